"""The public runpod-python SDK's requests (release 1.12.0), replayed byte for byte against a real
flashd: the worker's (aiohttp session headers, URLs built by string concatenation from the
RUNPOD_WEBHOOK_* templates, results posted as JSON under a form content type) and the clients'
(runpod.Endpoint with requests, runpod.AsyncioEndpoint with aiohttp). research/worker-protocol.md
§1 and §3 give each fact; the runpod package itself cannot be installed here, so each request is
written out as the SDK sends it.

Needs ``node`` and ``dist/flashd.mjs`` (``npm run build``); skips with the reason without them.
"""

import json
import re
import threading
import time
import unittest
import urllib.error
import urllib.parse
import urllib.request

from flashd_harness import Flashd, Unavailable

SERVER = None
SDK_UA = "RunPod-Python-SDK/1.12.0 (Linux 6.8.0; x86_64) Language/Python 3.12.3"
# aiohttp's ClientResponse.json() refuses any other content type (ContentTypeError).
AIOHTTP_JSON = re.compile(r"^application/(?:[\w.+-]+?\+)?json")
FINAL = {"COMPLETED", "FAILED", "TIMED_OUT"}  # runpod-python's FINAL_STATES


def setUpModule():
    global SERVER
    try:
        SERVER = Flashd(["--runtime", "none", "--take-hold-ms", "1000", "--lease-ms", "3000"]).start()
    except Unavailable as exc:
        raise unittest.SkipTest(str(exc))


def tearDownModule():
    if SERVER is not None:
        SERVER.stop()


def http(method, url, body=None, headers=None, timeout=30):
    """(status, headers with lower-case names, raw body)."""
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, {k.lower(): v for k, v in err.headers.items()}, err.read()


def media_type(headers):
    return headers.get("content-type", "").split(";")[0].strip()


class SdkWorker:
    """runpod-python's worker side: rp_job.get_job, rp_job.get_stop_signals, rp_http._transmit,
    rp_ping.Heartbeat, with the URLs built as rp_job and rp_http build them."""

    def __init__(self, env):
        self.env = env
        self.worker_id = env["RUNPOD_POD_ID"]
        key = env["RUNPOD_AI_API_KEY"]
        # http_client.AsyncClientSession: the session's headers, sent on every call.
        self.session = {"Content-Type": "application/json", "Authorization": key, "User-Agent": SDK_UA,
                        "Accept-Encoding": "gzip, deflate"}
        self.get_url = env["RUNPOD_WEBHOOK_GET_JOB"].replace("$ID", self.worker_id)
        self.done_url = env["RUNPOD_WEBHOOK_POST_OUTPUT"].replace("$RUNPOD_POD_ID", self.worker_id)
        self.stream_url = env["RUNPOD_WEBHOOK_POST_STREAM"].replace("$RUNPOD_POD_ID", self.worker_id)
        self.ping_url = env["RUNPOD_WEBHOOK_PING"].replace("$RUNPOD_POD_ID", self.worker_id)

    def take(self, in_progress=False, request_id=None):
        headers = dict(self.session)
        if request_id:  # _handle_result sets it on the shared session: later takes carry it
            headers["X-Request-ID"] = request_id
        return http("GET", self.get_url + "&job_in_progress=" + ("1" if in_progress else "0"), None, headers, 95)

    def take_batch(self, n, extra=""):
        url = self.get_url.replace("/job-take/", "/job-take-batch/") + f"&batch_size={n}{extra}&job_in_progress=0"
        return http("GET", url, None, self.session, 95)

    def stops(self):
        return http("GET", self.get_url.replace("/job-take/", "/job-stop/"), None, self.session, 95)

    def _post(self, url, job_id, result):
        headers = dict(self.session, **{"Content-Type": "application/x-www-form-urlencoded", "charset": "utf-8",
                                        "X-Request-ID": job_id})
        return http("POST", url, json.dumps(result, ensure_ascii=False).encode("utf-8"), headers)

    def done(self, job_id, result, is_stream=False):
        url = self.done_url.replace("$ID", job_id) + "&isStream=" + ("true" if is_stream else "false")
        return self._post(url, job_id, result)

    def progress(self, job_id, progress):  # rp_progress.progress_update
        return self.done(job_id, {"status": "IN_PROGRESS", "output": progress})

    def stream(self, job_id, value):
        return self._post(self.stream_url.replace("$ID", job_id) + "&isStream=false", job_id, {"output": value})

    def ping(self, job_ids=()):
        # requests merges params into the URL's query with urlencode: the comma becomes %2C.
        params = {"job_id": ",".join(job_ids)} if job_ids else {}
        params["runpod_version"] = "1.12.0"
        url = self.ping_url + "&" + urllib.parse.urlencode(params)
        return http("GET", url, None, {"Authorization": self.env["RUNPOD_AI_API_KEY"], "User-Agent": "python-requests/2.32.3"})


class SdkClient:
    """runpod.Endpoint (RunPodClient on requests) and runpod.AsyncioEndpoint (aiohttp)."""

    def __init__(self, endpoint_id, key):
        self.base = f"{SERVER.base}/v2/{endpoint_id}"
        self.headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}", "User-Agent": SDK_UA}

    def post(self, op, data=None, timeout=10):
        # requests.post(url, json=None): no body, Content-Length: 0, the JSON content type all the same.
        body = b"" if data is None else json.dumps(data).encode()
        return http("POST", f"{self.base}/{op}", body, self.headers, timeout)

    def get(self, op, timeout=10):
        return http("GET", f"{self.base}/{op}", None, self.headers, timeout)

    def run(self, request_input):  # Endpoint.run
        if not request_input.get("input"):
            request_input = {"input": request_input}
        status, headers, raw = self.post("run", request_input)
        assert status == 200, (status, raw)
        return json.loads(raw)["id"]


def new_endpoint():
    endpoint_id = SERVER.create_endpoint("wire")
    return endpoint_id, SdkWorker(SERVER.worker_env(endpoint_id)), SdkClient(endpoint_id, SERVER.key)


class WorkerEnvTest(unittest.TestCase):
    def test_templates_as_the_sdk_fills_them(self):
        endpoint_id = SERVER.create_endpoint("env")
        env = SERVER.worker_env(endpoint_id)
        for name in ("RUNPOD_WEBHOOK_GET_JOB", "RUNPOD_WEBHOOK_POST_OUTPUT", "RUNPOD_WEBHOOK_POST_STREAM",
                     "RUNPOD_WEBHOOK_PING"):
            self.assertIn("?", env[name], f"{name}: the SDK appends &param= by concatenation")
        self.assertIn("/job-take/$ID?", env["RUNPOD_WEBHOOK_GET_JOB"], "job-stop is derived from /job-take/")
        self.assertIn("/$ID?", env["RUNPOD_WEBHOOK_POST_OUTPUT"])
        self.assertIn("/$ID?", env["RUNPOD_WEBHOOK_POST_STREAM"])
        self.assertNotIn("$ID", env["RUNPOD_WEBHOOK_PING"], "rp_ping substitutes only $RUNPOD_POD_ID")
        self.assertEqual(env["RUNPOD_ENDPOINT_ID"], endpoint_id)
        self.assertTrue(env["RUNPOD_POD_ID"] and env["RUNPOD_AI_API_KEY"], "the heartbeat needs both")
        self.assertGreaterEqual(int(env["RUNPOD_PING_INTERVAL"]) // 1000, 1, "int(v)//1000 s: never 0 (a busy loop)")
        self.assertEqual(env["RUNPOD_SKIP_AUTO_SYSTEM_CHECKS"], "true")
        self.assertEqual(int(env["RUNPOD_REALTIME_PORT"]), 0, "0: the queue worker, not the local HTTP server")


class WorkerTest(unittest.TestCase):
    def test_take_with_the_sdk_headers_and_json_content_type(self):
        endpoint_id, worker, client = new_endpoint()
        job_id = client.run({})  # runpod.Endpoint.run({}) sends {"input": {}}
        status, headers, raw = worker.take(request_id="an-earlier-job")
        self.assertEqual(status, 200, raw)
        # get_job: content_type must be application/json, or the job is ignored (and lost).
        self.assertEqual(media_type(headers), "application/json")
        self.assertEqual(json.loads(raw), {"id": job_id, "input": {}}, "id and input, even an empty input")
        self.assertEqual(worker.done(job_id, {"output": None})[0], 200)

    def test_an_idle_take_is_held_then_204_and_stop_is_204(self):
        _, worker, _ = new_endpoint()
        started = time.monotonic()
        status, _, raw = worker.take()
        self.assertEqual((status, raw), (204, b""))
        self.assertGreaterEqual(time.monotonic() - started, 0.9, "held, not a tight loop of 204s")
        self.assertEqual(worker.stops()[0], 204)

    def test_batch_take_url_derived_by_replace(self):
        _, worker, client = new_endpoint()
        ids = [client.run({"i": i}) for i in range(3)]
        status, headers, raw = worker.take_batch(2, "&batch_strategy=LMove")  # 1.7.x added it
        self.assertEqual((status, media_type(headers)), (200, "application/json"), raw)
        jobs = json.loads(raw)
        self.assertEqual([j["id"] for j in jobs], ids[:2], "a JSON array, at most batch_size")
        status, _, raw = worker.take_batch(5)
        self.assertEqual([j["id"] for j in json.loads(raw)], ids[2:], "fewer than asked, at once")
        for job_id in ids:
            self.assertEqual(worker.done(job_id, {"output": job_id})[0], 200)
        status, _, raw = worker.take_batch(2)
        self.assertTrue(status == 204 or json.loads(raw) == [], (status, raw))

    def test_result_posted_as_form_content_type_utf8_and_progress(self):
        _, worker, client = new_endpoint()
        job_id = client.run({"x": 1})
        self.assertEqual(worker.take()[0], 200)
        self.assertEqual(worker.progress(job_id, {"pct": 50})[0], 200)
        body = json.loads(client.get(f"status/{job_id}")[2])
        self.assertEqual((body["status"], body["output"]), ("IN_PROGRESS", {"pct": 50}), "progress, not completion")
        self.assertEqual(worker.done(job_id, {"output": {"text": "héllo ✓ 🎉"}})[0], 200)
        # The progress thread's post can come after the result: it must not reopen the job.
        self.assertEqual(worker.progress(job_id, {"pct": 99})[0], 200, "a 4xx would be logged as an error")
        body = json.loads(client.get(f"status/{job_id}")[2])
        self.assertEqual((body["status"], body["output"]), ("COMPLETED", {"text": "héllo ✓ 🎉"}))
        for key in ("id", "delayTime", "executionTime", "workerId"):
            self.assertIn(key, body)

    def test_result_shapes_of_run_job(self):
        _, worker, client = new_endpoint()
        cases = [
            ({"error": json.dumps({"error_type": "<class 'ValueError'>", "error_message": "x"})}, "FAILED"),
            ({"output": {"a": 1}, "error": "boom"}, "FAILED"),
            ({"error": {"msg": "a dict"}}, "FAILED"),
            ({"output": [1, 2], "stopPod": True}, "COMPLETED"),
            ({"output": False}, "COMPLETED"),
        ]
        for result, expected in cases:
            worker = SdkWorker(SERVER.worker_env(client.base.rsplit("/", 1)[1]))  # stopPod retires a worker
            job_id = client.run({"r": 1})
            self.assertEqual(worker.take()[0], 200)
            self.assertEqual(worker.done(job_id, result)[0], 200)
            body = json.loads(client.get(f"status/{job_id}")[2])
            self.assertEqual(body["status"], expected, (result, body))
            if expected == "FAILED":
                self.assertIsInstance(body["error"], str, "the error is a string")

    def test_ping_with_encoded_job_ids_keeps_the_leases(self):
        _, worker, client = new_endpoint()
        ids = [client.run({"i": i}) for i in range(2)]
        self.assertEqual(len(json.loads(worker.take_batch(2)[2])), 2)
        deadline = time.monotonic() + 4.5  # past the 3 s lease
        while time.monotonic() < deadline:
            self.assertEqual(worker.ping(ids)[0], 200)
            time.sleep(1)  # RUNPOD_PING_INTERVAL can give no less
        for job_id in ids:
            self.assertEqual(json.loads(client.get(f"status/{job_id}")[2])["status"], "IN_PROGRESS")
            self.assertEqual(json.loads(worker.done(job_id, {"output": 1})[2]), {"ok": True})

    def test_unhealthy_report(self):
        endpoint_id, worker, client = new_endpoint()
        url = worker.ping_url + "&" + urllib.parse.urlencode(
            {"status": "unhealthy", "check": "memory", "reason": "2.1 GB free", "runpod_version": "1.12.0"})
        self.assertEqual(http("GET", url, None, {"Authorization": worker.env["RUNPOD_AI_API_KEY"]})[0], 200)
        self.assertEqual(json.loads(client.get("health")[2])["workers"]["unhealthy"], 1)


class StreamTest(unittest.TestCase):
    def test_generator_without_aggregate(self):
        _, worker, client = new_endpoint()
        job_id = client.run({"s": 1})
        self.assertEqual(worker.take()[0], 200)
        self.assertEqual(worker.stream(job_id, "tok1")[0], 200)
        self.assertEqual(worker.stream(job_id, None)[0], 200)
        body = json.loads(client.get(f"stream/{job_id}")[2])
        self.assertEqual(body, {"status": "IN_PROGRESS", "stream": [{"output": "tok1"}, {"output": None}]})
        self.assertEqual(json.loads(client.get(f"stream/{job_id}")[2])["stream"], [], "only what came since")
        self.assertEqual(worker.stream(job_id, {"t": 2})[0], 200)
        self.assertEqual(worker.done(job_id, {"output": []}, is_stream=True)[0], 200)
        # Job.stream(): yields until the status is final AND the stream is empty.
        seen = []
        for _ in range(5):
            body = json.loads(client.get(f"stream/{job_id}")[2])
            if body["status"] in FINAL and not body["stream"]:
                break
            seen += [c["output"] for c in body["stream"]]
        self.assertEqual((body["status"], seen), ("COMPLETED", [{"t": 2}]))

    def test_generator_error_is_the_final_post(self):
        _, worker, client = new_endpoint()
        job_id = client.run({"s": 1})
        self.assertEqual(worker.take()[0], 200)
        self.assertEqual(worker.stream(job_id, "a")[0], 200)
        self.assertEqual(worker.done(job_id, {"error": "handler: boom \ntraceback: tb"}, is_stream=True)[0], 200)
        body = json.loads(client.get(f"status/{job_id}")[2])
        self.assertEqual((body["status"], body["error"]), ("FAILED", "handler: boom \ntraceback: tb"))
        self.assertEqual(json.loads(client.get(f"stream/{job_id}")[2]), {"status": "FAILED", "stream": [{"output": "a"}]})


class ClientTest(unittest.TestCase):
    def test_run_sync_status_and_extra_members(self):
        _, worker, client = new_endpoint()

        def serve_one():
            status, _, raw = worker.take()
            job = json.loads(raw)
            worker.done(job["id"], {"output": {"got": job["input"], "s3": "s3Config" in job}})

        thread = threading.Thread(target=serve_one)
        thread.start()
        # Endpoint.run_sync: POST /runsync, no ?wait; a final status returns .get("output").
        status, headers, raw = client.post("runsync", {"input": {"q": 1}, "policy": {"executionTimeout": 60000, "ttl": 600000},
                                                       "s3Config": {"accessId": "a", "accessSecret": "b", "bucketName": "c",
                                                                    "endpointUrl": "https://s3.example.com"}}, timeout=60)
        thread.join()
        body = json.loads(raw)
        self.assertEqual((status, body["status"]), (200, "COMPLETED"), raw)
        self.assertEqual(body["output"], {"got": {"q": 1}, "s3": True}, "s3Config reaches the worker's job")
        status_body = json.loads(client.get(f"status/{body['id']}")[2])
        self.assertEqual((status_body["status"], status_body["output"]), ("COMPLETED", body["output"]))

    def test_cancel_purge_health_post_an_empty_json_body(self):
        _, worker, client = new_endpoint()
        running, queued = client.run({"c": 1}), client.run({"c": 2})
        self.assertEqual(json.loads(worker.take()[2])["id"], running)
        status, headers, raw = client.post(f"cancel/{running}", timeout=3)
        self.assertEqual((status, json.loads(raw)), (200, {"id": running, "status": "CANCELLED"}))
        self.assertTrue(AIOHTTP_JSON.match(headers["content-type"]))
        status, _, raw = worker.stops()
        self.assertEqual((status, json.loads(raw)), (200, {"jobsToStop": [running]}))
        # A cancelled job gets no job-done from the SDK; Job.stream() polls it for ever, so /stream
        # must keep answering, with "stream" present.
        self.assertEqual(json.loads(client.get(f"stream/{running}")[2]), {"status": "CANCELLED", "stream": []})
        status, _, raw = client.post("purge-queue", timeout=3)
        self.assertEqual((status, json.loads(raw)), (200, {"removed": 1, "status": "completed"}))
        self.assertEqual(json.loads(client.get(f"status/{queued}")[2])["status"], "CANCELLED")
        status, _, raw = client.get("health", timeout=3)
        health = json.loads(raw)
        self.assertEqual(set(health["workers"]), {"idle", "initializing", "ready", "running", "throttled", "unhealthy"})
        self.assertEqual(set(health["jobs"]), {"completed", "failed", "inProgress", "inQueue", "retried"})
        # A result the SDK posts anyway (a sync handler it could not interrupt) is not a 4xx.
        self.assertEqual(worker.done(running, {"output": "late"})[0], 200)

    def test_errors_are_json_for_aiohttp_and_keys_with_or_without_bearer(self):
        endpoint_id, _, client = new_endpoint()
        for status, headers, raw in (
            http("GET", f"{client.base}/health", None, dict(client.headers, Authorization="Bearer fd_usr_notAKeyAtAll0000000000000")),
            client.get("status/no-such-job"),
            http("GET", f"{SERVER.base}/v2/nosuchendpoint/health", None, client.headers),
        ):
            self.assertIn(status, (401, 404))
            self.assertTrue(AIOHTTP_JSON.match(headers["content-type"]), headers["content-type"])
            self.assertIn("detail", json.loads(raw))
        raw_key = dict(client.headers, Authorization=SERVER.key)
        self.assertEqual(http("GET", f"{client.base}/health", None, raw_key)[0], 200, "a raw key, as curl examples send it")

    def test_rate_limit_retry_after_is_whole_seconds(self):
        # urllib3's Retry (runpod.Endpoint mounts it for 429) parses Retry-After as an integer or
        # an HTTP date; anything else raises InvalidHeader.
        _, _, client = new_endpoint()
        for _ in range(3):  # purge-queue: 2 per 10 s
            status, headers, raw = client.post("purge-queue", timeout=3)
        self.assertEqual(status, 429, raw)
        self.assertRegex(headers["retry-after"], r"^[0-9]+$")
        self.assertTrue(AIOHTTP_JSON.match(headers["content-type"]))


if __name__ == "__main__":
    unittest.main()
