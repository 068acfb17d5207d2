"""``runpod.serverless.utils.rp_download``: fetch the files a job's input points at.

Standard library only (``urllib``), with runpod-python's names, arguments, return values and
folders:

- :func:`download_files_from_urls` ``(job_id, urls)`` saves each URL to
  ``jobs/<job_id>/downloaded_files/<uuid><ext>`` and returns the absolute paths, ``None`` for a
  URL that is ``None`` or could not be fetched (3 tries);
- :func:`file` ``(url)`` saves one URL to ``job_files/<uuid>.<ext>``, unpacks a ``.zip`` next to
  it, and returns ``{"file_path", "type", "original_name", "extracted_path"}``; it raises on
  failure.

The extension comes from the ``Content-Disposition`` file name, else from the URL path.
"""

from __future__ import annotations

import os
import shutil
import time
import urllib.error
import urllib.request
import uuid
import zipfile
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional, Union
from urllib.parse import unquote, urlparse

from ...version import __version__
from ..log import shown_url

HEADERS = {"User-Agent": f"vendor-flash/{__version__}"}
#: Tries per URL in :func:`download_files_from_urls`, 1 s then 2 s apart.
TRIES = 3


def calculate_chunk_size(file_size: int) -> int:
    """Read size for a body of ``file_size`` bytes: 1 KiB up to 1 MiB, 1 MiB up to 1 GiB, else 10 MiB."""
    if file_size <= 1024 * 1024:
        return 1024
    if file_size <= 1024 * 1024 * 1024:
        return 1024 * 1024
    return 10 * 1024 * 1024


def extract_disposition_params(content_disposition: str) -> Dict[str, str]:
    """``'attachment; filename="a.png"'`` → ``{"filename": "a.png"}`` (keys lower-cased)."""
    params = {}
    for part in content_disposition.split(";"):
        key, sep, value = part.partition("=")
        if sep:
            params[key.strip().lower()] = value.strip().strip('"')
    return params


def _original_name(url: str, headers) -> str:
    disposition = headers.get("Content-Disposition")
    name = extract_disposition_params(disposition).get("filename", "") if disposition else ""
    return os.path.basename(name) or os.path.basename(unquote(urlparse(url).path))


def _fetch(url: str, path_without_ext: str, timeout: float) -> str:
    """GET ``url`` into ``path_without_ext + ext``; return that path. Raises on any failure."""
    request = urllib.request.Request(url, headers=HEADERS)
    with urllib.request.urlopen(request, timeout=timeout) as response:  # raises HTTPError on 4xx/5xx
        ext = os.path.splitext(_original_name(url, response.headers))[1]
        try:
            size = int(response.headers.get("Content-Length") or 0)
        except ValueError:
            size = 0
        path = path_without_ext + ext
        with open(path, "wb") as out:
            shutil.copyfileobj(response, out, calculate_chunk_size(size))
    return path


def download_files_from_urls(job_id: str, urls: Union[str, List[Optional[str]]]) -> List[Optional[str]]:
    """Download one URL or a list of them, in parallel, into
    ``jobs/<job_id>/downloaded_files/``; return the absolute path of each file, in order, or
    ``None`` where the URL was ``None`` or failed 3 times (the failure is printed)."""
    directory = os.path.abspath(os.path.join("jobs", str(job_id), "downloaded_files"))
    os.makedirs(directory, exist_ok=True)

    def one(url: Optional[str]) -> Optional[str]:
        if url is None:
            return None
        target = os.path.join(directory, str(uuid.uuid4()))
        for attempt in range(TRIES):
            try:
                return os.path.abspath(_fetch(url, target, timeout=5))
            except (urllib.error.URLError, OSError, ValueError) as exc:
                if attempt + 1 == TRIES:
                    print(f"Failed to download {shown_url(url)}: {exc}", flush=True)
                    return None
                time.sleep(2 ** attempt)
        return None

    if isinstance(urls, str):
        urls = [urls]
    with ThreadPoolExecutor() as pool:
        return list(pool.map(one, urls))


def file(file_url: str) -> Dict[str, Optional[str]]:
    """Download ``file_url`` into ``job_files/`` under a random name (keeping its extension) and
    unpack it when it is a ``.zip``. Returns ``{"file_path": abs path, "type": extension
    without the dot, "original_name": ..., "extracted_path": abs folder or None}``. Raises
    ``urllib.error.URLError`` (``HTTPError`` for a 4xx/5xx) when it cannot be fetched."""
    os.makedirs("job_files", exist_ok=True)
    request = urllib.request.Request(file_url, headers=HEADERS)
    with urllib.request.urlopen(request, timeout=30) as response:
        original_name = _original_name(file_url, response.headers)
        file_type = os.path.splitext(original_name)[1].lstrip(".")
        name = str(uuid.uuid4())
        path = os.path.join("job_files", f"{name}.{file_type}")
        with open(path, "wb") as out:
            shutil.copyfileobj(response, out, 1024 * 1024)
    extracted = None
    if file_type == "zip":
        extracted = os.path.join("job_files", name)
        os.makedirs(extracted, exist_ok=True)
        with zipfile.ZipFile(path) as archive:
            archive.extractall(extracted)  # zipfile drops absolute and ".." parts of member names
        extracted = os.path.abspath(extracted)
    return {"file_path": os.path.abspath(path), "type": file_type, "original_name": original_name,
            "extracted_path": extracted}
