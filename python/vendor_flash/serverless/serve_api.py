"""``--rp_serve_api``: a local test API for trying a handler with curl during development.

It answers the routes of runpod-python's development server (its FastAPI app), with the same
request and response bodies, so scripts written against ``python handler.py --rp_serve_api``
keep working:

* ``POST /runsync`` ``{"input": {...}, "webhook"?: url}``: runs the job now and answers
  ``{"id", "status": "COMPLETED", "output"}`` or ``{"id", "status": "FAILED", "error"}``;
* ``POST /run``: keeps the job and answers ``{"id": "test-<uuid>", "status": "IN_PROGRESS"}``;
  the job runs when its ``/status`` or ``/stream`` is asked, and is then forgotten;
* ``POST /status/{id}``: runs a kept job and answers as ``/runsync``;
* ``POST /stream/{id}``: runs a kept job of a generator handler and answers
  ``{"id", "status": "COMPLETED", "stream": [{"output": chunk}, ...]}``.

Handlers run through :class:`~.handler.JobRun`, as in the worker loop: every handler form,
``return_aggregate_stream``, the result rules of :mod:`.result`, sync code on the main thread.
There is no authentication: it listens on ``localhost`` unless told otherwise.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import threading
import urllib.parse
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional, Tuple

from . import result as results
from .env import WorkerEnv
from .handler import HandlerKind, JobRun, LoopThread, MainThreadRunner, StopSignals, handler_kind
from .log import get_logger, job_extra, shown_url
from .progress import set_local_only
from .utils import rp_debugger
from ..version import __version__


def _json_bytes(payload: Any) -> bytes:
    """``payload`` as UTF-8 JSON; a lone surrogate (``"\\ud83d"``, which UTF-8 cannot hold) as
    JSON's ``\\u`` escape, the whole answer then ASCII-escaped, as the worker posts it to flashd."""
    try:
        return json.dumps(payload, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(payload).encode("ascii")


DEFAULT_HOST = "localhost"
DEFAULT_PORT = 8000
#: Largest request body read (flashd's own /runsync limit).
MAX_BODY = 20 * 1024 * 1024
WEBHOOK_TIMEOUT = 10.0
NOT_FOUND = "Job ID not found"
NOT_A_GENERATOR = "Stream not supported, handler must be a generator."

ROUTES = [
    {"method": "POST", "path": "/runsync", "body": {"input": "object", "webhook": "url (optional)"},
     "returns": "the result: {id, status: COMPLETED, output} or {id, status: FAILED, error}"},
    {"method": "POST", "path": "/run", "body": {"input": "object", "webhook": "url (optional)"},
     "returns": "{id, status: IN_PROGRESS}; the job runs when /status or /stream is asked"},
    {"method": "POST", "path": "/status/{job_id}", "returns": "runs the job, answers as /runsync"},
    {"method": "POST", "path": "/stream/{job_id}",
     "returns": "runs a generator's job: {id, status: COMPLETED, stream: [{output}, ...]}"},
    {"method": "GET", "path": "/health", "returns": "job and worker counts"},
]


class RequestError(Exception):
    """A request the API refuses: answered with ``status`` and ``{"detail": detail}``."""

    def __init__(self, status: int, detail: Any):
        super().__init__(str(detail))
        self.status = status
        self.detail = detail


def _invalid(kind: str, loc: List[Any], msg: str) -> RequestError:
    # FastAPI's 422 shape, which runpod-python's server answers for a body it cannot take
    return RequestError(422, [{"type": kind, "loc": loc, "msg": msg}])


def parse_job_request(raw: bytes) -> Tuple[Any, Optional[str]]:
    """``(input, webhook)`` from a ``/run`` or ``/runsync`` body; raises :class:`RequestError`."""
    try:
        body = json.loads(raw.decode("utf-8")) if raw.strip() else None
    except (UnicodeDecodeError, ValueError) as exc:
        raise _invalid("json_invalid", ["body"], f"JSON decode error: {exc}") from None
    if body is None:
        raise _invalid("missing", ["body"], 'Field required: send a JSON body {"input": {...}}')
    if not isinstance(body, dict):
        raise _invalid("model_attributes_type", ["body"],
                       'Input should be a valid dictionary: send {"input": {...}}')
    if "input" not in body or body["input"] is None:
        raise _invalid("missing", ["body", "input"], 'Field required: send {"input": {...}}')
    if not isinstance(body["input"], dict):
        raise _invalid("dict_type", ["body", "input"], "Input should be a valid dictionary (a JSON object)")
    webhook = body.get("webhook")
    if webhook is not None and not isinstance(webhook, str):
        raise _invalid("string_type", ["body", "webhook"], "Input should be a valid string")
    return body["input"], webhook


def job_answer(job_id: str, body: Dict[str, Any]) -> Dict[str, Any]:
    """The ``/runsync`` and ``/status`` answer for a job-done body (``stopPod`` is left out)."""
    if body.get("error"):
        return {"id": job_id, "status": "FAILED", "error": body["error"]}
    answer: Dict[str, Any] = {"id": job_id, "status": "COMPLETED"}
    if body.get("output") is not None:  # runpod-python's server leaves out a None output
        answer["output"] = body["output"]
    return answer


class WebhookError(ValueError):
    """A webhook URL that cannot be posted to; its message never holds the URL."""


def webhook_request(url: str, data: bytes) -> urllib.request.Request:
    """The POST of ``data`` to a webhook URL; raises :class:`WebhookError` for one that is not
    an http or https URL with a host (as requests, which runpod-python posts with, refuses it).

    User info in the URL (``http://user:password@host/...``) is taken out of it and sent as an
    ``Authorization: Basic`` header, percent-escapes decoded, as requests sends it.
    """
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number or out of range
    except ValueError as exc:
        raise WebhookError(f"not a valid URL ({exc})") from None
    if parts.scheme.lower() not in ("http", "https") or not host:
        raise WebhookError("not an http or https URL")
    headers = {"Content-Type": "application/json"}
    if "@" in parts.netloc:
        # user info (http://user:password@host/...): urllib would take it for part of the host,
        # so it is taken out of the URL and sent as Basic auth, as requests does
        userinfo, _, hostport = parts.netloc.rpartition("@")
        user, _, password = userinfo.partition(":")
        token = f"{urllib.parse.unquote(user)}:{urllib.parse.unquote(password)}".encode("utf-8")
        headers["Authorization"] = "Basic " + base64.b64encode(token).decode("ascii")
        url = urllib.parse.urlunsplit(parts._replace(netloc=hostport))
    return urllib.request.Request(url, data=data, method="POST", headers=headers)


class DevApi:
    """The local test API for one handler. :meth:`run` serves until SIGINT/SIGTERM."""

    def __init__(self, config: Dict[str, Any], env: Optional[WorkerEnv] = None,
                 host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, concurrency: int = 1):
        self.handler = config["handler"]
        self.kind = handler_kind(self.handler)
        self.aggregate = bool(config.get("return_aggregate_stream", False))
        rp_args = config.get("rp_args") or {}
        self.debugger_ready_ms: Optional[float] = rp_args.get("ready_delay_ms") if rp_args.get("rp_debugger") else None
        self.env = env or WorkerEnv.from_environ()
        self.concurrency = max(1, int(concurrency))
        self.log = get_logger()
        self.slots = threading.BoundedSemaphore(self.concurrency)
        self.lock = threading.Lock()
        self.kept: Dict[str, Dict[str, Any]] = {}  # /run jobs not yet asked for
        self.counts = {"completed": 0, "failed": 0, "inProgress": 0}
        self.main = MainThreadRunner()
        self.loop: Optional[LoopThread] = None
        self.stopping = threading.Event()
        self._signals = StopSignals()
        #: The SystemExit/KeyboardInterrupt a handler raised: the server stops after answering.
        self.exit_exception: Optional[BaseException] = None
        self.server = ThreadingHTTPServer((host, int(port)), _Handler)
        self.server.daemon_threads = True
        self.server.api = self  # type: ignore[attr-defined]

    @property
    def address(self) -> Tuple[str, int]:
        """The host and port listened on (the port the system picked for port 0)."""
        host, port = self.server.server_address[:2]
        return str(host), int(port)

    # -- running ----------------------------------------------------------------------------

    def run(self) -> int:
        """Serve until SIGINT/SIGTERM (or a handler's ``sys.exit``); returns the exit status."""
        host, port = self.address
        previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, self._on_signal)
        self.main.open()
        self.loop = LoopThread()
        thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.2},
                                  name="vendor-flash-serve-api", daemon=True)
        thread.start()
        self.log.info("vendor-flash %s local test API (handler: %s) on http://%s:%d: POST /runsync, "
                      "/run, /status/{id}, /stream/{id}. For local development only: no authentication",
                      __version__, self.kind.value, host, port)
        try:
            self.main.serve(self.stopping.is_set)  # sync handlers run here meanwhile
        finally:
            self.server.shutdown()
            self.server.server_close()
            self.main.close()
            self.loop.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if self.exit_exception is not None:
            return results.exit_status(self.exit_exception)
        return 0

    def stop(self, reason: str = "") -> None:
        """Stop serving (from any thread)."""
        if not self.stopping.is_set():
            self.log.info("local test API stopping%s", f" ({reason})" if reason else "")
        self.stopping.set()
        self.main.wake()

    def _on_signal(self, signum, _frame) -> None:
        if self._signals.classify(signum) == "repeat":
            self.log.debug("%s again within %.0f s of the first: the same stop request, ignored",
                           signal.Signals(signum).name, self._signals.window)
            return
        if self.stopping.is_set():
            # a sync handler on the main thread keeps the first one from taking effect
            self.log.warning("second signal: exiting now")
            os._exit(1)
        self.stop(signal.Signals(signum).name)

    def run_job(self, job: Dict[str, Any], chunks: Optional[List[Any]] = None) -> Dict[str, Any]:
        """Run one job as the worker loop does and return its job-done body.

        ``chunks`` collects a generator's yields as they come (for ``/stream``).
        """
        job_id = str(job["id"])
        extra = job_extra(job_id)
        with self.slots:
            with self.lock:
                self.counts["inProgress"] += 1
            run = JobRun(self.handler, job, self.loop, kind=self.kind, aggregate_stream=self.aggregate,
                         on_chunk=None if chunks is None else chunks.append,
                         worker_id=self.env.report_worker_id, hostname=self.env.hostname)
            on_main = self.kind in (HandlerKind.SYNC, HandlerKind.GENERATOR) and self.main.acquire()
            if on_main:
                run.call = self.main.call
            self.log.info("Started.", extra=extra)
            try:
                body = run.run()
            finally:
                if on_main:
                    self.main.release()
                with self.lock:
                    self.counts["inProgress"] -= 1
        body.pop("stopPod", None)  # refresh_worker: nothing to recycle here
        if self.debugger_ready_ms is not None:
            rp_debugger.attach_debugger_output(body, self.debugger_ready_ms)
        else:
            rp_debugger.clear_debugger_output()
        try:
            results.encode_body(body)
        except (TypeError, ValueError) as exc:
            body = results.unencodable_result(exc, self.env.report_worker_id, self.env.hostname)
        failed = bool(body.get("error"))
        with self.lock:
            self.counts["failed" if failed else "completed"] += 1
        if failed:  # at ERROR, with the error on one line (never the job's input)
            self.log.error("done (error: %s)", results.error_summary(body["error"]), extra=extra)
        else:
            self.log.info("done (ok)", extra=extra)
        self.log.info("Finished.", extra=extra)
        if run.exit_exception is not None:
            self.exit_exception = run.exit_exception
        return body

    # -- routes -----------------------------------------------------------------------------

    def keep(self, job_input: Any, webhook: Optional[str]) -> Dict[str, Any]:
        """``/run``: keep the job for a later ``/status`` or ``/stream``."""
        job_id = f"test-{uuid.uuid4()}"
        with self.lock:
            self.kept[job_id] = {"input": job_input, "webhook": webhook}
        return {"id": job_id, "status": "IN_PROGRESS"}

    def runsync(self, job_input: Any, webhook: Optional[str]) -> Dict[str, Any]:
        """``/runsync``: run the job now."""
        job_id = f"test-{uuid.uuid4()}"
        body = self.run_job(self._job(job_id, job_input, webhook))
        if webhook and not body.get("error"):
            self.send_webhook(webhook, {"output": body.get("output")}, job_id)
        return job_answer(job_id, body)

    def status(self, job_id: str) -> Dict[str, Any]:
        """``/status/{id}``: run a kept job; it is forgotten once answered."""
        with self.lock:
            kept = self.kept.pop(job_id, None)
        if kept is None:
            raise RequestError(404, None)
        body = self.run_job(self._job(job_id, kept["input"], kept["webhook"]))
        if kept["webhook"] and not body.get("error"):
            self.send_webhook(kept["webhook"], {"output": body.get("output")}, job_id)
        return job_answer(job_id, body)

    def stream(self, job_id: str) -> Dict[str, Any]:
        """``/stream/{id}``: run a kept generator job and answer every chunk it yielded."""
        with self.lock:
            if job_id not in self.kept:
                raise RequestError(404, None)
            if not self.kind.is_stream:  # as runpod-python, the job is kept for a /status
                return {"id": job_id, "status": "FAILED", "error": NOT_A_GENERATOR}
            kept = self.kept.pop(job_id)
        chunks: List[Any] = []
        body = self.run_job(self._job(job_id, kept["input"], kept["webhook"]), chunks)
        stream = [{"output": chunk} for chunk in chunks]
        if not body.get("error"):
            try:
                results.encode_body({"stream": stream})
            except (TypeError, ValueError) as exc:
                body = results.unencodable_result(exc, self.env.report_worker_id, self.env.hostname)
                stream = []
        if body.get("error"):
            return {"id": job_id, "status": "FAILED", "stream": stream, "error": body["error"]}
        if kept["webhook"]:
            self.send_webhook(kept["webhook"], stream, job_id)
        return {"id": job_id, "status": "COMPLETED", "stream": stream}

    def health(self) -> Dict[str, Any]:
        """Job and worker counts, in the shape of flashd's ``/health``."""
        with self.lock:
            running = self.counts["inProgress"]
            return {"jobs": {"completed": self.counts["completed"], "failed": self.counts["failed"],
                             "inProgress": running, "inQueue": len(self.kept), "retried": 0},
                    "workers": {"idle": 0 if running else 1, "running": 1 if running else 0}}

    @staticmethod
    def _job(job_id: str, job_input: Any, webhook: Optional[str]) -> Dict[str, Any]:
        job: Dict[str, Any] = {"id": job_id, "input": job_input}
        if webhook:
            job["webhook"] = webhook
        return job

    def send_webhook(self, url: str, payload: Any, job_id: str) -> None:
        """POST ``payload`` to ``url`` in the background (one try, 10 s), as runpod-python does."""
        data = _json_bytes(payload)

        def post() -> None:
            try:
                request = webhook_request(url, data)
                with urllib.request.urlopen(request, timeout=WEBHOOK_TIMEOUT) as response:  # noqa: S310
                    response.read()
                self.log.debug("webhook %s: delivered", shown_url(url), extra=job_extra(job_id))
            except Exception as exc:  # noqa: BLE001 - a webhook failure is only logged
                self.log.warning("webhook %s failed: %s", shown_url(url), exc, extra=job_extra(job_id))

        threading.Thread(target=post, name="vendor-flash-webhook", daemon=True).start()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = f"vendor-flash/{__version__}"

    @property
    def api(self) -> DevApi:
        return self.server.api  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        self.api.log.debug("%s - %s", self.address_string(), format % args)

    def do_GET(self) -> None:  # noqa: N802
        self._dispatch("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch("POST")

    def _dispatch(self, method: str) -> None:
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        parts = path.strip("/").split("/")
        try:
            raw = self._read_body()
            if path in ("/run", "/runsync"):
                self._allow(method, "POST")
                job_input, webhook = parse_job_request(raw)
                answer = self.api.keep(job_input, webhook) if path == "/run" else self.api.runsync(job_input, webhook)
            elif len(parts) == 2 and parts[0] in ("status", "stream") and parts[1]:
                self._allow(method, "POST", "GET")
                job_id = parts[1]
                try:
                    answer = self.api.status(job_id) if parts[0] == "status" else self.api.stream(job_id)
                except RequestError as exc:
                    if exc.status != 404:
                        raise
                    # runpod-python's body for an unknown id, with a 404 instead of its 200
                    self._send(404, {"id": job_id, "status": "FAILED", "error": NOT_FOUND})
                    return
            elif path == "/health":
                self._allow(method, "GET")
                answer = self.api.health()
            elif path in ("/", "/docs"):
                self._allow(method, "GET")
                answer = {"title": "vendor-flash local test API", "version": __version__,
                          "handler": self.api.kind.value, "note": "for local development only: no authentication",
                          "routes": ROUTES}
            else:
                raise RequestError(404, "Not Found")
        except RequestError as exc:
            self._send(exc.status, {"detail": exc.detail})
            return
        except Exception as exc:  # noqa: BLE001 - answer instead of dropping the connection
            self.api.log.exception("local test API: internal error")
            self._send(500, {"detail": f"internal error: {exc}"})
            return
        self._send(200, answer)
        if self.api.exit_exception is not None:
            self.api.stop(f"{type(self.api.exit_exception).__name__} from the handler")

    def _allow(self, method: str, *allowed: str) -> None:
        if method not in allowed:
            raise RequestError(405, "Method Not Allowed")

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            self.close_connection = True
            raise RequestError(411, "send the body with a Content-Length (chunked bodies are not read)")
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0:
            self.close_connection = True
            raise RequestError(400, "bad Content-Length")
        if length > MAX_BODY:
            self.close_connection = True
            raise RequestError(413, f"body too large: {length} bytes, the limit is {MAX_BODY} bytes")
        return self.rfile.read(length) if length > 0 else b""

    def _send(self, status: int, payload: Any) -> None:
        try:
            data = _json_bytes(payload)
        except (TypeError, ValueError) as exc:
            status, data = 500, json.dumps({"detail": f"answer not JSON-serialisable: {exc}"}).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def serve(config: Dict[str, Any], env: Optional[WorkerEnv] = None, host: Optional[str] = None,
          port: Optional[int] = None, concurrency: Optional[int] = None) -> int:
    """Start the local test API and serve until SIGINT/SIGTERM; returns the exit status."""
    set_local_only()
    host = host or DEFAULT_HOST
    port = DEFAULT_PORT if port is None else port
    try:
        api = DevApi(config, env, host, port, 1 if concurrency is None else concurrency)
    except (OSError, OverflowError) as exc:
        # A port in use (8000 is flashd's default port too), a port out of range or a host that
        # does not resolve: said in one line and exit 1, as uvicorn does for runpod-python,
        # instead of a traceback out of socketserver.
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc).rstrip(".")
        also = " (8000 is also flashd's default port)" if port == DEFAULT_PORT else ""
        get_logger().error("local test API cannot listen on %s:%s: %s; choose another port with "
                           "--rp_api_port%s, or another address with --rp_api_host",
                           host, port, reason, also)
        return 1
    return api.run()
