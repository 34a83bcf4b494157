#!/usr/bin/env python3
"""Error virtualization's cost and recovery on rkv (docs/errvirt.md).

Overhead: build/examples/rkv-ev (rkv compiled with the pass) against
build/examples/rkv-clang (the same compiler and flags without it), and the
three builds that each turn one saving of the undo log off (rkv-ev-nofilter:
every store logged, not each word once per transaction; rkv-ev-nostack:
stores to the frame's own allocas logged too; rkv-ev-nofresh: stores to
memory allocated in the same transaction logged too), with
bench/rkv_throughput.py's harness (servers on CPU 0, redis-benchmark on
CPU 1, 50 clients, SET and GET, -P 1 and -P 16, rotated order each round).
Reports medians of requests/s and of server CPU ns/request, and each
build's ratio to rkv-clang.

Recovery: rkv-ev with DEBUG enabled; --crashes requests that crash after a
checked malloc (DEBUG crash-after-alloc, answered with an error) and as
many PINGs, on one connection, each timed at the client: p50/p99.

Usage: python3 tools/errvirt/bench_overhead.py BUILD [--rounds 3]
       [--requests N] [--requests-pipelined N] [--crashes N]
Writes BUILD/errvirt/overhead.{jsonl,md}."""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from rkv_common import Server, free_port, machine, machine_line, rkv_argv, wait_serving  # noqa: E402
from rkv_throughput import measure, med  # noqa: E402

BASE = "rkv-clang"
SERVERS = [BASE, "rkv-ev", "rkv-ev-nofilter", "rkv-ev-nostack", "rkv-ev-nofresh"]


def overhead_table(rows, servers):
    out = [
        "| test | pipeline | " + " | ".join(f"{s} req/s" for s in servers) + " | "
        + " | ".join(f"CPU {s}/{BASE}" for s in servers[1:]) + " |",
        "|---|---:|" + "---:|" * (2 * len(servers) - 1),
    ]  # fmt: skip
    for test in ("SET", "GET"):
        for p in (1, 16):
            rps = [med(rows, s, p, test) for s in servers]
            cpu = [med(rows, s, p, test, "cpu_ns_per_req") for s in servers]
            cells = [f"{v:,.0f}" for v in rps] + [f"**{c / cpu[0]:.3f}**" for c in cpu[1:]]
            out.append(f"| {test} | {p} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def timed(fn, n):
    out = []
    for i in range(n):
        t0 = time.perf_counter_ns()
        fn(i)
        out.append((time.perf_counter_ns() - t0) / 1e6)
    return out


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]


def recovery(build, workdir, n):
    port = free_port()
    d = workdir / "recovery"
    d.mkdir()
    argv = rkv_argv(build / "examples" / "rkv-ev", port, d, 0) + ["--enable-debug", "yes"]
    srv = Server("rkv-ev", argv, d, cpu="0")
    srv.start()
    try:
        wait_serving(port, proc=srv.proc)
        c = redis.Redis(port=port, single_connection_client=True)

        def crash(i):
            try:
                c.execute_command("DEBUG", "crash-after-alloc", f"p{i}")
            except redis.ResponseError:
                return
            raise RuntimeError("crash-after-alloc answered without an error")

        ping = timed(lambda _: c.ping(), n)
        crashed = timed(crash, n)
        if srv.proc.poll() is not None:
            raise RuntimeError("rkv-ev died during the recovery run")
        return {"ping_ms": ping, "crash_ms": crashed}
    finally:
        srv.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build", type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=100_000, help="per test, without pipelining")
    ap.add_argument("--requests-pipelined", type=int, default=300_000, help="per test, with -P 16")
    ap.add_argument("--crashes", type=int, default=1000)
    ap.add_argument("--servers", nargs="+", default=SERVERS)
    args = ap.parse_args()
    build = args.build.resolve()
    for s in args.servers:
        if not (build / "examples" / s).exists():
            print(f"bench_overhead: reason=not_built: {build}/examples/{s} (run `make errvirt-bench-build`)",
                  file=sys.stderr)  # fmt: skip
            return 2
    load = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    out = build / "errvirt"
    out.mkdir(parents=True, exist_ok=True)
    command = f"python3 tools/errvirt/bench_overhead.py {' '.join(sys.argv[1:])}"
    with tempfile.TemporaryDirectory(prefix="ev-overhead-") as tmp:
        rows = measure(build, args.servers, args.rounds, args.requests, args.requests_pipelined, Path(tmp))
        rec = recovery(build, Path(tmp), args.crashes)
    with open(out / "overhead.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
        f.write(json.dumps({"recovery": rec}) + "\n")
    md = "\n".join([
        f"Command: `{command}`  ",
        f"Machine: {machine_line(machine())}  ",
        f"Load before the run (`uptime`): {load}  ",
        f"{args.rounds} rounds; medians. CPU: server CPU ns/request against {BASE}.",
        "",
    ]) + overhead_table(rows, args.servers)  # fmt: skip
    md += (
        f"\nRecovery, {args.crashes} requests each on one connection (client-side round trip, ms): "
        f"PING p50 {statistics.median(rec['ping_ms']):.3f} p99 {pct(rec['ping_ms'], 0.99):.3f}; "
        f"crashing request turned into an error reply p50 {statistics.median(rec['crash_ms']):.3f} "
        f"p99 {pct(rec['crash_ms'], 0.99):.3f}.\n"
    )
    (out / "overhead.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
