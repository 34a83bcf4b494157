"""Server CPU time per request of several redis-server binaries, same run:
an A/B of builds of the Redis port (e.g. main's against a branch's) with
stock as the baseline.

Each server alone on CPU 0 (no persistence), `redis-benchmark -c 50 -d 100
-r 1000000 -P 16` on CPU 1, one test a run; a first pass of each test fills
every keyspace, then --rounds rounds, the servers in a rotated order each
round.  For each run: requests/s, and the server's CPU time per request
from /proc/PID/stat (user time only with --user: the command's own work,
without the socket's system calls, which are the same for every build).
Prints medians and the ratio of each binary to the first.

Usage:
  python3 bench/redis_ab.py NAME=REDIS_SERVER [NAME=REDIS_SERVER ...]
      [--tests set,lpush,hset] [--requests 500000] [--rounds 5] [--user]
      [--json]"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from redis_port_bench import taskset  # noqa: E402
from rkv_common import free_port, wait_serving  # noqa: E402


def cpu_seconds(pid, user_only):
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + (0 if user_only else int(fields[12]))
    return ticks / os.sysconf("SC_CLK_TCK")


def bench(port, test, requests):
    argv = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-c", "50", "-n", str(requests)]
    argv += ["-P", "16", "-t", test, "-d", "100", "-r", "1000000", "-q", "--csv"]
    out = subprocess.run(taskset("1", argv), capture_output=True, text=True, check=True).stdout
    return float(out.strip().splitlines()[-1].split(",")[1].strip('"'))


def binaries(specs):
    out = []
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not Path(path).is_file():
            sys.exit(f"redis_ab: bad binary '{spec}': want NAME=PATH to a redis-server")
        out.append((name, path))
    if len({n for n, _ in out}) != len(out):
        sys.exit("redis_ab: two binaries with the same name")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binary", nargs="+", help="NAME=PATH of a redis-server; the first is the baseline")
    ap.add_argument("--tests", default="set,lpush,hset", help="redis-benchmark tests, comma-separated")
    ap.add_argument("--requests", type=int, default=500_000, help="per test, binary and round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--user", action="store_true", help="user CPU time only")
    ap.add_argument("--json", action="store_true", help="one JSON object per run on stdout")
    args = ap.parse_args()
    bins = binaries(args.binary)
    tests = [t for t in args.tests.split(",") if t]
    servers = {}
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for name, path in bins:
                port = free_port()
                d = Path(tmp) / name
                d.mkdir()
                argv = [path, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(d), "--save", ""]
                argv += ["--appendonly", "no", "--daemonize", "no", "--logfile", str(d / "redis.log")]
                proc = subprocess.Popen(
                    taskset("0", argv), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                )
                servers[name] = (proc, port)
                wait_serving(port, proc=proc)
            for _proc, port in servers.values():  # fill: the rounds overwrite
                for t in tests:
                    bench(port, t, args.requests)
            for r in range(args.rounds):
                order = bins[r % len(bins) :] + bins[: r % len(bins)]
                for t in tests:
                    for name, _ in order:
                        proc, port = servers[name]
                        c0 = cpu_seconds(proc.pid, args.user)
                        rps = bench(port, t, args.requests)
                        ns = 1e9 * (cpu_seconds(proc.pid, args.user) - c0) / args.requests
                        run = {"round": r, "test": t, "server": name, "rps": rps, "cpu_ns_per_req": ns}
                        runs.append(run)
                        if args.json:
                            print(json.dumps(run), flush=True)
        finally:
            for proc, _ in servers.values():
                proc.terminate()
                proc.wait()
    what = "user CPU" if args.user else "CPU"
    print(f"| test | server | req/s | server {what} ns/req | {what} against {bins[0][0]} |")
    print("|---|---|---:|---:|---:|")
    for t in tests:
        base = statistics.median(
            x["cpu_ns_per_req"] for x in runs if x["test"] == t and x["server"] == bins[0][0]
        )
        for name, _ in bins:
            mine = [x for x in runs if x["test"] == t and x["server"] == name]
            ns = statistics.median(x["cpu_ns_per_req"] for x in mine)
            rps = statistics.median(x["rps"] for x in mine)
            print(f"| {t.upper()} | {name} | {rps:,.0f} | {ns:,.0f} | {ns / base:.3f} |")


if __name__ == "__main__":
    main()
