"""Logging for the worker.

Lines go to stdout. When an endpoint id is set (a deployed worker) they are JSON objects
``{"requestId", "message", "level"}`` like runpod-python's, otherwise readable text.
``VENDOR_LOG_FORMAT=text|json`` forces a format; ``VENDOR_LOG_LEVEL`` (or ``RUNPOD_LOG_LEVEL`` /
``RUNPOD_DEBUG_LEVEL``) sets the level (``DEBUG``, ``TRACE``, ``INFO``, ``WARN``, ``ERROR``, or
``NOTSET`` for none, as in runpod-python; default ``INFO``; an unknown name is INFO with a
warning on stderr).
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from typing import Optional
from urllib.parse import urlparse

from .env import env_setting, env_value

LOGGER_NAME = "vendor_flash"
#: runpod-python's TRACE, between DEBUG and INFO.
TRACE = 15
#: runpod-python's NOTSET: nothing is written.
SILENT = logging.CRITICAL + 10
logging.addLevelName(TRACE, "TRACE")
_LEVELS = {"DEBUG": logging.DEBUG, "TRACE": TRACE, "INFO": logging.INFO, "WARN": logging.WARNING,
           "WARNING": logging.WARNING, "ERROR": logging.ERROR, "NOTSET": SILENT}


#: A surrogate code point, which UTF-8 cannot hold: a str decoded with ``errors="surrogateescape"``
#: (``os.fsdecode`` of a file name that is not UTF-8), or a client's string cut inside an emoji.
_SURROGATE = re.compile("[\ud800-\udfff]")


def _json_escape_surrogates(text: str) -> str:
    """JSON text with each surrogate as its ``\\uXXXX`` escape (it only occurs inside a string
    literal), as :func:`.result.encode_body` sends one: the reader's JSON parser gives the same
    string back, and the rest of the line stays as it is. Written as it was, the stream's UTF-8
    encoder raised, and logging dropped the line (``--- Logging error ---`` on stderr)."""
    return _SURROGATE.sub(lambda m: "\\u%04x" % ord(m.group()), text)


def _level(record: logging.LogRecord) -> str:
    """runpod-python's level names: ``WARN``, not ``WARNING``."""
    return "WARN" if record.levelno == logging.WARNING else record.levelname


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "requestId": getattr(record, "job_id", None),
            "message": record.getMessage(),
            "level": _level(record),
        }
        if record.exc_info:
            line["message"] += "\n" + self.formatException(record.exc_info)
        return _json_escape_surrogates(json.dumps(line, ensure_ascii=False))


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        job = getattr(record, "job_id", None)
        # runpod-python's text lines: "INFO    | message", "WARN    | job-id | message".
        prefix = f"{_level(record):<7}| " + (f"{job} | " if job else "")
        text = prefix + record.getMessage()
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        # A surrogate as U+FFFD, what a reader of invalid UTF-8 shows: UTF-8 cannot hold it, and
        # the stream's encoder raised, so logging dropped the line.
        return _SURROGATE.sub("\ufffd", text)


def get_logger() -> logging.Logger:
    """The package logger (configured on first use by :func:`setup`)."""
    return logging.getLogger(LOGGER_NAME)


#: The level settings already warned about (see :func:`_setting_level`): each is told once.
_warned_levels: set = set()


def _setting_level(level: Optional[str]) -> int:
    """The level ``level`` (``--rp_log_level``) or the environment sets; INFO when unset.

    An unknown name (a typo such as ``DEBG``) is INFO too, with one warning on stderr naming the
    setting and the accepted names. runpod-python raises ``ValueError("Invalid debug level")``
    instead; a worker in production keeps running here.
    """
    debug = os.environ.get("RUNPOD_DEBUG_LEVEL")
    setting = (("--rp_log_level", level) if level else env_setting("LOG_LEVEL")
               or (("RUNPOD_DEBUG_LEVEL", debug) if debug else None))
    if setting is None:
        return logging.INFO
    source, value = setting
    number = _LEVELS.get(value.strip().upper())
    if number is None:
        if (source, value) not in _warned_levels:
            _warned_levels.add((source, value))
            print(f"WARN   | {source}={value!r} is not a log level (DEBUG, TRACE, INFO, WARN, WARNING, ERROR or "
                  f"NOTSET, in any case): logging at INFO", file=sys.stderr, flush=True)
        number = logging.INFO
    return number


def setup(level: Optional[str] = None) -> logging.Logger:
    """Configure the package logger once; ``level`` overrides the environment."""
    logger = get_logger()
    logger.setLevel(_setting_level(level))
    if not getattr(logger, "_vendor_flash_configured", False):
        handler = logging.StreamHandler(sys.stdout)
        fmt = (os.environ.get("VENDOR_LOG_FORMAT") or "").lower()
        use_json = fmt == "json" or (fmt != "text" and env_value("ENDPOINT_ID") is not None)
        handler.setFormatter(_JsonFormatter() if use_json else _TextFormatter())
        logger.addHandler(handler)
        logger.propagate = False
        logger._vendor_flash_configured = True  # type: ignore[attr-defined]
    return logger


def ensure_setup() -> logging.Logger:
    """The package logger, configured from the environment if :func:`setup` has not run yet."""
    logger = get_logger()
    if not getattr(logger, "_vendor_flash_configured", False):
        setup()
    return logger


def level_number(name: str, default: int = logging.INFO) -> int:
    """``DEBUG``/``TRACE``/``INFO``/``WARN``/``WARNING``/``ERROR``/``NOTSET`` (any case) as a
    :mod:`logging` level (``NOTSET``: above every level, so nothing is written)."""
    return _LEVELS.get(str(name).strip().upper(), default)


def job_extra(job_id: Optional[str]) -> dict:
    """``extra=`` argument that tags a log line with a job id."""
    return {"job_id": job_id}


def shown_url(url: str) -> str:
    """``url`` for a log line: no query, fragment or user info, which may carry credentials
    (a presigned URL's ``X-Amz-Signature``, ``user:password@``)."""
    try:
        parts = urlparse(url)
    except ValueError:
        return "<unparsable URL>"
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    hidden = " (query hidden)" if parts.query or parts.fragment else ""
    return f"{parts.scheme}://{host}{parts.path}{hidden}" if parts.scheme else f"{parts.path}{hidden}"
