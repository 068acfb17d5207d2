"""The heartbeat process: pings flashd every interval, whatever the handler does.

A handler that holds the GIL (a long C call that does not release it, a regular expression
that backtracks) stops every thread of the worker, so a heartbeat thread would stop pinging
and flashd would take the job back after its lease and run it again. runpod-python pings from
its own process for the same reason; so does this module, run as
``python -m vendor_flash.serverless.heartbeat``.

Protocol, one JSON object per line:

* stdin, first line: the :class:`~vendor_flash.serverless.env.WorkerEnv` fields; then
  ``{"ids": [...], "now": bool}`` whenever the worker's jobs change (``now``: ping at once),
  with ``"stopped": [...]``: jobs the worker stopped on job-stop. The next ping lists them even
  when the ids of a later message, read with it, leave them out (their handler returned at once),
  and then the ping after it, sent at once, goes without them: flashd ends a stop at a ping
  without the job at once only once a ping has listed it.
  End of input, or the worker no longer being its parent (the worker exited, even on SIGKILL,
  and a process it forked holds the pipe), ends the process.
* stdout: one ``{"status": int|null, "body": str, "ids": [...], "error": str}`` per ping that
  failed or got a 4xx/5xx (a 409 names stale jobs), the only ones the worker acts on. Not one
  per ping: the worker cannot read them while a handler holds the GIL, and once the pipe was
  full (about 700 lines) the heartbeat blocked on it and stopped pinging.

SIGTERM and SIGINT are ignored: the worker decides when heartbeats end (after its drain).
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
from typing import List

from .env import WorkerEnv
from .ping import ping, ping_client

#: How often the worker's own liveness is checked: the end of stdin alone misses a worker killed
#: while a process it forked (a multiprocessing pool) still holds the pipe's other end.
PARENT_CHECK_SECONDS = 1.0


def main() -> int:
    """Run the heartbeat until stdin ends."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    fd = sys.stdin.fileno()  # read with os.read only: a buffered reader would hide lines from select
    pending = b""
    env = None
    client = None
    interval = 0.0
    ids: List[str] = []
    stopped: List[str] = []  # listed by the next ping only (see the protocol above)
    next_ping = None  # the first ping goes out with the first list of ids
    parent = os.getppid()
    while True:
        timeout = PARENT_CHECK_SECONDS
        if next_ping is not None:
            timeout = min(timeout, max(0.0, next_ping - time.monotonic()))
        readable, _, _ = select.select([fd], [], [], timeout)
        if os.getppid() != parent:
            return 0  # the worker is gone, though a process it forked may still hold our stdin
        now = False
        if readable:
            chunk = os.read(fd, 65536)
            if not chunk:
                return 0
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                message = json.loads(line)
                if env is None:  # the first line: the worker's environment
                    env = WorkerEnv(**message)
                    interval = env.ping_interval
                    client = ping_client(env)
                    continue
                ids = [str(i) for i in message.get("ids", [])]
                stopped += [str(i) for i in message.get("stopped", []) if str(i) not in stopped]
                now = now or bool(message.get("now")) or next_ping is None
        if env is None or client is None:
            continue
        if now or (next_ping is not None and time.monotonic() >= next_ping):
            once = [i for i in stopped if i not in ids]
            response, error = ping(client, env, ids + once)
            if response is None or response.status >= 400:
                status, body = (None, "") if response is None else (response.status, response.text(2000))
                sys.stdout.write(json.dumps({"status": status, "body": body, "ids": ids, "error": error}) + "\n")
                sys.stdout.flush()
            next_ping = time.monotonic() + interval
            if response is not None:
                stopped = []
                if once:
                    next_ping = time.monotonic()  # the ping without them, at once: it ends their stops


if __name__ == "__main__":
    sys.exit(main())
