"""Stage-based progress recovery against the usual alternatives.

examples/kmeans runs ITERS iterations of k-means over POINTS x DIMS floats
(2.5 GiB by default).  A NULL pointer write is injected halfway through the
assign stage of iteration ITERS/2, and the job recovers four ways:

  baseline     no crash (the reference time)
  stages       warm restart: points and centroids are still in the arena, the
               job resumes at the interrupted stage (rekindle_stages.h)
  scratch      cold restart: regenerate the points, start from iteration 0
  checkpoint   cold restart: regenerate the points (a real job re-reads its
               input), load the centroids written every K iterations

Every run must end with the same centroid hash.  Prints a markdown table,
writes it to bench/results/stages.md and one JSON line per run to
bench/results/stages.jsonl.

    python3 bench/stages_bench.py BUILD [--points N] [--dims D] [--k K]
                                        [--iters I] [--checkpoint-every K]
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def machine():
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem_kb = int(Path("/proc/meminfo").read_text().split()[1])
    except OSError:
        mem_kb = 0
    return f"{cpu}, {os.cpu_count()} CPUs, {mem_kb / 2**20:.0f} GiB RAM, Linux {platform.release()}"


def run(exe, common, extra):
    env = {k: v for k, v in os.environ.items() if k not in ("KMEANS_T0", "REKINDLE_MANIFEST_FD")}
    cmd = [str(exe), *common, *extra]
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    res = [json.loads(line) for line in p.stdout.splitlines() if line.startswith('{"kmeans"')][-1]
    res["wall_s"] = round(wall, 3)
    res["command"] = " ".join(cmd[1:])
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build", nargs="?", default="build")
    ap.add_argument("--points", type=int, default=40_000_000)
    ap.add_argument("--dims", type=int, default=16)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--checkpoint-every", type=int, default=3)
    ap.add_argument("--crash-fraction", type=float, default=0.5)
    args = ap.parse_args()

    exe = Path(args.build) / "examples" / "kmeans"
    if not exe.exists():
        sys.exit(f"{exe} missing: run make first")
    common = ["--points", args.points, "--dims", args.dims, "--k", args.k, "--iters", args.iters, "--quiet"]
    common = [str(c) for c in common]
    crash_iter = args.iters // 2
    crash = ["--crash-at", f"{crash_iter}:assign:{args.crash_fraction}"]
    ckpt = Path(tempfile.mkdtemp(prefix="kmeans-bench-")) / "centroids.ckpt"
    ck = ["--checkpoint-every", str(args.checkpoint_every), "--checkpoint-file", str(ckpt)]
    gib = args.points * args.dims * 4 / 2**30

    runs = [
        ("baseline", "no crash", []),
        ("stages", "warm restart, resume at the interrupted stage", crash),
        ("scratch", "cold restart, regenerate input, start from iteration 0", ["--mode", "scratch", *crash]),
        (
            "checkpoint",
            f"cold restart, regenerate input, last checkpoint (every {args.checkpoint_every} iterations)",
            ["--mode", "checkpoint", *ck, *crash],
        ),
    ]
    results = []
    for name, how, extra in runs:
        print(f"running {name} ...", file=sys.stderr, flush=True)
        r = run(exe, common, extra)
        r["bench"] = "stages"
        r["variant"] = name
        r["how"] = how
        results.append(r)
    base = results[0]
    hashes = {r["hash"] for r in results}
    if len(hashes) != 1:
        sys.exit(f"results differ: {[(r['variant'], r['hash']) for r in results]}")

    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    cmd = f"python3 bench/stages_bench.py {args.build} " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "build"
    )
    lines = [
        f"k-means, {args.points:,} points x {args.dims} dims float ({gib:.2f} GiB), k={args.k}, "
        f"{args.iters} iterations; crash (NULL write) {args.crash_fraction:.0%} into the assign stage of "
        f"iteration {crash_iter}.",
        "",
        f"Command: `{cmd}`  ",
        f"Machine: {machine()}  ",
        f"Run: {stamp}; every run ended with centroid hash `{base['hash']}`.",
        "",
        "| variant | recovery | CPU (s) | CPU lost to crash (s) | CPU vs. baseline | wall (s) | set-up (s) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lost = r["cpu_s"] - base["cpu_s"]
        setup = "-" if r["variant"] == "baseline" else f"{r['setup_s']:.2f}"
        lines.append(
            f"| {r['variant']} | {r['how']} | {r['cpu_s']:.1f} | "
            f"{'-' if r['variant'] == 'baseline' else f'{lost:.1f}'} | "
            f"{r['cpu_s'] / base['cpu_s']:.2f}x | {r['total_s']:.1f} | {setup} |"
        )
        r["lost_cpu_s"] = round(lost, 3)
        r["lost_wall_s"] = round(r["total_s"] - base["total_s"], 3)
    lines += [
        "",
        "CPU time is the process's user + system time over all its incarnations (exec keeps the",
        "counters); it is the primary measure because the machine may be shared. Wall time includes",
        "waiting for the CPU.",
    ]
    table = "\n".join(lines) + "\n"
    print(table)

    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "stages.md").write_text(table)
    with (out / "stages.jsonl").open("a") as f:
        for r in results:
            r["machine"] = machine()
            r["time"] = stamp
            f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
