#!/usr/bin/env python3
"""Error virtualization's survivability and recovery-surface campaign
(issue 16; docs/results.md, "Error virtualization: faults").

Each server is built with the project's fault injector and then errvirt
(BUILD/errvirt/{nginx,lighttpd}-fi-ev, BUILD/errvirt/rkv-fi-ev).  Per
server:

1. **Profile.**  A traced run (REKINDLE_FAULT_TRACE) of the workload: the
   sites whose count grew during the workload are the candidates (the paths
   the workload executes, as PHOENIX §6 and FIRestarter inject into).
2. **Recovery surface.**  An unarmed run with REKINDLE_EV_REPORT=1, minus an
   idle run (start, serve one probe, stop): of the transactions the
   workload executed (gates passed), the share whose window was still open
   at the next gate, i.e. a crash anywhere in it is recoverable.
3. **Fail-stop faults.**  Candidates in a seeded random order, each armed
   persistent from the middle of its workload count, with errvirt off at
   run time (REKINDLE_EV=off, the same binary): a fault is *triggered* and
   fail-stop when it fired and the server crashed (died of SIGSEGV, SIGBUS,
   SIGFPE or SIGILL; for rkv, librekindle reported a restart).  Faults that
   never crash (PHOENIX's types mostly corrupt silently) are counted and
   left out, as FIRestarter counts only faults that crash the vanilla
   server.
4. **With errvirt.**  Each fail-stop fault again, errvirt on.  *Survived*:
   the process lived through every crash in the same process (same pid, no
   fallback, no restart), the clients did not hang, and a last probe got an
   answer, an error one included (each of the workload's requests on a new
   connection until one is answered; rkv: PING).  *Process kept*, reported
   beside it: the same without the last probe, FIRestarter's "crash
   recovered" (a persistent fault on every request's path leaves a process
   that lives but fails every request: kept, not survived).
   Otherwise the run records why (the fallback's reason code).  Every
   recovery's latency (the run-time's recovery_ns: the signal to the
   program's error path) is kept.

The workloads: nginx and lighttpd, GETs of a static file, `/` (the
directory index), a 64 KiB file, a directory listing and a missing page over
two keep-alive connections
(tools/errvirt/servers/http_servers.py); rkv, redis-benchmark (PING, SET, GET, INCR, MSET).

With --sample noncritical the faults are FIRestarter's sample instead: one
per unique transaction on a non-critical path (the workload's transactions
from a gate trace, each classed by a probe that makes its gate fail once;
docs/errvirt.md, "Non-critical transactions").  Every server runs under
`setarch -R`, address randomization off, so that a gate's pc names its
transaction in every run.

Usage: fault_campaign.py BUILD [--servers nginx,lighttpd,rkv] [--candidates N]
       [--want SERVER=N,...] [--seed S] [--requests N] [--ports LO-HI]
       [--sample all|noncritical] [--mask-socket-writes] [--out DIR]
The candidates' order depends on the seed and on each site alone (its
function, type and position), so runs and build trees draw the same faults
as long as the workload executes them.
Writes DIR/errvirt-faults.{json,md,png} (DIR: bench/results), or
DIR/errvirt-faults-noncritical.* for the non-critical sample; with
--mask-socket-writes, the same names ending in -masked."""

import argparse
import collections
import hashlib
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "faultinject"))
sys.path.insert(0, str(ROOT / "tools" / "errvirt" / "servers"))
sys.path.insert(0, str(ROOT / "tools" / "errvirt"))
import http_servers as hs  # noqa: E402
from fi_trace import TraceError, read_counts  # noqa: E402

CRASH_SIGNALS = {-signal.SIGSEGV, -signal.SIGBUS, -signal.SIGFPE, -signal.SIGILL}
# FIRestarter (DSN'19), Tables III and IV: recovery surface and injected
# persistent faults survived / triggered.
FIRESTARTER = {
    "nginx": {"surface": 84.6, "survived": 10, "triggered": 10},
    "lighttpd": {"surface": 77.9, "survived": 29, "triggered": 41},
    "rkv": {"surface": None, "survived": 9, "triggered": 10, "note": "Redis"},
}
WANT = {"nginx": 10, "lighttpd": 41, "rkv": 10}


# ---- the servers -----------------------------------------------------------


class HttpTarget:
    def __init__(self, kind, exe, requests):
        self.kind, self.exe, self.requests = kind, exe, requests

    def start(self, d, env):
        s = hs.Server(self.kind, self.exe, d, env=env)
        if not s.wait_serving():
            s.stop()
            return None, s
        return s, s

    def workload(self, s, seed):
        """The requests on two keep-alive connections (every 8th on the
        second); what the clients saw."""
        rng = random.Random(seed)
        seen = collections.Counter()
        conns = [None, None]
        deadline = time.monotonic() + 30
        for i in range(self.requests):
            if time.monotonic() > deadline or seen["timeout"] >= 3:
                seen["gave up (hang)"] += 1
                break
            k = 1 if i % 8 == 7 else 0
            path = rng.choice(hs.PATHS).format(i=i)
            try:
                if conns[k] is None:
                    conns[k] = http.client.HTTPConnection("127.0.0.1", s.port, timeout=2)
                status, body = hs.get(conns[k], path)
                verdict = hs.check(status, body, path)
                seen[
                    "ok" if verdict == "ok" else ("error status" if verdict.startswith("status") else verdict)
                ] += 1
            except TimeoutError:
                seen["timeout"] += 1
                conns[k] = None
            except (OSError, http.client.HTTPException):
                seen["connection lost"] += 1
                conns[k] = None
                if s.proc.poll() is not None:
                    seen["server gone"] += 1
                    break
        for c in conns:
            if c is not None:
                c.close()
        # still answering at the end: an HTTP response, an error one included,
        # to any of the workload's requests on a new connection (a persistent
        # fault may sit on the path of some of them)
        answer = None
        for path in hs.PATHS:
            try:
                c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=2)
                answer = hs.get(c, path.format(i=0))[0]
                c.close()
                break
            except (OSError, http.client.HTTPException):
                continue
        seen[f"final probe {answer}"] += 1
        return seen

    def restarted(self, s):
        return False  # no librekindle: a fallback kills the process


class RkvTarget:
    def __init__(self, exe, requests):
        self.kind, self.exe, self.requests = "rkv", exe, requests

    def start(self, d, env):
        d.mkdir(parents=True, exist_ok=True)
        port = hs.free_port()
        err = open(d / "stderr", "w")  # noqa: SIM115 - closed by stop()
        argv = [str(self.exe), "--port", str(port), "--dir", str(d), "--save", ""]
        proc = subprocess.Popen(hs.ARGV_PREFIX + argv, stderr=err, stdout=subprocess.DEVNULL, env=env)
        s = _Proc(proc, port, d, err)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None:
            if _ping(port) is not None:
                return s, s
            time.sleep(0.03)
        s.stop()
        return None, s

    def workload(self, s, seed):
        seen = collections.Counter()
        seen["ping before " + str(_ping(s.port))] += 1
        cmd = [
            "redis-benchmark",
            "-p",
            str(s.port),
            "-n",
            str(self.requests),
            "-c",
            "2",
            "-q",
            "-t",
            # rkv's own commands: it has no lists, and redis-benchmark stops
            # at the first test answered with an error
            "ping,set,get,incr,mset",
            "-r",
            "200",
        ]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
            seen["benchmark exit " + str(p.returncode)] += 1
            seen["error replies"] += (p.stdout + p.stderr).count("ERR")
        except subprocess.TimeoutExpired:
            seen["gave up (hang)"] += 1
        seen["ping after " + str(_ping(s.port))] += 1
        return seen

    def restarted(self, s):
        return '{"rekindle":"restart"' in s.text()


def _ping(port):
    """PONG, an error line, or None (no answer within 2 s)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as c:
            c.sendall(b"PING\r\n")
            return c.recv(64).decode(errors="replace").strip() or None
    except OSError:
        return None


class _Proc:
    """rkv's process, with the Server interface the campaign uses."""

    def __init__(self, proc, port, d, err):
        self.proc, self.port, self.d, self.err, self.pid = proc, port, d, err, proc.pid

    def stop(self, timeout=10):
        return hs.stop_process(self.proc, self.err, timeout)

    def text(self):
        return (self.d / "stderr").read_text(errors="replace")

    def ev(self, kind=None):
        out = []
        for line in self.text().splitlines():
            if line.startswith('{"rekindle_ev"'):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
        return [e for e in out if kind is None or e["rekindle_ev"] == kind]


# ---- one run ------------------------------------------------------------------


def run(target, d, env, seed, do_workload=True):
    """Start, run the workload, stop; what happened."""
    s, handle = target.start(d, env)
    if s is None:
        rc = handle.stop()
        return {"started": False, "rc": rc, "text": handle.text(), "ev": handle.ev(), "clients": {}}
    pid = s.pid
    seen = target.workload(s, seed) if do_workload else collections.Counter()
    if not do_workload and isinstance(target, HttpTarget):
        c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=2)
        seen["probe " + str(hs.get(c, "/index.html")[0])] += 1
        c.close()
    alive = s.proc.poll() is None
    restarted = target.restarted(s)
    if isinstance(s, hs.Server):
        # SIGTERM, and wake nginx's single process if it sleeps through it
        # (http_servers.Server.terminate): no SIGKILL, so its exit-time
        # report line is written
        s.terminate()
    rc = s.stop()
    return {
        "started": True,
        "pid": pid,
        "alive_at_end": alive,
        "rc": rc,
        "restarted": restarted,
        "clients": dict(seen),
        "text": s.text(),
        "ev": s.ev(),
    }


def fired(r):
    return "rekindle-fault: fired" in r["text"]


def crashed(r):
    return (not r["alive_at_end"] and r["rc"] in CRASH_SIGNALS) or r["restarted"] if r["started"] else False


def report_counts(r):
    rep = [e for e in r["ev"] if e["rekindle_ev"] == "report"]
    return rep[-1] if rep else None


# ---- a server's campaign ------------------------------------------------------------


def profile(target, tmp, seed):
    """{site: (count at load, count during the workload)} for the sites the
    workload executed."""
    d = tmp / "profile"
    trace = d / "trace"
    d.mkdir(parents=True)
    env = dict(os.environ, REKINDLE_FAULT_TRACE=str(trace))
    s, handle = target.start(d, env)
    if s is None:
        handle.stop()
        raise RuntimeError(f"{target.kind}: the traced run did not serve: {handle.text()[-800:]}")
    before = read_counts(str(trace) + ".counts")
    target.workload(s, seed)
    after = read_counts(str(trace) + ".counts")
    s.stop()
    return {k: (before.get(k, 0), n - before.get(k, 0)) for k, n in after.items() if n > before.get(k, 0)}


def surface(target, tmp, seed):
    env = dict(os.environ, REKINDLE_EV_REPORT="1")
    idle = report_counts(run(target, tmp / "idle", env, seed, do_workload=False))
    busy = report_counts(run(target, tmp / "surface", env, seed))
    if not idle or not busy:
        return {"error": "reason=no_report: a run wrote no report line"}
    gates = busy["gates"] - idle["gates"]
    closed = busy["closed"] - idle["closed"]
    return {
        "gates": gates,
        "closed": closed,
        "closed_irrecoverable": busy["closed_irrecoverable"] - idle["closed_irrecoverable"],
        "closed_unknown": busy["closed_unknown"] - idle["closed_unknown"],
        "surface_pct": round(100.0 * (gates - closed) / gates, 1) if gates else None,
        "idle": idle,
        "busy": busy,
    }


def sites_info(exe):
    from fi_sites import read_sites

    return {s["id"]: s for s in read_sites(exe)}


def draw_order(prof, info, seed, kind):
    """The candidates in a seeded order that is the same for a site whatever
    else the workload executed: each site's rank is a hash of the seed and
    of what the site is (function, fault type, source position, index in its
    file), not its place in a shuffled list.  A shuffle of the executed set
    drew other faults whenever timing added or dropped a site (timers, the
    once-a-second Date header), and the injector's ids carry a hash of the
    source path, which differs between build trees."""

    def rank(site):
        meta = info.get(site, {})
        what = (meta.get("function"), meta.get("type"), meta.get("loc"), site.rpartition(":")[2])
        key = "|".join(str(x) for x in (seed, kind, *what))
        return hashlib.sha256(key.encode()).hexdigest(), site

    return sorted(prof, key=rank)


# ---- FIRestarter's sample: one fault per non-critical transaction ----------


def name_pcs(maps, pcs):
    """{pc: "function (file:line)"} by addr2line, from the process's
    /proc/PID/maps text (a pc in a module is its offset from the module's
    first mapping)."""
    spans, base = [], {}
    for line in maps.splitlines():
        f = line.split()
        if len(f) < 6 or not f[5].startswith("/"):
            continue
        lo, hi = (int(x, 16) for x in f[0].split("-"))
        base[f[5]] = min(base.get(f[5], lo), lo)
        spans.append((lo, hi, f[5]))
    by_module = collections.defaultdict(list)
    for pc in pcs:
        for lo, hi, path in spans:
            if lo <= pc < hi:
                by_module[path].append(pc)
                break
    out = {}
    for path, mpcs in by_module.items():
        addrs = [f"{pc - base[path]:#x}" for pc in mpcs]
        argv = ["addr2line", "-f", "-s", "-e", path, *addrs]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        lines = p.stdout.splitlines()
        for i, pc in enumerate(mpcs):
            fn, loc = (lines[2 * i : 2 * i + 2] + ["??", "??"])[:2]
            out[pc] = f"{fn} ({Path(path).name}: {loc})"
    return out


def gate_profile(target, tmp, seed):
    """The transactions the workload executes: {gate pc: (call, passes at
    load, passes during the workload)}, and their names."""
    from ev_gates import read_gates

    d = tmp / "gates"
    trace = d / "trace"
    d.mkdir(parents=True)
    s, handle = target.start(d, traced(trace))
    if s is None:
        handle.stop()
        raise RuntimeError(f"{target.kind}: the gate-traced run did not serve: {handle.text()[-800:]}")
    maps = Path(f"/proc/{s.pid}/maps").read_text()
    before = read_gates(trace)
    target.workload(s, seed)
    after = read_gates(trace)
    s.stop()
    gates = {
        pc: (name, before.get(pc, (name, 0))[1], n - before.get(pc, (name, 0))[1])
        for pc, (name, n) in after.items()
        if n > before.get(pc, (name, 0))[1]
    }
    return gates, name_pcs(maps, list(gates))


def traced(path, env=None):
    """The environment with the gate trace on: every errvirt run of the
    sample maps the trace file as the traced run did, so that the modules a
    server loads later (lighttpd's mod_dirlisting.so) land at the same
    addresses, and their gates keep their pcs."""
    return dict(env if env is not None else os.environ, REKINDLE_EV_GATE_TRACE=str(path))


def classify_gate(target, tmp, seed, pc, load, work):
    """Make the gate fail once, in the middle of the workload, as a
    recovery would, and see what the program's error handler does
    (FIRestarter §VI-B): it exits (or librekindle restarts it), it retries
    the same call (the next gate passed is this one), or the service is
    lost (the last probe gets no answer, or a client hangs): a critical
    path.  Otherwise it went its own way: non-critical."""
    for n in (load + max(1, work // 2), load + 1):
        env = dict(traced(tmp / f"g{pc:x}-{n}.gates"), REKINDLE_EV_PROBE_GATE=f"{pc:#x}:{n}")
        r = run(target, tmp / f"g{pc:x}-{n}", env, seed)
        if not [e for e in r["ev"] if e["rekindle_ev"] == "probe"]:
            continue  # not reached this time: once more, at the workload's first pass
        nxt = [e for e in r["ev"] if e["rekindle_ev"] == "probe_next"]
        if not r["started"] or not r["alive_at_end"] or r["restarted"]:
            return "critical: exits"
        if nxt and nxt[0]["same"]:
            return "critical: retries"
        if "gave up (hang)" in r["clients"] or not answered(r):
            return "critical: service lost"
        return "non-critical"
    return "not reached by the probe"


def answered(r):
    """The last probe (a GET on a new connection, rkv's PING) got an answer,
    an error one included."""
    last = ("final probe ", "ping after ")
    return any(k.startswith(last) and not k.endswith(" None") for k in r["clients"])


def transaction_of(r, site):
    """The transaction a fault's first crash fell in, from the errvirt run:
    the gate of the window it was recovered in, or, if the window had been
    closed by an output (or unknown) call, the transaction that call began;
    a run with no event keeps the fault on its own."""
    for e in r["ev"]:
        if e["rekindle_ev"] == "recovered":
            return ("gate", int(e["gate_pc"], 16))
        if e["rekindle_ev"] == "fallback":
            if e.get("closed_by") and e["closed_by"] != "ev_in_gate_call":
                return ("after", e.get("closed_by_call") or e["closed_by"], int(e["closed_at_pc"], 16))
            return ("gate", int(e.get("gate_pc", "0x0"), 16))
    return ("unplaced", site)


def in_sample(tx, classes):
    """Whether a fault in this transaction belongs to FIRestarter's sample:
    a gate classed non-critical (or one the probe never reached), and every
    transaction the errvirt run could not class (after an output call, no
    event): those stay in, where they count against us."""
    if tx[0] != "gate":
        return True
    return classes.get(tx[1], "unknown gate").startswith(("non-critical", "not reached", "unknown"))


def campaign(target, tmp, args, log):
    seed = args.seed
    prof = profile(target, tmp, seed)
    info = sites_info(target.exe)
    surf = surface(target, tmp, seed)
    log(f"{target.kind}: {len(prof)} sites executed by the workload; surface {surf.get('surface_pct')}%")
    order = draw_order(prof, info, seed, target.kind)
    want = args.want.get(target.kind, WANT[target.kind])
    tried, rows = [], []
    deadline = time.monotonic() + args.budget
    gates, classes, names, covered = {}, {}, {}, set()
    if args.sample == "noncritical":
        gates, names = gate_profile(target, tmp, seed)
        for pc, (call, load, work) in sorted(gates.items()):
            classes[pc] = classify_gate(target, tmp, seed, pc, load, work)
            log(f"{target.kind}: transaction after {call} at {names.get(pc, hex(pc))}: {classes[pc]}")
    vanilla_tally = collections.Counter()
    for n, site in enumerate(order[: args.candidates]):
        if len(rows) >= want or time.monotonic() > deadline:
            break
        load, work = prof[site]
        after = load + work // 2
        env = dict(
            os.environ, REKINDLE_FAULT=site, REKINDLE_FAULT_AFTER=str(after), REKINDLE_FAULT_MODE="persistent"
        )
        van = run(target, tmp / f"v{n}", dict(env, REKINDLE_EV="off"), seed)
        if not van["started"]:
            verdict = "did not start"
        elif not fired(van):
            verdict = "not triggered"
        elif crashed(van):
            verdict = "fail-stop"
        elif not van["alive_at_end"]:
            verdict = "died otherwise"
        else:
            verdict = "no crash"
        vanilla_tally[verdict] += 1
        meta = info.get(site, {})
        tried.append(
            {"site": site, "verdict": verdict, "type": meta.get("type"), "function": meta.get("function")}
        )
        if verdict != "fail-stop":
            continue
        r = run(target, tmp / f"e{n}", traced(tmp / f"e{n}.gates", env) if classes else env, seed)
        tx = transaction_of(r, site)
        if args.sample == "noncritical":
            if not in_sample(tx, classes) or tx in covered:
                tried[-1]["verdict"] = "fail-stop, not in the sample (critical, or its transaction had one)"
                continue
            covered.add(tx)
        inj = [e for e in r["ev"] if e["rekindle_ev"] == "injected"]
        rec = [e for e in r["ev"] if e["rekindle_ev"] == "recovered"]
        fb = [e for e in r["ev"] if e["rekindle_ev"] == "fallback"]
        hang = "gave up (hang)" in r["clients"]
        answering = answered(r)
        kept = r["started"] and r["alive_at_end"] and not r["restarted"]
        alive = kept and not fb and bool(rec) and not hang
        survived = alive and answering
        if survived:
            outcome = "survived"
        elif alive:
            outcome = "alive, not answering"
        elif not r["started"]:
            outcome = "did not start"
        elif fb and r["alive_at_end"]:
            # every request served, then the crash on the way out (SIGTERM)
            outcome = "at shutdown, fallback: " + fb[0]["reason"]
        elif fb:
            outcome = "fallback: " + fb[0]["reason"]
        elif hang:
            outcome = "hang"
        elif not rec:
            outcome = "no crash with errvirt"
        else:
            outcome = "died"
        row = {
            "site": site,
            "type": meta.get("type"),
            "function": meta.get("function"),
            "loc": meta.get("loc"),
            "description": meta.get("description"),
            "after": after,
            "vanilla_rc": van["rc"],
            # errvirt off, the server crashed only once stopped
            "vanilla_at_shutdown": van["alive_at_end"],
            "outcome": outcome,
            "survived": survived,
            "recoveries": len(rec),
            "injected_gates": sorted({e["gate"] for e in inj}),
            "recovery_ns": [e.get("recovery_ns") for e in inj],
            "rollback_ns": [e.get("rollback_ns") for e in rec],
            "fallback": fb[:2],
            "clients": r["clients"],
            "pid": r.get("pid"),
            "rc": r["rc"],
            "transaction": tx_label(tx, gates, names),
            "transaction_class": classes.get(tx[1], "unclassed") if tx[0] == "gate" else tx[0],
        }
        rows.append(row)
        log(
            f"{target.kind}: fault {len(rows):2d} {site} {meta.get('type')} in {meta.get('function')}: "
            f"{outcome} "
            f"(recoveries {len(rec)}, clients {r['clients']})"
        )
    return {
        "server": target.kind,
        "sample": args.sample,
        "transactions": {
            f"{pc:#x}": {"call": c, "passes": w, "name": names.get(pc), "class": classes.get(pc)}
            for pc, (c, _, w) in gates.items()
        },
        "executed_sites": len(prof),
        "surface": surf,
        "candidates_tried": len(tried),
        "vanilla": dict(vanilla_tally),
        "faults": rows,
        "tried": tried,
    }


def tx_label(tx, gates, names):
    if tx[0] == "gate":
        call = gates.get(tx[1], ("?",))[0] if gates else "?"
        return f"after {call} at {names.get(tx[1], hex(tx[1]))}"
    if tx[0] == "after":
        return f"after {tx[1]} at {tx[2]:#x} (an output or unknown call)"
    return "unplaced (no event)"


# ---- outputs --------------------------------------------------------------


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None


def summarize(res):
    faults = res["faults"]
    lat = [x for f in faults for x in f["recovery_ns"] if x is not None]
    return {
        "triggered": len(faults),
        "survived": sum(f["survived"] for f in faults),
        # FIRestarter's "crashes recovered" (Table IV): the process lived
        # through every crash (no fallback, no restart, no hang), whether or
        # not it still answered at the end.  Reported beside ours, never
        # instead of it (docs/errvirt.md, "Survived: ours and FIRestarter's").
        "kept": sum(f["outcome"] in ("survived", "alive, not answering") for f in faults),
        "recoveries": len(lat),
        "recovery_ms_p50": pct(lat, 0.5) / 1e6 if lat else None,
        "recovery_ms_p99": pct(lat, 0.99) / 1e6 if lat else None,
        "surface_pct": res["surface"].get("surface_pct"),
        "transaction_classes": dict(collections.Counter(t["class"] for t in res["transactions"].values())),
    }


MASKED_NOTE = (
    "Socket writes masked (REKINDLE_EV_MASK_SOCKET_WRITES=1): a crash after a reply's write rolls back to "
    "just after it and fails it with ECONNRESET; FIRestarter's own count does not do this."
)


def write_md(results, meta, path):
    lines = [
        f"Error virtualization fault campaign ({meta['date']}, load {meta['load']}, seed {meta['seed']}):",
        f"`{meta['command']}`",
        "",
        *([MASKED_NOTE, ""] if meta.get("mask_socket_writes") else []),
        "| server | survived / triggered | process kept / triggered | FIRestarter | recovery surface "
        "| FIRestarter | recovery p50 | p99 | candidates tried | vanilla verdicts |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        s = r["summary"]
        fr = FIRESTARTER[r["server"]]
        fsurf = f"{fr['surface']}%" if fr["surface"] is not None else "-"
        fname = f" ({fr['note']})" if fr.get("note") else ""
        p50 = f"{s['recovery_ms_p50']:.3f} ms" if s["recovery_ms_p50"] is not None else "-"
        p99 = f"{s['recovery_ms_p99']:.3f} ms" if s["recovery_ms_p99"] is not None else "-"
        verdicts = ", ".join(f"{k} {v}" for k, v in sorted(r["vanilla"].items()))
        lines.append(
            f"| {r['server']} | {s['survived']}/{s['triggered']} | {s['kept']}/{s['triggered']} | "
            f"{fr['survived']}/{fr['triggered']}{fname} | "
            f"{s['surface_pct']}% | {fsurf} | {p50} | {p99} | {r['candidates_tried']} | {verdicts} |"
        )
    for r in results:
        if r.get("sample") != "noncritical":
            continue
        classes = ", ".join(f"{k} {v}" for k, v in sorted(r["summary"]["transaction_classes"].items()))
        lines += [
            "",
            f"{r['server']}: FIRestarter's sample, one fault per unique transaction on a non-critical path. "
            f"The workload executed {len(r['transactions'])} transactions (gate call sites): {classes}.",
            "",
        ]
        for f in r["faults"]:
            where = f"`{f['function']}` ({f['type']})"
            lines.append(f"- {f['outcome']}: {where}, in the transaction {f['transaction']}")
    lines += ["", "Faults not survived:", ""]
    none = True
    for r in results:
        for f in r["faults"]:
            if not f["survived"]:
                none = False
                note = " (errvirt off, it crashed only at shutdown)" if f.get("vanilla_at_shutdown") else ""
                lines.append(
                    f"- {r['server']} `{f['site']}` {f['type']} in `{f['function']}` ({f['loc']}): "
                    f"{f['outcome']}{note}"
                )
    if none:
        lines.append("- none")
    path.write_text("\n".join(lines) + "\n")


def write_png(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["server"] for r in results]
    ours = [
        100.0 * r["summary"]["survived"] / r["summary"]["triggered"] if r["summary"]["triggered"] else 0
        for r in results
    ]
    theirs = [100.0 * FIRESTARTER[n]["survived"] / FIRESTARTER[n]["triggered"] for n in names]
    surf = [r["summary"]["surface_pct"] or 0 for r in results]
    fsurf = [FIRESTARTER[n]["surface"] or 0 for n in names]
    fig, ax = plt.subplots(1, 2, figsize=(9, 3.5))
    x = range(len(names))
    ax[0].bar([i - 0.2 for i in x], ours, 0.4, label="Rekindle")
    ax[0].bar([i + 0.2 for i in x], theirs, 0.4, label="FIRestarter")
    ax[0].set_title("survived / triggered (%)")
    ax[1].bar([i - 0.2 for i in x], surf, 0.4, label="Rekindle")
    ax[1].bar([i + 0.2 for i in x], fsurf, 0.4, label="FIRestarter")
    ax[1].set_title("recovery surface (%)")
    for a in ax:
        a.set_xticks(list(x), names)
        a.set_ylim(0, 105)
        a.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def ports_arg(text):
    lo, _, hi = text.partition("-")
    if not (lo.isdigit() and hi.isdigit() and 1024 <= int(lo) <= int(hi) <= 65535):
        raise argparse.ArgumentTypeError(f"reason=usage: {text!r} is not LO-HI (1024..65535)")
    return int(lo), int(hi)


def want_arg(text):
    out = {}
    for item in text.split(","):
        name, _, n = item.partition("=")
        if name not in WANT or not n.isdigit():
            names = ", ".join(WANT)
            raise argparse.ArgumentTypeError(f"reason=usage: {item!r} is not SERVER=N (SERVER: {names})")
        out[name] = int(n)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build", type=Path)
    ap.add_argument("--servers", default="nginx,lighttpd,rkv")
    ap.add_argument("--candidates", type=int, default=300, help="at most this many sites tried per server")
    ap.add_argument(
        "--want",
        type=want_arg,
        default={},
        help="SERVER=N,...: stop a server at N fail-stop faults (default: FIRestarter's count)",
    )
    ap.add_argument("--budget", type=float, default=900, help="seconds per server")
    ap.add_argument(
        "--requests", type=int, default=200, help="HTTP requests per run (rkv: 10x this, redis-benchmark)"
    )
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--sample",
        choices=("all", "noncritical"),
        default="all",
        help="all: every fail-stop fault the draw finds; noncritical: FIRestarter's sample, one fault per "
        "unique transaction on a non-critical path (docs/errvirt.md, 'Non-critical transactions')",
    )
    ap.add_argument(
        "--ports",
        type=ports_arg,
        default=None,
        help="LO-HI: the servers' loopback ports come from this range (default: http_servers.py's)",
    )
    ap.add_argument(
        "--mask-socket-writes",
        action="store_true",
        help="every errvirt run masks socket writes (REKINDLE_EV_MASK_SOCKET_WRITES=1; docs/errvirt.md, "
        "'Masking socket writes'): results go to *-masked.*",
    )
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args()
    # every run's environment derives from this one (the vanilla runs have
    # errvirt off, so the setting does nothing there)
    os.environ.pop("REKINDLE_EV_MASK_SOCKET_WRITES", None)
    if args.mask_socket_writes:
        os.environ["REKINDLE_EV_MASK_SOCKET_WRITES"] = "1"
    build = args.build.resolve()
    if args.ports:
        hs.PORT_RANGE = args.ports
    # address randomization off: a gate's pc is the same in every run of a
    # binary (the gate trace, the probes and the fault runs name
    # transactions by it); setarch execs the server, so the pid stays
    hs.ARGV_PREFIX = ["setarch", "x86_64", "-R"]
    exes = {
        "nginx": build / "errvirt" / "nginx-fi-ev" / "inst" / "sbin" / "nginx",
        "lighttpd": build / "errvirt" / "lighttpd-fi-ev" / "inst" / "sbin" / "lighttpd",
        "rkv": build / "errvirt" / "rkv-fi-ev",
    }
    servers = [x for x in args.servers.split(",") if x]
    for name in servers:
        if name not in exes:
            print(f"fault_campaign: reason=usage: unknown server {name!r}", file=sys.stderr)
            return 2
        if not exes[name].exists():
            print(
                f"fault_campaign: reason=not_built: {exes[name]} (run `make bench-errvirt-faults`)",
                file=sys.stderr,
            )
            return 2

    def log(msg):
        print(msg, flush=True)

    results = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ev-campaign-") as tmp_name:
        for name in servers:
            if name == "rkv":
                target = RkvTarget(exes[name], args.requests * 10)
            else:
                target = HttpTarget(name, exes[name], args.requests)
            try:
                res = campaign(target, Path(tmp_name) / name, args, log)
            except (RuntimeError, TraceError) as e:
                print(f"fault_campaign: reason=profile_failed: {e}", file=sys.stderr)
                return 1
            res["summary"] = summarize(res)
            results.append(res)
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load": os.getloadavg()[0],
        "seed": args.seed,
        "seconds": round(time.monotonic() - t0, 1),
        "command": "python3 tools/errvirt/fault_campaign.py " + " ".join(sys.argv[1:]),
        "mask_socket_writes": args.mask_socket_writes,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "errvirt-faults" if args.sample == "all" else "errvirt-faults-noncritical"
    stem += "-masked" if args.mask_socket_writes else ""
    (args.out / f"{stem}.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    write_md(results, meta, args.out / f"{stem}.md")
    write_png(results, args.out / f"{stem}.png")
    print((args.out / f"{stem}.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
