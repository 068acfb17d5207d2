"""The worker loop against an in-process fake of flashd's worker routes."""

import asyncio
import dataclasses
import datetime
import json
import logging
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

from fakeserver import FakeFlashd
from vendor_flash.serverless import progress_update
from vendor_flash.serverless.env import WorkerEnv
from vendor_flash.serverless.log import setup as setup_logging
from vendor_flash.serverless.worker import TOO_DEEP_ERROR, Worker

if os.environ.get("VF_TEST_LOG"):
    setup_logging(os.environ["VF_TEST_LOG"])
else:
    logging.getLogger("vendor_flash").setLevel(logging.CRITICAL)


class WorkerTestCase(unittest.TestCase):
    hold = 1.5

    def setUp(self):
        self.fake = FakeFlashd(hold=self.hold).start()
        self.addCleanup(self.fake.stop)

    def start_worker(self, config, **env_overrides):
        env = self.fake.env(**env_overrides)
        worker = Worker(config, WorkerEnv.from_environ(env))
        worker.transport.retry_delays = (0.01, 0.02, 0.04, 0.08)
        result = {}
        thread = threading.Thread(target=lambda: result.setdefault("rc", worker.run()), daemon=True)
        thread.start()

        def stop():
            worker.request_shutdown("test over")
            thread.join(10)

        self.addCleanup(stop)
        return worker, thread, result

    def done_posts(self, job_id):
        return self.fake.recorded("job-done", job_id)

    def final_post(self, job_id, timeout=10):
        def find():
            return [r for r in self.done_posts(job_id) if not r.refused and r.json().get("status") != "IN_PROGRESS"]
        return self.fake.wait_for(find, timeout)[-1]


class BasicFlowTest(WorkerTestCase):
    def test_sync_job_result_and_headers(self):
        self.start_worker({"handler": lambda job: {"sum": sum(job["input"])}})
        job_id = self.fake.submit([1, 2, 3])
        post = self.final_post(job_id)
        self.assertEqual(post.json(), {"output": {"sum": 6}})
        self.assertEqual(post.query["isStream"], "false")
        self.assertEqual(post.query["gpu"], "cpu")
        self.assertEqual(post.parts, ["w1", job_id])
        self.assertEqual(post.headers["authorization"], "worker-key")
        take = self.fake.recorded("job-take")[0]
        self.assertEqual(take.parts, ["w1"])
        self.assertEqual(take.query["job_in_progress"], "0")
        self.assertEqual(take.headers["authorization"], "worker-key")

    def job_lines(self, handler, job_input=None):
        """(level, message) of the lines a job logs, tagged with its id, at INFO and above."""
        self.start_worker({"handler": handler})
        with self.assertLogs("vendor_flash", level="INFO") as logs:
            job_id = self.fake.submit({} if job_input is None else job_input)
            self.final_post(job_id)
            self.fake.wait_for(lambda: any(r.getMessage() == "Finished." for r in logs.records))
        return [(r.levelname, r.getMessage()) for r in logs.records if getattr(r, "job_id", None) == job_id]

    def test_job_lines_read_as_runpod_python(self):
        # runpod-python logs "Started." and, after the result post, "Finished." (INFO, tagged
        # with the job id); log-based alerts and runbooks match them word for word.
        lines = self.job_lines(lambda job: "ok")
        self.assertEqual(lines[0], ("INFO", "Started."), lines)
        self.assertEqual(lines[-1], ("INFO", "Finished."), lines)
        self.assertRegex(lines[-2][1], r"^done in \d+\.\d{3} s \(ok\)$")

    def done_line(self, handler, job_input):
        """(level, message) of a job's ``done in`` line."""
        lines = self.job_lines(handler, job_input)
        done = [line for line in lines if line[1].startswith("done in")]
        self.assertEqual(len(done), 1, lines)
        self.assertNotIn("sk-not-for-logs", repr(lines))  # the input may hold secrets: never logged
        return done[0]

    def test_a_failed_job_is_done_at_error_with_its_error_and_never_its_input(self):
        # runpod-python logs a captured handler exception at ERROR; the job's done line, at INFO
        # before, is at ERROR too for every failed job (also one whose handler returned an
        # error, which logged nothing at ERROR), with the error on one line and no traceback
        def handler(job):
            what = job["input"]["case"]
            if what == "raise":
                raise ValueError("bad value\nsecond line")
            return {"error": "quota exceeded", "partial": 1} if what == "return" else {"error": {"code": 7}}

        expected = {"raise": "ValueError: bad value second line", "return": "quota exceeded",
                    "return_dict": '{"code": 7}'}
        self.start_worker({"handler": handler})
        with self.assertLogs("vendor_flash", level="INFO") as logs:
            ids = {case: self.fake.submit({"case": case, "api_key": "sk-not-for-logs"}) for case in expected}
            for job_id in ids.values():
                self.final_post(job_id)
            self.fake.wait_for(lambda: sum(r.getMessage() == "Finished." for r in logs.records) == len(ids))
        self.assertNotIn("sk-not-for-logs", "\n".join(logs.output))
        for case, job_id in ids.items():
            done = [(r.levelname, r.getMessage()) for r in logs.records
                    if getattr(r, "job_id", None) == job_id and r.getMessage().startswith("done in")]
            self.assertEqual(len(done), 1, logs.output)
            self.assertEqual(done[0][0], "ERROR", (case, done))
            self.assertRegex(done[0][1], r"^done in \d+\.\d{3} s \(error: .*\)$")
            self.assertEqual(done[0][1].split(" (error: ", 1)[1][:-1], expected[case], done)

    def test_a_failed_generator_job_is_done_at_error_with_its_error(self):
        def gen(job):
            yield 1
            raise KeyError("gone")

        level, message = self.done_line(gen, {"api_key": "sk-not-for-logs"})
        self.assertEqual(level, "ERROR", message)
        self.assertRegex(message, r"^done in \d+\.\d{3} s \(error: 'gone'\)$")

    def test_generator_job_lines_read_as_runpod_python(self):
        def gen(job):
            yield 1

        lines = self.job_lines(gen)
        self.assertEqual(lines[0], ("INFO", "Started."), lines)
        self.assertEqual(lines[-1], ("INFO", "Finished."), lines)
        self.assertEqual([m for _, m in lines].count("Finished."), 1, lines)

    def test_job_posts_carry_the_job_id_as_x_request_id(self):
        # runpod-python sends X-Request-ID: <job id> on its job-done and job-stream posts (progress
        # included); flashd takes it as the request id of its own log lines and error answers.
        def gen(job):
            progress_update(job, {"pct": 1})
            yield "chunk"

        self.start_worker({"handler": gen})
        job_id = self.fake.submit({})
        self.final_post(job_id)
        posts = self.done_posts(job_id) + self.fake.recorded("job-stream", job_id)
        self.assertEqual(len(posts), 3, posts)  # progress, chunk, result
        self.assertEqual([p.headers.get("x-request-id") for p in posts], [job_id] * 3)
        self.assertNotIn("x-request-id", self.fake.recorded("job-take")[0].headers)

    def test_generator_streams_then_ends(self):
        def gen(job):
            for i in range(3):
                yield f"t{i}"

        self.start_worker({"handler": gen})
        job_id = self.fake.submit({})
        post = self.final_post(job_id)
        self.assertEqual(post.query["isStream"], "true")
        self.assertEqual(post.json(), {"output": []})
        chunks = self.fake.recorded("job-stream", job_id)
        self.assertEqual([c.json() for c in chunks], [{"output": "t0"}, {"output": "t1"}, {"output": "t2"}])
        self.assertTrue(all(c.query["isStream"] == "false" for c in chunks))
        self.assertEqual([c.query["chunk"] for c in chunks], ["1", "2", "3"])  # a retry says which chunk it is
        self.assertLess(chunks[-1].at, post.at)

    def test_generator_aggregate(self):
        async def agen(job):
            for i in range(2):
                await asyncio.sleep(0)
                yield {"i": i}

        self.start_worker({"handler": agen, "return_aggregate_stream": True})
        job_id = self.fake.submit({})
        self.assertEqual(self.final_post(job_id).json(), {"output": [{"i": 0}, {"i": 1}]})

    def test_progress_update_arrives_before_result(self):
        def handler(job):
            progress_update(job, {"pct": 50})
            return "ok"

        self.start_worker({"handler": handler})
        job_id = self.fake.submit({})
        final = self.final_post(job_id)
        posts = self.done_posts(job_id)
        self.assertEqual(posts[0].json(), {"status": "IN_PROGRESS", "output": {"pct": 50}})
        self.assertEqual(posts[0].query["isStream"], "false")
        self.assertIs(posts[-1], final)
        self.assertEqual(final.json(), {"output": "ok"})

    def test_heartbeat_lists_jobs_in_progress(self):
        gate = threading.Event()
        self.addCleanup(gate.set)

        def handler(job):
            gate.wait(10)
            return 1

        self.start_worker({"handler": handler}, interval_ms=100)
        job_id = self.fake.submit({})
        ping = self.fake.wait_for(lambda: [p for p in self.fake.recorded("ping") if p.query.get("job_id") == job_id])
        self.assertEqual(ping[0].headers["authorization"], "worker-key")
        self.assertEqual(ping[0].parts, ["w1"])
        gate.set()
        self.final_post(job_id)

    def test_invalid_job_is_skipped(self):
        served = []

        def hook(req):
            if not served:
                served.append(1)
                return 200, {"id": "no-input"}
            return None

        self.fake.hooks["job-take"] = hook
        self.start_worker({"handler": lambda job: "fine"})
        job_id = self.fake.submit({})
        self.assertEqual(self.final_post(job_id).json(), {"output": "fine"})
        self.assertEqual(self.done_posts("no-input"), [])


    def test_generator_stops_when_flashd_discards_its_chunk(self):
        # flashd answers a chunk for a job it has ended (cancel, timeout) with 200 discarded,
        # possibly before its job-stop reaches the worker
        self.fake.hooks["job-stream"] = lambda req: (200, {"ok": True, "discarded": True, "reason": "ended"})
        yielded = []

        def gen(job):
            for i in range(50):
                yielded.append(i)
                yield i
                time.sleep(0.02)

        self.start_worker({"handler": gen})
        job_id = self.fake.submit({})
        self.fake.wait_for(lambda: self.fake.recorded("job-stream", job_id))
        time.sleep(0.5)
        self.assertEqual(len(self.fake.recorded("job-stream", job_id)), 1, "no chunk after the discarded one")
        self.assertEqual(yielded, [0], "the generator was stopped at its next yield")
        self.assertEqual([p for p in self.done_posts(job_id) if not p.refused], [], "no result posted for an ended job")

    def test_job_whose_thread_cannot_start_is_handed_back_and_the_take_loop_goes_on(self):
        # threading.Thread.start raises RuntimeError at a thread or pid limit
        real_start = threading.Thread.start
        failed = []

        def start(thread):
            if thread.name == "job-first" and not failed:
                failed.append(thread.name)
                raise RuntimeError("can't start new thread")
            return real_start(thread)

        threading.Thread.start = start
        self.addCleanup(setattr, threading.Thread, "start", real_start)
        worker, _, _ = self.start_worker({"handler": lambda job: "fine"}, interval_ms=100)
        self.fake.submit({}, job_id="first")
        second = self.fake.submit({}, job_id="second")
        self.assertEqual(self.final_post(second).json(), {"output": "fine"}, "the take loop lived on")
        self.assertEqual(failed, ["job-first"])
        self.assertNotIn("first", worker.jobs, "the job is not held")
        self.fake.wait_for(lambda: [p for p in self.fake.recorded("ping") if p.at > self.done_posts(second)[-1].at])
        last = self.fake.recorded("ping")[-1]
        self.assertNotIn("first", last.query.get("job_id", ""), "the heartbeats stop listing it")
        self.assertEqual(self.done_posts("first"), [], "no result: flashd queues it again")

    def test_job_nested_too_deep_to_decode_does_not_stop_the_take_loop(self):
        # flashd accepts any JSON; Python's decoder gives up (RecursionError) near 1000 levels
        served = []
        deep = b'{"id":"too-deep","input":' + b'{"a":' * 100_000 + b'1' + b'}' * 100_000 + b'}'

        def hook(req):
            if not served:
                served.append(1)
                return 200, deep
            return None

        self.fake.hooks["job-take"] = hook
        with self.assertLogs("vendor_flash", level="INFO") as logs:
            self.start_worker({"handler": lambda job: "fine"})
            job_id = self.fake.submit({})
            self.assertEqual(self.final_post(job_id).json(), {"output": "fine"})
            # the job is not left IN_PROGRESS until its lease runs out (three times, ~95 s): it
            # fails at once, without running, and its id is read without decoding the answer
            self.assertEqual(self.final_post("too-deep").json(), {"error": TOO_DEEP_ERROR})
            self.fake.wait_for(lambda: any(r.getMessage().startswith("done (error") for r in logs.records))
        self.assertIn("nested too deeply to decode", TOO_DEEP_ERROR)
        # a failed job's done line is at ERROR, as for a job that ran
        self.assertEqual([(r.levelname, r.getMessage()) for r in logs.records if r.getMessage().startswith("done (")],
                         [("ERROR", "done (error, not run)")])

    def test_batch_with_a_job_too_deep_to_decode_runs_the_others(self):
        deep = b'{"a":' * 100_000 + b'1' + b'}' * 100_000
        served = []

        def hook(req):
            if not served:
                served.append(1)
                return 200, b'[{"id":"shallow","input":{"n":1}},{"input":' + deep + b',"id":"deep"}]'
            return None

        self.fake.hooks["job-take"] = hook
        self.start_worker({"handler": lambda job: job["input"]})
        self.assertEqual(self.final_post("shallow").json(), {"output": {"n": 1}})
        self.assertEqual(self.final_post("deep").json(), {"error": TOO_DEEP_ERROR})


class RetryTest(WorkerTestCase):
    def test_done_retried_on_5xx(self):
        failures = []

        def hook(req):
            if len(failures) < 2:
                failures.append(req)
                return 503, {"error": "busy"}
            return None

        self.fake.hooks["job-done"] = hook
        self.start_worker({"handler": lambda job: "x"})
        job_id = self.fake.submit({})
        self.fake.wait_for(lambda: len(self.done_posts(job_id)) == 3)
        self.assertEqual([p.json() for p in self.done_posts(job_id)], [{"output": "x"}] * 3)

    def test_done_not_retried_on_409(self):
        self.fake.hooks["job-done"] = lambda req: (409, {"title": "stale"})
        self.start_worker({"handler": lambda job: "x"})
        job_id = self.fake.submit({})
        self.final_post(job_id)
        time.sleep(0.3)  # would be enough for the 4 fast retries configured above
        self.assertEqual(len(self.done_posts(job_id)), 1)

    def test_a_result_refused_with_409_is_a_warning(self):
        # flashd gave the job to another attempt (a lost lease): this run's result is thrown
        # away, which the log said only at INFO ("done in … s (ok, result stale)")
        self.fake.hooks["job-done"] = lambda req: (409, {"title": "Stale job attempt"})
        self.start_worker({"handler": lambda job: "x"})
        with self.assertLogs("vendor_flash", level="INFO") as logs:
            job_id = self.fake.submit({})
            self.final_post(job_id)
            self.fake.wait_for(lambda: any(r.getMessage() == "Finished." for r in logs.records))
        done = [(r.levelname, r.getMessage()) for r in logs.records if r.getMessage().startswith("done in")]
        self.assertEqual(len(done), 1, logs.output)
        self.assertEqual(done[0][0], "WARNING", logs.output)
        self.assertRegex(done[0][1], r"^done in \d+\.\d{3} s \(ok, result stale: the job belongs to another "
                                     r"attempt \(HTTP 409\)\)$")

    def test_stream_409_stops_the_generator(self):
        produced = []

        def gen(job):
            for i in range(50):
                produced.append(i)
                yield i

        self.fake.hooks["job-stream"] = lambda req: (409, {"title": "stale"})
        worker, _, _ = self.start_worker({"handler": gen})
        job_id = self.fake.submit({})
        self.fake.wait_for(lambda: self.fake.recorded("job-stream", job_id))
        self.fake.wait_for(lambda: not worker.jobs)
        self.assertEqual(produced, [0])
        self.assertEqual(self.done_posts(job_id), [])


class SpinGuardTest(WorkerTestCase):
    hold = 0.0  # a server that answers 204 at once

    def test_no_spin_on_immediate_204(self):
        self.start_worker({"handler": lambda job: 1})
        time.sleep(2.0)
        takes = len(self.fake.recorded("job-take"))
        # 0.5 + 1 + 2 s of backoff: at most 3-4 takes in 2 s, never hundreds
        self.assertLessEqual(takes, 4)
        self.assertGreaterEqual(takes, 2)

    def test_backoff_on_errors(self):
        self.fake.hooks["job-take"] = lambda req: (500, {"title": "down"})
        self.start_worker({"handler": lambda job: 1})
        time.sleep(2.0)
        self.assertLessEqual(len(self.fake.recorded("job-take")), 4)

    def test_an_html_error_page_is_logged_on_one_line(self):
        # a reverse proxy in front of flashd answers 502 with a multi-line HTML page: each log
        # line about it stays one line (a text log is read line by line)
        page = (b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n"
                b"<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n")
        self.fake.hooks["job-take"] = lambda req: (502, page)
        failed_once = []
        self.fake.hooks["job-done"] = lambda req: None if failed_once else failed_once.append(1) or (502, page)
        self.fake.hooks["job-stop"] = lambda req: (502, page)
        self.fake.hooks["ping"] = lambda req: (502, page)
        with self.assertLogs("vendor_flash", level="INFO") as logs:
            worker, _, _ = self.start_worker({"handler": lambda job: "ok"})
            self.fake.wait_for(lambda: len(self.fake.recorded("job-take")) >= 2)
            self.fake.hooks.pop("job-take")
            job_id = self.fake.submit({})
            self.assertEqual(self.final_post(job_id).json(), {"output": "ok"})
            self.fake.wait_for(lambda: any("Finished." in line for line in logs.output))
            self.fake.wait_for(lambda: sum("HTTP 502" in line for line in logs.output) >= 4)
        about = [line for line in logs.output if "502" in line]
        for route in ("job-take got HTTP 502", "result post got HTTP 502", "job-stop got HTTP 502", "ping got HTTP 502"):
            self.assertTrue(any(route in line for line in about), (route, about))
        for line in about:
            self.assertNotIn("\n", line)
            self.assertNotIn("\r", line)
        self.assertTrue(any("<title>502 Bad Gateway</title></head> <body>" in line for line in about), about)


class ConcurrencyTest(WorkerTestCase):
    def test_batch_take_when_several_slots_free(self):
        running = []
        peak = []

        async def handler(job):
            running.append(job["id"])
            peak.append(len(running))
            await asyncio.sleep(0.5)
            running.remove(job["id"])
            return job["id"]

        ids = [self.fake.submit({}, f"c{i}") for i in range(6)]
        self.start_worker({"handler": handler, "concurrency_modifier": lambda current: 3})
        for job_id in ids:
            self.assertEqual(self.final_post(job_id).json(), {"output": job_id})
        batches = self.fake.recorded("job-take-batch")
        self.assertTrue(batches)
        self.assertEqual(batches[0].query["batch_size"], "3")
        self.assertEqual(max(peak), 3)

    def test_zero_pauses_intake_until_the_modifier_says_otherwise(self):
        allowed = threading.Event()
        calls = []

        def modifier(current):
            calls.append(current)
            return 1 if allowed.is_set() else 0

        job_id = self.fake.submit({})
        self.start_worker({"handler": lambda job: "ran", "concurrency_modifier": modifier})
        time.sleep(1.5)
        self.assertEqual(self.fake.recorded("job-take") + self.fake.recorded("job-take-batch"), [], "no take at concurrency 0")
        self.assertGreaterEqual(calls.count(0), 1, "the modifier is asked again with 0")
        allowed.set()
        self.assertEqual(self.final_post(job_id).json(), {"output": "ran"})

    def test_a_drop_to_zero_acts_once_the_take_already_parked_returns(self):
        # As runpod-python: the modifier sizes a take before it long-polls, so a take parked
        # before the drop still takes a job; intake stops after it (README, "Take").
        allowed = threading.Event()
        allowed.set()
        self.start_worker({"handler": lambda job: "ran", "concurrency_modifier": lambda current: 1 if allowed.is_set() else 0})
        self.fake.wait_for(lambda: self.fake.recorded("job-take"))
        allowed.clear()
        job_id = self.fake.submit({})
        self.assertEqual(self.final_post(job_id).json(), {"output": "ran"}, "the take parked before the drop still took a job")
        takes = len(self.fake.recorded("job-take") + self.fake.recorded("job-take-batch"))
        time.sleep(1.5)
        self.assertEqual(len(self.fake.recorded("job-take") + self.fake.recorded("job-take-batch")), takes, "no take after it at 0")

    def test_a_failing_modifier_is_said_once_and_again_when_it_works(self):
        healthy = threading.Event()
        calls = []

        def modifier(current):
            calls.append(current)
            if not healthy.is_set():
                raise KeyError("gpu")
            return 1

        gate = threading.Event()
        self.addCleanup(gate.set)
        with self.assertLogs("vendor_flash", level="INFO") as logs:
            self.start_worker({"handler": lambda job: gate.wait(10) and "ran", "concurrency_modifier": modifier})
            first = self.fake.submit({})
            self.fake.wait_for(lambda: len(calls) >= 4)  # asked each second while the job runs
            healthy.set()
            gate.set()
            self.assertEqual(self.final_post(first).json(), {"output": "ran"})
            self.fake.wait_for(lambda: any("works again" in line for line in logs.output))
        failed = [line for line in logs.output if "concurrency_modifier failed" in line]
        self.assertEqual(len(failed), 1, logs.output)
        self.assertIn("ERROR", failed[0])
        self.assertIn("(KeyError: 'gpu'): keeping concurrency 1", failed[0])

    def test_one_slot_waits_for_the_job(self):
        gate = threading.Event()
        self.addCleanup(gate.set)
        self.start_worker({"handler": lambda job: gate.wait(10)})
        first = self.fake.submit({})
        self.fake.wait_for(lambda: self.fake.recorded("job-take"))
        time.sleep(0.5)
        self.assertEqual(len(self.fake.recorded("job-take")), 1)  # no take while busy
        gate.set()
        self.final_post(first)


class MainThreadTest(WorkerTestCase):
    """runpod-python runs sync handlers and sync generators on its main thread (its event loop)."""

    def test_sync_handler_runs_on_the_thread_that_runs_the_worker(self):
        seen = []
        worker, thread, _ = self.start_worker({"handler": lambda job: seen.append(threading.current_thread()) or "ok"})
        for _ in range(2):
            self.final_post(self.fake.submit({}))
        self.assertEqual(seen, [thread, thread])

    def test_sync_generator_steps_run_on_the_thread_that_runs_the_worker(self):
        seen = []

        def gen(job):
            seen.append(threading.current_thread())
            yield 1
            seen.append(threading.current_thread())
            yield 2

        worker, thread, _ = self.start_worker({"handler": gen, "return_aggregate_stream": True})
        self.assertEqual(self.final_post(self.fake.submit({})).json(), {"output": [1, 2]})
        self.assertEqual(seen, [thread, thread])

    def test_sync_jobs_still_run_in_parallel_with_a_concurrency_modifier(self):
        both = threading.Barrier(2, timeout=10)
        seen = []

        def handler(job):
            seen.append(threading.current_thread())
            both.wait()  # returns only once both jobs run at the same time
            return "ok"

        worker, thread, _ = self.start_worker({"handler": handler, "concurrency_modifier": lambda c: 2})
        ids = [self.fake.submit({}) for _ in range(2)]
        for job_id in ids:
            self.assertEqual(self.final_post(job_id).json(), {"output": "ok"})
        self.assertEqual(seen.count(thread), 1, seen)  # one on the worker's thread, one on its own

    def test_shutdown_while_a_sync_handler_runs_on_the_main_thread(self):
        started = threading.Event()

        def handler(job):
            started.set()
            time.sleep(0.5)
            return threading.current_thread().name

        worker, thread, result = self.start_worker({"handler": handler})
        job_id = self.fake.submit({})
        self.assertTrue(started.wait(10))
        worker.request_shutdown("test")
        thread.join(10)
        self.assertEqual(result.get("rc"), 0)
        self.assertEqual(self.final_post(job_id, timeout=0.1).json(), {"output": thread.name})


class StopTest(WorkerTestCase):
    def test_stop_cancels_async_handler_without_result(self):
        cancelled = threading.Event()
        started = threading.Event()

        async def handler(job):
            if not job["input"].get("slow"):
                return "quick"
            started.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        worker, _, _ = self.start_worker({"handler": handler})
        job_id = self.fake.submit({"slow": True})
        self.assertTrue(started.wait(10))
        self.fake.stop_job(job_id)
        self.assertTrue(cancelled.wait(10))
        self.fake.wait_for(lambda: not worker.jobs)
        self.assertEqual(self.done_posts(job_id), [])
        # and it takes the next job
        nxt = self.fake.submit({})
        self.assertEqual(self.final_post(nxt).json(), {"output": "quick"})

    def test_stopped_async_handler_holds_its_slot_until_its_cleanup_ends(self):
        # the RunPod docs' pattern (catch CancelledError, await a cleanup, re-raise): the job is
        # still listed and the one slot still taken while the cleanup runs, so the next job
        # waits for it instead of starting beside it
        started, cleaning = threading.Event(), threading.Event()
        gate = threading.Event()
        self.addCleanup(gate.set)
        marks = []

        async def handler(job):
            if job["input"].get("next"):
                marks.append("next started")
                return "next"
            started.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cleaning.set()
                while not gate.is_set():
                    await asyncio.sleep(0.01)
                marks.append("cleanup done")
                raise

        worker, _, _ = self.start_worker({"handler": handler})
        first = self.fake.submit({}, "first")
        self.assertTrue(started.wait(10))
        self.fake.stop_job(first)
        self.assertTrue(cleaning.wait(10))
        t0 = time.monotonic()
        nxt = self.fake.submit({"next": True}, "next")
        pings = self.fake.wait_for(lambda: [p for p in self.fake.recorded("ping") if p.at > t0][3:])
        self.assertEqual({p.query.get("job_id") for p in pings}, {first})
        self.assertEqual([r for r in self.fake.recorded("job-take") if r.at > t0], [])
        self.assertEqual(marks, [])
        self.assertEqual(list(worker.in_progress_ids()), [first])
        gate.set()
        self.assertEqual(self.final_post(nxt).json(), {"output": "next"})
        self.assertEqual(marks, ["cleanup done", "next started"])
        self.assertEqual(self.done_posts(first), [])

    def test_stop_of_a_sync_job_drops_its_result_without_spinning(self):
        gate = threading.Event()
        self.addCleanup(gate.set)
        started = threading.Event()

        def handler(job):
            started.set()
            gate.wait(10)
            return "too late"

        worker, _, _ = self.start_worker({"handler": handler}, interval_ms=60_000)
        self.fake.wait_for(lambda: self.fake.recorded("ping"))  # the first, immediate ping
        job_id = self.fake.submit({})
        self.assertTrue(started.wait(10))
        t0 = time.monotonic()
        self.fake.stop_job(job_id)
        # the cancel triggers an immediate ping; it still lists the job, whose handler runs on
        # (the worker is busy, not idle), and the stop offered again meanwhile does not spin
        ping = self.fake.wait_for(lambda: [p for p in self.fake.recorded("ping") if p.at > t0])
        self.assertEqual(ping[0].query.get("job_id"), job_id)
        time.sleep(1.0)
        stops_polled = [r for r in self.fake.recorded("job-stop") if r.at > t0]
        self.assertLessEqual(len(stops_polled), 5)
        t1 = time.monotonic()
        gate.set()
        self.fake.wait_for(lambda: not worker.jobs)
        # once the handler has returned, a ping at once (not at the next interval) drops the job
        self.fake.wait_for(lambda: [p for p in self.fake.recorded("ping") if p.at > t1 and "job_id" not in p.query])
        self.assertEqual(self.done_posts(job_id), [])

    def test_unacknowledged_stops_do_not_spin(self):
        # no heartbeat at all: flashd would answer job-stop at once for ever
        self.fake.stops.append("not-here")
        env = self.fake.env()
        env["VENDOR_WEBHOOK_PING"] = ""
        worker = Worker({"handler": lambda job: 1}, WorkerEnv.from_environ(env))
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        self.addCleanup(lambda: (worker.request_shutdown("test"), thread.join(10)))
        time.sleep(2.0)
        self.assertLessEqual(len(self.fake.recorded("job-stop")), 5)


class ShutdownTest(WorkerTestCase):
    def test_shutdown_finishes_in_flight_job(self):
        started = threading.Event()

        def handler(job):
            started.set()
            time.sleep(0.5)
            return "drained"

        worker, thread, result = self.start_worker({"handler": handler})
        job_id = self.fake.submit({})
        self.assertTrue(started.wait(10))
        worker.request_shutdown("test")
        thread.join(10)
        self.assertFalse(thread.is_alive())
        self.assertEqual(result["rc"], 0)
        self.assertEqual(self.final_post(job_id, timeout=0.1).json(), {"output": "drained"})

    def test_refresh_worker_config(self):
        with self.assertLogs("vendor_flash", level="INFO") as logs:
            worker, thread, result = self.start_worker({"handler": lambda job: "once", "refresh_worker": True})
            job_id = self.fake.submit({})
            self.assertEqual(self.final_post(job_id).json(), {"output": "once", "stopPod": True})
            thread.join(10)
        self.assertEqual(result.get("rc"), 0)
        # runpod-python's line, word for word, with the job id
        said = [r for r in logs.records if r.getMessage() == "refresh_worker flag set, stopping pod after job."]
        self.assertEqual([(r.levelname, getattr(r, "job_id", None)) for r in said], [("INFO", job_id)])

    def test_refresh_worker_from_output(self):
        worker, thread, result = self.start_worker(
            {"handler": lambda job: {"refresh_worker": job["input"]["refresh"], "v": 1}})
        first = self.fake.submit({"refresh": False})
        self.assertEqual(self.final_post(first).json(), {"output": {"v": 1}})
        second = self.fake.submit({"refresh": True})
        self.assertEqual(self.final_post(second).json(), {"output": {"v": 1}, "stopPod": True})
        thread.join(10)
        self.assertEqual(result.get("rc"), 0)



class HandlerExitTest(WorkerTestCase):
    """A handler that raises SystemExit or KeyboardInterrupt fails its job, then the worker exits."""

    def check_exit_result(self, post, code, stream=False):
        body = post.json()
        self.assertIs(body.get("stopPod"), True, body)
        if stream:
            self.assertTrue(body["error"].startswith("handler: SystemExit("), body)
            return body
        info = json.loads(body["error"])
        self.assertEqual(info["error_type"], "<class 'SystemExit'>")
        self.assertIn(f"sys.exit({code})", info["error_message"])
        self.assertIn(f"exits with status {code}", info["error_message"])
        self.assertIn("Traceback", info["error_traceback"])
        return body

    def test_sync_sys_exit_fails_the_job_lets_others_finish_and_exits_with_its_code(self):
        release = threading.Event()
        self.addCleanup(release.set)
        slow_started = threading.Event()

        def handler(job):
            if job["input"].get("exit"):
                slow_started.wait(10)
                sys.exit(3)
            slow_started.set()
            release.wait(10)
            return "slow done"

        worker, thread, result = self.start_worker({"handler": handler, "concurrency_modifier": lambda c: 2})
        slow = self.fake.submit({}, "slow")
        bad = self.fake.submit({"exit": True}, "bad")
        self.check_exit_result(self.final_post(bad), 3)
        self.assertTrue(worker.stopping.is_set())  # no more takes
        time.sleep(0.3)
        self.assertTrue(thread.is_alive())  # still finishing the other job
        release.set()
        self.assertEqual(self.final_post(slow).json(), {"output": "slow done"})
        thread.join(10)
        self.assertFalse(thread.is_alive())
        self.assertEqual(result.get("rc"), 3)
        self.assertEqual(len(self.done_posts(bad)), 1)

    def test_async_sys_exit_does_not_kill_the_event_loop(self):
        release = threading.Event()
        self.addCleanup(release.set)
        slow_started = threading.Event()

        async def handler(job):
            await asyncio.sleep(0)
            if job["input"].get("exit"):
                sys.exit(3)
            slow_started.set()
            while not release.is_set():  # an async job in flight on the shared loop
                await asyncio.sleep(0.01)
            return "fine"

        worker, thread, result = self.start_worker({"handler": handler, "concurrency_modifier": lambda c: 2})
        slow = self.fake.submit({}, "slow")
        self.assertTrue(slow_started.wait(10))
        bad = self.fake.submit({"exit": True}, "bad")
        self.check_exit_result(self.final_post(bad), 3)
        self.assertTrue(worker.loop.alive)
        release.set()
        self.assertEqual(self.final_post(slow).json(), {"output": "fine"})
        thread.join(10)
        self.assertEqual(result.get("rc"), 3)

    def test_generator_sys_exit(self):
        def gen(job):
            yield 1
            sys.exit(4)

        worker, thread, result = self.start_worker({"handler": gen})
        job_id = self.fake.submit({})
        body = self.check_exit_result(self.final_post(job_id), 4, stream=True)
        self.assertIn("exits with status 4", body["error"])
        thread.join(10)
        self.assertEqual(result.get("rc"), 4)

    def test_keyboard_interrupt_in_async_handler(self):
        async def handler(job):
            raise KeyboardInterrupt

        worker, thread, result = self.start_worker({"handler": handler})
        job_id = self.fake.submit({})
        body = self.final_post(job_id).json()
        info = json.loads(body["error"])
        self.assertEqual(info["error_type"], "<class 'KeyboardInterrupt'>")
        self.assertTrue(body["stopPod"])
        thread.join(10)
        self.assertEqual(result.get("rc"), 130)


class UndeliverableTest(WorkerTestCase):
    def test_result_over_the_body_limit_fails_the_job_without_reuploads(self):
        self.fake.body_limit = 1 << 20
        self.start_worker({"handler": lambda job: {"data": "x" * (2 << 20)}})
        job_id = self.fake.submit({})
        post = self.final_post(job_id)
        self.assertRegex(post.json()["error"], r"^output too large: \d+ bytes, the limit is 1048576 bytes \(HTTP 413\)$")
        self.assertEqual([p.refused for p in self.done_posts(job_id)], [True, False])

    def test_undeliverable_stream_chunk_fails_the_job(self):
        produced = []

        def gen(job):
            for i in range(5):
                produced.append(i)
                yield "x" * (2 << 20) if i == 1 else i

        self.fake.body_limit = 1 << 20
        self.start_worker({"handler": gen, "return_aggregate_stream": True})
        job_id = self.fake.submit({})
        post = self.final_post(job_id)
        self.assertEqual(post.query["isStream"], "true")
        error = post.json()["error"]
        self.assertRegex(error, r"^stream chunk 2 could not be delivered: too large: \d+ bytes, "
                                r"the limit is 1048576 bytes \(HTTP 413\); the generator was stopped$")
        self.assertEqual(produced, [0, 1])  # the generator was stopped
        self.assertEqual([c.json() for c in self.fake.recorded("job-stream", job_id) if not c.refused], [{"output": 0}])

    def test_unencodable_stream_chunk_fails_the_job_naming_the_chunk_not_the_handler(self):
        produced = []

        def gen(job):
            for value in ({"ok": 1}, {"when": datetime.datetime(2026, 1, 2)}, {"after": 2}):
                produced.append(value)
                yield value

        self.start_worker({"handler": gen, "return_aggregate_stream": True})
        with self.assertLogs("vendor_flash", level="INFO") as logs:
            job_id = self.fake.submit({})
            post = self.final_post(job_id)
            self.fake.wait_for(lambda: any("done in" in line for line in logs.output))
        self.assertEqual(post.query["isStream"], "true")
        error = post.json()["error"]
        self.assertEqual(error, "stream chunk 2 (dict) is not JSON serialisable: Object of type datetime is not "
                                "JSON serializable; the generator was stopped")
        self.assertEqual(len(produced), 2)  # the generator was stopped
        self.assertEqual([c.json() for c in self.fake.recorded("job-stream", job_id)], [{"output": {"ok": 1}}])
        self.assertTrue(any(error in line and "ERROR" in line for line in logs.output), logs.output)
        self.assertFalse(any("Traceback" in line for line in logs.output), logs.output)

    def test_stream_chunk_out_of_range_float_names_its_type(self):
        def gen(job):
            yield float("inf")

        self.start_worker({"handler": gen})
        job_id = self.fake.submit({})
        self.assertEqual(self.final_post(job_id).json()["error"],
                         "stream chunk 1 (float) is not JSON serialisable: Out of range float values are not JSON "
                         "compliant; the generator was stopped")

    def test_stream_chunk_lost_to_an_outage_fails_the_job(self):
        self.fake.hooks["job-stream"] = lambda req: (503, {"title": "down"})

        def gen(job):
            yield "a"
            yield "b"

        worker, _, _ = self.start_worker({"handler": gen})
        worker.transport.final_retry_seconds = 0.3
        job_id = self.fake.submit({})
        error = self.final_post(job_id).json()["error"]
        self.assertTrue(error.startswith("stream chunk 1 ("), error)
        self.assertIn("HTTP 503", error)
        self.assertEqual(len(self.fake.recorded("job-stream", job_id)) > 5, True)

    def test_result_survives_a_long_outage_and_stays_listed_in_pings(self):
        down_until = []
        accepted = []

        def hook(req):
            if not down_until:
                down_until.append(time.monotonic() + 1.5)
            if time.monotonic() < down_until[0]:
                return 503, {"title": "restarting"}
            accepted.append(req)
            return None

        self.fake.hooks["job-done"] = hook
        worker, _, _ = self.start_worker({"handler": lambda job: "kept"}, interval_ms=100)
        job_id = self.fake.submit({})
        self.assertEqual(self.fake.wait_for(lambda: accepted)[0].json(), {"output": "kept"})
        posts = self.done_posts(job_id)
        self.assertGreater(len(posts), 5)  # more than the old 5 attempts
        first_failure = posts[0].at
        listed = [p for p in self.fake.recorded("ping") if first_failure + 1.0 < p.at < posts[-1].at]
        self.assertTrue(listed)
        self.assertTrue(all(p.query.get("job_id") == job_id for p in listed))

    def test_unencodable_result_is_logged_as_an_error(self):
        self.start_worker({"handler": lambda job: {"bad": {1, 2}}})
        with self.assertLogs("vendor_flash", level="INFO") as logs:
            job_id = self.fake.submit({})
            self.assertIn("not JSON serialisable", self.final_post(job_id).json()["error"])
            self.fake.wait_for(lambda: any("done in" in line for line in logs.output))
        finished = [line for line in logs.output if "done in" in line]
        self.assertIn("(error", finished[0])
        self.assertNotIn("(ok", finished[0])


class ProgressOrderTest(WorkerTestCase):
    def test_rapid_updates_are_posted_in_order_and_coalesced(self):
        peak = []

        def hook(req):
            if req.json().get("status") == "IN_PROGRESS":
                time.sleep(0.01)  # a server slower than the handler
            return None

        def handler(job):
            for i in range(200):
                progress_update(job, {"step": i})
                peak.append(sum(1 for t in threading.enumerate() if t.name.startswith("progress-")))
            return "done"

        self.fake.hooks["job-done"] = hook
        self.start_worker({"handler": handler})
        job_id = self.fake.submit({})
        self.assertEqual(self.final_post(job_id).json(), {"output": "done"})
        steps = [p.json()["output"]["step"] for p in self.done_posts(job_id) if p.json().get("status") == "IN_PROGRESS"]
        self.assertEqual(steps[-1], 199)
        self.assertEqual(steps, sorted(set(steps)))  # strictly increasing: never an older one after a newer
        self.assertLess(len(steps), 200)  # coalesced
        self.assertLessEqual(max(peak), 1)  # one sender thread per job


class WorkerProcessTest(WorkerTestCase):
    """``tests/workers/handlers.py sync`` in its own process, its stdout a pipe."""

    def start_worker_process(self, path_first=None, extra_env=None, **env_overrides):
        """``path_first``: a folder put first on PYTHONPATH (a ``sitecustomize.py``)."""
        tests = os.path.dirname(os.path.abspath(__file__))
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("RUNPOD_", "VENDOR_")) and k != "PYTHONUNBUFFERED"}
        pythonpath = os.pathsep.join(p for p in (path_first, os.path.dirname(tests)) if p)
        env.update(self.fake.env(**env_overrides), PYTHONPATH=pythonpath, VENDOR_LOG_FORMAT="text", **(extra_env or {}))
        proc = subprocess.Popen([sys.executable, os.path.join(tests, "workers", "handlers.py"), "sync"],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
        self.addCleanup(lambda: (proc.poll() is None and proc.kill(), proc.wait(), proc.stdout.close()))
        return proc

    def stop_worker_process(self, proc):
        """SIGTERM, as flashd stops a worker: it exits 0."""
        proc.terminate()
        self.assertEqual(proc.wait(10), 0)

    def new_gate(self):
        """A path a ``gate`` handler input waits for; opened at cleanup at the latest."""
        gate = os.path.join(tempfile.mkdtemp(prefix="vf-gate-"), "gate")
        self.addCleanup(lambda: open(gate, "w").close())
        return gate

    def test_print_in_a_running_job_reaches_a_piped_stdout_at_once(self):
        # flashd's process runtime and containers give the worker a pipe, which Python
        # block-buffers: a handler's print() must not wait there until the job ends
        proc = self.start_worker_process()
        lines = []
        reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, b"")), daemon=True)
        reader.start()
        gate = self.new_gate()
        job_id = self.fake.submit({"print": "loading the model", "gate": gate})
        try:
            self.fake.wait_for(lambda: any(b"loading the model" in line for line in lines), timeout=10)
            self.assertEqual(self.done_posts(job_id), [])  # seen while the job still runs
        finally:
            open(gate, "w").close()
        self.assertEqual(self.final_post(job_id).json(), {"output": {"echo": {"print": "loading the model", "gate": gate}}})
        self.stop_worker_process(proc)

    def start_gated_job(self, proc):
        """Submit a job that prints, then waits for a gate; return the gate once it runs."""
        lines = []
        threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, b"")), daemon=True).start()
        gate = self.new_gate()
        job_id = self.fake.submit({"print": "running", "gate": gate})
        self.fake.wait_for(lambda: any(b"running" in line for line in lines), timeout=10)
        return job_id, gate

    def test_one_sigterm_delivered_twice_is_one_stop(self):
        # `timeout -s TERM 5 python3 h.py` signals the child and its process group: the same
        # SIGTERM arrives twice within milliseconds, which was taken for a second signal
        # ("exiting now, in-flight results are lost", exit 1)
        proc = self.start_worker_process()
        job_id, gate = self.start_gated_job(proc)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.05)  # two pending SIGTERMs would be delivered as one
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        self.assertIsNone(proc.poll(), "the repeated SIGTERM ended the worker")
        open(gate, "w").close()
        self.assertEqual(proc.wait(10), 0)
        self.assertEqual(self.final_post(job_id).json(), {"output": {"echo": {"print": "running", "gate": gate}}})

    def test_a_second_signal_after_a_second_exits_at_once(self):
        proc = self.start_worker_process()
        self.start_gated_job(proc)
        proc.send_signal(signal.SIGTERM)
        time.sleep(1.2)
        self.assertIsNone(proc.poll())  # the in-flight job holds the graceful stop
        proc.send_signal(signal.SIGTERM)
        self.assertEqual(proc.wait(5), 1)

    def test_heartbeat_goes_on_while_a_handler_holds_the_gil(self):
        # a C call that keeps the GIL (here libc sleep() through ctypes.PyDLL) stops every
        # thread of the worker process; pings come from their own process, as runpod-python's
        # do, so the lease is renewed (the worker runs apart: the fake server needs the GIL too)
        proc = self.start_worker_process(interval_ms=100)
        job_id = self.fake.submit({"hold_gil": 2})
        self.assertEqual(self.final_post(job_id, timeout=15).json(), {"output": {"echo": {"hold_gil": 2}}})
        self.assertGreaterEqual(self.pings_listing(job_id), 5)
        self.stop_worker_process(proc)

    def heartbeat_child(self, proc):
        out = subprocess.run(["pgrep", "-P", str(proc.pid), "-f", "vendor_flash.serverless.heartbeat"],
                             capture_output=True, text=True).stdout.split()
        self.assertEqual(len(out), 1, out)
        return int(out[0])

    def pings_listing(self, job_id):
        return len([p for p in self.fake.recorded("ping") if job_id in p.query.get("job_id", "").split(",")])

    def test_pings_go_on_from_a_thread_when_the_heartbeat_process_dies(self):
        proc = self.start_worker_process(interval_ms=100)
        gate = self.new_gate()
        job_id = self.fake.submit({"print": "working", "gate": gate})
        self.fake.wait_for(lambda: self.pings_listing(job_id) >= 2, timeout=10)
        os.kill(self.heartbeat_child(proc), signal.SIGKILL)
        time.sleep(0.5)
        before = self.pings_listing(job_id)
        # the job goes on, its lease must too
        self.fake.wait_for(lambda: self.pings_listing(job_id) >= before + 5, timeout=5)
        open(gate, "w").close()
        self.assertEqual(self.final_post(job_id).json(), {"output": {"echo": {"print": "working", "gate": gate}}})
        self.stop_worker_process(proc)

    def test_heartbeat_process_ends_with_a_killed_worker_whose_fork_holds_its_pipe(self):
        # a handler's fork-started children (multiprocessing) share the worker's end of the
        # heartbeat's stdin: after a SIGKILL of the worker they kept it open, and the heartbeat
        # went on renewing the dead worker's leases
        proc = self.start_worker_process(interval_ms=100)
        job_id = self.fake.submit({"fork": 8, "sleep": 30})
        self.fake.wait_for(lambda: self.pings_listing(job_id) >= 2, timeout=10)
        heartbeat = self.heartbeat_child(proc)
        proc.kill()
        proc.wait()
        time.sleep(2.5)
        before = self.pings_listing(job_id)
        time.sleep(1)
        self.assertEqual(self.pings_listing(job_id), before, "no ping for a dead worker's job")
        self.assertFalse(os.path.exists(f"/proc/{heartbeat}") and _alive(heartbeat), "the heartbeat process is gone")


    def test_heartbeat_process_ignores_a_group_sigterm_while_it_starts(self):
        # the heartbeat set SIG_IGN only once its interpreter had started and imported the SDK:
        # a SIGTERM to the worker's process group in that window (flashd stopping a fresh
        # process worker, `timeout`, Ctrl-C) killed it, and the worker warned "heartbeat
        # process gone" in a normal shutdown. A sitecustomize holds the heartbeat at its start
        # (before any of its own code runs) until the group has had its SIGTERM.
        hold = tempfile.mkdtemp(prefix="vf-hb-")
        with open(os.path.join(hold, "sitecustomize.py"), "w") as f:
            f.write(HOLD_HEARTBEAT_AT_START)
        proc = self.start_worker_process(path_first=hold, extra_env={"VF_TEST_HOLD_DIR": hold})
        ready = os.path.join(hold, "ready")
        self.fake.wait_for(lambda: os.path.exists(ready), timeout=20)
        with open(ready) as f:
            ignored = int(f.read(), 16)
        os.killpg(proc.pid, signal.SIGTERM)
        time.sleep(0.2)  # delivered before the heartbeat goes on
        open(os.path.join(hold, "go"), "w").close()
        self.assertEqual(proc.wait(10), 0)
        out = proc.stdout.read().decode()
        self.assertTrue(ignored & (1 << (signal.SIGTERM - 1)), f"SIGTERM not ignored at the start: {ignored:x}")
        self.assertTrue(ignored & (1 << (signal.SIGINT - 1)), f"SIGINT not ignored at the start: {ignored:x}")
        self.assertNotIn("heartbeat process gone", out)


#: Run in the heartbeat process only, before its own code: writes its ignored-signal mask
#: (/proc/self/status SigIgn) to $VF_TEST_HOLD_DIR/ready, then waits for .../go.
HOLD_HEARTBEAT_AT_START = """
import os, time
if b"vendor_flash.serverless.heartbeat" in open("/proc/self/cmdline", "rb").read():
    d = os.environ["VF_TEST_HOLD_DIR"]
    with open("/proc/self/status") as f:
        mask = [line.split()[1] for line in f if line.startswith("SigIgn:")][0]
    with open(os.path.join(d, "ready.tmp"), "w") as f:
        f.write(mask)
    os.rename(os.path.join(d, "ready.tmp"), os.path.join(d, "ready"))
    deadline = time.monotonic() + 20
    while not os.path.exists(os.path.join(d, "go")) and time.monotonic() < deadline:
        time.sleep(0.01)
"""


class HeartbeatProcessTest(WorkerTestCase):
    """``python -m vendor_flash.serverless.heartbeat`` on its own, fed as the worker feeds it."""

    def test_only_pings_the_worker_must_act_on_are_reported(self):
        # the worker cannot read the reports while a handler holds the GIL: one line per ping
        # filled the pipe (64 KiB, ~700 pings) and the heartbeat blocked on it, pings and all
        env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        proc = subprocess.Popen([sys.executable, "-m", "vendor_flash.serverless.heartbeat"], env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.addCleanup(lambda: (proc.stdin.close(), proc.wait(5), proc.stdout.close()))
        worker_env = WorkerEnv.from_environ(self.fake.env(interval_ms=100))
        proc.stdin.write((json.dumps(dataclasses.asdict(worker_env)) + "\n").encode())
        proc.stdin.write((json.dumps({"ids": ["j1"], "now": True}) + "\n").encode())
        proc.stdin.flush()
        self.fake.wait_for(lambda: len(self.fake.recorded("ping")) >= 5, timeout=10)
        self.assertEqual(select.select([proc.stdout], [], [], 0.3)[0], [], "nothing reported for 200s")
        self.fake.hooks["ping"] = lambda req: (409, {"staleJobs": ["j1"]})
        report = json.loads(proc.stdout.readline())
        self.assertEqual((report["status"], report["ids"]), (409, ["j1"]))

    def test_a_job_stopped_on_job_stop_is_listed_by_the_next_ping_then_left_out_at_once(self):
        # flashd ends a stop at a ping without the job at once only once a ping listed it. A job
        # cancelled right after its take stops at once: the worker's messages saying it holds
        # the job, that it stopped it, and that it no longer holds it are read together, and one
        # ping of the last ids (without the job) left the stop until the next regular ping.
        env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        proc = subprocess.Popen([sys.executable, "-m", "vendor_flash.serverless.heartbeat"], env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.addCleanup(lambda: (proc.stdin.close(), proc.wait(5), proc.stdout.close()))
        worker_env = WorkerEnv.from_environ(self.fake.env(interval_ms=60_000))
        proc.stdin.write((json.dumps(dataclasses.asdict(worker_env)) + "\n").encode())
        proc.stdin.write((json.dumps({"ids": [], "now": False}) + "\n").encode())
        proc.stdin.flush()
        self.fake.wait_for(lambda: len(self.fake.recorded("ping")) >= 1, timeout=10)  # the first ping
        for message in ({"ids": ["j1"], "now": False}, {"ids": ["j1"], "now": True, "stopped": ["j1"]},
                        {"ids": [], "now": True}):
            proc.stdin.write((json.dumps(message) + "\n").encode())
        proc.stdin.flush()
        pings = self.fake.wait_for(lambda: self.fake.recorded("ping")[1:] if len(self.fake.recorded("ping")) >= 3
                                   else None, timeout=10)
        listed = [p.query.get("job_id", "") for p in pings]
        self.assertEqual(listed[:2], ["j1", ""], "listed once, then left out at once")
        time.sleep(0.3)
        self.assertEqual(len(self.fake.recorded("ping")), 3, "and no more pings until the interval")


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


if __name__ == "__main__":
    unittest.main()
