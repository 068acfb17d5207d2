"""A tiny in-process stand-in for flashd's worker routes, for testing the worker loop.

It speaks the routes of the contract (job-take, job-take-batch, job-done, job-stream, job-stop,
ping) and records every request. Tests script its answers through attributes.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, List, Optional
from urllib.parse import parse_qs, urlsplit


class Request:
    """One recorded request."""

    def __init__(self, method: str, route: str, parts: List[str], query: Dict[str, str],
                 headers: Dict[str, str], body: bytes):
        self.method = method
        self.route = route
        self.parts = parts
        self.query = query
        self.headers = headers
        self.body = body
        self.at = time.monotonic()
        self.refused = False  # answered 413 before its body was read (see FakeFlashd.body_limit)

    def json(self) -> Any:
        return json.loads(self.body.decode("utf-8"))

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"<{self.method} {self.route} {self.parts} {self.query} {self.body[:80]!r}>"


class FakeFlashd:
    """Start with :meth:`start`; the worker env comes from :meth:`env`."""

    def __init__(self, hold: float = 2.0):
        self.hold = hold
        self.lock = threading.Condition()
        self.queue: List[Dict[str, Any]] = []
        self.stops: List[str] = []
        self.stop_times: Dict[str, float] = {}
        self.requests: List[Request] = []
        # hooks: route -> callable(Request) -> Optional[(status, body_obj)]; None = default
        self.hooks: Dict[str, Callable[[Request], Optional[tuple]]] = {}
        # like flashd's 64 MiB job-done limit: a longer declared body gets a 413 at once, unread,
        # and the connection is closed
        self.body_limit: Optional[int] = None
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    # -- control ----------------------------------------------------------------------------

    @property
    def base(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "FakeFlashd":
        self.thread.start()
        return self

    def stop(self) -> None:
        with self.lock:
            self.hold = 0
            self.lock.notify_all()
        self.server.shutdown()
        self.server.server_close()

    def env(self, worker_id: str = "w1", key: str = "worker-key", interval_ms: int = 200) -> Dict[str, str]:
        b = f"{self.base}/v2/ep1"
        return {
            "VENDOR_WEBHOOK_GET_JOB": f"{b}/job-take/$ID?gpu=cpu",
            "VENDOR_WEBHOOK_POST_OUTPUT": f"{b}/job-done/{worker_id}/$ID?gpu=cpu",
            "VENDOR_WEBHOOK_POST_STREAM": f"{b}/job-stream/{worker_id}/$ID?gpu=cpu",
            "VENDOR_WEBHOOK_PING": f"{b}/ping/{worker_id}?gpu=cpu",
            "VENDOR_POD_ID": worker_id,
            "VENDOR_AI_API_KEY": key,
            "VENDOR_ENDPOINT_ID": "ep1",
            "VENDOR_PING_INTERVAL": str(interval_ms),
        }

    def submit(self, job_input: Any, job_id: Optional[str] = None) -> str:
        job_id = job_id or f"job-{len(self.requests)}-{time.monotonic_ns()}"
        with self.lock:
            self.queue.append({"id": job_id, "input": job_input})
            self.lock.notify_all()
        return job_id

    def stop_job(self, job_id: str) -> None:
        with self.lock:
            self.stops.append(job_id)
            self.stop_times[job_id] = time.monotonic()
            self.lock.notify_all()

    def recorded(self, route: str, job_id: Optional[str] = None) -> List[Request]:
        with self.lock:
            out = [r for r in self.requests if r.route == route]
        if job_id is not None:
            out = [r for r in out if r.parts and r.parts[-1] == job_id]
        return out

    def wait_for(self, predicate: Callable[[], Any], timeout: float = 10.0) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(0.01)
        raise AssertionError("condition not met before the deadline")

    # -- HTTP -------------------------------------------------------------------------------

    def _handle(self, req: Request) -> tuple:
        hook = self.hooks.get(req.route)
        if hook is not None:
            answer = hook(req)
            if answer is not None:
                return answer
        if req.route in ("job-take", "job-take-batch"):
            size = int(req.query.get("batch_size", "1")) if req.route == "job-take-batch" else 1
            deadline = time.monotonic() + self.hold
            with self.lock:
                while not self.queue and time.monotonic() < deadline:
                    self.lock.wait(max(0.0, deadline - time.monotonic()))
                jobs = self.queue[:size]
                del self.queue[:size]
            if not jobs:
                return 204, None
            return 200, (jobs if req.route == "job-take-batch" else jobs[0])
        if req.route == "job-stop":
            # like flashd: pending stops are answered at once, again and again, until a ping
            # no longer lists the job
            deadline = time.monotonic() + self.hold
            with self.lock:
                while not self.stops and time.monotonic() < deadline:
                    self.lock.wait(max(0.0, deadline - time.monotonic()))
                stops = list(self.stops)
            return (200, {"jobsToStop": stops}) if stops else (204, None)
        if req.route == "ping":
            listed = set(filter(None, req.query.get("job_id", "").split(",")))
            now = time.monotonic()
            with self.lock:
                # like flashd: a stop younger than a second survives a ping that does not list
                # its job (the ping may predate the job's registration in the worker)
                self.stops = [j for j in self.stops if j in listed or now - self.stop_times.get(j, 0.0) < 1.0]
            return 200, {"ok": True}
        return 200, {}

    def _handler_class(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # silence
                pass

            def _serve(self):
                length = int(self.headers.get("Content-Length") or 0)
                limit = fake.body_limit
                refuse = limit is not None and length > limit
                body = self.rfile.read(length) if length and not refuse else b""
                url = urlsplit(self.path)
                segments = [s for s in url.path.split("/") if s]
                # /v2/ep1/<route>/<rest...>
                route = segments[2] if len(segments) > 2 else ""
                query = {k: v[0] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
                req = Request(self.command, route, segments[3:], query,
                              {k.lower(): v for k, v in self.headers.items()}, body)
                req.refused = refuse
                with fake.lock:
                    fake.requests.append(req)
                if refuse:
                    data = json.dumps({"title": "Payload too large", "status": 413,
                                       "detail": f"The request body is larger than the {limit} bytes "
                                                 "this route accepts."}).encode()
                    self.send_response(413)
                    self.send_header("Content-Type", "application/problem+json")
                    self.send_header("Content-Length", str(len(data)))
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.wfile.write(data)
                    self.close_connection = True
                    return
                try:
                    status, payload = fake._handle(req)
                except Exception as exc:  # pragma: no cover
                    status, payload = 500, {"error": str(exc)}
                # bytes: sent as they are (a body json.dumps cannot produce)
                data = b"" if payload is None else payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                if data:
                    self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if data:
                    self.wfile.write(data)

            do_GET = _serve
            do_POST = _serve

        return Handler
