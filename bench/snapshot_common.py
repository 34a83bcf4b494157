"""Shared pieces of the durable-snapshot benchmarks against Redis
(snapshot_rkv_bench.py: throughput, restore_bench.py: restore after the
machine dies and acknowledged writes lost): rkv under `rekindle run` or
`rekindle restore` with its supervisor and app pids, real Redis 7 with its
own persistence settings, SIGKILL of a whole stack, the page cache dropped,
a bounded pipelined filler and writer, memory and disk sizes.

Everything listens on 127.0.0.1 only.  Servers run pinned to --server-cpu
(`taskset`: the supervisor, its snapshot engine, rkv, Redis and Redis's
fork children all share it); the harness and its clients pin themselves to
--client-cpu."""

import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rkv_common import ROOT, RespError, free_port, machine, machine_line, resp  # noqa: E402, F401

RESULTS = ROOT / "bench" / "results"
HOST = "127.0.0.1"


def pin_self(cpu):
    """The harness (and every client it starts without taskset) on cpu."""
    with contextlib.suppress(OSError, ValueError):
        os.sched_setaffinity(0, {int(c) for c in str(cpu).split(",")})


def taskset(cpu, argv):
    return ["taskset", "-c", str(cpu), *argv] if cpu is not None and shutil.which("taskset") else list(argv)


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def pct(xs, q):
    s = sorted(x for x in xs if x is not None)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))] if s else None


def fmt(v, spec, none="—"):
    return none if v is None else format(v, spec)


def mib(b):
    return None if b is None else b / 2**20


def du_bytes(path):
    """Bytes allocated on disk under path (st_blocks), like du."""
    path = Path(path)
    if not path.exists():
        return 0
    if path.is_file():
        return path.stat().st_blocks * 512
    return sum(f.stat().st_blocks * 512 for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def drop_caches():
    """sync, then drop the page cache, dentries and inodes (root only).
    Returns the seconds it took, or None if it could not be done."""
    t = time.monotonic()
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError as e:
        print(f"drop_caches: {e} (not root?): the page cache stays warm", file=sys.stderr)
        return None
    return round(time.monotonic() - t, 3)


def proc_mem(pid):
    """VmRSS, RssAnon, RssShmem of pid in bytes ({} if it is gone)."""
    out = {}
    try:
        for ln in Path(f"/proc/{pid}/status").read_text().splitlines():
            k, _, v = ln.partition(":")
            if k in ("VmRSS", "RssAnon", "RssShmem", "RssFile"):
                out[k] = int(v.split()[0]) * 1024
    except (OSError, ValueError):
        return {}
    return out


def children(pid):
    out = []
    with contextlib.suppress(OSError):
        for t in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, ValueError):
                out += [int(c) for c in (t / "children").read_text().split()]
    return out


def cpu_ns(pids):
    """CPU time the threads of pids have run (schedstat, ns)."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{pid}/task").iterdir():
                with contextlib.suppress(OSError, ValueError, IndexError):
                    total += int((task / "schedstat").read_text().split()[0])
    return total


def loadavg():
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def cpu_pressure():
    p = Path("/proc/pressure/cpu")
    return p.read_text().split("\n")[0] if p.exists() else None


def wait_port(port, timeout=300.0, proc=None, cmd="PING"):
    """Until the server answers cmd (Redis answers -LOADING while it loads)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before serving")
        try:
            return resp(port, cmd, timeout=5)
        except (OSError, RespError, ConnectionError):
            time.sleep(0.005)
    raise RuntimeError(f"port {port}: not serving after {timeout} s")


def wait_gone(pids, timeout=10.0):
    deadline = time.monotonic() + timeout
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            # a zombie of ours counts as gone: its memory is freed
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z":
                    break
            time.sleep(0.005)


def info(port, section=None, timeout=30.0):
    """INFO as a dict of str (numbers stay strings)."""
    raw = resp(port, "INFO", section, timeout=timeout) if section else resp(port, "INFO", timeout=timeout)
    raw = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
    out = {}
    for ln in raw.splitlines():
        k, sep, v = ln.partition(":")
        if sep and not ln.startswith("#"):
            out[k.strip()] = v.strip()
    return out


# ---------------------------------------------------------------- servers


class RkvStack:
    """rkv under `rekindle run` (or `rekindle restore --from`), on loopback,
    pinned to cpu.  snapshot_dir None: no snapshots."""

    def __init__(
        self, build, workdir, port, *, name="rkvbench", cpu="0", snapshot_dir=None, interval=None,
        durability="none", restore_from=None, snapshot_memory=None, rkv_args=(), tag="run", sup_args=(),
    ):  # fmt: skip
        self.build, self.workdir, self.port, self.name = Path(build), Path(workdir), port, name
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.events_path = self.workdir / f"events-{tag}.jsonl"
        self.err_path = self.workdir / f"stderr-{tag}.log"
        self.env = dict(os.environ, REKINDLE_RUNTIME_DIR=str(self.workdir / "run"))
        for k in ("REKINDLE_MANIFEST_FD", "LISTEN_FDS", "LISTEN_PID", "NOTIFY_SOCKET"):
            self.env.pop(k, None)
        sup = [str(self.build / "bin" / "rekindle")]
        sup += ["restore", "--from", str(restore_from)] if restore_from else ["run"]
        sup += ["--name", name, "--events", str(self.events_path), "--listen", f"{HOST}:{port}", *sup_args]
        if snapshot_dir:
            sup += ["--snapshot-dir", str(snapshot_dir), "--snapshot-events", "every"]
            if interval is not None:
                sup += ["--snapshot-interval", str(interval)]
            if snapshot_memory:
                sup += ["--snapshot-memory", str(snapshot_memory)]
        app = [str(self.build / "examples" / "rkv"), "--port", str(port), "--bind", HOST]
        app += ["--dir", str(self.workdir), "--save", "", "--durability", durability, *rkv_args]
        self.argv = taskset(cpu, [*sup, "--", *app])
        self.proc = None
        self.t_start = None

    def start(self):
        err = open(self.err_path, "ab")  # noqa: SIM115 - handed to the child
        self.t_start = time.monotonic()
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=err, env=self.env,
                                     cwd=self.workdir, start_new_session=True)  # fmt: skip
        err.close()
        return self

    def wait_serving(self, timeout=600.0):
        return wait_port(self.port, timeout, self.proc)

    @staticmethod
    def _json_lines(path, prefix, key, kind):
        """The JSON lines of path that start with prefix, whose key is kind
        (all of them for None); a line being written is skipped."""
        out = []
        if path.exists():
            for ln in path.read_text(errors="replace").splitlines():
                if ln.startswith(prefix):
                    with contextlib.suppress(json.JSONDecodeError):
                        e = json.loads(ln)
                        if kind is None or e.get(key) == kind:
                            out.append(e)
        return out

    def events(self, kind=None):
        return self._json_lines(self.events_path, "{", "supervisor", kind)

    def rkv_log(self, kind=None):
        return self._json_lines(self.err_path, '{"rkv"', "rkv", kind)

    @property
    def sup_pid(self):
        """The supervisor (taskset execs it: same pid)."""
        return self.proc.pid

    def app_pid(self, timeout=10.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            sp = self.events("spawn")
            if sp:
                return sp[-1]["pid"]
            time.sleep(0.01)
        kids = children(self.sup_pid)
        return kids[0] if kids else None

    def checkpoint(self, tag=None, timeout=600):
        argv = [str(self.build / "bin" / "rekindle"), "checkpoint", self.name, "--wait", "--json"]
        if tag:
            argv += ["--tag", tag]
        t = time.monotonic()
        p = subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=timeout, check=False)
        took = time.monotonic() - t
        try:
            out = json.loads(p.stdout)
        except json.JSONDecodeError:
            out = {"ok": False, "stdout": p.stdout, "stderr": p.stderr}
        out["wall_s"] = round(took, 3)
        if p.returncode:
            raise RuntimeError(f"rekindle checkpoint failed: {p.stdout} {p.stderr}")
        return out

    def kill9(self):
        """SIGKILL the supervisor and the app at once (nothing holds a memfd
        any more, as after the machine died).  Returns the time of the kill."""
        app = self.app_pid(timeout=1)
        t = time.monotonic()
        wall = time.time()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.sup_pid, signal.SIGKILL)
        if app:
            with contextlib.suppress(ProcessLookupError):
                os.kill(app, signal.SIGKILL)
        self.proc.wait(timeout=30)
        wait_gone([app] if app else [], timeout=30)
        return t, wall

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.kill9()

    def pids(self):
        app = self.app_pid(timeout=0.1)
        return [self.sup_pid] + ([app] if app else [])


def redis_conf(port, workdir, extra=()):
    return [
        "redis-server", "--port", str(port), "--bind", HOST, "--protected-mode", "yes",
        "--dir", str(workdir), "--dbfilename", "dump.rdb", "--save", "", "--appendonly", "no",
        "--daemonize", "no", "--logfile", str(workdir / "redis.log"), *extra,
    ]  # fmt: skip


AOF_EVERYSEC = ("--appendonly", "yes", "--appendfsync", "everysec")
AOF_ALWAYS = ("--appendonly", "yes", "--appendfsync", "always")


class RedisServer:
    def __init__(self, workdir, port, extra=(), cpu="0"):
        self.workdir, self.port = Path(workdir), port
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.argv = taskset(cpu, redis_conf(port, self.workdir, extra))
        self.proc = None
        self.t_start = None

    def start(self):
        self.t_start = time.monotonic()
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     cwd=self.workdir, start_new_session=True)  # fmt: skip
        return self

    def wait_serving(self, timeout=600.0):
        return wait_port(self.port, timeout, self.proc)

    def log(self):
        p = self.workdir / "redis.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def pids(self):
        return [self.proc.pid]

    def kill9(self):
        t, wall = time.monotonic(), time.time()
        kids = children(self.proc.pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGKILL)
        for k in kids:  # a BGSAVE or rewrite child would go with the machine too
            with contextlib.suppress(ProcessLookupError):
                os.kill(k, signal.SIGKILL)
        self.proc.wait(timeout=30)
        wait_gone(kids)
        return t, wall

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: no save with --save "" and no AOF; fsyncs the AOF if on
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.kill9()


def redis_wait_quiet(port, timeout=600.0):
    """Until no AOF rewrite or BGSAVE is running or scheduled."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        i = info(port, "persistence")
        busy = [k for k in ("aof_rewrite_in_progress", "aof_rewrite_scheduled", "rdb_bgsave_in_progress")
                if i.get(k, "0") != "0"]  # fmt: skip
        if not busy:
            return
        time.sleep(0.05)


# ---------------------------------------------------------------- clients


def _set_cmd(key, value):
    return b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(key), key, len(value), value)


def fill(port, n, value_size=100, key_fmt=b"key:%012d", conns=2, chunk=2000, timeout=900.0):
    """SETs keys key_fmt % i (i < n) to value_size bytes of 'x' (what
    redis-benchmark -d writes), over conns pipelined connections (a writer
    and a reader thread each).  Bounded by n and timeout.  Returns seconds."""
    value = b"x" * value_size
    t0 = time.monotonic()
    deadline = t0 + timeout
    errors = []

    def one(c):
        idx = range(c, n, conns)
        with socket.create_connection((HOST, port), timeout=timeout) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            want = len(idx)

            def reader():
                got, buf = 0, b""
                while got < want and time.monotonic() < deadline:
                    b = s.recv(1 << 20)
                    if not b:
                        errors.append("connection closed")
                        return
                    buf += b
                    k = buf.count(b"\r\n")
                    if b"-" in buf:
                        errors.extend(ln for ln in buf.split(b"\r\n") if ln.startswith(b"-"))
                    got += k
                    buf = buf[buf.rfind(b"\r\n") + 2 :]

            rt = threading.Thread(target=reader, daemon=True)
            rt.start()
            for a in range(0, want, chunk):
                if time.monotonic() > deadline:
                    break
                s.sendall(b"".join(_set_cmd(key_fmt % i, value) for i in idx[a : a + chunk]))
            rt.join(timeout=max(1.0, deadline - time.monotonic()))

    ts = [threading.Thread(target=one, args=(c,), daemon=True) for c in range(conns)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise RuntimeError(f"fill: {errors[:3]}")
    if time.monotonic() > deadline:
        raise RuntimeError(f"fill: not done in {timeout} s")
    return round(time.monotonic() - t0, 3)


class RssSampler:
    """Samples proc_mem of named pids every period s (a thread), at most
    max_s seconds.  pids_fn() -> {name: pid}."""

    def __init__(self, pids_fn, period=0.05, max_s=3600.0):
        self.pids_fn, self.period, self.max_s = pids_fn, period, max_s
        self.samples = []  # (t, name, VmRSS, RssAnon, RssShmem)
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self._t.start()
        return self

    def _run(self):
        end = time.monotonic() + self.max_s
        while not self._stop.is_set() and time.monotonic() < end:
            t = time.monotonic()
            with contextlib.suppress(Exception):
                for name, pid in self.pids_fn().items():
                    m = proc_mem(pid)
                    if m:
                        self.samples.append(
                            (t, name, m.get("VmRSS", 0), m.get("RssAnon", 0), m.get("RssShmem", 0))
                        )
            self._stop.wait(self.period)

    def stop(self):
        self._stop.set()
        self._t.join(timeout=5)

    def peak(self, name, t0=None, t1=None, key=2):
        vals = [rss_of(s, key) for s in self.samples if s[1] == name and (t0 is None or t0 <= s[0] <= t1)]
        return max(vals) if vals else None


def rss_of(sample, key=2):
    """A sample's VmRSS (key 2), or RssAnon (3); the supervisor's VmRSS
    without its RssShmem: the pages of the app's memfds it maps (the cut's
    views, the agent's buffer) are the app's memory, counted in the app's
    RSS, not memory the supervisor adds."""
    v = sample[key]
    if key == 2 and sample[1] == "supervisor":
        v -= sample[4]
    return v


def store_summary(build, store):
    """`rekindle snapshots --json` totals of a store, and its size on disk."""
    p = subprocess.run([str(Path(build) / "bin" / "rekindle"), "snapshots", str(store), "--json"],
                       capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    try:
        d = json.loads(p.stdout)
    except json.JSONDecodeError:
        d = {}
    snaps = d.get("snapshots", [])
    out = {"snapshots": len(snaps), "du_bytes": du_bytes(store)}
    if snaps:
        out["newest_logical_bytes"] = snaps[-1].get("logical_bytes")
        out["newest_id"] = snaps[-1].get("id")
    for k, v in d.items():
        if k not in ("snapshots", "broken"):
            out[k] = v
    return out


def store_gc_keep1(build, store):
    """Folds the store down to its newest snapshot; its size on disk then."""
    subprocess.run([str(Path(build) / "bin" / "rekindle"), "gc", str(store), "--keep", "1"],
                   capture_output=True, text=True, timeout=1800, check=False)  # fmt: skip
    return du_bytes(store)


def snapshot_created(build, store, snap_id):
    """The wall-clock time (unix s) a snapshot was created (its cut)."""
    import datetime

    p = subprocess.run([str(Path(build) / "bin" / "rekindle"), "snapshots", str(store), "--json"],
                       capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    with contextlib.suppress(json.JSONDecodeError):
        for s in json.loads(p.stdout).get("snapshots", []):
            if s.get("id") == snap_id:
                c = s["created"].replace("Z", "+00:00")
                return datetime.datetime.fromisoformat(c).timestamp()
    return None


def free_ports(n):
    out = set()
    while len(out) < n:
        out.add(free_port())
    return list(out)
