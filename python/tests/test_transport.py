"""Transport retry rules, job parsing and backoff (pure or against the fake server)."""

import logging
import unittest

from fakeserver import FakeFlashd
from vendor_flash.serverless.env import WorkerEnv
from vendor_flash.serverless.http import HttpClient, HttpResponse
from vendor_flash.serverless.transport import PostOutcome, Transport, retry_after_seconds
from vendor_flash.serverless.worker import Backoff, parse_jobs

logging.getLogger("vendor_flash").setLevel(logging.CRITICAL)


def response(body: bytes, status: int = 200) -> HttpResponse:
    return HttpResponse(status=status, headers={"content-type": "application/json"}, body=body)


class ParseJobsTest(unittest.TestCase):
    def test_single_job(self):
        self.assertEqual(parse_jobs(response(b'{"id": "a", "input": {}}')), ([{"id": "a", "input": {}}], [], []))

    def test_batch(self):
        jobs, problems, _ = parse_jobs(response(b'[{"id": "a", "input": 1}, {"id": "b", "input": null}, 3]'))
        self.assertEqual(jobs, [{"id": "a", "input": 1}])
        self.assertEqual(len(problems), 2)
        self.assertIn("input", problems[0])

    def test_empty(self):
        self.assertEqual(parse_jobs(response(b"")), ([], [], []))
        self.assertEqual(parse_jobs(response(b"[]")), ([], [], []))

    def test_not_json(self):
        jobs, problems, _ = parse_jobs(response(b"<html>"))
        self.assertEqual(jobs, [])
        self.assertIn("not JSON", problems[0])

    def test_extra_keys_are_kept(self):
        jobs, _, _ = parse_jobs(response(b'{"id": "a", "input": {}, "webhook": "http://x", "batchId": "b"}'))
        self.assertEqual(jobs[0]["batchId"], "b")

    def test_too_deep_to_decode_gives_the_job_ids(self):
        # Python's decoder gives up near 1000 levels: the ids are read without decoding, so the
        # worker can fail those jobs at once instead of leaving them to run out their lease
        deep = b'{"a":' * 100_000 + b"1" + b"}" * 100_000
        self.assertEqual(parse_jobs(response(b'{"input": ' + deep + b', "id": "j\\"1"}')), ([], [], ['j"1']))
        # a batch: the other jobs are decoded on their own and run
        jobs, problems, too_deep = parse_jobs(response(
            b'[{"id": "a", "input": 1}, {"id": "b", "input": ' + deep + b'}, {"input": {"id": "inner"}, "id": "c"}]'))
        self.assertEqual((jobs, problems, too_deep),
                         ([{"id": "a", "input": 1}, {"input": {"id": "inner"}, "id": "c"}], [], ["b"]))
        # no id: skipped, as before
        jobs, problems, too_deep = parse_jobs(response(b'{"input": ' + deep + b"}"))
        self.assertEqual((jobs, too_deep), ([], []))
        self.assertEqual(problems, ["job-take answer is nested too deeply to decode; skipped"])
        # an "id" inside the input is not the job's
        _, problems, too_deep = parse_jobs(response(b'{"input": [{"id": "inner"}, ' + deep + b"]}"))
        self.assertEqual(too_deep, [])


class BackoffTest(unittest.TestCase):
    def test_doubles_to_the_cap_and_resets(self):
        b = Backoff(0.5, 5.0)
        self.assertEqual([b.next() for _ in range(6)], [0.5, 1.0, 2.0, 4.0, 5.0, 5.0])
        b.reset()
        self.assertEqual(b.next(), 0.5)

    def test_retry_after(self):
        self.assertEqual(retry_after_seconds({"retry-after": "3"}, 5.0), 3.0)
        self.assertEqual(retry_after_seconds({}, 5.0), 5.0)
        self.assertEqual(retry_after_seconds({"retry-after": "soon"}, 5.0), 5.0)
        self.assertEqual(retry_after_seconds({"retry-after": "999"}, 5.0), 30.0)


class TransportTest(unittest.TestCase):
    def setUp(self):
        self.fake = FakeFlashd().start()
        self.addCleanup(self.fake.stop)
        self.env = WorkerEnv.from_environ(self.fake.env())
        self.client = HttpClient(self.env.api_key)
        self.addCleanup(self.client.close)
        self.sleeps = []
        self.transport = Transport(self.env, client=self.client, sleep=self.sleeps.append)

    def script(self, route, statuses):
        answers = list(statuses)
        self.fake.hooks[route] = lambda req: (answers.pop(0), {"title": "scripted"}) if answers else None

    def test_delivered(self):
        self.assertIs(self.transport.post_done("j", {"output": 1}), PostOutcome.DELIVERED)
        post = self.fake.recorded("job-done", "j")[0]
        self.assertEqual(post.headers["content-type"], "application/json")
        self.assertEqual(post.query["isStream"], "false")

    def test_retries_5xx_with_backoff(self):
        self.script("job-done", [500, 502, 503])
        self.assertIs(self.transport.post_done("j", {"output": 1}), PostOutcome.DELIVERED)
        self.assertEqual(self.sleeps, [0.5, 1.0, 2.0])
        self.assertEqual(len(self.fake.recorded("job-done", "j")), 4)

    def test_progress_gives_up_after_the_short_window(self):
        self.script("job-done", [500] * 10)
        self.assertIs(self.transport.post_progress("j", {"pct": 1}), PostOutcome.FAILED)
        self.assertEqual(len(self.fake.recorded("job-done", "j")), 5)
        self.assertEqual(self.sleeps, [0.5, 1.0, 2.0, 4.0])

    def test_final_result_is_retried_for_minutes(self):
        # a 5xx for 10 attempts: the old 5-attempt window (about 7.5 s) would have dropped it
        self.script("job-done", [500] * 10)
        self.assertIs(self.transport.post_done("j", {"output": 1}), PostOutcome.DELIVERED)
        self.assertEqual(len(self.fake.recorded("job-done", "j")), 11)
        self.assertEqual(self.sleeps, [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0, 10.0, 10.0])

    def test_final_result_gives_up_after_the_long_window_then_posts_an_error(self):
        answers = [500] * 1000

        def hook(req):
            if req.json().get("output") == 1:
                return answers.pop(0), {"title": "down"}
            return None  # the small error result gets through
        self.fake.hooks["job-done"] = hook
        delivery = self.transport.deliver_result("j", {"output": 1})
        self.assertIs(delivery.outcome, PostOutcome.FAILED)
        self.assertIs(delivery.fallback, PostOutcome.DELIVERED)
        self.assertGreaterEqual(sum(self.sleeps), 300.0)
        self.assertLess(sum(self.sleeps), 320.0)
        self.assertEqual(max(self.sleeps), 10.0)
        last = self.fake.recorded("job-done", "j")[-1].json()
        self.assertTrue(last["error"].startswith("result could not be delivered: not delivered after"), last)
        self.assertIn("HTTP 500", last["error"])

    def test_final_retries_stop_when_the_job_is_no_longer_held(self):
        self.script("job-done", [503] * 100)
        calls = []

        def still_held():
            calls.append(1)
            return len(calls) < 3  # held for two retries, then stopped (or taken over)
        delivery = self.transport.deliver_result("j", {"output": 1}, still_held=still_held)
        self.assertIs(delivery.outcome, PostOutcome.FAILED)
        self.assertIsNone(delivery.fallback)  # nothing more is posted for a job not held
        self.assertEqual(len(self.fake.recorded("job-done", "j")), 3)

    def test_429_is_retried(self):
        self.script("job-done", [429])
        self.assertIs(self.transport.post_done("j", {"output": 1}), PostOutcome.DELIVERED)
        self.assertEqual(self.sleeps, [0.5])  # no Retry-After header: the normal delay

    def test_409_is_stale_and_not_retried(self):
        self.script("job-done", [409])
        self.assertIs(self.transport.post_done("j", {"output": 1}), PostOutcome.STALE)
        self.assertEqual(self.sleeps, [])

    def test_other_4xx_dropped(self):
        self.script("job-stream", [400])
        self.assertIs(self.transport.post_stream("j", "chunk"), PostOutcome.REJECTED)
        self.assertEqual(len(self.fake.recorded("job-stream", "j")), 1)

    def test_connection_refused_is_retried(self):
        env = WorkerEnv.from_environ({"VENDOR_WEBHOOK_POST_OUTPUT": "http://127.0.0.1:9/v2/e/job-done/w/$ID?gpu=cpu"})
        with HttpClient() as client:
            outcome = Transport(env, client=client, sleep=self.sleeps.append).post_progress("j", 1)
        self.assertIs(outcome, PostOutcome.FAILED)
        self.assertEqual(self.sleeps, [0.5, 1.0, 2.0, 4.0])

    def test_connection_refused_final_result_is_retried_for_minutes(self):
        env = WorkerEnv.from_environ({"VENDOR_WEBHOOK_POST_OUTPUT": "http://127.0.0.1:9/v2/e/job-done/w/$ID?gpu=cpu"})
        with HttpClient() as client:
            delivery = Transport(env, client=client, sleep=self.sleeps.append).deliver_result("j", {"output": 1})
        self.assertIs(delivery.outcome, PostOutcome.FAILED)
        self.assertIs(delivery.fallback, PostOutcome.FAILED)  # the error result cannot get through either
        self.assertIn("ConnectionRefusedError", delivery.reason())
        first = self.sleeps[:delivery.attempts - 1]
        self.assertEqual(first[:6], [0.5, 1.0, 2.0, 4.0, 8.0, 10.0])
        self.assertGreaterEqual(sum(first), 300.0)
        self.assertEqual(self.sleeps[delivery.attempts - 1:], [0.5, 1.0, 2.0, 4.0])  # the error result

    def test_unencodable_result_becomes_an_error(self):
        self.assertIs(self.transport.post_done("j", {"output": {1, 2}}), PostOutcome.DELIVERED)
        body = self.fake.recorded("job-done", "j")[0].json()
        self.assertIn("not JSON serialisable", body["error"])

    def test_refused_body_answer_is_read_after_the_send_fails(self):
        # the server answers 413 and closes without reading a 32 MB body: sending fails
        # (broken pipe or reset), but the 413 it already sent is what the caller gets
        self.fake.body_limit = 1 << 20
        url = self.env.job_done_url("j", False)
        answer = self.client.request("POST", url, body=b"x" * (32 << 20))
        self.assertEqual(answer.status, 413)
        self.assertIsNotNone(answer.send_error)
        self.assertIn("1048576 bytes", answer.json()["detail"])
        self.assertEqual(self.client.request("POST", url, body=b"{}").status, 200)  # client still usable

    def test_result_over_the_body_limit_is_not_retried_and_fails_the_job(self):
        self.fake.body_limit = 1 << 20
        size = len(b'{"output": ""}') + (24 << 20)
        delivery = self.transport.deliver_result("j", {"output": "x" * (24 << 20)})
        self.assertIs(delivery.outcome, PostOutcome.REJECTED)
        self.assertEqual(delivery.status, 413)
        self.assertIs(delivery.fallback, PostOutcome.DELIVERED)
        posts = self.fake.recorded("job-done", "j")
        self.assertEqual([p.refused for p in posts], [True, False])  # one upload, then the error result
        self.assertEqual(self.sleeps, [])
        self.assertEqual(posts[1].json(), {
            "error": f"output too large: {size} bytes, the limit is 1048576 bytes (HTTP 413)"})

    def test_refused_result_keeps_stop_pod_in_the_error_result(self):
        self.script("job-done", [400])
        delivery = self.transport.deliver_result("j", {"output": 1, "stopPod": True})
        self.assertIs(delivery.outcome, PostOutcome.REJECTED)
        body = self.fake.recorded("job-done", "j")[-1].json()
        self.assertEqual(body, {"error": "result could not be delivered: refused with HTTP 400: scripted",
                                "stopPod": True})

    def test_progress_body(self):
        self.transport.post_progress("j", {"pct": 1})
        post = self.fake.recorded("job-done", "j")[0]
        self.assertEqual(post.json(), {"status": "IN_PROGRESS", "output": {"pct": 1}})
        self.assertEqual(post.query["isStream"], "false")


if __name__ == "__main__":
    unittest.main()
