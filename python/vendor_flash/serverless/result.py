"""Turn what a handler returns (or raises) into the body posted to job-done.

The rules are runpod-python's (``rp_job.run_job`` / ``run_job_generator``), so results look the
same to flashd, to clients and to log parsers:

* a ``dict`` output loses its ``error`` and ``refresh_worker`` keys: a truthy ``error`` becomes
  the result's ``error``, a truthy ``refresh_worker`` adds ``"stopPod": true``; what is left is
  the ``output``, dropped when it is ``{}``;
* any other value is wrapped as ``{"output": value}``;
* an exception becomes ``{"error": "<JSON string>"}`` with the keys of :func:`error_info`;
* a generator yields stream chunks; a yielded dict with a truthy ``error`` ends the job with
  ``{"error": str(error)}``; an exception ends it with ``{"error": "handler: … \\ntraceback: …"}``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import traceback
from typing import Any, Dict, List, Optional

from ..version import __version__

#: Value of the ``runpod_version`` key in error reports (kept for log parsers).
SDK_VERSION_TAG = f"vendor-flash/{__version__}"


def _source_dir(module: Any) -> str:
    return os.path.dirname(os.path.realpath(module.__file__))


#: Where the code that carries a job to the handler lives: this module's directory (not its
#: ``utils``), and the stdlib modules it hands work through (a future, the event loop).
#: Frames from there ahead of the handler's own are left out of an error's traceback.
_SDK_DIR = os.path.dirname(os.path.realpath(__file__))
_STDLIB_DISPATCH_DIRS = (_source_dir(concurrent.futures), _source_dir(asyncio))
_dispatch_cache: Dict[str, bool] = {}


def _is_dispatch(filename: str) -> bool:
    known = _dispatch_cache.get(filename)
    if known is None:
        path = os.path.realpath(filename)
        known = (os.path.dirname(path) == _SDK_DIR
                 or any(path.startswith(d + os.sep) for d in _STDLIB_DISPATCH_DIRS))
        _dispatch_cache[filename] = known
    return known


def format_handler_traceback(exc: BaseException) -> str:
    """The traceback of a handler's exception, as runpod-python shows it: one frame of the SDK
    (the call into the handler), then the handler's own frames.

    The SDK hands a handler's call to the main thread or the event loop and raises the exception
    again in the job's thread, which put several SDK and stdlib frames (``_run_single``,
    ``call``, ``raise error``, ``concurrent.futures``' ``result``…) ahead of the handler's. Those
    leading frames are left out but the last; an exception with no frame outside them (raised
    by the SDK itself) keeps its whole traceback.
    """
    tb = exc.__traceback__
    start = tb
    node = tb
    while node is not None and _is_dispatch(node.tb_frame.f_code.co_filename):
        start = node
        node = node.tb_next
    if node is None:  # nothing but SDK frames: show them all
        start = tb
    return "".join(traceback.format_exception(type(exc), exc, start))


def normalize_output(output: Any) -> Dict[str, Any]:
    """Build the job-done body for a non-generator handler's return value.

    >>> normalize_output({"error": "x", "a": 1})
    {'output': {'a': 1}, 'error': 'x'}
    >>> normalize_output({"error": "x"})
    {'error': 'x'}
    >>> normalize_output([1, 2])
    {'output': [1, 2]}
    """
    if isinstance(output, dict):
        output = dict(output)  # do not mutate the handler's object
        error = output.pop("error", None)
        refresh = output.pop("refresh_worker", None)
        result: Dict[str, Any] = {"output": output}
        if error:
            result["error"] = error
        if refresh:
            result["stopPod"] = True
    else:
        result = {"output": output}
    if result.get("output") == {}:
        result.pop("output")
    return result


def error_info(exc: BaseException, worker_id: str = "unknown", hostname: str = "unknown") -> Dict[str, str]:
    """Describe a handler exception with runpod-python's keys.

    Keys: ``error_type`` (``str(type(exc))``, e.g. ``"<class 'ValueError'>"``), ``error_message``
    (``str(exc)``), ``error_traceback``, ``hostname``, ``worker_id``, ``runpod_version`` (here
    ``"vendor-flash/<version>"``) and ``vendor_flash_version`` (the bare version).
    """
    tb = format_handler_traceback(exc)
    return {
        "error_type": str(type(exc)),
        "error_message": str(exc),
        "error_traceback": tb,
        "hostname": hostname,
        "worker_id": worker_id,
        "runpod_version": SDK_VERSION_TAG,
        "vendor_flash_version": __version__,
    }


def exception_result(exc: BaseException, worker_id: str = "unknown", hostname: str = "unknown") -> Dict[str, str]:
    """The job-done body for a handler exception: ``{"error": json.dumps(error_info(...))}``."""
    return {"error": json.dumps(error_info(exc, worker_id, hostname))}


def generator_exception_result(exc: BaseException, message: Optional[str] = None) -> Dict[str, str]:
    """The job-done body for an exception raised inside a generator handler."""
    tb = format_handler_traceback(exc)
    return {"error": f"handler: {exc if message is None else message} \ntraceback: {tb}"}


#: Exceptions that end the process when nothing catches them: a handler raising one fails its
#: job, and the worker then exits (after its other jobs finish) instead of serving more jobs.
PROCESS_EXITS = (SystemExit, KeyboardInterrupt)


def process_exit_code(exc: BaseException) -> Any:
    """What the interpreter would exit with: ``SystemExit.code`` as given, 130 for Ctrl-C."""
    if isinstance(exc, SystemExit):
        return exc.code
    return 130


def exit_status(exc: BaseException) -> int:
    """The numeric exit status for ``exc`` (``None`` -> 0, an int as is, anything else -> 1)."""
    code = process_exit_code(exc)
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    return 1


def describe_exit(exc: BaseException) -> str:
    """A clear message for a handler that raised :data:`PROCESS_EXITS`."""
    status = exit_status(exc)
    if isinstance(exc, SystemExit):
        return (f"SystemExit({exc.code!r}): the handler called sys.exit({exc.code!r}); "
                f"the job failed and the worker exits with status {status}")
    return (f"{type(exc).__name__}: raised by the handler; "
            f"the job failed and the worker exits with status {status}")


def exit_result(exc: BaseException, worker_id: str = "unknown", hostname: str = "unknown",
                stream: bool = False) -> Dict[str, Any]:
    """The job-done body for a handler that raised SystemExit or KeyboardInterrupt.

    Same format as any other handler error (a JSON string with runpod-python's keys, or the
    generator form), with a message that names the exception and the exit code, and
    ``"stopPod": true`` because the worker process ends after this job.
    """
    message = describe_exit(exc)
    if stream:
        body: Dict[str, Any] = generator_exception_result(exc, message)
    else:
        info = error_info(exc, worker_id, hostname)
        info["error_message"] = message
        body = {"error": json.dumps(info)}
    body["stopPod"] = True
    return body


def chunk_error(chunk: Any) -> Optional[Dict[str, str]]:
    """If a yielded value is a dict with a truthy ``error``, return the terminal error body."""
    if isinstance(chunk, dict) and chunk.get("error"):
        return {"error": str(chunk["error"])}
    return None


def stream_final_result(chunks: List[Any], aggregate: bool) -> Dict[str, Any]:
    """The final job-done body of a generator job (posted with ``isStream=true``)."""
    return {"output": list(chunks) if aggregate else []}


#: The most characters of a job's error that :func:`error_summary` keeps.
ERROR_SUMMARY_CHARS = 300


def error_summary(error: Any, limit: int = ERROR_SUMMARY_CHARS) -> str:
    """A job's error (a job-done body's ``error``) for its log line: one line, no traceback.

    A handler exception's JSON report gives ``ValueError: message``; a generator's error
    (``handler: <message> \\ntraceback: …``) its message; any other error (what a handler
    returned) is shown as it is, a non-string as JSON. Runs of whitespace become one space, and
    the text is cut to ``limit`` characters.

    >>> error_summary(exception_result(ValueError("bad"))["error"])
    'ValueError: bad'
    >>> error_summary("handler: boom \\ntraceback: Traceback …")
    'boom'
    >>> error_summary({"code": 7})
    '{"code": 7}'
    """
    text = error if isinstance(error, str) else None
    if text is None:
        try:
            text = json.dumps(error, ensure_ascii=False, default=str)
        except (TypeError, ValueError):
            text = str(error)
    elif text.startswith("handler: ") and " \ntraceback: " in text:
        text = text[len("handler: "):text.index(" \ntraceback: ")]
    elif text.startswith("{") and '"error_type"' in text:
        try:
            info = json.loads(text)
        except ValueError:
            info = None
        if isinstance(info, dict) and isinstance(info.get("error_type"), str):
            kind = info["error_type"]
            if kind.startswith("<class '") and kind.endswith("'>"):
                kind = kind[len("<class '"):-len("'>")]
            message = str(info.get("error_message") or "")
            text = message if message.startswith(kind) else f"{kind}: {message}".rstrip(": ")
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def encode_body(body: Dict[str, Any]) -> bytes:
    """Serialise a body as strict UTF-8 JSON (``NaN``/``Infinity`` are refused).

    A string with a lone surrogate, which UTF-8 cannot hold, is sent as a ``\\uXXXX`` escape
    (the whole body then ASCII-escaped), so it arrives as it was instead of failing the job.

    Raises ``TypeError`` or ``ValueError`` when the body cannot be encoded, including a value
    nested deeper than Python's JSON encoder goes (about 1000 levels, some 10,000 on Python 3.13:
    the encoder raises ``RecursionError``, reported here as ``ValueError``).
    """
    try:
        text = json.dumps(body, ensure_ascii=False, allow_nan=False)
    except RecursionError:
        raise ValueError("nested too deeply to encode as JSON") from None
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate ("\ud83d": a client cut a string inside an emoji, or a file name read
        # with surrogateescape) has no UTF-8 form, but JSON's \u escape holds it: the receiver's
        # JSON parser gives back the same string. Only such text pays for the ASCII escapes.
        return json.dumps(body, ensure_ascii=True, allow_nan=False).encode("ascii")


def unencodable_result(exc: Exception, worker_id: str = "unknown", hostname: str = "unknown") -> Dict[str, str]:
    """The body sent instead of a result that is not JSON-serialisable."""
    wrapped = TypeError(f"handler output is not JSON serialisable: {exc}")
    wrapped.__traceback__ = exc.__traceback__
    return exception_result(wrapped, worker_id, hostname)
