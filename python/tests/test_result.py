"""Result normalisation, error format and generator aggregation (runpod-python's rules)."""

import json
import unittest

from vendor_flash.serverless import result as r


class NormalizeTest(unittest.TestCase):
    def test_dict_output(self):
        self.assertEqual(r.normalize_output({"a": 1}), {"output": {"a": 1}})

    def test_error_only(self):
        self.assertEqual(r.normalize_output({"error": "x"}), {"error": "x"})

    def test_error_with_output(self):
        self.assertEqual(r.normalize_output({"error": "x", "a": 1}), {"output": {"a": 1}, "error": "x"})

    def test_falsy_error_is_dropped(self):
        self.assertEqual(r.normalize_output({"error": "", "a": 1}), {"output": {"a": 1}})
        self.assertEqual(r.normalize_output({"error": None}), {})

    def test_refresh_worker(self):
        self.assertEqual(r.normalize_output({"refresh_worker": True, "a": 1}), {"output": {"a": 1}, "stopPod": True})
        self.assertEqual(r.normalize_output({"refresh_worker": True}), {"stopPod": True})
        self.assertEqual(r.normalize_output({"refresh_worker": False, "a": 1}), {"output": {"a": 1}})

    def test_empty_dict_drops_output(self):
        self.assertEqual(r.normalize_output({}), {})

    def test_non_dict_values_are_wrapped(self):
        for value in (True, False, 0, 1.5, "s", [1, 2], [], None):
            self.assertEqual(r.normalize_output(value), {"output": value})

    def test_handler_dict_not_mutated(self):
        out = {"error": "x", "a": 1}
        r.normalize_output(out)
        self.assertEqual(out, {"error": "x", "a": 1})

    def test_dict_error_kept_as_is(self):
        self.assertEqual(r.normalize_output({"error": {"code": 1}}), {"error": {"code": 1}})


class ErrorFormatTest(unittest.TestCase):
    def _raise(self):
        try:
            raise ValueError("boom")
        except ValueError as exc:
            return exc

    def test_exception_result_is_a_json_string(self):
        body = r.exception_result(self._raise(), worker_id="w1", hostname="h1")
        self.assertEqual(list(body), ["error"])
        self.assertIsInstance(body["error"], str)
        info = json.loads(body["error"])
        self.assertEqual(info["error_type"], "<class 'ValueError'>")
        self.assertEqual(info["error_message"], "boom")
        self.assertIn("Traceback (most recent call last)", info["error_traceback"])
        self.assertIn("ValueError: boom", info["error_traceback"])
        self.assertEqual(info["hostname"], "h1")
        self.assertEqual(info["worker_id"], "w1")
        self.assertTrue(info["runpod_version"].startswith("vendor-flash/"))
        self.assertIn("vendor_flash_version", info)

    def test_runpod_keys_present(self):
        info = r.error_info(self._raise())
        for key in ("error_type", "error_message", "error_traceback", "hostname", "worker_id", "runpod_version"):
            self.assertIn(key, info)
        self.assertEqual(info["hostname"], "unknown")
        self.assertEqual(info["worker_id"], "unknown")

    def test_generator_exception_format(self):
        body = r.generator_exception_result(self._raise())
        self.assertTrue(body["error"].startswith("handler: boom \ntraceback: Traceback"))


class StreamTest(unittest.TestCase):
    def test_aggregate(self):
        self.assertEqual(r.stream_final_result([1, {"a": 2}], True), {"output": [1, {"a": 2}]})

    def test_no_aggregate_gives_empty_list(self):
        self.assertEqual(r.stream_final_result([1, 2], False), {"output": []})

    def test_chunk_error(self):
        self.assertEqual(r.chunk_error({"error": "bad"}), {"error": "bad"})
        self.assertEqual(r.chunk_error({"error": 3}), {"error": "3"})
        self.assertIsNone(r.chunk_error({"error": ""}))
        self.assertIsNone(r.chunk_error("error"))


class EncodeTest(unittest.TestCase):
    def test_utf8_not_ascii_escaped(self):
        self.assertEqual(r.encode_body({"output": "é"}), '{"output": "é"}'.encode("utf-8"))

    def test_lone_surrogate_sent_as_json_escape(self):
        data = r.encode_body({"output": "é \ud83d"})
        self.assertEqual(data, b'{"output": "\\u00e9 \\ud83d"}')
        self.assertEqual(json.loads(data), {"output": "é \ud83d"})

    def test_refuses_nan_and_objects(self):
        with self.assertRaises(ValueError):
            r.encode_body({"output": float("nan")})
        with self.assertRaises(TypeError):
            r.encode_body({"output": object()})

    def test_refuses_nesting_too_deep_with_value_error(self):
        nested = []
        for _ in range(100_000):  # past the encoder's limit on every Python from 3.10
            nested = [nested]
        with self.assertRaisesRegex(ValueError, "nested too deeply"):
            r.encode_body({"output": nested})

    def test_unencodable_result(self):
        try:
            r.encode_body({"output": object()})
        except TypeError as exc:
            body = r.unencodable_result(exc)
        info = json.loads(body["error"])
        self.assertIn("not JSON serialisable", info["error_message"])


class ErrorSummaryTest(unittest.TestCase):
    """The error of a failed job's log line: one line, no traceback, its type when it has one."""

    def test_handler_exception(self):
        self.assertEqual(r.error_summary(r.exception_result(ValueError("bad\n  value"))["error"]),
                         "ValueError: bad value")
        self.assertEqual(r.error_summary(r.exception_result(ValueError())["error"]), "ValueError")
        self.assertEqual(r.error_summary(r.exception_result(unittest.SkipTest("x"))["error"]),
                         "unittest.case.SkipTest: x")

    def test_exit(self):
        body = r.exit_result(SystemExit(3))
        self.assertEqual(r.error_summary(body["error"]),
                         "SystemExit(3): the handler called sys.exit(3); the job failed and the worker exits "
                         "with status 3")

    def test_generator_exception(self):
        self.assertEqual(r.error_summary(r.generator_exception_result(RuntimeError("boom"))["error"]), "boom")

    def test_returned_errors_as_they_are(self):
        self.assertEqual(r.error_summary("quota exceeded"), "quota exceeded")
        self.assertEqual(r.error_summary({"code": 7, "why": "x"}), '{"code": 7, "why": "x"}')
        self.assertEqual(r.error_summary('{"error_type": 1}'), '{"error_type": 1}')

    def test_long_errors_are_cut(self):
        self.assertEqual(r.error_summary("x" * 1000), "x" * (r.ERROR_SUMMARY_CHARS - 1) + "…")


if __name__ == "__main__":
    unittest.main()
