"""Worker environment: env var lookup with RunPod fallbacks, and the URLs built from it.

flashd gives a worker URL *templates* that already hold a ``?query``. The worker fills in
placeholders and appends its own parameters, exactly as runpod-python does:

* ``$ID`` is the worker id in the job-take URL and the job id in the job-done/job-stream URLs;
* ``$RUNPOD_POD_ID`` / ``$VENDOR_POD_ID`` are the worker id everywhere.

Every variable is read under its flashd name first (``VENDOR_…``) and then under RunPod's
(``RUNPOD_…``). An empty value counts as unset.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Optional
from urllib.parse import quote

#: Default heartbeat interval in milliseconds (runpod-python's default).
DEFAULT_PING_INTERVAL_MS = 10_000
#: Smallest heartbeat interval honoured, in milliseconds.
MIN_PING_INTERVAL_MS = 100

_POD_ID_PLACEHOLDERS = ("$VENDOR_POD_ID", "$RUNPOD_POD_ID")


def env_setting(name: str, environ: Optional[Mapping[str, str]] = None) -> Optional[tuple[str, str]]:
    """``(variable, value)`` of ``VENDOR_<name>``, else ``RUNPOD_<name>``, else ``None`` (empty
    values are skipped): :func:`env_value` with the name of the variable it read."""
    environ = os.environ if environ is None else environ
    for prefix in ("VENDOR_", "RUNPOD_"):
        value = environ.get(prefix + name)
        if value:
            return prefix + name, value
    return None


def env_value(name: str, environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """Return ``VENDOR_<name>``, else ``RUNPOD_<name>``, else ``None`` (empty values are skipped).

    ``name`` is given without prefix, e.g. ``env_value("WEBHOOK_GET_JOB")``.
    """
    setting = env_setting(name, environ)
    return None if setting is None else setting[1]


def append_query(url: str, params: Iterable[tuple[str, str]]) -> str:
    """Append ``key=value`` pairs to ``url``, with ``&`` when it already has a query, else ``?``.

    Values must already be encoded. This matches runpod-python's string concatenation on
    templates that hold a ``?query`` and still gives a valid URL for templates that do not.
    """
    out = url
    for key, value in params:
        out += ("&" if "?" in out else "?") + f"{key}={value}"
    return out


def fill_pod_id(template: str, worker_id: str) -> str:
    """Replace ``$VENDOR_POD_ID`` and ``$RUNPOD_POD_ID`` with the worker id."""
    for placeholder in _POD_ID_PLACEHOLDERS:
        template = template.replace(placeholder, worker_id)
    return template


def _quote_id(value: str) -> str:
    return quote(str(value), safe="")


@dataclass(frozen=True)
class WorkerEnv:
    """The worker's view of its environment. Build it with :meth:`from_environ`."""

    get_job: Optional[str] = None
    post_output: Optional[str] = None
    post_stream: Optional[str] = None
    ping: Optional[str] = None
    worker_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    worker_id_from_env: bool = False
    api_key: str = ""
    endpoint_id: Optional[str] = None
    ping_interval_ms: int = DEFAULT_PING_INTERVAL_MS
    hostname: str = "unknown"

    @classmethod
    def from_environ(cls, environ: Optional[Mapping[str, str]] = None) -> "WorkerEnv":
        """Read the worker settings from ``environ`` (default ``os.environ``)."""
        environ = os.environ if environ is None else environ

        def get(name: str) -> Optional[str]:
            return env_value(name, environ)

        pod_id = get("POD_ID")
        interval = DEFAULT_PING_INTERVAL_MS
        raw_interval = get("PING_INTERVAL")
        if raw_interval:
            try:
                interval = max(MIN_PING_INTERVAL_MS, int(float(raw_interval)))
            except ValueError:
                interval = DEFAULT_PING_INTERVAL_MS
        return cls(
            get_job=get("WEBHOOK_GET_JOB"),
            post_output=get("WEBHOOK_POST_OUTPUT"),
            post_stream=get("WEBHOOK_POST_STREAM"),
            ping=get("WEBHOOK_PING"),
            worker_id=pod_id or str(uuid.uuid4()),
            worker_id_from_env=bool(pod_id),
            api_key=get("AI_API_KEY") or "",
            endpoint_id=get("ENDPOINT_ID"),
            ping_interval_ms=interval,
            hostname=get("POD_HOSTNAME") or "unknown",
        )

    # -- mode -------------------------------------------------------------------------------

    @property
    def is_production(self) -> bool:
        """True when a job-take URL is configured (otherwise the worker runs in local mode)."""
        return bool(self.get_job)

    @property
    def ping_enabled(self) -> bool:
        """Heartbeats need a ping URL, a worker key and a worker id from the environment."""
        return bool(self.ping and self.api_key and self.worker_id_from_env)

    @property
    def report_worker_id(self) -> str:
        """Worker id for error reports: the pod id from the environment, else ``"unknown"``."""
        return self.worker_id if self.worker_id_from_env else "unknown"

    @property
    def ping_interval(self) -> float:
        """Heartbeat interval in seconds."""
        return self.ping_interval_ms / 1000.0

    # -- URLs -------------------------------------------------------------------------------

    def _take_base(self) -> str:
        if not self.get_job:
            raise RuntimeError("no job-take URL configured (VENDOR_WEBHOOK_GET_JOB)")
        return fill_pod_id(self.get_job, self.worker_id).replace("$ID", self.worker_id)

    def job_take_url(self, job_in_progress: bool) -> str:
        """``GET`` URL that long-polls for one job."""
        return append_query(self._take_base(), [("job_in_progress", "1" if job_in_progress else "0")])

    def job_take_batch_url(self, batch_size: int, job_in_progress: bool) -> str:
        """``GET`` URL that long-polls for up to ``batch_size`` jobs (a JSON array)."""
        base = self._take_base().replace("/job-take/", "/job-take-batch/")
        return append_query(
            base,
            [("batch_size", str(int(batch_size))), ("job_in_progress", "1" if job_in_progress else "0")],
        )

    def job_stop_url(self) -> Optional[str]:
        """``GET`` URL of the job-stop long-poll, or ``None`` when it cannot be derived."""
        base = self._take_base()
        if "/job-take/" not in base:
            return None
        return base.replace("/job-take/", "/job-stop/")

    def job_done_url(self, job_id: str, is_stream: bool = False) -> str:
        """``POST`` URL for a job result or progress update."""
        template = self.post_output or "JOB_DONE_URL"
        url = fill_pod_id(template, self.worker_id).replace("$ID", _quote_id(job_id))
        return append_query(url, [("isStream", "true" if is_stream else "false")])

    def job_stream_url(self, job_id: str, chunk: Optional[int] = None) -> str:
        """``POST`` URL for one streamed chunk (``isStream=false``, as runpod-python sends it).

        ``chunk``: the chunk's number in its job (1 for the first yield), sent as ``chunk=N`` so
        that flashd stores a chunk that is posted again (its answer was lost) only once.
        """
        template = self.post_stream or "JOB_STREAM_URL"
        url = fill_pod_id(template, self.worker_id).replace("$ID", _quote_id(job_id))
        query = [("isStream", "false")] + ([("chunk", str(chunk))] if chunk is not None else [])
        return append_query(url, query)

    def ping_url(self, job_ids: Iterable[str] = (), sdk_version: Optional[str] = None) -> str:
        """``GET`` URL of the heartbeat listing the jobs in progress (``job_id=a,b``)."""
        if not self.ping:
            raise RuntimeError("no ping URL configured (VENDOR_WEBHOOK_PING)")
        url = fill_pod_id(self.ping, self.worker_id).replace("$ID", self.worker_id)
        params = []
        ids = [_quote_id(j) for j in job_ids]
        if ids:
            params.append(("job_id", ",".join(ids)))
        if sdk_version:
            params.append(("vendor_flash_version", _quote_id(sdk_version)))
        return append_query(url, params)

