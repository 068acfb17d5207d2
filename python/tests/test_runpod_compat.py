"""runpod-python names provided by install_runpod_alias(): rp_validator.validate and RunPodLogger."""

import io
import json
import logging
import os
import subprocess
import sys
import unittest

from flashd_harness import PYTHON_DIR
from vendor_flash.serverless.log import get_logger
from vendor_flash.serverless.modules.rp_logger import LOG_LEVELS, RunPodLogger
from vendor_flash.serverless.utils.rp_validator import validate

SCHEMA = {
    "text": {"type": str, "required": True},
    "max_length": {"type": int, "required": False, "default": 100, "constraints": lambda x: x > 0},
    "temperature": {"type": float, "required": False, "default": 0.7},
    "stop": {"type": list},
}


class ValidateTest(unittest.TestCase):
    def test_valid_input_gets_defaults(self):
        self.assertEqual(validate({"text": "hi"}, SCHEMA),
                         {"validated_input": {"text": "hi", "max_length": 100, "temperature": 0.7, "stop": None}})

    def test_given_values_are_kept(self):
        out = validate({"text": "hi", "max_length": 5, "stop": ["\n"]}, SCHEMA)
        self.assertEqual(out["validated_input"]["max_length"], 5)
        self.assertEqual(out["validated_input"]["stop"], ["\n"])

    def test_int_is_accepted_for_float(self):
        out = validate({"text": "hi", "temperature": 1}, SCHEMA)
        self.assertEqual(out["validated_input"]["temperature"], 1.0)
        self.assertIsInstance(out["validated_input"]["temperature"], float)

    def test_missing_required(self):
        out = validate({}, SCHEMA)
        self.assertEqual(out, {"errors": ["text is a required input."]})

    def test_unknown_key(self):
        out = validate({"text": "hi", "colour": "red"}, SCHEMA)
        self.assertEqual(list(out), ["errors"])
        self.assertIn("colour", out["errors"][0])

    def test_wrong_type(self):
        out = validate({"text": 3, "max_length": "5"}, SCHEMA)
        self.assertEqual(len(out["errors"]), 2)
        self.assertIn("text should be str", out["errors"][0])
        self.assertIn("max_length should be int", out["errors"][1])

    def test_bool_is_not_a_number(self):
        self.assertIn("errors", validate({"text": "a", "max_length": True}, SCHEMA))
        self.assertIn("errors", validate({"text": "a", "temperature": False}, SCHEMA))

    def test_null_passes_the_type_check(self):
        # runpod-python: `if validated_input[key] is not None and not is_instance` is the type error.
        out = validate({"text": "hi", "stop": None}, SCHEMA)
        self.assertEqual(out["validated_input"]["stop"], None)

    def test_constraints(self):
        out = validate({"text": "hi", "max_length": 0}, SCHEMA)
        self.assertEqual(out, {"errors": ["max_length does not meet the constraints."]})

    def test_constraint_that_raises_is_an_error(self):
        out = validate({"n": 1}, {"n": {"type": int, "constraints": lambda v: v / 0}})
        self.assertIn("ZeroDivisionError", out["errors"][0])

    def test_every_problem_is_listed(self):
        out = validate({"max_length": -1, "x": 1}, SCHEMA)
        self.assertEqual(len(out["errors"]), 3)

    def test_tuple_of_types(self):
        schema = {"v": {"type": (int, str), "required": True}}
        self.assertEqual(validate({"v": "a"}, schema), {"validated_input": {"v": "a"}})
        self.assertIn("errors", validate({"v": 1.5}, schema))


class RunPodLoggerTest(unittest.TestCase):
    def setUp(self):
        logger = get_logger()
        self.stream = io.StringIO()
        self.handler = logging.StreamHandler(self.stream)
        self.handler.setFormatter(logging.Formatter("%(levelname)s|%(job_id)s|%(message)s"))
        saved = (list(logger.handlers), logger.level, getattr(logger, "_vendor_flash_configured", False))
        logger.handlers = [self.handler]
        logger._vendor_flash_configured = True
        logger.setLevel(logging.INFO)
        RunPodLogger._level = None

        def restore():
            logger.handlers, level, logger._vendor_flash_configured = saved
            logger.setLevel(level)
            RunPodLogger._level = None
        self.addCleanup(restore)

    def lines(self):
        return self.stream.getvalue().splitlines()

    def test_levels_and_request_id(self):
        log = RunPodLogger()
        log.debug("hidden")
        log.info("hello 100%")
        log.warn("careful", request_id="job-1")
        log.error("broken")
        log.log("custom", "ERROR")
        self.assertEqual(self.lines(), ["INFO|None|hello 100%", "WARNING|job-1|careful", "ERROR|None|broken",
                                        "ERROR|None|custom"])

    def test_set_level(self):
        log = RunPodLogger()
        log.set_level("DEBUG")
        log.debug("shown", request_id="j")
        log.set_level("ERROR")
        log.warn("hidden")
        self.assertEqual(self.lines(), ["DEBUG|j|shown"])

    def test_one_instance_so_a_level_set_anywhere_applies_everywhere(self):
        first, second = RunPodLogger(), RunPodLogger()
        self.assertIs(first, second)
        first.set_level("ERROR")
        second.info("hidden")
        get_logger().info("an SDK line, hidden too")
        second.error("shown")
        self.assertEqual(self.lines(), ["ERROR|None|shown"])

    def test_trace_notset_and_numeric_levels_as_runpod(self):
        log = RunPodLogger()
        log.trace("hidden at INFO")
        log.set_level("TRACE")
        log.debug("hidden at TRACE")
        log.trace("traced", request_id="j")
        log.set_level(1)  # an index into LOG_LEVELS: DEBUG
        log.debug("debug by index")
        log.set_level("NOTSET")  # runpod-python: nothing at all
        log.error("hidden at NOTSET")
        self.assertEqual(self.lines(), ["TRACE|j|traced", "DEBUG|None|debug by index"])
        with self.assertRaises(ValueError):
            log.set_level("LOUD")
        self.assertEqual(LOG_LEVELS, ["NOTSET", "DEBUG", "TRACE", "INFO", "WARN", "ERROR"])

    def test_secret_is_masked(self):
        RunPodLogger().secret("API_KEY", "abcdef")
        self.assertEqual(self.lines(), ["INFO|None|API_KEY: a****f"])


class AliasModulesTest(unittest.TestCase):
    def run_code(self, code, **env):
        environ = {k: v for k, v in os.environ.items() if not k.startswith(("RUNPOD_", "VENDOR_"))}
        environ.update(PYTHONPATH=PYTHON_DIR, **env)
        return subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True, timeout=30)

    def test_runpod_imports_resolve(self):
        code = "\n".join([
            "import vendor_flash; vendor_flash.install_runpod_alias()",
            "import runpod",
            "from runpod import RunPodLogger",
            "from runpod.serverless.utils.rp_validator import validate",
            "from runpod.serverless.utils import validate as v2",
            "from runpod.serverless.modules.rp_logger import RunPodLogger as L2",
            "import runpod.serverless.utils.rp_validator as mod",
            "print(RunPodLogger is L2, validate is v2, mod.validate is validate, runpod.serverless.start is not None)",
            "print(validate({'a': 1}, {'a': {'type': int, 'required': True}}))",
        ])
        out = self.run_code(code)
        self.assertEqual(out.stdout.splitlines(), ["True True True True", "{'validated_input': {'a': 1}}"], out.stderr)

    def test_logger_writes_sdk_lines_to_stdout(self):
        code = ("import vendor_flash; vendor_flash.install_runpod_alias()\n"
                "from runpod import RunPodLogger\n"
                "log = RunPodLogger()\n"
                "log.info('text line', request_id='j1')\n"
                "log.warn('careful')\n"
                "log.debug('not at INFO')\n")
        out = self.run_code(code, VENDOR_LOG_FORMAT="text")
        # runpod-python's text lines: the level padded to 7, WARN rather than WARNING.
        self.assertEqual(out.stdout.splitlines(), ["INFO   | j1 | text line", "WARN   | careful"], out.stderr)
        out = self.run_code(code, RUNPOD_ENDPOINT_ID="ep")
        self.assertEqual([json.loads(line) for line in out.stdout.splitlines()],
                         [{"requestId": "j1", "message": "text line", "level": "INFO"},
                          {"requestId": None, "message": "careful", "level": "WARN"}], out.stderr)


if __name__ == "__main__":
    unittest.main()
