#!/usr/bin/env python3
"""Cost of one rk_unsafe_begin/rk_unsafe_end pair (bench/unsafe_bench.c).

Runs the benchmark (median of RUNS runs of ITERS iterations per case), then
runs it again under `strace -f` and counts the syscalls each thread makes
between the getppid() markers around its measured loop (the fast path must
make none).  Writes bench/results/unsafe.jsonl and bench/results/unsafe.md.

Usage: python3 bench/run_unsafe.py [BUILD] [--iters N] [--runs R]
"""

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINE = re.compile(r"^(\d+)\s+(\w+)\(")  # "TID name(" ("<... name resumed>" continues a call)


def machine() -> dict:
    model = "?"
    flags = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name") and model == "?":
            model = line.split(":", 1)[1].strip()
        if line.startswith("flags") and not flags:
            flags = line.split(":", 1)[1]
    load = os.getloadavg()
    return {
        "cpu": model,
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "pku": " pku" in flags,
        "ospke": " ospke" in flags,
        "loadavg_1m": round(load[0], 2),
    }


def syscalls_in_loops(binary: Path, iters: int) -> dict:
    """Syscalls made inside the measured loops, per case, from an strace -f log."""
    if not shutil.which("strace"):
        return {"error": "strace not installed"}
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "trace"
        out = subprocess.run(
            ["strace", "-f", "-qq", "-o", str(log), str(binary), "-n", str(iters), "-r", "1"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        cases = [json.loads(x)["case"] for x in out.splitlines() if x.startswith("{")]
        inside: dict[str, bool] = {}  # tid -> inside its measured loop
        loops = 0
        count = 0
        names: dict[str, int] = {}
        total = 0
        for line in log.read_text().splitlines():
            m = LINE.match(line)
            if not m:
                continue
            tid, name = m.groups()
            total += 1
            if name == "getppid":
                if inside.get(tid):
                    inside[tid] = False
                    loops += 1
                else:
                    inside[tid] = True
                continue
            if inside.get(tid):
                count += 1
                names[name] = names.get(name, 0) + 1
    return {
        "iters_per_loop": iters,
        "measured_loops": loops,
        "cases": cases,
        "syscalls_in_loops": count,
        "by_name": names,
        "syscalls_whole_process": total,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("build", nargs="?", default="build")
    ap.add_argument("--iters", type=int, default=100_000_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--strace-iters", type=int, default=2_000_000)
    a = ap.parse_args()
    binary = ROOT / a.build / "bench" / "unsafe_bench"
    if not binary.exists():
        print(f"{binary} missing: make BUILD={a.build} all", file=sys.stderr)
        return 2
    cmd = [str(binary), "-n", str(a.iters), "-r", str(a.runs)]
    print("running:", " ".join(cmd), file=sys.stderr)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    rows = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    print(f"strace check ({a.strace_iters} iterations per loop)", file=sys.stderr)
    sc = syscalls_in_loops(binary, a.strace_iters)
    mach = machine()
    command = f"python3 bench/run_unsafe.py {a.build} --iters {a.iters} --runs {a.runs}"

    res = ROOT / "bench" / "results"
    res.mkdir(parents=True, exist_ok=True)
    with open(res / "unsafe.jsonl", "w") as f:
        f.write(json.dumps({"meta": {"command": command, "machine": mach, "strace": sc}}) + "\n")
        for r in rows:
            f.write(json.dumps(r) + "\n")

    base = {r["case"]: r["ns_per_iter"] for r in rows}
    empty = base.get("empty_loop", 0.0)
    md = [
        "# rk_unsafe_begin/rk_unsafe_end cost",
        "",
        f"`{command}` — {mach['cpu']}, {mach['cpus']} CPUs, Linux {mach['kernel']}, "
        f"PKU {'yes' if mach['pku'] and mach['ospke'] else 'no'}, "
        f"load average {mach['loadavg_1m']} at the end (shared machine).",
        "",
        f"Median of {a.runs} runs of {a.iters:,} iterations per case; a 2-thread run counts "
        "its slower thread; threads pinned to CPUs 0 and 1. TSC ticks are at the TSC "
        "frequency, not the core clock.",
        "",
        "| case | threads | ns/iter | minus empty loop | TSC ticks/iter | note |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        net = r["ns_per_iter"] - empty if r["case"] != "empty_loop" else 0.0
        md.append(
            f"| {r['case']} | {r['threads']} | {r['ns_per_iter']:.2f} | {net:.2f} | "
            f"{r['tsc_per_iter']:.1f} | {r['note']}"
            f"{' (protected)' if r['protected'] else ''} |"
        )
    md.append("")
    if "error" in sc:
        md.append(f"Syscall check: not run ({sc['error']}).")
    else:
        md.append(
            f"Syscalls inside the measured loops (`strace -f`, {sc['measured_loops']} loops of "
            f"{sc['iters_per_loop']:,} iterations, every case): **{sc['syscalls_in_loops']}**"
            f"{' ' + json.dumps(sc['by_name']) if sc['by_name'] else ''}; "
            f"the whole process made {sc['syscalls_whole_process']} (setup, threads, markers)."
        )
    md.append("")
    text = "\n".join(md)
    (res / "unsafe.md").write_text(text)
    print(text)
    return 0 if sc.get("syscalls_in_loops", 0) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
