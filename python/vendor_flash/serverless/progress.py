"""``progress_update(job, data)``: report progress of a running job.

Like runpod-python, the update is sent from a background thread so the handler never waits
for the network. Unlike runpod-python:

* each job has at most one sender thread, which posts its updates in order;
* updates that come faster than they can be posted are coalesced: only the latest one not yet
  sent is kept, so an older value never lands after a newer one and threads are never piled up;
* the worker waits for a job's pending updates before it posts the job's final result, so a
  late progress update can never arrive after the result.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict, Optional

from . import result as results
from .env import WorkerEnv
from .log import get_logger, job_extra
from .transport import PostOutcome, Transport

_lock = threading.Condition()
_transport: Optional[Transport] = None
_stale_callback: Optional[Callable[[str], None]] = None
_local_only = False


class _Channel:
    """The progress updates of one job: the latest one not sent yet, and its sender thread."""

    def __init__(self, transport: Transport):
        self.transport = transport
        self.pending: Optional[bytes] = None
        self.coalesced = 0  # updates replaced by a newer one before they were sent
        self.sender: Optional[threading.Thread] = None


_channels: Dict[str, _Channel] = {}


def set_transport(transport: Optional[Transport], on_stale=None) -> None:
    """Used by the worker: send updates with its transport; ``on_stale(job_id)`` on a 409."""
    global _transport, _stale_callback
    with _lock:
        _transport = transport
        _stale_callback = on_stale


def set_local_only() -> None:
    """Used by ``--test_input`` and ``--rp_serve_api``: updates are only logged, never posted
    (a job-done URL left in the developer's environment must not get local test job ids)."""
    global _transport, _local_only
    with _lock:
        _local_only = True
        _transport = None


def _get_transport() -> Optional[Transport]:
    global _transport
    with _lock:
        if _transport is None and not _local_only:
            env = WorkerEnv.from_environ()
            if env.post_output:
                _transport = Transport(env)
        return _transport


def progress_update(job: Dict[str, Any], progress: Any) -> None:
    """Send ``{"status": "IN_PROGRESS", "output": progress}`` for ``job`` (a job dict or its id).

    Returns at once; the update is visible in ``/status`` while the job is IN_PROGRESS. The
    value is encoded at once (later changes to the object are not sent). In local mode (no
    job-done URL, ``--test_input`` or ``--rp_serve_api``) it is only logged.
    """
    job_id = str(job["id"] if isinstance(job, dict) else job)
    transport = _get_transport()
    if transport is None:
        get_logger().info("progress update: %s", progress, extra=job_extra(job_id))
        return
    try:
        data = results.encode_body({"status": "IN_PROGRESS", "output": progress})
    except (TypeError, ValueError) as exc:
        get_logger().error("progress update is not JSON serialisable: %s", exc, extra=job_extra(job_id))
        return
    start = None
    with _lock:
        channel = _channels.get(job_id)
        if channel is None:
            channel = _channels[job_id] = _Channel(transport)
        if channel.pending is not None:
            channel.coalesced += 1
        channel.pending = data
        if channel.sender is None:
            start = channel.sender = threading.Thread(target=_send_loop, args=(job_id, channel),
                                                      name=f"progress-{job_id}", daemon=True)
    if start is not None:
        start.start()


def _send_loop(job_id: str, channel: _Channel) -> None:
    """Post the job's latest pending update until none is left, then end."""
    log = get_logger()
    try:
        while True:
            with _lock:
                data, channel.pending = channel.pending, None
                coalesced, channel.coalesced = channel.coalesced, 0
                if data is None:
                    _retire(job_id, channel)
                    return
            if coalesced:
                log.debug("progress: %d older update(s) replaced by a newer one before sending", coalesced,
                          extra=job_extra(job_id))
            outcome = channel.transport.post_progress_data(job_id, data)
            if outcome is PostOutcome.STALE:
                with _lock:
                    channel.pending = None  # the job is not ours any more: send nothing else
                    _retire(job_id, channel)
                    callback = _stale_callback
                if callback is not None:
                    callback(job_id)
                return
    except BaseException:  # noqa: BLE001 - a sender must not die silently, nor wedge its job
        log.exception("progress update failed", extra=job_extra(job_id))
        with _lock:
            channel.pending = None
            _retire(job_id, channel)


def _retire(job_id: str, channel: _Channel) -> None:
    """End ``channel``'s sender (call with ``_lock`` held and nothing pending)."""
    channel.sender = None
    if _channels.get(job_id) is channel:
        del _channels[job_id]
    _lock.notify_all()


def wait_pending(job_id: str, timeout: float = 15.0) -> None:
    """Wait (up to ``timeout`` seconds in all) until the progress updates of ``job_id`` are sent."""
    deadline = time.monotonic() + timeout
    with _lock:
        while job_id in _channels:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            _lock.wait(remaining)
