"""Local one-shot mode (no job-take URL): --test_input, ./test_input.json, exit codes."""

import http.server
import json
import os
import subprocess
import sys
import tempfile
import threading
import unittest

from flashd_harness import PYTHON_DIR, WORKERS_DIR
from vendor_flash.serverless.local import load_test_job

SCRIPT = os.path.join(WORKERS_DIR, "local_handlers.py")


def run_local(mode, *args, cwd=None, env_extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNPOD_", "VENDOR_"))}
    env["PYTHONPATH"] = PYTHON_DIR
    env["VENDOR_LOG_FORMAT"] = "text"
    env.update(env_extra or {})
    proc = subprocess.run([sys.executable, SCRIPT, mode, *args], cwd=cwd or tempfile.gettempdir(),
                          env=env, capture_output=True, text=True, timeout=60)
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    return proc.returncode, last, proc.stdout + proc.stderr


class LoadJobTest(unittest.TestCase):
    def test_test_input_argument(self):
        job, problem = load_test_job('{"input": {"a": 1}}')
        self.assertEqual(job, {"input": {"a": 1}, "id": "local_test"})
        self.assertEqual(problem, "")

    def test_id_is_kept(self):
        job, _ = load_test_job('{"id": "mine", "input": {}}')
        self.assertEqual(job["id"], "mine")

    def test_missing_input(self):
        job, problem = load_test_job('{"id": "x"}')
        self.assertIsNone(job)
        self.assertIn("no input", problem)

    def test_bad_json(self):
        self.assertIsNone(load_test_job("{nope")[0])

    def test_file_in_cwd(self):
        with tempfile.TemporaryDirectory() as d:
            self.assertIsNone(load_test_job(None, d)[0])
            with open(os.path.join(d, "test_input.json"), "w") as fh:
                json.dump({"input": [1]}, fh)
            self.assertEqual(load_test_job(None, d)[0], {"input": [1], "id": "local_test"})


class LocalModeTest(unittest.TestCase):
    def test_success_exits_0(self):
        rc, last, out = run_local("echo", "--test_input", '{"input": {"q": "hi"}}')
        self.assertEqual(rc, 0, out)
        self.assertEqual(json.loads(last), {"output": {"id": "local_test", "input": {"q": "hi"}}})
        self.assertNotIn("start() returned", out)

    def test_sdk_flags_leave_sys_argv(self):
        # as runpod-python's start(): a handler that parses the command line sees only its own arguments
        rc, last, out = run_local("argv", "--model", "m1", "--test_input", '{"input": {}}', "--rp_log_level", "ERROR",
                                  "--rp_api_port", "9000", "-v")
        self.assertEqual(rc, 0, out)
        self.assertEqual(json.loads(last), {"output": {"argv": ["--model", "m1", "-v"]}})

    def test_help_lists_the_sdk_flags_and_exits_0_without_running_the_handler(self):
        # as runpod-python, whose start() parses its flags with argparse's -h/--help: a user who
        # tries `python3 handler.py --help` learns the flags instead of running the job (here
        # ./test_input.json) or, with a worker environment loaded, starting a worker
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "test_input.json"), "w") as fh:
                json.dump({"input": {"q": 1}}, fh)
            for flag in ("--help", "-h"):
                rc, _, out = run_local("echo", flag, cwd=d)
                self.assertEqual(rc, 0, out)
                self.assertIn("usage: ", out)
                for sdk_flag in ("--test_input", "--rp_serve_api", "--rp_api_port", "--rp_api_host",
                                 "--rp_api_concurrency", "--rp_log_level", "--rp_debugger"):
                    self.assertIn(sdk_flag, out)
                self.assertNotIn("local_test", out)
            rc, _, out = run_local("echo", "--help", cwd=d,
                                   env_extra={"VENDOR_WEBHOOK_GET_JOB": "http://127.0.0.1:9/take/$ID"})
            self.assertEqual(rc, 0, out)
            self.assertIn("usage: ", out)
            self.assertNotIn("WEBHOOK_POST_OUTPUT", out)

    def test_an_unknown_log_level_warns_once_on_stderr_and_logs_at_info(self):
        # runpod-python raises ValueError("Invalid debug level: DEBG"); here the worker goes on at INFO
        for var in ("RUNPOD_DEBUG_LEVEL", "RUNPOD_LOG_LEVEL", "VENDOR_LOG_LEVEL"):
            env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNPOD_", "VENDOR_"))}
            env.update(PYTHONPATH=PYTHON_DIR, VENDOR_LOG_FORMAT="text", **{var: "DEBG"})
            proc = subprocess.run([sys.executable, SCRIPT, "echo", "--test_input", '{"input": {}}'],
                                  cwd=tempfile.gettempdir(), env=env, capture_output=True, text=True, timeout=60)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            warnings = [line for line in proc.stderr.splitlines() if "DEBG" in line]
            self.assertEqual(warnings, [f"WARN   | {var}='DEBG' is not a log level (DEBUG, TRACE, INFO, WARN, "
                                        f"WARNING, ERROR or NOTSET, in any case): logging at INFO"], proc.stderr)
            self.assertIn("INFO   | local_test | Started.", proc.stdout)
            self.assertNotIn("DEBUG", proc.stdout)
        rc, _, out = run_local("echo", "--test_input", '{"input": {}}', "--rp_log_level", "loud")
        self.assertEqual(rc, 0, out)
        self.assertIn("--rp_log_level='loud' is not a log level", out)
        for good in ("debug", "WARN", "warning", "NOTSET", " error "):
            rc, _, out = run_local("echo", "--test_input", '{"input": {}}', env_extra={"RUNPOD_DEBUG_LEVEL": good})
            self.assertEqual(rc, 0, out)
            self.assertNotIn("not a log level", out)

    def test_test_input_json_file(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "test_input.json"), "w") as fh:
                json.dump({"id": "file-job", "input": 5}, fh)
            rc, last, out = run_local("echo", cwd=d)
        self.assertEqual(rc, 0, out)
        self.assertEqual(json.loads(last)["output"], {"id": "file-job", "input": 5})

    def test_no_input_exits_1(self):
        with tempfile.TemporaryDirectory() as d:
            rc, _, out = run_local("echo", cwd=d)
        self.assertEqual(rc, 1, out)
        # runpod-python's line and level, word for word
        self.assertIn("WARN   | test_input.json not found, exiting.\n", out)

    def test_lines_read_as_runpod_python(self):
        # runpod-python's rp_local lines, word for word (a runbook or CI check may grep them)
        rc, last, out = run_local("echo", "--test_input", '{"input": {"q": "hi"}}')
        self.assertEqual(rc, 0, out)
        lines = out.strip().splitlines()
        for expected in ("INFO   | test_input set, using test_input as job input.",
                         "INFO   | local_test | Started.",
                         "INFO   | Job local_test completed successfully.",
                         "INFO   | Local testing complete, exiting."):
            self.assertIn(expected, lines)
        self.assertEqual(lines[-2], "INFO   | Local testing complete, exiting.", out)
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "test_input.json"), "w") as fh:
                json.dump({"id": "file-job", "input": 5}, fh)
            rc, _, out = run_local("echo", cwd=d)
        self.assertEqual(rc, 0, out)
        self.assertIn("INFO   | Using test_input.json as job input.", out.splitlines())
        rc, _, out = run_local("fail", "--test_input", '{"input": {}}')
        self.assertEqual(rc, 1, out)
        self.assertTrue(any(l.startswith("ERROR  | Job local_test failed with error: {") for l in out.splitlines()), out)
        self.assertNotIn("Local testing complete", out)

    def test_exception_exits_1(self):
        rc, last, out = run_local("fail", "--test_input", '{"input": {}}')
        self.assertEqual(rc, 1, out)
        info = json.loads(json.loads(last)["error"])
        self.assertEqual(info["error_message"], "local failure")

    def test_output_the_worker_cannot_encode_fails_as_in_the_worker(self):
        # local mode printed these with json.dumps(default=str) and exited 0, while the worker
        # and --rp_serve_api end the job FAILED: it now encodes as the worker does
        for kind in ("datetime", "inf", "nan", "set", "bytes", "decimal"):
            with self.subTest(kind=kind):
                rc, last, out = run_local("unencodable", "--test_input", json.dumps({"input": {"kind": kind}}))
                self.assertEqual(rc, 1, out)
                body = json.loads(last)
                self.assertEqual(list(body), ["error"], out)
                info = json.loads(body["error"])
                self.assertTrue(info["error_message"].startswith("handler output is not JSON serialisable: "), out)
                self.assertIn("result is not JSON serialisable: ", out)
                self.assertNotIn("completed successfully", out)

    def test_error_key_exits_1(self):
        rc, last, _ = run_local("error_key", "--test_input", '{"input": {}}')
        self.assertEqual((rc, json.loads(last)), (1, {"error": "declared error"}))

    def test_sys_exit_prints_the_error_and_exits_with_its_code(self):
        rc, last, out = run_local("exit", "--test_input", '{"input": {}}')
        self.assertEqual(rc, 3, out)
        info = json.loads(json.loads(last)["error"])
        self.assertEqual(info["error_type"], "<class 'SystemExit'>")
        self.assertNotIn("start() returned", out)

    def test_rp_debugger_adds_the_timings_to_the_output(self):
        code, last, out = run_local("timed", "--rp_debugger", "--test_input", '{"input": {}}')
        self.assertEqual(code, 0, out)
        result = json.loads(last)["output"]
        self.assertTrue(result["done"], out)
        self.assertEqual([t["name"] for t in result["rp_debugger"]["timestamps"]], ["timed", "step"], out)
        self.assertGreaterEqual(result["rp_debugger"]["ready_delay_ms"], 0)
        code, last, out = run_local("timed", "--test_input", '{"input": {}}')
        self.assertEqual(json.loads(last), {"output": {"done": True}}, out)

    def test_generator_output_is_collected(self):
        rc, last, out = run_local("gen", "--test_input", '{"input": {}}')
        self.assertEqual(rc, 0, out)
        self.assertEqual(json.loads(last), {"output": ["a", "b"]})

    def test_test_input_wins_over_production_env(self):
        rc, last, out = run_local("echo", "--test_input", '{"input": 1}',
                                  env_extra={"RUNPOD_WEBHOOK_GET_JOB": "http://127.0.0.1:9/v2/x/job-take/$ID?gpu=cpu"})
        self.assertEqual(rc, 0, out)
        self.assertEqual(json.loads(last)["output"]["input"], 1)

    def test_progress_updates_are_only_logged_not_posted_to_a_result_url_in_the_env(self):
        # a developer's shell may still hold a deployed worker's URLs: the local job id must not go there
        posts = []

        class Receiver(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                posts.append(self.path)
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            url = f"http://127.0.0.1:{server.server_address[1]}/v2/x/job-done/w?gpu=cpu"
            rc, last, out = run_local("progress", "--test_input", '{"input": {}}',
                                      env_extra={"RUNPOD_WEBHOOK_POST_OUTPUT": url})
        finally:
            server.shutdown()
            server.server_close()
        self.assertEqual((rc, json.loads(last)), (0, {"output": {"done": True}}), out)
        self.assertIn("progress update: {'step': 1}", out)
        self.assertEqual(posts, [])

    def test_job_url_without_result_url_exits_2_saying_what_is_missing(self):
        # runpod-python would post every result to the literal "JOB_DONE_URL" and lose them all
        rc, _, out = run_local("echo", env_extra={"RUNPOD_WEBHOOK_GET_JOB": "http://127.0.0.1:9/v2/x/job-take/$ID?gpu=cpu"})
        self.assertEqual(rc, 2, out)
        self.assertIn("VENDOR_WEBHOOK_POST_OUTPUT (or RUNPOD_WEBHOOK_POST_OUTPUT) is not set", out)

    def test_generator_without_stream_url_exits_2_saying_what_is_missing(self):
        # without it every yield went to the literal "JOB_STREAM_URL" and each job failed with
        # "handler: unsupported URL scheme: ''"
        rc, _, out = run_local("gen", env_extra={
            "RUNPOD_WEBHOOK_GET_JOB": "http://127.0.0.1:9/v2/x/job-take/$ID?gpu=cpu",
            "RUNPOD_WEBHOOK_POST_OUTPUT": "http://127.0.0.1:9/v2/x/job-done/$ID?gpu=cpu"})
        self.assertEqual(rc, 2, out)
        self.assertIn("VENDOR_WEBHOOK_POST_STREAM (or RUNPOD_WEBHOOK_POST_STREAM) is not set", out)


class AliasTest(unittest.TestCase):
    def test_import_as_runpod(self):
        import vendor_flash as runpod

        self.assertTrue(callable(runpod.serverless.start))
        self.assertTrue(callable(runpod.serverless.progress_update))

    def test_install_runpod_alias(self):
        code = ("import vendor_flash, sys; print(vendor_flash.install_runpod_alias()); "
                "import runpod; from runpod import serverless; "
                "print(runpod is vendor_flash, serverless is vendor_flash.serverless)")
        out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": PYTHON_DIR},
                             capture_output=True, text=True, timeout=30)
        self.assertEqual(out.stdout.split(), ["True", "True", "True"], out.stderr)


if __name__ == "__main__":
    unittest.main()
