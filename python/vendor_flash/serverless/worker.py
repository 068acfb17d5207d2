"""The production worker: take jobs, run them, post results, heartbeat, stop and shut down.

Threads:

* **take** – long-polls job-take (one slot free) or job-take-batch (several), starts a thread
  per job, and waits on a condition while every slot is busy (no polling).
* **job-<id>** – runs the handler (async ones on the shared event loop), streams chunks,
  posts the result, then frees the slot.
* **stop** – long-polls job-stop and cancels the listed jobs.
* **heartbeat** – feeds the ids of the jobs in progress to the heartbeat process, which pings
  every interval (renews leases) even while a handler holds the GIL (:mod:`.heartbeat`).
* **main** – runs the code of sync handlers and generators (one job at a time, as runpod-python
  runs them on its main thread; see :class:`~.handler.MainThreadRunner`) until a shutdown request
  (SIGTERM/SIGINT, ``refresh_worker``, or a handler that raised SystemExit/KeyboardInterrupt),
  then stops taking, lets in-flight jobs finish and post, and returns the exit status.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from . import progress
from . import result as results
from .env import WorkerEnv
from .handler import (ChunkNotDelivered, HandlerKind, JobCancelled, JobRun, LoopThread, MainThreadRunner,
                      StopSignals, handler_kind)
from .http import TRANSPORT_ERRORS, HttpClient, HttpResponse, RequestAborted
from .log import get_logger, job_extra
from .ping import ping, ping_client
from .transport import ChunkNotEncodable, PostOutcome, Transport, retry_after_seconds
from .utils import rp_debugger
from ..version import __version__

#: Client-side limit of a job-take / job-stop long-poll (the server holds < 90 s).
LONG_POLL_TIMEOUT = 95.0
#: An empty long-poll answer faster than this counts as "not held" and is backed off.
SPIN_GUARD_SECONDS = 1.0
#: How often the heartbeat process is told the jobs in progress (when they changed).
HEARTBEAT_FEED_SECONDS = 0.2


def _ignore_stop_signals() -> None:
    """In the heartbeat process, between fork and exec: SIGTERM and SIGINT are the worker's to act on."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)


class Backoff:
    """Exponential backoff: ``first``, doubling, capped at ``cap`` seconds."""

    def __init__(self, first: float = 0.5, cap: float = 5.0):
        self.first = first
        self.cap = cap
        self._next = first

    def next(self) -> float:
        """The delay to wait now; the following one doubles."""
        delay = self._next
        self._next = min(self.cap, self._next * 2)
        return delay

    def reset(self) -> None:
        """Start again from ``first``."""
        self._next = self.first


#: The error result posted for a job whose answer is nested deeper than Python's JSON decoder goes.
TOO_DEEP_ERROR = ("input is nested too deeply to decode (deeper than Python's JSON decoder goes, "
                  "about 1000 levels): the job was not run")

#: What a scan of an undecodable job-take answer stops at: a JSON string, or a structural character.
_JSON_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[{}\[\]:,]')
_JSON_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")


def scan_jobs(text: str) -> List[Tuple[Optional[str], str]]:
    """The jobs of a job-take answer too deeply nested to decode, without decoding it.

    ``text`` is one job object or an array of them (job-take-batch). Returns, per job object, its
    top-level ``id`` (``None`` when it has none: a string id, or a number id as written) and its
    own text, found with one pass over the strings and structural characters, so no depth of
    nesting is a problem. Stops at the first sign that ``text`` is not such an answer.
    """
    found: List[Tuple[Optional[str], str]] = []
    stack: List[str] = []
    top = ""
    start = 0
    job_id: Optional[str] = None
    expect_key = False
    key: Optional[str] = None
    value_from = -1  # where the value of the job's "id" starts, once its ':' is seen
    for match in _JSON_TOKEN.finditer(text):
        token = match.group()
        at_job = stack == ["{"] or stack == ["[", "{"]
        if value_from >= 0:
            # the token after "id": is the id when it is a string; else the id is the text between
            if token.startswith('"') and not text[value_from:match.start()].strip():
                job_id = json.loads(token)
            else:
                raw = text[value_from:match.start()].strip()
                if _JSON_NUMBER.fullmatch(raw):
                    job_id = raw
            value_from = -1
        if token in ("{", "["):
            if not stack:
                top = token
            stack.append(token)
            if stack == ["{"] or stack == ["[", "{"]:
                start, job_id, expect_key = match.start(), None, True
        elif token in ("}", "]"):
            if not stack or {"}": "{", "]": "["}[token] != stack[-1]:
                break
            stack.pop()
            if token == "}" and (stack == [] or stack == ["["]):
                found.append((job_id, text[start:match.end()]))
            if not stack:
                break
        elif token == ",":
            expect_key = at_job and stack[-1] == "{"
        elif token == ":":
            if at_job and key == "id" and job_id is None:
                value_from = match.end()
            key = None
        elif at_job and expect_key:
            key = json.loads(token)
            expect_key = False
    if top != "[" and len(found) > 1:
        return found[:1]
    return found


def parse_jobs(response: HttpResponse) -> Tuple[List[Dict[str, Any]], List[str], List[str]]:
    """Jobs from a 200 job-take (object) or job-take-batch (array) answer.

    Returns ``(jobs, problems, too_deep)``; a job without ``id`` or ``input`` is skipped and
    reported. ``too_deep`` holds the ids of jobs nested deeper than Python's JSON decoder goes
    (about 1000 levels): they are read with :func:`scan_jobs`, and the worker fails them with
    :data:`TOO_DEEP_ERROR` instead of leaving them to run out their lease.
    """
    if not response.body.strip():
        return [], [], []
    try:
        payload = response.json()
    except ValueError as exc:
        return [], [f"job-take answer is not JSON: {exc}"], []
    except RecursionError:
        return _parse_too_deep(response)
    jobs, problems = _check_jobs(payload if isinstance(payload, list) else [payload])
    return jobs, problems, []


def _check_jobs(items: List[Any]) -> Tuple[List[Dict[str, Any]], List[str]]:
    jobs, problems = [], []
    for item in items:
        if not isinstance(item, dict):
            problems.append(f"job is not an object: {item!r:.200}")
            continue
        missing = [k for k in ("id", "input") if item.get(k) is None]
        if missing:
            problems.append(f"Job has missing field(s): {', '.join(missing)}.")
            continue
        jobs.append(item)
    return jobs, problems


def _parse_too_deep(response: HttpResponse) -> Tuple[List[Dict[str, Any]], List[str], List[str]]:
    # Valid JSON nested deeper than Python's decoder goes: each job of the answer is decoded on
    # its own (in a batch, the others run), and one still too deep is failed by its id. Without
    # an id flashd gets the job back when its lease runs out; this worker goes on taking jobs.
    jobs: List[Dict[str, Any]] = []
    problems: List[str] = []
    too_deep: List[str] = []
    for job_id, text in scan_jobs(response.body.decode("utf-8", "replace")):
        try:
            item = json.loads(text)
        except RecursionError:
            if job_id is None:
                problems.append("job-take answer is nested too deeply to decode; skipped")
            else:
                too_deep.append(job_id)
            continue
        except ValueError as exc:
            problems.append(f"job-take answer is not JSON: {exc}")
            continue
        more, said = _check_jobs([item])
        jobs.extend(more)
        problems.extend(said)
    if not (jobs or problems or too_deep):
        problems.append("job-take answer is nested too deeply to decode; skipped")
    return jobs, problems, too_deep


@dataclass
class ActiveJob:
    """A job held by this worker."""

    job: Dict[str, Any]
    run: JobRun
    lost: bool = False  # a 409 said another attempt owns it now
    chunks: int = 0  # stream chunks posted so far
    thread: Optional[threading.Thread] = field(default=None, repr=False)

    @property
    def id(self) -> str:
        """The job id, as a string."""
        return str(self.job["id"])

    def held(self) -> bool:
        """False once the job was stopped here or taken over by another attempt."""
        return not (self.lost or self.run.cancelled)


class Worker:
    """A flashd/RunPod queue worker for one handler. Call :meth:`run`."""

    def __init__(self, config: Dict[str, Any], env: WorkerEnv):
        if not callable(config.get("handler")):
            raise ValueError("config['handler'] must be a callable")
        self.config = config
        self.env = env
        self.handler: Callable = config["handler"]
        self.kind: HandlerKind = handler_kind(self.handler)
        self.aggregate = bool(config.get("return_aggregate_stream", False))
        self.refresh_always = bool(config.get("refresh_worker", False))
        rp_args = config.get("rp_args") or {}
        #: ``--rp_debugger``: rp_debugger timings go into each dict output; None: off.
        self.debugger_ready_ms: Optional[float] = rp_args.get("ready_delay_ms") if rp_args.get("rp_debugger") else None
        self.modifier: Optional[Callable[[int], int]] = config.get("concurrency_modifier")
        self.concurrency = 1
        #: The last concurrency_modifier failure logged, so a modifier that keeps failing is said once.
        self._modifier_failure: Optional[str] = None
        self.log = get_logger()

        self.transport = Transport(env)
        self.take_client = HttpClient(env.api_key, timeout=LONG_POLL_TIMEOUT, max_idle=1)
        self.stop_client = HttpClient(env.api_key, timeout=LONG_POLL_TIMEOUT, max_idle=1)
        self.jobs: Dict[str, ActiveJob] = {}
        self.cond = threading.Condition()
        self.stopping = threading.Event()  # no more takes
        self.finished = threading.Event()  # drained, background loops end
        self.loop: Optional[LoopThread] = None
        #: Runs sync handler code on the thread that calls :meth:`run` (the main thread).
        self.main = MainThreadRunner()
        self._ping_now = threading.Event()  # wakes the heartbeat early
        #: Jobs this worker stopped on job-stop that the next ping lists once more, even if their
        #: handler has returned by then (see :meth:`_take_stopped`). Guarded by ``cond``.
        self._stopped_once: Set[str] = set()
        self._signals = StopSignals()
        self._feed_lock = threading.Lock()
        self._heartbeat_proc: Optional[subprocess.Popen] = None
        self._fed_ids: Optional[List[str]] = None
        self._threads: List[threading.Thread] = []
        #: The SystemExit/KeyboardInterrupt a handler raised: the worker exits after it.
        self.exit_exception: Optional[BaseException] = None

    # -- public -----------------------------------------------------------------------------

    def run(self) -> int:
        """Run until shut down; returns the exit status.

        0, unless a handler raised SystemExit or KeyboardInterrupt: then the status that
        exception asks for (see :attr:`exit_exception`), once the other jobs have finished.
        """
        self.log.info("vendor-flash %s worker %s starting (handler: %s, endpoint: %s)",
                      __version__, self.env.worker_id, self.kind.value, self.env.endpoint_id or "-")
        previous = self._install_signal_handlers()
        self.main.open()
        self.loop = LoopThread()
        progress.set_transport(self.transport, on_stale=self._mark_lost)
        try:
            if self.env.ping_enabled:
                # before the first take, so the first job is listed before its handler runs
                self._heartbeat_proc = self._start_heartbeat_process()
                self._spawn(self._heartbeat_loop, "heartbeat")
            take = self._spawn(self._take_loop, "take")
            self._spawn(self._stop_loop, "stop")
            if not self.env.ping_enabled:
                self.log.warning("heartbeat disabled: needs the ping URL, the worker key and the pod id")
            self.main.serve(self.stopping.is_set)  # sync handlers run here meanwhile
            # a take answered during shutdown still registers its jobs
            self.main.serve(lambda: not take.is_alive(), timeout=30)
            self._drain()
        finally:
            self.main.close()
            self.finished.set()
            self._ping_now.set()
            self.take_client.abort()
            self.stop_client.abort()
            for thread in self._threads:
                thread.join(timeout=5)
            progress.set_transport(None)
            self.transport.client.close()
            self.loop.stop()
            self._restore_signal_handlers(previous)
        if self.exit_exception is not None:
            status = results.exit_status(self.exit_exception)
            self.log.info("worker %s stopped: exiting with status %d (%s from a handler)",
                          self.env.worker_id, status, type(self.exit_exception).__name__)
            return status
        self.log.info("worker %s stopped", self.env.worker_id)
        return 0

    def request_shutdown(self, reason: str) -> None:
        """Stop taking jobs; in-flight jobs finish and post their results, then :meth:`run` returns."""
        if self.stopping.is_set():
            return
        self.log.info("shutting down (%s): no new jobs, finishing %d in flight", reason, len(self.jobs))
        self.stopping.set()
        self.take_client.abort()
        with self.cond:
            self.cond.notify_all()

    def in_progress_ids(self) -> List[str]:
        """Ids of the jobs whose handler still runs here, cancelled and lost ones included.

        A stopped job stays listed until its handler has returned (a sync handler cannot be
        interrupted), as runpod-python's heartbeats do: flashd then counts this worker busy, not
        idle, so queued jobs get another worker, and it keeps a re-run of the job away from here
        while the old run goes on. A job leaves the list when its thread ends.
        """
        with self.cond:
            return list(self.jobs)

    def cancel_job(self, job_id: str) -> bool:
        """Cancel a job running here (no result will be posted).

        Returns False when the job is not running here or was already cancelled. A stop for a
        job this worker has not registered yet is not remembered: flashd offers the stop again
        while the worker's pings list the job.
        """
        with self.cond:
            active = self.jobs.get(job_id)
            if active is None or active.run.cancelled:
                return False
        # the job-stop does not say why: a /cancel, an execution timeout or TTL, or a lost lease
        self.log.info("stop requested by flashd (cancel, timeout or lost lease): stopping the job",
                      extra=job_extra(job_id))
        active.run.cancel()
        return True

    # -- take -------------------------------------------------------------------------------

    def _current_concurrency(self) -> int:
        if self.modifier is None:
            return self.concurrency
        try:
            value = int(self.modifier(self.concurrency))
        except Exception as exc:  # noqa: BLE001 - a bad modifier must not kill the worker
            # asked again every second while the slots are busy: say a failure once, not each time
            failure = f"{type(exc).__name__}: {exc}"
            if failure != self._modifier_failure:
                self.log.error("concurrency_modifier failed (%s): keeping concurrency %d; the same failure "
                               "again is logged at DEBUG only", failure, self.concurrency)
                self._modifier_failure = failure
            else:
                self.log.debug("concurrency_modifier failed again (%s)", failure)
            return self.concurrency
        if self._modifier_failure is not None:
            self.log.info("concurrency_modifier works again: concurrency %d", max(0, value))
            self._modifier_failure = None
        self.concurrency = max(0, value)  # 0 pauses intake, as in runpod-python
        return self.concurrency

    def _take_loop(self) -> None:
        backoff = Backoff(0.5, 5.0)
        while not self.stopping.is_set():
            want = self._current_concurrency()
            with self.cond:
                free = want - len(self.jobs)
                if free <= 0:
                    self.cond.wait(timeout=1.0)
                    continue
                busy = bool(self.jobs)
            try:
                jobs, delay = self._take(free, busy, backoff)
                for job in jobs:
                    self._start_job(job)
            except RequestAborted:
                break
            except Exception as exc:  # noqa: BLE001 - the take loop is the worker: it must not die
                delay = backoff.next()
                self.log.error("job-take loop error (%s: %s), going on in %.1f s", type(exc).__name__, exc, delay)
            if delay > 0:
                self.stopping.wait(delay)

    def _take(self, count: int, busy: bool, backoff: Backoff) -> Tuple[List[Dict[str, Any]], float]:
        """One job-take (``count == 1``) or job-take-batch call. Returns ``(jobs, delay)``."""
        if count == 1:
            url = self.env.job_take_url(busy)
        else:
            url = self.env.job_take_batch_url(count, busy)
        started = time.monotonic()
        try:
            response = self.take_client.request("GET", url, timeout=LONG_POLL_TIMEOUT)
        except RequestAborted:
            raise
        except TimeoutError:
            self.log.debug("job-take held past %.0f s, polling again", LONG_POLL_TIMEOUT)
            return [], 0.0
        except TRANSPORT_ERRORS as exc:
            delay = backoff.next()
            self.log.warning("job-take failed (%s: %s), retrying in %.1f s", type(exc).__name__, exc, delay)
            return [], delay
        held = time.monotonic() - started
        status = response.status
        if status == 200:
            jobs, problems, too_deep = parse_jobs(response)
            for problem in problems:
                self.log.error(problem)
            for job_id in too_deep:
                self._fail_undecodable(job_id)
            if jobs:
                backoff.reset()
                return jobs, 0.0
            return [], self._empty_delay(held, backoff)
        if status in (204, 400):
            return [], self._empty_delay(held, backoff)
        if status == 429:
            delay = retry_after_seconds(response.headers, 5.0)
            self.log.warning("job-take rate limited, waiting %.1f s", delay)
            return [], delay
        delay = backoff.next()
        self.log.error("job-take got HTTP %d, retrying in %.1f s: %s", status, delay, response.line())
        return [], delay

    def _fail_undecodable(self, job_id: str) -> None:
        """Post the error result of a job whose input is too deeply nested to decode."""
        extra = job_extra(job_id)
        self.log.error("%s", TOO_DEEP_ERROR, extra=extra)
        outcome = self.transport.post_done(job_id, {"error": TOO_DEEP_ERROR})
        fate = "" if outcome is PostOutcome.DELIVERED else f", result {outcome.value}"
        self.log.error("done (error, not run%s)", fate, extra=extra)

    def _empty_delay(self, held: float, backoff: Backoff) -> float:
        if held >= SPIN_GUARD_SECONDS:
            backoff.reset()
            return 0.0
        delay = backoff.next()
        self.log.debug("job-take answered empty after %.3f s (not held), waiting %.1f s", held, delay)
        return delay

    # -- jobs -------------------------------------------------------------------------------

    def _start_job(self, job: Dict[str, Any]) -> None:
        job_id = str(job["id"])
        extra = job_extra(job_id)
        with self.cond:
            if job_id in self.jobs:
                self.log.warning("job delivered twice to this worker: ignoring the copy", extra=extra)
                return
            run = JobRun(
                self.handler, job, self.loop, kind=self.kind, aggregate_stream=self.aggregate,
                on_chunk=lambda value: self._stream_chunk(job_id, value),
                worker_id=self.env.report_worker_id, hostname=self.env.hostname,
            )
            active = ActiveJob(job=job, run=run)
            self.jobs[job_id] = active
        # runpod-python's line, word for word (log alerts and metrics match it)
        self.log.info("Started.", extra=extra)
        batch = job.get("batchId")
        if batch:
            self.log.debug("batchId: %s", batch, extra=extra)
        thread = threading.Thread(target=self._job_thread, args=(active,), name=f"job-{job_id}", daemon=True)
        active.thread = thread
        try:
            # listed before the handler runs: one that grabs the GIL at once still gets pings
            self._feed_heartbeat()
        except (OSError, ValueError):
            pass  # the heartbeat loop notices and falls back to a thread
        try:
            thread.start()
        except RuntimeError as exc:  # "can't start new thread": a thread or pid limit
            # Not run, so not held: the next heartbeat leaves it out and flashd queues it again.
            self.log.error("cannot start a thread for the job (%s): handing it back", exc, extra=extra)
            with self.cond:
                self.jobs.pop(job_id, None)
                self.cond.notify_all()
            raise

    def _job_thread(self, active: ActiveJob) -> None:
        job_id = active.id
        extra = job_extra(job_id)
        started = time.monotonic()
        # sync code on the main thread, as runpod-python runs it, when no other job holds it
        on_main = self.kind in (HandlerKind.SYNC, HandlerKind.GENERATOR) and self.main.acquire()
        if on_main:
            active.run.call = self.main.call
        try:
            try:
                body = active.run.run()
            except JobCancelled:
                cancelled = active.run.cancelled_body or {}
                if self.refresh_always or cancelled.get("stopPod"):
                    self._recycle_anyway(job_id, "stopped")
                else:
                    self.log.info("stopped: no result posted", extra=extra)
                return
            finally:
                if on_main:
                    self.main.release()
                    on_main = False
                if active.run.exit_exception is not None:
                    self._exit_after_jobs(active.run.exit_exception, job_id)
            if self.refresh_always:
                self.log.info("refresh_worker flag set, stopping pod after job.", extra=extra)
                body["stopPod"] = True
            if self.debugger_ready_ms is not None:
                rp_debugger.attach_debugger_output(body, self.debugger_ready_ms)
            else:
                rp_debugger.clear_debugger_output()
            progress.wait_pending(job_id)
            if not active.held():
                if body.get("stopPod"):
                    self._recycle_anyway(job_id, "no longer held here")
                else:
                    self.log.info("job no longer held here: result dropped", extra=extra)
                return
            if body.get("stopPod"):
                self.request_shutdown("refresh_worker")
            delivery = self.transport.deliver_result(job_id, body, is_stream=self.kind.is_stream,
                                                     still_held=active.held)
            if delivery.outcome is PostOutcome.STALE:
                active.lost = True
            if delivery.discarded:
                # flashd had ended the job (cancel, timeout) before its job-stop reached this
                # worker, e.g. one that came while the handler was returning: nothing was stored
                self.log.info("stopped by flashd before its result arrived: result discarded (after %.3f s)",
                              time.monotonic() - started, extra=extra)
                return
            failed = bool(body.get("error")) or delivery.substituted or delivery.fallback is not None
            if delivery.delivered:
                fate = ""
            elif delivery.fallback is not None:
                fate = f", result {delivery.outcome.value}: {delivery.reason()}; error result {delivery.fallback.value}"
            elif delivery.outcome is PostOutcome.STALE:
                fate = f", result {delivery.outcome.value}: {delivery.reason()}"
            else:
                fate = f", result {delivery.outcome.value}"
            # a failed job at ERROR, with its error (never its input, which may hold secrets); a
            # result refused because another attempt holds the job (this run's work is lost) at WARN
            level = (logging.ERROR if failed else
                     logging.WARNING if delivery.outcome is PostOutcome.STALE else logging.INFO)
            state = (f"error: {results.error_summary(body['error'])}" if body.get("error")
                     else "error" if failed else "ok")
            self.log.log(level, "done in %.3f s (%s%s)", time.monotonic() - started, state, fate, extra=extra)
        except BaseException:  # noqa: BLE001 - never let a job thread die silently
            self.log.exception("internal error while running the job", extra=extra)
        finally:
            # runpod-python's last line for a job, word for word: after its result post,
            # whatever became of it (and here also when no result is posted: a stopped job)
            self.log.info("Finished.", extra=extra)
            if on_main:  # an internal error before the reservation was ended
                self.main.release()
            with self.cond:
                self.jobs.pop(job_id, None)
                self.cond.notify_all()
            self.main.wake()  # the drain checks again
            if not active.held():
                # a stopped job's handler has returned: tell flashd now (its pings listed the
                # job until here, so flashd still counts this worker busy)
                self._ping_now.set()

    def _recycle_anyway(self, job_id: str, why: str) -> None:
        """refresh_worker for a job whose result is not wanted: flashd is still told (a result
        body of just ``stopPod``, which it discards), so the exit that follows is a recycle and
        not a crash, and the worker shuts down."""
        extra = job_extra(job_id)
        self.log.info("%s: no result posted; refresh_worker: asking flashd to recycle this worker", why, extra=extra)
        self.request_shutdown("refresh_worker")
        delivery = self.transport.send(self.env.job_done_url(job_id),
                                       results.encode_body({"stopPod": True}), job_id, "recycle request")
        if delivery.outcome is not PostOutcome.DELIVERED and delivery.outcome is not PostOutcome.STALE:
            self.log.warning("recycle request not delivered (%s): the exit may be reported as a crash",
                             delivery.outcome.value, extra=extra)

    def _exit_after_jobs(self, exc: BaseException, job_id: str) -> None:
        """A handler raised SystemExit/KeyboardInterrupt: stop taking, finish, then exit with its status."""
        with self.cond:
            if self.exit_exception is None:  # the first one decides the exit status
                self.exit_exception = exc
        self.log.error("handler raised %s: the job fails, and the worker exits with status %d once its "
                       "other jobs have finished", results.describe_exit(exc).split(":")[0],
                       results.exit_status(exc), extra=job_extra(job_id))
        self.request_shutdown(f"{type(exc).__name__} raised by a handler")

    def _stream_chunk(self, job_id: str, value: Any) -> None:
        with self.cond:
            active = self.jobs.get(job_id)
        if active is None or not active.held():
            raise JobCancelled(job_id)
        active.chunks += 1
        try:
            delivery = self.transport.deliver_chunk(job_id, value, still_held=active.held, number=active.chunks)
        except ChunkNotEncodable as exc:
            # the SDK failed the yield, not the handler: say which chunk, and what it was
            message = (f"stream chunk {active.chunks} ({type(value).__name__}) is not JSON serialisable: {exc}; "
                       f"the generator was stopped")
            self.log.error("%s", message, extra=job_extra(job_id))
            raise ChunkNotDelivered(message) from None
        if delivery.outcome is PostOutcome.STALE:
            self._mark_lost(job_id)
            raise JobCancelled(job_id)
        if delivery.discarded:
            # flashd ended the job (cancel, timeout) before its job-stop reached us: stop now.
            self.log.info("stream chunk discarded: flashd has ended the job, stopping it", extra=job_extra(job_id))
            active.run.cancel()
            raise JobCancelled(job_id)
        if not delivery.delivered:
            if not active.held():
                raise JobCancelled(job_id)
            size = "" if delivery.status == 413 else f" ({delivery.size} bytes)"  # a 413 reason has it
            raise ChunkNotDelivered(f"stream chunk {active.chunks}{size} could not be delivered: "
                                    f"{delivery.reason()}; the generator was stopped")

    def _mark_lost(self, job_id: str) -> None:
        """A 409 said this attempt is stale: stop the job and post nothing more for it."""
        with self.cond:
            active = self.jobs.get(job_id)
        if active is not None and not active.lost:
            active.lost = True
            self.log.warning("job now belongs to another attempt: stopping it here", extra=job_extra(job_id))
            active.run.cancel()

    def _drain(self) -> None:
        """Wait until every job that will post a result has done so (running sync handler code
        meanwhile)."""
        def drained() -> bool:
            with self.cond:
                return not any(not (j.run.cancelled or j.lost) for j in self.jobs.values())

        self.main.serve(drained)

    # -- stop channel -----------------------------------------------------------------------

    def _stop_loop(self) -> None:
        url = self.env.job_stop_url()
        if url is None:
            self.log.warning("job-stop disabled: the job-take URL has no /job-take/ segment")
            return
        backoff = Backoff(1.0, 5.0)
        warned_404 = False
        while not self.finished.is_set():
            started = time.monotonic()
            try:
                response = self.stop_client.request("GET", url, timeout=LONG_POLL_TIMEOUT)
            except RequestAborted:
                return
            except TimeoutError:
                continue
            except TRANSPORT_ERRORS as exc:
                delay = backoff.next()
                self.log.debug("job-stop failed (%s), retrying in %.1f s", exc, delay)
                self.finished.wait(delay)
                continue
            held = time.monotonic() - started
            delay = 0.0
            if response.status == 200:
                ids = self._stop_ids(response)
                self.log.debug("job-stop: %s", ids)
                acted = [job_id for job_id in ids if self.cancel_job(job_id)]
                if acted:
                    # tell flashd at once that these jobs are no longer held here, so it stops
                    # offering them (it clears a stop when a ping no longer lists the job): a
                    # ping that lists them once more, then one without them (_take_stopped)
                    if self.env.ping_enabled:
                        with self.cond:
                            self._stopped_once.update(acted)
                    self._ping_now.set()
                    backoff.reset()
                elif held < SPIN_GUARD_SECONDS:
                    # nothing new (stops already handled, or for jobs not running here): flashd
                    # answers such polls at once until a ping acknowledges them; do not spin
                    delay = backoff.next()
                else:
                    backoff.reset()
            elif response.status == 204:
                delay = backoff.next() if held < SPIN_GUARD_SECONDS else 0.0
                if delay == 0.0:
                    backoff.reset()
            elif response.status == 429:
                delay = retry_after_seconds(response.headers, 5.0)
            else:
                delay = backoff.next()
                if response.status != 404 or not warned_404:
                    self.log.warning("job-stop got HTTP %d: %s", response.status, response.line(200))
                warned_404 = warned_404 or response.status == 404
            if delay > 0:
                self.finished.wait(delay)

    def _stop_ids(self, response: HttpResponse) -> List[str]:
        try:
            payload = response.json()
        except ValueError:
            self.log.warning("job-stop answer is not JSON: %s", response.line(200))
            return []
        ids = payload.get("jobsToStop") if isinstance(payload, dict) else None
        return [i for i in ids if isinstance(i, str)] if isinstance(ids, list) else []

    # -- heartbeat --------------------------------------------------------------------------

    def _heartbeat_loop(self) -> None:
        """Pings from a child process (see :mod:`.heartbeat`), fed the ids of the jobs in progress.

        A handler holding the GIL stops every thread here, but not that process, so leases are
        renewed as runpod-python's heartbeat process renews them. Falls back to pinging from
        this thread when the process cannot be started.
        """
        with self._feed_lock:
            proc = self._heartbeat_proc
        if proc is None:
            self._heartbeat_thread_loop()
            return
        reader = threading.Thread(target=self._heartbeat_results, args=(proc,), name="vendor-flash-heartbeat-results",
                                  daemon=True)
        reader.start()
        try:
            while not self.finished.is_set():
                if proc.poll() is not None:  # killed, or failed: its pings stopped with it
                    raise OSError(f"it exited with status {proc.returncode}")
                now = self._ping_now.is_set()
                self._ping_now.clear()
                self._feed_heartbeat(now)
                self._ping_now.wait(HEARTBEAT_FEED_SECONDS)
        except (OSError, ValueError) as exc:
            self.log.warning("heartbeat process gone (%s): pinging from a thread", exc)
            with self._feed_lock:
                self._heartbeat_proc = None
            self._heartbeat_thread_loop()
        finally:
            with self._feed_lock:
                self._heartbeat_proc = None
            try:
                proc.stdin.close()
            except OSError:
                pass
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            reader.join(5)
            proc.stdout.close()

    def _take_stopped(self) -> List[str]:
        """The jobs stopped on job-stop since the last ping: the next ping lists them, whether or
        not their handler has returned by then, and the one after it goes without them.

        flashd ends a stop at the first ping without the job only once a ping has listed the job
        (before that, a ping without it may have been made before the worker registered a job it
        took moments ago). A job cancelled within a second of its take, before the first regular
        ping, is often gone from the jobs by the time its ping goes out (an async handler stops at
        once): that ping alone would leave the stop, and this worker running in /health, until
        the next regular ping, up to 10 s later. Listed once, then left out, it ends at once.
        """
        with self.cond:
            stopped = sorted(self._stopped_once)
            self._stopped_once.clear()
        return stopped

    def _feed_heartbeat(self, now: bool = False) -> None:
        """Tell the heartbeat process the jobs in progress, when they changed (or ``now``: ping)."""
        with self._feed_lock:
            proc = self._heartbeat_proc
            if proc is None:
                return
            ids = self.in_progress_ids()
            stopped = self._take_stopped()
            if now or ids != self._fed_ids or stopped:
                message: Dict[str, Any] = {"ids": ids, "now": now or bool(stopped)}
                if stopped:
                    # listed by the next ping even if a later message before it drops them (the
                    # process reads what piled up in its pipe at once, and pings the last ids)
                    message["stopped"] = stopped
                proc.stdin.write((json.dumps(message) + "\n").encode())
                proc.stdin.flush()
                self._fed_ids = ids

    def _start_heartbeat_process(self) -> Optional[subprocess.Popen]:
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ)
        env["PYTHONPATH"] = package_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        try:
            # SIG_IGN set between fork and exec is kept across exec, and Python keeps an inherited
            # SIG_IGN: the heartbeat ignores a SIGTERM/SIGINT sent to the whole process group
            # from its first instant, not only once its interpreter has started and imported us
            proc = subprocess.Popen([sys.executable, "-m", "vendor_flash.serverless.heartbeat"], env=env,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True,
                                    preexec_fn=_ignore_stop_signals)
            proc.stdin.write((json.dumps(dataclasses.asdict(self.env)) + "\n").encode())
            proc.stdin.flush()
        except (OSError, ValueError) as exc:
            self.log.warning("cannot start the heartbeat process (%s): pinging from a thread", exc)
            return None
        return proc

    def _heartbeat_results(self, proc: subprocess.Popen) -> None:
        """Act on what the heartbeat process reports for each ping (a 409 names stale jobs)."""
        for line in proc.stdout:
            try:
                report = json.loads(line)
            except ValueError:
                continue
            self._ping_outcome(report.get("status"), report.get("body", "").encode(), report.get("ids", []),
                               report.get("error", ""))

    def _heartbeat_thread_loop(self) -> None:
        client = ping_client(self.env)
        try:
            while not self.finished.is_set():
                self.ping_once(client)
                self._ping_now.wait(self.env.ping_interval)
                self._ping_now.clear()
        finally:
            client.close()

    def ping_once(self, client: HttpClient) -> Optional[int]:
        """Send one heartbeat listing the jobs in progress; returns the HTTP status or None."""
        ids = self.in_progress_ids()
        stopped = [i for i in self._take_stopped() if i not in ids]
        response, error = ping(client, self.env, ids + stopped)
        if response is None:
            with self.cond:  # not seen by flashd: listed by the next ping
                self._stopped_once.update(stopped)
            self._ping_outcome(None, b"", ids, error)
            return None
        if stopped:
            self._ping_now.set()  # at once the ping without them, which ends their stops
        self._ping_outcome(response.status, response.body, ids)
        return response.status

    def _ping_outcome(self, status: Optional[int], body: bytes, ids: List[str], error: str = "") -> None:
        """Log a failed ping; on a 409, drop the jobs it names."""
        if status is None:
            self.log.warning("ping failed: %s", error)
            return
        response = HttpResponse(status=status, headers={}, body=body)
        if status == 409:
            self._stale_from_ping(response, ids)
        elif status >= 400:
            self.log.warning("ping got HTTP %d: %s", status, response.line(200))

    def _stale_from_ping(self, response: HttpResponse, sent: List[str]) -> None:
        """A 409 on ping: drop the jobs it names (or the only job sent, if it names none)."""
        named: List[str] = []
        try:
            payload = response.json()
        except ValueError:
            payload = None
        if isinstance(payload, dict):
            for key in ("staleJobs", "stale", "jobIds", "jobs", "jobsToStop", "jobId", "job_id"):
                value = payload.get(key)
                if isinstance(value, str):
                    named.append(value)
                elif isinstance(value, list):
                    named.extend(v for v in value if isinstance(v, str))
        if not named and len(sent) == 1:
            named = sent
        if not named:
            self.log.warning("ping refused with 409 without naming jobs: %s", response.line(200))
        for job_id in named:
            if job_id in sent:
                self._mark_lost(job_id)

    # -- plumbing ---------------------------------------------------------------------------

    def _spawn(self, target: Callable[[], None], name: str) -> threading.Thread:
        thread = threading.Thread(target=target, name=f"vendor-flash-{name}", daemon=True)
        self._threads.append(thread)
        thread.start()
        return thread

    def _on_signal(self, signum, _frame) -> None:
        kind = self._signals.classify(signum)
        if kind == "repeat":
            self.log.debug("%s again within %.0f s of the first: the same stop request, ignored",
                           signal.Signals(signum).name, self._signals.window)
            return
        if kind == "second":
            self.log.warning("second signal: exiting now, in-flight results are lost")
            os._exit(1)
        self.request_shutdown(signal.Signals(signum).name)

    def _install_signal_handlers(self) -> Dict[int, Any]:
        previous: Dict[int, Any] = {}
        if threading.current_thread() is not threading.main_thread():
            return previous
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, self._on_signal)
        return previous

    @staticmethod
    def _restore_signal_handlers(previous: Dict[int, Any]) -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
