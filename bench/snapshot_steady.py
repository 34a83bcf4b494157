#!/usr/bin/env python3
"""Steady state of rkv under continuous snapshots (issue 13): one long,
unmodified `redis-benchmark` run per (build, option set, test), so that
what runs in the background at its own pace (a fold of the journal under
`--snapshot-publish-every`, retention) falls inside the measured window.
`snapshot_rkv_bench.py` takes a checkpoint before each of its short tests,
and a checkpoint folds the journal outside the window.

Each run: a fresh rkv under `rekindle run --snapshot-interval INTERVAL`
(server, supervisor and engine on --server-cpu), 1 M keys of 100 bytes
preloaded, a checkpoint, then `redis-benchmark -c 50 -d 100 -r KEYS -t TEST
-P P -n N` on --client-cpu.  Builds and option sets are interleaved within
each round.  One JSON line a run (requests/s, snapshots taken, how many were
journaled, folds and their wall time) to --out, and a table of medians on
stdout.

  python3 bench/snapshot_steady.py --build old=/tmp/old --build new=build \\
      --variant new+10s=new:--snapshot-publish-every,10s --rounds 2
"""

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from snapshot_common import RkvStack, fill, free_port  # noqa: E402

TESTS = {"set1": ("set", 1, 1_500_000), "get16": ("get", 16, 15_000_000)}


def one_run(build, sup_args, test, args, workdir):
    name, pipeline, n = TESTS[test]
    n = max(1000, int(n * args.scale))
    port = free_port()
    srv = RkvStack(build, workdir, port, name="steady", cpu=args.server_cpu,
                   snapshot_dir=workdir / "store", interval=args.interval, durability="async",
                   snapshot_memory=None, rkv_args=[], sup_args=sup_args)  # fmt: skip
    srv.start()
    try:
        srv.wait_serving()
        fill(port, args.keys, 100, conns=2)
        srv.checkpoint()
        t0 = time.monotonic()
        bench = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-c", "50", "-n", str(n), "-d", "100"]
        load = ["-r", str(args.keys), "-t", name, "-P", str(pipeline), "-q"]
        argv = ["taskset", "-c", args.client_cpu, *bench, *load]
        p = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=args.timeout)
        wall = time.monotonic() - t0
    finally:
        srv.stop()
    rps = re.findall(r"([\d.]+) requests per second", p.stdout)
    text = next(workdir.glob("events*.jsonl")).read_text()
    events = [json.loads(line) for line in text.splitlines() if line.strip()]
    snaps = [e for e in events if e.get("supervisor") == "snapshot"]
    folds = [e for e in events if e.get("supervisor") == "journal_folded"]
    return {
        "rps": float(rps[-1]) if rps else None,
        "wall_s": round(wall, 1),
        "snapshots": len(snaps),
        "journaled": sum(1 for s in snaps if s["journaled"]),
        "folds": len(folds),
        "fold_ms": sum(f["took_ms"] for f in folds),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", action="append", required=True, metavar="NAME=DIR",
                    help="a build directory (bin/rekindle, examples/rkv), repeatable")  # fmt: skip
    ap.add_argument("--variant", action="append", default=[], metavar="LABEL=BUILD:OPT,VAL,...",
                    help="a build with more `rekindle run` options (commas between words)")  # fmt: skip
    ap.add_argument("--tests", default="set1,get16", help=f"comma-separated, of {sorted(TESTS)}")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--interval", default="10ms")
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--scale", type=float, default=1.0, help="requests per run times this (smoke: 0.01)")
    ap.add_argument("--server-cpu", default="0")
    ap.add_argument("--client-cpu", default="1")
    ap.add_argument("--timeout", type=float, default=300.0, help="s per redis-benchmark run at most")
    ap.add_argument("--out", type=Path, default=Path("bench/results/snap-steady.jsonl"))
    args = ap.parse_args()
    builds = dict(b.split("=", 1) for b in args.build)
    setups = [(label, Path(d).resolve(), []) for label, d in builds.items()]
    for v in args.variant:
        label, rest = v.split("=", 1)
        base, _, opts = rest.partition(":")
        if base not in builds:
            ap.error(f"--variant {v}: no --build named {base}")
        setups.append((label, Path(builds[base]).resolve(), [w for w in opts.split(",") if w]))
    tests = args.tests.split(",")
    for t in tests:
        if t not in TESTS:
            ap.error(f"unknown test {t!r}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    got = {}
    with open(args.out, "a") as out:
        for r in range(1, args.rounds + 1):
            for test in tests:
                for label, build, sup_args in setups:
                    with tempfile.TemporaryDirectory(prefix="steady-") as tmp:
                        res = one_run(build, sup_args, test, args, Path(tmp))
                    res.update(round=r, setup=label, test=test, interval=args.interval, options=sup_args)
                    out.write(json.dumps(res) + "\n")
                    out.flush()
                    print(f"round {r} {test:6} {label:12} {res['rps'] or 0:>12,.0f}/s  "
                          f"{res['snapshots']} snapshots ({res['journaled']} journaled), "
                          f"{res['folds']} folds {res['fold_ms']} ms", flush=True)  # fmt: skip
                    got.setdefault((test, label), []).append(res)
    print("\n| test | setup | requests/s (median) | snapshots (median) |\n|---|---|---:|---:|")
    for (test, label), rs in got.items():
        rps = statistics.median(x["rps"] or 0 for x in rs)
        print(f"| {test} | {label} | {rps:,.0f} | {statistics.median(x['snapshots'] for x in rs):,.0f} |")


if __name__ == "__main__":
    main()
