"""Helpers importable under runpod-python's names (``runpod.serverless.utils``).

:mod:`.rp_validator` (``validate``), :mod:`.rp_download` (``download_files_from_urls``,
``file``), :mod:`.rp_upload` (S3-compatible uploads, signed here with the standard library),
:mod:`.rp_cleanup` (``clean``) and :mod:`.rp_debugger` (``LineTimer``, ``FunctionTimer``).
"""

from . import rp_cleanup, rp_debugger, rp_download, rp_upload, rp_validator
from .rp_download import download_files_from_urls
from .rp_upload import upload_file_to_bucket, upload_in_memory_object
from .rp_validator import validate

__all__ = ["validate", "download_files_from_urls", "upload_file_to_bucket", "upload_in_memory_object",
           "rp_cleanup", "rp_debugger", "rp_download", "rp_upload", "rp_validator"]
