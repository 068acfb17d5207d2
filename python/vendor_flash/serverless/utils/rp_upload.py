"""``runpod.serverless.utils.rp_upload``: put a job's files in S3-compatible storage.

Standard library only: requests are signed with AWS Signature Version 4 here, path-style
(``<endpoint>/<bucket>/<key>``, what boto3 does with a custom ``endpoint_url``), and each file
goes up in one ``PUT`` (S3 takes up to 5 GiB that way). Credentials come from ``bucket_creds``
(a job's ``s3Config``: ``endpointUrl``, ``accessId``, ``accessSecret``) or else from
``BUCKET_ENDPOINT_URL``, ``BUCKET_ACCESS_KEY_ID`` and ``BUCKET_SECRET_ACCESS_KEY``. The region
is read from the endpoint URL (``…s3.<region>.…``, ``<region>.digitaloceanspaces.com``), else
``us-east-1``.

With no credentials, as in runpod-python, :func:`upload_image` copies the file to
``simulated_uploaded/`` and :func:`upload_file_to_bucket` (and :func:`upload_in_memory_object`)
to ``local_upload/``, and they return that relative path. Returned URLs are presigned ``GET``
URLs valid for 7 days.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import mimetypes
import os
import shutil
import threading
import time
import urllib.error
import urllib.request
import uuid
from typing import Any, Dict, List, Mapping, Optional, Tuple
from urllib.parse import quote, urlparse

PRESIGN_EXPIRES = 604800  # 7 days, the most SigV4 allows
_EXTRA_ARG_HEADERS = {
    "ACL": "x-amz-acl",
    "CacheControl": "Cache-Control",
    "ContentDisposition": "Content-Disposition",
    "ContentEncoding": "Content-Encoding",
    "ContentLanguage": "Content-Language",
    "ContentType": "Content-Type",
    "StorageClass": "x-amz-storage-class",
}
_CHUNK = 1024 * 1024


def extract_region_from_url(endpoint_url: str) -> Optional[str]:
    """``https://s3.eu-west-2.amazonaws.com`` → ``eu-west-2``; ``https://nyc3.digitaloceanspaces.com`` → ``nyc3``."""
    netloc = urlparse(endpoint_url).netloc
    if ".s3." in endpoint_url:
        return endpoint_url.split(".s3.")[1].split(".")[0]
    if netloc.startswith("s3.") and netloc.count(".") >= 3:
        return netloc.split(".")[1]
    if netloc.endswith(".digitaloceanspaces.com"):
        return netloc.split(".")[0]
    return None


# ------------------------------- SigV4 signing ------------------------------- #

def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode("utf-8"), hashlib.sha256).digest()


def _signing_key(secret: str, day: str, region: str) -> bytes:
    key = _hmac(("AWS4" + secret).encode("utf-8"), day)
    for part in (region, "s3", "aws4_request"):
        key = _hmac(key, part)
    return key


def _canonical_query(params: Mapping[str, str]) -> str:
    return "&".join(f"{quote(k, safe='~')}={quote(str(v), safe='~')}" for k, v in sorted(params.items()))


def _string_to_sign(method: str, path: str, query: Mapping[str, str], headers: Mapping[str, str],
                    payload_hash: str, stamp: str, scope: str) -> Tuple[str, str]:
    canon = {k.lower(): " ".join(str(v).split()) for k, v in headers.items()}
    signed = ";".join(sorted(canon))
    request = "\n".join([method, quote(path or "/", safe="/~"), _canonical_query(query),
                         "".join(f"{k}:{canon[k]}\n" for k in sorted(canon)), signed, payload_hash])
    to_sign = "\n".join(["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(request.encode("utf-8")).hexdigest()])
    return to_sign, signed


def _split(url: str) -> Tuple[str, str, str]:
    """``(scheme, netloc, path)`` of an unencoded URL whose path is everything after the host:
    an object key may hold ``?``, ``#`` or ``;``, which ``urlparse`` would take out of the path."""
    scheme, _, rest = url.partition("://")
    netloc, slash, path = rest.partition("/")
    return scheme, netloc, slash + path


def _stamp(now: Optional[datetime.datetime]) -> Tuple[str, str]:
    now = now or datetime.datetime.now(datetime.timezone.utc)
    return now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")


def sign_headers(method: str, url: str, headers: Dict[str, str], payload_hash: str, access_key: str,
                 secret_key: str, region: str, now: Optional[datetime.datetime] = None) -> Dict[str, str]:
    """Return ``headers`` plus ``Host``, ``x-amz-date``, ``x-amz-content-sha256`` and the SigV4
    ``Authorization`` for a request to the unencoded ``url`` (query parameters not supported)."""
    stamp, day = _stamp(now)
    _, netloc, path = _split(url)
    out = dict(headers, Host=netloc, **{"x-amz-date": stamp, "x-amz-content-sha256": payload_hash})
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign, signed = _string_to_sign(method, path, {}, out, payload_hash, stamp, scope)
    signature = hmac.new(_signing_key(secret_key, day, region), to_sign.encode("utf-8"), hashlib.sha256).hexdigest()
    out["Authorization"] = (f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, SignedHeaders={signed}, "
                            f"Signature={signature}")
    return out


def presign_url(method: str, url: str, access_key: str, secret_key: str, region: str,
                expires: int = PRESIGN_EXPIRES, now: Optional[datetime.datetime] = None) -> str:
    """A presigned URL (SigV4 query parameters, ``host`` signed) for the unencoded ``url``."""
    stamp, day = _stamp(now)
    scheme, netloc, path = _split(url)
    scope = f"{day}/{region}/s3/aws4_request"
    query = {"X-Amz-Algorithm": "AWS4-HMAC-SHA256", "X-Amz-Credential": f"{access_key}/{scope}",
             "X-Amz-Date": stamp, "X-Amz-Expires": str(expires), "X-Amz-SignedHeaders": "host"}
    to_sign, _ = _string_to_sign(method, path, query, {"host": netloc}, "UNSIGNED-PAYLOAD", stamp, scope)
    query["X-Amz-Signature"] = hmac.new(_signing_key(secret_key, day, region), to_sign.encode("utf-8"),
                                        hashlib.sha256).hexdigest()
    return f"{scheme}://{netloc}{quote(path or '/', safe='/~')}?{_canonical_query(query)}"


# --------------------------------- The client -------------------------------- #

class BucketClient:
    """Just enough of an S3 client for this module: ``put_object`` and ``generate_presigned_url``."""

    def __init__(self, endpoint_url: str, access_key: str, secret_key: str, region: Optional[str] = None):
        self.endpoint_url = endpoint_url.rstrip("/")
        self.access_key = access_key
        self.secret_key = secret_key
        self.region = region or extract_region_from_url(endpoint_url) or "us-east-1"

    def object_url(self, bucket: str, key: str) -> str:
        return f"{self.endpoint_url}/{bucket}/{key}"

    def put_object(self, bucket: str, key: str, body: Any, content_type: Optional[str] = None,
                   extra_headers: Optional[Dict[str, str]] = None, tries: int = 3) -> None:
        """Upload ``body`` (bytes, or a path given as ``("file", path)``) with up to ``tries``
        tries on 5xx and connection errors. Raises ``urllib.error.HTTPError`` on a refusal."""
        if isinstance(body, tuple):
            path = body[1]
            digest = hashlib.sha256()
            with open(path, "rb") as fh:
                for chunk in iter(lambda: fh.read(_CHUNK), b""):
                    digest.update(chunk)
            payload_hash, length = digest.hexdigest(), os.path.getsize(path)
        else:
            path, payload_hash, length = None, hashlib.sha256(body).hexdigest(), len(body)
        headers = dict(extra_headers or {})
        if content_type:
            headers["Content-Type"] = content_type
        if not any(name.lower() == "content-type" for name in headers):
            # else urllib sends (unsigned) its form default, application/x-www-form-urlencoded,
            # and the bucket serves the object with it
            headers["Content-Type"] = "application/octet-stream"
        url = self.object_url(bucket, key)
        for attempt in range(tries):
            signed = sign_headers("PUT", url, headers, payload_hash, self.access_key, self.secret_key, self.region)
            signed["Content-Length"] = str(length)
            del signed["Host"]  # urllib sends the same one
            try:
                if path is not None:
                    with open(path, "rb") as fh:
                        self._send(url, fh, signed)
                else:
                    self._send(url, body, signed)
                return
            except urllib.error.HTTPError as exc:
                if exc.code < 500 or attempt + 1 == tries:
                    raise
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if attempt + 1 == tries:
                    raise
            time.sleep(0.5 * 2 ** attempt)

    @staticmethod
    def _send(url: str, data: Any, headers: Dict[str, str]) -> None:
        scheme, netloc, path = _split(url)  # the path exactly as signed (every byte but unreserved ones and "/" escaped)
        wire = f"{scheme}://{netloc}{quote(path, safe='/~')}"
        request = urllib.request.Request(wire, data=data, headers=headers, method="PUT")
        with urllib.request.urlopen(request, timeout=300) as response:
            response.read()

    def generate_presigned_url(self, bucket: str, key: str, expires: int = PRESIGN_EXPIRES) -> str:
        return presign_url("GET", self.object_url(bucket, key), self.access_key, self.secret_key, self.region, expires)


def get_boto_client(bucket_creds: Optional[Mapping[str, str]] = None) -> Tuple[Optional[BucketClient], None]:
    """``(client, None)`` from ``bucket_creds`` or the ``BUCKET_*`` environment, or
    ``(None, None)`` when the endpoint URL, key id or secret is missing. The name and the pair
    are runpod-python's; the client is this module's :class:`BucketClient`, not boto3's."""
    if bucket_creds:
        endpoint, access, secret = (bucket_creds.get("endpointUrl"), bucket_creds.get("accessId"),
                                    bucket_creds.get("accessSecret"))
    else:
        endpoint, access, secret = (os.environ.get("BUCKET_ENDPOINT_URL"), os.environ.get("BUCKET_ACCESS_KEY_ID"),
                                    os.environ.get("BUCKET_SECRET_ACCESS_KEY"))
    if endpoint and access and secret:
        return BucketClient(endpoint, access, secret), None
    return None, None


def _no_bucket(folder: str) -> None:
    print(f"No bucket endpoint set, saving to disk folder '{folder}'", flush=True)
    print("If this is a live endpoint, set BUCKET_ENDPOINT_URL, BUCKET_ACCESS_KEY_ID and "
          "BUCKET_SECRET_ACCESS_KEY (see vendor-flash's README)", flush=True)


def _extra_headers(extra_args: Optional[Mapping[str, Any]]) -> Dict[str, str]:
    headers: Dict[str, str] = {}
    for name, value in (extra_args or {}).items():
        if name == "Metadata":
            headers.update({f"x-amz-meta-{k}": str(v) for k, v in value.items()})
        elif name in _EXTRA_ARG_HEADERS:
            headers[_EXTRA_ARG_HEADERS[name]] = str(value)
        else:
            raise ValueError(f"extra_args {name!r} is not supported; supported: "
                             f"{', '.join(sorted([*_EXTRA_ARG_HEADERS, 'Metadata']))}")
    return headers


# ------------------------------ runpod-python API ----------------------------- #

def upload_image(job_id: str, image_location: str, result_index: int = 0, results_list: Optional[list] = None,
                 bucket_name: Optional[str] = None) -> str:
    """Upload one file as ``<job_id>/<8 random hex><ext>`` to ``bucket_name`` (default: the
    bucket named for this month, ``%m-%y``) and return a presigned URL; without credentials,
    copy it to ``simulated_uploaded/`` and return that path. Also stores the result in
    ``results_list[result_index]`` when a list is given. The bytes go up as they are (runpod-python
    re-encodes images with Pillow first)."""
    image_name = uuid.uuid4().hex[:8]
    extension = os.path.splitext(image_location)[1]
    client, _ = get_boto_client()
    if client is None:
        _no_bucket("simulated_uploaded")
        os.makedirs("simulated_uploaded", exist_ok=True)
        result = f"simulated_uploaded/{image_name}{extension}"
        shutil.copyfile(image_location, result)
    else:
        guessed = mimetypes.guess_type("x" + extension)[0] or ""
        content_type = "image/" + extension.lstrip(".") if guessed.startswith("image/") else "application/octet-stream"
        bucket = bucket_name or time.strftime("%m-%y")
        key = f"{job_id}/{image_name}{extension}"
        client.put_object(bucket, key, ("file", image_location), content_type=content_type)
        result = client.generate_presigned_url(bucket, key)
    if results_list is not None:
        results_list[result_index] = result
    return result


def files(job_id: str, file_list: List[str]) -> List[Optional[str]]:
    """:func:`upload_image` for each file, in parallel; the results in order."""
    results: List[Optional[str]] = [None] * len(file_list)
    threads = [threading.Thread(target=upload_image, args=(job_id, path, index, results))
               for index, path in enumerate(file_list)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def bucket_upload(job_id: str, file_list: List[str], bucket_creds: Mapping[str, str]) -> List[str]:
    """Upload each file as ``<job_id>/<path as given>`` to ``bucket_creds["bucketName"]`` and
    return its plain (unsigned) URL ``<endpointUrl>/<bucketName>/<job_id>/<path>``."""
    client, _ = get_boto_client(bucket_creds)
    if client is None:
        raise ValueError("bucket_creds needs endpointUrl, accessId and accessSecret")
    bucket = str(bucket_creds["bucketName"])
    urls = []
    for path in file_list:
        client.put_object(bucket, f"{job_id}/{path}", ("file", path))
        urls.append(f"{bucket_creds['endpointUrl']}/{bucket}/{job_id}/{path}")
    return urls


def upload_file_to_bucket(file_name: str, file_location: str, bucket_creds: Optional[Mapping[str, str]] = None,
                          bucket_name: Optional[str] = None, prefix: Optional[str] = None,
                          extra_args: Optional[Mapping[str, Any]] = None) -> str:
    """Upload ``file_location`` as ``[<prefix>/]<file_name>`` and return a presigned URL;
    without credentials, copy it to ``local_upload/<file_name>`` and return that path.
    ``extra_args`` takes boto3's ``ContentType``, ``ContentDisposition``, ``ContentEncoding``,
    ``ContentLanguage``, ``CacheControl``, ``ACL``, ``StorageClass`` and ``Metadata``."""
    client, _ = get_boto_client(bucket_creds)
    if client is None:
        _no_bucket("local_upload")
        os.makedirs("local_upload", exist_ok=True)
        local = f"local_upload/{file_name}"
        shutil.copyfile(file_location, local)
        return local
    bucket = bucket_name or time.strftime("%m-%y")
    key = f"{prefix}/{file_name}" if prefix else file_name
    client.put_object(bucket, key, ("file", file_location), extra_headers=_extra_headers(extra_args))
    return client.generate_presigned_url(bucket, key)


def upload_in_memory_object(file_name: str, file_data: bytes, bucket_creds: Optional[Mapping[str, str]] = None,
                            bucket_name: Optional[str] = None, prefix: Optional[str] = None) -> str:
    """Upload ``file_data`` as ``[<prefix>/]<file_name>`` and return a presigned URL; without
    credentials, write it to ``local_upload/<file_name>`` and return that path (runpod-python
    fails there)."""
    client, _ = get_boto_client(bucket_creds)
    if client is None:
        _no_bucket("local_upload")
        os.makedirs("local_upload", exist_ok=True)
        local = f"local_upload/{file_name}"
        with open(local, "wb") as fh:
            fh.write(file_data)
        return local
    bucket = bucket_name or time.strftime("%m-%y")
    key = f"{prefix}/{file_name}" if prefix else file_name
    client.put_object(bucket, key, bytes(file_data))
    return client.generate_presigned_url(bucket, key)
