"""Runs the rkv example server (examples/rkv) for its system tests: alone, or
under `rekindle run --listen`; reads its JSON log lines ({"rkv": ...} and
the runtime's {"rekindle": ...}) from stderr; hands out redis-py clients."""

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from supervisor_harness import REKINDLE, free_port

from conftest import BUILD

RKV = BUILD / "examples" / "rkv"
RKV_MALLOC = BUILD / "examples" / "rkv-malloc"


class Rkv:
    """One rkv server with its own directory; stopped by close()."""

    def __init__(self, tmp_path, *args, supervised=False, exe=RKV, env=None, sup=("run",), **popen_kw):
        """popen_kw goes to subprocess.Popen (preexec_fn, for example); sup:
        the supervisor's command and extra options (`restore --from D`, ...)."""
        if not exe.exists():
            pytest.fail(f"{exe} missing: run `make` first")
        self.dir = Path(tmp_path)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.err_path = self.dir / "rkv.err"
        self.events_path = self.dir / "events.jsonl"
        self.env = dict(os.environ)
        for k in ("REKINDLE_MANIFEST_FD", "LISTEN_FDS", "LISTEN_PID", "NOTIFY_SOCKET"):
            self.env.pop(k, None)
        self.env["REKINDLE_RUNTIME_DIR"] = str(self.dir / "run")
        self.env.update(env or {})
        cmd = [str(exe), "--port", str(self.port), "--dir", str(self.dir), *map(str, args)]
        if supervised:
            cmd = [
                str(REKINDLE), *sup, "--name", "rkv", "--events", str(self.events_path),
                "--listen", f"127.0.0.1:{self.port}", "--", *cmd,
            ]  # fmt: skip
        self.err = open(self.err_path, "w")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=self.err, env=self.env, **popen_kw
        )
        try:
            self.wait_log("ready")
        except BaseException:
            self.close()  # a server that never got ready is not left running
            raise

    # ---- log ------------------------------------------------------------------
    def stderr(self):
        if not self.err.closed:
            self.err.flush()
        return self.err_path.read_text()

    def log(self, event=None):
        out = []
        for line in self.stderr().splitlines():
            if line.startswith('{"rkv"'):
                e = json.loads(line)
                if event is None or e["rkv"] == event:
                    out.append(e)
        return out

    def runtime_events(self, kind):
        return [
            json.loads(line)
            for line in self.stderr().splitlines()
            if line.startswith('{"rekindle"') and json.loads(line)["rekindle"] == kind
        ]

    def wait_log(self, event, count=1, timeout=15.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.log(event)
            if len(found) >= count:
                return found[count - 1]
            if self.proc.poll() is not None:
                break
            time.sleep(0.01)
        raise AssertionError(
            f"no {event!r} line #{count} from rkv; stderr:\n{self.stderr()[-4000:]}{self.diagnosis()}"
        )

    def diagnosis(self):
        """For a failure message: the supervisor's last events and where the
        processes' threads sleep (a hang is then readable from the log)."""
        out = ""
        if self.events_path.exists():
            last = self.events_path.read_text().splitlines()[-20:]
            out += "\nsupervisor events (last 20):\n" + "\n".join(last)
        pids = [self.proc.pid]
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        with contextlib.suppress(OSError, ValueError):
            pids += [int(x) for x in children.read_text().split()]
        for pid in pids:
            for task in sorted(Path(f"/proc/{pid}/task").glob("*")):
                try:
                    comm = (task / "comm").read_text().strip()
                    wchan = (task / "wchan").read_text().strip()
                    state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
                except OSError:
                    continue
                out += f"\npid {pid} task {task.name} {comm}: state {state} wchan {wchan}"
        return out

    def ready(self, count=1):
        return self.wait_log("ready", count)

    # ---- clients --------------------------------------------------------------
    def client(self, **kw):
        # No retries: redis-py would send a crashing command (DEBUG SEGFAULT)
        # again to the restarted server.
        return redis.Redis(port=self.port, socket_timeout=20, retry=Retry(NoBackoff(), 0), **kw)

    def wait_serving(self, timeout=15.0):
        """A client, once the server answers (it may be restarting)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                r = self.client()
                r.ping()
                return r
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def raw(self, data, timeout=2.0):
        """Sends bytes on a fresh connection; returns what came back before
        EOF or the timeout, and whether the server closed the connection."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as s:
            s.sendall(data)
            out, closed = b"", False
            try:
                while True:
                    d = s.recv(65536)
                    if not d:
                        closed = True
                        break
                    out += d
            except TimeoutError:
                pass
            return out, closed

    def supervisor_events(self, kind):
        if not self.events_path.exists():
            return []
        return [
            e
            for e in map(json.loads, filter(None, self.events_path.read_text().splitlines()))
            if e.get("supervisor") == kind
        ]

    def app_pid(self):
        """The pid of the server itself (under the supervisor: its child)."""
        if not self.events_path.exists():
            return self.proc.pid
        return self.supervisor_events("spawn")[-1]["pid"]

    def close(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.err.close()


def resp(*args):
    """One request in RESP2 multibulk form."""
    out = b"*%d\r\n" % len(args)
    for a in args:
        b = a if isinstance(a, bytes) else str(a).encode()
        out += b"$%d\r\n%s\r\n" % (len(b), b)
    return out
