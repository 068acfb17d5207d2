"""``RunPodLogger``: runpod-python's logger class, writing through the SDK's own log.

Lines go where the SDK's log lines go (stdout), in the same format: JSON
``{"requestId", "message", "level"}`` when an endpoint id is set, else text. The level follows the
SDK's (``VENDOR_LOG_LEVEL`` / ``RUNPOD_LOG_LEVEL`` / ``RUNPOD_DEBUG_LEVEL`` / ``--rp_log_level``)
unless :meth:`RunPodLogger.set_level` is called.
"""

from __future__ import annotations

from typing import Any, Optional

from ..log import ensure_setup, job_extra, level_number


class RunPodLogger:
    """``log.debug/info/warn/error(message, request_id=None)`` and ``log.log(message, level)``."""

    _instance: Optional["RunPodLogger"] = None
    _level: Optional[int] = None

    def __new__(cls) -> "RunPodLogger":
        # one shared instance, as in runpod-python: a level set anywhere applies everywhere
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def set_level(self, new_level: str) -> None:
        """Only messages at ``new_level`` (``DEBUG``, ``INFO``, ``WARN``, ``ERROR``) or above are written."""
        type(self)._level = level_number(new_level)
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


__all__ = ["RunPodLogger"]
