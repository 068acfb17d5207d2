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
        self.assertEqual(parse_jobs(response(b'{"id": "a", "input": {}}')), ([{"id": "a", "input": {}}], []))

    def test_batch(self):
        jobs, problems = parse_jobs(response(b'[{"id": "a", "input": 1}, {"id": "b", "input": null}, 3]'))
        self.assertEqual(jobs, [{"id": "a", "input": 1}])
        self.assertEqual(len(problems), 2)
        self.assertIn("input", problems[0])

    def test_empty(self):
        self.assertEqual(parse_jobs(response(b"")), ([], []))
        self.assertEqual(parse_jobs(response(b"[]")), ([], []))

    def test_not_json(self):
        jobs, problems = parse_jobs(response(b"<html>"))
        self.assertEqual(jobs, [])
        self.assertIn("not JSON", problems[0])

    def test_extra_keys_are_kept(self):
        jobs, _ = parse_jobs(response(b'{"id": "a", "input": {}, "webhook": "http://x", "batchId": "b"}'))
        self.assertEqual(jobs[0]["batchId"], "b")


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

    def test_gives_up(self):
        self.script("job-done", [500] * 10)
        self.assertIs(self.transport.post_done("j", {"output": 1}), PostOutcome.FAILED)
        self.assertEqual(len(self.fake.recorded("job-done", "j")), 5)

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
            outcome = Transport(env, client=client, sleep=self.sleeps.append).post_done("j", {"output": 1})
        self.assertIs(outcome, PostOutcome.FAILED)
        self.assertEqual(self.sleeps, [0.5, 1.0, 2.0, 4.0])

    def test_unencodable_result_becomes_an_error(self):
        self.assertIs(self.transport.post_done("j", {"output": {1, 2}}), PostOutcome.DELIVERED)
        body = self.fake.recorded("job-done", "j")[0].json()
        self.assertIn("not JSON serialisable", body["error"])

    def test_progress_body(self):
        self.transport.post_progress("j", {"pct": 1})
        post = self.fake.recorded("job-done", "j")[0]
        self.assertEqual(post.json(), {"status": "IN_PROGRESS", "output": {"pct": 1}})
        self.assertEqual(post.query["isStream"], "false")


if __name__ == "__main__":
    unittest.main()
