"""Start a real flashd for integration tests and talk to its job API.

flashd is ``node <repo>/dist/flashd.mjs`` (build it with ``npm run build``), or the file named by
``FLASHD_BIN``. Tests skip, with the reason, when node or the build is missing, or when the
server has no ``/v2/serverless/{id}/worker-env`` route yet.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from typing import Any, Dict, List, Optional, Tuple

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO_DIR = os.path.dirname(PYTHON_DIR)
WORKERS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers")


class Unavailable(Exception):
    """flashd cannot be used here; the message is the skip reason."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout: float = 20.0, interval: float = 0.05, what: str = "condition"):
    """Poll ``predicate`` until it returns a truthy value or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}; last value: {last!r}")


class Flashd:
    """A flashd process with a temporary data dir and a random admin key."""

    def __init__(self, extra_args: Optional[List[str]] = None):
        self.bin = os.environ.get("FLASHD_BIN") or os.path.join(REPO_DIR, "dist", "flashd.mjs")
        self.node = shutil.which("node")
        if not self.node:
            raise Unavailable("node is not installed")
        if not os.path.exists(self.bin):
            raise Unavailable(f"{self.bin} not found: run `npm run build` in {REPO_DIR}")
        self.key = secrets.token_hex(16)  # 32 characters
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.data_dir = tempfile.mkdtemp(prefix="vf-flashd-")
        self.log_path = os.path.join(self.data_dir, "flashd.log")
        self.extra_args = extra_args or []
        self.proc: Optional[subprocess.Popen] = None

    def start(self) -> "Flashd":
        env = dict(os.environ, FLASHD_ADMIN_API_KEY=self.key)
        args = [self.node, self.bin, "--port", str(self.port), "--data-dir", self.data_dir,
                "--rate-limit-minute", "100000", "--rate-limit-hour", "1000000", "--rate-limit-day", "10000000",
                *self.extra_args]
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(args, env=env, stdout=self._log, stderr=subprocess.STDOUT)

        def ready():
            if self.proc.poll() is not None:
                raise Unavailable(f"flashd exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return True
            except OSError:
                return False

        wait_until(ready, 20, what="flashd to listen")
        return self

    def kill(self) -> None:
        """SIGKILL the server, keeping its data dir (for restart tests)."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._log.close()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if getattr(self, "_log", None):
            self._log.close()
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def log_tail(self, n: int = 4000) -> str:
        try:
            with open(self.log_path, "rb") as fh:
                return fh.read()[-n:].decode("utf-8", "replace")
        except OSError:
            return ""

    # -- HTTP -------------------------------------------------------------------------------

    def call(self, method: str, path: str, body: Any = None, timeout: float = 30.0) -> Tuple[int, Any]:
        """Request with the admin key; returns ``(status, decoded JSON or text or None)``."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.key}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as err:
            status, raw = err.code, err.read()
        if not raw:
            return status, None
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode("utf-8", "replace")

    def create_endpoint(self, name: str) -> str:
        status, body = self.call("POST", "/v2/serverless", {
            "name": name, "type": "QUEUE", "scaling": {"type": "QUEUE_DELAY", "queueDelay": 4},
            "image": "none", "cpu": [{"id": "cpu3c", "vcpuCount": 2}], "workers": {"min": 0, "max": 0},
        })
        if status not in (200, 201):
            raise AssertionError(f"endpoint create failed: {status} {body}")
        return body["id"]

    def worker_env(self, endpoint_id: str) -> Dict[str, str]:
        status, body = self.call("GET", f"/v2/serverless/{endpoint_id}/worker-env")
        if status == 404:
            raise Unavailable(f"GET /v2/serverless/{{id}}/worker-env answers 404 on this flashd build: "
                              f"the queue and worker routes have not landed yet ({body})")
        if status != 200 or not isinstance(body, dict) or "env" not in body:
            raise AssertionError(f"worker-env failed: {status} {body}")
        return body["env"]


class WorkerProcess:
    """``python3 tests/workers/<script> <args>`` with a worker environment."""

    def __init__(self, env: Dict[str, str], script: str, *args: str, log_dir: str):
        self.env = env
        self.argv = [sys.executable, os.path.join(WORKERS_DIR, script), *args]
        self.log_path = os.path.join(log_dir, f"worker-{script}-{'-'.join(args)}-{time.monotonic_ns()}.log")
        self.proc: Optional[subprocess.Popen] = None

    def start(self) -> "WorkerProcess":
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNPOD_", "VENDOR_"))}
        env.update(self.env)
        env["PYTHONPATH"] = PYTHON_DIR + os.pathsep + env.get("PYTHONPATH", "")
        env["PYTHONUNBUFFERED"] = "1"
        env.setdefault("VENDOR_LOG_FORMAT", "text")
        env.setdefault("VENDOR_LOG_LEVEL", "DEBUG")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.argv, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        return self

    def stop(self) -> Optional[int]:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode if self.proc else None

    def log(self) -> str:
        try:
            with open(self.log_path, "rb") as fh:
                return fh.read().decode("utf-8", "replace")
        except OSError:
            return ""


class AnswerDroppingRelay:
    """An HTTP relay in front of flashd that forwards every request; for the first ``drop_route``
    POST (e.g. ``job-stream``) it closes the connection once flashd has answered, without passing
    the answer on: a post that was stored but whose answer was lost (a proxy or network fault).
    ``hold_route`` (e.g. ``job-stop``): flashd's answers to GETs on it are held back until
    :meth:`release`, as when they are late (a slow network, a worker that was paused)."""

    def __init__(self, upstream_port: int, drop_route: Optional[str] = None, hold_route: Optional[str] = None):
        import http.client
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        relay = self
        self.dropped: List[str] = []
        self.held = threading.Event()
        self.released = threading.Event()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _relay(self):
                hold = self.command == "GET" and hold_route and f"/{hold_route}/" in self.path
                if hold:
                    relay.held.set()
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                upstream = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=120)
                try:
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    answer = upstream.getresponse()
                    data = answer.read()
                finally:
                    upstream.close()
                if hold:
                    relay.released.wait(60)
                if (self.command == "POST" and drop_route and f"/{drop_route}/" in self.path
                        and not relay.dropped):
                    relay.dropped.append(self.path)
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.send_response(answer.status)
                for key, value in answer.getheaders():
                    if key.lower() not in ("connection", "transfer-encoding", "content-length", "keep-alive"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _relay

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.upstream_port = upstream_port
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def worker_env(self, env: Dict[str, str]) -> Dict[str, str]:
        """``env`` (from worker-env) with its URLs pointing at this relay."""
        return {k: v.replace(f"127.0.0.1:{self.upstream_port}", f"127.0.0.1:{self.port}") for k, v in env.items()}

    def release(self) -> None:
        """Pass on held answers, and stop holding."""
        self.released.set()

    def close(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()
