"""Latency of rkv builds while the heap grows and huge pages are made: an
A/B of builds (e.g. two ways of collapsing the keyspace's ranges), with the
first as the baseline.

Each round starts every build fresh (no save, --hugepages yes) and runs
`redis-benchmark -t set -d SIZE -r 100000000 -c 50 -P 16` against it: new
keys, so the heap's top crosses a 2 MiB range every 2 MiB / (SIZE + ~100 B)
SETs and a range is collapsed each time.  The builds go in a rotated order
each round.  For each run: requests/s, p50, p99 and max latency (from
redis-benchmark's CSV), the server's CPU time, and the bytes INFO says were
collapsed.  Prints medians and the ratio of each build to the first.

Usage:
  python3 bench/hugepages_ab.py NAME=RKV [NAME=RKV ...]
      [--requests 200000] [--size 4096] [--rounds 5] [--json]"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from redis_ab import cpu_seconds  # noqa: E402
from rkv_common import free_port, wait_serving  # noqa: E402

FIELDS = ("rps", "p50_ms", "p99_ms", "max_ms", "cpu_s", "huge_mib")


def run_one(name, exe, args, workdir):
    port = free_port()
    d = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=workdir))
    env = dict(os.environ, REKINDLE_RUNTIME_DIR=str(d / "run"))
    cmd = [exe, "--port", str(port), "--dir", str(d), "--save", "", "--hugepages", "yes"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        wait_serving(port, timeout=30, proc=proc)
        cpu0 = cpu_seconds(proc.pid, False)
        argv = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-c", "50", "-n", str(args.requests)]
        argv += ["-P", "16", "-t", "set", "-d", str(args.size), "-r", "100000000", "--csv"]
        out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=600).stdout
        row = out.strip().splitlines()[-1].replace('"', "").split(",")
        # test, rps, avg, min, p50, p95, p99, max
        info = redis.Redis(port=port).info("memory")
        return {
            "build": name,
            "rps": float(row[1]),
            "p50_ms": float(row[4]),
            "p99_ms": float(row[6]),
            "max_ms": float(row[7]),
            "cpu_s": cpu_seconds(proc.pid, False) - cpu0,
            "huge_mib": info.get("arena_hugepage_bytes", 0) / (1 << 20),
        }
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        subprocess.run(["rm", "-rf", str(d)], check=False)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build", nargs="+", help="NAME=PATH of an rkv binary; the first is the baseline")
    ap.add_argument("--requests", type=int, default=200_000, help="SETs per run")
    ap.add_argument("--size", type=int, default=4096, help="value bytes")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", action="store_true", help="one JSON object per run on stdout")
    args = ap.parse_args()
    builds = []
    for spec in args.build:
        name, sep, path = spec.partition("=")
        if not sep or not Path(path).is_file():
            sys.exit(f"hugepages_ab: bad build '{spec}': want NAME=PATH to an rkv binary")
        builds.append((name, path))
    runs = []
    with tempfile.TemporaryDirectory(prefix="hugepages-ab-") as workdir:
        for rnd in range(args.rounds):
            for i in range(len(builds)):
                name, exe = builds[(rnd + i) % len(builds)]
                r = run_one(name, exe, args, workdir)
                r["round"] = rnd
                runs.append(r)
                if args.json:
                    print(json.dumps(r), flush=True)
                else:
                    print(f"round {rnd} {name}: " + " ".join(f"{k}={r[k]:.3f}" for k in FIELDS), flush=True)
    base = builds[0][0]
    med = {}
    for n, _ in builds:
        med[n] = {k: statistics.median(r[k] for r in runs if r["build"] == n) for k in FIELDS}
    print(f"medians over {args.rounds} rounds ({args.requests} SETs of {args.size} B, -c 50 -P 16):")
    for n, _ in builds:
        cells = " ".join(f"{k}={med[n][k]:.3f} ({med[n][k] / med[base][k]:.3f}x)" if med[base][k] else
                         f"{k}={med[n][k]:.3f}" for k in FIELDS)  # fmt: skip
        print(f"  {n}: {cells}")


if __name__ == "__main__":
    main()
