"""Local one-shot mode: run the handler once on a test input and exit 0 (success) or 1 (error).

Used when no job-take URL is configured, or when ``--test_input`` is given, like runpod-python.
The job comes from ``--test_input '<json>'`` or ``./test_input.json`` and must hold ``input``;
``id`` defaults to ``"local_test"``. A generator's yields are collected into a list. The result
is encoded as the worker encodes it (strict JSON, :func:`.result.encode_body`): one the worker
would fail as not JSON-serialisable is printed as that error result, and the exit code is 1.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional, Tuple

from . import result as results
from .env import WorkerEnv
from .handler import JobRun, LoopThread
from .log import get_logger, job_extra
from .progress import set_local_only
from .utils import rp_debugger

#: runpod-python's words when there is no job to run (logged at WARN).
NO_TEST_INPUT = "test_input.json not found, exiting."


def load_test_job(test_input: Optional[str], cwd: str = ".") -> Tuple[Optional[Dict[str, Any]], str]:
    """Return ``(job, problem)``: the job to run, or ``None`` and why it cannot run."""
    if test_input is not None:
        source = "--test_input"
        text = test_input
    else:
        path = os.path.join(cwd, "test_input.json")
        if not os.path.exists(path):
            return None, NO_TEST_INPUT
        source = path
        with open(path, "r", encoding="utf-8") as fh:
            text = fh.read()
    try:
        job = json.loads(text)
    except ValueError as exc:
        return None, f"{source} is not valid JSON: {exc}"
    if not isinstance(job, dict) or job.get("input") is None:
        return None, "Job has no input parameter. Unable to run."
    job.setdefault("id", "local_test")
    return job, ""


def run_local(config: Dict[str, Any], test_input: Optional[str], env: Optional[WorkerEnv] = None) -> int:
    """Run the handler once and return the exit code (0 ok, 1 error).

    A handler that raises SystemExit (or KeyboardInterrupt) gets its error result printed, then
    SystemExit is raised again with the handler's code (130 for KeyboardInterrupt).
    """
    log = get_logger()
    env = env or WorkerEnv.from_environ()
    # runpod-python's rp_local lines, word for word and at its levels
    if test_input is not None:
        log.info("test_input set, using test_input as job input.")
    elif os.path.exists("test_input.json"):
        log.info("Using test_input.json as job input.")
    job, problem = load_test_job(test_input)
    if job is None:
        if problem == NO_TEST_INPUT:
            log.warning(problem)
        else:
            log.error(problem)
        return 1
    job_id = str(job["id"])
    log.debug("Retrieved local job: %s", job)
    log.info("Started.", extra=job_extra(job_id))
    set_local_only()
    loop = LoopThread()
    try:
        run = JobRun(config["handler"], job, loop, aggregate_stream=True,
                     worker_id=env.report_worker_id, hostname=env.hostname)
        result = run.run()
    finally:
        loop.stop()
    rp_args = config.get("rp_args") or {}
    if rp_args.get("rp_debugger"):
        rp_debugger.attach_debugger_output(result, rp_args.get("ready_delay_ms"))
    try:
        # the worker's strict encoding: what it would fail (a datetime, a set, bytes, NaN,
        # Infinity...) fails here too, with the same error, instead of printing as a string
        text = results.encode_body(result).decode("utf-8")
    except (TypeError, ValueError) as exc:
        log.error("result is not JSON serialisable: %s", exc, extra=job_extra(job_id))
        replacement = results.unencodable_result(exc, env.report_worker_id, env.hostname)
        if result.get("stopPod"):
            replacement["stopPod"] = True
        result = replacement
        text = results.encode_body(result).decode("utf-8")
    if result.get("error"):
        log.error("Job %s failed with error: %s", job_id, result["error"])
        print(text)
        if run.exit_exception is not None:
            # the handler called sys.exit(): end the process with its code, as it would have
            raise SystemExit(results.process_exit_code(run.exit_exception))
        return 1
    log.info("Job %s completed successfully.", job_id)
    log.info("Local testing complete, exiting.")
    print(text)
    return 0
