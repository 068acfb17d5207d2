"""Handlers used by the integration tests: ``handlers.py <mode> [flags]``.

It imports the SDK the way existing RunPod workers import ``runpod``.
"""

import asyncio
import decimal
import os
import signal
import sys
import time

import vendor_flash as runpod

MODE = sys.argv[1]
decimal.getcontext().prec = 50  # thread-local state set at import, as handlers do
FLAGS = set(sys.argv[2:])


def wait_for_file(path, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)


def sync_handler(job):
    """Echo, with behaviours picked by the input."""
    inp = job["input"]
    if inp.get("raise"):
        raise ValueError(inp["raise"])
    if "exit" in inp:
        sys.exit(inp["exit"])
    if "big" in inp:
        return {"data": "x" * inp["big"]}
    if "deep" in inp:  # nested deeper than Python's JSON encoder goes
        nested = []
        for _ in range(inp["deep"]):
            nested = [nested]
        if inp.get("as_progress"):
            runpod.serverless.progress_update(job, nested)
            return {"after_progress": True}
        return {"nested": nested}
    if "progress" in inp:
        runpod.serverless.progress_update(job, inp["progress"])
        wait_for_file(inp["gate"])
        return {"done": True}
    if "hold_gil" in inp:  # a C call that keeps the GIL: every thread of this process stops
        import ctypes

        ctypes.PyDLL(None).sleep(inp["hold_gil"])
    if "fork" in inp:  # a child that shares the worker's descriptors (a fork-started pool)
        if os.fork() == 0:
            time.sleep(inp["fork"])
            os._exit(0)
    if "alarm" in inp:  # signal.signal() only works on the main thread, where runpod runs sync handlers
        def on_alarm(signum, frame):
            raise TimeoutError("alarm")

        previous = signal.signal(signal.SIGALRM, on_alarm)
        try:
            signal.setitimer(signal.ITIMER_REAL, inp["alarm"])
            try:
                time.sleep(10)
            except TimeoutError:
                return {"alarm": "fired", "prec": decimal.getcontext().prec}
            return {"alarm": "not fired"}
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    if "print" in inp:
        print(inp["print"])
        wait_for_file(inp["gate"])
    if "sleep" in inp:
        time.sleep(inp["sleep"])
    if "return" in inp:
        return inp["return"]
    return {"echo": inp}


RUNNING = {"now": 0}


async def async_handler(job):
    inp = job["input"]
    RUNNING["now"] += 1
    peak = RUNNING["now"]
    try:
        if "raise" in inp:
            raise ValueError(inp["raise"])
        if "wait" in inp:
            end = time.monotonic() + inp["wait"]
            while time.monotonic() < end:
                await asyncio.sleep(0.05)
                peak = max(peak, RUNNING["now"])
        if "forever" in inp:
            try:
                if "started" in inp:  # the handler is running: a stop from now on reaches its await
                    with open(inp["started"], "w") as fh:
                        fh.write("started")
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                with open(inp["forever"], "w") as fh:
                    fh.write("cancelled")
                raise
        return {"peak": peak, "id": job["id"]}
    finally:
        RUNNING["now"] -= 1


def gen_handler(job):
    if "prec" in job["input"]:  # the decimal context set at import (main thread only)
        yield decimal.getcontext().prec
    if "echo" in job["input"]:  # a string as the client sent it, lone surrogates (\ud83d) included
        yield job["input"]["echo"]
    for i in range(job["input"].get("n", 3)):
        if i == 1 and "big" in job["input"]:
            yield "x" * job["input"]["big"]
        if i == 1 and "raise" in job["input"]:
            raise ValueError(job["input"]["raise"])
        yield {"chunk": i}


async def agen_handler(job):
    for i in range(job["input"].get("n", 3)):
        await asyncio.sleep(0.01)
        if i == 1 and "raise" in job["input"]:
            raise ValueError(job["input"]["raise"])
        yield f"token-{i}"


@runpod.serverless.utils.rp_debugger.FunctionTimer
def timed_handler(job):
    with runpod.serverless.utils.rp_debugger.LineTimer("step"):
        if job["input"].get("list"):
            return [1]
        return {"done": True}


HANDLERS = {"timed": timed_handler, "sync": sync_handler, "async": async_handler, "gen": gen_handler, "agen": agen_handler}

config = {"handler": HANDLERS[MODE]}
if "aggregate" in FLAGS:
    config["return_aggregate_stream"] = True
if "refresh" in FLAGS:
    config["refresh_worker"] = True
if "concurrency4" in FLAGS:
    config["concurrency_modifier"] = lambda current: 4
if "modifier_raises" in FLAGS:  # a concurrency_modifier that always raises
    def failing_modifier(current):
        raise RuntimeError("no GPU memory figure")

    config["concurrency_modifier"] = failing_modifier

runpod.serverless.start(config)
