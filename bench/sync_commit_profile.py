#!/usr/bin/env python3
"""Where rkv `--durability sync` spends its CPU (issue 13): one or more
builds, each in alternating rounds, under the same load.

For each build and round: rkv --durability sync under `rekindle run
--snapshot-dir` (supervisor and rkv pinned to --server-cpu), --keys keys
preloaded (100-byte values, the names `redis-benchmark -r` draws), then
`redis-benchmark -t set -P P -c 50 -n N -r KEYS -d 100` on --client-cpu.
Reported per run:

  SET/s        redis-benchmark's own figure
  cpu_us/SET   user + system CPU of the supervisor and rkv (every thread)
               over the benchmark, per SET: what sets throughput when both
               share one CPU
  commit       medians over the journaled group commits of the run (the
               supervisor's `snapshot` events): SETs per commit, pages cut,
               pages as deltas, stop (the app frozen; of it the freeze,
               the scan and the cut's copy), put (hash, compress),
               commit (record written, fdatasync)
  rss          the supervisor's VmRSS less RssShmem (the app's memfd pages
               it maps) over the benchmark (sampled every
               50 ms): median and peak, MiB

A build may carry environment settings for its supervisor after commas,
so one build can be compared with itself under other settings:

    python3 bench/sync_commit_profile.py build build,REKINDLE_SNAPSHOT_SHADOW_BYTES=67108864

--perf records `perf record -g` on the server CPU during the benchmark of
each run (its perf.data stays in the run's directory, kept with --keep):
`perf report -i DIR/perf.data --no-children --sort comm,sym`.

Example (two builds, 3 rounds):

    python3 bench/sync_commit_profile.py build /tmp/before --rounds 3
"""

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from snapshot_common import RkvStack, RssSampler, fill, free_port, rss_of, taskset  # noqa: E402


def cpu_ticks(pids):
    """utime + stime of each pid (all its threads), in clock ticks."""
    t = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        t += int(fields[11]) + int(fields[12])
    return t


def rss_summary(sampler):
    """Median and peak of the supervisor's VmRSS samples (without the app's
    memfd pages it maps: snapshot_common.rss_of), MiB."""
    v = [rss_of(s) / (1 << 20) for s in sampler.samples]
    if not v:
        return {}
    return {"rss_median_mib": round(statistics.median(v)), "rss_peak_mib": round(max(v))}


def parse_build(spec):
    """DIR[,KEY=VALUE...]: a build directory and environment settings."""
    path, *env = spec.split(",")
    pairs = {}
    for kv in env:
        k, sep, v = kv.partition("=")
        if not sep or not k:
            raise argparse.ArgumentTypeError(f"{kv!r}: KEY=VALUE after a build's comma")
        pairs[k] = v
    return (Path(path).resolve(), pairs, spec)


def commit_medians(events, t0_ns):
    """Medians over the journaled snapshots taken after t0_ns."""
    js = [
        e for e in events if e.get("supervisor") == "snapshot" and e.get("journaled") and e["t_ns"] >= t0_ns
    ]
    if not js:
        return {"commits": 0}

    def med(k):
        v = [e[k] for e in js if k in e]
        return statistics.median(v) if v else None

    return {
        "commits": len(js),
        "cut_pages": med("cut_pages"),
        "delta_pages": med("delta_pages"),
        "stop_us": med("stop_us"),
        "freeze_us": med("freeze_us"),
        "scan_us": med("scan_us"),
        "cut_copy_us": med("cut_copy_us"),
        "put_us": med("put_us"),
        "commit_us": med("commit_us"),
        "took_us": med("took_us"),
    }


def one_run(spec, args, rnd):
    build, env, name = spec
    wd = Path(tempfile.mkdtemp(prefix=f"sync-profile-r{rnd}-", dir=args.workdir))
    port = free_port()
    stack = RkvStack(build, wd, port, name="sync-profile", cpu=args.server_cpu, snapshot_dir=wd / "store",
                     interval="100ms", durability="sync")  # fmt: skip
    stack.env.update(env)
    stack.start()
    try:
        stack.wait_serving()
        fill(port, args.keys, 100, conns=4)
        stack.checkpoint()
        time.sleep(1.0)
        pids = [stack.sup_pid, stack.app_pid()]
        perf = None
        if args.perf:
            perf = subprocess.Popen(
                ["perf", "record", "-g", "-C", str(args.server_cpu), "-o", str(wd / "perf.data"),
                 "--", "sleep", str(args.perf_seconds)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
        rss = RssSampler(lambda: {"supervisor": stack.sup_pid}, max_s=args.timeout + 60).start()
        c0, t0_ns, t0 = cpu_ticks(pids), time.monotonic_ns(), time.monotonic()
        bench = ["redis-benchmark", "-p", str(port), "-c", "50", "-n", str(args.requests),
                 "-P", str(args.pipeline), "-t", "set", "-r", str(args.keys), "-d", "100", "-q"]  # fmt: skip
        out = subprocess.run(
            taskset(args.client_cpu, bench), capture_output=True, text=True, timeout=args.timeout, check=False
        )
        secs = time.monotonic() - t0
        c1 = cpu_ticks(pids)
        rss.stop()
        rss_res = rss_summary(rss)
        if perf:
            perf.wait(timeout=args.perf_seconds + 60)
        line = [x for x in out.stdout.splitlines() if x.startswith("SET:")]
        rps = float(line[-1].split()[1]) if line else None
        tick = 1e6 / 100  # us per clock tick (USER_HZ)
        res = {
            "build": name,
            "round": rnd,
            "set_per_s": rps,
            "seconds": round(secs, 2),
            "cpu_us_per_set": round((c1 - c0) * tick / args.requests, 2),
            **commit_medians(stack.events(), t0_ns),
            **rss_res,
        }
        if res["commits"]:
            res["sets_per_commit"] = round(args.requests / res["commits"], 1)
        res["dir"] = str(wd) if args.keep or args.perf else None
        return res
    finally:
        stack.stop()
        if not (args.keep or args.perf):
            shutil.rmtree(wd, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("builds", nargs="+", type=parse_build,
                    help="build directories (bin/rekindle, examples/rkv): DIR[,KEY=VALUE...]")  # fmt: skip
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--requests", type=int, default=300_000)
    ap.add_argument("--pipeline", type=int, default=16)
    ap.add_argument("--server-cpu", default="0")
    ap.add_argument("--client-cpu", default="1")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds for one benchmark at most")
    ap.add_argument("--perf", action="store_true", help="perf record the server CPU during each benchmark")
    ap.add_argument("--perf-seconds", type=int, default=6)
    ap.add_argument("--keep", action="store_true", help="keep each run's directory")
    ap.add_argument("--workdir", default=None, help="where the runs' directories go (default: a temp dir)")
    ap.add_argument("--json", action="store_true", help="one JSON object per run, then the summary")
    args = ap.parse_args()
    for b, _, _ in args.builds:
        for f in ("bin/rekindle", "examples/rkv"):
            if not (b / f).exists():
                ap.error(f"{b / f} missing: build it first (make all)")
    if args.rounds < 1 or args.requests < 1 or args.keys < 1:
        ap.error("--rounds, --requests and --keys must be at least 1")
    runs = []
    for rnd in range(1, args.rounds + 1):
        for b in args.builds:
            r = one_run(b, args, rnd)
            runs.append(r)
            print(json.dumps(r) if args.json else
                  f"round {rnd} {b[2]}: {r['set_per_s']} SET/s, {r['cpu_us_per_set']} us CPU/SET, "
                  f"{r.get('sets_per_commit')} SETs/commit, pages {r.get('cut_pages')} "
                  f"({r.get('delta_pages')} deltas), stop {r.get('stop_us')} us, put {r.get('put_us')} us, "
                  f"commit {r.get('commit_us')} us, "
                  f"RSS {r.get('rss_median_mib')}/{r.get('rss_peak_mib')} MiB",
                  flush=True)  # fmt: skip
    summary = {}
    for _, _, name in args.builds:
        mine = [r for r in runs if r["build"] == name]
        summary[name] = {
            "set_per_s": statistics.median([r["set_per_s"] or 0 for r in mine]),
            "cpu_us_per_set": statistics.median([r["cpu_us_per_set"] for r in mine]),
            "rss_peak_mib": max([r.get("rss_peak_mib") or 0 for r in mine]),
        }
    print(json.dumps({"medians": summary}) if args.json else f"medians: {json.dumps(summary)}")


if __name__ == "__main__":
    main()
