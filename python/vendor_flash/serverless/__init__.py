"""Serverless worker API, compatible with ``runpod.serverless``.

>>> from vendor_flash import serverless
>>> def handler(job):
...     return {"echo": job["input"]}
>>> serverless.start({"handler": handler})  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

from . import modules, utils
from .env import WorkerEnv
from .handler import handler_kind
from .log import setup as _setup_logging
from .modules.rp_logger import RunPodLogger
from .progress import progress_update
from .result import process_exit_code
from .worker import Worker

_IMPORTED_AT = time.perf_counter()  # --rp_debugger's ready_delay_ms counts from here to start()

__all__ = ["start", "progress_update", "WorkerEnv", "Worker", "RunPodLogger", "utils", "modules"]


def _parse_args(argv: List[str]) -> Tuple[argparse.Namespace, List[str]]:
    """The SDK's own flags, and the arguments that are not its own.

    ``-h``/``--help`` prints them and exits 0, as runpod-python's parser does (it is argparse's
    default there), instead of running the handler on ./test_input.json or starting a worker.
    """
    parser = argparse.ArgumentParser(
        description="vendor-flash serverless worker arguments (runpod-python's). With a job-take URL "
                    "in the environment (VENDOR_WEBHOOK_GET_JOB or RUNPOD_WEBHOOK_GET_JOB) the handler "
                    "serves a flashd endpoint; without one, or with --test_input, it runs once on "
                    "--test_input or ./test_input.json; with --rp_serve_api it serves the local test API.")
    parser.add_argument("--test_input", default=None, metavar="JSON",
                        help='run the handler once on this job, e.g. \'{"input": {...}}\', and exit 0 or 1')
    parser.add_argument("--rp_log_level", "--log_level", dest="log_level", default=None, metavar="LEVEL",
                        help="DEBUG, TRACE, INFO (default), WARN, ERROR or NOTSET")
    parser.add_argument("--rp_serve_api", action="store_true",
                        help="serve the local test API (/runsync, /run, /status, /stream; no authentication)")
    parser.add_argument("--rp_debugger", action="store_true",
                        help="add rp_debugger timings to each dict output")
    # --rp_serve_api's settings, with runpod-python's types and defaults (serve_api.py)
    parser.add_argument("--rp_api_port", type=int, default=8000, metavar="PORT",
                        help="the local test API's port (default 8000, flashd's default port too)")
    parser.add_argument("--rp_api_concurrency", type=int, default=1, metavar="N",
                        help="jobs the local test API runs at once (default 1)")
    parser.add_argument("--rp_api_host", default="localhost", metavar="HOST",
                        help="address the local test API listens on (default localhost)")
    return parser.parse_known_args(argv)


def _line_buffer_stdout() -> None:
    """Write the handler's ``print()`` lines out at each newline.

    A worker's stdout is a pipe (flashd's process runtime, a container), which Python
    block-buffers: a line printed during a long job stayed in the buffer until the job ended
    (or 8 KiB piled up), so ``/logs`` and ``?follow=true`` showed nothing meanwhile.
    """
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is None or getattr(sys.stdout, "line_buffering", True):
        return
    try:
        reconfigure(line_buffering=True)
    except (ValueError, OSError):  # a replaced or closed stdout: leave it as it is
        pass


def start(config: Dict[str, Any], argv: Optional[List[str]] = None) -> Optional[int]:
    """Start the worker with ``config`` (``handler`` required; ``concurrency_modifier``,
    ``return_aggregate_stream``, ``refresh_worker`` optional).

    Production mode when ``VENDOR_WEBHOOK_GET_JOB`` (or ``RUNPOD_WEBHOOK_GET_JOB``) is set and no
    ``--test_input`` is given: serves jobs until SIGTERM/SIGINT or ``refresh_worker``, then
    returns 0. If a handler raised SystemExit (``sys.exit(n)``) or KeyboardInterrupt, its job
    fails, the other jobs finish, and SystemExit is raised again with the handler's code (130
    for KeyboardInterrupt), so the process ends as it would have without the SDK. Otherwise
    local mode: runs the handler once and exits the process (0 or 1, or the handler's
    ``sys.exit`` code).

    With ``--rp_serve_api`` (before either mode, as in runpod-python): serves the local test API
    (:mod:`.serve_api`) on ``--rp_api_host``:``--rp_api_port`` (``localhost:8000``) until
    SIGINT/SIGTERM, then returns 0.
    """
    if not callable(config.get("handler")):
        raise ValueError("start() needs config['handler'], a callable")
    args, rest = _parse_args(sys.argv[1:] if argv is None else argv)
    if argv is None:
        # As runpod-python's start(): the SDK's flags leave sys.argv, so a handler that parses
        # the command line itself (argparse) sees only its own arguments.
        sys.argv = sys.argv[:1] + rest
    log = _setup_logging(args.log_level)
    env = WorkerEnv.from_environ()
    if args.rp_debugger:
        # as runpod-python: config["rp_args"] holds the flag, and every dict output of a job
        # gets the rp_debugger timings (utils.rp_debugger) and the import-to-start delay
        ready_ms = (time.perf_counter() - _IMPORTED_AT) * 1000
        config = dict(config, rp_args=dict(config.get("rp_args") or {}, rp_debugger=True, ready_delay_ms=ready_ms))
    if args.rp_serve_api:
        # as runpod-python: the local test API comes before production and local mode
        from .serve_api import serve

        status = serve(config, env, args.rp_api_host, args.rp_api_port, args.rp_api_concurrency)
        if status:
            raise SystemExit(status)
        return status
    if args.test_input is None and env.is_production:
        if not env.post_output:
            # runpod-python would post to the literal "JOB_DONE_URL" and drop every result.
            log.error("VENDOR_WEBHOOK_POST_OUTPUT (or RUNPOD_WEBHOOK_POST_OUTPUT) is not set, so no "
                      "result could be posted: set it too (`flashd worker-env` prints every variable "
                      "a worker needs)")
            sys.exit(2)
        if not env.post_stream and handler_kind(config["handler"]).is_stream:
            # every yield would go to the literal "JOB_STREAM_URL" and each job fail with
            # "handler: unsupported URL scheme: ''", which blames the handler
            log.error("VENDOR_WEBHOOK_POST_STREAM (or RUNPOD_WEBHOOK_POST_STREAM) is not set, so a "
                      "generator handler could post none of its yields: set it too (`flashd "
                      "worker-env` prints every variable a worker needs)")
            sys.exit(2)
        _line_buffer_stdout()
        worker = Worker(config, env)
        status = worker.run()
        if worker.exit_exception is not None:
            raise SystemExit(process_exit_code(worker.exit_exception))
        return status
    from .local import run_local

    sys.exit(run_local(config, args.test_input, env))
