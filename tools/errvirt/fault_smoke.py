#!/usr/bin/env python3
"""A first, small survivability run of error virtualization with the
project's fault injector (not the full campaign: docs/errvirt.md).

rkv is built with both passes, the injector's first and then errvirt's
(BUILD/errvirt/rkv-fi-ev, `make errvirt-fault-smoke`).  A traced run of the
workload lists the executed sites; each run arms one of them, picked at
random, persistent from the middle of the workload on, runs rkv alone (no
supervisor: its own warm restart is the fallback), and drives the workload
on one connection while a second connection does PINGs.  Outcome per run,
from the server's stderr and the clients:

  no crash          the fault never faulted
  error virtualized every crash became a library error; the process and
                    the second connection lived through all of them
  warm restart      errvirt declined (reason counted) and librekindle
                    restarted the process warm
  died              the process is gone
  hang              the clients gave up (timeouts, or 10 s)
  did not start     the fault acted before rkv served

Usage: python3 tools/errvirt/fault_smoke.py BUILD [--runs N] [--seed S] [--min-count N]
Prints a table and writes BUILD/errvirt/fault-smoke.json."""

import argparse
import collections
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "faultinject"))
from fi_trace import read_counts  # noqa: E402

KEYS = 200
OPS = 2000


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(exe, d, env):
    port = free_port()
    err = open(d / "stderr", "w")  # noqa: SIM115 - closed by stop()
    argv = [str(exe), "--port", str(port), "--dir", str(d), "--save", ""]
    p = subprocess.Popen(argv, stderr=err, stdout=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            redis.Redis(port=port, socket_timeout=2).ping()
            return p, port, err
        except redis.ResponseError:
            return p, port, err  # it answers (an armed fault may make that an error)
        except redis.ConnectionError:
            if p.poll() is not None:
                break
            time.sleep(0.02)
    p.kill()
    p.wait()
    err.close()
    raise RuntimeError(f"rkv did not start: {(d / 'stderr').read_text()[-1000:]}")


def stop(p, err):
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    err.close()


def connect(port):
    """One connection (redis-py's handshake runs now), or None."""
    try:
        return redis.Redis(port=port, socket_timeout=2, single_connection_client=True)
    except (redis.RedisError, ValueError):
        return None


def workload(port, seed):
    """OPS commands on one connection; PINGs on another.  Counts of what
    the clients saw."""
    rng = random.Random(seed)
    seen = collections.Counter()
    main, other = connect(port), connect(port)
    deadline = time.monotonic() + 10
    for i in range(OPS):
        if time.monotonic() > deadline or seen["timeout"] >= 3:
            seen["gave up (hang)"] += 1
            break
        k = f"k{rng.randrange(KEYS)}"
        main = main or connect(port)
        if main is None:
            seen["connect failed"] += 1
            continue
        try:
            if rng.random() < 0.5:
                main.set(k, f"v{i}")
            else:
                main.get(k)
            seen["ok"] += 1
        except redis.ResponseError:
            seen["error reply"] += 1
        except redis.TimeoutError:
            seen["timeout"] += 1
            main = None
        except redis.ConnectionError:
            seen["connection lost"] += 1
            main = None
        except (ValueError, redis.RedisError):  # a reply redis-py cannot parse
            seen["bad reply"] += 1
            main = None
        if i % 50 == 0:
            other = other or connect(port)
            try:
                if other is None:
                    raise redis.ConnectionError("no connection")
                other.ping()
            except redis.ResponseError:
                seen["other error reply"] += 1
            except (redis.ConnectionError, redis.TimeoutError, ValueError):
                seen["other connection lost"] += 1
                other = None
    return seen


def ev_lines(text):
    return [json.loads(line) for line in text.splitlines() if line.startswith('{"rekindle_ev"')]


def one(exe, site, after, seed, tmp):
    d = Path(tempfile.mkdtemp(dir=tmp))
    env = dict(os.environ, REKINDLE_FAULT=site, REKINDLE_FAULT_AFTER=str(after))
    env["REKINDLE_FAULT_MODE"] = "persistent"
    try:
        p, port, err = start(exe, d, env)
    except RuntimeError:  # the fault acts before rkv serves
        return {"site": site, "after": after, "outcome": "did not start", "recoveries": 0,
                "fallback_reasons": [], "restarts": 0, "clients": {}}  # fmt: skip
    pid = p.pid
    try:
        seen = workload(port, seed)
        alive = p.poll() is None
    finally:
        stop(p, err)
    text = (d / "stderr").read_text()
    evs = ev_lines(text)
    rec = [e for e in evs if e["rekindle_ev"] == "recovered"]
    fb = [e["reason"] for e in evs if e["rekindle_ev"] == "fallback"]
    restarts = text.count('{"rekindle":"restart"')
    if not alive:
        outcome = "died"
    elif seen["gave up (hang)"]:
        outcome = "hang"
    elif restarts:
        outcome = "warm restart"
    elif rec:
        outcome = "error virtualized"
    else:
        outcome = "no crash"
    return {"site": site, "after": after, "pid": pid, "outcome": outcome, "recoveries": len(rec),
            "fallback_reasons": fb, "restarts": restarts, "clients": dict(seen)}  # fmt: skip


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build", type=Path)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--min-count", type=int, default=1, help="only sites run this often (request paths)")
    args = ap.parse_args()
    exe = args.build.resolve() / "errvirt" / "rkv-fi-ev"
    if not exe.exists():
        print(f"fault_smoke: reason=not_built: {exe} (run `make errvirt-fault-smoke`)", file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="ev-faults-") as tmp_name:
        tmp = Path(tmp_name)
        # the traced run: which sites the workload executes, how often
        d = tmp / "trace"
        d.mkdir()
        trace = d / "trace"
        p, port, err = start(exe, d, dict(os.environ, REKINDLE_FAULT_TRACE=str(trace)))
        try:
            workload(port, args.seed)
        finally:
            stop(p, err)
        counts = read_counts(trace)
        sites = sorted(s for s, n in counts.items() if n >= args.min_count)
        rows = []
        for i in range(args.runs):
            site = rng.choice(sites)
            try:
                r = one(exe, site, counts[site] // 2, args.seed + i, tmp)
            except Exception as e:  # noqa: BLE001 - one run's harness error, not the whole smoke's
                r = {"site": site, "after": counts[site] // 2, "outcome": "harness error", "error": repr(e),
                     "recoveries": 0, "fallback_reasons": [], "restarts": 0, "clients": {}}  # fmt: skip
            rows.append(r)
            print(f"run {i:3d} {site} after={r['after']:6d} {r['outcome']:18s} rec={r['recoveries']} "
                  f"fallback={r['fallback_reasons'][:2]} clients={r['clients']}", flush=True)  # fmt: skip
    out = args.build / "errvirt"
    out.mkdir(parents=True, exist_ok=True)
    (out / "fault-smoke.json").write_text(json.dumps(rows, indent=1) + "\n")
    tally = collections.Counter(r["outcome"] for r in rows)
    reasons = collections.Counter(x for r in rows for x in r["fallback_reasons"])
    outcomes = ", ".join(f"{k} {v}" for k, v in tally.most_common())
    print(f"\n{len(rows)} runs ({len(sites)} executed sites): {outcomes}")
    print("fallback reasons: " + (", ".join(f"{k} {v}" for k, v in reasons.most_common()) or "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
