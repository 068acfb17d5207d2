"""Handlers for the --rp_serve_api tests: ``serve_handlers.py <mode> --rp_serve_api ...``."""

import asyncio
import sys
import threading
import time

from vendor_flash import serverless


def sync(job):
    if job["input"].get("fail"):
        raise RuntimeError("sync failure")
    if job["input"].get("error"):
        return {"error": job["input"]["error"], "kept": 1}
    if job["input"].get("none"):
        return None
    if job["input"].get("exit"):
        sys.exit(3)
    if job["input"].get("sleep"):
        time.sleep(job["input"]["sleep"])
    return {"id": job["id"], "input": job["input"], "main_thread": threading.current_thread() is threading.main_thread()}


async def async_handler(job):
    await asyncio.sleep(0.01)
    if job["input"].get("fail"):
        raise ValueError("async failure")
    return {"async": job["input"]}


def gen(job):
    if "echo" in job["input"]:
        yield job["input"]["echo"]
    for i in range(job["input"].get("n", 3)):
        yield {"i": i}
    if job["input"].get("fail"):
        raise RuntimeError("generator failure")


async def agen(job):
    for i in range(job["input"].get("n", 2)):
        await asyncio.sleep(0.01)
        yield f"tok{i}"


mode = sys.argv.pop(1)
config = {"handler": {"sync": sync, "async": async_handler, "gen": gen, "agen": agen}[mode]}
if mode == "agen":
    config["return_aggregate_stream"] = True
status = serverless.start(config)
print(f"start() returned {status}", flush=True)
