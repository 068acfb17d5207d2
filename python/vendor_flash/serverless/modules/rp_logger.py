"""``RunPodLogger``: runpod-python's logger class, writing through the SDK's own log.

Lines go where the SDK's log lines go (stdout), in the same format: JSON
``{"requestId", "message", "level"}`` when an endpoint id is set, else text. The level follows the
SDK's (``VENDOR_LOG_LEVEL`` / ``RUNPOD_LOG_LEVEL`` / ``RUNPOD_DEBUG_LEVEL`` / ``--rp_log_level``)
unless :meth:`RunPodLogger.set_level` is called.
"""

from __future__ import annotations

from typing import Any, Optional

from ..log import ensure_setup, job_extra, level_number

#: runpod-python's level names; ``set_level`` also takes an index into this list.
LOG_LEVELS = ["NOTSET", "DEBUG", "TRACE", "INFO", "WARN", "ERROR"]


def _validate_level(level: Any) -> str:
    """A level name from ``LOG_LEVELS`` (``WARNING`` is taken as ``WARN``), or ValueError."""
    if isinstance(level, int) and not isinstance(level, bool):
        if 0 <= level < len(LOG_LEVELS):
            return LOG_LEVELS[level]
    elif isinstance(level, str):
        name = level.strip().upper()
        name = "WARN" if name == "WARNING" else name
        if name in LOG_LEVELS:
            return name
    raise ValueError(f"Invalid debug level: {level}")


class RunPodLogger:
    """``log.debug/trace/info/warn/error(message, request_id=None)`` and ``log.log(message, level)``."""

    _instance: Optional["RunPodLogger"] = None
    _level: Optional[int] = None

    def __new__(cls) -> "RunPodLogger":
        # one shared instance, as in runpod-python: a level set anywhere applies everywhere
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def set_level(self, new_level: Any) -> None:
        """Only messages at ``new_level`` or above are written: a name from :data:`LOG_LEVELS`
        (``NOTSET``: none at all) or its index, as in runpod-python. ValueError for others."""
        type(self)._level = level_number(_validate_level(new_level))
        ensure_setup().setLevel(type(self)._level)  # runpod: the SDK's own lines follow it too

    @property
    def level(self) -> int:
        """The :mod:`logging` level in force."""
        if self._level is not None:
            return self._level
        return ensure_setup().getEffectiveLevel()

    def log(self, message: Any, message_level: str = "INFO", job_id: Optional[str] = None) -> None:
        """Write ``message`` at ``message_level`` (tagged with ``job_id`` when given)."""
        levelno = level_number(message_level)
        if levelno < self.level:
            return
        logger = ensure_setup()
        record = logger.makeRecord(logger.name, levelno, "runpod", 0, str(message), (), None,
                                   extra=job_extra(job_id))
        logger.handle(record)

    def debug(self, message: Any, request_id: Optional[str] = None) -> None:
        self.log(message, "DEBUG", request_id)

    def trace(self, message: Any, request_id: Optional[str] = None) -> None:
        self.log(message, "TRACE", request_id)

    def info(self, message: Any, request_id: Optional[str] = None) -> None:
        self.log(message, "INFO", request_id)

    def warn(self, message: Any, request_id: Optional[str] = None) -> None:
        self.log(message, "WARN", request_id)

    warning = warn

    def error(self, message: Any, request_id: Optional[str] = None) -> None:
        self.log(message, "ERROR", request_id)

    def tip(self, message: Any) -> None:
        """A hint, written at INFO."""
        self.log(f"TIP: {message}", "INFO")

    def secret(self, secret_name: str, secret: Any) -> None:
        """Log that a secret is set, showing only its first and last characters."""
        text = str(secret)
        shown = text[0] + "*" * (len(text) - 2) + text[-1] if len(text) > 2 else "*" * len(text)
        self.info(f"{secret_name}: {shown}")


__all__ = ["RunPodLogger", "LOG_LEVELS"]
