"""Handlers for the local-mode tests: ``local_handlers.py <mode> [--test_input ...]``."""

import datetime
import decimal
import sys

from vendor_flash import serverless
from vendor_flash.serverless.utils import rp_debugger


def echo(job):
    return {"id": job["id"], "input": job["input"]}


def fail(job):
    raise RuntimeError("local failure")


def gen(job):
    yield "a"
    yield "b"


def error_key(job):
    return {"error": "declared error"}


def exit3(job):
    sys.exit(3)


def progress(job):
    serverless.progress_update(job, {"step": 1})
    return {"done": True}


def argv(job):
    return {"argv": sys.argv[1:]}


def unencodable(job):
    # values json.dumps(default=str) would print as strings (or NaN/Infinity) but the worker fails
    return {"datetime": {"when": datetime.datetime(2024, 1, 1)}, "inf": {"x": float("inf")},
            "nan": float("nan"), "set": {1}, "bytes": b"x", "decimal": decimal.Decimal("1.5")}[job["input"]["kind"]]


@rp_debugger.FunctionTimer
def timed(job):
    with rp_debugger.LineTimer("step"):
        return {"done": True}


mode = sys.argv.pop(1)
serverless.start({"handler": {"echo": echo, "fail": fail, "gen": gen, "error_key": error_key, "exit": exit3, "timed": timed, "argv": argv, "progress": progress, "unencodable": unencodable}[mode]})
print("start() returned", flush=True)  # never reached: local mode exits
