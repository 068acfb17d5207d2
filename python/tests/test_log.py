"""Log lines with a lone surrogate (a str decoded with errors='surrogateescape', a client's
string cut inside an emoji echoed into a log): written, with the surrogate replaced, not lost
to a UnicodeEncodeError ("--- Logging error ---" on stderr) or, worse, killing the worker."""

import json
import os
import subprocess
import sys
import unittest

PYTHON_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))

CODE = r"""
import os
from vendor_flash.serverless.log import get_logger, job_extra, setup
from vendor_flash.serverless.modules.rp_logger import RunPodLogger
setup()
name = os.fsdecode(b"model-\xff.bin")  # a file name read with surrogateescape: "model-\udcff.bin"
RunPodLogger().info("loading " + name, "job-1")
get_logger().warning("client sent %s", "cut \ud83d emoji", extra=job_extra("job-2"))
RunPodLogger().info("still here: caf\u00e9 \U0001F600")
"""


def run(fmt, locale):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LC_", "PYTHONIO"))}
    env.update(PYTHONPATH=PYTHON_DIR, VENDOR_LOG_FORMAT=fmt, LC_ALL=locale, LANG=locale)
    return subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, timeout=60)


class LoneSurrogateLogTest(unittest.TestCase):
    def test_json_lines_keep_the_surrogate_as_an_escape(self):
        for locale in ("C.UTF-8", "C"):
            with self.subTest(locale=locale):
                r = run("json", locale)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertNotIn(b"Logging error", r.stderr)
                text = r.stdout.decode("utf-8")  # strict: valid UTF-8, every line
                lines = [json.loads(line) for line in text.splitlines()]
                self.assertEqual([line["message"] for line in lines],
                                 ["loading model-\udcff.bin", "client sent cut \ud83d emoji", "still here: caf\u00e9 \U0001F600"],
                                 "each line written; the JSON parser gives the surrogate back")
                self.assertEqual([line["requestId"] for line in lines], ["job-1", "job-2", None])
                self.assertIn("caf\u00e9 \U0001F600", text, "other text stays as it is, not \\u-escaped")

    def test_text_lines_show_the_replacement_character(self):
        for locale in ("C.UTF-8", "C"):
            with self.subTest(locale=locale):
                r = run("text", locale)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertNotIn(b"Logging error", r.stderr)
                self.assertEqual(r.stdout.decode("utf-8").splitlines(), [
                    "INFO   | job-1 | loading model-\ufffd.bin",
                    "WARN   | job-2 | client sent cut \ufffd emoji",
                    "INFO   | still here: caf\u00e9 \U0001F600",
                ])


if __name__ == "__main__":
    unittest.main()
