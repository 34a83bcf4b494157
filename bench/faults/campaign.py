#!/usr/bin/env python3
"""The fault campaign (issue 15): PHOENIX's Table 7 for Rekindle.

Each run starts a server built with the fault injector (bench/faults/build.sh)
under `rekindle run`, loads data, saves a snapshot (the cold path's
persistence), and drives a workload while a Python model holds what every key
must hold.  One fault is armed: a site picked at random among the sites the
workload executes (from a traced profiling run), acting from the middle of
the workload on (REKINDLE_FAULT_AFTER: the site's load-phase count plus half
its workload count, persistent).  The first incarnation only is armed
(fi_shim.c, REKINDLE_FI_ONCE): a restarted server runs the fixed code.  The
run observes crash, hang or none, lets Rekindle recover (warm, or cold:
then the model goes back to the snapshot), finishes the workload and
compares every key with the model.  A run that ends with wrong data after
a failure is run again with the same fault, seed and workload under a
vanilla restart (REKINDLE_FI_VANILLA: every restart cold), to tell
corruption Rekindle added from corruption both have.

    campaign.py --runs N [--targets rkv,redis] [--configs regions,noregions]
                [--methods ours,phoenix] [--seed S] [--jobs J] [--out bench/results]
                [--build build]
    campaign.py --one --target rkv --config regions --site ID[,ID...] --after N[,N...]
                [--seed S] [--workload mixed|ycsb]

Two methods (docs/faultinject.md, "PHOENIX's method and ours"): "ours" (the
default) is the method above: the mixed workload (300 requests, mostly
writes, on 200 keys), one fault a run at a site the workload executes, a
workload drawn anew for every run.  "phoenix" follows PHOENIX §4.4: a
deterministic YCSB workload (90% reads, 10% inserts, Zipfian; the same one
in every run), ten faulty instructions a run drawn uniformly from every
site of the functions the workload executes, each armed from the middle
of the workload (its count at the profile's midpoint).  The classes and
what counts as corruption are the same in both.

Classes (exactly one per run): see CLASSES.  Writes faults.json, faults.md
and faults.png to --out.
"""

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "faultinject"))
from fi_sites import read_sites  # noqa: E402
from fi_trace import read_counts  # noqa: E402

CLASSES = (
    "warm recovery",
    "fallback: unsafe region",
    "fallback: crash after recovery",
    "fallback: other",
    "additional corruption",
    "shared corruption",
    "silent corruption",
    "no effect",
    "not triggered",
    "unrecovered",
    "harness error",
)
CONFIGS = {"regions": {}, "noregions": {"REKINDLE_FI_NO_REGIONS": "1"}}
# Not in a campaign unless --configs names it: regions, and the Redis port's
# keyspace check at a warm start (patch 0005; rkv ignores the variable)
EXTRA_CONFIGS = {"regions-check": {"REDIS_REKINDLE_VERIFY_KEYSPACE": "1"}}
ALL_CONFIGS = {**CONFIGS, **EXTRA_CONFIGS}
WORKLOADS = ("mixed", "ycsb")


class Method:
    """How a campaign draws its faults and drives its workload."""

    def __init__(self, name, workload, faults, pool, deterministic, arm):
        self.name, self.workload, self.faults = name, workload, faults
        self.pool = pool  # "sites": the sites the workload executes; "functions": every site of its functions
        self.deterministic = deterministic  # the profile's workload in every run (PHOENIX), or one per run
        # "count": each site from its count at the midpoint (REKINDLE_FAULT_AFTER);
        # "signal": every site from the moment the harness signals the app at the midpoint
        self.arm = arm


METHODS = {
    "ours": Method("ours", "mixed", 1, "sites", False, "count"),
    # PHOENIX §4.4: deterministic workloads, 10 LLVM IR instructions a run
    # from the functions a vanilla workload activates, switched on halfway
    # by a signal
    "phoenix": Method("phoenix", "ycsb", 10, "functions", True, "signal"),
    # the same, each site armed by its count at the profile's midpoint: the
    # counts of sites that run by time (cron, rehash steps) vary between
    # runs, so such a fault can act before the midpoint, even before the SAVE
    "phoenix-count": Method("phoenix-count", "ycsb", 10, "functions", True, "count"),
}
ARM_SIGNAL = signal.SIGUSR2  # neither Redis nor rkv nor librekindle uses it

# One run stays near a second: small data, a short workload, short timeouts.
LOAD_KEYS = 200
WORKLOAD_OPS = 300
OP_TIMEOUT = 1.0  # a reply later than this: the server hangs or lost the request
HANG_TIMEOUT = "400ms"  # rekindle run --hang-timeout (heartbeats come every 100 ms)
SERVE_TIMEOUT = 6.0  # from a failure to serving again (the harness kills a wedged app at half)
RUN_DEADLINE = 30.0  # a whole run, whatever happens
OP_WALL = 3.0  # one request, however its reply trickles in (an endless reply is a hang too)
# The YCSB workload (PHOENIX §4.3/§4.4: Redis under YCSB, 90% reads and 10%
# inserts, Zipfian): YCSB's Redis binding stores a record as a hash of
# fieldcount fields (HSET; default 10 fields of 100 bytes), adds its key to
# the sorted set "_indices" on insert (ZADD, scored by the key's hash), and
# reads a record with HGETALL.  rkv, which has strings only, keeps a record
# as one string of the same size and no index.
YCSB_RECORDS = LOAD_KEYS
YCSB_FIELDS = 10
YCSB_FIELD_LEN = 100
YCSB_READ = 0.9
ZIPF_THETA = 0.99  # YCSB's ZipfianGenerator.ZIPFIAN_CONSTANT
YCSB_INDEX = b"_indices"
SUPERVISOR_OPTS = [
    "--hang-timeout", HANG_TIMEOUT, "--check-interval", "100ms", "--kill-timeout", "300ms",
    "--backoff-initial", "10ms", "--backoff-max", "200ms", "--max-restarts", "5",
    "--stop-timeout", "1s",
]  # fmt: skip


class HarnessError(Exception):
    pass


class Unrecovered(Exception):
    pass


class BadReply(Exception):
    pass


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- targets ---------------------------------------------------------------------------


class Target:
    name = ""
    snapshot_file = ""
    kinds = ("str",)

    def __init__(self, build):
        self.build = Path(build).resolve()

    def args(self, workdir, port):
        raise NotImplementedError


class Rkv(Target):
    name = "rkv"
    snapshot_file = "rkv.snap"

    @property
    def exe(self):
        return self.build / "faults" / "rkv-fi"

    def args(self, workdir, port):
        # the supervisor's --listen socket comes as LISTEN_FDS (--port is then ignored)
        return [str(self.exe), "--port", str(port), "--dir", str(workdir), "--save", "", "--hugepages", "no",
                "--arena-size", "256mb"]  # fmt: skip


class RedisPort(Target):
    name = "redis"
    snapshot_file = "dump.rdb"
    kinds = ("str", "list", "hash")

    @property
    def exe(self):
        return self.build / "faults" / "redis" / "rekindle" / "src" / "redis-server"

    def args(self, workdir, port):
        # LISTEN_FDS: the server's own --port 0 opens nothing
        return [str(self.exe), "--port", "0", "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", str(workdir), "--daemonize", "no", "--logfile", ""]  # fmt: skip


TARGETS = {"rkv": Rkv, "redis": RedisPort}


# ---- the model -------------------------------------------------------------------------

ABSENT = None


class Model:
    """What every key must hold: kv (key -> bytes, list of bytes, or dict);
    alt: key -> the other values a key may hold (a request in flight at a
    failure may or may not have been applied; such keys are frozen: the
    workload does not touch them again); snap/snap_alt: what the last
    acknowledged SAVE holds, which a cold restart brings back."""

    def __init__(self):
        self.kv, self.alt, self.frozen = {}, {}, set()
        self.snap, self.snap_alt = {}, {}

    def uncertain(self, before):
        """before: {key: value before the request}, the request's keys."""
        for k, v in before.items():
            self.alt.setdefault(k, []).append(v)
            self.frozen.add(k)

    def saved(self):
        self.snap, self.snap_alt = _copy(self.kv), {k: list(v) for k, v in self.alt.items()}

    def save_uncertain(self, old, old_alt):
        """A SAVE that failed: the file is the old one or the new one."""
        self.saved()
        for k in set(old) | set(self.kv):
            if old.get(k) != self.kv.get(k):
                self.snap_alt.setdefault(k, []).append(old.get(k))
        for k, vs in old_alt.items():
            self.snap_alt.setdefault(k, []).extend(vs)

    def cold(self):
        self.kv, self.alt = _copy(self.snap), {k: list(v) for k, v in self.snap_alt.items()}
        self.frozen |= set(self.alt)

    def ok(self, key, value):
        return value == self.kv.get(key) or value in self.alt.get(key, ())

    def keys(self):
        return set(self.kv) | set(self.alt)


def _copy1(v):
    return list(v) if isinstance(v, list) else dict(v) if isinstance(v, dict) else v


def _copy(kv):
    return {k: _copy1(v) for k, v in kv.items()}


# ---- one run -----------------------------------------------------------------------------


class Server:
    """`rekindle run` around one target, in its own process group."""

    def __init__(self, target, workdir, env_extra):
        self.target, self.dir = target, Path(workdir)
        self.port = free_port()
        self.events_path = self.dir / "events.jsonl"
        self.err_path = self.dir / "stderr.txt"
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("REKINDLE_", "LISTEN_")) and k != "NOTIFY_SOCKET"}  # fmt: skip
        # short: the control socket's path must fit a sockaddr_un
        self.rundir = tempfile.mkdtemp(prefix="rkfi-", dir="/tmp")
        env["REKINDLE_RUNTIME_DIR"] = self.rundir
        env.update(env_extra)
        data = self.dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        self.data = data
        cmd = [str(target.build / "bin" / "rekindle"), "run", "--name", "fi",
               "--events", str(self.events_path), "--listen", f"127.0.0.1:{self.port}",
               *SUPERVISOR_OPTS, "--", *target.args(data, self.port)]  # fmt: skip
        self.err = open(self.err_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=self.err, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True, cwd=data)  # fmt: skip
        self.seen_up = 0

    def events(self, kind=None):
        try:
            text = self.events_path.read_text()
        except FileNotFoundError:
            return []
        out = []
        for line in text[: text.rfind("\n") + 1].splitlines():
            if line.strip():
                e = json.loads(line)
                if kind is None or e.get("supervisor") == kind:
                    out.append(e)
        return out

    def stderr(self):
        if not self.err.closed:
            self.err.flush()
        return self.err_path.read_text(errors="replace")

    def client(self, timeout=OP_TIMEOUT, single=False):
        """single: one connection for good (the workload's): a pooled client
        would connect again without a word when the server closed its
        connection between two requests, and a restart would go unseen."""
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=timeout,
                           socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0),
                           single_connection_client=single)  # fmt: skip

    def ping(self, timeout=0.3):
        c = self.client(timeout)
        try:
            c.ping()
            return c
        except Exception:  # not up, or a faulty server's garbage (the handshake too)
            c.close()
            return None

    def app_pid(self):
        ups = self.events("spawn")
        return ups[-1]["pid"] if ups else None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=4)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)  # the group this run started
                self.proc.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        # the app (a process group of its own), if the supervisor died first
        for e in self.events("spawn"):
            pid = e.get("pid")
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if str(self.data).encode() in cmd:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.err.close()
        shutil.rmtree(self.rundir, ignore_errors=True)


class Run:
    """One run: see the module's docstring.  The result is a dict."""

    def __init__(self, target, config, workdir, site=None, after=0, seed=0, vanilla=False, workload="mixed",
                 arm_signal=False):  # fmt: skip
        """site: one site id or several, comma-separated; after: one count,
        or one per site, comma-separated (REKINDLE_FAULT_AFTER)."""
        if workload not in WORKLOADS:
            raise ValueError(f"unknown workload {workload!r} (one of {', '.join(WORKLOADS)})")
        self.target, self.config, self.workload = target, config, workload
        self.arm_signal = arm_signal and bool(site)  # the fault acts once the app got ARM_SIGNAL
        self.site, self.after, self.seed, self.vanilla = site, after, seed, vanilla
        self.records = []  # ycsb: the records' keys, in insert order
        self.missing_only = False  # every wrong key of the final check is a missing one
        self.zipf = Zipfian(ZIPF_THETA)
        self.workdir = Path(workdir)
        self.rng = random.Random(seed)
        self.model = Model()
        self.failures_seen = 0  # op errors that led to a restart
        self.error_replies = 0
        self.read_mismatches = 0
        self.mismatches_before_restart = None  # wrong GETs the faulty incarnation served
        self.harness_kills = 0
        self.ident = None
        self.unnoticed_restarts = 0
        self.op_started = None
        self.done = threading.Event()
        self.deadline = time.monotonic() + RUN_DEADLINE

    def env(self, trace=None):
        env = dict(ALL_CONFIGS[self.config])
        if self.site:
            env.update(REKINDLE_FAULT=self.site, REKINDLE_FAULT_AFTER=str(self.after),
                       REKINDLE_FI_ONCE=str(self.workdir / "armed-once"))  # fmt: skip
        if self.site and self.arm_signal:
            env["REKINDLE_FAULT_ARM_SIGNAL"] = str(int(ARM_SIGNAL))
        if self.vanilla:
            env["REKINDLE_FI_VANILLA"] = "1"
        if trace:
            env["REKINDLE_FAULT_TRACE"] = str(trace)
        return env

    # ---- failures ------------------------------------------------------------------
    def check_time(self):
        if time.monotonic() > self.deadline:
            raise HarnessError(f"run deadline ({RUN_DEADLINE}s) passed")

    def recover(self, timed_out):
        """After a request failed: back to a serving server.  Returns a fresh
        client.  A request without a reply within OP_TIMEOUT from a server
        the supervisor did not see fail (it heartbeats, but does not answer)
        is a hang the way a health check sees it: the harness kills the app
        (SIGKILL) and the supervisor restarts it.  Whether the server
        restarted is what INFO says (Redis's run_id, rkv's generation), not
        the supervisor's events, which may lag a busy machine; once it has,
        the events of every restart are waited for, and one that came up
        cold sends the model back to the snapshot."""
        s = self.server
        if timed_out and not self.restarting():
            self.health_kill()
        deadline = time.monotonic() + SERVE_TIMEOUT
        settle = time.monotonic() + 1.0
        killed = timed_out
        while True:
            self.check_time()
            if s.events("giveup") or s.proc.poll() is not None:
                raise Unrecovered("the supervisor gave up" if s.events("giveup") else "the supervisor exited")
            c = self.timed(s.ping)
            if c is not None:
                ident = self.timed(identity, c)
                c.close()
                if ident is not None and ident == self.ident:
                    break  # no restart: the server closed the connection, or a request got lost
                if len(s.events("up")) > s.seen_up and self.settled():
                    self.ident = ident
                    break
                if (
                    ident is None
                    and len(s.events("failure")) <= self.failures_seen
                    and time.monotonic() > settle
                ):
                    break  # it serves, cannot say who it is, and nothing failed
            elif not killed and time.monotonic() > settle and not self.restarting():
                # no PING answered for a second, and nothing failed: the
                # health check's verdict again
                self.health_kill()
                killed = True
            if time.monotonic() > deadline:
                raise Unrecovered(f"not serving {SERVE_TIMEOUT}s after a failure")
            time.sleep(0.02)
        self.sync_generations()
        return s.client(single=True)

    def watchdog(self):
        """A thread: a request that has run OP_WALL seconds gets the health
        check's verdict (the app is killed: its connection drops); past the
        run's deadline, everything is killed, so that no read blocks."""
        while not self.done.wait(0.1):
            t = self.op_started
            if t is not None and time.monotonic() - t > OP_WALL:
                self.op_started = None
                self.health_kill()
            if time.monotonic() > self.deadline + 2:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.server.proc.pid, signal.SIGKILL)
                pid = self.server.app_pid()
                if pid:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                return

    def timed(self, fn, *args):
        """fn(*args) under the watchdog."""
        self.op_started = time.monotonic()
        try:
            return fn(*args)
        finally:
            self.op_started = None

    def restarting(self):
        s = self.server
        return len(s.events("failure")) > self.failures_seen or len(s.events("up")) > s.seen_up

    def health_kill(self):
        pid = self.server.app_pid()
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                self.harness_kills += 1

    def settled(self):
        """Every failure the supervisor reported was followed by an up."""
        fails = [f.get("generation", 0) for f in self.server.events("failure")]
        ups = [u.get("generation", 0) for u in self.server.events("up")]
        return bool(ups) and (not fails or ups[-1] > max(fails))

    def sync_generations(self):
        s = self.server
        ups = s.events("up")
        new = ups[s.seen_up :]
        s.seen_up = len(ups)
        self.failures_seen = len(s.events("failure"))
        if self.mismatches_before_restart is None and any(u.get("generation", 0) > 0 for u in new):
            self.mismatches_before_restart = self.read_mismatches
        if any(u.get("kind") == "cold" for u in new if u.get("generation", 0) > 0):
            self.model.cold()

    # ---- requests ---------------------------------------------------------------------
    def do(self, keys, fn, apply):
        """fn(client) sends the request; apply() changes the model as the
        request would.  On a failure the keys become uncertain."""
        before = {k: _copy({k: self.model.kv.get(k)})[k] for k in keys}
        try:
            reply = self.timed(fn, self.c)
        except (redis.ConnectionError, redis.TimeoutError) as e:
            apply()
            self.model.uncertain(before)
            self.c.close()
            self.c = self.recover(isinstance(e, redis.TimeoutError))
            return False, None
        except Exception:  # an error reply, or one the client cannot parse: a new connection
            apply()
            self.model.uncertain(before)
            self.error_replies += 1
            self.c.close()
            self.c = self.recover(False)  # the server may have restarted all the same
            return False, None
        apply()
        return True, reply

    def pick(self, prefix, n):
        for _ in range(20):
            k = f"{prefix}:{self.rng.randrange(n)}".encode()
            if k not in self.model.frozen:
                return k
        return None

    def value(self):
        return self.rng.randbytes(self.rng.randint(1, 48)).hex().encode()

    # ---- the YCSB workload ------------------------------------------------------------
    def ycsb_record(self):
        return {f"field{i}".encode(): self.rng.randbytes(YCSB_FIELD_LEN // 2).hex().encode()
                for i in range(YCSB_FIELDS)}  # fmt: skip

    def ycsb_insert(self):
        """YCSB's insert: the next key in insert order (hashed, as YCSB's
        default insertorder=hashed), a new record, and its index entry."""
        m = self.model
        key = b"user%d" % fnv64(len(self.records))
        self.records.append(key)
        if "hash" not in self.target.kinds:
            v = b"".join(self.ycsb_record().values())
            self.do([key], lambda c: c.set(key, v), lambda: m.kv.__setitem__(key, v))
            return
        rec = self.ycsb_record()
        score = float(fnv64(key) % (1 << 31))  # YCSB scores by the key's hashCode
        if YCSB_INDEX in m.frozen:  # a failed insert left the index uncertain: not touched again
            self.do([key], lambda c: c.hset(key, mapping=rec), lambda: m.kv.__setitem__(key, dict(rec)))
            return

        def send(c):
            c.hset(key, mapping=rec)
            return c.zadd(YCSB_INDEX, {key: score})

        def apply():
            m.kv[key] = dict(rec)
            m.kv.setdefault(YCSB_INDEX, {})[key] = score

        self.do([key, YCSB_INDEX], send, apply)

    def ycsb_read(self):
        m = self.model
        for _ in range(20):
            key = self.records[fnv64(self.zipf.next(self.rng, len(self.records))) % len(self.records)]
            if key not in m.frozen:
                break
        else:
            return
        if "hash" in self.target.kinds:
            ok, got = self.do([], lambda c: c.hgetall(key), lambda: None)
            got = None if got == {} else got  # HGETALL of a missing key (a record is never empty)
        else:
            ok, got = self.do([], lambda c: c.get(key), lambda: None)
        if ok and not m.ok(key, got):
            self.read_mismatches += 1

    def op(self):
        if self.workload == "ycsb":
            if self.rng.random() < YCSB_READ and self.records:
                self.ycsb_read()
            else:
                self.ycsb_insert()
            return
        m, r = self.model, self.rng
        kinds = self.target.kinds
        x = r.random()
        if "list" in kinds and x < 0.08:
            k = self.pick("l", 20)
            if k:
                v = self.value()
                self.do([k], lambda c: c.rpush(k, v), lambda: m.kv.setdefault(k, []).append(v))
            return
        if "hash" in kinds and x < 0.16:
            k, f = self.pick("h", 20), f"f{r.randrange(8)}".encode()
            if k:
                v = self.value()
                self.do([k], lambda c: c.hset(k, f, v), lambda: m.kv.setdefault(k, {}).__setitem__(f, v))
            return
        x = r.random()
        if x < 0.30:
            k = self.pick("k", LOAD_KEYS)
            if k:
                v = self.value()
                self.do([k], lambda c: c.set(k, v), lambda: m.kv.__setitem__(k, v))
        elif x < 0.50:
            k = self.pick("k", LOAD_KEYS)
            if k:
                ok, got = self.do([], lambda c: c.get(k), lambda: None)
                if ok and not m.ok(k, got):
                    self.read_mismatches += 1
        elif x < 0.58:
            k = self.pick("k", LOAD_KEYS)
            if k:
                self.do([k], lambda c: c.delete(k), lambda: m.kv.pop(k, None))
        elif x < 0.70:
            k = self.pick("c", 20)
            if k:
                n = b"%d" % (int(m.kv.get(k, 0)) + 1)
                self.do([k], lambda c: c.incr(k), lambda: m.kv.__setitem__(k, n))
        elif x < 0.82:
            k = self.pick("k", LOAD_KEYS)
            if k:
                v = self.value()
                self.do([k], lambda c: c.append(k, v), lambda: m.kv.__setitem__(k, m.kv.get(k, b"") + v))
        else:
            ks = [self.pick("k", LOAD_KEYS) for _ in range(3)]
            ks = list(dict.fromkeys(k for k in ks if k))
            if ks:
                vals = {k: self.value() for k in ks}
                self.do(ks, lambda c: c.mset(vals), lambda: m.kv.update(vals))

    def load(self):
        m = self.model
        if self.workload == "ycsb":  # YCSB's load phase: one insert per record
            for _ in range(YCSB_RECORDS):
                self.ycsb_insert()
        for start in range(0, LOAD_KEYS if self.workload == "mixed" else 0, 50):
            batch = {f"k:{i}".encode(): self.value() for i in range(start, min(start + 50, LOAD_KEYS))}
            self.do(list(batch), lambda c, b=batch: c.mset(b), lambda b=batch: m.kv.update(b))
        old, old_alt = _copy(m.snap), {k: list(v) for k, v in m.snap_alt.items()}
        try:
            self.timed(self.c.save)
            m.saved()
        except (redis.ConnectionError, redis.TimeoutError) as e:
            m.save_uncertain(old, old_alt)
            self.c.close()
            self.c = self.recover(isinstance(e, redis.TimeoutError))
        except Exception:  # an error reply, or one the client cannot parse
            self.error_replies += 1
            m.save_uncertain(old, old_alt)
            self.c.close()
            self.c = self.recover(False)

    # ---- the final check --------------------------------------------------------------
    def read_all(self, c):
        """{key: value} of everything the server holds, by type."""
        out = {}
        keys = c.keys("*")
        if not isinstance(keys, list) or not all(isinstance(k, bytes) for k in keys):
            raise BadReply(f"KEYS replied {str(keys)[:80]}")
        for k in keys:
            t = c.type(k)
            if t == b"string":
                out[k] = c.get(k)
            elif t == b"list":
                out[k] = c.lrange(k, 0, -1)
            elif t == b"hash":
                out[k] = c.hgetall(k)
            elif t == b"zset":
                out[k] = dict(c.zrange(k, 0, -1, withscores=True))
            elif t == b"none":
                continue  # gone between KEYS and TYPE (expiry cannot: no TTLs)
            else:
                out[k] = ("type", t)
        return out

    def verify(self):
        got, failed = None, False
        for _ in range(4):
            self.check_time()
            try:
                got = self.timed(self.read_all, self.c)
                break
            except (redis.ConnectionError, redis.TimeoutError) as e:
                failed = True
                self.c.close()
                self.c = self.recover(isinstance(e, redis.TimeoutError))
            except Exception:  # an error reply, or one the client cannot parse
                failed = False
                self.error_replies += 1
                self.c.close()
                self.c = self.recover(False)
        if got is None and failed:
            raise Unrecovered("the final check kept failing")
        if len(self.server.events("up")) > self.server.seen_up:
            self.unnoticed_restarts += 1  # the model missed a restart: a harness bug
        self.sync_generations()
        m = self.model
        if got is None:
            return ["the final check got an error reply"]
        bad = []
        self.missing_only = True
        for k in sorted(m.keys() | set(got)):
            v = got.get(k, ABSENT)
            if not m.ok(k, v):
                bad.append(k.decode(errors="replace"))
                self.missing_only &= v is ABSENT
        return bad

    # ---- the whole run ---------------------------------------------------------------
    def execute(self, trace=None, on_phase=None):
        """Returns the result dict.  on_phase(name) is called after the load
        and after the workload (the profiling run reads its counters)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        res = {"target": self.target.name, "config": self.config, "site": self.site, "after": self.after,
               "seed": self.seed, "vanilla": self.vanilla}  # fmt: skip
        self.server = Server(self.target, self.workdir, self.env(trace))
        dog = threading.Thread(target=self.watchdog, daemon=True)
        dog.start()
        try:
            try:
                self.c = self.start()
                self.load()
                if on_phase:
                    on_phase("load")
                for i in range(WORKLOAD_OPS):
                    if i == WORKLOAD_OPS // 2:
                        if on_phase:
                            on_phase("half")
                        self.arm()
                    self.check_time()
                    self.op()
                if on_phase:
                    on_phase("workload")
                bad = self.verify()
                res["corrupt_keys"] = len(bad)
                res["corrupt_sample"] = bad[:5]
                # PHOENIX's validation accepts a partial dataset (every key
                # present right, some missing): reported, not a class
                res["corrupt_missing_only"] = bool(bad) and self.missing_only
            except Unrecovered as e:
                res["unrecovered"] = str(e)
            except HarnessError as e:
                res["harness_error"] = str(e)
            except Exception as e:  # a bug of the harness: one run's error, not the campaign's
                res["harness_error"] = f"{type(e).__name__}: {e}: {traceback.format_exc()[-1500:]}"
            finally:
                if getattr(self, "c", None) is not None:
                    self.c.close()
        finally:
            self.done.set()
            dog.join()
            self.server.stop()
        s = self.server
        err = s.stderr()
        res["fired"] = "rekindle-fault: fired" in err
        res["fired_sites"] = list(dict.fromkeys(FIRED.findall(err)))  # in the order they fired
        res["workload"] = self.workload
        if self.arm_signal:
            res["armed_by_signal"] = getattr(self, "armed_at_midpoint", False)
        res["failures"] = [{k: e.get(k) for k in ("kind", "reason", "signal", "exit_code", "generation")}
                           for e in s.events("failure")]  # fmt: skip
        res["ups"] = [{k: e.get(k) for k in ("generation", "kind", "code", "reason")} for e in s.events("up")]
        res.update(unnoticed_restarts=self.unnoticed_restarts, error_replies=self.error_replies,
                   read_mismatches=self.read_mismatches, harness_kills=self.harness_kills,
                   mismatches_before_restart=self.mismatches_before_restart,
                   seconds=round(time.monotonic() - t0, 3))  # fmt: skip
        res["observed"] = observed(res)
        return res

    def arm(self):
        """PHOENIX's switch to the faulty versions: ARM_SIGNAL to the app,
        if it is still the first incarnation (a restarted one runs the fixed
        code, and ARM_SIGNAL's default action would kill it)."""
        s = self.server
        if not self.arm_signal or len(s.events("up")) != 1:
            return
        pid = s.app_pid()
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, ARM_SIGNAL)
        self.armed_at_midpoint = True

    def start(self):
        s = self.server
        deadline = time.monotonic() + 10
        while True:
            if s.proc.poll() is not None:
                raise HarnessError(f"rekindle run exited ({s.proc.returncode}): {s.stderr()[-1500:]}")
            if s.events("up"):
                c = s.ping(1.0)
                if c is not None:
                    self.ident = identity(c)
                    c.close()
                    self.sync_generations()
                    return s.client(single=True)
            if time.monotonic() > deadline:
                raise HarnessError(f"the server never came up: {s.stderr()[-1500:]}")
            time.sleep(0.01)


FIRED = re.compile(r"rekindle-fault: fired site=([0-9a-f]{16}:\d+)")


def fnv64(x):
    """FNV-1a, 64 bits, of an int's decimal digits or of bytes: YCSB hashes
    key numbers with it (Utils.fnvhash64), and scrambles its Zipfian ranks."""
    h = 0xCBF29CE484222325
    for b in x if isinstance(x, bytes) else str(x).encode():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


class Zipfian:
    """YCSB's ZipfianGenerator (Gray et al., "Quickly generating
    billion-record synthetic databases"): ranks 0..n-1, rank 0 the most
    popular, for an n that grows as records are inserted."""

    def __init__(self, theta):
        self.theta, self.n, self.zetan = theta, 0, 0.0
        self.zeta2 = 1 + 0.5**theta

    def next(self, rng, n):
        while self.n < n:
            self.n += 1
            self.zetan += 1 / self.n**self.theta
        if n <= 1:
            return 0
        t = self.theta
        alpha = 1 / (1 - t)
        eta = (1 - (2 / n) ** (1 - t)) / (1 - self.zeta2 / self.zetan)
        u = rng.random()
        uz = u * self.zetan
        if uz < 1:
            return 0
        if uz < 1 + 0.5**t:
            return 1
        return min(n - 1, int(n * (eta * u - eta + 1) ** alpha))


def identity(c):
    """Which process answers: changes at every restart, warm or cold, in
    place or not (rkv: its generation; Redis: run_id, new at each exec)."""
    try:
        info = c.info("server")
    except Exception:  # a server that cannot answer INFO: unknown
        return None
    ident = (info.get("run_id"), info.get("rekindle_generation"), info.get("process_id"))
    return ident if any(ident) else None


def observed(res):
    """crash, hang or none: what the first failure was."""
    if not res.get("failures"):
        return "hang" if res.get("harness_kills") else "none"
    f = res["failures"][0]
    return "hang" if f.get("kind") == "hang" or res.get("harness_kills") else "crash"


def classify(res):
    """Exactly one of CLASSES."""
    if "harness_error" in res:
        return "harness error"
    if "unrecovered" in res:
        return "unrecovered"
    restarts = [u for u in res.get("ups", []) if (u.get("generation") or 0) > 0]
    corrupt = res.get("corrupt_keys", 0) > 0
    if not restarts:
        if corrupt:
            return "silent corruption"
        return "no effect" if res.get("fired") else "not triggered"
    if corrupt:
        v = res.get("vanilla_result")
        if v is None or v.get("harness_error"):
            return "harness error"
        # a vanilla restart that never came back is no better off
        return (
            "shared corruption" if v.get("unrecovered") or v.get("corrupt_keys") else "additional corruption"
        )
    first = restarts[0]
    if first.get("kind") == "cold":
        return "fallback: unsafe region" if first.get("code") == "unsafe_region_open" else "fallback: other"
    if any(u.get("kind") == "cold" for u in restarts[1:]):
        return "fallback: crash after recovery"
    return "warm recovery"


def inconsistencies(res):
    """What in a classified result contradicts its class (empty when none):
    the campaign's and the system test's check of the classification."""
    c = res.get("class")
    restarts = [u for u in res.get("ups", []) if (u.get("generation") or 0) > 0]
    corrupt = res.get("corrupt_keys", 0) > 0
    out = []
    if c not in CLASSES:
        return [f"unknown class {c!r}"]
    if c in ("harness error", "unrecovered"):
        return out
    if res.get("unnoticed_restarts"):
        out.append("the workload's connection did not see a restart")
    if "corrupt_keys" not in res:
        out.append("no final check")
    if c in ("silent corruption", "no effect", "not triggered") and restarts:
        out.append(f"{c} with restarts {restarts}")
    if (c in ("silent corruption", "additional corruption", "shared corruption")) != corrupt:
        out.append(f"{c} with corrupt_keys={res.get('corrupt_keys')}")
    if c == "not triggered" and res.get("fired"):
        out.append("not triggered, but the fault fired")
    if c in ("additional corruption", "shared corruption"):
        v = res.get("vanilla_result") or {}
        if not restarts:
            out.append(f"{c} without a restart")
        if (c == "shared corruption") != bool(v.get("corrupt_keys") or v.get("unrecovered")):
            out.append(f"{c}, but the vanilla run had corrupt_keys={v.get('corrupt_keys')}")
    if c.startswith("fallback") or c == "warm recovery":
        if not restarts:
            out.append(f"{c} without a restart")
        elif c == "warm recovery" and any(u.get("kind") != "warm" for u in restarts):
            out.append(f"warm recovery with restarts {restarts}")
        first = restarts[0] if restarts else {}
        if (c == "fallback: unsafe region" and first.get("code") != "unsafe_region_open") or (
            c == "fallback: crash after recovery" and first.get("kind") != "warm"
        ):
            out.append(f"{c} with first restart {first}")
    return out


# ---- profiling and campaigns ------------------------------------------------------------


def profile(target, workdir, seed=1, workload="mixed"):
    """The traced vanilla workload: {site: (load count, workload count)} for
    every site the workload executes, with the sites' descriptions."""
    return profile_full(target, workdir, seed, workload)[0]


def profile_full(target, workdir, seed=1, workload="mixed"):
    """The traced vanilla workload: (executed, pool, half) where executed is
    profile()'s dict; pool: every site of the functions that have an
    executed site (PHOENIX's gcov function list), as {id: site}; half:
    {id: count} of every site at the workload's midpoint (the count a fault
    armed "halfway" must let pass)."""
    trace = Path(workdir) / "trace"
    marks = {}

    def on_phase(name):
        marks[name] = read_counts(f"{trace}.counts")

    r = Run(target, "regions", Path(workdir) / "run", seed=seed, workload=workload)
    res = r.execute(trace=trace, on_phase=on_phase)
    clean = res.get("corrupt_keys") == 0 and not res.get("error_replies") and not res.get("read_mismatches")
    if "workload" not in marks or res.get("ups", [{}])[-1].get("generation") != 0 or not clean:
        raise HarnessError(f"the profiling run failed: {res}")
    sites = {s["id"]: s for s in read_sites(target.exe)}
    out = {}
    for sid, total in marks["workload"].items():
        loaded = marks["load"].get(sid, 0)
        if total > loaded and sid in sites:
            out[sid] = dict(sites[sid], load_count=loaded, workload_count=total - loaded)
    fns = {s["function"] for s in out.values()}
    pool = {sid: s for sid, s in sites.items() if s["function"] in fns}
    return out, pool, marks["half"]


def one_run(target, config, site, after, seed, workdir, keep=False, workload="mixed", arm_signal=False):
    """A run, and its vanilla twin when it ended corrupt after a failure;
    returns the result with its class."""
    Path(workdir).mkdir(parents=True, exist_ok=True)
    wd = Path(tempfile.mkdtemp(prefix=f"{target.name}-{config}-", dir=workdir))
    try:
        res = Run(target, config, wd / "rk", site=site, after=after, seed=seed, workload=workload,
                  arm_signal=arm_signal).execute()  # fmt: skip
        restarted = any((u.get("generation") or 0) > 0 for u in res.get("ups", []))
        if res.get("corrupt_keys") and restarted:
            v = Run(target, config, wd / "vanilla", site=site, after=after, seed=seed, vanilla=True,
                    workload=workload, arm_signal=arm_signal).execute()  # fmt: skip
            fields = (
                "corrupt_keys",
                "corrupt_sample",
                "observed",
                "ups",
                "harness_error",
                "unrecovered",
                "fired",
            )
            res["vanilla_result"] = {k: v[k] for k in fields if k in v}
        res["class"] = classify(res)
        bad = inconsistencies(res)
        if bad:
            res["inconsistent"] = bad
        return res
    finally:
        if keep:
            print(f"campaign: the run's directory is kept: {wd}", file=sys.stderr)
        else:
            shutil.rmtree(wd, ignore_errors=True)


def pick(sites, rng):
    sid = rng.choice(sorted(sites))
    s = sites[sid]
    return s, s["load_count"] + s["workload_count"] // 2


def pick_many(pool, half, k, rng):
    """k distinct sites drawn uniformly from pool (PHOENIX: bugs evenly
    spread over the instructions of the activated functions), each armed
    from the midpoint: AFTER = its count there."""
    chosen = rng.sample(sorted(pool), min(k, len(pool)))
    return [pool[sid] for sid in chosen], [half.get(sid, 0) for sid in chosen]


def campaign(target, config, sites, runs, seed, workdir, jobs=1, log=None, partial=None,
             method=METHODS["ours"], pool=None, half=None, workload_seed=1):  # fmt: skip
    """runs runs of one configuration.  method "ours": one site of sites a
    run; "phoenix": method.faults sites of pool, armed at their half
    counts, and the profile's workload (workload_seed) in every run."""
    rng = random.Random(f"{seed}-{target.name}" + ("" if method.name == "ours" else f"-{method.name}"))
    plan = []  # the same faults in every configuration
    for i in range(runs):
        if method.faults == 1 and method.pool == "sites":
            s, after = pick(sites, rng)
            chosen, afters = [s], [after]
        else:
            chosen, afters = pick_many(
                pool if method.pool == "functions" else sites, half or {}, method.faults, rng
            )
        run_seed = rng.randrange(1 << 30)
        plan.append((chosen, afters, workload_seed if method.deterministic else run_seed, i))

    def go(p):
        chosen, afters, run_seed, i = p
        ids = ",".join(s["id"] for s in chosen)
        after = afters[0] if len(afters) == 1 else ",".join(map(str, afters))
        if method.arm == "signal":
            after = 0
        res = one_run(target, config, ids, after, run_seed, workdir, workload=method.workload,
                      arm_signal=method.arm == "signal")  # fmt: skip
        # the site that fired first names the run (the first drawn, if none did)
        by_id = {s["id"]: s for s in chosen}
        s = next((by_id[f] for f in res.get("fired_sites", []) if f in by_id), chosen[0])
        res.update(type=s["type"], function=s["function"], loc=s.get("loc"), method=method.name)
        if log:
            log(f"{target.name}/{config}/{method.name} {i + 1}/{runs} {s['type']} {s['function']} -> "
                f"{res['class']} ({res['observed']}, {res['seconds']}s)")  # fmt: skip
        if partial:  # every finished run, so a campaign cut short still has its results
            with open(partial, "a") as f:
                f.write(json.dumps(res) + "\n")
        return res

    if jobs <= 1:
        return [go(p) for p in plan]
    with ThreadPoolExecutor(jobs) as ex:
        return list(ex.map(go, plan))


# ---- output -------------------------------------------------------------------------------


def row(r):
    """A result's row in the tables: (target, configuration), the method
    named after the configuration when it is not ours."""
    m = r.get("method", "ours")
    return r["target"], r["config"] if m == "ours" else f"{r['config']}, {m}"


def summarize(results):
    """{(target, config): {class: count}} and the runs' total."""
    out = {}
    for r in results:
        d = out.setdefault(row(r), dict.fromkeys(CLASSES, 0))
        d[r["class"]] += 1
    return out


def cold_codes(results):
    """{(target, config): {code: count}}: why the fallbacks went cold (the
    first cold restart's decision code)."""
    out = {}
    for r in results:
        if r["class"].startswith("fallback"):
            code = next((u.get("code") for u in r.get("ups", []) if u.get("kind") == "cold"), None)
            d = out.setdefault(row(r), {})
            d[code] = d.get(code, 0) + 1
    return out


def count(results, target, config, field):
    out = {}
    for r in results:
        if row(r) == (target, config):
            out[str(r.get(field))] = out.get(str(r.get(field)), 0) + 1
    return out


def phoenix_row(d):
    """PHOENIX Table 7's columns from our classes: the runs that failed
    (crash or hang, so a restart), warm recoveries (Rec.), fallbacks by the
    unsafe-region check (Chk.), other fallbacks (Fbk.: a crash after
    recovery, or the runtime's own checks), the rate Rec. / failed, and the
    corruption classes (Add., Shd.; Sil. without a restart)."""
    failed = sum(d[k] for k in CLASSES[:6]) + d["unrecovered"]
    fbk = d["fallback: crash after recovery"] + d["fallback: other"]
    rate = 100 * d["warm recovery"] / failed if failed else 0.0
    return (
        failed,
        d["warm recovery"],
        d["fallback: unsafe region"],
        fbk,
        rate,
        d["additional corruption"],
        d["shared corruption"],
        d["silent corruption"],
    )


def corruption_notes(results):
    """One line per target and configuration with additional or shared
    corruption: the functions and fault types of those runs."""
    out = {}
    for r in results:
        if r["class"] in ("additional corruption", "shared corruption"):
            d = out.setdefault((*row(r), r["class"]), {})
            w = f"{r.get('function')} ({r.get('type')})"
            d[w] = d.get(w, 0) + 1
            if r.get("corrupt_missing_only"):
                d[None] = d.get(None, 0) + 1
    lines = []
    for (t, c, cls), d in sorted(out.items()):
        missing = d.pop(None, 0)
        where = ", ".join(f"{k} x{v}" if v > 1 else k for k, v in sorted(d.items()))
        lines.append(
            f"- {t} / {c}, {cls}: {sum(d.values())}: {where}"
            + (f" ({missing} with only missing keys, which PHOENIX's validation accepts)" if missing else "")
        )
    return lines


def table_md(summary, meta, codes=None, notes=None):
    cols = [c for c in CLASSES if any(d[c] for d in summary.values())] or list(CLASSES)
    lines = [
        f"# Fault campaign ({meta['date']})",
        "",
        f"{meta['note']}",
        "",
        "| target | configuration | runs | " + " | ".join(cols) + " |",
        "|---|---|---|" + "---|" * len(cols),
    ]
    for (t, c), d in sorted(summary.items()):
        n = sum(d.values())
        cells = [f"{d[k]} ({100 * d[k] / n:.1f}%)" for k in cols]
        lines.append(f"| {t} | {c} | {n} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "As PHOENIX's Table 7 (the rate is warm recoveries of the runs that failed, crash or hang;"
        " Fbk. = crash after recovery + other fallbacks; Add./Shd. count among the failed runs):",
        "",
        "| target | configuration | failed | Rec. | Chk. | Fbk. | Rate | Add. | Shd. | Sil. |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (t, c), d in sorted(summary.items()):
        f, rec, chk, fbk, rate, add, shd, sil = phoenix_row(d)
        lines.append(f"| {t} | {c} | {f} | {rec} | {chk} | {fbk} | {rate:.1f}% | {add} | {shd} | {sil} |")
    lines.append("")
    for (t, c), d in sorted((codes or {}).items()):
        why = ", ".join(f"{k} {v}" for k, v in sorted(d.items(), key=lambda kv: -kv[1]))
        lines.append(f"- {t} / {c}, why the fallbacks went cold: {why}")
    lines += notes or []
    lines.append("")
    return "\n".join(lines)


def chart(summary, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted(summary)
    cols = [c for c in CLASSES if any(summary[k][c] for k in keys)]
    fig, ax = plt.subplots(figsize=(min(14, max(8, 1.3 * len(cols) + 3)), 5.5))
    width = 0.8 / max(1, len(keys))
    for i, k in enumerate(keys):
        n = sum(summary[k].values())
        ys = [100 * summary[k][c] / n for c in cols]
        xs = [j + i * width for j in range(len(cols))]
        bars = ax.bar(xs, ys, width, label=f"{k[0]} / {k[1]} (n={n})")
        for x, y in zip(xs, ys, strict=True):
            if y:
                ax.text(x, y + 0.5, f"{y:.0f}", ha="center", fontsize=7)
        del bars
    ax.set_xticks([j + width * (len(keys) - 1) / 2 for j in range(len(cols))])
    labels = [c.replace(": ", ":\n").replace(" corruption", "\ncorruption") for c in cols]
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel("% of runs")
    ax.set_title("Rekindle fault campaign (PHOENIX Table 7 classes)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=20, help="runs per target and configuration")
    ap.add_argument("--targets", default="rkv,redis")
    ap.add_argument("--configs", default="regions,noregions")
    ap.add_argument(
        "--methods", default="ours", help="ours, phoenix, or both (comma-separated): see the docstring"
    )
    ap.add_argument("--workload", default="mixed", choices=WORKLOADS, help="the workload (--one)")
    ap.add_argument("--arm-signal", action="store_true",
                    help="(--one) the faults act once the harness signals the midpoint")  # fmt: skip
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--name", default="faults", help="output file stem")
    ap.add_argument("--one", action="store_true", help="a single run: --target --config --site --after")
    ap.add_argument("--target", default="rkv")
    ap.add_argument("--config", default="regions")
    ap.add_argument("--site")
    ap.add_argument("--after", default="0", help="one count, or one per site (comma-separated)")
    ap.add_argument("--keep", action="store_true", help="keep the run's directory (--one)")
    ap.add_argument("--redraw", metavar="JSON", help="write the .md and .png again from a campaign's JSON")
    a = ap.parse_args()

    if a.redraw:
        doc = json.loads(Path(a.redraw).read_text())
        results = doc["runs"]
        stem = Path(a.redraw).with_suffix("")
        summary, codes = summarize(results), cold_codes(results)
        stem.with_suffix(".md").write_text(table_md(summary, doc["meta"], codes, corruption_notes(results)))
        chart(summary, stem.with_suffix(".png"))
        return 0

    work = Path(tempfile.mkdtemp(prefix="rk-faults-"))
    try:
        if a.one:
            t = TARGETS[a.target](a.build)
            res = one_run(t, a.config, a.site, a.after, a.seed, work, keep=a.keep, workload=a.workload,
                          arm_signal=a.arm_signal)  # fmt: skip
            print(json.dumps(res, indent=1))
            return 0
        methods = a.methods.split(",")
        unknown = [m for m in methods if m not in METHODS]
        if unknown:
            print(
                f"campaign: unknown method(s) {', '.join(unknown)} (one of {', '.join(METHODS)})",
                file=sys.stderr,
            )
            return 2
        bad_configs = [c for c in a.configs.split(",") if c not in ALL_CONFIGS]
        if bad_configs:
            known = ", ".join(ALL_CONFIGS)
            print(
                f"campaign: unknown configuration(s) {', '.join(bad_configs)} (one of {known})",
                file=sys.stderr,
            )
            return 2
        results, profiles = [], {}
        Path(a.out).mkdir(parents=True, exist_ok=True)
        partial = Path(a.out) / f"{a.name}.partial.jsonl"
        partial.unlink(missing_ok=True)
        t_start = time.monotonic()
        for tn in a.targets.split(","):
            t = TARGETS[tn](a.build)
            if not t.exe.exists():
                print(f"campaign: {t.exe} missing: run bench/faults/build.sh", file=sys.stderr)
                return 2
            for mn in methods:
                method = METHODS[mn]
                sites, pool, half = profile_full(t, work / f"profile-{tn}-{mn}", workload=method.workload)
                key = tn if mn == "ours" else f"{tn}, {mn}"
                profiles[key] = {"executed_sites": len(sites), "all_sites": len(read_sites(t.exe)),
                                 "pool_sites": len(pool) if method.pool == "functions" else len(sites),
                                 "functions": len({s["function"] for s in sites.values()})}  # fmt: skip
                print(f"campaign: {key}: {len(sites)} sites executed by the {method.workload} workload "
                      f"(of {profiles[key]['all_sites']}), in {profiles[key]['functions']} functions with "
                      f"{len(pool)} sites", file=sys.stderr)  # fmt: skip
                for cfg in a.configs.split(","):
                    results += campaign(t, cfg, sites, a.runs, a.seed, work, a.jobs,
                                        log=lambda m: print(m, file=sys.stderr, flush=True),
                                        partial=partial, method=method, pool=pool, half=half)  # fmt: skip
        elapsed = time.monotonic() - t_start
        summary = summarize(results)
        meta = {
            "date": time.strftime("%Y-%m-%d"),
            "runs_per_config": a.runs,
            "methods": methods,
            "seed": a.seed,
            "jobs": a.jobs,
            "elapsed_s": round(elapsed, 1),
            "profiles": profiles,
            "workload": {"load_keys": LOAD_KEYS, "ops": WORKLOAD_OPS, "op_timeout_s": OP_TIMEOUT,
                         "hang_timeout": HANG_TIMEOUT, "ycsb_records": YCSB_RECORDS,
                         "ycsb_read": YCSB_READ,
                         "faults_per_run": {m: METHODS[m].faults for m in methods}},  # fmt: skip
            "note": (f"{a.runs} runs per target and configuration, seed {a.seed}, {elapsed:.0f} s "
                     f"({elapsed / max(1, len(results)):.2f} s a run, {a.jobs} job(s))"),
        }  # fmt: skip
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        codes = cold_codes(results)
        doc = {
            "meta": meta,
            "classes": list(CLASSES),
            "summary": [{"target": t, "config": c, "runs": sum(d.values()), "counts": d,
                         "percent": {k: round(100 * v / sum(d.values()), 2) for k, v in d.items()},
                         "fallback_codes": codes.get((t, c), {}),
                         "observed": count(results, t, c, "observed"), "fired": count(results, t, c, "fired")}
                        for (t, c), d in sorted(summary.items())],
            "runs": results,
        }  # fmt: skip
        (out / f"{a.name}.json").write_text(json.dumps(doc, indent=1) + "\n")
        (out / f"{a.name}.md").write_text(table_md(summary, meta, codes, corruption_notes(results)))
        chart(summary, out / f"{a.name}.png")
        print(table_md(summary, meta, codes, corruption_notes(results)))
        partial.unlink(missing_ok=True)
        return 0
    finally:
        if not (a.one and a.keep):  # --keep: one_run said where the run's directory is
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
