#!/usr/bin/env python3
"""What durable snapshots cost rkv's throughput, against Redis 7's own
persistence (issue 13, speed): unmodified `redis-benchmark` against

  rkv                rkv under `rekindle run`, no snapshots: the baseline
  rkv-snap-10ms      rkv --durability async under `rekindle run --snapshot-dir
                     --snapshot-interval 10ms` (replies at once)
  rkv-snap-100ms     the same, --snapshot-interval 100ms
  rkv-sync-redo      the same, its writes made durable by the redo log
                     (--sync-via redo: one append and one fdatasync a group)
  rkv-sync           rkv --durability sync under snapshots (--sync-interval,
                     default 100ms): every reply that may depend on a write
                     waits until that write is in a durable snapshot (group
                     commit)
  redis              redis-server 7, no persistence (reference)
  redis-aof-everysec appendonly yes, appendfsync everysec
  redis-aof-always   appendonly yes, appendfsync always
  redis-bgsave       no AOF; BGSAVE after BGSAVE for the whole run (the next
                     starts as soon as one ends), over the preloaded keyspace

Each server is started fresh for its turn, in its own temp dir, on
127.0.0.1, pinned to --server-cpu (with its supervisor, snapshot engine and
fork children); the harness and redis-benchmark run on --client-cpu.  The
keyspace is preloaded first (--keys keys `key:%012d` with 100-byte values:
the names `redis-benchmark -r` draws, so every recorded SET overwrites and
every GET hits), then a snapshot config takes a checkpoint (`rekindle
checkpoint --wait`: the first, full snapshot is behind it) and Redis waits
for any AOF rewrite to end.  Then four redis-benchmark runs: 50 clients,
-d 100, -r KEYS, SET and GET, without pipelining and with -P 16, bounded by
-n (--requests, --requests-pipelined; --slow-requests* for the configs
where each write waits for the disk: rkv-sync, redis-aof-always) and by
--bench-timeout s (a run cut short reports its last 'overall' rps).

--repeat N rounds; each round runs every config once, in an order rotated
by one each round, so drift of this shared machine lands on all.  Reported:
median requests/s, p50/p99/max latency, server CPU ns per request (the
server's threads: supervisor + rkv, or redis-server; not fork children),
the ratio to the rkv baseline of the same run (of the medians, with the
range of the same-round ratios).  Memory under the write-heavy load (SET
-P 16): supervisor RSS sampled every 50 ms (peak, and its rise over the
idle supervisor before the tests) and the engine's staging peak
(`staging_peak_bytes`, bounded by --snapshot-memory); Redis: the fork's
copy-on-write (current_cow_peak, rdb/aof_last_cow_size).  Size on disk:
the store as it is after the run and folded to its newest snapshot
(`rekindle gc --keep 1`), against Redis's dump.rdb (redis-bgsave) and
appendonlydir.  One PNG: requests/s over time (redis-benchmark's 250 ms
progress lines) of each config in the first round.

  python3 bench/snapshot_rkv_bench.py BUILD [--repeat 5] [--keys 1000000]
      [--configs ...] [--quick] [--self-check] [--out DIR] [--name NAME]
Writes NAME.{md,json,png} (default snapshot_rkv) under bench/results/."""

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from snapshot_common import (  # noqa: E402
    AOF_ALWAYS,
    AOF_EVERYSEC,
    RESULTS,
    RedisServer,
    RkvStack,
    RssSampler,
    children,
    cpu_ns,
    cpu_pressure,
    du_bytes,
    fill,
    fmt,
    free_port,
    info,
    loadavg,
    machine,
    machine_line,
    median,
    mib,
    pin_self,
    redis_wait_quiet,
    resp,
    rss_of,
    store_gc_keep1,
    store_summary,
    taskset,
)

CLIENTS = 50
VALUE = 100
TESTS = [("SET", 1), ("GET", 1), ("SET", 16), ("GET", 16)]

CONFIGS = {
    "rkv": {"kind": "rkv", "label": "rkv, no snapshots (baseline)"},
    "rkv-snap-10ms": {"kind": "rkv", "interval": "10ms", "durability": "async",
                      "label": "rkv, snapshots every 10 ms"},
    "rkv-snap-100ms": {"kind": "rkv", "interval": "100ms", "durability": "async",
                       "label": "rkv, snapshots every 100 ms"},
    "rkv-sync": {"kind": "rkv", "interval": None, "durability": "sync", "slow": True,
                 "label": "rkv --durability sync"},
    "rkv-sync-redo": {"kind": "rkv", "interval": None, "durability": "sync", "slow": True,
                      "rkv_extra": ["--sync-via", "redo"],
                      "label": "rkv --durability sync --sync-via redo"},
    "redis": {"kind": "redis", "label": "Redis 7, no persistence"},
    "redis-aof-everysec": {"kind": "redis", "extra": AOF_EVERYSEC, "label": "Redis 7, AOF everysec"},
    "redis-aof-always": {"kind": "redis", "extra": AOF_ALWAYS, "slow": True, "label": "Redis 7, AOF always"},
    "redis-bgsave": {"kind": "redis", "bgsave": True, "label": "Redis 7, during BGSAVE"},
}  # fmt: skip
BASELINE = "rkv"


# ---------------------------------------------------------------- redis-benchmark


def bench_argv(port, test, pipeline, n, keys):
    argv = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-c", str(CLIENTS), "-n", str(n)]
    argv += ["-t", test.lower(), "-d", str(VALUE), "-r", str(keys)]
    if pipeline > 1:
        argv += ["-P", str(pipeline)]
    return argv


PROGRESS = re.compile(rb"(SET|GET): rps=([\d.]+) \(overall: ([\d.]+)\)")


def run_benchmark(argv, timeout, client_cpu):
    """redis-benchmark, not quiet: its progress lines (every 250 ms, read as
    they come) give the series; its summary the rps and latencies.  Killed
    after timeout s: then the last 'overall' rps, marked truncated."""
    p = subprocess.Popen(taskset(client_cpu, argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    t0 = time.monotonic()
    series, buf = [], b""
    truncated = False
    timer = threading.Timer(timeout, p.kill)
    timer.start()
    try:
        while True:
            b = os.read(p.stdout.fileno(), 65536)
            if not b:
                break
            now = time.monotonic() - t0
            buf += b
            for m in PROGRESS.finditer(b):
                series.append((round(now, 3), float(m.group(2)), float(m.group(3))))
        p.wait()
    finally:
        timer.cancel()
    wall = time.monotonic() - t0
    txt = buf.decode(errors="replace")
    out = {"wall_s": round(wall, 3), "series": series}
    m = re.search(r"throughput summary: ([\d.]+) requests per second", txt)
    lat = re.search(r"avg\s+min\s+p50\s+p95\s+p99\s+max\s*\n\s*([\d.\s]+)", txt)
    if m:
        out["rps"] = float(m.group(1))
    elif series:
        truncated = True
        out["rps"] = series[-1][2]
    else:
        raise RuntimeError(f"redis-benchmark gave nothing: rc {p.returncode} {p.stderr.read()!r}")
    if lat:
        v = [float(x) for x in lat.group(1).split()[:6]]
        out.update(avg_ms=v[0], p50_ms=v[2], p95_ms=v[3], p99_ms=v[4], max_ms=v[5])
    out["truncated"] = truncated or p.returncode != 0
    return out


# ---------------------------------------------------------------- one config


class BgsaveLoop:
    """BGSAVE after BGSAVE until stopped (bounded by max_s); samples the
    fork's copy-on-write from INFO persistence."""

    def __init__(self, port, max_s):
        self.port, self.max_s = port, max_s
        self.started = 0
        self.cow_peak = 0
        self.last_cow = []
        self.busy_s = 0.0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self._t.start()
        return self

    def _run(self):
        end = time.monotonic() + self.max_s
        t_busy = None
        while not self._stop.is_set() and time.monotonic() < end:
            try:
                i = info(self.port, "persistence")
                if i.get("rdb_bgsave_in_progress") == "1":
                    self.cow_peak = max(self.cow_peak, int(i.get("current_cow_peak", "0") or 0))
                else:
                    if t_busy is not None:
                        self.busy_s += time.monotonic() - t_busy
                        self.last_cow.append(int(i.get("rdb_last_cow_size", "0") or 0))
                    resp(self.port, "BGSAVE")
                    self.started += 1
                    t_busy = time.monotonic()
            except Exception:  # noqa: BLE001 - "already in progress" and the like: try again
                pass
            self._stop.wait(0.02)
        if t_busy is not None:
            self.busy_s += time.monotonic() - t_busy

    def stop(self):
        self._stop.set()
        self._t.join(timeout=10)


def keep_args(args):
    """The run options every snapshot config shares: retention, publication."""
    keep = ["--snapshot-keep", str(args.snapshot_keep)] if args.snapshot_keep else []
    if args.snapshot_publish_every:
        keep += ["--snapshot-publish-every", args.snapshot_publish_every]
    return keep


def start_server(name, cfg, build, workdir, args):
    port = free_port()
    if cfg["kind"] == "rkv":
        snap = cfg.get("interval") is not None or cfg.get("durability", "none") != "none"
        interval = cfg.get("interval") or (args.sync_interval if cfg.get("durability") == "sync" else None)
        srv = RkvStack(build, workdir, port, name=f"sb-{name}", cpu=args.server_cpu,
                       snapshot_dir=workdir / "store" if snap else None, interval=interval,
                       durability=cfg.get("durability", "none"), snapshot_memory=args.snapshot_memory,
                       rkv_args=args.rkv_args.split() + cfg.get("rkv_extra", []),
                       sup_args=keep_args(args) if snap else [])  # fmt: skip
        srv.snapshots = snap
    else:
        srv = RedisServer(workdir, port, cfg.get("extra", ()), cpu=args.server_cpu)
        srv.snapshots = False
    srv.start()
    srv.wait_serving()
    return srv, port


def run_config(name, build, rnd, args, workdir):
    cfg = CONFIGS[name]
    srv, port = start_server(name, cfg, build, workdir, args)
    res = {"config": name, "round": rnd, "tests": []}
    snap = srv.snapshots
    try:
        res["fill_s"] = fill(port, args.keys, VALUE, conns=4 if cfg.get("slow") else 2)
        if snap:
            res["checkpoint"] = srv.checkpoint()
        if cfg["kind"] == "redis":
            redis_wait_quiet(port)

        def pids():
            if cfg["kind"] == "rkv":
                p = {"supervisor": srv.sup_pid}
                a = srv.app_pid(timeout=0.1)
                if a:
                    p["app"] = a
                return p
            p = {"redis": srv.proc.pid}
            for i, k in enumerate(children(srv.proc.pid)):
                p[f"child{i}"] = k
            return p

        sampler = RssSampler(pids, period=0.05, max_s=args.bench_timeout * 5 + 60).start()
        time.sleep(0.2)
        t_idle = time.monotonic()
        bg = BgsaveLoop(port, args.bench_timeout * 5 + 60).start() if cfg.get("bgsave") else None
        stats0 = info(port, "stats") if cfg["kind"] == "redis" else {}
        for test, pipeline in TESTS:
            slow = cfg.get("slow")
            n = (
                (args.slow_requests_pipelined if slow else args.requests_pipelined)
                if pipeline > 1
                else (args.slow_requests if slow else args.requests)
            )
            if snap:  # the snapshots catch up with the test before: each test starts settled
                res.setdefault("settle_s", []).append(srv.checkpoint()["wall_s"])
            mypids = srv.pids()
            c0 = cpu_ns(mypids)
            t0 = time.monotonic()
            b = run_benchmark(
                bench_argv(port, test, pipeline, n, args.keys), args.bench_timeout, args.client_cpu
            )
            t1 = time.monotonic()
            c1 = cpu_ns(mypids)
            done = n if not b["truncated"] else round(b["rps"] * b["wall_s"])
            row = {"test": test, "pipeline": pipeline, "requests": n, "t0": t0, "t1": t1, **b,
                   "cpu_ns_per_req": (c1 - c0) / max(1, done)}  # fmt: skip
            res["tests"].append(row)
            print(
                f"  {name:19s} {test} P={pipeline:2d} {b['rps']:>11,.0f}/s"
                f"  p99 {fmt(b.get('p99_ms'), '.2f')} ms"
                f"  max {fmt(b.get('max_ms'), '.1f')} ms{'  TRUNCATED' if b['truncated'] else ''}",
                flush=True,
            )
        if bg:
            bg.stop()
            res["bgsave"] = {"started": bg.started, "busy_s": round(bg.busy_s, 2), "cow_peak": bg.cow_peak,
                             "last_cow": bg.last_cow}  # fmt: skip
        sampler.stop()
        # memory: idle (the samples before the first test) and under each test
        t_first = res["tests"][0]["t0"]
        mem = {}
        for who in ("supervisor", "app", "redis"):
            idle_v = [rss_of(s) for s in sampler.samples if s[1] == who and s[0] <= t_first]
            if not idle_v and not any(s[1] == who for s in sampler.samples):
                continue
            mem[who] = {"idle_rss": idle_v[-1] if idle_v else None,
                        "peak_rss": {f"{r['test']}-P{r['pipeline']}": sampler.peak(who, r["t0"], r["t1"])
                                     for r in res["tests"]}}  # fmt: skip
        kids = [s for s in sampler.samples if s[1].startswith("child")]
        if kids:
            mem["fork_child_peak_rss"] = max(s[2] for s in kids)
        res["mem"] = mem
        res["t_idle"] = t_idle
        if cfg["kind"] == "redis":
            p = info(port, "persistence")
            s1 = info(port, "stats")
            keep = ("aof_last_cow_size", "rdb_last_cow_size", "aof_current_size")
            res["redis"] = {k: p.get(k) for k in (*keep,
                                                  "aof_rewrites", "rdb_saves")}  # fmt: skip
            res["redis"]["forks"] = int(s1.get("total_forks", 0)) - int(stats0.get("total_forks", 0))
        res["keys_end"] = resp(port, "DBSIZE", timeout=600)
        res["loadavg"] = loadavg()
        res["cpu_pressure"] = cpu_pressure()
    finally:
        srv.stop()
    if cfg["kind"] == "rkv":
        evs = srv.events()
        snaps = [e for e in evs if e.get("supervisor") == "snapshot"]
        t_ns0 = res["tests"][0]["t0"] * 1e9 if res["tests"] else 0
        during = [e for e in snaps if e.get("t_ns", 0) >= t_ns0]
        t_ns1 = res["tests"][-1]["t1"] * 1e9 if res["tests"] else 0
        # during the tests (one at the stop, the app exiting mid-snapshot, is not the load's)
        failed = [
            e for e in evs if e.get("supervisor") == "snapshot_failed" and t_ns0 <= e.get("t_ns", 0) <= t_ns1
        ]
        stops = [e["stop_us"] for e in during]
        res["snapshots"] = {
            "count_during_tests": len(during),
            "failed": len(failed),
            "failed_codes": sorted({e.get("code") for e in failed}),
            "stop_us_median": median(stops),
            "stop_us_max": max(stops) if stops else None,
            "took_ms_median": median([e["took_ms"] for e in during]),
            "staging_peak_bytes": max([e.get("staging_peak_bytes", 0) for e in snaps] or [0]),
            "staging_peak_bytes_tests": max([e.get("staging_peak_bytes", 0) for e in during] or [0]),
            "new_bytes_during_tests": sum(e.get("new_bytes", 0) for e in during),
        }
        if snap:
            # its size folded to the newest is measured once every config
            # has run (that gc deletes most of the store's files)
            res["disk"] = {"store": store_summary(build, workdir / "store")}
        res["rkv_durability"] = [e.get("mode") for e in srv.rkv_log("durability")]
    else:
        rdb = workdir / "dump.rdb"
        res["disk"] = {"rdb_bytes": du_bytes(rdb) if rdb.exists() else None,
                       "aof_bytes": du_bytes(workdir / "appendonlydir") or None}  # fmt: skip
    return res


# ---------------------------------------------------------------- report


def test_rows(results, name, test, pipeline):
    return [t for r in results if r["config"] == name for t in r["tests"]
            if (t["test"], t["pipeline"]) == (test, pipeline)]  # fmt: skip


def med_of(results, name, test, pipeline, key="rps"):
    return median([t.get(key) for t in test_rows(results, name, test, pipeline)])


def ratio_cell(results, name, test, pipeline):
    a, b = med_of(results, name, test, pipeline), med_of(results, BASELINE, test, pipeline)
    if a is None or not b:
        return "—"
    by = {}
    for r in results:
        for t in r["tests"]:
            if (t["test"], t["pipeline"]) == (test, pipeline):
                by[(r["round"], r["config"])] = t["rps"]
    rr = [
        by[(k, name)] / by[(k, BASELINE)]
        for k in {k for k, _ in by}
        if (k, name) in by and (k, BASELINE) in by
    ]
    rng = f" [{min(rr):.0%}–{max(rr):.0%}]" if len(rr) > 1 else ""
    return f"**{a / b:.0%}**{rng}"


def table(results, configs, args, command, mach):
    n_rounds = len({r["round"] for r in results})
    out = [
        "## Throughput under durable snapshots: rkv against Redis 7's persistence (redis-benchmark)",
        "",
        f"Command: `{command}`  ",
        f"Machine: {mach}  ",
        f"Servers pinned to CPU {args.server_cpu} (with the supervisor, its snapshot engine, fork children), "
        f"redis-benchmark and the harness to CPU {args.client_cpu}. `redis-benchmark -c {CLIENTS} -d {VALUE} "
        f"-r {args.keys}`, SET and GET as separate runs, with and without `-P 16`; "
        f"-n {args.requests:,} / {args.requests_pipelined:,} (-P 16), "
        f"{args.slow_requests:,} / {args.slow_requests_pipelined:,} for rkv-sync and redis-aof-always. "
        f"Keyspace preloaded ({args.keys:,} keys of {VALUE} B, the names the benchmark draws), each server "
        f"fresh for its turn; {n_rounds} round(s), configs in a rotated order each round. Medians; "
        f"ratio: median over the rkv baseline's median (range of the same-round ratios).",
        "",
        "| config | test | P | requests/s | vs rkv baseline | p50 ms | p99 ms | max ms | server CPU ns/req |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for test, pipeline in TESTS:
        for name in configs:
            rows = test_rows(results, name, test, pipeline)
            if not rows:
                continue
            trunc = sum(bool(t["truncated"]) for t in rows)
            tr = f" ({trunc} cut at {args.bench_timeout:.0f} s)" if trunc else ""
            out.append(
                f"| {CONFIGS[name]['label']} | {test} | {pipeline} "
                f"| {med_of(results, name, test, pipeline):,.0f}{tr} "
                f"| {ratio_cell(results, name, test, pipeline)} "
                f"| {fmt(med_of(results, name, test, pipeline, 'p50_ms'), '.3f')} "
                f"| {fmt(med_of(results, name, test, pipeline, 'p99_ms'), '.2f')} "
                f"| {fmt(med_of(results, name, test, pipeline, 'max_ms'), '.1f')} "
                f"| {fmt(med_of(results, name, test, pipeline, 'cpu_ns_per_req'), ',.0f')} |"
            )
    # snapshots and memory
    out += [
        "",
        "### Snapshots, memory and disk",
        "",
        f"Memory under the write-heavy load (SET -P 16): supervisor VmRSS less RssShmem (the app's memfd "
        f"pages it maps) sampled every 50 ms, its peak and "
        f"its rise over the idle supervisor of the same run; the engine's staging peak "
        f"(`staging_peak_bytes`, "
        f"bounded by --snapshot-memory {args.snapshot_memory or '64M (default)'}). Redis: the peak "
        f"copy-on-write of its BGSAVE fork (`current_cow_peak`). Disk: the store after the run (all its "
        f"snapshots) and folded to the newest (`rekindle gc --keep 1`), against Redis's dump.rdb and "
        f"appendonlydir after the run. Medians over the rounds.",
        "",
        "| config | snapshots during the tests | failed | stop median / max | each took (median) "
        "| supervisor RSS idle → peak (SET -P16) | staging peak | Redis fork CoW peak, BGSAVEs "
        "| on disk after the run | on disk, newest only |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in configs:
        rs = [r for r in results if r["config"] == name]
        if not rs:
            continue

        def m(f, rs=rs):
            return median([f(r) for r in rs])

        def g(d, *ks):
            for k in ks:
                if not isinstance(d, dict) or d.get(k) is None:
                    return None
                d = d[k]
            return d

        cells = [CONFIGS[name]["label"]]
        if CONFIGS[name]["kind"] == "rkv":
            sn = [r["snapshots"] for r in rs]
            cells += [fmt(median([s["count_during_tests"] for s in sn]), ".0f"),
                      failed_cell(sn),
                      f"{fmt(median([s['stop_us_median'] for s in sn]), ',.0f')} us / "
                      f"{fmt(median([s['stop_us_max'] for s in sn]), ',.0f')} us",
                      fmt(median([s["took_ms_median"] for s in sn]), ".0f") + " ms"]  # fmt: skip
            idle = m(lambda r: g(r, "mem", "supervisor", "idle_rss"))
            peak = m(lambda r: g(r, "mem", "supervisor", "peak_rss", "SET-P16"))
            cells.append(f"{fmt(mib(idle), '.1f')} → {fmt(mib(peak), '.1f')} MiB"
                         + (f" (+{mib(peak - idle):.1f})" if idle and peak else ""))  # fmt: skip
            cells.append(fmt(mib(m(lambda r: r["snapshots"]["staging_peak_bytes_tests"])), ".1f") + " MiB")
            cells.append("")
            cells.append(fmt(mib(m(lambda r: g(r, "disk", "store", "du_bytes"))), ",.1f", "") + " MiB"
                         if m(lambda r: g(r, "disk", "store", "du_bytes")) else "—")  # fmt: skip
            cells.append(fmt(mib(m(lambda r: g(r, "disk", "store_keep1_bytes"))), ",.1f", "—") + " MiB"
                         if m(lambda r: g(r, "disk", "store_keep1_bytes")) else "—")  # fmt: skip
        else:
            cells += ["", "", "", ""]
            idle = m(lambda r: g(r, "mem", "redis", "idle_rss"))
            cells.append(f"(redis-server {fmt(mib(idle), '.0f')} MiB)")
            cells.append("")
            if CONFIGS[name].get("bgsave"):
                cells.append(f"{fmt(mib(m(lambda r: g(r, 'bgsave', 'cow_peak'))), ',.1f')} MiB, "
                             f"{fmt(m(lambda r: g(r, 'bgsave', 'started')), '.0f')} BGSAVEs")  # fmt: skip
            else:
                cells.append("")
            disk = m(lambda r: g(r, "disk", "rdb_bytes") or g(r, "disk", "aof_bytes"))
            what = "RDB" if CONFIGS[name].get("bgsave") else "AOF"
            cells.append(f"{what} {mib(disk):,.1f} MiB" if disk else "—")
            cells.append("")
        out.append("| " + " | ".join(cells) + " |")
    out += ["", f"![requests/s over time]({args.name}.png)", ""]
    return "\n".join(out) + "\n"


def failed_cell(sn):
    n = sum(s["failed"] for s in sn)
    codes = sorted({c for s in sn for c in s["failed_codes"] if c})
    return f"{n} {' '.join(codes)}".strip()


def plot(results, configs, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib: no PNG", file=sys.stderr)
        return
    first = min(r["round"] for r in results)
    fig, axes = plt.subplots(2, 2, figsize=(13, 8))
    for ax, (test, pipeline) in zip(axes.flat, TESTS, strict=True):
        for name in configs:
            for r in results:
                if r["config"] != name or r["round"] != first:
                    continue
                for t in r["tests"]:
                    if (t["test"], t["pipeline"]) == (test, pipeline) and t["series"]:
                        xs = [s[0] for s in t["series"]]
                        ys = [s[1] / 1000 for s in t["series"]]
                        ls = "-" if CONFIGS[name]["kind"] == "rkv" else "--"
                        ax.plot(xs, ys, ls, lw=1.0, label=CONFIGS[name]["label"])
        ax.set_title(f"{test}, {'-P 16' if pipeline > 1 else 'no pipelining'}")
        ax.set_xlabel("s since redis-benchmark started")
        ax.set_ylabel("requests/s (thousands, per 250 ms)")
        ax.set_ylim(bottom=0)
    axes.flat[0].legend(fontsize=7, loc="lower right")
    fig.suptitle(
        "rkv under durable snapshots vs Redis 7 persistence: redis-benchmark throughput (first round)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------- main


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build", type=Path)
    ap.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    ap.add_argument("--repeat", type=int, default=5, help="rounds (medians over them)")
    ap.add_argument("--keys", type=int, default=1_000_000, help="preloaded keyspace = redis-benchmark -r")
    ap.add_argument("--requests", type=int, default=300_000, help="-n without pipelining")
    ap.add_argument("--requests-pipelined", type=int, default=2_000_000, help="-n with -P 16")
    ap.add_argument("--slow-requests", type=int, default=20_000, help="-n, rkv-sync and AOF always")
    ap.add_argument("--slow-requests-pipelined", type=int, default=200_000)
    ap.add_argument("--bench-timeout", type=float, default=120.0, help="s per redis-benchmark run at most")
    ap.add_argument("--sync-interval", default="100ms", help="rkv-sync's --snapshot-interval")
    ap.add_argument("--snapshot-memory", default=None, help="rekindle run --snapshot-memory (default 64M)")
    ap.add_argument("--snapshot-keep", type=int, default=None, help="--snapshot-keep N (snapshot configs)")
    ap.add_argument(
        "--snapshot-publish-every",
        default=None,
        metavar="DUR",
        help="--snapshot-publish-every DUR (snapshot configs)",
    )
    ap.add_argument("--rkv-args", default="", help="more rkv options for every rkv config")
    ap.add_argument("--server-cpu", default="0")
    ap.add_argument("--client-cpu", default="1")
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 round, 100k keys, small -n")
    ap.add_argument("--self-check", action="store_true", help="run --quick into a temp dir and check it")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--name", default="snapshot_rkv")
    ap.add_argument("--keep-files", type=Path, metavar="DIR",
                    help="the stores and logs go under DIR and stay (default: a temporary directory, "
                         "removed at the end); runs one after another then never measure in the wake "
                         "of the previous run's deletions")  # fmt: skip
    a = ap.parse_args(argv)
    if a.quick:
        a.repeat, a.keys = 1, 100_000
        a.requests, a.requests_pipelined = 20_000, 100_000
        a.slow_requests, a.slow_requests_pipelined = 2_000, 20_000
        a.bench_timeout = min(a.bench_timeout, 30.0)
    return a


def main(argv=None):
    args = parse(argv)
    if args.self_check:
        return self_check(args)
    build = args.build.resolve()
    for p in (build / "bin" / "rekindle", build / "examples" / "rkv"):
        if not p.exists():
            sys.exit(f"{p} missing: run make all")
    pin_self(args.client_cpu)
    configs = list(args.configs)
    if BASELINE not in configs:
        print("note: no rkv baseline in --configs: no ratios", file=sys.stderr)
    results = []
    t_all = time.monotonic()
    # every config's files stay until the run ends: deleting a store of
    # thousands of files makes the next config's file creations slow for
    # minutes (ext4 without a journal scans the inodes it freed recently)
    workdirs = []
    if args.keep_files:
        args.keep_files.mkdir(parents=True, exist_ok=True)
    with (
        contextlib.nullcontext(tempfile.mkdtemp(prefix="snaprkv-", dir=args.keep_files))
        if args.keep_files
        else tempfile.TemporaryDirectory(prefix="snaprkv-")
    ) as top:
        for rnd in range(args.repeat):
            k = rnd % len(configs)
            for name in configs[k:] + configs[:k]:
                print(f"round {rnd + 1}/{args.repeat}: {name}", flush=True)
                workdir = Path(top) / f"{rnd}-{name}"
                workdir.mkdir()
                results.append(run_config(name, build, rnd, args, workdir))
                workdirs.append(workdir)
        for res, workdir in zip(results, workdirs, strict=True):
            if (workdir / "store").is_dir():
                res["disk"]["store_keep1_bytes"] = store_gc_keep1(build, workdir / "store")
    mach = machine()
    command = "python3 bench/snapshot_rkv_bench.py " + " ".join(sys.argv[1:] if argv is None else argv)
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {"command": command, "machine": mach, "wall_s": round(time.monotonic() - t_all, 1),
           "args": {k: str(v) for k, v in vars(args).items()}, "results": results}  # fmt: skip
    (args.out / f"{args.name}.json").write_text(json.dumps(doc, indent=1))
    md = table(results, configs, args, command, machine_line(mach))
    (args.out / f"{args.name}.md").write_text(md)
    plot(results, configs, args.out / f"{args.name}.png")
    print(md)
    return doc


def self_check(args):
    """The quick mode, into a temp dir: every config ran every test and
    served, the table, JSON and PNG are there."""
    with tempfile.TemporaryDirectory(prefix="snaprkv-check-") as d:
        argv = [str(args.build), "--quick", "--out", d, "--name", "check"]
        if args.configs != list(CONFIGS):
            argv += ["--configs", *args.configs]
        doc = main(argv)
        res = doc["results"]
        problems = []
        for name in args.configs:
            rs = [r for r in res if r["config"] == name]
            if len(rs) != 1 or len(rs[0]["tests"]) != len(TESTS):
                problems.append(f"{name}: {len(rs)} results")
                continue
            for t in rs[0]["tests"]:
                if not t["rps"] > 0 or not t["series"]:
                    problems.append(f"{name} {t['test']} P{t['pipeline']}: rps {t['rps']}, no series")
            if rs[0]["keys_end"] < 0.6 * 100_000:
                problems.append(f"{name}: {rs[0]['keys_end']} keys at the end")
            if CONFIGS[name]["kind"] == "rkv" and name != BASELINE:
                s = rs[0]["snapshots"]
                if s["count_during_tests"] < 1:
                    problems.append(f"{name}: no snapshot during the tests")
                if not rs[0]["disk"]["store_keep1_bytes"]:
                    problems.append(f"{name}: empty store")
        for ext in ("md", "json", "png"):
            if not (Path(d) / f"check.{ext}").stat().st_size:
                problems.append(f"check.{ext} empty")
        if problems:
            print("SELF-CHECK FAILED:\n  " + "\n  ".join(problems))
            sys.exit(1)
        print(
            f"self-check ok: {len(res)} configs, {sum(len(r['tests']) for r in res)} runs, "
            "md/json/png written"
        )
    return doc


if __name__ == "__main__":
    main()
