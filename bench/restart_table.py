"""Turns restart_bench JSON lines into the Markdown table of
bench/results/restart.md (medians over all rounds; ratios to the bare
fork+exec measured in the same run: back to back, and after the same read
pass over the preserved size that precedes every warm restart)."""

import json
import platform
import statistics
import subprocess
import sys
from collections import defaultdict


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def main(path, command):
    rows = defaultdict(lambda: defaultdict(list))
    with open(path) as f:
        records = [json.loads(line) for line in f]
    for r in records:
        size, variant = r["size_mb"], r["variant"]
        rows[size][variant].append(r)
        if variant != "bare" and not r.get("contents_ok", True):
            sys.exit(f"contents check failed: {r}")
    bare_all = [r["restart_us"] for s in rows.values() for r in s["bare"]]
    bare = statistics.median(bare_all)
    nproc = subprocess.run(["nproc"], capture_output=True, text=True, check=True).stdout.strip()
    print("### Warm restart latency (rk_restart() to rk_init() return)\n")
    print(f"Command: `{command}`  ")
    print(f"Machine: {cpu_model()}, {nproc} cores, Linux {platform.release()}  ")
    print(
        f"Bare fork+exec of the same binary, no state: median {bare / 1000:.2f} ms "
        f"over {len(bare_all)} runs (same run).\n"
    )
    print(
        "| preserved | warm restart (median) | ratio to bare | bare after the same read pass | "
        "ratio to it | without the exec page pool | without teardown helper | "
        "touch all pages after restart | pre-fault all pages (rk_prefault) | samples |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for size in sorted(rows):
        v = rows[size]
        warm = statistics.median(r["restart_us"] for r in v["warm"])
        sync = statistics.median(r["restart_us"] for r in v["sync"])
        bare_read = statistics.median(r["restart_us"] for r in v["bare_read"])
        nopool = statistics.median(r["restart_us"] for r in v["nopool"])
        touch = statistics.median(r["touch_ms"] for r in v["warm"])
        pre = statistics.median(r["prefault_ms"] for r in v["prefault"])
        label = f"{size // 1024} GiB" if size >= 1024 else f"{size} MiB"
        print(
            f"| {label} | {warm / 1000:.2f} ms | {warm / bare:.2f}x | {bare_read / 1000:.2f} ms | "
            f"{warm / bare_read:.2f}x | {nopool / 1000:.2f} ms | {sync / 1000:.2f} ms | "
            f"{touch:.1f} ms | {pre:.1f} ms | {len(v['warm'])} |"
        )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
