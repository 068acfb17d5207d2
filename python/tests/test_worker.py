"""The worker loop against an in-process fake of flashd's worker routes."""

import asyncio
import logging
import os
import threading
import time
import unittest

from fakeserver import FakeFlashd
from vendor_flash.serverless import progress_update
from vendor_flash.serverless.env import WorkerEnv
from vendor_flash.serverless.log import setup as setup_logging
from vendor_flash.serverless.worker import Worker

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
            return [r for r in self.done_posts(job_id) if r.json().get("status") != "IN_PROGRESS"]
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
        # the cancel triggers an immediate ping without the job, which clears the stop
        ping = self.fake.wait_for(lambda: [p for p in self.fake.recorded("ping") if p.at > t0])
        self.assertNotIn("job_id", ping[0].query)
        time.sleep(1.0)
        stops_polled = [r for r in self.fake.recorded("job-stop") if r.at > t0]
        self.assertLessEqual(len(stops_polled), 5)
        gate.set()
        self.fake.wait_for(lambda: not worker.jobs)
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
        worker, thread, result = self.start_worker({"handler": lambda job: "once", "refresh_worker": True})
        job_id = self.fake.submit({})
        self.assertEqual(self.final_post(job_id).json(), {"output": "once", "stopPod": True})
        thread.join(10)
        self.assertEqual(result.get("rc"), 0)

    def test_refresh_worker_from_output(self):
        worker, thread, result = self.start_worker(
            {"handler": lambda job: {"refresh_worker": job["input"]["refresh"], "v": 1}})
        first = self.fake.submit({"refresh": False})
        self.assertEqual(self.final_post(first).json(), {"output": {"v": 1}})
        second = self.fake.submit({"refresh": True})
        self.assertEqual(self.final_post(second).json(), {"output": {"v": 1}, "stopPod": True})
        thread.join(10)
        self.assertEqual(result.get("rc"), 0)


if __name__ == "__main__":
    unittest.main()
