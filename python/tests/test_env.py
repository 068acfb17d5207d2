"""Env var fallbacks and URL building."""

import unittest

from vendor_flash.serverless.env import WorkerEnv, append_query, env_value

BASE = "http://flashd:8000/v2/ep1"


def runpod_env(**extra):
    env = {
        "RUNPOD_WEBHOOK_GET_JOB": f"{BASE}/job-take/$ID?gpu=NVIDIA+A40",
        "RUNPOD_WEBHOOK_POST_OUTPUT": f"{BASE}/job-done/$RUNPOD_POD_ID/$ID?gpu=NVIDIA+A40",
        "RUNPOD_WEBHOOK_POST_STREAM": f"{BASE}/job-stream/$RUNPOD_POD_ID/$ID?gpu=NVIDIA+A40",
        "RUNPOD_WEBHOOK_PING": f"{BASE}/ping/$RUNPOD_POD_ID?gpu=NVIDIA+A40",
        "RUNPOD_POD_ID": "pod7",
        "RUNPOD_AI_API_KEY": "k-runpod",
        "RUNPOD_ENDPOINT_ID": "ep1",
        "RUNPOD_PING_INTERVAL": "4000",
    }
    env.update(extra)
    return env


class EnvFallbackTest(unittest.TestCase):
    def test_vendor_name_wins(self):
        env = {"VENDOR_AI_API_KEY": "v", "RUNPOD_AI_API_KEY": "r"}
        self.assertEqual(env_value("AI_API_KEY", env), "v")

    def test_runpod_name_is_the_fallback(self):
        self.assertEqual(env_value("AI_API_KEY", {"RUNPOD_AI_API_KEY": "r"}), "r")

    def test_empty_value_counts_as_unset(self):
        env = {"VENDOR_AI_API_KEY": "", "RUNPOD_AI_API_KEY": "r"}
        self.assertEqual(env_value("AI_API_KEY", env), "r")
        self.assertIsNone(env_value("AI_API_KEY", {"VENDOR_AI_API_KEY": ""}))

    def test_from_runpod_environment(self):
        env = WorkerEnv.from_environ(runpod_env())
        self.assertTrue(env.is_production)
        self.assertEqual(env.worker_id, "pod7")
        self.assertEqual(env.api_key, "k-runpod")
        self.assertEqual(env.endpoint_id, "ep1")
        self.assertEqual(env.ping_interval, 4.0)
        self.assertTrue(env.ping_enabled)

    def test_vendor_names_override_runpod_names(self):
        env = WorkerEnv.from_environ(runpod_env(
            VENDOR_POD_ID="vw", VENDOR_AI_API_KEY="vk",
            VENDOR_WEBHOOK_GET_JOB="http://other/v2/e/job-take/$ID?gpu=x"))
        self.assertEqual(env.worker_id, "vw")
        self.assertEqual(env.api_key, "vk")
        self.assertEqual(env.job_take_url(False), "http://other/v2/e/job-take/vw?gpu=x&job_in_progress=0")

    def test_local_mode_without_take_url(self):
        env = WorkerEnv.from_environ({})
        self.assertFalse(env.is_production)
        self.assertFalse(env.ping_enabled)
        self.assertEqual(env.report_worker_id, "unknown")
        self.assertTrue(env.worker_id)  # a random id still exists

    def test_ping_needs_key_and_pod_id(self):
        self.assertFalse(WorkerEnv.from_environ(runpod_env(RUNPOD_AI_API_KEY="")).ping_enabled)
        env = runpod_env()
        del env["RUNPOD_POD_ID"]
        self.assertFalse(WorkerEnv.from_environ(env).ping_enabled)

    def test_ping_interval_parsing(self):
        self.assertEqual(WorkerEnv.from_environ({}).ping_interval, 10.0)
        self.assertEqual(WorkerEnv.from_environ({"RUNPOD_PING_INTERVAL": "abc"}).ping_interval, 10.0)
        self.assertEqual(WorkerEnv.from_environ({"VENDOR_PING_INTERVAL": "0"}).ping_interval, 0.1)
        self.assertEqual(WorkerEnv.from_environ({"VENDOR_PING_INTERVAL": "2500"}).ping_interval, 2.5)


class UrlTest(unittest.TestCase):
    def setUp(self):
        self.env = WorkerEnv.from_environ(runpod_env())

    def test_job_take(self):
        self.assertEqual(self.env.job_take_url(False), f"{BASE}/job-take/pod7?gpu=NVIDIA+A40&job_in_progress=0")
        self.assertEqual(self.env.job_take_url(True), f"{BASE}/job-take/pod7?gpu=NVIDIA+A40&job_in_progress=1")

    def test_job_take_batch(self):
        self.assertEqual(
            self.env.job_take_batch_url(4, True),
            f"{BASE}/job-take-batch/pod7?gpu=NVIDIA+A40&batch_size=4&job_in_progress=1")

    def test_job_stop(self):
        self.assertEqual(self.env.job_stop_url(), f"{BASE}/job-stop/pod7?gpu=NVIDIA+A40")
        odd = WorkerEnv.from_environ({"VENDOR_WEBHOOK_GET_JOB": "http://h/get?w=$ID"})
        self.assertIsNone(odd.job_stop_url())

    def test_job_done_and_stream(self):
        self.assertEqual(self.env.job_done_url("j-1"), f"{BASE}/job-done/pod7/j-1?gpu=NVIDIA+A40&isStream=false")
        self.assertEqual(self.env.job_done_url("j-1", True), f"{BASE}/job-done/pod7/j-1?gpu=NVIDIA+A40&isStream=true")
        self.assertEqual(self.env.job_stream_url("j-1"), f"{BASE}/job-stream/pod7/j-1?gpu=NVIDIA+A40&isStream=false")

    def test_worker_id_already_in_template(self):
        env = WorkerEnv.from_environ({
            "VENDOR_POD_ID": "w9",
            "VENDOR_WEBHOOK_POST_OUTPUT": "http://h/v2/e/job-done/w9/$ID?gpu=cpu",
            "VENDOR_WEBHOOK_GET_JOB": "http://h/v2/e/job-take/$ID?gpu=cpu",
        })
        self.assertEqual(env.job_done_url("abc"), "http://h/v2/e/job-done/w9/abc?gpu=cpu&isStream=false")

    def test_vendor_pod_id_placeholder(self):
        env = WorkerEnv.from_environ({
            "VENDOR_POD_ID": "w9",
            "VENDOR_WEBHOOK_POST_OUTPUT": "http://h/v2/e/job-done/$VENDOR_POD_ID/$ID?gpu=cpu",
            "VENDOR_WEBHOOK_PING": "http://h/v2/e/ping/$VENDOR_POD_ID?gpu=cpu",
        })
        self.assertEqual(env.job_done_url("abc"), "http://h/v2/e/job-done/w9/abc?gpu=cpu&isStream=false")
        self.assertEqual(env.ping_url(), "http://h/v2/e/ping/w9?gpu=cpu")

    def test_job_id_is_url_quoted(self):
        self.assertEqual(self.env.job_done_url("a b/c"), f"{BASE}/job-done/pod7/a%20b%2Fc?gpu=NVIDIA+A40&isStream=false")

    def test_ping(self):
        self.assertEqual(self.env.ping_url(), f"{BASE}/ping/pod7?gpu=NVIDIA+A40")
        self.assertEqual(self.env.ping_url(["a", "b"]), f"{BASE}/ping/pod7?gpu=NVIDIA+A40&job_id=a,b")
        self.assertEqual(self.env.ping_url([], "0.1.0"), f"{BASE}/ping/pod7?gpu=NVIDIA+A40&vendor_flash_version=0.1.0")

    def test_append_query_without_query(self):
        self.assertEqual(append_query("http://h/x", [("a", "1"), ("b", "2")]), "http://h/x?a=1&b=2")
        self.assertEqual(append_query("http://h/x?q=0", [("a", "1")]), "http://h/x?q=0&a=1")


if __name__ == "__main__":
    unittest.main()
