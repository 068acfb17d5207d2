"""Posting results, stream chunks and progress to flashd, with the retry rules of the contract.

* 2xx: delivered.
* 409: the job no longer belongs to this worker (a stale attempt): dropped, never retried.
* 429, 5xx and transport errors: retried with backoff (runpod-python drops a result on a
  connection error; flashd asks workers to retry).
* any other 4xx: dropped and logged (retrying would not help).
"""

from __future__ import annotations

import enum
import time
from typing import Any, Callable, Dict, Optional, Sequence

from . import result as results
from .env import WorkerEnv
from .http import TRANSPORT_ERRORS, HttpClient, RequestAborted
from .log import get_logger, job_extra

#: Waits between attempts of a result post (so 5 attempts in about 7.5 s).
DEFAULT_RETRY_DELAYS = (0.5, 1.0, 2.0, 4.0)


class PostOutcome(enum.Enum):
    """What happened to a post."""

    DELIVERED = "delivered"
    STALE = "stale"  # 409: the job belongs to another attempt now
    REJECTED = "rejected"  # other 4xx
    FAILED = "failed"  # retries exhausted


def retry_after_seconds(headers: Dict[str, str], default: float) -> float:
    """Seconds from a ``Retry-After`` header (integer seconds), else ``default``; capped at 30."""
    value = headers.get("retry-after")
    try:
        return min(30.0, max(0.0, float(value))) if value is not None else default
    except ValueError:
        return default


class Transport:
    """Sends job-done, job-stream and progress bodies for one worker."""

    def __init__(
        self,
        env: WorkerEnv,
        client: Optional[HttpClient] = None,
        retry_delays: Sequence[float] = DEFAULT_RETRY_DELAYS,
        sleep: Callable[[float], None] = time.sleep,
        timeout: float = 60.0,
    ):
        self.env = env
        self.client = client or HttpClient(env.api_key, timeout=timeout, max_idle=32)
        self.retry_delays = tuple(retry_delays)
        self.sleep = sleep
        self.log = get_logger()

    def post_done(self, job_id: str, body: Dict[str, Any], is_stream: bool = False) -> PostOutcome:
        """POST a final result to job-done (``isStream=true`` ends a generator job).

        A body that cannot be encoded as JSON is replaced by an error result, so the job
        ends FAILED instead of hanging until its timeout.
        """
        try:
            data = results.encode_body(body)
        except (TypeError, ValueError) as exc:
            self.log.error("result is not JSON serialisable: %s", exc, extra=job_extra(job_id))
            data = results.encode_body(results.unencodable_result(exc, self.env.report_worker_id, self.env.hostname))
        return self.post(self.env.job_done_url(job_id, is_stream), data, job_id, "result")

    def post_stream(self, job_id: str, chunk: Any) -> PostOutcome:
        """POST one generator chunk to job-stream. Raises TypeError/ValueError if not JSON."""
        data = results.encode_body({"output": chunk})
        return self.post(self.env.job_stream_url(job_id), data, job_id, "stream chunk")

    def post_progress(self, job_id: str, progress: Any) -> PostOutcome:
        """POST ``{"status": "IN_PROGRESS", "output": progress}`` to job-done (``isStream=false``)."""
        data = results.encode_body({"status": "IN_PROGRESS", "output": progress})
        return self.post(self.env.job_done_url(job_id, False), data, job_id, "progress")

    def post(self, url: str, data: bytes, job_id: str, what: str) -> PostOutcome:
        """POST ``data`` to ``url`` with the retry rules above."""
        extra = job_extra(job_id)
        attempts = len(self.retry_delays) + 1
        for attempt in range(attempts):
            delay = self.retry_delays[attempt] if attempt < len(self.retry_delays) else None
            try:
                response = self.client.request("POST", url, body=data)
            except RequestAborted:
                self.log.error("%s not sent: client closed", what, extra=extra)
                return PostOutcome.FAILED
            except TRANSPORT_ERRORS as exc:
                self.log.warning("%s post failed (%s: %s), attempt %d/%d",
                                 what, type(exc).__name__, exc, attempt + 1, attempts, extra=extra)
            else:
                status = response.status
                if 200 <= status < 300:
                    return PostOutcome.DELIVERED
                if status == 409:
                    self.log.info("%s refused with 409: job no longer held by this worker, dropped",
                                  what, extra=extra)
                    return PostOutcome.STALE
                if status == 429 or status >= 500:
                    self.log.warning("%s post got HTTP %d, attempt %d/%d: %s",
                                     what, status, attempt + 1, attempts, response.text(200), extra=extra)
                    if status == 429 and delay is not None:
                        delay = retry_after_seconds(response.headers, delay)
                else:
                    self.log.error("%s rejected with HTTP %d, dropped: %s",
                                   what, status, response.text(), extra=extra)
                    return PostOutcome.REJECTED
            if delay is not None:
                self.sleep(delay)
        self.log.error("%s dropped after %d attempts", what, attempts, extra=extra)
        return PostOutcome.FAILED
