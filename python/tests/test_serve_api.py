"""``--rp_serve_api``: the local test API, over real HTTP on loopback, one server per handler form."""

import base64
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from flashd_harness import PYTHON_DIR, WORKERS_DIR

SCRIPT = os.path.join(WORKERS_DIR, "serve_handlers.py")
LISTENING = re.compile(r"local test API .* on http://([^:/]+):(\d+)")


class Server:
    """``serve_handlers.py <mode> --rp_serve_api --rp_api_port 0`` in a subprocess."""

    def __init__(self, mode, *args):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNPOD_", "VENDOR_"))}
        env.update(PYTHONPATH=PYTHON_DIR, VENDOR_LOG_FORMAT="text", PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen([sys.executable, SCRIPT, mode, "--rp_serve_api", "--rp_api_port", "0", *args],
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines = []
        self.port = None
        self._ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if not self._ready.wait(20) or self.port is None:
            self.stop()
            raise AssertionError("the local test API did not start:\n" + self.output())

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)
            match = LISTENING.search(line)
            if match and self.port is None:
                self.host, self.port = match.group(1), int(match.group(2))
                self._ready.set()
        self._ready.set()

    def output(self):
        return "".join(self.lines)

    def request(self, method, path, body=None, raw=None):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=20)
        try:
            data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
            conn.request(method, path, body=data, headers={"Content-Type": "application/json"} if data is not None else {})
            resp = conn.getresponse()
            return resp.status, json.loads(resp.read().decode())
        finally:
            conn.close()

    def wait(self, timeout=10):
        return self.proc.wait(timeout)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()


class ServeApiCase(unittest.TestCase):
    mode = ""
    args = ()

    @classmethod
    def setUpClass(cls):
        cls.server = Server(cls.mode, *cls.args)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def wait_for_output(self, pattern, timeout=15):
        deadline = time.monotonic() + timeout
        while not re.search(pattern, self.server.output()) and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.server.output()

    def run_then(self, route, job_input):
        status, answer = self.server.request("POST", "/run", {"input": job_input})
        self.assertEqual(status, 200, answer)
        self.assertEqual(answer["status"], "IN_PROGRESS")
        self.assertRegex(answer["id"], r"^test-[0-9a-f-]{36}$")
        return answer["id"], self.server.request("POST", f"/{route}/{answer['id']}")


class SyncHandlerTest(ServeApiCase):
    mode = "sync"

    def test_listens_on_localhost_by_default(self):
        self.assertEqual(self.server.host, "127.0.0.1", self.server.output())

    def test_runsync(self):
        status, answer = self.server.request("POST", "/runsync", {"input": {"q": "hi"}})
        self.assertEqual(status, 200)
        self.assertEqual(answer["status"], "COMPLETED")
        # the handler gets {"id", "input"}, and its sync code runs on the main thread, as in the worker loop
        self.assertEqual(answer["output"], {"id": answer["id"], "input": {"q": "hi"}, "main_thread": True})

    def test_run_then_status_runs_the_job_once(self):
        job_id, (status, answer) = self.run_then("status", {"q": 1})
        self.assertEqual((status, answer["status"], answer["output"]["input"]), (200, "COMPLETED", {"q": 1}))
        self.assertEqual(answer["id"], job_id)
        status, answer = self.server.request("POST", f"/status/{job_id}")
        self.assertEqual((status, answer), (404, {"id": job_id, "status": "FAILED", "error": "Job ID not found"}))

    def test_status_answers_get_too(self):
        status, answer = self.server.request("POST", "/run", {"input": {"q": 2}})
        status, answer = self.server.request("GET", f"/status/{answer['id']}")
        self.assertEqual((status, answer["output"]["input"]), (200, {"q": 2}))

    def test_exception_fails_with_the_error_string(self):
        status, answer = self.server.request("POST", "/runsync", {"input": {"fail": True}})
        self.assertEqual((status, answer["status"], sorted(answer)), (200, "FAILED", ["error", "id", "status"]))
        info = json.loads(answer["error"])
        self.assertEqual((info["error_type"], info["error_message"]), ("<class 'RuntimeError'>", "sync failure"))

    def test_error_key_fails(self):
        status, answer = self.server.request("POST", "/runsync", {"input": {"error": "declared"}})
        self.assertEqual(answer, {"id": answer["id"], "status": "FAILED", "error": "declared"})

    def test_a_failed_job_is_done_at_error_with_its_error_and_never_its_input(self):
        # a failed job's done line was "done (error)" at INFO; a handler that returned an error
        # had no ERROR line at all
        ids = []
        for job_input in ({"fail": True, "token": "sk-not-for-logs"}, {"error": "declared", "token": "sk-not-for-logs"},
                          {"q": "fine"}):
            ids.append(self.server.request("POST", "/runsync", {"input": job_input})[1]["id"])
        out = self.wait_for_output(rf"{ids[-1]} \| Finished\.")
        done = [line for line in out.splitlines() if " | done (" in line and any(i in line for i in ids)]
        self.assertEqual(done, [f"ERROR  | {ids[0]} | done (error: RuntimeError: sync failure)",
                                f"ERROR  | {ids[1]} | done (error: declared)",
                                f"INFO   | {ids[2]} | done (ok)"], out)
        self.assertNotIn("sk-not-for-logs", out)

    def test_none_output_is_left_out(self):
        status, answer = self.server.request("POST", "/runsync", {"input": {"none": True}})
        self.assertEqual(answer, {"id": answer["id"], "status": "COMPLETED"})

    def test_stream_of_a_plain_handler_fails_and_keeps_the_job(self):
        job_id, (status, answer) = self.run_then("stream", {"q": 3})
        self.assertEqual((status, answer), (200, {"id": job_id, "status": "FAILED",
                                                  "error": "Stream not supported, handler must be a generator."}))
        status, answer = self.server.request("POST", f"/status/{job_id}")
        self.assertEqual((status, answer["status"]), (200, "COMPLETED"))

    def test_bad_requests(self):
        cases = [
            (b"{not json", "json_invalid", ["body"]),
            (b"", "missing", ["body"]),
            (b"[1]", "model_attributes_type", ["body"]),
            (b"{}", "missing", ["body", "input"]),
            (b'{"input": null}', "missing", ["body", "input"]),
            (b'{"input": [1]}', "dict_type", ["body", "input"]),
            (b'{"input": {}, "webhook": 5}', "string_type", ["body", "webhook"]),
        ]
        for raw, kind, loc in cases:
            for route in ("/run", "/runsync"):
                with self.subTest(body=raw, route=route):
                    status, answer = self.server.request("POST", route, raw=raw)
                    self.assertEqual(status, 422, answer)
                    self.assertEqual((answer["detail"][0]["type"], answer["detail"][0]["loc"]), (kind, loc))
                    self.assertTrue(answer["detail"][0]["msg"])

    def test_a_bad_content_length_is_a_400(self):
        for value in ("-5", "abc"):
            with self.subTest(content_length=value), socket.create_connection((self.server.host, self.server.port), timeout=20) as s:
                s.sendall(f"POST /runsync HTTP/1.1\r\nHost: x\r\nContent-Length: {value}\r\n\r\n".encode())
                head = s.makefile("rb").read().decode("latin-1")  # the server closes the connection after it
                self.assertTrue(head.startswith("HTTP/1.0 400") or head.startswith("HTTP/1.1 400"), head)
                self.assertIn("bad Content-Length", head)

    def test_unknown_routes_and_methods(self):
        self.assertEqual(self.server.request("GET", "/nope"), (404, {"detail": "Not Found"}))
        self.assertEqual(self.server.request("GET", "/runsync"), (405, {"detail": "Method Not Allowed"}))
        self.assertEqual(self.server.request("POST", "/stream/nope"),
                         (404, {"id": "nope", "status": "FAILED", "error": "Job ID not found"}))

    def test_health_and_index(self):
        status, answer = self.server.request("GET", "/health")
        self.assertEqual(status, 200)
        self.assertEqual(sorted(answer["jobs"]), ["completed", "failed", "inProgress", "inQueue", "retried"])
        status, answer = self.server.request("GET", "/")
        self.assertEqual((status, answer["handler"]), (200, "sync"))

    def start_hook(self):
        """A webhook receiver on loopback: returns ``(port, got, done)``; ``got`` holds
        ``(path, Authorization header, body)`` per POST."""
        got = []
        done = threading.Event()

        class Hook(BaseHTTPRequestHandler):
            def do_POST(self):
                got.append((self.path, self.headers.get("Authorization"),
                            json.loads(self.rfile.read(int(self.headers["Content-Length"])))))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()
                done.set()

            def log_message(self, *args):
                pass

        hook = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
        threading.Thread(target=hook.serve_forever, daemon=True).start()
        self.addCleanup(hook.server_close)
        self.addCleanup(hook.shutdown)
        return hook.server_address[1], got, done

    def test_a_webhook_that_is_not_a_url_is_one_warning(self):
        # urllib.request.Request() raised before the try: a raw traceback out of the webhook thread
        marker = len(self.server.lines)
        for bad in ("nota url", "ftp://127.0.0.1/hook"):
            status, answer = self.server.request("POST", "/runsync", {"input": {"w": 3}, "webhook": bad})
            self.assertEqual((status, answer["status"]), (200, "COMPLETED"))
        self.wait_for_output(r"webhook ftp://127\.0\.0\.1/hook failed")
        out = "".join(self.server.lines[marker:])
        self.assertNotIn("Traceback", out)
        self.assertNotIn("Exception in thread", out)
        warnings = [re.sub(r"test-[0-9a-f-]{36}", "test-ID", l) for l in out.splitlines() if "webhook" in l]
        self.assertEqual(warnings, ["WARN   | test-ID | webhook nota url failed: not an http or https URL",
                                    "WARN   | test-ID | webhook ftp://127.0.0.1/hook failed: not an http or https URL"],
                         out)

    def test_webhook_user_info_is_sent_as_basic_auth(self):
        # urllib took "bob:pw@127.0.0.1" for the host (a DNS error); requests, which
        # runpod-python's test API posts with, sends the user info as Basic auth
        port, got, done = self.start_hook()
        url = f"http://bob:s3cr3t%40pw@127.0.0.1:{port}/cb"
        status, answer = self.server.request("POST", "/runsync", {"input": {"w": 4}, "webhook": url})
        self.assertEqual(status, 200)
        self.assertTrue(done.wait(10), self.server.output())
        expected = "Basic " + base64.b64encode(b"bob:s3cr3t@pw").decode()
        self.assertEqual(got, [("/cb", expected, {"output": answer["output"]})])
        # a failure never logs the password
        with socket.socket() as closed:
            closed.bind(("127.0.0.1", 0))
            dead = closed.getsockname()[1]
        status, _ = self.server.request("POST", "/runsync", {"input": {"w": 5},
                                                             "webhook": f"http://bob:s3cr3t@127.0.0.1:{dead}/cb"})
        out = self.wait_for_output(rf"webhook http://127\.0\.0\.1:{dead}/cb failed")
        self.assertIn(f"webhook http://127.0.0.1:{dead}/cb failed: ", out)
        self.assertNotIn("s3cr3t", out)

    def test_webhook_gets_the_output(self):
        port, got, done = self.start_hook()
        url = f"http://127.0.0.1:{port}/hook"
        status, answer = self.server.request("POST", "/runsync", {"input": {"w": 1}, "webhook": url})
        self.assertEqual(status, 200)
        self.assertTrue(done.wait(10), self.server.output())
        self.assertEqual(got, [("/hook", None, {"output": answer["output"]})])

    def test_a_failed_webhook_is_logged_without_its_query(self):
        # a webhook URL often carries its credential in the query (?token=...): never in the log
        with socket.socket() as closed:
            closed.bind(("127.0.0.1", 0))
            port = closed.getsockname()[1]  # nothing listens there once closed
        url = f"http://127.0.0.1:{port}/hook/path?token=s3cr3t-webhook-token"
        status, _ = self.server.request("POST", "/runsync", {"input": {"w": 2}, "webhook": url})
        self.assertEqual(status, 200)
        deadline = time.monotonic() + 15
        while not re.search(r"webhook .* failed", self.server.output()) and time.monotonic() < deadline:
            time.sleep(0.05)
        out = self.server.output()
        self.assertIn(f"webhook http://127.0.0.1:{port}/hook/path (query hidden) failed", out)
        self.assertNotIn("s3cr3t-webhook-token", out)


class AsyncHandlerTest(ServeApiCase):
    mode = "async"

    def test_runsync_and_status(self):
        status, answer = self.server.request("POST", "/runsync", {"input": {"a": 1}})
        self.assertEqual((status, answer["status"], answer["output"]), (200, "COMPLETED", {"async": {"a": 1}}))
        _, (status, answer) = self.run_then("status", {"fail": True})
        self.assertEqual((status, answer["status"]), (200, "FAILED"))
        self.assertEqual(json.loads(answer["error"])["error_message"], "async failure")


class GeneratorHandlerTest(ServeApiCase):
    mode = "gen"

    def test_stream_answers_every_chunk(self):
        job_id, (status, answer) = self.run_then("stream", {"n": 3})
        self.assertEqual((status, answer), (200, {"id": job_id, "status": "COMPLETED",
                                                  "stream": [{"output": {"i": i}} for i in range(3)]}))
        self.assertEqual(self.server.request("POST", f"/stream/{job_id}")[0], 404)

    def test_without_return_aggregate_stream_the_output_is_empty(self):
        # as the worker loop posts it (and flashd's /status then shows it)
        status, answer = self.server.request("POST", "/runsync", {"input": {"n": 2}})
        self.assertEqual((status, answer["status"], answer["output"]), (200, "COMPLETED", []))
        _, (status, answer) = self.run_then("status", {"n": 2})
        self.assertEqual((status, answer["output"]), (200, []))

    def test_a_chunk_with_a_lone_surrogate_is_answered_as_sent(self):
        # "\ud83d" is valid JSON (a JavaScript client's string cut inside an emoji); UTF-8 cannot hold it
        job_id, (status, answer) = self.run_then("stream", {"n": 0, "echo": "cut \ud83d"})
        self.assertEqual((status, answer), (200, {"id": job_id, "status": "COMPLETED", "stream": [{"output": "cut \ud83d"}]}))

    def test_failing_generator(self):
        job_id, (status, answer) = self.run_then("stream", {"n": 2, "fail": True})
        self.assertEqual((status, answer["status"], answer["stream"]), (200, "FAILED", [{"output": {"i": 0}}, {"output": {"i": 1}}]))
        self.assertTrue(answer["error"].startswith("handler: generator failure \ntraceback: "), answer)
        self.assertIn(f"ERROR  | {job_id} | done (error: generator failure)\n",
                      self.wait_for_output(rf"{job_id} \| Finished\."))
        status, answer = self.server.request("POST", "/runsync", {"input": {"fail": True}})
        self.assertEqual((status, answer["status"]), (200, "FAILED"))


class AsyncGeneratorAggregateTest(ServeApiCase):
    mode = "agen"
    args = ("--rp_api_concurrency", "2", "--rp_api_host", "127.0.0.1")

    def test_host_flag(self):
        self.assertEqual(self.server.host, "127.0.0.1")

    def test_aggregate_stream_returns_the_yields(self):
        status, answer = self.server.request("POST", "/runsync", {"input": {"n": 3}})
        self.assertEqual((status, answer["output"]), (200, ["tok0", "tok1", "tok2"]))
        job_id, (status, answer) = self.run_then("stream", {"n": 2})
        self.assertEqual(answer, {"id": job_id, "status": "COMPLETED", "stream": [{"output": "tok0"}, {"output": "tok1"}]})


class ShutdownTest(unittest.TestCase):
    def test_sigint_stops_the_server_and_start_returns(self):
        server = Server("sync")
        self.assertEqual(server.request("POST", "/runsync", {"input": {}})[0], 200)
        server.proc.send_signal(signal.SIGINT)
        self.assertEqual(server.wait(), 0, server.output())
        server.stop()
        self.assertIn("start() returned 0", server.output())

    def test_one_sigterm_delivered_twice_is_one_stop(self):
        # `timeout -s TERM` signals the process and its group: the repeat is not a second signal
        # (a sync handler runs meanwhile, so the first signal has not ended the process yet)
        server = Server("sync")
        answers = []
        request = threading.Thread(target=lambda: answers.append(
            server.request("POST", "/runsync", {"input": {"sleep": 1}})))
        request.start()
        deadline = time.monotonic() + 10
        while "Started." not in server.output() and time.monotonic() < deadline:
            time.sleep(0.01)
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(0.05)  # two pending SIGTERMs would be delivered as one
        server.proc.send_signal(signal.SIGTERM)
        request.join(10)
        self.assertEqual(server.wait(), 0, server.output())
        server.stop()
        self.assertEqual([(status, answer["status"]) for status, answer in answers], [(200, "COMPLETED")])
        self.assertIn("start() returned 0", server.output())

    def test_handler_sys_exit_fails_the_job_then_exits_with_its_code(self):
        server = Server("sync")
        try:
            status, answer = server.request("POST", "/runsync", {"input": {"exit": True}})
            self.assertEqual((status, answer["status"]), (200, "FAILED"))
            self.assertEqual(json.loads(answer["error"])["error_type"], "<class 'SystemExit'>")
            self.assertEqual(server.wait(), 3, server.output())
        finally:
            server.stop()


class BindErrorTest(unittest.TestCase):
    """A port that cannot be had (flashd's own default port 8000, another test API) is said in
    one line naming the address and the flag, and start() exits 1, as uvicorn does for
    runpod-python: no traceback."""

    def run_serve(self, *args):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNPOD_", "VENDOR_"))}
        env.update(PYTHONPATH=PYTHON_DIR, VENDOR_LOG_FORMAT="text")
        return subprocess.run([sys.executable, SCRIPT, "sync", "--rp_serve_api", *args], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=20)

    def test_a_port_in_use_is_one_clear_line_and_exit_1(self):
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            done = self.run_serve("--rp_api_host", "127.0.0.1", "--rp_api_port", str(port))
        self.assertEqual(done.returncode, 1, done.stdout)
        self.assertNotIn("Traceback", done.stdout)
        self.assertRegex(done.stdout, rf"ERROR +\| local test API cannot listen on 127\.0\.0\.1:{port}: .*in use.*--rp_api_port")

    def test_a_port_out_of_range_is_one_clear_line_and_exit_1(self):
        done = self.run_serve("--rp_api_port", "70000")
        self.assertEqual(done.returncode, 1, done.stdout)
        self.assertNotIn("Traceback", done.stdout)
        self.assertRegex(done.stdout, r"ERROR +\| local test API cannot listen on localhost:70000: .*--rp_api_port")


if __name__ == "__main__":
    unittest.main()
