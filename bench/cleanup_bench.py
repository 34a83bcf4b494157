#!/usr/bin/env python3
"""Recovery-to-serving after a warm restart: mark-and-sweep against the
pending cleanup (bench/cleanup_bench.c), and, with --baseline, what the
pending allocations cost the allocator's and the regions' fast paths.

For each size, one cleanup_bench process builds the table and restarts
itself 2 x RUNS times, alternating the two cleanups; the table gives medians.
"Down" is the previous incarnation's rk_restart() entry to the answer of the
first request in the new one: restart (exec, rk_init) + recovery + one
lookup.

--baseline DIR: a build directory whose bench/alloc_bench and
bench/unsafe_bench were built from THIS tree's bench sources against the
library before the change, e.g.

    mkdir /tmp/base && git archive 7ca5689 | tar -x -C /tmp/base
    cp bench/alloc_bench.c bench/unsafe_bench.c /tmp/base/bench/
    make -C /tmp/base BUILD=/tmp/base/build /tmp/base/build/bench/alloc_bench \\
        /tmp/base/build/bench/unsafe_bench

Both builds then run interleaved, round after round, and the table gives
medians of ns per operation before and after.

Writes bench/results/cleanup.jsonl and bench/results/cleanup.md.

Usage: python3 bench/cleanup_bench.py [BUILD] [--sizes N ...] [--runs R]
                                      [--baseline DIR] [--rounds K]
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def machine():
    model = "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    mem_kb = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            mem_kb = int(line.split()[1])
    return {
        "cpu": model,
        "cpus": os.cpu_count(),
        "mem_gib": round(mem_kb / 2**20, 1),
        "kernel": platform.release(),
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }


def run_json(cmd, timeout=1800):
    env = dict(os.environ)
    env.pop("REKINDLE_MANIFEST_FD", None)
    cmd = [str(c) for c in cmd]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr[-2000:]}")
    return [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def cleanup_rows(build, sizes, runs):
    rows = []
    for n in sizes:
        print(f"cleanup_bench --objects {n} --runs {runs}", file=sys.stderr)
        rows += run_json([build / "bench" / "cleanup_bench", "--objects", n, "--runs", runs])
    for r in rows:
        r["down_us"] = r["restart_us"] + r["serving_us"] - r["main_to_init_us"]
    return rows


HOT_ALLOC = [("mix", 1), ("mix", 2), ("xfer", 2)]
HOT_UNSAFE = ["pair", "alloc_free", "alloc_publish"]


def hot_rows(builds, rounds, ops, iters):
    """builds: {"before": dir, "after": dir}; interleaved, the order flipped every round."""
    rows = []
    names = list(builds)
    for k in range(rounds):
        order = names if k % 2 == 0 else names[::-1]
        for name in order:
            b = Path(builds[name])
            for w, t in HOT_ALLOC:
                for r in run_json(
                    [
                        b / "bench" / "alloc_bench",
                        "--backend",
                        "rk",
                        "--workload",
                        w,
                        "--threads",
                        t,
                        "--ops",
                        ops,
                    ]
                ):
                    rows.append(
                        {
                            "build": name,
                            "round": k,
                            "bench": f"alloc_{w}_{t}t",
                            "ns": r["ns_per_op"],
                            "cpu_ns": r["cpu_ns_per_op"],
                        }
                    )
            for c in HOT_UNSAFE:
                for r in run_json([b / "bench" / "unsafe_bench", "-n", iters, "-r", 3, "-c", c]):
                    rows.append(
                        {"build": name, "round": k, "bench": c, "ns": r["ns_per_iter"], "cpu_ns": None}
                    )
            print(f"round {k}: {name} done", file=sys.stderr)
    return rows


def table(rows, hot, cmd, m, runs):
    out = ["# Cleanup after a warm restart: mark-and-sweep against the pending allocations", ""]
    out.append(f"Command: `{cmd}`  ")
    out.append(
        f"Machine: {m['cpu']}, {m['cpus']} CPUs, {m['mem_gib']} GiB, Linux {m['kernel']}; "
        f"load average {m['loadavg_1m']} at the end (a shared VM: other builds and tests ran meanwhile; "
        "medians)."
    )
    out += [
        "",
        "Each size: one process builds a hash table of N entries (bucket array, chained"
        f" entries of 48-112 B), then restarts in place {2 * runs} times with 4 threads x 16"
        " objects in flight, alternating the two cleanups. sweep = the old README template"
        " (rk_mark on the table, the bucket array and every entry, then"
        " rk_finish_recovery(true)); pending = rk_finish_recovery_mode(RK_CLEANUP_PENDING)."
        " Recovery = rk_init's return to the end of the cleanup; serving = main() to the"
        " answer of one lookup; down = the previous incarnation's rk_restart() to that"
        " answer. Medians in ms.",
        "",
        "| objects | cleanup | runs | recovery ms | serving ms | down ms | of which rk_finish_recovery ms"
        " | objects freed | down sweep / pending |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n in sorted({r["objects"] for r in rows}):
        by = {
            mode: [r for r in rows if r["objects"] == n and r["mode"] == mode]
            for mode in ("sweep", "pending")
        }
        downs = {mode: med([r["down_us"] for r in rs]) for mode, rs in by.items()}
        for mode, rs in by.items():
            ratio = f"{downs['sweep'] / downs['pending']:.0f}x" if mode == "sweep" else ""
            out.append(
                f"| {n:,} | {mode} | {len(rs)} | {med([r['recover_us'] for r in rs]) / 1e3:.3f} |"
                f" {med([r['serving_us'] for r in rs]) / 1e3:.3f} | {downs[mode] / 1e3:.3f} |"
                f" {med([r['cleanup_us'] for r in rs]) / 1e3:.3f} | {med([r['freed'] for r in rs]):.0f} |"
                f" {ratio} |"
            )
    if hot:
        out += [
            "",
            "## What the pending allocations cost the fast paths",
            "",
            "The same bench sources built against the library before (`before`) and after (`after`) the"
            " change, run interleaved; medians over the rounds. alloc_bench: ns per op (mix: a free + an"
            " alloc in one thread; xfer: an alloc in the producer + its free in the consumer). unsafe_bench:"
            " ns per iteration (pair: begin + end; alloc_free: rk_alloc(64) + rk_free; alloc_publish: the"
            " same with a pair between them, whose end commits the allocation).",
            "",
            "| bench | before ns | after ns | after - before | before CPU ns | after CPU ns"
            " | after - before (CPU) | rounds |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for b in dict.fromkeys(r["bench"] for r in hot):

            def m_(build, key, b=b):
                xs = [r[key] for r in hot if r["bench"] == b and r["build"] == build and r[key] is not None]
                return med(xs) if xs else None

            bef, aft = m_("before", "ns"), m_("after", "ns")
            cb, ca = m_("before", "cpu_ns"), m_("after", "cpu_ns")
            cpu = f"{cb:.1f} | {ca:.1f} | {ca - cb:+.1f}" if cb is not None else "| |"
            n = len([r for r in hot if r["bench"] == b and r["build"] == "after"])
            out.append(f"| {b} | {bef:.1f} | {aft:.1f} | {aft - bef:+.1f} | {cpu} | {n} |")
        out += [
            "",
            "CPU ns (alloc_bench only): the process's CPU time over all ops, less sensitive than wall time"
            " to the other tenants of the machine.",
        ]
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build", nargs="?", default="build")
    ap.add_argument("--sizes", type=int, nargs="+", default=[500_000, 5_000_000])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--baseline")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--ops", type=int, default=2_000_000)
    ap.add_argument("--iters", type=int, default=20_000_000)
    a = ap.parse_args()
    build = Path(a.build).resolve()
    rows = cleanup_rows(build, a.sizes, a.runs)
    hot = []
    if a.baseline:
        hot = hot_rows({"before": a.baseline, "after": build}, a.rounds, a.ops, a.iters)
    cmd = "python3 bench/cleanup_bench.py " + " ".join(sys.argv[1:])
    m = machine()
    md = table(rows, hot, cmd, m, a.runs)
    res = ROOT / "bench" / "results"
    res.mkdir(exist_ok=True)
    with open(res / "cleanup.jsonl", "w") as f:
        for r in rows + hot:
            f.write(json.dumps({**r, "machine": m}) + "\n")
    (res / "cleanup.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
