"""Run one job through a handler of any form, with cancellation.

Handlers may be a sync function, an ``async def``, a generator or an async generator.
Async code runs on one shared event loop in a background thread (:class:`LoopThread`); the
calling thread waits for it, so a job can be run from any thread and cancelled from another.
Sync handlers and generators run in the calling thread, or, when the job was given a
:class:`MainThreadRunner` call, on the thread that serves it (the worker's main thread, where
runpod-python runs them: ``signal.signal()`` and thread-local state set at import work there).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import enum
import inspect
import json
import threading
import time
from typing import Any, Callable, Dict, List, Optional

from . import result as results
from .log import get_logger


class HandlerKind(enum.Enum):
    """The four handler forms."""

    SYNC = "sync"
    ASYNC = "async"
    GENERATOR = "generator"
    ASYNC_GENERATOR = "async_generator"

    @property
    def is_stream(self) -> bool:
        """Generators stream their yields."""
        return self in (HandlerKind.GENERATOR, HandlerKind.ASYNC_GENERATOR)


def handler_kind(handler: Callable) -> HandlerKind:
    """Classify a handler (functions, ``functools.partial`` and callable objects)."""
    candidates = [handler]
    call = getattr(type(handler), "__call__", None)
    if not inspect.isroutine(handler) and call is not None:
        candidates.append(call)
    for fn in candidates:
        if inspect.isasyncgenfunction(fn):
            return HandlerKind.ASYNC_GENERATOR
        if inspect.isgeneratorfunction(fn):
            return HandlerKind.GENERATOR
        if inspect.iscoroutinefunction(fn):
            return HandlerKind.ASYNC
    return HandlerKind.SYNC


class _Escaped(Exception):
    """Carries a SystemExit/KeyboardInterrupt out of the event loop as an ordinary exception.

    asyncio re-raises those two out of ``run_forever`` (which would end the shared loop thread
    and break every later async job), so submitted work converts them to this and
    :meth:`JobRun._await` raises the original again in the job's thread.
    """

    def __init__(self, original: BaseException):
        super().__init__(repr(original))
        self.original = original


async def _guarded(awaitable):
    try:
        return await awaitable
    except results.PROCESS_EXITS as exc:
        raise _Escaped(exc) from None


class LoopThread:
    """An asyncio event loop running in a daemon thread.

    The loop survives a SystemExit or KeyboardInterrupt raised on it (by a handler's own
    background task, say): it logs it and keeps running until :meth:`stop`.
    """

    def __init__(self, name: str = "vendor-flash-loop"):
        self.loop = asyncio.new_event_loop()
        self._stop_requested = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            while not self._stop_requested.is_set():
                try:
                    self.loop.run_forever()
                except BaseException as exc:  # noqa: BLE001 - the shared loop must not die
                    if self._stop_requested.is_set():
                        break
                    get_logger().error("event loop: %s escaped from a task (%r); the loop keeps running",
                                       type(exc).__name__, exc)
                    continue
                break  # stop() was called
        finally:
            pending = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
            for task in pending:
                task.cancel()
            try:
                if pending:
                    self.loop.run_until_complete(asyncio.wait(pending, timeout=2))
                self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            except BaseException:  # noqa: BLE001 - closing anyway
                pass
            self.loop.close()

    @property
    def alive(self) -> bool:
        """True while the loop thread runs."""
        return self._thread.is_alive()

    def submit(self, awaitable) -> "Submitted":
        """Run an awaitable as a task on the loop; returns its :class:`Submitted`.

        A SystemExit or KeyboardInterrupt it raises reaches the result as :class:`_Escaped`.
        """
        return Submitted(self.loop, awaitable)

    def stop(self) -> None:
        """Stop the loop (pending tasks are abandoned)."""
        self._stop_requested.set()
        if not self.loop.is_closed():
            try:
                self.loop.call_soon_threadsafe(self.loop.stop)
            except RuntimeError:  # closed meanwhile
                pass
        self._thread.join(timeout=5)


class Submitted:
    """An awaitable running as a task on a :class:`LoopThread`, seen from other threads.

    :meth:`cancel` asks the task to stop (its code gets ``asyncio.CancelledError``), and the
    task counts as ended only when its code has ended: a handler that awaits a cleanup before
    re-raising, or ignores the cancellation, is still running until then. (The future of
    ``asyncio.run_coroutine_threadsafe`` counts as cancelled as soon as it is asked to.)
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, awaitable):
        self._loop = loop
        self._future: concurrent.futures.Future = concurrent.futures.Future()
        self._task: Optional[asyncio.Task] = None
        self._done = threading.Event()  # set once _future is: concurrent.futures.wait() misses its cancel()
        self._cancel_asked = False
        self._lock = threading.Lock()
        self._awaitable = awaitable
        loop.call_soon_threadsafe(self._start, awaitable)

    def _start(self, awaitable) -> None:  # on the loop
        with self._lock:
            cancel_asked = self._cancel_asked
        if cancel_asked:
            # stopped before its task could start: its code never runs (as a task cancelled
            # before its first step), and it is closed here, not left for the garbage collector
            # to warn "coroutine ... was never awaited"
            self._close_unstarted()
            self._future.cancel()
            self._done.set()
            return
        try:
            self._task = self._loop.create_task(_guarded(awaitable))
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            self._future.set_exception(exc)
            self._done.set()
            return
        self._task.add_done_callback(self._ended)

    def _close_unstarted(self) -> None:
        """Close the awaitable if its code never started (a coroutine still CORO_CREATED)."""
        awaitable = self._awaitable
        if inspect.iscoroutine(awaitable) and inspect.getcoroutinestate(awaitable) == inspect.CORO_CREATED:
            awaitable.close()

    def _ended(self, task: asyncio.Task) -> None:  # on the loop
        if task.cancelled():
            self._close_unstarted()  # cancelled before its first step (the loop shutting down)
            self._future.cancel()
        elif task.exception() is not None:
            self._future.set_exception(task.exception())
        else:
            self._future.set_result(task.result())
        self._done.set()

    def cancel(self) -> None:
        """Ask the task to stop; any thread. Only the first call counts: a second
        ``CancelledError`` would interrupt the cleanup the first one started."""
        with self._lock:
            if self._cancel_asked:
                return
            self._cancel_asked = True
        try:
            # queued after _start (submitted first), so the task exists when this runs
            self._loop.call_soon_threadsafe(self._cancel_task)
        except RuntimeError:  # the loop is closed
            pass

    def _cancel_task(self) -> None:  # on the loop
        if self._task is not None:
            self._task.cancel()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Wait up to ``timeout`` seconds for the task to end; True once it has."""
        return self._done.wait(timeout)

    def result(self) -> Any:
        """Wait for the task to end; its result, or its exception (``CancelledError`` when cancelled)."""
        return self._future.result()


class MainThreadRunner:
    """Runs the code of sync handlers and generators on one thread, the one calling :meth:`serve`.

    runpod-python calls a sync handler (and steps a sync generator) on its event loop, in the
    main thread: a handler may call ``signal.signal()`` (a ``SIGALRM`` timeout), and state set
    on the main thread at import (``torch.set_grad_enabled(False)``, ``torch.cuda.set_device``,
    a ``decimal`` context) applies to it. The worker serves this runner from its main thread.
    One job holds it at a time (:meth:`acquire`); a job that finds it held runs in its own
    thread, so sync jobs still run in parallel when a ``concurrency_modifier`` allows it.
    """

    def __init__(self):
        self._cond = threading.Condition()
        self._items: collections.deque = collections.deque()
        self._held = False
        self._open = False

    def open(self) -> None:
        """Accept jobs (the caller is about to :meth:`serve`)."""
        with self._cond:
            self._open = True

    def acquire(self) -> bool:
        """Reserve the thread for one job; False when another job holds it or it is not served."""
        with self._cond:
            if self._held or not self._open:
                return False
            self._held = True
            return True

    def release(self) -> None:
        """End the reservation made by :meth:`acquire`."""
        with self._cond:
            self._held = False

    def call(self, fn: Callable, *args: Any) -> Any:
        """Run ``fn(*args)`` on the serving thread and return its result or raise its exception.

        Once the runner is closed, ``fn`` runs in the calling thread instead.
        """
        item = [fn, args, threading.Event(), None, None]  # fn, args, done, value, error
        with self._cond:
            queued = self._open
            if queued:
                self._items.append(item)
                self._cond.notify_all()
        if not queued:
            return fn(*args)
        item[2].wait()
        if item[4] is not None:
            error, item[4] = item[4], None
            raise error
        return item[3]

    def wake(self) -> None:
        """Make :meth:`serve` check its condition now."""
        with self._cond:
            self._cond.notify_all()

    def serve(self, until: Callable[[], bool], timeout: Optional[float] = None) -> None:
        """Run queued calls until ``until()`` is true (checked at least every 0.5 s) or ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not until():
            wait = 0.5
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
                if wait <= 0:
                    return
            with self._cond:
                if not self._items:
                    self._cond.wait(wait)
                item = self._items.popleft() if self._items else None
            if item is not None:
                self._run(item)

    @staticmethod
    def _run(item: list) -> None:
        fn, args, done = item[0], item[1], item[2]
        try:
            item[3] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the job's thread, which reports it
            item[4] = exc
        finally:
            done.set()

    def close(self) -> None:
        """Stop serving: later calls run in their caller's thread; queued ones are refused."""
        with self._cond:
            self._open = False
            items = list(self._items)
            self._items.clear()
        for item in items:  # jobs still waiting after the drain are stopped ones: not run
            item[4] = RuntimeError("the worker stopped before this handler could run")
            item[2].set()


#: A repeat of the first stop signal within this many seconds is taken as the same request:
#: ``timeout -s TERM``, a shell's Ctrl-C or a supervisor may signal both the process and its
#: process group, so one stop arrives twice within milliseconds.
REPEAT_SIGNAL_WINDOW = 1.0


class StopSignals:
    """Tells a first stop signal from a repeat of it and from a second one.

    :meth:`classify` answers ``"first"`` (stop gracefully), ``"repeat"`` (the same signal again
    within :data:`REPEAT_SIGNAL_WINDOW` of the first: ignore it) or ``"second"`` (any later
    signal, or another signal: exit at once).
    """

    def __init__(self, window: float = REPEAT_SIGNAL_WINDOW):
        self.window = window
        self.first: Optional[int] = None
        self.first_at = 0.0

    def classify(self, signum: int) -> str:
        now = time.monotonic()
        if self.first is None:
            self.first, self.first_at = signum, now
            return "first"
        if signum == self.first and now - self.first_at < self.window:
            return "repeat"
        return "second"


#: A stopped async handler that has not ended this many seconds after the stop gets an ERROR
#: line (once). It is still waited for: its job stays listed in the pings and holds its slot.
STOP_REPORT_SECONDS = 30.0


class JobCancelled(Exception):
    """Raised by :class:`JobRun` when the job was cancelled while running."""


class ChunkNotDelivered(Exception):
    """Raised by an ``on_chunk`` callback when a stream chunk could not be delivered.

    The generator is stopped and the job ends with ``{"error": str(exc)}``.
    """


class JobRun:
    """One execution of a handler for one job.

    ``on_chunk(value)`` is called in the running thread for each value a generator yields
    (before the job ends); it may raise :class:`ChunkNotDelivered` to end the job with an
    error. :meth:`cancel` may be called from any thread: async handlers get
    ``asyncio.CancelledError`` at their next ``await``; generators stop at their next yield;
    a sync handler runs to its end and its result is dropped; a job cancelled before its
    handler started does not run it (of any form). :meth:`run` returns only once
    the handler's code has ended, so a stopped job is not over while its handler still runs
    (an async one awaiting a cleanup after the ``CancelledError``, or ignoring it).

    A handler that raises SystemExit or KeyboardInterrupt gets an error result (see
    :func:`result.exit_result`) and the exception is kept in :attr:`exit_exception`, so the
    caller can end the process once it is safe to.
    """

    def __init__(
        self,
        handler: Callable,
        job: Dict[str, Any],
        loop: LoopThread,
        kind: Optional[HandlerKind] = None,
        aggregate_stream: bool = False,
        on_chunk: Optional[Callable[[Any], None]] = None,
        worker_id: str = "unknown",
        hostname: str = "unknown",
    ):
        self.handler = handler
        self.job = job
        self.loop = loop
        self.kind = kind or handler_kind(handler)
        self.aggregate_stream = aggregate_stream
        self.on_chunk = on_chunk
        self.worker_id = worker_id
        self.hostname = hostname
        self._cancelled = threading.Event()
        self._lock = threading.Lock()
        self._submitted: Optional[Submitted] = None
        self._cancelled_at = 0.0
        #: Seconds after a stop before a handler that still runs is reported (ERROR).
        self.stop_report_after = STOP_REPORT_SECONDS
        #: The SystemExit or KeyboardInterrupt the handler raised, if it did.
        self.exit_exception: Optional[BaseException] = None
        #: The job-done body the handler came to after its job was cancelled (not posted).
        self.cancelled_body: Optional[Dict[str, Any]] = None
        #: Runs the handler's sync code elsewhere (:meth:`MainThreadRunner.call`); None: here.
        self.call: Optional[Callable[..., Any]] = None

    @property
    def cancelled(self) -> bool:
        """True once :meth:`cancel` was called."""
        return self._cancelled.is_set()

    def cancel(self) -> None:
        """Ask the running handler to stop. Safe to call from any thread, more than once."""
        with self._lock:
            if not self._cancelled.is_set():
                self._cancelled_at = time.monotonic()
                self._cancelled.set()
            submitted = self._submitted
        if submitted is not None:
            submitted.cancel()

    def run(self) -> Dict[str, Any]:
        """Run the handler to its end and return the job-done body.

        Raises :class:`JobCancelled` if the job was cancelled (no result must be posted); one
        cancelled before it started does not call the handler at all.
        """
        if self.cancelled:
            # stopped between its take and here: its handler is not run (a sync one would run
            # to its end, holding the worker, for a result that is dropped)
            raise JobCancelled(self.job.get("id"))
        if self.kind.is_stream:
            result = self._run_stream()
        else:
            result = self._run_single()
        if self.cancelled:
            self.cancelled_body = result
            raise JobCancelled(self.job.get("id"))
        return result

    # -- internals --------------------------------------------------------------------------

    def _sync(self, fn: Callable, *args: Any) -> Any:
        """Run sync handler code: through :attr:`call` when set, else in this thread."""
        return fn(*args) if self.call is None else self.call(fn, *args)

    def _await(self, coro) -> Any:
        """Run ``coro`` on the loop and wait for it to end, honouring cancellation.

        A cancel stops its task, and this still waits until the task has ended: the handler
        runs until then, so its job must stay with the worker (listed in its pings, holding its
        slot) and the next job must not start beside it.
        """
        submitted = self.loop.submit(coro)
        with self._lock:
            self._submitted = submitted
        if self.cancelled:
            submitted.cancel()
        try:
            self._wait(submitted)
            return submitted.result()
        except concurrent.futures.CancelledError as exc:
            if self.cancelled:
                raise JobCancelled(self.job.get("id")) from exc
            raise  # the handler's task was cancelled by the handler itself: an error
        except _Escaped as escaped:
            raise escaped.original from None
        finally:
            with self._lock:
                self._submitted = None

    def _wait(self, submitted: Submitted) -> None:
        """Wait for ``submitted`` to end, however long it takes; after a stop, a handler still
        running :attr:`stop_report_after` seconds later is reported once at ERROR."""
        reported = False
        while not submitted.wait(None if reported else 1.0):
            if not self.cancelled:
                continue
            stopped_for = time.monotonic() - self._cancelled_at
            if stopped_for >= self.stop_report_after:
                get_logger().error(
                    "handler still running %.0f s after the job was stopped (asyncio.CancelledError caught "
                    "and not re-raised, or a long cleanup): the job stays listed in this worker's pings "
                    "and holds its slot until the handler returns", stopped_for,
                    extra={"job_id": self.job.get("id")})
                reported = True

    def _run_single(self) -> Dict[str, Any]:
        try:
            output = self._sync(self.handler, self.job)
            if inspect.isawaitable(output):
                output = self._await(output)
            return results.normalize_output(output)
        except JobCancelled:
            raise
        except results.PROCESS_EXITS as exc:
            self.exit_exception = exc
            if self.cancelled:
                raise JobCancelled(self.job.get("id")) from exc
            return results.exit_result(exc, self.worker_id, self.hostname)
        except BaseException as exc:  # noqa: BLE001 - every handler error is reported
            if self.cancelled:
                raise JobCancelled(self.job.get("id")) from exc
            info = results.error_info(exc, self.worker_id, self.hostname)
            # as runpod-python's run_job: the bare message, then the report indented by 4
            extra = {"job_id": self.job.get("id")}
            get_logger().error("Captured Handler Exception", extra=extra)
            get_logger().error("%s", json.dumps(info, indent=4), extra=extra)
            return {"error": json.dumps(info)}

    def _run_stream(self) -> Dict[str, Any]:
        try:
            return self._run_stream_body()
        finally:
            # runpod-python's run_job_generator logs this when the generator ends, however it ended
            get_logger().info("Finished running generator.", extra={"job_id": self.job.get("id")})

    def _run_stream_body(self) -> Dict[str, Any]:
        chunks: List[Any] = []
        try:
            if self.kind is HandlerKind.ASYNC_GENERATOR:
                terminal = self._drain_async(self.handler(self.job), chunks)
            else:
                terminal = self._drain_sync(self._sync(self.handler, self.job), chunks)
        except JobCancelled:
            raise
        except ChunkNotDelivered as exc:
            if self.cancelled:
                raise JobCancelled(self.job.get("id")) from exc
            return {"error": str(exc)}
        except results.PROCESS_EXITS as exc:
            self.exit_exception = exc
            if self.cancelled:
                raise JobCancelled(self.job.get("id")) from exc
            return results.exit_result(exc, self.worker_id, self.hostname, stream=True)
        except BaseException as exc:  # noqa: BLE001
            if self.cancelled:
                raise JobCancelled(self.job.get("id")) from exc
            body = results.generator_exception_result(exc)
            extra = {"job_id": self.job.get("id")}
            # as runpod-python: str(err) alone (its type name when that is empty); the traceback
            # is in the job's error, and in the DEBUG line after
            get_logger().error("%s", str(exc) or type(exc).__name__, extra=extra)
            get_logger().debug("%s", body["error"], extra=extra)
            return body
        if terminal is not None:
            return terminal
        return results.stream_final_result(chunks, self.aggregate_stream)

    def _emit(self, value: Any, chunks: List[Any]) -> Optional[Dict[str, Any]]:
        terminal = results.chunk_error(value)
        if terminal is not None:
            return terminal
        if self.on_chunk is not None:
            self.on_chunk(value)
        if self.aggregate_stream:
            chunks.append(value)
        return None

    def _drain_sync(self, gen, chunks: List[Any]) -> Optional[Dict[str, Any]]:
        try:
            iterator = iter(gen)
            while True:
                try:
                    value = self._sync(next, iterator)
                except StopIteration:
                    return None
                if self.cancelled:
                    raise JobCancelled(self.job.get("id"))
                terminal = self._emit(value, chunks)
                if terminal is not None:
                    return terminal
                if self.cancelled:
                    raise JobCancelled(self.job.get("id"))
        finally:
            close = getattr(gen, "close", None)
            if close is not None:
                try:
                    self._sync(close)
                except Exception:  # noqa: BLE001 - closing must not mask the outcome
                    pass

    def _drain_async(self, agen, chunks: List[Any]) -> Optional[Dict[str, Any]]:
        try:
            while True:
                try:
                    value = self._await(agen.__anext__())
                except StopAsyncIteration:
                    return None
                if self.cancelled:  # it went on after the CancelledError: its value is not sent
                    raise JobCancelled(self.job.get("id"))
                terminal = self._emit(value, chunks)
                if terminal is not None:
                    return terminal
                if self.cancelled:
                    raise JobCancelled(self.job.get("id"))
        finally:
            try:
                # the generator's cleanup (its finally) is the handler still running: waited for
                closing = self.loop.submit(agen.aclose())
                self._wait(closing)
                closing.result()
            except BaseException:  # noqa: BLE001 - closing must not mask the outcome
                pass

