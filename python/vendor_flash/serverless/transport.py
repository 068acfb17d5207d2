"""Posting results, stream chunks and progress to flashd, with the retry rules of the contract.

* 2xx: delivered.
* 409: the job no longer belongs to this worker (a stale attempt): dropped, never retried.
* 429, 5xx and transport errors: retried with backoff (runpod-python drops a result on a
  connection error; flashd asks workers to retry). Progress updates are retried for about
  7.5 s. Final results and stream chunks are retried much longer (5 minutes by default, the
  wait between attempts doubling up to 10 s), so a flashd restart does not cost a re-run.
* any other 4xx: not retried (retrying would not help). For a final result, a small error
  result is posted instead, so the job ends FAILED rather than being run again after its lease
  (see :meth:`Transport.deliver_result`).
"""

from __future__ import annotations

import enum
import re
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Sequence

from . import result as results
from .env import WorkerEnv
from .http import TRANSPORT_ERRORS, HttpClient, HttpResponse, RequestAborted
from .log import get_logger, job_extra

#: Waits between the first attempts of a post (so 5 attempts in about 7.5 s).
DEFAULT_RETRY_DELAYS = (0.5, 1.0, 2.0, 4.0)
#: How long a final result or a stream chunk keeps being retried, in seconds.
FINAL_RETRY_SECONDS = 300.0
#: The longest wait between two attempts of a final result or stream chunk, in seconds.
FINAL_RETRY_DELAY_CAP = 10.0


class ChunkNotEncodable(TypeError, ValueError):
    """A stream chunk that cannot be encoded as JSON (:func:`result.encode_body` refused it);
    ``str()`` is the encoder's message. A TypeError and a ValueError, as that function raises."""


class PostOutcome(enum.Enum):
    """What happened to a post."""

    DELIVERED = "delivered"
    STALE = "stale"  # 409: the job belongs to another attempt now
    REJECTED = "rejected"  # other 4xx
    FAILED = "failed"  # retries exhausted (or given up: the job is no longer held here)


def _says_discarded(response: Any) -> bool:
    """Whether a 2xx body is flashd's ``{"ok": true, "discarded": true, ...}``."""
    if b'"discarded"' not in response.body:
        return False
    try:
        body = response.json()
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("discarded") is True


@dataclass
class Delivery:
    """The fate of one post, with what is needed to explain a failure."""

    outcome: PostOutcome
    size: int = 0  # bytes in the body
    status: Optional[int] = None  # the last HTTP status, None when no answer came
    detail: str = ""  # the server's reason or the last transport error
    attempts: int = 0
    elapsed: float = 0.0
    substituted: bool = False  # the body was not JSON: an error result was sent in its place
    fallback: Optional[PostOutcome] = None  # set when an error result replaced a refused one
    #: A 2xx saying ``"discarded": true``: flashd had already ended the job (cancel, timeout).
    discarded: bool = False

    @property
    def delivered(self) -> bool:
        """True on a 2xx."""
        return self.outcome is PostOutcome.DELIVERED

    def reason(self) -> str:
        """Why the body was not delivered, in words."""
        if self.status == 413:
            limit = _limit_from(self.detail)
            if limit is not None:
                return f"too large: {self.size} bytes, the limit is {limit} bytes (HTTP 413)"
            return f"too large: {self.size} bytes, refused with HTTP 413" + (f": {self.detail}" if self.detail else "")
        if self.outcome is PostOutcome.REJECTED:
            return f"refused with HTTP {self.status}" + (f": {self.detail}" if self.detail else "")
        if self.outcome is PostOutcome.STALE:
            return "the job belongs to another attempt (HTTP 409)"
        last = f"HTTP {self.status}" if self.status is not None else "no answer"
        return (f"not delivered after {self.attempts} attempt{'s' if self.attempts != 1 else ''} "
                f"in {self.elapsed:.0f} s ({last}" + (f": {self.detail}" if self.detail else "") + ")")


def _limit_from(detail: str) -> Optional[int]:
    match = re.search(r"(\d+) bytes", detail or "")
    return int(match.group(1)) if match else None


def _problem_detail(response: HttpResponse) -> str:
    """The human part of an error answer: ``detail`` or ``title`` of a problem body, else text."""
    try:
        payload = response.json()
    except ValueError:
        payload = None
    if isinstance(payload, dict):
        for key in ("detail", "title", "error", "message"):
            value = payload.get(key)
            if isinstance(value, str) and value:
                return value[:300]
    return response.line(300)


def retry_after_seconds(headers: Dict[str, str], default: float) -> float:
    """Seconds from a ``Retry-After`` header (integer seconds), else ``default``; capped at 30."""
    value = headers.get("retry-after")
    try:
        return min(30.0, max(0.0, float(value))) if value is not None else default
    except ValueError:
        return default


def undeliverable_result(delivery: Delivery, stop_pod: bool = False) -> Dict[str, Any]:
    """The small error result posted when a final result cannot be delivered."""
    if delivery.status == 413:
        message = f"output too large: {delivery.reason()[len('too large: '):]}"
    else:
        message = f"result could not be delivered: {delivery.reason()}"
    body: Dict[str, Any] = {"error": message}
    if stop_pod:
        body["stopPod"] = True
    return body


class Transport:
    """Sends job-done, job-stream and progress bodies for one worker."""

    def __init__(
        self,
        env: WorkerEnv,
        client: Optional[HttpClient] = None,
        retry_delays: Sequence[float] = DEFAULT_RETRY_DELAYS,
        sleep: Callable[[float], None] = time.sleep,
        timeout: float = 60.0,
        final_retry_seconds: float = FINAL_RETRY_SECONDS,
        final_delay_cap: float = FINAL_RETRY_DELAY_CAP,
    ):
        self.env = env
        self.client = client or HttpClient(env.api_key, timeout=timeout, max_idle=32)
        self.retry_delays = tuple(retry_delays)
        self.sleep = sleep
        self.final_retry_seconds = final_retry_seconds
        self.final_delay_cap = final_delay_cap
        self.log = get_logger()

    # -- final results ----------------------------------------------------------------------

    def deliver_result(
        self,
        job_id: str,
        body: Dict[str, Any],
        is_stream: bool = False,
        still_held: Optional[Callable[[], bool]] = None,
    ) -> Delivery:
        """POST a final result to job-done (``isStream=true`` ends a generator job).

        A body that cannot be encoded as JSON is replaced by an error result, so the job ends
        FAILED instead of hanging until its timeout. Connection errors, 429 and 5xx are retried
        for :attr:`final_retry_seconds` while ``still_held()`` is true. When the server refuses
        the result (a 4xx other than 409, e.g. 413 for a result over its size limit) or the
        retries run out, a small error result is posted in its place (``Delivery.fallback``).
        """
        substituted = False
        try:
            data = results.encode_body(body)
        except (TypeError, ValueError) as exc:
            self.log.error("result is not JSON serialisable: %s", exc, extra=job_extra(job_id))
            replacement = results.unencodable_result(exc, self.env.report_worker_id, self.env.hostname)
            if body.get("stopPod"):
                replacement["stopPod"] = True
            data = results.encode_body(replacement)
            substituted = True
        url = self.env.job_done_url(job_id, is_stream)
        delivery = self.send(url, data, job_id, "result", final=True, still_held=still_held)
        delivery.substituted = substituted
        if delivery.outcome in (PostOutcome.REJECTED, PostOutcome.FAILED) and (still_held is None or still_held()):
            fallback = undeliverable_result(delivery, bool(body.get("stopPod")))
            self.log.error("result not delivered: posting an error result instead: %s", fallback["error"],
                           extra=job_extra(job_id))
            delivery.fallback = self.send(url, results.encode_body(fallback), job_id, "error result",
                                          still_held=still_held).outcome
        return delivery

    def post_done(self, job_id: str, body: Dict[str, Any], is_stream: bool = False) -> PostOutcome:
        """:meth:`deliver_result`, returning only what happened to the result itself."""
        return self.deliver_result(job_id, body, is_stream).outcome

    # -- stream chunks and progress ---------------------------------------------------------

    def deliver_chunk(self, job_id: str, chunk: Any, still_held: Optional[Callable[[], bool]] = None,
                      number: Optional[int] = None) -> Delivery:
        """POST one generator chunk to job-stream, retried like a final result.

        ``number``: the chunk's number in its job (1, 2, …), sent as ``chunk=N``: every attempt
        carries the same one, so flashd stores a chunk whose first answer was lost only once.
        Raises :class:`ChunkNotEncodable` (a TypeError and a ValueError) if the chunk is not JSON.
        """
        try:
            data = results.encode_body({"output": chunk})
        except (TypeError, ValueError) as exc:
            raise ChunkNotEncodable(str(exc)) from exc
        return self.send(self.env.job_stream_url(job_id, number), data, job_id, "stream chunk", final=True,
                         still_held=still_held)

    def post_stream(self, job_id: str, chunk: Any) -> PostOutcome:
        """:meth:`deliver_chunk`, returning the outcome only."""
        return self.deliver_chunk(job_id, chunk).outcome

    def post_progress(self, job_id: str, progress: Any) -> PostOutcome:
        """POST ``{"status": "IN_PROGRESS", "output": progress}`` to job-done (``isStream=false``)."""
        return self.post_progress_data(job_id, results.encode_body({"status": "IN_PROGRESS", "output": progress}))

    def post_progress_data(self, job_id: str, data: bytes) -> PostOutcome:
        """POST an already encoded progress body (short retries: a newer update may follow)."""
        return self.post(self.env.job_done_url(job_id, False), data, job_id, "progress")

    # -- the retry loop ---------------------------------------------------------------------

    def post(self, url: str, data: bytes, job_id: str, what: str) -> PostOutcome:
        """POST ``data`` to ``url`` with the short retry window; returns the outcome."""
        return self.send(url, data, job_id, what).outcome

    def _next_delay(self, attempt: int, previous: float, final: bool, elapsed: float) -> Optional[float]:
        """The wait before attempt ``attempt + 1`` (0-based ``attempt`` just failed), or None to give up."""
        if attempt < len(self.retry_delays):
            return self.retry_delays[attempt]
        if not final or elapsed >= self.final_retry_seconds:
            return None
        return min(self.final_delay_cap, max(previous * 2, 0.5))

    def send(
        self,
        url: str,
        data: bytes,
        job_id: str,
        what: str,
        final: bool = False,
        still_held: Optional[Callable[[], bool]] = None,
    ) -> Delivery:
        """POST ``data`` to ``url`` with the retry rules above.

        ``final``: keep retrying for :attr:`final_retry_seconds` instead of the short window.
        ``still_held``: checked before each retry; when it turns false the post is given up.
        """
        extra = job_extra(job_id)
        # as runpod-python: the job id as the request id (flashd uses it in its log lines and as
        # an error answer's "instance"); left out for an id no header can carry
        headers = {"X-Request-ID": job_id} if job_id.isascii() and job_id.isprintable() else None
        started = time.monotonic()
        slept = 0.0
        delay = 0.0
        attempt = 0
        status: Optional[int] = None
        detail = ""

        def result(outcome: PostOutcome, discarded: bool = False) -> Delivery:
            return Delivery(outcome, size=len(data), status=status, detail=detail, attempts=attempt + 1,
                            elapsed=max(time.monotonic() - started, slept), discarded=discarded)

        while True:
            retry_after: Optional[float] = None
            try:
                response = self.client.request("POST", url, body=data, headers=headers)
            except RequestAborted:
                self.log.error("%s not sent: client closed", what, extra=extra)
                detail = "client closed"
                return result(PostOutcome.FAILED)
            except TRANSPORT_ERRORS as exc:
                status, detail = None, f"{type(exc).__name__}: {exc}"
                self.log.warning("%s post failed (%s), attempt %d", what, detail, attempt + 1, extra=extra)
            else:
                status = response.status
                if 200 <= status < 300:
                    return result(PostOutcome.DELIVERED, _says_discarded(response))
                detail = _problem_detail(response)
                if status == 409:
                    self.log.info("%s refused with 409: job no longer held by this worker, dropped",
                                  what, extra=extra)
                    return result(PostOutcome.STALE)
                if status == 429 or status >= 500:
                    self.log.warning("%s post got HTTP %d, attempt %d: %s", what, status, attempt + 1,
                                     detail, extra=extra)
                    if status == 429:
                        retry_after = retry_after_seconds(response.headers, -1.0)
                else:
                    self.log.error("%s (%d bytes) refused with HTTP %d, not retried: %s", what, len(data),
                                   status, detail, extra=extra)
                    return result(PostOutcome.REJECTED)
            elapsed = max(time.monotonic() - started, slept)
            delay = self._next_delay(attempt, delay, final, elapsed)
            if delay is None:
                self.log.error("%s dropped after %d attempts in %.1f s", what, attempt + 1, elapsed, extra=extra)
                return result(PostOutcome.FAILED)
            if retry_after is not None and retry_after >= 0:
                delay = retry_after
            if still_held is not None and not still_held():
                self.log.info("%s given up: the job is no longer held by this worker", what, extra=extra)
                detail = detail or "the job is no longer held by this worker"
                return result(PostOutcome.FAILED)
            self.sleep(delay)
            slept += delay
            attempt += 1
