"""The SDK against a real flashd: runsync, run + status, stream, cancel, progress, refresh, shutdown.

Needs ``node`` and ``dist/flashd.mjs`` (``npm run build`` at the repo root). Skips with the reason
when they are missing or when the server has no worker routes yet.
"""

import json
import os
import re
import shutil
import signal
import tempfile
import time
import unittest

import vendor_flash.serverless
from flashd_harness import AnswerDroppingRelay, Flashd, Unavailable, WorkerProcess, wait_until
from vendor_flash.serverless.env import WorkerEnv
from vendor_flash.serverless.http import HttpClient
from vendor_flash.serverless.transport import PostOutcome, Transport

FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT"}
SERVER = None
ENDPOINTS = {}
WORKERS = []
TMP = None


def setUpModule():
    global SERVER, TMP
    try:
        SERVER = Flashd().start()
    except Unavailable as exc:
        raise unittest.SkipTest(str(exc))
    TMP = tempfile.mkdtemp(prefix="vf-it-")
    try:
        probe = SERVER.create_endpoint("probe")
        SERVER.worker_env(probe)
        for name, script_args in {
            "sync": ("sync",),
            "async": ("async", "concurrency4"),
            "gen": ("gen",),
            "gen_agg": ("gen", "aggregate"),
            "agen_agg": ("agen", "aggregate"),
            "timed": ("timed", "--rp_debugger"),
        }.items():
            endpoint_id = SERVER.create_endpoint(name.replace("_", "-"))
            ENDPOINTS[name] = endpoint_id
            WORKERS.append(WorkerProcess(SERVER.worker_env(endpoint_id), "handlers.py", *script_args,
                                         log_dir=TMP).start())
    except Unavailable as exc:
        tearDownModule()
        raise unittest.SkipTest(str(exc))


def tearDownModule():
    for worker in WORKERS:
        worker.stop()
    if SERVER is not None:
        SERVER.stop()
    if TMP and not os.environ.get("VF_KEEP_LOGS"):
        shutil.rmtree(TMP, ignore_errors=True)


def runsync(endpoint, job_input, wait_ms=30000):
    status, body = SERVER.call("POST", f"/v2/{endpoint}/runsync?wait={wait_ms}", {"input": job_input}, timeout=60)
    assert status in (200, 201), (status, body)
    return body


def run(endpoint, job_input):
    status, body = SERVER.call("POST", f"/v2/{endpoint}/run", {"input": job_input})
    assert status in (200, 201), (status, body)
    return body


def status_of(endpoint, job_id):
    status, body = SERVER.call("GET", f"/v2/{endpoint}/status/{job_id}")
    assert status == 200, (status, body)
    return body


def wait_status(endpoint, job_id, predicate, timeout=20, what="status"):
    return wait_until(lambda: (lambda b: b if predicate(b) else None)(status_of(endpoint, job_id)),
                      timeout, interval=0.05, what=what)


def heartbeat_connected(worker_pid):
    """Whether the worker's heartbeat process has a socket open (its first ping went out); True
    where /proc cannot tell."""
    if not os.path.isdir("/proc/self/fd"):
        return True
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            if ppid != worker_pid:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                if b"vendor_flash.serverless.heartbeat" not in fh.read():
                    continue
            fds = os.listdir(f"/proc/{entry}/fd")
            if any(os.readlink(f"/proc/{entry}/fd/{fd}").startswith("socket:") for fd in fds):
                return True
        except (OSError, ValueError, IndexError):
            continue
    return False


class IntegrationCase(unittest.TestCase):
    def dump_logs(self):
        out = [f"--- flashd ---\n{SERVER.log_tail()}"]
        out += [f"--- {w.argv[2:]} ---\n{w.log()[-3000:]}" for w in WORKERS]
        return "\n".join(out)


class JobTest(IntegrationCase):
    def test_runsync_sync_handler(self):
        body = runsync(ENDPOINTS["sync"], {"x": 1})
        self.assertEqual(body["status"], "COMPLETED", self.dump_logs())
        self.assertEqual(body["output"], {"echo": {"x": 1}})
        for key in ("id", "delayTime", "executionTime", "workerId"):
            self.assertIn(key, body)

    def test_job_lines_read_as_runpod_python(self):
        # runpod-python's per-job lines, word for word: "Started." and, after the result post,
        # "Finished.", both tagged with the job id.
        body = runsync(ENDPOINTS["sync"], {"return": "logged"})
        self.assertEqual(body["status"], "COMPLETED", self.dump_logs())
        log = wait_until(lambda: f"INFO   | {body['id']} | Finished." in WORKERS[0].log() and WORKERS[0].log(),
                         10, what="the Finished. line")
        lines = [line for line in log.splitlines() if f"| {body['id']} |" in line]
        self.assertEqual(lines[0], f"INFO   | {body['id']} | Started.", lines)
        self.assertEqual(lines[-1], f"INFO   | {body['id']} | Finished.", lines)
        self.assertRegex(lines[-2], r"^INFO   \| [^|]+ \| done in \d+\.\d{3} s \(ok\)$")

    def test_run_and_status(self):
        ref = run(ENDPOINTS["sync"], {"sleep": 0.2, "return": [1, "two"]})
        self.assertEqual(ref["status"], "IN_QUEUE")
        body = wait_status(ENDPOINTS["sync"], ref["id"], lambda b: b["status"] in FINAL)
        self.assertEqual(body["status"], "COMPLETED", body)
        self.assertEqual(body["output"], [1, "two"])
        self.assertTrue(body.get("workerId"))

    def test_run_replies_in_queue(self):
        # spec "States and transitions": POST /run -> IN_QUEUE, returned at once, even when an
        # idle worker long-polling takes the job before the reply is written.
        ref = run(ENDPOINTS["sync"], {"return": "q"})
        wait_status(ENDPOINTS["sync"], ref["id"], lambda b: b["status"] in FINAL)
        self.assertEqual(ref["status"], "IN_QUEUE")

    def test_non_dict_outputs(self):
        for value in ("text", 42, True, None):
            body = runsync(ENDPOINTS["sync"], {"return": value})
            self.assertEqual(body["status"], "COMPLETED", body)
            self.assertEqual(body.get("output"), value)

    def test_handler_exception_fails_with_error_string(self):
        body = runsync(ENDPOINTS["sync"], {"raise": "broken input"})
        self.assertEqual(body["status"], "FAILED", body)
        self.assertIsInstance(body["error"], str)
        info = json.loads(body["error"])
        self.assertEqual(info["error_type"], "<class 'ValueError'>")
        self.assertEqual(info["error_message"], "broken input")
        self.assertIn("Traceback", info["error_traceback"])
        self.assertTrue(info["worker_id"].startswith("wkr_"))
        self.assertIn("runpod_version", info)

    def test_handler_exception_traceback_starts_at_the_handler_call(self):
        # runpod-python's error_traceback is one SDK frame (the call into the handler), then the
        # handler's frames. The SDK's hand-off to the main thread or the event loop put four to
        # six more SDK and concurrent.futures frames (_run_single, call, `raise error`, result…)
        # ahead of the handler's, for every handler form.
        sdk_dir = os.path.dirname(os.path.realpath(vendor_flash.serverless.__file__))
        for name in ("sync", "async", "gen_agg", "agen_agg"):
            body = runsync(ENDPOINTS[name], {"raise": f"broken {name}"})
            self.assertEqual(body["status"], "FAILED", body)
            if name in ("sync", "async"):
                tb = json.loads(body["error"])["error_traceback"]
            else:
                self.assertTrue(body["error"].startswith(f"handler: broken {name} \ntraceback: "), body)
                tb = body["error"].split("\ntraceback: ", 1)[1]
            files = re.findall(r'^  File "([^"]+)", line \d+, in ', tb, re.M)
            self.assertEqual(os.path.dirname(os.path.realpath(files[0])), sdk_dir, (name, tb))
            self.assertTrue(files[1:] and all(f.endswith("handlers.py") for f in files[1:]), (name, tb))
            self.assertTrue(tb.endswith(f"ValueError: broken {name}\n"), (name, tb))

    def test_error_key_in_output_fails(self):
        body = runsync(ENDPOINTS["sync"], {"return": {"error": "bad thing", "partial": 1}})
        self.assertEqual(body["status"], "FAILED", body)
        self.assertEqual(body["error"], "bad thing")

    def test_a_failed_job_is_logged_at_error_and_the_level_still_filters(self):
        # RUNPOD_DEBUG_LEVEL=ERROR: a failed job's done line (at INFO before: nothing showed that
        # a job whose handler returned an error failed) is written, with its error on one line
        # and never its input; the INFO lines (Started., done (ok), Finished.) are not
        endpoint = SERVER.create_endpoint("error-level")
        env = dict(SERVER.worker_env(endpoint), VENDOR_LOG_LEVEL="", RUNPOD_DEBUG_LEVEL="ERROR")
        worker = WorkerProcess(env, "handlers.py", "sync", log_dir=TMP).start()
        self.addCleanup(worker.stop)
        secret = "sk-not-for-logs"
        raised = runsync(endpoint, {"raise": "broken input", "token": secret})
        returned = runsync(endpoint, {"return": {"error": "bad thing"}, "token": secret})
        fine = runsync(endpoint, {"return": "ok", "token": secret})
        self.assertEqual([b["status"] for b in (raised, returned, fine)], ["FAILED", "FAILED", "COMPLETED"],
                         worker.log())
        log = wait_until(lambda: f"| {returned['id']} | done in" in worker.log() and worker.log(), 10,
                         what="the done line")
        self.assertRegex(log, rf"(?m)^ERROR  \| {raised['id']} \| done in \d+\.\d{{3}} s "
                              rf"\(error: ValueError: broken input\)$")
        self.assertRegex(log, rf"(?m)^ERROR  \| {returned['id']} \| done in \d+\.\d{{3}} s \(error: bad thing\)$")
        self.assertNotIn(fine["id"], log)
        self.assertFalse([line for line in log.splitlines() if line.startswith(("INFO", "DEBUG"))], log)
        self.assertNotIn(secret, log)

    def test_result_nested_too_deeply_to_encode_fails_the_job(self):
        # json.dumps raises RecursionError (not TypeError/ValueError) past about 1000 levels (some
        # 10,000 on 3.13): the job ends FAILED at once instead of staying IN_PROGRESS until its
        # lease runs out and being run again
        body = runsync(ENDPOINTS["sync"], {"deep": 100_000}, wait_ms=10000)
        self.assertEqual(body["status"], "FAILED", self.dump_logs())
        info = json.loads(body["error"])
        self.assertIn("not JSON serialisable", info["error_message"])
        self.assertIn("nested too deeply", info["error_message"])

    def test_progress_nested_too_deeply_is_dropped_and_the_job_goes_on(self):
        body = runsync(ENDPOINTS["sync"], {"deep": 100_000, "as_progress": True}, wait_ms=10000)
        self.assertEqual((body["status"], body.get("output")), ("COMPLETED", {"after_progress": True}),
                         self.dump_logs())

    def test_sync_handler_runs_on_the_main_thread(self):
        # runpod-python calls sync handlers on its main thread: signal.signal() works there, and
        # thread-local state set at import (a decimal context, torch.set_grad_enabled) applies
        body = runsync(ENDPOINTS["sync"], {"alarm": 0.2})
        self.assertEqual((body["status"], body.get("output")), ("COMPLETED", {"alarm": "fired", "prec": 50}), body)

    def test_generator_runs_on_the_main_thread(self):
        body = runsync(ENDPOINTS["gen_agg"], {"prec": True, "n": 0})
        self.assertEqual((body["status"], body.get("output")), ("COMPLETED", [50]), body)

    def test_async_handler(self):
        body = runsync(ENDPOINTS["async"], {})
        self.assertEqual(body["status"], "COMPLETED", body)
        self.assertEqual(body["output"]["id"], body["id"])

    def test_progress_visible_while_in_progress(self):
        gate = os.path.join(TMP, f"gate-{time.monotonic_ns()}")
        ref = run(ENDPOINTS["sync"], {"progress": {"pct": 50, "stage": "half"}, "gate": gate})
        body = wait_status(ENDPOINTS["sync"], ref["id"],
                           lambda b: b["status"] == "IN_PROGRESS" and b.get("output") is not None,
                           what="progress in /status")
        self.assertEqual(body["output"], {"pct": 50, "stage": "half"})
        open(gate, "w").close()
        body = wait_status(ENDPOINTS["sync"], ref["id"], lambda b: b["status"] in FINAL)
        self.assertEqual(body["status"], "COMPLETED", body)
        self.assertEqual(body["output"], {"done": True})


class DebuggerTest(IntegrationCase):
    def test_rp_debugger_flag_adds_timings_to_dict_outputs(self):
        body = runsync(ENDPOINTS["timed"], {})
        self.assertEqual(body["status"], "COMPLETED", self.dump_logs())
        debug = body["output"]["rp_debugger"]
        self.assertTrue(body["output"]["done"])
        self.assertEqual([t["name"] for t in debug["timestamps"]], ["timed_handler", "step"], body)
        self.assertGreaterEqual(debug["ready_delay_ms"], 0)
        self.assertIn("python_version", debug["system_info"])
        # a list output is left as it is, and its timings do not spill into the next job
        self.assertEqual(runsync(ENDPOINTS["timed"], {"list": True})["output"], [1])
        debug = runsync(ENDPOINTS["timed"], {})["output"]["rp_debugger"]
        self.assertEqual([t["name"] for t in debug["timestamps"]], ["timed_handler", "step"], debug)


class StreamTest(IntegrationCase):
    def collect_stream(self, endpoint, job_id, timeout=20):
        chunks = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status, body = SERVER.call("GET", f"/v2/{endpoint}/stream/{job_id}")
            self.assertEqual(status, 200, body)
            self.assertIn("stream", body)
            chunks += [c["output"] for c in body["stream"]]
            if body["status"] in FINAL and not body["stream"]:
                return body["status"], chunks
            time.sleep(0.05)
        self.fail(f"stream did not end: {chunks}")

    def test_generator_stream_without_aggregate(self):
        ref = run(ENDPOINTS["gen"], {"n": 4})
        final, chunks = self.collect_stream(ENDPOINTS["gen"], ref["id"])
        self.assertEqual(final, "COMPLETED")
        self.assertEqual(chunks, [{"chunk": i} for i in range(4)])

    def test_a_yield_with_a_lone_surrogate_is_streamed_as_sent(self):
        # A JavaScript client that cut a string inside an emoji sends "\ud83d" (valid JSON), which
        # Python reads as a lone surrogate: UTF-8 cannot hold it, JSON's \u escape can.
        ref = run(ENDPOINTS["gen_agg"], {"n": 1, "echo": "cut \ud83d here"})
        final, chunks = self.collect_stream(ENDPOINTS["gen_agg"], ref["id"])
        self.assertEqual((final, chunks), ("COMPLETED", ["cut \ud83d here", {"chunk": 0}]), self.dump_logs())
        self.assertEqual(status_of(ENDPOINTS["gen_agg"], ref["id"])["output"], ["cut \ud83d here", {"chunk": 0}])

    def test_a_result_with_a_lone_surrogate_is_kept_as_sent(self):
        body = runsync(ENDPOINTS["sync"], {"text": "\udc80 tail"})
        self.assertEqual((body["status"], body.get("output")), ("COMPLETED", {"echo": {"text": "\udc80 tail"}}), body)

    def test_generator_aggregate_runsync(self):
        body = runsync(ENDPOINTS["gen_agg"], {"n": 3})
        self.assertEqual(body["status"], "COMPLETED", body)
        self.assertEqual(body["output"], [{"chunk": 0}, {"chunk": 1}, {"chunk": 2}])

    def test_async_generator_aggregate_and_stream(self):
        ref = run(ENDPOINTS["agen_agg"], {"n": 5})
        final, chunks = self.collect_stream(ENDPOINTS["agen_agg"], ref["id"])
        self.assertEqual(final, "COMPLETED")
        self.assertEqual(chunks, [f"token-{i}" for i in range(5)])
        body = status_of(ENDPOINTS["agen_agg"], ref["id"])
        self.assertEqual(body["output"], [f"token-{i}" for i in range(5)])


    def test_a_chunk_whose_answer_was_lost_is_streamed_once(self):
        # flashd stores the first chunk, but the connection drops before its answer reaches the
        # worker, which posts the chunk again: /stream must not show it twice.
        endpoint = SERVER.create_endpoint("stream-retry")
        relay = AnswerDroppingRelay(SERVER.port, "job-stream")
        self.addCleanup(relay.close)
        worker = WorkerProcess(relay.worker_env(SERVER.worker_env(endpoint)), "handlers.py", "gen", log_dir=TMP).start()
        self.addCleanup(worker.stop)
        ref = run(endpoint, {"n": 3})
        body = wait_status(endpoint, ref["id"], lambda b: b["status"] in FINAL)
        self.assertEqual(body["status"], "COMPLETED", worker.log())
        self.assertEqual(len(relay.dropped), 1, "the first chunk's answer was dropped")
        status, streamed = SERVER.call("GET", f"/v2/{endpoint}/stream/{ref['id']}")
        self.assertEqual(status, 200, streamed)
        self.assertEqual(streamed["stream"], [{"output": {"chunk": i}} for i in range(3)], worker.log())


class ConcurrencyAndCancelTest(IntegrationCase):
    def test_concurrency_modifier_runs_jobs_together(self):
        ids = [run(ENDPOINTS["async"], {"wait": 1.0})["id"] for _ in range(4)]
        bodies = [wait_status(ENDPOINTS["async"], i, lambda b: b["status"] in FINAL) for i in ids]
        self.assertTrue(all(b["status"] == "COMPLETED" for b in bodies), bodies)
        self.assertGreaterEqual(max(b["output"]["peak"] for b in bodies), 2, bodies)

    def test_cancel_reaches_async_handler(self):
        marker = os.path.join(TMP, f"cancelled-{time.monotonic_ns()}")
        started = f"{marker}.started"
        ref = run(ENDPOINTS["async"], {"forever": marker, "started": started})
        wait_status(ENDPOINTS["async"], ref["id"], lambda b: b["status"] == "IN_PROGRESS", what="IN_PROGRESS")
        # IN_PROGRESS is set when the worker takes the job, before its handler runs: a stop that
        # reaches the worker first ends the job with the handler never started (nothing to see
        # CancelledError), so the cancel waits until the handler is inside its await.
        wait_until(lambda: os.path.exists(started), 15, what="the handler to start")
        status, body = SERVER.call("POST", f"/v2/{ENDPOINTS['async']}/cancel/{ref['id']}")
        self.assertEqual(status, 200, body)
        self.assertEqual(body["status"], "CANCELLED")
        wait_until(lambda: os.path.exists(marker), 15, what="the handler to see CancelledError")
        self.assertEqual(status_of(ENDPOINTS["async"], ref["id"])["status"], "CANCELLED")
        # the worker is free again
        self.assertEqual(runsync(ENDPOINTS["async"], {})["status"], "COMPLETED")

    def test_a_cancelled_sync_job_keeps_its_worker_busy_until_the_handler_returns(self):
        # A sync handler cannot be interrupted: until it returns, the worker's heartbeats list the
        # job, so flashd counts the worker running (not idle) and gives queued jobs another one.
        endpoint = ENDPOINTS["sync"]

        def workers():
            status, body = SERVER.call("GET", f"/v2/{endpoint}/health")
            self.assertEqual(status, 200, body)
            return body["workers"]

        wait_until(lambda: workers()["idle"] == 1, 15, what="an idle sync worker")
        ref = run(endpoint, {"sleep": 4.5, "return": "too late"})
        wait_status(endpoint, ref["id"], lambda b: b["status"] == "IN_PROGRESS", what="IN_PROGRESS")
        time.sleep(1.5)  # long enough that flashd takes a ping without the job as the job let go
        status, body = SERVER.call("POST", f"/v2/{endpoint}/cancel/{ref['id']}")
        self.assertEqual((status, body["status"]), (200, "CANCELLED"))
        cancelled = time.monotonic()
        while time.monotonic() < cancelled + 2.0:  # the handler sleeps on for about 3 s
            seen = workers()
            self.assertEqual((seen["idle"], seen["running"]), (0, 1), self.dump_logs())
            time.sleep(0.1)
        # idle again soon after the handler returns (a ping at once, not at the next interval)
        wait_until(lambda: workers()["idle"] == 1, 4, what="the worker idle again")
        self.assertEqual(status_of(endpoint, ref["id"])["status"], "CANCELLED")


    def test_a_job_cancelled_right_after_its_take_leaves_the_worker_idle_at_once(self):
        # A cancel within a second of the take, before any regular ping listed the job: the
        # handler stopped at once and the worker pinged without the job, but flashd took that
        # ping for one made before the worker registered the job, so the stop (and /health's
        # running) lasted until the next regular ping, up to 10 s later.
        endpoint = SERVER.create_endpoint("cancel-at-take")
        worker = WorkerProcess(SERVER.worker_env(endpoint), "handlers.py", "async", log_dir=TMP).start()
        self.addCleanup(worker.stop)

        def workers():
            status, body = SERVER.call("GET", f"/v2/{endpoint}/health")
            self.assertEqual(status, 200, body)
            return body["workers"]

        wait_until(lambda: workers()["idle"] == 1, 15, what="an idle async worker")
        # Its heartbeat process pings from its first message on; on a loaded machine its start
        # can take seconds, so the cancels wait until it has a connection to flashd (no ping at
        # all would hold the stop for another reason).
        wait_until(lambda: heartbeat_connected(worker.proc.pid), 15, what="the heartbeat process to ping")
        for round_ in range(5):
            marker = os.path.join(TMP, f"cancel-at-take-{round_}-{time.monotonic_ns()}")
            started = f"{marker}.started"
            ref = run(endpoint, {"forever": marker, "started": started})
            wait_until(lambda: os.path.exists(started), 15, what="the handler to start")
            status, body = SERVER.call("POST", f"/v2/{endpoint}/cancel/{ref['id']}")
            self.assertEqual((status, body["status"]), (200, "CANCELLED"))
            cancelled = time.monotonic()
            wait_until(lambda: os.path.exists(marker), 5, what="the handler to see CancelledError")
            try:
                wait_until(lambda: (lambda w: w["idle"] == 1 and w["running"] == 0)(workers()), 1.5,
                           interval=0.05, what="the worker idle again")
            except AssertionError:
                self.fail(f"round {round_}: still {workers()} {time.monotonic() - cancelled:.1f} s after the cancel\n"
                          f"{worker.log()[-3000:]}\n--- flashd ---\n{SERVER.log_tail()}")
            self.assertEqual(status_of(endpoint, ref["id"])["status"], "CANCELLED")

    def test_a_modifier_that_keeps_raising_is_logged_once_and_jobs_still_run(self):
        # The take loop asks the modifier again every second while the slot is busy: a modifier
        # that raises every time is said once, not once a second for as long as jobs run.
        endpoint = SERVER.create_endpoint("modifier-raises")
        worker = WorkerProcess(SERVER.worker_env(endpoint), "handlers.py", "sync", "modifier_raises",
                               log_dir=TMP).start()
        self.addCleanup(worker.stop)
        ids = [run(endpoint, {"sleep": 2.0, "return": i})["id"] for i in range(2)]
        bodies = [wait_status(endpoint, i, lambda b: b["status"] in FINAL) for i in ids]
        self.assertEqual([(b["status"], b.get("output")) for b in bodies], [("COMPLETED", 0), ("COMPLETED", 1)],
                         worker.log())
        lines = [line for line in worker.log().splitlines() if "concurrency_modifier" in line]
        errors = [line for line in lines if line.startswith("ERROR")]
        self.assertEqual(len(errors), 1, worker.log())
        self.assertIn("concurrency_modifier failed (RuntimeError: no GPU memory figure)", errors[0])
        self.assertIsNone(worker.proc.poll())


class LifecycleTest(IntegrationCase):
    def test_refresh_worker_posts_stop_pod_and_exits(self):
        endpoint = SERVER.create_endpoint("refresh")
        worker = WorkerProcess(SERVER.worker_env(endpoint), "handlers.py", "sync", "refresh", log_dir=TMP).start()
        self.addCleanup(worker.stop)
        body = runsync(endpoint, {"return": "once"})
        self.assertEqual(body["status"], "COMPLETED", body)
        self.assertEqual(body["output"], "once")
        wait_until(lambda: worker.proc.poll() is not None, 15, what="the worker to exit")
        self.assertEqual(worker.proc.returncode, 0, worker.log())

    def test_refresh_worker_recycles_after_a_cancelled_job_too(self):
        # A cancelled job's result is not posted, but refresh_worker still holds: flashd is told
        # (so a managed worker's exit is a recycle, not a crash) and the worker exits.
        endpoint = SERVER.create_endpoint("refresh-cancel")
        worker = WorkerProcess(SERVER.worker_env(endpoint), "handlers.py", "sync", "refresh", log_dir=TMP).start()
        self.addCleanup(worker.stop)
        ref = run(endpoint, {"sleep": 1.5, "return": "too late"})
        wait_status(endpoint, ref["id"], lambda b: b["status"] == "IN_PROGRESS", what="IN_PROGRESS")
        status, body = SERVER.call("POST", f"/v2/{endpoint}/cancel/{ref['id']}")
        self.assertEqual((status, body["status"]), (200, "CANCELLED"))
        wait_until(lambda: worker.proc.poll() is not None, 15, what="the worker to exit")
        self.assertEqual(worker.proc.returncode, 0, worker.log())
        self.assertIn("asking flashd to recycle this worker", worker.log())
        status, body = SERVER.call("GET", f"/v2/{endpoint}/health")
        self.assertEqual(body["workers"], {"idle": 0, "initializing": 0, "ready": 0, "running": 0,
                                           "throttled": 0, "unhealthy": 0}, worker.log())
        self.assertEqual(status_of(endpoint, ref["id"])["status"], "CANCELLED")

    def test_sigterm_finishes_the_job_in_flight(self):
        endpoint = SERVER.create_endpoint("drain")
        worker = WorkerProcess(SERVER.worker_env(endpoint), "handlers.py", "sync", log_dir=TMP).start()
        self.addCleanup(worker.stop)
        ref = run(endpoint, {"sleep": 1.5, "return": "drained"})
        wait_status(endpoint, ref["id"], lambda b: b["status"] == "IN_PROGRESS", what="IN_PROGRESS")
        worker.proc.send_signal(signal.SIGTERM)
        body = wait_status(endpoint, ref["id"], lambda b: b["status"] in FINAL)
        self.assertEqual(body["status"], "COMPLETED", body)
        self.assertEqual(body["output"], "drained")
        wait_until(lambda: worker.proc.poll() is not None, 15, what="the worker to exit")
        self.assertEqual(worker.proc.returncode, 0, worker.log())

    def test_retry_of_a_timed_out_sync_job_runs_once_its_old_run_has_returned(self):
        # The worker still runs the timed-out attempt (a sync handler cannot be interrupted) and
        # has free slots: the retry must not be handed to it while it does, or it takes the
        # retry for a copy of the job it holds, ignores it, and the retry times out unrun.
        endpoint = SERVER.create_endpoint("retry-sync")
        worker = WorkerProcess(SERVER.worker_env(endpoint), "handlers.py", "sync", "concurrency4", log_dir=TMP).start()
        self.addCleanup(worker.stop)
        gate = os.path.join(TMP, f"gate-{time.monotonic_ns()}")
        job_input = {"print": "waiting for the gate", "gate": gate, "return": "ran"}
        status, ref = SERVER.call("POST", f"/v2/{endpoint}/run", {"input": job_input, "policy": {"executionTimeout": 5000}})
        self.assertEqual(status, 200, ref)
        wait_status(endpoint, ref["id"], lambda b: b["status"] == "TIMED_OUT", timeout=20, what="TIMED_OUT")
        status, body = SERVER.call("POST", f"/v2/{endpoint}/retry/{ref['id']}")
        self.assertEqual((status, body["status"]), (200, "IN_QUEUE"), body)
        time.sleep(1.0)
        with open(gate, "w"):
            pass  # the old run returns now; the retry finds the gate open at once
        body = wait_status(endpoint, ref["id"], lambda b: b["status"] in FINAL, timeout=20)
        self.assertEqual((body["status"], body.get("output")), ("COMPLETED", "ran"), worker.log())
        self.assertNotIn("job delivered twice", worker.log())


class FailureModesTest(IntegrationCase):
    """Handlers and results that used to leave a job IN_PROGRESS (and run again after its lease)."""

    OVER_LIMIT = 64 * 1024 * 1024 + 1000  # flashd's job-done and job-stream limit is 64 MiB

    def test_sys_exit_fails_the_job_and_the_worker_exits_with_its_code(self):
        endpoint = SERVER.create_endpoint("exit")
        worker = WorkerProcess(SERVER.worker_env(endpoint), "handlers.py", "sync", log_dir=TMP).start()
        self.addCleanup(worker.stop)
        body = runsync(endpoint, {"exit": 3})
        self.assertEqual(body["status"], "FAILED", body)
        info = json.loads(body["error"])
        self.assertEqual(info["error_type"], "<class 'SystemExit'>")
        self.assertIn("sys.exit(3)", info["error_message"])
        wait_until(lambda: worker.proc.poll() is not None, 15, what="the worker to exit")
        self.assertEqual(worker.proc.returncode, 3, worker.log())
        self.assertEqual(worker.log().count(f"{body['id']} | Started."), 1, worker.log())

    def test_result_over_the_body_limit_fails_the_job(self):
        endpoint = SERVER.create_endpoint("big")
        worker = WorkerProcess(SERVER.worker_env(endpoint), "handlers.py", "sync", log_dir=TMP).start()
        self.addCleanup(worker.stop)
        body = runsync(endpoint, {"big": self.OVER_LIMIT})
        self.assertEqual(body["status"], "FAILED", body)
        # flashd fails the job itself when it refuses the post; the SDK's own error post comes second.
        self.assertRegex(body["error"], r"^The worker's result was \d+ bytes, over the 67108864-byte limit of a worker post \(HTTP 413\)")
        posts = lambda: worker.log().count("result (") + worker.log().count("result post failed")  # noqa: E731
        wait_until(lambda: posts() > 0, 15, what="the worker to log its refused result")
        self.assertEqual(posts(), 1, worker.log())  # posted once, never re-uploaded
        self.assertEqual(runsync(endpoint, {"return": "next"})["output"], "next")  # the worker goes on

    def test_stream_chunk_over_the_body_limit_fails_the_job(self):
        ref = run(ENDPOINTS["gen"], {"n": 3, "big": self.OVER_LIMIT})
        body = wait_status(ENDPOINTS["gen"], ref["id"], lambda b: b["status"] in FINAL)
        self.assertEqual(body["status"], "FAILED", body)
        self.assertRegex(body["error"], r"^The worker's stream chunk was \d+ bytes, over the 67108864-byte limit of a worker post \(HTTP 413\)")


class LeaseTest(unittest.TestCase):
    """Heartbeats renew leases; a stale attempt's result gets 409 and is dropped (own flashd, short lease)."""

    LEASE_MS = 3000

    @classmethod
    def setUpClass(cls):
        if SERVER is None:
            raise unittest.SkipTest("flashd unavailable")
        cls.server = Flashd(["--lease-ms", str(cls.LEASE_MS), "--max-attempts", "5"]).start()
        cls.endpoint = cls.server.create_endpoint("lease")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def start_worker(self, heartbeat=True):
        env = self.server.worker_env(self.endpoint)
        if not heartbeat:
            env = {k: v for k, v in env.items() if not k.endswith("WEBHOOK_PING")}
        worker = WorkerProcess(env, "handlers.py", "sync", log_dir=TMP).start()
        self.addCleanup(worker.stop)
        return worker

    def job(self, job_id):
        status, body = self.server.call("GET", f"/v2/{self.endpoint}/status/{job_id}")
        self.assertEqual(status, 200, body)
        return body

    def test_heartbeat_keeps_a_long_job(self):
        worker = self.start_worker()
        _, ref = self.server.call("POST", f"/v2/{self.endpoint}/run", {"input": {"sleep": 2.5 * self.LEASE_MS / 1000, "return": "kept"}})
        body = wait_until(lambda: (lambda b: b if b["status"] in FINAL else None)(self.job(ref["id"])), 30, what="final status")
        self.assertEqual(body["status"], "COMPLETED", body)
        self.assertEqual(body["output"], "kept")
        self.assertEqual(worker.log().count(f"{ref['id']} | Started."), 1, worker.log())
        self.assertNotIn("409", worker.log())

    def test_result_for_a_job_held_by_another_worker_gets_409_once(self):
        endpoint = self.server.create_endpoint("stale")
        env_a = WorkerEnv.from_environ(self.server.worker_env(endpoint))
        env_b = WorkerEnv.from_environ(self.server.worker_env(endpoint))
        _, ref = self.server.call("POST", f"/v2/{endpoint}/run", {"input": {"n": 1}})
        with HttpClient(env_a.api_key) as client:
            taken = client.request("GET", env_a.job_take_url(False), timeout=30)
        self.assertEqual(taken.status, 200, taken.text())
        self.assertEqual(taken.json()["id"], ref["id"])

        with CountingClient(env_b.api_key) as counting:
            outcome = Transport(env_b, client=counting, retry_delays=(0.01,) * 4).post_done(ref["id"], {"output": "b"})
        self.assertIs(outcome, PostOutcome.STALE)
        self.assertEqual(counting.calls, 1)  # a 409 is never retried

        with HttpClient(env_a.api_key) as client:
            outcome = Transport(env_a, client=client).post_done(ref["id"], {"output": "a"})
        self.assertIs(outcome, PostOutcome.DELIVERED)
        body = self.job_on(endpoint, ref["id"])
        self.assertEqual((body["status"], body["output"]), ("COMPLETED", "a"))

    def test_stopping_a_sync_job_does_not_spin_the_stop_channel(self):
        worker = self.start_worker()
        _, ref = self.server.call("POST", f"/v2/{self.endpoint}/run", {"input": {"sleep": 2.0, "return": "x"}})
        wait_until(lambda: self.job(ref["id"])["status"] == "IN_PROGRESS", 10, what="IN_PROGRESS")
        status, body = self.server.call("POST", f"/v2/{self.endpoint}/cancel/{ref['id']}")
        self.assertEqual((status, body["status"]), (200, "CANCELLED"))
        wait_until(lambda: "stopped: no result posted" in worker.log(), 15, what="the result to be dropped")
        self.assertEqual(self.job(ref["id"])["status"], "CANCELLED")
        self.assertIn("stop requested by flashd (cancel, timeout or lost lease): stopping the job", worker.log())
        self.assertLessEqual(worker.log().count("job-stop: ["), 5, worker.log())
        # and the worker takes new work afterwards
        _, ref2 = self.server.call("POST", f"/v2/{self.endpoint}/run", {"input": {"return": "next"}})
        body = wait_until(lambda: (lambda b: b if b["status"] in FINAL else None)(self.job(ref2["id"])), 15, what="next job")
        self.assertEqual(body["output"], "next")

    def test_result_of_a_job_whose_stop_comes_late_is_not_logged_as_done(self):
        # the job-stop reaches the worker only after the handler has returned (a paused worker,
        # a slow network): the result is posted and flashd discards it; the log says so
        # its own endpoint: the relay's job-take long-poll outlives the worker and would take a job
        endpoint = self.server.create_endpoint("late-stop")
        relay = AnswerDroppingRelay(self.server.port, hold_route="job-stop")
        self.addCleanup(relay.close)
        worker = WorkerProcess(relay.worker_env(self.server.worker_env(endpoint)), "handlers.py", "sync",
                               log_dir=TMP).start()
        self.addCleanup(worker.stop)
        wait_until(relay.held.is_set, 15, what="the first job-stop poll")
        _, ref = self.server.call("POST", f"/v2/{endpoint}/run", {"input": {"sleep": 1.5, "return": "late"}})
        wait_until(lambda: self.job_on(endpoint, ref["id"])["status"] == "IN_PROGRESS", 10, what="IN_PROGRESS")
        status, body = self.server.call("POST", f"/v2/{endpoint}/cancel/{ref['id']}")
        self.assertEqual((status, body["status"]), (200, "CANCELLED"))
        wait_until(lambda: f"{ref['id']} | Finished." in worker.log(), 15, what="the job to finish")
        relay.release()
        lines = [line.split(" | ")[-1] for line in worker.log().splitlines() if f" | {ref['id']} | " in line]
        self.assertEqual(self.job_on(endpoint, ref["id"])["status"], "CANCELLED")
        self.assertFalse([line for line in lines if line.startswith("done in")], lines)
        self.assertEqual(lines[0], "Started.", lines)
        self.assertRegex(lines[1], r"^stopped by flashd before its result arrived: result discarded "
                                   r"\(after \d+\.\d{3} s\)$")
        self.assertEqual(lines[2:], ["Finished."], lines)

    def job_on(self, endpoint, job_id):
        status, body = self.server.call("GET", f"/v2/{endpoint}/status/{job_id}")
        self.assertEqual(status, 200, body)
        return body


class CountingClient(HttpClient):
    """An HttpClient that counts requests."""

    calls = 0

    def request(self, *args, **kwargs):
        self.calls += 1
        return super().request(*args, **kwargs)

class RestartTest(unittest.TestCase):
    """flashd killed with SIGKILL and restarted on the same port and data dir."""

    def setUp(self):
        if SERVER is None:
            raise unittest.SkipTest("flashd unavailable")
        self.server = Flashd().start()
        self.addCleanup(self.server.stop)
        self.endpoint = self.server.create_endpoint("restart")
        self.worker = WorkerProcess(self.server.worker_env(self.endpoint), "handlers.py", "sync", log_dir=TMP).start()
        self.addCleanup(self.worker.stop)

    def final(self, job_id, timeout=30):
        def done():
            status, body = self.server.call("GET", f"/v2/{self.endpoint}/status/{job_id}")
            return body if status == 200 and body["status"] in FINAL else None
        return wait_until(done, timeout, interval=0.1, what="a final status")

    def _result_across_an_outage(self, outage_s, value):
        """A job whose result post meets flashd down for `outage_s` more seconds: posted once it is back, run once."""
        _, ref = self.server.call("POST", f"/v2/{self.endpoint}/run", {"input": {"sleep": 1.0, "return": value}})
        wait_until(lambda: f"{ref['id']} | Started." in self.worker.log(), 15, what="the job to start")
        # flashd writes a claim once its job has run 100 ms (a job claimed just before a crash
        # is queued again instead); past that, the worker keeps its job across the restart
        time.sleep(0.3)
        self.server.kill()
        # the result post meets a refused connection and is retried with backoff
        wait_until(lambda: f"{ref['id']} | result post failed" in self.worker.log(), 15, what="a failed post")
        time.sleep(outage_s)
        self.server.start()
        body = self.final(ref["id"], timeout=45)
        self.assertEqual((body["status"], body.get("output")), ("COMPLETED", value), self.worker.log())
        self.assertEqual(self.worker.log().count(f"{ref['id']} | Started."), 1, self.worker.log())

    def test_result_posted_across_a_server_restart(self):
        self._result_across_an_outage(0.0, "survived")

    def test_result_survives_an_outage_longer_than_the_first_retries(self):
        # the first 5 attempts span about 7.5 s; a final result keeps being retried for minutes
        self._result_across_an_outage(9.0, "patient")

    def test_idle_worker_reconnects_after_a_restart(self):
        self.assertEqual(runsync_on(self.server, self.endpoint, {"return": 1})["output"], 1)
        self.server.kill()
        self.server.start()
        body = runsync_on(self.server, self.endpoint, {"return": 2})
        self.assertEqual((body["status"], body.get("output")), ("COMPLETED", 2), self.worker.log())
        self.assertEqual(self.worker.proc.poll(), None)


def runsync_on(server, endpoint, job_input):
    status, body = server.call("POST", f"/v2/{endpoint}/runsync?wait=30000", {"input": job_input}, timeout=60)
    assert status == 200, (status, body)
    if body["status"] not in FINAL:
        status, body = server.call("GET", f"/v2/{endpoint}/status/{body['id']}")
    return body


if __name__ == "__main__":
    unittest.main()
