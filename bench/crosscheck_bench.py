#!/usr/bin/env python3
"""What cross-check validation costs the serving process.

For each arena size: the ledger test app (tests/apps/ledger.c) fills its
arena, faults, restarts warm and starts a cross-check whose validator is
held back (--check-delay-ms) so that the measurement happens while it runs.
Reported: the setup (userfaultfd registration and write protection of the
used range, fork of the validator), the latency of a client write that is
the first to its page while the check runs (fault, copy of the page into the
validator, release) against the same write once the check is over, and the
per-page copy time the runtime reports.

Usage: python3 bench/crosscheck_bench.py BUILD [--sizes-mb 64 1024] [--writes 2000]
"""

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Conn:
    def __init__(self, port, timeout=30.0):
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        self.f = self.s.makefile("rb")

    def cmd(self, line):
        self.s.sendall(line.encode() + b"\n")
        return json.loads(self.f.readline())

    def close(self):
        self.f.close()
        self.s.close()


def events(path):
    out = []
    for line in Path(path).read_text().splitlines():
        if line.startswith('{"rekindle"'):
            out.append(json.loads(line))
    return out


def wait_for(pred, timeout=120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.01)
    raise SystemExit("timed out")


def timed_writes(conn, indexes, value):
    lat = []
    for i in indexes:
        t0 = time.perf_counter_ns()
        conn.cmd(f"set {i} {value}")
        lat.append((time.perf_counter_ns() - t0) / 1000)
    return lat


def one_size(build, size_mb, writes, delay_ms):
    entries = size_mb * (1 << 20) // 8
    tmp = Path(tempfile.mkdtemp(prefix="rk-ccbench-"))
    port = free_port()
    err = tmp / "stderr"
    with open(err, "w") as ef:
        proc = subprocess.Popen(
            [str(build / "apps" / "ledger"), "--port", str(port), "--journal", str(tmp / "journal"),
             "--entries", str(entries), "--crosscheck", "--check-delay-ms", str(delay_ms)],
            stdout=subprocess.DEVNULL, stderr=ef, env={"REKINDLE_CRASHLOOP_MS": "0", "PATH": "/usr/bin:/bin"},
        )
    try:
        c = Conn(port)
        # touch every page once so the whole arena is resident, as in a server
        stride = 512  # 512 entries of 8 bytes: one 4 KiB page
        pages = list(range(0, entries, stride))
        step = max(1, len(pages) // writes)
        chosen = pages[::step][:writes]
        for i in chosen:
            c.cmd(f"set {i} 1")
        c.s.sendall(b"segv\n")
        c.close()
        started = wait_for(lambda: [e for e in events(err) if e.get("result") == "started"])[0]
        c = Conn(port)
        during = timed_writes(c, chosen, 2)
        checking = c.cmd("state")["crosscheck"] == "running"
        verdicts = ("match", "mismatch", "failed")
        done = wait_for(lambda: [e for e in events(err) if e.get("result") in verdicts],
                        timeout=delay_ms / 1000 + 300)[0]
        after = timed_writes(c, chosen, 3)
        c.close()
        return {
            "size_mb": size_mb,
            "protected_mb": round(started["protected_bytes"] / (1 << 20), 1),
            "setup_us": started["setup_us"],
            "writes": len(chosen),
            "measured_while_running": checking,
            "first_write_us_median": round(statistics.median(during), 1),
            "write_after_us_median": round(statistics.median(after), 1),
            "copy_us_per_page": done["copy_us_per_page"],
            "pages_copied": done["pages_copied"],
            "result": done["result"],
        }
    finally:
        proc.kill()
        proc.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build", type=Path)
    ap.add_argument("--sizes-mb", type=int, nargs="+", default=[64, 1024])
    ap.add_argument("--writes", type=int, default=2000)
    ap.add_argument("--json", action="store_true", help="print the rows as JSON lines only")
    args = ap.parse_args()
    build = args.build.resolve()
    rows = []
    for mb in args.sizes_mb:
        # hold the validator long enough for every write to land while it runs
        rows.append(one_size(build, mb, args.writes, delay_ms=3000 + args.writes * 2))
    cmd = f"python3 bench/crosscheck_bench.py {args.build} --sizes-mb {' '.join(map(str, args.sizes_mb))} " \
          f"--writes {args.writes}"
    if args.json:
        for r in rows:
            print(json.dumps(r))
        return
    info = Path("/proc/cpuinfo").read_text().splitlines()
    cpu = next((ln.split(":", 1)[1].strip() for ln in info if ln.startswith("model name")), "?")
    print(f"`{cmd}` on {cpu}, {os.cpu_count()} CPUs, Linux {platform.release()}\n")
    print("| arena | protected | setup | client write, first to its page, check running | same write after |"
          " copy per page | result |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['size_mb']} MiB | {r['protected_mb']} MiB | {r['setup_us']} µs | "
              f"{r['first_write_us_median']} µs (median of {r['writes']}) | "
              f"{r['write_after_us_median']} µs | "
              f"{r['copy_us_per_page']} µs | {r['result']} |")
        if not r["measured_while_running"]:
            print(f"\nwarning: the check ended before the writes at {r['size_mb']} MiB", file=sys.stderr)
    out = ROOT / "bench" / "results" / "crosscheck.jsonl"
    with open(out, "a") as f:
        for r in rows:
            f.write(json.dumps({"command": cmd, **r}) + "\n")


if __name__ == "__main__":
    main()
