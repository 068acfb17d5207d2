"""Running jobs through every handler form, with streaming and cancellation."""

import asyncio
import concurrent.futures
import functools
import inspect
import json
import logging
import sys
import threading
import time
import unittest

from vendor_flash.serverless.handler import HandlerKind, JobCancelled, JobRun, LoopThread, handler_kind

# Handler exceptions are logged at ERROR; keep the test output to the results.
logging.getLogger("vendor_flash").setLevel(logging.CRITICAL)

JOB = {"id": "j1", "input": {"n": 3}}


def sync_handler(job):
    return {"double": job["input"]["n"] * 2}


async def async_handler(job):
    await asyncio.sleep(0)
    return job["input"]["n"] + 1


def gen_handler(job):
    for i in range(job["input"]["n"]):
        yield {"i": i}


async def agen_handler(job):
    for i in range(job["input"]["n"]):
        await asyncio.sleep(0)
        yield i


class Callable:
    async def __call__(self, job):
        return "obj"


class KindTest(unittest.TestCase):
    def test_kinds(self):
        self.assertIs(handler_kind(sync_handler), HandlerKind.SYNC)
        self.assertIs(handler_kind(async_handler), HandlerKind.ASYNC)
        self.assertIs(handler_kind(gen_handler), HandlerKind.GENERATOR)
        self.assertIs(handler_kind(agen_handler), HandlerKind.ASYNC_GENERATOR)
        self.assertIs(handler_kind(functools.partial(agen_handler)), HandlerKind.ASYNC_GENERATOR)
        self.assertIs(handler_kind(Callable()), HandlerKind.ASYNC)
        self.assertIs(handler_kind(lambda job: 1), HandlerKind.SYNC)


class RunTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.loop = LoopThread()

    @classmethod
    def tearDownClass(cls):
        cls.loop.stop()

    def run_job(self, handler, aggregate=False, job=JOB):
        chunks = []
        run = JobRun(handler, dict(job), self.loop, aggregate_stream=aggregate, on_chunk=chunks.append)
        return run.run(), chunks

    def test_sync(self):
        self.assertEqual(self.run_job(sync_handler), ({"output": {"double": 6}}, []))

    def test_async(self):
        self.assertEqual(self.run_job(async_handler), ({"output": 4}, []))

    def test_sync_returning_awaitable(self):
        self.assertEqual(self.run_job(lambda job: async_handler(job)), ({"output": 4}, []))

    def test_generator_without_aggregate(self):
        result, chunks = self.run_job(gen_handler)
        self.assertEqual(result, {"output": []})
        self.assertEqual(chunks, [{"i": 0}, {"i": 1}, {"i": 2}])

    def test_generator_with_aggregate(self):
        result, chunks = self.run_job(gen_handler, aggregate=True)
        self.assertEqual(result, {"output": [{"i": 0}, {"i": 1}, {"i": 2}]})
        self.assertEqual(len(chunks), 3)

    def test_async_generator(self):
        self.assertEqual(self.run_job(agen_handler, aggregate=True), ({"output": [0, 1, 2]}, [0, 1, 2]))

    def test_exception(self):
        def bad(job):
            raise RuntimeError("nope")
        result, _ = self.run_job(bad)
        info = json.loads(result["error"])
        self.assertEqual(info["error_type"], "<class 'RuntimeError'>")
        self.assertEqual(info["error_message"], "nope")

    def test_exception_is_logged_as_an_error_with_its_traceback(self):
        def bad(job):
            raise RuntimeError("logged")

        def bad_stream(job):
            yield 1
            raise ValueError("logged mid-stream")

        with self.assertLogs("vendor_flash", level="ERROR") as logs:
            result, _ = self.run_job(bad)
            self.run_job(bad_stream)
        # as runpod-python's run_job: "Captured Handler Exception" alone (a log alert can match
        # the message exactly), then the error report as JSON indented by 4, each its own record
        self.assertEqual(len(logs.records), 3, logs.output)
        self.assertEqual(logs.records[0].getMessage(), "Captured Handler Exception")
        report = logs.records[1].getMessage()
        self.assertTrue(report.startswith('{\n    "error_type": "<class \'RuntimeError\'>",\n'), report)
        self.assertEqual(json.loads(report), json.loads(result["error"]))
        self.assertIn("Traceback", report)
        self.assertEqual(logs.records[2].getMessage(), "logged mid-stream")

    def test_generator_exception_is_logged_as_runpod_python(self):
        # runpod-python's run_job_generator logs str(err) at ERROR (no traceback: that is in the
        # job's error), then "Finished running generator." at INFO, both with the job id.
        def bad_stream(job):
            yield 1
            raise ValueError("broke mid-stream")

        def good_stream(job):
            yield 1

        def silent(job):
            yield 1
            raise ValueError()

        with self.assertLogs("vendor_flash", level="DEBUG") as logs:
            result, _ = self.run_job(bad_stream)
        lines = [(r.levelname, r.getMessage(), getattr(r, "job_id", None)) for r in logs.records]
        self.assertEqual(lines[0], ("ERROR", "broke mid-stream", "j1"), lines)
        self.assertEqual(lines[-1], ("INFO", "Finished running generator.", "j1"), lines)
        # the whole error string, traceback included, only at DEBUG
        self.assertIn(("DEBUG", result["error"], "j1"), lines)
        with self.assertLogs("vendor_flash", level="INFO") as logs:
            self.run_job(good_stream)
            self.run_job(silent)
        self.assertEqual([(r.levelname, r.getMessage()) for r in logs.records],
                         [("INFO", "Finished running generator."), ("ERROR", "ValueError"),
                          ("INFO", "Finished running generator.")])

    def test_async_exception(self):
        async def bad(job):
            await asyncio.sleep(0)
            raise KeyError("k")
        info = json.loads(self.run_job(bad)[0]["error"])
        self.assertEqual(info["error_type"], "<class 'KeyError'>")

    def test_generator_exception(self):
        def bad(job):
            yield 1
            raise ValueError("mid-stream")
        result, chunks = self.run_job(bad, aggregate=True)
        self.assertEqual(chunks, [1])
        self.assertTrue(result["error"].startswith("handler: mid-stream \ntraceback:"))

    def test_yielded_error_ends_the_stream(self):
        def gen(job):
            yield 1
            yield {"error": "stop here"}
            yield 2
        result, chunks = self.run_job(gen, aggregate=True)
        self.assertEqual(result, {"error": "stop here"})
        self.assertEqual(chunks, [1])

    def test_cancel_async(self):
        seen = []
        started = threading.Event()

        async def slow(job):
            started.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                seen.append("cancelled")
                raise
            return "late"

        run = JobRun(slow, dict(JOB), self.loop)
        threading.Thread(target=lambda: (started.wait(5), run.cancel())).start()
        t0 = time.monotonic()
        with self.assertRaises(JobCancelled):
            run.run()
        self.assertLess(time.monotonic() - t0, 5)
        deadline = time.monotonic() + 5
        while not seen and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertEqual(seen, ["cancelled"])

    def stop_when(self, run, event):
        threading.Thread(target=lambda: (event.wait(5), run.cancel()), daemon=True).start()

    def test_cancelled_async_handler_is_over_only_when_its_cleanup_is(self):
        # the RunPod docs' pattern: catch CancelledError, await a cleanup, re-raise
        started, state = threading.Event(), {}

        async def handler(job):
            started.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                await asyncio.sleep(1)
                state["cleanup_done"] = True
                raise

        run = JobRun(handler, dict(JOB), self.loop)
        self.stop_when(run, started)
        with self.assertRaises(JobCancelled):
            run.run()
        self.assertEqual(state, {"cleanup_done": True})

    def test_async_handler_that_ignores_the_stop_is_waited_for_and_reported(self):
        started, seen = threading.Event(), {}

        async def handler(job):
            started.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                pass  # goes on regardless, here until the worker has said so
            for _ in range(1000):
                if seen["logs"].records:
                    break
                await asyncio.sleep(0.01)
            return {"refresh_worker": True, "late": 1}

        run = JobRun(handler, dict(JOB), self.loop)
        run.stop_report_after = 0.0
        self.stop_when(run, started)
        with self.assertLogs("vendor_flash", level="ERROR") as logs:
            seen["logs"] = logs
            with self.assertRaises(JobCancelled):
                run.run()
        # it ran to its end: what it returned is there (refresh_worker still recycles the worker)
        self.assertEqual(run.cancelled_body, {"output": {"late": 1}, "stopPod": True})
        self.assertEqual(len(logs.records), 1, logs.output)
        self.assertIn("handler still running", logs.records[0].getMessage())
        self.assertEqual(logs.records[0].job_id, JOB["id"])

    def test_cancelled_async_generator_is_over_only_when_its_cleanup_is(self):
        started, state = threading.Event(), []

        async def agen(job):
            try:
                yield 1
                started.set()
                try:
                    await asyncio.sleep(30)
                except asyncio.CancelledError:
                    await asyncio.sleep(0.5)
                    state.append("cleanup")
                    yield "after the stop"  # ignores it: its value is not sent
                    state.append("resumed")
            finally:
                state.append("closed")

        chunks = []
        run = JobRun(agen, dict(JOB), self.loop, on_chunk=chunks.append)
        self.stop_when(run, started)
        with self.assertRaises(JobCancelled):
            run.run()
        self.assertEqual(state, ["cleanup", "closed"])  # closed by the worker, not left running
        self.assertEqual(chunks, [1])

    def test_cancel_sync_drops_result(self):
        gate = threading.Event()

        def blocking(job):
            gate.wait(5)
            return "done"

        run = JobRun(blocking, dict(JOB), self.loop)
        run.cancel()
        gate.set()
        with self.assertRaises(JobCancelled):
            run.run()

    def test_a_job_stopped_before_its_handler_starts_does_not_run_it(self):
        # a stop that reaches the worker between its take and the handler's start: the handler
        # is not called (a sync one ran to its end before, holding the worker for a dropped result)
        called = []

        def sync(job):
            called.append("sync")
            return "late"

        async def coro(job):
            called.append("async")
            return "late"

        def gen(job):
            called.append("generator")
            yield "late"

        async def agen(job):
            called.append("async generator")
            yield "late"

        for handler in (sync, coro, gen, agen):
            chunks = []
            run = JobRun(handler, dict(JOB), self.loop, on_chunk=chunks.append)
            run.cancel()
            with self.assertRaises(JobCancelled):
                run.run()
            self.assertEqual(chunks, [])
        self.assertEqual(called, [])

    def test_a_task_stopped_before_the_loop_starts_it_is_closed_not_left_unawaited(self):
        # the stop reaches the task before the loop has run it: its code never runs, and its
        # coroutine is closed (it was left to the garbage collector, which printed "RuntimeWarning:
        # coroutine 'handler' was never awaited" on the worker's stderr for a cancelled job)
        ran, gate = [], threading.Event()

        async def handler(job):
            ran.append(True)

        self.loop.loop.call_soon_threadsafe(gate.wait, 5)  # the loop is busy until the gate opens
        coroutine = handler(JOB)
        submitted = self.loop.submit(coroutine)
        submitted.cancel()
        gate.set()
        self.assertTrue(submitted.wait(5))
        with self.assertRaises(concurrent.futures.CancelledError):
            submitted.result()
        self.assertEqual(ran, [])
        self.assertEqual(inspect.getcoroutinestate(coroutine), inspect.CORO_CLOSED)

    def test_cancel_generator_between_yields(self):
        produced = []

        def gen(job):
            for i in range(100):
                produced.append(i)
                yield i

        holder = {}

        def on_chunk(value):
            if value == 2:
                holder["run"].cancel()

        run = JobRun(gen, dict(JOB), self.loop, on_chunk=on_chunk)
        holder["run"] = run
        with self.assertRaises(JobCancelled):
            run.run()
        self.assertEqual(produced, [0, 1, 2])

    def test_cancel_async_generator(self):
        closed = []

        async def agen(job):
            try:
                for i in range(100):
                    await asyncio.sleep(0.01)
                    yield i
            finally:
                closed.append(True)

        holder = {}

        def on_chunk(value):
            if value == 1:
                holder["run"].cancel()

        run = JobRun(agen, dict(JOB), self.loop, on_chunk=on_chunk)
        holder["run"] = run
        with self.assertRaises(JobCancelled):
            run.run()
        self.assertEqual(closed, [True])

    def test_concurrent_async_jobs_share_the_loop(self):
        async def wait(job):
            await asyncio.sleep(0.3)
            return job["id"]

        results = []
        threads = [threading.Thread(target=lambda i=i: results.append(
            JobRun(wait, {"id": i, "input": {}}, self.loop).run())) for i in range(10)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertLess(time.monotonic() - t0, 2.5)
        self.assertEqual(sorted(r["output"] for r in results), list(range(10)))



class ProcessExitTest(unittest.TestCase):
    """SystemExit and KeyboardInterrupt from a handler: an error result, the exception kept, the loop alive."""

    def setUp(self):
        self.loop = LoopThread()
        self.addCleanup(self.loop.stop)

    def run_job(self, handler):
        run = JobRun(handler, dict(JOB), self.loop, on_chunk=lambda value: None)
        return run, run.run()

    def assert_loop_works(self):
        self.assertTrue(self.loop.alive)
        self.assertEqual(JobRun(async_handler, dict(JOB), self.loop).run(), {"output": 4})

    def test_sync_sys_exit(self):
        def handler(job):
            sys.exit(3)
        run, result = self.run_job(handler)
        self.assertIsInstance(run.exit_exception, SystemExit)
        info = json.loads(result["error"])
        self.assertEqual(info["error_type"], "<class 'SystemExit'>")
        self.assertIn("sys.exit(3)", info["error_message"])
        self.assertIs(result["stopPod"], True)

    def test_async_sys_exit_keeps_the_loop(self):
        async def handler(job):
            await asyncio.sleep(0)
            sys.exit(3)
        run, result = self.run_job(handler)
        self.assertEqual(run.exit_exception.code, 3)
        self.assertEqual(json.loads(result["error"])["error_type"], "<class 'SystemExit'>")
        self.assert_loop_works()

    def test_async_keyboard_interrupt_keeps_the_loop(self):
        async def handler(job):
            raise KeyboardInterrupt
        run, result = self.run_job(handler)
        self.assertIsInstance(run.exit_exception, KeyboardInterrupt)
        self.assertIn("status 130", json.loads(result["error"])["error_message"])
        self.assert_loop_works()

    def test_async_generator_sys_exit_keeps_the_loop(self):
        async def agen(job):
            yield 1
            sys.exit(5)
        run, result = self.run_job(agen)
        self.assertTrue(result["error"].startswith("handler: SystemExit(5): the handler called sys.exit(5)"), result)
        self.assertEqual(run.exit_exception.code, 5)
        self.assert_loop_works()

    def test_stray_task_sys_exit_does_not_end_the_loop(self):
        async def handler(job):
            asyncio.get_running_loop().call_soon(sys.exit, 9)  # not part of the job
            await asyncio.sleep(0.05)
            return "still here"
        logging.getLogger("vendor_flash").disabled = True
        self.addCleanup(setattr, logging.getLogger("vendor_flash"), "disabled", False)
        run, result = self.run_job(handler)
        self.assertEqual(result, {"output": "still here"})
        self.assertIsNone(run.exit_exception)
        self.assert_loop_works()

    def test_handler_cancelling_itself_is_an_error_not_a_stop(self):
        async def handler(job):
            raise asyncio.CancelledError()
        run, result = self.run_job(handler)
        self.assertIn("CancelledError", json.loads(result["error"])["error_type"])


class ChunkNotDeliveredTest(unittest.TestCase):
    def test_ends_the_stream_with_the_error(self):
        from vendor_flash.serverless.handler import ChunkNotDelivered

        loop = LoopThread()
        self.addCleanup(loop.stop)
        produced = []

        def gen(job):
            for i in range(10):
                produced.append(i)
                yield i

        def on_chunk(value):
            if value == 2:
                raise ChunkNotDelivered("stream chunk 3 could not be delivered")

        result = JobRun(gen, dict(JOB), loop, aggregate_stream=True, on_chunk=on_chunk).run()
        self.assertEqual(result, {"error": "stream chunk 3 could not be delivered"})
        self.assertEqual(produced, [0, 1, 2])


if __name__ == "__main__":
    unittest.main()
