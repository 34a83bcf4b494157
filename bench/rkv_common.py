"""Shared pieces of the rkv benchmarks (rkv_throughput.py, availability.py):
the machine line, free ports, a minimal RESP client, and the servers under
test (real Redis 7, rkv, rkv-malloc, rkv under `rekindle run`), each started
pinned to a CPU with `taskset`."""

import datetime
import os
import platform
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def machine():
    """Model, cores, kernel, RAM, redis version, date: for the tables."""
    model = platform.processor() or platform.machine()
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        m = re.search(r"^Model name:\s*(.+)$", out, re.M)
        model = m.group(1).strip() if m else model
        hv = re.search(r"^Hypervisor vendor:\s*(.+)$", out, re.M)
        if hv:
            model += f" ({hv.group(1).strip()} guest)"
    except (OSError, subprocess.CalledProcessError):
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    redis = subprocess.run(
        ["redis-server", "--version"], capture_output=True, text=True, check=False
    ).stdout.split()
    rv = next((w.split("=")[1] for w in redis if w.startswith("v=")), "?")
    return {
        "model": model,
        "cores": os.cpu_count(),
        "kernel": platform.release(),
        "mem_gib": round(mem_gib),
        "redis": rv,
        "date": datetime.date.today().isoformat(),
    }


def machine_line(m):
    return (
        f"{m['model']}, {m['cores']} vCPUs, {m['mem_gib']} GiB RAM, Linux {m['kernel']}, "
        f"redis-server {m['redis']}, {m['date']}"
    )


# ---------------------------------------------------------------- RESP


def _encode(args):
    out = [f"*{len(args)}\r\n".encode()]
    for a in args:
        b = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


class RespError(Exception):
    pass


def _read_reply(f):
    line = f.readline()
    if not line:
        raise ConnectionError("connection closed")
    kind, rest = line[:1], line[1:-2]
    if kind == b"+":
        return rest.decode()
    if kind == b"-":
        raise RespError(rest.decode())
    if kind == b":":
        return int(rest)
    if kind == b"$":
        n = int(rest)
        if n < 0:
            return None
        data = f.read(n + 2)
        return data[:-2]
    if kind == b"*":
        return [_read_reply(f) for _ in range(int(rest))]
    raise RespError(f"bad reply {line!r}")


def resp(port, *args, timeout=120.0):
    """One command on a fresh connection; returns the decoded reply."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(_encode(args))
        with s.makefile("rb") as f:
            return _read_reply(f)


def send_only(port, *args):
    """Sends a command and does not wait (DEBUG SEGFAULT); returns the send time."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    t = time.monotonic()
    s.sendall(_encode(args))
    return s, t


def wait_serving(port, timeout=300.0, proc=None):
    """Until DBSIZE answers (Redis answers -LOADING while it loads)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before serving")
        try:
            return resp(port, "DBSIZE", timeout=5)
        except (OSError, RespError, ConnectionError):
            time.sleep(0.01)
    raise RuntimeError(f"port {port}: not serving after {timeout} s")


# ---------------------------------------------------------------- servers


def have_rkv(build):
    return (build / "examples" / "rkv").exists() and (build / "examples" / "rkv-malloc").exists()


def redis_argv(port, workdir):
    # crash-memcheck-enabled no: Redis 7 scans all of its memory after a
    # crash by default (a diagnostic); the restart is what is measured here.
    return [
        "redis-server",
        "--port", str(port),
        "--bind", "127.0.0.1",
        "--dir", str(workdir),
        "--dbfilename", "dump.rdb",
        "--save", "",
        "--appendonly", "no",
        "--enable-debug-command", "yes",
        "--crash-memcheck-enabled", "no",
        "--daemonize", "no",
        "--logfile", str(workdir / "redis.log"),
    ]  # fmt: skip


def rkv_argv(binary, port, workdir, maxmemory):
    return [
        str(binary),
        "--port", str(port),
        "--bind", "127.0.0.1",
        "--dir", str(workdir),
        "--dbfilename", "rkv.snap",
        "--save", "",
        "--maxmemory", str(maxmemory),
        "--enable-debug", "yes",
    ]  # fmt: skip


def supervised_argv(build, name, port, events, app_argv):
    return [
        str(build / "bin" / "rekindle"),
        "run",
        "--name", name,
        "--events", str(events),
        "--listen", f"127.0.0.1:{port}",
        "--",
        *app_argv,
    ]  # fmt: skip


class Server:
    """One server process (or supervisor), pinned with taskset.  With
    respawn=True a watcher thread restarts it with the same argv as soon as
    it dies (like systemd's Restart=always with no delay) and records when."""

    def __init__(self, name, argv, workdir, cpu="0", env=None):
        self.name = name
        self.argv = ["taskset", "-c", cpu, *argv] if cpu and shutil.which("taskset") else list(argv)
        self.workdir = workdir
        self.env = env
        self.proc = None
        self.incarnation = 0
        self.exits = []  # (monotonic exit seen, returncode, monotonic respawned)
        self.respawn = False
        self._stopping = False
        self._watcher = None

    def log_path(self, incarnation=None):
        i = self.incarnation if incarnation is None else incarnation
        return self.workdir / f"{self.name}.{i}.stderr"

    def _spawn(self):
        err = open(self.log_path(), "wb")  # noqa: SIM115 - kept open for the child's life
        self.proc = subprocess.Popen(
            self.argv, stdout=subprocess.DEVNULL, stderr=err, env=self.env, cwd=self.workdir
        )
        err.close()

    def start(self, respawn=False):
        import threading

        self.respawn = respawn
        self._spawn()
        if respawn:
            self._watcher = threading.Thread(target=self._watch, daemon=True)
            self._watcher.start()

    def _watch(self):
        while not self._stopping:
            proc = self.proc
            rc = proc.wait()
            seen = time.monotonic()
            if self._stopping:
                return
            self.incarnation += 1
            self._spawn()
            self.exits.append((seen, rc, time.monotonic()))

    def stop(self):
        self._stopping = True
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._watcher:
            self._watcher.join(timeout=5)
