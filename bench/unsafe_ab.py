#!/usr/bin/env python3
"""bench/unsafe_bench before and after a change, interleaved, on a shared
(noisy) machine.

Each round runs every case of each build's unsafe_bench once (one process
per case and build, -n ITERS -r RUNS); a process prints the median of its
RUNS runs.  The table gives, per case and build, the median of those
medians over the rounds, the median of each round's best run (less
sensitive to other load: preemption only adds), and the ratio of the
median to the same build's unprotected pair.

The "before" build is this tree's bench source against the library before
the change, e.g.

    mkdir /tmp/base && git archive BASE | tar -x -C /tmp/base
    cp bench/unsafe_bench.c /tmp/base/bench/
    make -C /tmp/base BUILD=/tmp/base/build /tmp/base/build/bench/unsafe_bench

Usage: python3 bench/unsafe_ab.py BEFORE_BUILD AFTER_BUILD [--rounds K]
           [--iters N] [--runs R] [--cases a,b,...] [--json FILE]
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

DEFAULT_CASES = [
    "empty_loop",
    "pair",
    "nested_pair",
    "pair_write_protect",
    "wrpkru_pair",
    "pair_then_wrpkru",
    "nested_pair_write_protect",
    "alloc_free",
    "alloc_free_write_protect",
    "alloc_in_region",
    "alloc_in_region_write_protect",
]


def machine():
    model, flags = "?", []
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name") and model == "?":
            model = line.split(":", 1)[1].strip()
        if line.startswith("flags") and not flags:
            flags = line.split(":", 1)[1].split()
    return {
        "cpu": model,
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "pku": "pku" in flags and "ospke" in flags,
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }


def run_case(binary, case, iters, runs):
    p = subprocess.run(
        [str(binary), "-n", str(iters), "-r", str(runs), "-c", case],
        capture_output=True,
        text=True,
        check=False,
    )
    rows = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
    return rows[0] if rows else None  # None: the case needs pkeys here


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=2_000_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cases", default=",".join(DEFAULT_CASES))
    ap.add_argument("--json", help="also write every row here (JSON lines)")
    a = ap.parse_args()
    builds = {
        "before": Path(a.before) / "bench" / "unsafe_bench",
        "after": Path(a.after) / "bench" / "unsafe_bench",
    }
    for b in builds.values():
        if not b.exists():
            print(f"{b} missing", file=sys.stderr)
            return 2
    cases = a.cases.split(",")
    med = {(b, c): [] for b in builds for c in cases}
    best = {(b, c): [] for b in builds for c in cases}
    rows = []
    load0 = os.getloadavg()[0]
    for r in range(a.rounds):
        for c in cases:
            for b, binary in builds.items():
                row = run_case(binary, c, a.iters, a.runs)
                if row is None:
                    continue
                row.update(build=b, round=r)
                rows.append(row)
                med[(b, c)].append(row["ns_per_iter"])
                best[(b, c)].append(min(row["ns_runs"]))
    mach = machine()
    mach["loadavg_1m_start"] = round(load0, 2)
    cmd = (
        f"python3 bench/unsafe_ab.py {a.before} {a.after} --rounds {a.rounds}"
        f" --iters {a.iters} --runs {a.runs}"
        + ("" if a.cases == ",".join(DEFAULT_CASES) else f" --cases {a.cases}")
    )
    print(f"`{cmd}`  ")
    print(
        f"{mach['cpu']}, {mach['cpus']} CPUs, Linux {mach['kernel']}, PKU {'yes' if mach['pku'] else 'no'}, "
        f"load average {mach['loadavg_1m_start']} at the start and {mach['loadavg_1m']} at the end"
        " (shared machine)."
    )
    print()
    print(
        "| case | before ns (median of medians) | after ns | before best | after best"
        " | before / pair | after / pair |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")

    def m(b, c, d):
        return statistics.median(d[(b, c)]) if d[(b, c)] else None

    def f(x, fmt="{:.1f}"):
        return "-" if x is None else fmt.format(x)

    for c in cases:
        mb, ma = m("before", c, med), m("after", c, med)
        bb, ba = m("before", c, best), m("after", c, best)
        pb, pa = m("before", "pair", med), m("after", "pair", med)
        rb = mb / pb if mb is not None and pb else None
        ra = ma / pa if ma is not None and pa else None
        print(f"| {c} | {f(mb)} | {f(ma)} | {f(bb)} | {f(ba)} | {f(rb, '{:.2f}')} | {f(ra, '{:.2f}')} |")
    if a.json:
        with open(a.json, "w") as fh:
            fh.write(json.dumps({"meta": {"command": cmd, "machine": mach}}) + "\n")
            for row in rows:
                fh.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
