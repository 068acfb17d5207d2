"""runpod.serverless.utils helpers a ported worker imports: rp_download, rp_upload, rp_cleanup,
rp_debugger.

Downloads and uploads go over real HTTP on loopback: a small file server, and an S3 stand-in
that keeps what is PUT and checks each request's SigV4 shape. The signatures themselves are
checked against the worked examples in AWS's SigV4 documentation.
"""

import asyncio
import contextlib
import datetime
import hashlib
import hmac
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import unittest
import urllib.request
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlparse

from flashd_harness import PYTHON_DIR
from vendor_flash.serverless.utils import rp_cleanup, rp_debugger, rp_download, rp_upload

AK, SK = "AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
EMPTY_SHA = hashlib.sha256(b"").hexdigest()


class Server:
    """A ThreadingHTTPServer on 127.0.0.1:0 with ``handler`` as its request handler class."""

    def __init__(self, handler):
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class Files(BaseHTTPRequestHandler):
    """GET /named/<anything>: a Content-Disposition name; /plain/<file>; /zip/x.zip; else 404."""

    def log_message(self, *args):
        pass

    def do_GET(self):
        path = urlparse(self.path).path
        if path.startswith("/named/"):
            body, extra = b"named body", {"Content-Disposition": 'attachment; filename="photo.png"'}
        elif path.startswith("/plain/"):
            body, extra = b"plain body", {}
        elif path == "/zip/pack.zip":
            buf = io.BytesIO()
            with zipfile.ZipFile(buf, "w") as archive:
                archive.writestr("inner/a.txt", "A")
            body, extra = buf.getvalue(), {}
        else:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        for key, value in extra.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class FakeS3(BaseHTTPRequestHandler):
    """PUT /<bucket>/<key> stores the body when the SigV4 headers are well formed; GET with
    presigned query parameters returns it."""

    objects = {}
    problems = []

    def log_message(self, *args):
        pass

    def _reply(self, status, body=b""):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_PUT(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        auth = self.headers.get("Authorization", "")
        if hashlib.sha256(body).hexdigest() != self.headers.get("x-amz-content-sha256"):
            self.problems.append("payload hash")
        match = re.match(r"AWS4-HMAC-SHA256 Credential=AK/\d{8}/us-east-1/s3/aws4_request, "
                         r"SignedHeaders=([a-z0-9;-]+), Signature=[0-9a-f]{64}$", auth)
        if not match or not {"host", "x-amz-content-sha256", "x-amz-date"} <= set(match.group(1).split(";")):
            self.problems.append(f"authorization {auth}")
        elif self._signature(match.group(1)) != auth.rsplit("Signature=", 1)[1]:
            self.problems.append(f"signature of {self.path}")
        key = unquote(urlparse(self.path).path)
        FakeS3.objects[key] = (body, self.headers.get("Content-Type"), {k.lower(): v for k, v in self.headers.items()})
        self._reply(200)

    def _signature(self, signed_headers):
        """The SigV4 signature (secret "SK") of this request as S3 computes it: from the path
        exactly as it came on the wire, not from what the client meant."""
        names = signed_headers.split(";")
        canonical = "\n".join(["PUT", self.path, "", "".join(f"{n}:{' '.join(self.headers[n].split())}\n" for n in names),
                               signed_headers, self.headers["x-amz-content-sha256"]])
        stamp = self.headers["x-amz-date"]
        scope = f"{stamp[:8]}/us-east-1/s3/aws4_request"
        to_sign = "\n".join(["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()])
        key = ("AWS4SK").encode()
        for part in (stamp[:8], "us-east-1", "s3", "aws4_request"):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        return hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()

    def do_GET(self):
        parsed = urlparse(self.path)
        query = parse_qs(parsed.query)
        if query.get("X-Amz-Algorithm") != ["AWS4-HMAC-SHA256"] or "X-Amz-Signature" not in query \
                or query.get("X-Amz-Expires") != ["604800"]:
            return self._reply(403)
        stored = FakeS3.objects.get(unquote(parsed.path))
        self._reply(200, stored[0]) if stored else self._reply(404)


class InTempDir(unittest.TestCase):
    def setUp(self):
        self.old_cwd = os.getcwd()
        self.dir = tempfile.mkdtemp(prefix="vf-utils-")
        os.chdir(self.dir)

    def tearDown(self):
        os.chdir(self.old_cwd)
        shutil.rmtree(self.dir, ignore_errors=True)


class AliasTest(unittest.TestCase):
    def test_worker_style_imports_resolve(self):
        # the import lines of runpod's own example workers (worker-faster_whisper, worker-sdxl)
        code = "\n".join([
            "import vendor_flash; vendor_flash.install_runpod_alias()",
            "import runpod",
            "from runpod.serverless.utils import download_files_from_urls, rp_cleanup, rp_debugger, rp_upload, rp_download",
            "from runpod.serverless.utils import upload_file_to_bucket, upload_in_memory_object",
            "from runpod.serverless.utils.rp_upload import upload_image, files, bucket_upload",
            "from runpod.serverless.utils.rp_download import file",
            "import runpod.serverless.utils.rp_cleanup as c",
            "print(c.clean is rp_cleanup.clean, download_files_from_urls is rp_download.download_files_from_urls)",
        ])
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNPOD_", "VENDOR_"))}
        env["PYTHONPATH"] = PYTHON_DIR
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30)
        self.assertEqual(out.stdout.splitlines(), ["True True"], out.stderr)


class DownloadTest(InTempDir):
    @classmethod
    def setUpClass(cls):
        cls.server = Server(Files)

    @classmethod
    def tearDownClass(cls):
        cls.server.close()

    def test_download_files_from_urls(self):
        base = self.server.url
        tries = rp_download.TRIES
        rp_download.TRIES = 1
        try:
            paths = rp_download.download_files_from_urls("job-1", [f"{base}/named/x", f"{base}/plain/b.txt", None,
                                                                    f"{base}/missing.bin"])
        finally:
            rp_download.TRIES = tries
        folder = os.path.join(self.dir, "jobs", "job-1", "downloaded_files")
        self.assertEqual(os.path.dirname(paths[0]), os.path.realpath(folder) if paths[0].startswith("/private") else folder)
        self.assertTrue(paths[0].endswith(".png") and paths[1].endswith(".txt"), paths)
        self.assertEqual(paths[2:], [None, None])
        with open(paths[0], "rb") as fh:
            self.assertEqual(fh.read(), b"named body")
        self.assertEqual(len(rp_download.download_files_from_urls("job-1", f"{base}/plain/c.txt")), 1)

    def test_failed_download_line_hides_credentials(self):
        tries = rp_download.TRIES
        rp_download.TRIES = 1
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                url = f"http://user:pw-secret@{self.server.url[len('http://'):]}/missing.bin?X-Amz-Signature=sig-secret#frag"
                self.assertEqual(rp_download.download_files_from_urls("job-2", [url]), [None])
        finally:
            rp_download.TRIES = tries
        line = out.getvalue()
        self.assertIn("Failed to download http://127.0.0.1:", line)
        self.assertIn("/missing.bin (query hidden)", line)
        self.assertNotIn("secret", line)

    def test_file_unpacks_a_zip(self):
        out = rp_download.file(f"{self.server.url}/zip/pack.zip")
        self.assertEqual((out["type"], out["original_name"]), ("zip", "pack.zip"))
        self.assertTrue(out["file_path"].startswith(os.path.join(self.dir, "job_files")))
        with open(os.path.join(out["extracted_path"], "inner", "a.txt")) as fh:
            self.assertEqual(fh.read(), "A")
        with self.assertRaises(OSError):
            rp_download.file(f"{self.server.url}/nothing")


class CleanupTest(InTempDir):
    def test_clean(self):
        for folder in ("input_objects", "output_objects", "job_files", "mine", "kept"):
            os.makedirs(os.path.join(folder, "sub"))
        open("output.zip", "w").close()
        rp_cleanup.clean(["mine", "not-there"])
        self.assertEqual(sorted(os.listdir(".")), ["kept"])
        rp_cleanup.clean()  # nothing left to remove: no error


class DebuggerTest(unittest.TestCase):
    def test_timers(self):
        rp_debugger.clear_debugger_output()

        @rp_debugger.FunctionTimer
        def predict(x):
            with rp_debugger.LineTimer("inner_step"):
                return x * 2

        @rp_debugger.FunctionTimer
        async def apredict(x):
            return x + 1

        self.assertEqual(predict(2), 4)
        self.assertEqual(predict(3), 6)  # a name timed again (the next job) is fine
        self.assertEqual(asyncio.run(apredict(1)), 2)
        self.assertEqual(predict.__name__, "predict")
        out = rp_debugger.get_debugger_output()
        self.assertEqual([c["name"] for c in out["timestamps"]], ["predict", "inner_step", "predict", "inner_step", "apredict"])
        self.assertTrue(all(c["duration_ms"] >= 0 and c["start"] <= c["end"] for c in out["timestamps"]))
        self.assertIn("python_version", out["system_info"])
        self.assertEqual(rp_debugger.get_debugger_output()["timestamps"], [])  # read once, then cleared


class SigV4Test(unittest.TestCase):
    """The worked examples of https://docs.aws.amazon.com/AmazonS3/latest/API/sig-v4-header-based-auth.html
    and sigv4-query-string-auth.html (bucket examplebucket, 24 May 2013)."""

    NOW = datetime.datetime(2013, 5, 24, tzinfo=datetime.timezone.utc)

    def test_header_signature(self):
        headers = rp_upload.sign_headers("GET", "https://examplebucket.s3.amazonaws.com/test.txt", {"Range": "bytes=0-9"},
                                         EMPTY_SHA, AK, SK, "us-east-1", self.NOW)
        self.assertEqual(headers["Authorization"],
                         "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
                         "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
                         "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41")

    def test_presigned_url(self):
        url = rp_upload.presign_url("GET", "https://examplebucket.s3.amazonaws.com/test.txt", AK, SK, "us-east-1",
                                    86400, self.NOW)
        query = parse_qs(urlparse(url).query)
        self.assertEqual(query["X-Amz-Signature"], ["aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404"])

    def test_region_from_endpoint(self):
        self.assertEqual(rp_upload.extract_region_from_url("https://bucket.s3.eu-west-2.amazonaws.com"), "eu-west-2")
        self.assertEqual(rp_upload.extract_region_from_url("https://nyc3.digitaloceanspaces.com"), "nyc3")
        self.assertIsNone(rp_upload.extract_region_from_url("http://127.0.0.1:9000"))


class UploadTest(InTempDir):
    @classmethod
    def setUpClass(cls):
        cls.s3 = Server(FakeS3)

    @classmethod
    def tearDownClass(cls):
        cls.s3.close()

    def setUp(self):
        super().setUp()
        FakeS3.objects.clear()
        FakeS3.problems.clear()
        self.creds = {"endpointUrl": self.s3.url, "accessId": "AK", "accessSecret": "SK", "bucketName": "bkt"}
        with open("out image.png", "wb") as fh:
            fh.write(b"\x89PNG fake")
        self.env_before = dict(os.environ)

    def tearDown(self):
        os.environ.clear()
        os.environ.update(self.env_before)
        super().tearDown()

    def fetch(self, url):
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.read()

    def test_upload_file_to_bucket_with_job_s3_config(self):
        url = rp_upload.upload_file_to_bucket("result a&b.png", "out image.png", bucket_creds=self.creds,
                                              bucket_name="bkt", prefix="job-9",
                                              extra_args={"ContentType": "image/png", "Metadata": {"k": "v"}})
        self.assertEqual(FakeS3.problems, [])
        body, content_type, headers = FakeS3.objects["/bkt/job-9/result a&b.png"]
        self.assertEqual((body, content_type, headers.get("x-amz-meta-k")), (b"\x89PNG fake", "image/png", "v"))
        self.assertTrue(url.startswith(f"{self.s3.url}/bkt/job-9/result%20a%26b.png?X-Amz-Algorithm="), url)
        self.assertEqual(self.fetch(url), b"\x89PNG fake")
        with self.assertRaises(ValueError):
            rp_upload.upload_file_to_bucket("x", "out image.png", bucket_creds=self.creds, extra_args={"Nope": 1})

    def test_keys_with_url_delimiters_go_to_that_key(self):
        # "#", "?" and ";" end a URL's path for urlparse: the key must still be sent whole
        for name in ("a#1.png", "b?x=1.png", "c;v.png", "d +é.png"):
            url = rp_upload.upload_in_memory_object(name, name.encode(), bucket_creds=self.creds,
                                                    bucket_name="bkt", prefix="job-7")
            self.assertIn(f"/bkt/job-7/{name}", FakeS3.objects, name)
            self.assertEqual(self.fetch(url), name.encode(), name)
        self.assertEqual(FakeS3.problems, [])

    def test_an_upload_without_content_type_is_stored_as_bytes(self):
        # urllib would otherwise send its form default, and S3 serve the object with it
        rp_upload.upload_in_memory_object("raw.bin", b"\x00", bucket_creds=self.creds, bucket_name="bkt")
        rp_upload.bucket_upload("job-5", ["out image.png"], self.creds)
        self.assertEqual(FakeS3.objects["/bkt/raw.bin"][1], "application/octet-stream")
        self.assertEqual(FakeS3.objects["/bkt/job-5/out image.png"][1], "application/octet-stream")
        self.assertEqual(FakeS3.problems, [])

    def test_upload_in_memory_object_and_bucket_upload(self):
        url = rp_upload.upload_in_memory_object("mem.bin", b"\x00\x01", bucket_creds=self.creds, bucket_name="bkt")
        self.assertEqual(self.fetch(url), b"\x00\x01")
        urls = rp_upload.bucket_upload("job-2", ["out image.png"], self.creds)
        self.assertEqual(urls, [f"{self.s3.url}/bkt/job-2/out image.png"])
        self.assertEqual(FakeS3.objects["/bkt/job-2/out image.png"][0], b"\x89PNG fake")
        self.assertEqual(FakeS3.problems, [])

    def test_upload_image_from_bucket_environment(self):
        os.environ.update(BUCKET_ENDPOINT_URL=self.s3.url, BUCKET_ACCESS_KEY_ID="AK", BUCKET_SECRET_ACCESS_KEY="SK")
        results = [None, None]
        url = rp_upload.upload_image("job-3", "out image.png", 1, results)
        self.assertEqual(results, [None, url])
        (key, (body, content_type, _)), = FakeS3.objects.items()
        self.assertRegex(key, r"^/\d\d-\d\d/job-3/[0-9a-f]{8}\.png$")  # this month's bucket, as runpod-python
        self.assertEqual((body, content_type), (b"\x89PNG fake", "image/png"))
        self.assertEqual(self.fetch(url), b"\x89PNG fake")
        self.assertEqual(len(rp_upload.files("job-3", ["out image.png", "out image.png"])), 2)

    def test_without_credentials_files_are_copied_locally(self):
        for name in ("BUCKET_ENDPOINT_URL", "BUCKET_ACCESS_KEY_ID", "BUCKET_SECRET_ACCESS_KEY"):
            os.environ.pop(name, None)
        path = rp_upload.upload_image("job-4", "out image.png")
        self.assertRegex(path, r"^simulated_uploaded/[0-9a-f]{8}\.png$")
        self.assertEqual(rp_upload.upload_file_to_bucket("r.png", "out image.png"), "local_upload/r.png")
        self.assertEqual(rp_upload.upload_in_memory_object("m.bin", b"m"), "local_upload/m.bin")
        for path in (path, "local_upload/r.png"):
            with open(path, "rb") as fh:
                self.assertEqual(fh.read(), b"\x89PNG fake")


if __name__ == "__main__":
    unittest.main()
