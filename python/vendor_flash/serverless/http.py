"""A small keep-alive HTTP client on top of :mod:`http.client`.

Each :class:`HttpClient` keeps idle connections per host and reuses them. Requests that are
blocked (long-polls) can be interrupted from another thread with :meth:`HttpClient.abort`,
which the worker uses on shutdown.
"""

from __future__ import annotations

import http.client
import json
import platform
import socket
import threading
from dataclasses import dataclass
from typing import Any, Dict, Optional
from urllib.parse import urlsplit

from ..version import __version__

USER_AGENT = (
    f"vendor-flash/{__version__} ({platform.system()}; {platform.machine()}) "
    f"Language/Python {platform.python_version()}"
)

# Errors that mean the request did not get an HTTP response.
TRANSPORT_ERRORS = (OSError, http.client.HTTPException)


class RequestAborted(Exception):
    """Raised when :meth:`HttpClient.abort` interrupted the request."""


@dataclass
class HttpResponse:
    """A fully read HTTP response."""

    status: int
    headers: Dict[str, str]
    body: bytes
    #: Set when the answer was read after sending the request body failed (the server answered
    #: and closed before taking the whole body, as it does for a 413).
    send_error: Optional[str] = None

    @property
    def content_type(self) -> str:
        """The media type, lower-cased, without parameters."""
        return self.headers.get("content-type", "").split(";")[0].strip().lower()

    def json(self) -> Any:
        """Decode the body as UTF-8 JSON."""
        return json.loads(self.body.decode("utf-8"))

    def text(self, limit: int = 500) -> str:
        """The body as text, cut to ``limit`` characters (for log lines)."""
        return self.body[:limit].decode("utf-8", "replace")

    def line(self, limit: int = 500) -> str:
        """The body for a log line: :meth:`text` with each run of whitespace (the line breaks of
        a proxy's HTML error page) made one space, so the log line stays one line."""
        return " ".join(self.text(limit).split())


def _new_connection(scheme: str, netloc: str, timeout: float) -> http.client.HTTPConnection:
    if scheme == "https":
        return http.client.HTTPSConnection(netloc, timeout=timeout)
    if scheme == "http":
        return http.client.HTTPConnection(netloc, timeout=timeout)
    raise ValueError(f"unsupported URL scheme: {scheme!r}")


class HttpClient:
    """Thread-safe HTTP client with keep-alive connection reuse.

    ``auth`` is sent verbatim as the ``Authorization`` header (flashd and RunPod workers send
    the raw key, without ``Bearer``).
    """

    def __init__(self, auth: str = "", timeout: float = 30.0, max_idle: int = 8):
        self._auth = auth
        self._timeout = timeout
        self._max_idle = max_idle
        self._lock = threading.Lock()
        self._idle: Dict[tuple, list] = {}
        self._active: set = set()
        self._aborted = False

    def request(
        self,
        method: str,
        url: str,
        body: Optional[bytes] = None,
        headers: Optional[Dict[str, str]] = None,
        timeout: Optional[float] = None,
    ) -> HttpResponse:
        """Send one request and read the whole response.

        Raises :class:`RequestAborted` after :meth:`abort`, :class:`OSError` or
        :class:`http.client.HTTPException` on transport failures. A request that fails on a
        reused keep-alive connection before any response arrives is retried once on a new one.
        """
        parts = urlsplit(url)
        key = (parts.scheme, parts.netloc)
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        send_headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if self._auth:
            send_headers["Authorization"] = self._auth
        if body is not None:
            send_headers["Content-Type"] = "application/json"
        if headers:
            send_headers.update(headers)
        timeout = self._timeout if timeout is None else timeout

        for attempt in (0, 1):
            conn, reused = self._checkout(key, timeout)
            try:
                if conn.sock is None:
                    conn.connect()
                if self._aborted:
                    self._discard(conn)
                    raise RequestAborted("client aborted")
                try:
                    conn.request(method, target, body=body, headers=send_headers)
                except TRANSPORT_ERRORS as send_error:
                    # A server that refuses a body (413) answers at once and closes while the
                    # body is still being sent: read that answer instead of failing blindly.
                    early = self._early_answer(conn, body)
                    if early is None:
                        raise
                    self._discard(conn)
                    early.send_error = f"{type(send_error).__name__}: {send_error}"
                    return early
                raw = conn.getresponse()
                data = raw.read()
            except TRANSPORT_ERRORS as exc:
                self._discard(conn)
                if self._aborted:
                    raise RequestAborted(str(exc)) from exc
                if reused and attempt == 0 and isinstance(
                    exc, (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)
                ):
                    continue
                raise
            response = HttpResponse(
                status=raw.status,
                headers={k.lower(): v for k, v in raw.getheaders()},
                body=data,
            )
            if raw.will_close:
                self._discard(conn)
            else:
                self._checkin(key, conn)
            return response
        raise AssertionError("unreachable")  # pragma: no cover

    def _early_answer(self, conn, body: Optional[bytes]) -> Optional[HttpResponse]:
        """After a send error, the response the server already sent, if one can be read.

        Only for requests with a body (a server refusing it answers before reading it all).
        A 408 is ignored: some servers send it on an idle keep-alive connection before closing
        it, and it does not answer this request.
        """
        if not body or self._aborted or conn.sock is None:
            return None
        try:
            conn.sock.settimeout(min(5.0, conn.timeout or 5.0))
            raw = conn.getresponse()
            data = raw.read()
        except Exception:  # noqa: BLE001 - nothing readable: the caller reports the send error
            return None
        if raw.status == 408:
            return None
        return HttpResponse(status=raw.status, headers={k.lower(): v for k, v in raw.getheaders()}, body=data)

    def abort(self) -> None:
        """Interrupt requests in flight and refuse new ones (used on shutdown)."""
        with self._lock:
            self._aborted = True
            active = list(self._active)
            idle = [c for conns in self._idle.values() for c in conns]
            self._idle.clear()
        for conn in active:
            sock = conn.sock
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        for conn in idle:
            conn.close()

    def __enter__(self) -> "HttpClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Close idle connections."""
        with self._lock:
            idle = [c for conns in self._idle.values() for c in conns]
            self._idle.clear()
        for conn in idle:
            conn.close()

    # -- pool -------------------------------------------------------------------------------

    def _checkout(self, key: tuple, timeout: float):
        with self._lock:
            if self._aborted:
                raise RequestAborted("client aborted")
            pool = self._idle.get(key)
            conn = pool.pop() if pool else None
            reused = conn is not None
            if conn is None:
                conn = _new_connection(key[0], key[1], timeout)
            self._active.add(conn)
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn, reused

    def _checkin(self, key: tuple, conn) -> None:
        with self._lock:
            self._active.discard(conn)
            pool = self._idle.setdefault(key, [])
            if not self._aborted and len(pool) < self._max_idle:
                pool.append(conn)
                return
        conn.close()

    def _discard(self, conn) -> None:
        with self._lock:
            self._active.discard(conn)
        conn.close()
