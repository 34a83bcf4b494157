#!/usr/bin/env python3
"""Error virtualization's throughput overhead on nginx and lighttpd (issue
16): each server built with rekindle-ev-cc against the same source built
by plain clang-19 with the same flags (tools/errvirt/servers/*.sh ev|clang),
both run as one process (tools/errvirt/servers/http_servers.py), loaded by
wrk on loopback: a static page (/index.html) and a small dynamic one (/dir/,
a directory listing the server generates per request).

The machine is a shared 2-vCPU VM, so requests/s swing with the other
work.  Each round runs the two builds back to back (alternating which goes
first) and the result per test is the median over rounds of the ratio
baseline/errvirt of requests/s, and of the server's CPU time per request
(utime+stime from /proc/PID/stat over the run / requests), which is less
sensitive to the other work on the machine.

--compare LABEL=BUILD2 (repeatable) adds BUILD2's errvirt builds (another
version of the pass, e.g. the one before a change, or one built with a
saving switched off) to the same rounds, as a column of its own, so they
all share the machine's load.  --page limits the pages.

Usage: bench_http.py BUILD [--servers nginx,lighttpd] [--page static|dynamic]
       [--rounds N] [--duration S] [--connections N]
       [--compare LABEL=BUILD2]... [--ports LO-HI] [--out DIR]
Writes DIR/errvirt-http.{json,md} (DIR: bench/results)."""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "errvirt" / "servers"))
import http_servers as hs  # noqa: E402

TESTS = {"static": "/index.html", "dynamic": "/dir/"}
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TICK  # utime, stime


def wrk(port, path, duration, conns):
    cmd = ["wrk", "-t1", f"-c{conns}", f"-d{duration}s", "--latency", f"http://127.0.0.1:{port}{path}"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 30, check=True).stdout
    reqs = int(re.search(r"(\d+) requests in", out).group(1))
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    p99 = re.search(r"99%\s+([\d.]+)(us|ms|s)", out)
    scale = {"us": 1e-3, "ms": 1.0, "s": 1e3}
    return {
        "requests": reqs,
        "rps": rps,
        "non2xx": int(non2xx.group(1)) if non2xx else 0,
        "p99_ms": float(p99.group(1)) * scale[p99.group(2)] if p99 else None,
    }


def measure(kind, exe, d, test, args):
    s = hs.Server(kind, exe, d)
    try:
        if not s.wait_serving():
            raise RuntimeError(f"{kind} {exe} did not serve: {s.text()[-500:]}")
        wrk(s.port, TESTS[test], 1, args.connections)  # warm up
        c0 = cpu_seconds(s.pid)
        r = wrk(s.port, TESTS[test], args.duration, args.connections)
        r["cpu_us_per_req"] = (cpu_seconds(s.pid) - c0) / r["requests"] * 1e6 if r["requests"] else None
        if s.ev("recovered") or s.ev("fallback"):
            raise RuntimeError(f"{kind}: errvirt recovered or fell back during a benchmark")
        return r
    finally:
        s.stop()


def ports_arg(text):
    lo, _, hi = text.partition("-")
    if not (lo.isdigit() and hi.isdigit() and 1024 <= int(lo) <= int(hi) <= 65535):
        raise argparse.ArgumentTypeError(f"reason=usage: {text!r} is not LO-HI (1024..65535)")
    return int(lo), int(hi)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build", type=Path)
    ap.add_argument("--servers", default="nginx,lighttpd")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=int, default=5)
    ap.add_argument("--connections", type=int, default=10)
    ap.add_argument(
        "--compare",
        action="append",
        default=[],
        help="LABEL=BUILD2: BUILD2's errvirt builds too",
    )
    ap.add_argument("--page", action="append", choices=sorted(TESTS), help="only these pages (repeatable)")
    ap.add_argument("--ports", type=ports_arg, default=None, help="LO-HI: the servers' loopback ports")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args()
    if args.ports:
        hs.PORT_RANGE = args.ports
    b = args.build.resolve() / "errvirt"
    exes = {
        (n, k): b / f"{n}-{k}" / "inst" / "sbin" / n for n in ("nginx", "lighttpd") for k in ("ev", "clang")
    }
    kinds = ["clang", "ev"]
    labels = []
    for c in args.compare:
        label, sep, other = c.partition("=")
        if not sep or not label or label in kinds or not other:
            print(f"bench_http: reason=usage: --compare LABEL=BUILD2, got {c!r}", file=sys.stderr)
            return 2
        kinds.append(label)
        labels.append(label)
        for n in ("nginx", "lighttpd"):
            exes[(n, label)] = Path(other).resolve() / "errvirt" / f"{n}-ev" / "inst" / "sbin" / n
    tests = args.page or list(TESTS)
    servers = [x for x in args.servers.split(",") if x]
    for (n, _kind), e in exes.items():
        if n in servers and not e.exists():
            print(
                f"bench_http: reason=not_built: {e} (run `make errvirt-nginx errvirt-lighttpd`)",
                file=sys.stderr,
            )
            return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="ev-http-") as tmp:
        for n in servers:
            for test in tests:
                runs = {k: [] for k in kinds}
                for rnd in range(args.rounds):
                    order = kinds if rnd % 2 == 0 else kinds[::-1]
                    for k in order:
                        runs[k].append(
                            measure(n, exes[(n, k)], Path(tmp) / f"{n}-{test}-{k}-{rnd}", test, args)
                        )
                rps_ratio = [c["rps"] / e["rps"] for c, e in zip(runs["clang"], runs["ev"], strict=True)]
                cpu_ratio = [
                    e["cpu_us_per_req"] / c["cpu_us_per_req"]
                    for c, e in zip(runs["clang"], runs["ev"], strict=True)
                ]
                row = {
                    "server": n,
                    "test": test,
                    "path": TESTS[test],
                    "rps_clang": statistics.median(r["rps"] for r in runs["clang"]),
                    "rps_ev": statistics.median(r["rps"] for r in runs["ev"]),
                    "throughput_overhead_pct": round(100 * (statistics.median(rps_ratio) - 1), 1),
                    "cpu_us_clang": statistics.median(r["cpu_us_per_req"] for r in runs["clang"]),
                    "cpu_us_ev": statistics.median(r["cpu_us_per_req"] for r in runs["ev"]),
                    "cpu_overhead_pct": round(100 * (statistics.median(cpu_ratio) - 1), 1),
                    "p99_ms_clang": statistics.median(r["p99_ms"] for r in runs["clang"]),
                    "p99_ms_ev": statistics.median(r["p99_ms"] for r in runs["ev"]),
                    "runs": runs,
                }
                for label in labels:
                    cmp_ratio = [
                        e["cpu_us_per_req"] / c["cpu_us_per_req"]
                        for c, e in zip(runs["clang"], runs[label], strict=True)
                    ]
                    row["cpu_us_" + label] = statistics.median(r["cpu_us_per_req"] for r in runs[label])
                    row["cpu_overhead_pct_" + label] = round(100 * (statistics.median(cmp_ratio) - 1), 1)
                rows.append(row)
                print(
                    f"{n} {test}: rps {row['rps_clang']:.0f} -> {row['rps_ev']:.0f} "
                    f"(+{row['throughput_overhead_pct']}%), cpu/req {row['cpu_us_clang']:.1f} -> "
                    f"{row['cpu_us_ev']:.1f} us (+{row['cpu_overhead_pct']}%)",
                    flush=True,
                )
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load": os.getloadavg(),
        "command": "python3 tools/errvirt/bench_http.py " + " ".join(sys.argv[1:]),
        "compare": labels,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "errvirt-http.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    md = [
        f"`{meta['command']}` ({meta['date']}, load {meta['load'][0]:.1f}); wrk -t1 -c{args.connections} "
        f"-d{args.duration}s, {args.rounds} rounds, medians:",
        "",
        "| server | page | req/s clang | req/s errvirt | throughput overhead "
        "| CPU us/req clang | errvirt | CPU overhead |"
        + "".join(f" CPU us/req {label} | {label} CPU overhead |" for label in labels),
        "|---|---|---:|---:|---:|---:|---:|---:|" + "---:|---:|" * len(labels),
    ]
    for r in rows:
        md.append(
            f"| {r['server']} | {r['test']} ({r['path']}) | {r['rps_clang']:.0f} | {r['rps_ev']:.0f} | "
            f"{r['throughput_overhead_pct']}% | {r['cpu_us_clang']:.1f} | {r['cpu_us_ev']:.1f} | "
            f"{r['cpu_overhead_pct']}% |"
            + "".join(
                f" {r['cpu_us_' + label]:.1f} | {r['cpu_overhead_pct_' + label]}% |" for label in labels
            )
        )
    (args.out / "errvirt-http.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
