"""One heartbeat: ``GET ping/{worker}?job_id=a,b``, from the heartbeat process or, when that
process is gone, from the worker's own thread (:mod:`.heartbeat`, :mod:`.worker`)."""

from __future__ import annotations

from typing import List, Optional, Tuple

from .env import WorkerEnv
from .http import TRANSPORT_ERRORS, HttpClient, HttpResponse
from ..version import __version__


def ping_client(env: WorkerEnv) -> HttpClient:
    """The HTTP client pings go through."""
    return HttpClient(env.api_key, timeout=min(30.0, max(2.0, 2 * env.ping_interval)), max_idle=1)


def ping(client: HttpClient, env: WorkerEnv, ids: List[str]) -> Tuple[Optional[HttpResponse], str]:
    """One heartbeat listing ``ids``: the response, or None and why the request failed."""
    try:
        return client.request("GET", env.ping_url(ids, __version__)), ""
    except TRANSPORT_ERRORS as exc:
        return None, f"{type(exc).__name__}: {exc}"
