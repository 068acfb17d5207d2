"""``progress_update(job, data)``: report progress of a running job.

Like runpod-python, the update is sent from a background thread so the handler never waits
for the network. Unlike runpod-python, the worker waits for a job's pending updates before it
posts the job's final result, so a late progress update can never arrive after the result.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, List, Optional

from .env import WorkerEnv
from .log import get_logger, job_extra
from .transport import PostOutcome, Transport

_lock = threading.Lock()
_pending: Dict[str, List[threading.Thread]] = {}
_transport: Optional[Transport] = None
_stale_callback = None


def set_transport(transport: Optional[Transport], on_stale=None) -> None:
    """Used by the worker: send updates with its transport; ``on_stale(job_id)`` on a 409."""
    global _transport, _stale_callback
    with _lock:
        _transport = transport
        _stale_callback = on_stale


def _get_transport() -> Optional[Transport]:
    global _transport
    with _lock:
        if _transport is None:
            env = WorkerEnv.from_environ()
            if env.post_output:
                _transport = Transport(env)
        return _transport


def progress_update(job: Dict[str, Any], progress: Any) -> None:
    """Send ``{"status": "IN_PROGRESS", "output": progress}`` for ``job`` (a job dict or its id).

    Returns at once; the update is visible in ``/status`` while the job is IN_PROGRESS. In local
    mode (no job-done URL) it is only logged.
    """
    job_id = str(job["id"] if isinstance(job, dict) else job)
    transport = _get_transport()
    if transport is None:
        get_logger().info("progress update: %s", progress, extra=job_extra(job_id))
        return

    def send() -> None:
        try:
            outcome = transport.post_progress(job_id, progress)
        except (TypeError, ValueError) as exc:
            get_logger().error("progress update is not JSON serialisable: %s", exc, extra=job_extra(job_id))
            return
        if outcome is PostOutcome.STALE and _stale_callback is not None:
            _stale_callback(job_id)

    thread = threading.Thread(target=_run_and_forget, args=(job_id, send), name=f"progress-{job_id}", daemon=True)
    with _lock:
        _pending.setdefault(job_id, []).append(thread)
    thread.start()


def _run_and_forget(job_id: str, fn) -> None:
    try:
        fn()
    finally:
        with _lock:
            threads = _pending.get(job_id)
            if threads is not None:
                me = threading.current_thread()
                if me in threads:
                    threads.remove(me)
                if not threads:
                    _pending.pop(job_id, None)


def wait_pending(job_id: str, timeout: float = 15.0) -> None:
    """Wait (up to ``timeout`` seconds in all) for the progress updates of ``job_id`` in flight."""
    deadline = time.monotonic() + timeout
    while True:
        with _lock:
            threads = list(_pending.get(job_id, ()))
        if not threads:
            return
        for thread in threads:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            thread.join(remaining)
