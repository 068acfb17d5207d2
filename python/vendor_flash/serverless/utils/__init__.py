"""Helpers importable under runpod-python's names (``runpod.serverless.utils``).

Only :mod:`.rp_validator` is provided; ``rp_upload``, ``rp_download`` and ``rp_cleanup`` are not.
"""

from .rp_validator import validate

__all__ = ["validate"]
