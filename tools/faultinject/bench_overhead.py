#!/usr/bin/env python3
"""The fault injector's unarmed cost on rkv: build/examples/rkv-fi (rkv
compiled with the pass, no fault armed) against build/examples/rkv-clang
(the same compiler and flags without the pass), same run, with
bench/rkv_throughput.py's harness: servers pinned to CPU 0,
redis-benchmark to CPU 1, 50 clients, SET and GET, -P 1 and -P 16, the
servers taking turns in a rotated order each round.  Reports medians of
requests/s, p99 latency and server CPU ns/request, and the rkv-fi/rkv-clang
ratios (with the range of the same-round ratios).  Then the worst case:
bench_micro.c, a loop of calls to a tiny function, built both ways
(BUILD/faultinject/micro-{clang,fi}), run alternately --micro-runs times
each: median CPU ns per call (thread CPU time).

Usage: python3 tools/faultinject/bench_overhead.py BUILD [--rounds 5]
       [--requests N] [--requests-pipelined N]
Writes BUILD/faultinject/overhead.{jsonl,md}."""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from rkv_common import machine, machine_line  # noqa: E402
from rkv_throughput import measure, med, round_ratios  # noqa: E402

SERVERS = ["rkv-clang", "rkv-fi"]


def table(rows, command, mach, rounds, load):
    out = [
        "| test | pipeline | rkv-clang req/s | rkv-fi req/s | rkv-fi/rkv-clang [round range] "
        "| p99 ms (clang / fi) | server CPU ns/req (clang / fi) | CPU fi/clang |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for test in ("SET", "GET"):
        for p in (1, 16):
            a, b = (med(rows, s, p, test) for s in SERVERS)
            rr = round_ratios(rows, "rkv-fi", "rkv-clang", p, test)
            p99 = " / ".join(f"{med(rows, s, p, test, 'p99_ms'):.3f}" for s in SERVERS)
            ca, cb = (med(rows, s, p, test, "cpu_ns_per_req") for s in SERVERS)
            out.append(
                f"| {test} | {p} | {a:,.0f} | {b:,.0f} | **{b / a:.3f}** [{min(rr):.3f}–{max(rr):.3f}] "
                f"| {p99} | {ca:,.0f} / {cb:,.0f} | **{cb / ca:.3f}** |"
            )
    head = [
        f"Command: `{command}`  ",
        f"Machine: {machine_line(mach)}  ",
        f"Load before the run (`uptime`): {load}  ",
        f"{rounds} rounds; medians.",
        "",
    ]
    return "\n".join(head + out) + "\n"


def micro(build, runs, calls):
    """{build: [ns per call, ...]}, the two builds run alternately."""
    out = {"micro-clang": [], "micro-fi": []}
    for _ in range(runs):
        for name in out:
            p = subprocess.run(
                [str(build / "faultinject" / name), str(calls)],
                capture_output=True, text=True, check=True, timeout=300,
            )  # fmt: skip
            out[name].append(json.loads(p.stdout)["ns_per_call"])
    return out


def micro_table(res, runs, calls):
    a, b = (statistics.median(res[k]) for k in ("micro-clang", "micro-fi"))
    pairs = [f / c for c, f in zip(res["micro-clang"], res["micro-fi"], strict=True)]
    return (
        f"\nbench_micro.c, {calls:,} calls of a tiny function, {runs} runs of each build alternately "
        f"(thread CPU time): median ns/call clang {a:.3f}, with the pass {b:.3f}: **{b / a:.3f}x** "
        f"[pairs {min(pairs):.3f}–{max(pairs):.3f}], {b - a:+.3f} ns per call.\n"
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build", type=Path)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=100_000, help="per test, without pipelining")
    ap.add_argument("--requests-pipelined", type=int, default=500_000, help="per test, with -P 16")
    ap.add_argument("--micro-runs", type=int, default=9)
    ap.add_argument("--micro-calls", type=int, default=200_000_000)
    ap.add_argument("--micro-only", action="store_true")
    args = ap.parse_args()
    build = args.build.resolve()
    for s in [] if args.micro_only else SERVERS:
        if not (build / "examples" / s).exists():
            msg = f"bench_overhead: reason=not_built: {build}/examples/{s} (run `make rkv-fi`)"
            print(msg, file=sys.stderr)
            return 2
    load = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    out = build / "faultinject"
    out.mkdir(parents=True, exist_ok=True)
    command = f"python3 tools/faultinject/bench_overhead.py {' '.join(sys.argv[1:])}"
    md = ""
    if not args.micro_only:
        with tempfile.TemporaryDirectory(prefix="fi-overhead-") as tmp:
            rows = measure(build, SERVERS, args.rounds, args.requests, args.requests_pipelined, Path(tmp))
        with open(out / "overhead.jsonl", "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        md = table(rows, command, machine(), args.rounds, load)
    else:
        md = f"Command: `{command}`  \nMachine: {machine_line(machine())}  \nLoad before the run: {load}\n"
    md += micro_table(micro(build, args.micro_runs, args.micro_calls), args.micro_runs, args.micro_calls)
    (out / "overhead.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
