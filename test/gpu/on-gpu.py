#!/usr/bin/env python3
"""End-to-end check of flashd on a machine with a real NVIDIA GPU (stdlib only).

Not part of `npm test` (CI has no GPU). Run it on a GPU host from the repository root:

    node build/bundle.mjs && python3 test/gpu/on-gpu.py --out /tmp/gpu-check
    python3 test/gpu/on-gpu.py --flashd dist/flashd --out /tmp/gpu-check   # the single binary

It records what nvidia-smi prints (the two calls discovery makes, plus -L and -q) under
OUT/recording/, starts flashd with the process runtime on a fresh data directory, and checks:

  1. discovery: the catalogs list every GPU nvidia-smi lists, with the driver's CUDA version;
  2. a GPU endpoint's first job cold-starts a worker that gets exactly one GPU, by UUID in
     CUDA_VISIBLE_DEVICES, and (with PyTorch) computes on it correctly;
  3. the warm worker takes the next job; the catalog shows the GPU held;
  4. an endpoint asking for more GPUs than the host has, and one whose GPU is held by another
     endpoint's worker, wait throttled with the reason in their log, and lose no job;
  5. once the first endpoint's worker idles out, the waiting endpoint gets the GPU;
  6. SIGTERM stops flashd with exit 0, its workers gone and no process left on the GPU;
  7. a flashd started while nvidia-smi still fails (a driver not loaded yet) finds the GPUs once
     it answers (`--gpu-rediscover-ms`), through a wrapper that fails until a file exists.

Prints one line per check and a JSON report (OUT/report.json); exits 1 if any check failed.
"""
import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
QUERY = ["--query-gpu=index,uuid,name,memory.total,driver_version", "--format=csv,noheader,nounits"]
KEY = "gpu-check-admin-key-0123456789abcdef"

report = {"checks": [], "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def check(name, ok, detail=None):
    report["checks"].append({"name": name, "ok": bool(ok), "detail": detail})
    print(f"{'ok  ' if ok else 'FAIL'} {name}" + (f": {detail}" if detail is not None else ""), flush=True)
    return ok


def call(port, method, path, body=None, timeout=30):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                                 headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            return r.status, (json.loads(raw) if raw else None)
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw)
        except ValueError:
            return e.code, raw.decode(errors="replace")


def until(what, fn, timeout=60, every=0.2):
    end = time.monotonic() + timeout
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() > end:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(every)


def record(out):
    rec = os.path.join(out, "recording")
    os.makedirs(rec, exist_ok=True)
    runs = {"nvidia-smi.txt": [], "query-gpu.csv": QUERY, "nvidia-smi-L.txt": ["-L"], "nvidia-smi-q.txt": ["-q"]}
    for name, args in runs.items():
        p = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=60)
        with open(os.path.join(rec, name), "w") as f:
            f.write(p.stdout)
        if p.returncode != 0 and name in ("nvidia-smi.txt", "query-gpu.csv"):
            raise RuntimeError(f"nvidia-smi {' '.join(args)} exited {p.returncode}: {p.stderr.strip()}")
    rows = []
    for line in open(os.path.join(rec, "query-gpu.csv")).read().splitlines():
        if line.strip():
            cells = [c.strip() for c in line.split(",")]
            rows.append({"index": int(cells[0]), "uuid": cells[1], "name": ",".join(cells[2:-2]).strip(),
                         "memoryMiB": int(cells[-2]), "driver": cells[-1]})
    head = open(os.path.join(rec, "nvidia-smi.txt")).read()
    cuda = head.split("CUDA Version:")[1].split()[0] if "CUDA Version:" in head else None
    return rows, cuda


def gpu_procs():
    p = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader"],
                       capture_output=True, text=True, timeout=60)
    return [line for line in p.stdout.splitlines() if line.strip()]


def system_lines(port, ep):
    status, lines = call(port, "GET", f"/v2/serverless/{ep}/logs")
    return [l["line"] for l in lines if l.get("stream") == "system"] if status == 200 else []


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--flashd", default="node dist/flashd.mjs", help="command that runs flashd (default: %(default)s)")
    ap.add_argument("--out", required=True, help="folder for the recording, flashd's log and report.json")
    ap.add_argument("--port", type=int, default=18931)
    ap.add_argument("--matmul-n", type=int, default=8192)
    args = ap.parse_args()
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)

    t0 = time.monotonic()
    gpus, cuda = record(out)
    report["nvidiaSmi"] = {"gpus": gpus, "cudaVersion": cuda}
    print(f"nvidia-smi: {len(gpus)} GPU(s) {[g['name'] for g in gpus]}, driver {gpus[0]['driver'] if gpus else '?'}, CUDA {cuda}", flush=True)
    if not gpus:
        check("nvidia-smi lists a GPU", False)
        return finish(out)

    data = tempfile.mkdtemp(prefix="flashd-gpu-check-")
    env = {**os.environ, "FLASHD_ADMIN_API_KEY": KEY}
    cmd = [*shlex.split(args.flashd), "--data-dir", data, "--port", str(args.port), "--runtime", "process",
           "--process-workdir", REPO, "--log-format", "text"]
    log_path = os.path.join(out, "flashd.log")
    log = open(log_path, "w")
    flashd = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        until("flashd to listen", lambda: flashd.poll() is None and ping(args.port) or (flashd.poll() is not None and fail_start(log_path)), 90)
        report["startS"] = round(time.monotonic() - t0, 2)
        run_checks(args, gpus, cuda)
    except Exception as e:  # a check that could not run is a failed check
        check("the checks ran to the end", False, f"{type(e).__name__}: {e}")
    finally:
        stop(flashd, gpus)
        log.close()
        shutil.rmtree(data, ignore_errors=True)
    late_driver(args, gpus, out)
    return finish(out)


def late_driver(args, gpus, out):
    """Check 7: GPUs found by rediscovery once nvidia-smi starts answering."""
    work = tempfile.mkdtemp(prefix="flashd-gpu-late-")
    flag = os.path.join(work, "driver-loaded")
    real = shutil.which("nvidia-smi")
    wrapper = os.path.join(work, "bin", "nvidia-smi")
    os.makedirs(os.path.dirname(wrapper))
    with open(wrapper, "w") as f:
        f.write(f"""#!/bin/sh
if [ -e {shlex.quote(flag)} ]; then exec {shlex.quote(real)} "$@"; fi
echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running."
exit 9
""")
    os.chmod(wrapper, 0o755)
    env = {**os.environ, "FLASHD_ADMIN_API_KEY": KEY, "PATH": os.path.dirname(wrapper) + os.pathsep + os.environ.get("PATH", "")}
    # Port 0: flashd binds a free one and logs it (args.port + 1 could be any process's port).
    cmd = [*shlex.split(args.flashd), "--data-dir", os.path.join(work, "data"), "--port", "0", "--runtime", "none",
           "--gpu-rediscover-ms", "1000", "--log-format", "text"]
    log_path = os.path.join(out, "flashd-late-driver.log")
    with open(log_path, "w") as log:
        flashd = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            port = until("flashd to listen", lambda: listening_port(log_path) or (flashd.poll() is not None and fail_start(log_path)), 90)
            total = lambda: sum(t["availability"]["total"] for t in call(port, "GET", "/v2/catalog/gpus?include=AVAILABILITY")[1])
            before = total()
            open(flag, "w").close()
            started = time.monotonic()
            after = until("the GPUs after the driver answers", lambda: total() or None, 30)
            check("a driver that answers only after start is picked up by rediscovery", before == 0 and after == len(gpus),
                  {"before": before, "after": after, "s": round(time.monotonic() - started, 2)})
        except Exception as e:
            check("a driver that answers only after start is picked up by rediscovery", False, f"{type(e).__name__}: {e}")
        finally:
            if flashd.poll() is None:
                os.killpg(flashd.pid, signal.SIGTERM)
                flashd.wait(30)
            shutil.rmtree(work, ignore_errors=True)


def listening_port(log_path):
    """The port flashd logged it listens on (started with --port 0), or None before that line."""
    m = re.search(r"flashd listening url=http://[^\s:]+:(\d+)", open(log_path).read())
    return int(m.group(1)) if m else None


def ping(port):
    try:
        return call(port, "GET", "/healthz", timeout=2)[0] == 200
    except OSError:
        return False


def fail_start(log_path):
    raise RuntimeError("flashd exited during start:\n" + open(log_path).read()[-4000:])


def endpoint(port, name, gpu, workers):
    status, body = call(port, "POST", "/v2/serverless", {
        "name": name, "type": "QUEUE", "image": "local/process-worker:1",
        "args": "python3 -u test/fixtures/workers/cuda.py", "gpu": gpu, "workers": workers,
        "scaling": {"type": "QUEUE_DELAY", "queueDelay": 1},
    })
    if status != 201:
        raise RuntimeError(f"create {name}: {status} {body}")
    return body["id"]


def run_checks(args, gpus, cuda):
    port = args.port
    first = gpus[0]
    # 1. Discovery through the catalogs.
    _, types = call(port, "GET", "/v2/catalog/gpus?include=AVAILABILITY")
    known = {t["id"]: t for t in types}
    mine = known.get(first["name"])
    check("the catalog lists the GPU type nvidia-smi names", mine is not None, first["name"])
    if mine is None:
        return
    same = sum(1 for g in gpus if g["name"] == first["name"])
    check("its availability counts every such GPU, all free", mine["availability"]["total"] == same and mine["availability"]["available"] == same, mine["availability"])
    check("its CUDA versions are the driver's", mine["cudaVersions"] == [cuda], mine["cudaVersions"])
    _, dcs = call(port, "GET", "/v2/catalog/data-centers?include=GPU_AVAILABILITY")
    check("the data center lists it", any(a["gpuTypeId"] == first["name"] for a in dcs[0]["gpuAvailability"]), dcs[0]["gpuAvailability"])
    pool = mine["pool"]
    report["pool"] = pool

    # 2. A cold start on the GPU.
    a = endpoint(port, "gpu-a", {"pools": [pool], "count": 1, "minCudaVersion": cuda}, {"min": 0, "max": 1, "idleTimeout": 5})
    started = time.monotonic()
    status, r = call(port, "POST", f"/v2/{a}/runsync?wait=240000", {"input": {"n": args.matmul_n}}, timeout=250)
    report["coldStart"] = {"wallS": round(time.monotonic() - started, 2), "reply": r}
    ok = status == 200 and isinstance(r, dict) and r.get("status") == "COMPLETED"
    check("the first job cold-starts a worker and completes", ok, {k: r.get(k) for k in ("status", "delayTime", "executionTime", "workerId")} if isinstance(r, dict) else r)
    if not ok:
        return
    o = r["output"]
    uuids = {g["uuid"] for g in gpus}
    check("the worker gets one GPU, by UUID, in CUDA_VISIBLE_DEVICES", o["cudaVisibleDevices"] in uuids, o["cudaVisibleDevices"])
    check("its job URLs name the GPU type", o["gpuInUrl"])
    if o["torch"] is None:
        check("PyTorch in the worker (skipped: not installed)", True, o.get("torchError"))
    else:
        check("CUDA inside the worker sees exactly that GPU", o["cudaAvailable"] and o["deviceCount"] == 1, {k: o.get(k) for k in ("cudaAvailable", "deviceCount")})
        if o.get("deviceUuid"):
            check("torch's device UUID is the one flashd placed", o["deviceUuid"] == o["cudaVisibleDevices"], o["deviceUuid"])
        check("torch names the device as nvidia-smi does", o.get("deviceName") == first["name"], o.get("deviceName"))
        check("a float32 product on the GPU matches the CPU's", o.get("maxAbsError", 1) < 1e-2, o.get("maxAbsError"))
        check("bf16 products ran", (o.get("matmul") or {}).get("tflops", 0) > 0, o.get("matmul"))

    # 3. The warm worker, and the GPU shown as held.
    status, r2 = call(port, "POST", f"/v2/{a}/runsync?wait=60000", {"input": {"n": 2048}}, timeout=70)
    check("the next job runs on the same warm worker", r2.get("status") == "COMPLETED" and r2.get("workerId") == r["workerId"], {k: r2.get(k) for k in ("status", "delayTime", "executionTime", "workerId")})
    report["warm"] = r2
    _, types = call(port, "GET", "/v2/catalog/gpus?include=AVAILABILITY")
    held = next(t for t in types if t["id"] == first["name"])["availability"]
    check("the catalog shows the GPU held while the worker lives", held["available"] == same - 1, held)

    # 4. Endpoints that cannot get a GPU now: they wait, and their log says why.
    too_many = endpoint(port, "gpu-too-many", {"pools": [pool], "count": len(gpus) + 1}, {"min": 0, "max": 1, "idleTimeout": 5})
    _, j1 = call(port, "POST", f"/v2/{too_many}/run", {"input": {}})
    waits = [(too_many, j1["id"], f"no host has {len(gpus) + 1} matching GPUs")]
    if len(gpus) == 1:
        b = endpoint(port, "gpu-b", {"pools": [pool], "count": 1}, {"min": 0, "max": 1, "idleTimeout": 5})
        _, jb = call(port, "POST", f"/v2/{b}/run", {"input": {"n": 2048}})
        waits.append((b, jb["id"], "every matching GPU is held by another worker"))
    for ep, job, reason in waits:
        h = until(f"{ep} throttled", lambda: (lambda s, h: h if h["workers"]["throttled"] >= 1 else None)(*call(port, "GET", f"/v2/{ep}/health")), 20)
        st = call(port, "GET", f"/v2/{ep}/status/{job}")[1]["status"]
        said = [l for l in system_lines(port, ep) if l.startswith("no worker can start")]
        check(f"an endpoint that cannot get its GPU waits, its job {st}, and says why", st == "IN_QUEUE" and len(said) == 1 and reason in said[0],
              {"health": h["workers"], "log": said})

    # 5. The first worker idles out (idleTimeout 5 s); the waiting endpoint gets the GPU.
    if len(gpus) == 1:
        b, jb, _ = waits[1]
        done = until("the waiting endpoint's job", lambda: (lambda s, x: x if x.get("status") in ("COMPLETED", "FAILED") else None)(*call(port, "GET", f"/v2/{b}/status/{jb}")), 120, 0.5)
        check("once the first worker idles out, the waiting endpoint gets the GPU", done["status"] == "COMPLETED" and done["output"]["cudaVisibleDevices"] == o["cudaVisibleDevices"],
              {k: done.get(k) for k in ("status", "delayTime", "executionTime")})
        check("the first endpoint's log says its worker stopped idle", any("idle for" in l for l in system_lines(port, a)))
    call(port, "POST", f"/v2/{too_many}/cancel/{j1['id']}")
    report["logs"] = {ep: system_lines(port, ep) for ep in [a] + [w[0] for w in waits]}


def stop(flashd, gpus):
    if flashd.poll() is None:
        os.killpg(flashd.pid, signal.SIGTERM)
        try:
            code = flashd.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(flashd.pid, signal.SIGKILL)
            code = flashd.wait()
        check("SIGTERM stops flashd with exit 0", code == 0, code)
    else:
        check("flashd ran until stopped", False, flashd.returncode)
    time.sleep(1)
    left = [p for p in os.listdir("/proc") if p.isdigit() and "test/fixtures/workers/cuda.py" in cmdline(p)]
    check("no worker process is left", not left, left)
    procs = gpu_procs()
    check("no process is left on the GPU", not procs, procs)


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def finish(out):
    report["passed"] = all(c["ok"] for c in report["checks"]) and bool(report["checks"])
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump(report, f, indent=2)
    print(f"{sum(c['ok'] for c in report['checks'])}/{len(report['checks'])} checks passed", flush=True)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
