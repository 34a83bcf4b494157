"""Turns alloc_bench JSON lines into the Markdown table of
bench/results/alloc.md: medians over the rounds of each configuration and
the rk/glibc ratio of the medians (same run, interleaved)."""

import json
import platform
import statistics
import subprocess
import sys
from collections import defaultdict
from datetime import date

TARGET = 1.5  # rk may cost at most this many times glibc per operation


def lscpu_field(name):
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    for line in out.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == name:
            return value.strip()
    return "unknown"


def load(path):
    rows = defaultdict(lambda: defaultdict(list))
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if r["errors"]:
                sys.exit(f"objects corrupted or handed out twice: {r}")
            rows[(r["workload"], r["threads"])][r["backend"]].append(r)
    return rows


def round_ratio_range(v):
    """Smallest and largest rk/glibc ratio of one round (the pair ran back to back)."""
    glibc = {r["round"]: r["ns_per_op"] for r in v["glibc"]}
    ratios = [r["ns_per_op"] / glibc[r["round"]] for r in v["rk"] if r["round"] in glibc]
    return min(ratios), max(ratios)


def describe(workload):
    if workload == "mix":
        return "mix (free+alloc pair, one thread)"
    return "xfer (alloc in producer, free in consumer)"


def main(path, command):
    rows = load(path)
    first = next(iter(next(iter(rows.values())).values()))[0]
    print("### Allocator: rk_alloc/rk_free against glibc malloc/free\n")
    print(f"Command: `{command}`  ")
    print(
        f"Machine: {lscpu_field('Model name')}, {lscpu_field('CPU(s)')} cores, "
        f"Linux {platform.release()}, {platform.libc_ver()[0]} {platform.libc_ver()[1]}  "
    )
    print(f"Date: {date.today().isoformat()}  ")
    print(
        f"Ops per thread (mix) or per pair (xfer): {first['ops']}; window {first['window']} "
        f"live objects per thread (mix); seed {first['seed']}.\n"
    )
    print(
        "ns/op is the wall time of the timed phase divided by the ops of one thread (mix) "
        "or one producer/consumer pair (xfer); CPU ns/op divides the process's CPU time by "
        "all ops. Medians over the rounds; the ratio is rk median / glibc median; per-round "
        "ratios compare the two backends of the same round, which ran back to back.\n"
    )
    print(
        "| workload | threads | rk ns/op | glibc ns/op | ratio rk/glibc | per-round ratios | "
        "rk CPU ns/op | glibc CPU ns/op | target <= 1.5x | rounds |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for workload, threads in sorted(rows):
        v = rows[(workload, threads)]
        rk = statistics.median(r["ns_per_op"] for r in v["rk"])
        gl = statistics.median(r["ns_per_op"] for r in v["glibc"])
        rk_cpu = statistics.median(r["cpu_ns_per_op"] for r in v["rk"])
        gl_cpu = statistics.median(r["cpu_ns_per_op"] for r in v["glibc"])
        ratio = rk / gl
        lo, hi = round_ratio_range(v)
        met = "met" if ratio <= TARGET else "MISSED"
        print(
            f"| {describe(workload)} | {threads} | {rk:.1f} | {gl:.1f} | {ratio:.2f}x | {lo:.2f}-{hi:.2f}x | "
            f"{rk_cpu:.1f} | {gl_cpu:.1f} | {met} | {min(len(v['rk']), len(v['glibc']))} |"
        )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
