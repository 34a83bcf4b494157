#!/usr/bin/env python3
"""Stop time of durable snapshots (`make bench-snapshots`): for each arena
size and dirty fraction, bench/snapshot_load runs under
`rekindle run --snapshot-dir` and writes PERMILLE per mille of its pages per
interval; every snapshot's `snapshot` event gives the stop (how long the app
was held at the cut), the pages copied, what was written.  The first,
full, snapshot of each run is reported apart.  One table (markdown) and a PNG
of the stop-time distributions go to bench/results/.

  python3 bench/snapshot_bench.py BUILD [--sizes-mb 2048 8192]
      [--permille 1 10 100] [--interval-ms 100] [--seconds 10]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def pct(values, q):
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))] if s else None


def one_run(build, mb, permille, interval_ms, seconds, workdir):
    store = workdir / "store"
    events = workdir / "events.jsonl"
    env = dict(os.environ, REKINDLE_RUNTIME_DIR=str(workdir / "run"))
    cmd = [
        str(build / "bin" / "rekindle"), "run", "--name", "snapbench",
        "--events", str(events), "--snapshot-dir", str(store),
        "--snapshot-interval", f"{interval_ms}ms", "--snapshot-events", "every",
        "--", str(build / "bench" / "snapshot_load"), "--mb", str(mb),
        "--permille", str(permille), "--period-ms", str(interval_ms), "--seconds", str(seconds),
    ]  # fmt: skip
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, check=False)
    wall = time.monotonic() - t0
    evs = [json.loads(x) for x in events.read_text().splitlines() if x.startswith("{")]
    snaps = [e for e in evs if e.get("supervisor") == "snapshot"]
    failed = [e for e in evs if e.get("supervisor") == "snapshot_failed"]
    done = [json.loads(x) for x in p.stdout.splitlines() if x.startswith('{"load":"done"')]
    full = [e for e in snaps if e["kind"] == "full"]
    # steady state: the deltas begun 2 s after the load finished filling its
    # arena (during the fill it writes ~1 GB/s: reported apart)
    filled = [json.loads(x) for x in p.stdout.splitlines() if x.startswith('{"load":"filled"')]
    settle = filled[0]["t_ns"] + 2_000_000_000 if filled else 0
    during_fill = [e for e in snaps if e["t_ns"] < settle]
    delta = [e for e in snaps if e["kind"] == "delta" and e["t_ns"] >= settle]
    stops = [e["stop_us"] for e in delta]
    store_bytes = sum(f.stat().st_size for f in store.rglob("*") if f.is_file())
    return {
        "mb": mb,
        "permille": permille,
        "interval_ms": interval_ms,
        "seconds": seconds,
        "wall_s": round(wall, 2),
        "snapshots": len(delta),
        # after the first (full) one: the steady rate
        "per_second": round(len(delta) / max(1e-3, (delta[-1]["t_ns"] - delta[0]["t_ns"]) / 1e9), 1)
        if len(delta) > 1
        else 0.0,
        "failed": len(failed),
        "failed_codes": sorted({e["code"] for e in failed}),
        "stop_us_median": statistics.median(stops) if stops else None,
        "stop_us_p99": pct(stops, 99),
        "stop_us_max": max(stops) if stops else None,
        "scan_us_median": statistics.median([e["scan_us"] for e in delta]) if delta else None,
        "cut_copy_us_median": statistics.median([e["cut_copy_us"] for e in delta]) if delta else None,
        "cut_pages_median": statistics.median([e["cut_pages"] for e in delta]) if delta else None,
        "precopy_pages_median": statistics.median([e["precopy_pages"] for e in delta]) if delta else None,
        "took_ms_median": statistics.median([e["took_ms"] for e in delta]) if delta else None,
        "staging_peak_mb": round(max([e["staging_peak_bytes"] for e in snaps] or [0]) / 2**20, 1),
        "fill_stop_us_max": max([e["stop_us"] for e in during_fill] or [0]),
        "full_stop_us": full[0]["stop_us"] if full else None,
        "full_took_ms": full[0]["took_ms"] if full else None,
        "store_mb": round(store_bytes / 2**20, 1),
        "pages_per_interval": done[0]["pages_per_interval"] if done else None,
        "stops": stops,
        "load_avg": os.getloadavg()[0],
    }


def table(rows):
    out = [
        "| arena | dirty per interval | snapshots/s | stop median | stop p99 | scan (median) "
        "| copy at cut (median) | pages at cut (median) | snapshot took (median) "
        "| first (full) snapshot: stop / took | longest stop during the fill | failed | peak staging |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]  # fmt: skip
    for r in rows:
        out.append(
            f"| {r['mb'] // 1024} GiB | {r['permille'] / 10:g}% ({r['pages_per_interval']} pages) "
            f"| {r['per_second']} | {r['stop_us_median']} us | {r['stop_us_p99']} us "
            f"| {r['scan_us_median']} us | {r['cut_copy_us_median']} us | {r['cut_pages_median']} "
            f"| {r['took_ms_median']} ms | {r['full_stop_us']} us / {r['full_took_ms']} ms "
            f"| {r['fill_stop_us_max']} us "
            f"| {r['failed']} {' '.join(r['failed_codes'])} | {r['staging_peak_mb']} MiB |"
        )
    return "\n".join(out)


def plot(rows, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib: no PNG", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(9, 4.5))
    labels, data = [], []
    for r in rows:
        if r["stops"]:
            labels.append(f"{r['mb'] // 1024} GiB\n{r['permille'] / 10:g}%")
            data.append([s / 1000 for s in r["stops"]])
    ax.boxplot(data, whis=(1, 99), showfliers=True)
    ax.set_xticks(range(1, len(labels) + 1), labels)
    ax.set_yscale("log")
    ax.set_ylabel("stop per snapshot (ms, log)")
    ax.axhline(0.95, color="gray", ls="--", lw=1)
    ax.text(0.55, 0.95, "Aurora 0.95 ms (2 GiB, paper)", va="bottom", fontsize=8, color="gray")
    ax.set_title("Rekindle snapshot stop time (whiskers: p1-p99)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build", type=Path)
    ap.add_argument("--sizes-mb", type=int, nargs="+", default=[2048, 8192])
    ap.add_argument("--permille", type=int, nargs="+", default=[1, 10, 100])
    ap.add_argument("--interval-ms", type=int, default=100)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--out", default="snapshots")
    a = ap.parse_args()
    build = a.build.resolve()
    rows = []
    for mb in a.sizes_mb:
        for pm in a.permille:
            with tempfile.TemporaryDirectory(prefix="rk-snapbench-") as d:
                r = one_run(build, mb, pm, a.interval_ms, a.seconds, Path(d))
                shutil.rmtree(d, ignore_errors=True)
            rows.append(r)
            short = {k: v for k, v in r.items() if k != "stops"}
            print(json.dumps(short), flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{a.out}.json").write_text(json.dumps(rows, indent=1))
    md = table(rows)
    (RESULTS / f"{a.out}.md").write_text(md + "\n")
    plot(rows, RESULTS / f"{a.out}.png")
    print(md)


if __name__ == "__main__":
    main()
