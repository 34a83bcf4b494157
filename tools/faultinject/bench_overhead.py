#!/usr/bin/env python3
"""The fault injector's unarmed cost on rkv: build/examples/rkv-fi (rkv
compiled with the pass, no fault armed) against build/examples/rkv-clang
(the same compiler and flags without the pass), same run, with
bench/rkv_throughput.py's harness: servers pinned to CPU 0,
redis-benchmark to CPU 1, 50 clients, SET and GET, -P 1 and -P 16, the
servers taking turns in a rotated order each round.  Reports medians of
requests/s, p99 latency and server CPU ns/request, and the rkv-fi/rkv-clang
ratios (with the range of the same-round ratios).

Usage: python3 tools/faultinject/bench_overhead.py BUILD [--rounds 5]
       [--requests N] [--requests-pipelined N]
Writes BUILD/faultinject/overhead.{jsonl,md}."""

import argparse
import json
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build", type=Path)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=100_000, help="per test, without pipelining")
    ap.add_argument("--requests-pipelined", type=int, default=500_000, help="per test, with -P 16")
    args = ap.parse_args()
    build = args.build.resolve()
    for s in SERVERS:
        if not (build / "examples" / s).exists():
            msg = f"bench_overhead: reason=not_built: {build}/examples/{s} (run `make rkv-fi`)"
            print(msg, file=sys.stderr)
            return 2
    load = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="fi-overhead-") as tmp:
        rows = measure(build, SERVERS, args.rounds, args.requests, args.requests_pipelined, Path(tmp))
    out = build / "faultinject"
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "overhead.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    command = f"python3 tools/faultinject/bench_overhead.py {' '.join(sys.argv[1:])}"
    md = table(rows, command, machine(), args.rounds, load)
    (out / "overhead.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
