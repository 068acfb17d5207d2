"""``runpod.serverless.utils.rp_cleanup``: remove the folders the download helpers fill.

>>> from vendor_flash.serverless.utils import rp_cleanup
>>> rp_cleanup.clean(["input_objects"])  # doctest: +SKIP
"""

from __future__ import annotations

import os
import shutil
from typing import Iterable, Optional

#: Removed by every :func:`clean`, relative to the current directory, as runpod-python does.
DEFAULT_FOLDERS = ("input_objects", "output_objects", "job_files")


def clean(folder_list: Optional[Iterable[str]] = None) -> None:
    """Remove ``input_objects``, ``output_objects``, ``job_files`` and ``output.zip`` from the
    current directory, then every folder in ``folder_list``. A missing one is skipped.

    ``jobs/<job id>/`` (where :func:`~.rp_download.download_files_from_urls` saves) is removed
    only when listed, as with runpod-python.
    """
    for folder in (*DEFAULT_FOLDERS, *(folder_list or ())):
        shutil.rmtree(folder, ignore_errors=True)
    if os.path.isfile("output.zip"):
        os.remove("output.zip")
