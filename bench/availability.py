"""Availability through a crash: rkv's warm restart against cold restarts and
real Redis 7 reloading its RDB (the metrics of PHOENIX, SOSP '25, sec. 4.3.3).

For each key count N and scenario, one run:

  1. start the server (pinned to CPU 0; rkv with --rkv-args), load N keys of 100-byte values with
     pipelined SETs (bench/respload.c, `respload load`);
  2. start the closed-loop client (`respload run`, pinned to CPU 1): 4
     connections x 32 pipelined commands, GETs of uniformly random keys,
     5% SETs of fresh values (with a sequence number), cache-aside (a miss
     SETs the key back), reconnect at once and then every 1 ms; it reports
     successful GETs, hits and misses per 100 ms (--bucket-ms);
  3. after --warmup s, snapshot if the scenario has one (SAVE), then wait
     --before s (default 30: the snapshot is 30 s old at the crash);
  4. crash: `DEBUG SEGFAULT`;
  5. keep the client running until the effective availability is back to
     90% and a few seconds more (at least --after-min s, at most
     --after-max s); then the client reads back every key whose last
     acknowledged write was a fresh SET (lost acknowledged writes).

Scenarios:
  rkv-cold-empty     rkv restarted cold by this harness, no persistence
  rkv-cold-snapshot  rkv restarted cold by this harness, loads its snapshot
  rkv-warm           rkv under `rekindle run`: warm restart in place
  redis-rdb          redis-server 7 restarted by this harness, loads its RDB
"Restarted by this harness": a watcher thread respawns the process with the
same argv the moment it dies (systemd's Restart=always without delay).

Metrics (effective availability = GET hits per second, as in PHOENIX):
  downtime        the longest time around the crash with no successful reply
                  at all, from the client's own timestamps (last success
                  before, first success after; 1 ms slots), and the same in
                  whole empty buckets
  avail@5s        effective availability in the fifth second after the
                  crash, [crash+4 s, crash+5 s), over the 5 s before it
  t90             time from the crash to the end of the first bucket
                  from which the next 500 ms average >= 90% of before
  lost writes     acknowledged fresh SETs whose value was later missing or
                  older (in flight at the crash excepted)

Usage: python3 bench/availability.py BUILD [--keys 1000000 5000000] [--quick]
       [--scenarios ...] [--before 30] [--json]
Writes bench/results/availability.{jsonl,md} and availability_<N>.png (--out
DIR elsewhere); docs/results-rkv.md quotes them."""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rkv_common import (  # noqa: E402
    ROOT,
    Server,
    free_port,
    have_rkv,
    machine,
    machine_line,
    redis_argv,
    resp,
    rkv_argv,
    send_only,
    supervised_argv,
    wait_serving,
)

SCENARIOS = {
    "rkv-cold-empty": "rkv, cold restart, no persistence",
    "rkv-cold-snapshot": "rkv, cold restart from its snapshot",
    "rkv-warm": "rkv under `rekindle run`, warm restart",
    "redis-rdb": "Redis 7, restart from its RDB",
}
SNAPSHOT = {"rkv-cold-snapshot", "redis-rdb"}
CLIENT = {"conns": 4, "pipeline": 32, "write_pct": 5}
BUCKET_MS = 100  # the client's default; --bucket-ms for a finer timeline
T90_WINDOW_S = 0.5  # t90: from a bucket on, this long must average >= 90%


class Client:
    """`respload run` in the background; live buckets from its stdout."""

    def __init__(self, build, port, keys, bucket_ms, cpu="1"):
        argv = [str(build / "bench" / "respload"), "run", "--port", str(port), "--keys", str(keys)]
        argv += ["--conns", str(CLIENT["conns"]), "--pipeline", str(CLIENT["pipeline"])]
        argv += ["--write-pct", str(CLIENT["write_pct"]), "--duration", "900", "--bucket-ms", str(bucket_ms)]
        self.bucket_s = bucket_ms / 1000
        if shutil.which("taskset"):
            argv = ["taskset", "-c", cpu, *argv]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        self.live = []  # [b, get, hit, miss, set, wr, err]
        self.summary = None
        self.t0 = time.monotonic()  # replaced by the client's own t0 at the end
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                d = json.loads(line)
            except json.JSONDecodeError:
                continue
            if d.get("respload") == "bucket":
                self.live.append([d["b"], d["get"], d["hit"], d["miss"], d["set"], d["wr"], d["err"]])
            elif d.get("respload") == "summary":
                self.summary = d

    def stop(self):
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=300)
        self._reader.join(timeout=10)
        if not self.summary:
            raise RuntimeError("respload: no summary")
        return self.summary


def start_server(name, build, port, workdir, keys, rkv_args):
    """Returns (Server, restarted_by_harness).  rkv_args: more options for rkv."""
    maxmemory = 0  # rkv: refuse writes above this; 0 = no limit (Redis has none set either)
    if name == "redis-rdb":
        return Server("redis", redis_argv(port, workdir), workdir), True
    if name in ("rkv-cold-empty", "rkv-cold-snapshot"):
        # rkv-malloc is the same server without Rekindle: a fault kills it,
        # and the harness starts it again (cold).
        argv = rkv_argv(build / "examples" / "rkv-malloc", port, workdir, maxmemory) + rkv_args
        return Server("rkv-malloc", argv, workdir), True
    if name == "rkv-warm":
        env = dict(os.environ, REKINDLE_RUNTIME_DIR=str(workdir / "run"))
        env.pop("NOTIFY_SOCKET", None)
        app = rkv_argv(build / "examples" / "rkv", port, workdir, maxmemory) + rkv_args
        argv = supervised_argv(build, "rkv-avail", port, workdir / "events.jsonl", app)
        return Server("rekindle", argv, workdir, env=env), False
    raise ValueError(name)


def server_notes(name, server, workdir):
    """What the server itself said about its restart."""
    notes = {}
    if name == "redis-rdb":
        logs = (workdir / "redis.log").read_text(errors="replace") if (workdir / "redis.log").exists() else ""
        loads = [ln.split("DB loaded from disk:")[1].strip() for ln in logs.splitlines() if "DB loaded" in ln]
        notes["rdb_loaded"] = loads
    else:
        ready, verified, hugepages = [], [], []
        for i in range(server.incarnation + 1):
            p = server.log_path(i)
            if not p.exists():
                continue
            for ln in p.read_text(errors="replace").splitlines():
                if '"rkv"' in ln or '"rekindle":"hugepages"' in ln:
                    try:
                        d = json.loads(ln)
                    except json.JSONDecodeError:
                        continue
                    if d.get("rkv") == "ready":
                        ready.append(d)
                    elif d.get("rkv") == "verified":
                        verified.append(d)
                    elif d.get("rekindle") == "hugepages":
                        hugepages.append(d)
        notes["ready"] = ready
        notes["verified"] = verified  # the warm start's check of the table: when it ended
        notes["hugepages"] = hugepages  # the runtime's huge pages thread: waiting, off, on again
    ev = workdir / "events.jsonl"
    if ev.exists():
        evs = [json.loads(ln) for ln in ev.read_text().splitlines() if ln.strip()]
        notes["restart"] = [
            {k: e.get(k) for k in ("mode", "path", "decided", "detect_us", "spawn_us", "ready_us")}
            for e in evs
            if e.get("supervisor") == "restart"
        ]
        notes["up"] = [
            {k: e.get(k) for k in ("kind", "reason", "restart_us", "preserved_bytes")}
            for e in evs
            if e.get("supervisor") == "up"
        ]
    notes["harness_respawns"] = [
        {"exit_rc": rc, "respawn_ms_after_exit": round((t1 - t0) * 1000, 2)} for t0, rc, t1 in server.exits
    ]
    return notes


def t90_of(rel, eff, pre, bucket_s):
    """Crash to the end of the first bucket after it that is back to 90% of
    pre, and from which T90_WINDOW_S averages 90% too; None if none."""
    n = max(1, round(T90_WINDOW_S / bucket_s))
    for i, r in enumerate(rel):
        win = eff[i : i + n]
        if r >= 0 and len(win) == n and eff[i] >= 0.9 * pre and sum(win) / n >= 0.9 * pre:
            return r + bucket_s
    return None


def recovered(live, t0, t_crash, pre, bucket_s):
    """t90 from live buckets (seconds after the crash), or None."""
    rel = [t0 + b * bucket_s - t_crash for b, *_ in live]
    return None if pre <= 0 else t90_of(rel, [hit / bucket_s for _b, _g, hit, *_ in live], pre, bucket_s)


def coarser(rel, eff, bucket_s, to_s):
    """The series in buckets of to_s (a multiple of bucket_s), as the client
    would have counted them: aligned to its start."""
    k = round(to_s / bucket_s)
    n = len(eff) // k
    return [rel[i * k] for i in range(n)], [sum(eff[i * k : i * k + k]) / k for i in range(n)]


def run_one(name, build, keys, args, workdir):
    port = free_port()
    server, harness_restarts = start_server(name, build, port, workdir, keys, args.rkv_args.split())
    server.start(respawn=harness_restarts)
    try:
        wait_serving(port, proc=server.proc)
        t = time.monotonic()
        load = subprocess.run(
            ["taskset", "-c", "1", str(build / "bench" / "respload"), "load", "--port", str(port)]
            + ["--keys", str(keys)],
            capture_output=True,
            text=True,
            check=True,
        )
        loaded = json.loads(load.stdout)
        print(f"  loaded {keys} keys in {time.monotonic() - t:.1f} s", flush=True)
        client = Client(build, port, keys, args.bucket_ms)
        bucket_s = client.bucket_s
        time.sleep(args.warmup)
        t_snap = t_snap_done = None
        if name in SNAPSHOT:
            t_snap = time.monotonic()
            resp(port, "SAVE", timeout=600)
            t_snap_done = time.monotonic()
            print(f"  SAVE took {t_snap_done - t_snap:.2f} s", flush=True)
        client.proc.send_signal(signal.SIGUSR1)  # count keys written from here to the crash
        t_mark = time.monotonic()
        time.sleep(args.before)
        loadavg = Path("/proc/loadavg").read_text().split()[:3]
        psi = Path("/proc/pressure/cpu")
        # CPU pressure (PSI "some"): the share of time runnable tasks waited for
        # a CPU; others' work on this shared VM shows here
        pressure = psi.read_text().split("\n")[0] if psi.exists() else None
        info = resp(port, "INFO", "memory") if name.startswith("rkv") else b""
        info = info.decode(errors="replace") if isinstance(info, bytes) else str(info)
        huge = [ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("arena_huge")]
        conn, t_crash = send_only(port, "DEBUG", "SEGFAULT")
        client.proc.send_signal(signal.SIGUSR2)
        print(f"  crashed {t_crash - t_mark:.1f} s after the mark; waiting for recovery", flush=True)
        # pre-crash level from the live buckets (the last 5 s)
        time.sleep(0.3)
        # the last 6 s but the few buckets the crash may have touched
        window = client.live[-round(6 / bucket_s) : -round(0.3 / bucket_s)]
        base = [hit / bucket_s for b, _g, hit, *_ in window]
        pre_live = sum(base) / len(base) if base else 0
        t90_live = None
        while True:
            time.sleep(0.5)
            el = time.monotonic() - t_crash
            # the client's t0: within a ms of Client() creation; exact t0 comes with the summary
            t90_live = recovered(client.live, client.t0, t_crash, pre_live, bucket_s)
            recent = client.live[-round(0.5 / bucket_s) :]
            hit_ok = sum(b[2] for b in recent) >= 0.9 * sum(b[1] for b in recent) > 0
            if el >= args.after_max:
                break
            if el >= args.after_min and t90_live is not None and hit_ok and el >= t90_live + 3:
                break
        conn.close()
        summary = client.stop()
        wait_serving(port, timeout=60)
        dbsize = resp(port, "DBSIZE")
    finally:
        server.stop()
    return {
        "port": port,
        "loaded": loaded,
        "t_snap": t_snap,
        "t_snap_done": t_snap_done,
        "t_mark": t_mark,
        "loadavg": loadavg,
        "cpu_pressure": pressure,
        "hugepages_at_crash": huge,
        "rkv_args": args.rkv_args,
        "t_crash": t_crash,
        "summary": summary,
        "notes": server_notes(name, server, workdir),
        "dbsize_end": dbsize,
    }


def analyse(name, keys, raw):
    s = raw["summary"]
    t0 = s["t0_ns"] / 1e9
    t_crash = raw["t_crash"]
    bk = s["buckets"]  # [get, hit, miss, set, wr, err]
    bucket_s = s["bucket_ms"] / 1000
    rel = [t0 + i * bucket_s - t_crash for i in range(len(bk))]
    eff = [b[1] / bucket_s for b in bk]
    get = [b[0] / bucket_s for b in bk]
    hitrate = [b[1] / b[0] if b[0] else None for b in bk]

    pre_idx = [i for i, r in enumerate(rel) if r >= -5.0 and r + bucket_s <= 0]
    pre = sum(eff[i] for i in pre_idx) / len(pre_idx)
    pre_get = sum(get[i] for i in pre_idx) / len(pre_idx)
    pre_hit = sum(bk[i][1] for i in pre_idx) / max(1, sum(bk[i][0] for i in pre_idx))

    # downtime from the client's gaps (>= 2 ms with no successful reply):
    # the one the crash opens, i.e. that ends after the crash and starts
    # within 50 ms of it (the server takes DEBUG SEGFAULT within a batch's
    # time).  None: no such gap, the downtime is under the 2 ms threshold.
    gaps = [(a / 1e9 - t_crash, b / 1e9 - t_crash) for a, b in s["gaps"]]
    around = [g for g in gaps if g[1] > 0 and abs(g[0]) < 0.05]
    gap = max(around, key=lambda g: g[1] - g[0], default=None)
    downtime_ms = (gap[1] - gap[0]) * 1000 if gap else None
    # in whole buckets: the run of buckets with no successful reply that
    # starts within 200 ms of the crash bucket
    first = next(i for i, r in enumerate(rel) if r + bucket_s > 0)
    empty = 0
    for i in range(first, min(first + 1 + round(0.2 / bucket_s), len(bk))):
        run = 0
        while i + run < len(bk) and bk[i + run][0] + bk[i + run][3] == 0:
            run += 1
        if run:
            empty = run
            break
    # the fifth second after the crash, if it was observed to its end
    w5 = [i for i, r in enumerate(rel) if r >= 4.0 - 1e-9 and r + bucket_s <= 5.0 + 1e-9]
    whole = rel[-1] + bucket_s >= 5.0 and len(w5) >= round(1 / bucket_s) - 1
    avail5 = sum(eff[i] for i in w5) / len(w5) / pre if w5 and whole else None
    t90 = t90_of(rel, eff, pre, bucket_s)
    # the same in 100 ms buckets, as the client counts by default (t90 can be
    # no less than 0.1 s there: the first bucket wholly after the crash)
    t90_100ms = t90_of(*coarser(rel, eff, bucket_s, 0.1), pre, 0.1) if bucket_s < 0.1 else t90
    # hit rate back to 90% of before (independent of the machine's noise)
    t90_hit = None
    n = max(1, round(T90_WINDOW_S / bucket_s))
    for i in [i for i, r in enumerate(rel) if r >= 0]:
        win = bk[i : i + n]
        g, h = sum(b[0] for b in win), sum(b[1] for b in win)
        if len(win) == n and all(b[0] for b in win) and h / g >= 0.9 * pre_hit:
            t90_hit = rel[i] + bucket_s
            break
    acked_pre = sum(b[4] for b, r in zip(bk, rel, strict=True) if r + bucket_s <= 0)
    v = s["verify"]
    return {
        "scenario": name,
        "label": SCENARIOS[name],
        "keys": keys,
        "pre_eff_per_s": round(pre),
        "pre_get_per_s": round(pre_get),
        "pre_hit_rate": round(pre_hit, 4),
        "downtime_ms": None if downtime_ms is None else round(downtime_ms, 1),
        "downtime_gap_s": gap,
        "gaps_near_crash_s": [(round(a, 4), round(b, 4)) for a, b in gaps if -0.5 < a < 2 and b - a >= 0.005],
        "loadavg_at_crash": raw["loadavg"],
        "cpu_pressure_at_crash": raw["cpu_pressure"],
        "hugepages_at_crash": raw["hugepages_at_crash"],
        "rkv_args": raw["rkv_args"],
        "bucket_ms": s["bucket_ms"],
        "downtime_buckets_ms": round(empty * bucket_s * 1000),
        "avail_5s": None if avail5 is None else round(avail5, 3),
        "t90_s": None if t90 is None else round(t90, 3),
        "t90_100ms_s": None if t90_100ms is None else round(t90_100ms, 2),
        "t90_hit_rate_s": None if t90_hit is None else round(t90_hit, 3),
        "observed_after_s": round(rel[-1] + bucket_s, 1),
        "lost_acked_writes": s["lost_run"] + v["lost"],
        "lost_seen_in_run": s["lost_run"],
        "lost_at_verify": v["lost"],
        "acked_writes_before_crash": acked_pre,
        "keys_written_after_mark": s["keys_written_between_marks"],
        "mark_before_crash_s": round(t_crash - raw["t_mark"], 1),
        "t_crash_monotonic_s": t_crash,
        "in_flight_uncertain": v["uncertain_left"] + v["uncertain_applied"],
        "corrupt_values": s["corrupt"],
        "reconnects": s["reconnects"],
        "verify_checked": v["checked"],
        "dbsize_end": raw["dbsize_end"],
        "load_s": raw["loaded"]["load_s"],
        "snapshot_age_s": None if raw["t_snap"] is None else round(t_crash - raw["t_snap"], 1),
        "notes": raw["notes"],
        "series": {
            "rel_s": [round(r, 3) for r in rel],
            "eff": [round(e) for e in eff],
            "hit_rate": [None if h is None else round(h, 4) for h in hitrate],
        },
    }


def fmt(v, spec, none="—"):
    return none if v is None else format(v, spec)


def table(rows, command, mach, skipped, bucket_ms):
    out = [
        "## Availability through a crash (rkv, Redis 7)",
        "",
        f"Command: `{command}`  ",
        f"Machine: {mach}  ",
        "Servers on CPU 0, the client (`bench/respload.c`: "
        f"{CLIENT['conns']} connections x {CLIENT['pipeline']} pipelined commands, uniform GETs, "
        f"{CLIENT['write_pct']}% fresh SETs, cache-aside fill on a miss, 1 ms reconnect) on CPU 1. "
        "100-byte values. Effective availability = GET hits/s. One run per row.",
        "",
        "*downtime*: the longest time with no successful reply around the crash, from the client's "
        f"timestamps (and in whole empty {bucket_ms} ms buckets). *avail@5s*: effective availability in "
        "[crash+4 s, crash+5 s) over the 5 s before the crash. *t90*: crash to the end of the first "
        f"{bucket_ms} ms bucket after it that is back to 90% and from which the 500 ms average is too "
        "(*t90 at 100 ms*: the same in 100 ms buckets, whose first ends 0.1-0.2 s after the crash); "
        "*hit rate back*: "
        "the same for the hit rate (90% of the one before, every bucket serving), which the machine's "
        "noise does not move. *lost*: keys whose last "
        "acknowledged fresh SET was later read back missing or older (in-flight ones excepted), "
        "against the keys given a fresh acknowledged value between the snapshot (or the same point "
        "without one, --before s before the crash) and the crash.",
        "",
    ]
    for keys in sorted({r["keys"] for r in rows}):
        out += [
            f"### {keys:,} keys",
            "",
            f"| scenario | before: GET/s, hit rate | downtime (client) | downtime ({bucket_ms} ms buckets) "
            "| avail@5s | t90 | t90 at 100 ms | hit rate back to 90% "
            "| keys with a lost acked write / written in the last 30 s "
            "| restart (server's word) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for r in [r for r in rows if r["keys"] == keys]:
            dt = fmt(r["downtime_ms"], ".1f", "< 2") + " ms"
            never = f"> {r['observed_after_s']:.0f}"
            t90 = fmt(r["t90_s"], ".3f" if r["bucket_ms"] < 100 else ".1f", never) + " s"
            t90c = fmt(r["t90_100ms_s"], ".1f", never) + " s"
            snap = f"{r['keys_written_after_mark']:,}"
            t90h = fmt(r["t90_hit_rate_s"], ".2f", never) + " s"
            out.append(
                f"| {r['label']}{variant_note(r)} "
                f"| {r['pre_get_per_s'] / 1000:,.0f}k, {r['pre_hit_rate']:.1%} | {dt} "
                f"| {r['downtime_buckets_ms']} ms | {fmt(r['avail_5s'], '.0%')} | {t90} | {t90c} | {t90h} "
                f"| {r['lost_acked_writes']:,} / {snap} | {restart_word(r)} |"
            )
        out.append("")
        out.append(f"![timeline, {keys:,} keys](availability_{keys}.png)")
        out.append("")
    for s in skipped:
        out.append(f"Not run: {s}  ")
    return "\n".join(out) + "\n"


def variant_note(r):
    return f" [{r['variant']}, run {r['run']}]" if "variant" in r else ""


def restart_word(r):
    n = r["notes"]
    if r["scenario"] == "redis-rdb":
        return "RDB loaded in " + ", ".join(n.get("rdb_loaded") or ["?"])
    parts = []
    for d in n.get("ready", [])[1:]:
        parts.append(f"{d.get('start')} start, {d.get('keys'):,} keys, ready in {d.get('ready_ms')} ms")
    for u in n.get("up", [])[1:]:
        parts.append(f"runtime: {u.get('kind')} in {u.get('restart_us')} us")
    return "; ".join(parts) or "?"


PLOT_SMOOTH_MS = 50


def trailing_mean(xs, n):
    out, total = [], 0.0
    for i, x in enumerate(xs):
        total += x - (xs[i - n] if i >= n else 0)
        out.append(total / min(i + 1, n))
    return out


def plot(rows, keys, path, xlim=(-8, None), value_bytes=100):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    bucket_ms = rows[0]["bucket_ms"]
    smooth = max(1, PLOT_SMOOTH_MS // bucket_ms)  # finer buckets are mostly the scheduler's noise
    for r in [r for r in rows if r["keys"] == keys]:
        s = r["series"]
        x = [t + r["bucket_ms"] / 1000 for t in s["rel_s"]]  # plotted at the bucket's end
        label = (r["label"] + variant_note(r)).replace("`", "")
        style = {"lw": 1.0, "ls": "--" if r.get("variant") == "baseline" else "-"}
        ax1.plot(x, [e / 1000 for e in trailing_mean(s["eff"], smooth)], label=label, **style)
        ax2.plot(x, [h * 100 if h is not None else float("nan") for h in s["hit_rate"]], **style)
    ax1.axvline(0, color="k", ls=":", lw=1)
    ax2.axvline(0, color="k", ls=":", lw=1)
    per = f"per {bucket_ms} ms" + (f", mean of the last {smooth * bucket_ms} ms" if smooth > 1 else "")
    ax1.set_ylabel(f"GET hits / s (thousands)\n{per}")
    ax2.set_ylabel("hit rate (%)")
    ax2.set_xlabel("time since DEBUG SEGFAULT (s)")
    ax2.set_ylim(-2, 102)
    ax1.set_ylim(bottom=0)
    ax1.set_xlim(*xlim)
    ax1.legend(loc="lower right", fontsize=9)
    ax1.set_title(f"Effective availability through a crash, {keys:,} keys of {value_bytes:,} B")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build", type=Path)
    ap.add_argument("--keys", type=int, nargs="+", default=[1_000_000, 5_000_000])
    ap.add_argument("--scenarios", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS))
    ap.add_argument("--warmup", type=float, default=3.0, help="s of load before the snapshot")
    ap.add_argument("--before", type=float, default=30.0, help="s from the snapshot to the crash")
    ap.add_argument("--after-min", type=float, default=10.0, help="s after the crash (>= 5.3)")
    ap.add_argument("--after-max", type=float, default=60.0)
    ap.add_argument("--quick", action="store_true", help="100k keys, 10 s before the crash")
    ap.add_argument("--json", action="store_true", help="print the result rows as JSON lines")
    ap.add_argument("--bucket-ms", type=int, default=BUCKET_MS, help="client's count interval")
    ap.add_argument("--rkv-args", default="", help="more options for rkv, e.g. '--hugepages no'")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each scenario (medians if > 1)")
    ap.add_argument("--baseline", type=Path, help="another build, run interleaved with BUILD")
    ap.add_argument("--baseline-rkv-args", default="", help="rkv options for the baseline")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args()
    if args.quick:
        args.keys, args.before, args.after_min, args.after_max = [100_000], 10.0, 6.0, 20.0
    args.after_min = max(args.after_min, 5.3)
    args.after_max = max(args.after_max, args.after_min)
    if not 1 <= args.bucket_ms <= 100 or 100 % args.bucket_ms:
        sys.exit(f"--bucket-ms {args.bucket_ms}: expected a divisor of 100 (1..100)")
    build = args.build.resolve()
    if not (build / "bench" / "respload").exists():
        sys.exit(f"{build}/bench/respload missing: run make BUILD={args.build} all")
    skipped = []
    scenarios = list(args.scenarios)
    if not have_rkv(build):
        missing = [s for s in scenarios if s.startswith("rkv")]
        if missing:
            msg = f"{', '.join(missing)}: {build}/examples/rkv and rkv-malloc are not built (no rkv yet)"
            print("skipping " + msg, file=sys.stderr)
            skipped.append(msg)
        scenarios = [s for s in scenarios if not s.startswith("rkv")]
    variants = [("this", build, args.rkv_args)]
    if args.baseline:
        variants.insert(0, ("baseline", args.baseline.resolve(), args.baseline_rkv_args))
    mach = machine()
    rows = []
    for keys in args.keys:
        for rep in range(args.repeat):
            for variant, vbuild, rkv_args in variants:  # interleaved: the machine's drift hits both
                for name in scenarios:
                    print(
                        f"{name}, {keys} keys, {variant} ({vbuild}), run {rep + 1}/{args.repeat}", flush=True
                    )
                    with tempfile.TemporaryDirectory(prefix="avail-") as tmp:
                        raw = run_one(
                            name,
                            vbuild,
                            keys,
                            argparse.Namespace(**{**vars(args), "rkv_args": rkv_args}),
                            Path(tmp),
                        )
                    row = {
                        **analyse(name, keys, raw),
                        "variant": variant,
                        "build": str(vbuild),
                        "run": rep + 1,
                    }
                    brief = {
                        k: v for k, v in row.items() if k not in ("series", "notes", "gaps_near_crash_s")
                    }
                    print("  " + json.dumps(brief), flush=True)
                    if args.json:
                        print(json.dumps(row))
                    rows.append(row)
    argv = " ".join(sys.argv[1:])
    command = f"python3 bench/availability.py {argv}"
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "availability.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps({**r, "machine": mach, "command": command}) + "\n")
    for keys in args.keys:
        plot(rows, keys, args.out / f"availability_{keys}.png")
        if args.bucket_ms < 100:
            plot(rows, keys, args.out / f"availability_{keys}_first_seconds.png", xlim=(-0.5, 3.0))
    md = table(rows, command, machine_line(mach), skipped, args.bucket_ms)
    if args.repeat > 1 or args.baseline:
        md += medians(rows)
    (args.out / "availability.md").write_text(md)
    print(md)


def median(xs):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


MEDIAN_COLUMNS = [  # (row key, heading, format)
    ("pre_get_per_s", "before: GET/s", ",.0f"),
    ("downtime_ms", "downtime, ms", ".1f"),
    ("t90_s", "t90, s", ".3f"),
    ("t90_100ms_s", "t90 at 100 ms, s", ".2f"),
    ("t90_hit_rate_s", "hit rate back, s", ".3f"),
    ("avail_5s", "avail@5s", ".1%"),
]


def medians(rows):
    """Medians over the runs of each variant, and this one over the baseline."""
    out = ["", "### Medians", ""]
    out.append("| keys | scenario | variant | runs | " + " | ".join(h for _, h, _ in MEDIAN_COLUMNS) + " |")
    out.append("|---:|---|---|---:|" + "---:|" * len(MEDIAN_COLUMNS))
    groups = {}
    for r in rows:
        groups.setdefault((r["keys"], r["scenario"], r["variant"]), []).append(r)
    for (keys, scenario, variant), rs in groups.items():
        cells = []
        for key, _, spec in MEDIAN_COLUMNS:
            m = median([r[key] for r in rs])
            cells.append(
                fmt(m, spec)
                + (f" ({sum(r[key] is None for r in rs)} none)" if any(r[key] is None for r in rs) else "")
            )
            base = groups.get((keys, scenario, "baseline"))
            if variant != "baseline" and base and m is not None:
                b = median([r[key] for r in base])
                if b:
                    cells[-1] += f" ({m / b:.2f}x)" if m / b >= 0.1 else f" ({m / b:.3f}x)"
        out.append(f"| {keys:,} | {scenario} | {variant} | {len(rs)} | " + " | ".join(cells) + " |")
    out.append("")
    out.append(
        "(x: the median of this variant over the baseline's, same session; none: not reached while observed)"
    )
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
