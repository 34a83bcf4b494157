#!/usr/bin/env python3
"""Restore after the machine dies, and acknowledged writes lost when it
dies under load (issue 13, speed and durability): rkv on Rekindle's durable
snapshots against Redis 7 reloading its RDB and replaying its AOF.

Part `restore` (for each --keys N, each scenario, --repeat times, the
scenarios in a rotated order each round):

  rkv        rkv --durability async under `rekindle run --snapshot-dir
             --snapshot-interval` (--snapshot-interval, default 1s)
  redis-rdb  redis-server 7, no AOF; SAVE
  redis-aof  redis-server 7, appendonly yes, appendfsync everysec,
             aof-use-rdb-preamble no, no automatic rewrite: the AOF holds
             every SET as a command, and a restart replays them

  1. start the server (pinned to --server-cpu) and load N keys of 100-byte
     values (bench/respload.c `respload load`, pipelined);
  2. make it durable: rkv `rekindle checkpoint NAME --wait`; Redis SAVE; the
     AOF after 2 s of quiet (everysec has synced it);
  3. start the GET client (`respload run --write-pct 0`: 4 connections x 32
     pipelined GETs of uniformly random loaded keys, reconnecting every 1 ms
     when refused; successful GETs per --bucket-ms), --steady s of it: the
     steady rate before;
  4. the machine "dies": SIGKILL of the supervisor and rkv (nothing holds
     the memfds any more) or of redis-server; then `sync; echo 3 >
     /proc/sys/vm/drop_caches` (root): the store, the RDB or the AOF, and
     the binaries, are read from disk again, as after a reboot;
  5. t0: `rekindle restore --from STORE ... -- rkv ...` or redis-server on
     the same dir and port; the client runs on until GETs are back to 90%
     of the steady rate (and 2 s more) or --after-max s.

  first GET    t0 to the first successful reply (the client's own
               timestamps, 1 ms slots; Redis answers -LOADING until loaded,
               which is not a success)
  t90          t0 to the end of the first bucket from which the next 500 ms
               average >= 90% of the steady rate before the kill
  Also: what the server says (the supervisor's restore event and rkv's
  ready_ms; Redis's 'DB loaded from ...: X seconds'), DBSIZE after, and the
  size on disk of the same N keys: the store (as it is, and folded to its
  newest snapshot), dump.rdb, appendonlydir.

Part `lost` (--repeat times each): rkv under snapshots every 10 ms and
100 ms (--durability async: replies at once) and with --durability sync
(replies held until durable), --lost-preload keys loaded and checkpointed,
then --lost-conns writer connections, each SETting fresh keys L<c>:<i> in
order, --lost-pipeline per batch, recording when each batch was
acknowledged; after --lost-seconds the supervisor and rkv are SIGKILLed
under that load, the page cache dropped, the store restored, and every
acknowledged key read back.  Lost = acknowledged but missing after the
restore (with sync it must be 0); the loss window = the kill minus the
acknowledgement time of the oldest lost write; also the age at the kill of
the snapshot restored (its cut).  Note: the kill loses what was only in
the memfds; files the store wrote survive (drop_caches writes dirty pages
back first): a power cut is the QEMU test's job, not this one's.

  python3 bench/restore_bench.py BUILD [--keys 1000000 5000000] [--repeat 3]
      [--parts restore lost] [--quick] [--self-check] [--out DIR] [--name NAME]
Writes NAME.{md,json} and NAME_<N>.png (default restore) under bench/results/."""

import argparse
import json
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from availability import PLOT_SMOOTH_MS, trailing_mean  # noqa: E402
from snapshot_common import (  # noqa: E402
    AOF_EVERYSEC,
    HOST,
    RESULTS,
    RedisServer,
    RkvStack,
    cpu_pressure,
    drop_caches,
    du_bytes,
    fmt,
    free_port,
    loadavg,
    machine,
    machine_line,
    median,
    mib,
    pin_self,
    resp,
    snapshot_created,
    store_gc_keep1,
    store_summary,
)

SCENARIOS = {
    "rkv": "rkv, `rekindle restore` from its store",
    "rkv-lazy": "rkv, `rekindle restore --restore-pages lazy`",
    "redis-rdb": "Redis 7, loading its RDB",
    "redis-aof": "Redis 7, replaying its AOF",
}
AOF_REPLAY = (*AOF_EVERYSEC, "--aof-use-rdb-preamble", "no", "--auto-aof-rewrite-percentage", "0")
LOST = {
    "async-10ms": {"durability": "async", "interval": "10ms", "label": "rkv, async, snapshots every 10 ms"},
    "async-100ms": {
        "durability": "async",
        "interval": "100ms",
        "label": "rkv, async, snapshots every 100 ms",
    },
    "sync": {"durability": "sync", "interval": None, "label": "rkv --durability sync"},
}
CLIENT = {"conns": 4, "pipeline": 32}
T90_WINDOW_S = 0.5


# ---------------------------------------------------------------- the GET client


class GetClient:
    """`respload run --write-pct 0` in the background; live buckets."""

    def __init__(self, build, port, keys, bucket_ms):
        argv = [str(build / "bench" / "respload"), "run", "--port", str(port), "--keys", str(keys)]
        argv += ["--conns", str(CLIENT["conns"]), "--pipeline", str(CLIENT["pipeline"]), "--write-pct", "0"]
        argv += ["--duration", "1800", "--bucket-ms", str(bucket_ms), "--no-verify"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        self.bucket_s = bucket_ms / 1000
        self.live = []
        self.summary = None
        self.t_created = time.monotonic()
        self._r = threading.Thread(target=self._read, daemon=True)
        self._r.start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                d = json.loads(line)
            except json.JSONDecodeError:
                continue
            if d.get("respload") == "bucket":
                self.live.append((d["b"], d["get"], d["hit"]))
            elif d.get("respload") == "summary":
                self.summary = d

    def rate_since(self, t_from, t_to=None):
        """Mean hits/s of the live buckets that lie wholly in [t_from, t_to]."""
        t_to = time.monotonic() if t_to is None else t_to
        sel = [h for b, _g, h in self.live if t_from <= self.t_created + b * self.bucket_s
               and self.t_created + (b + 1) * self.bucket_s <= t_to]  # fmt: skip
        return sum(sel) / len(sel) / self.bucket_s if sel else 0.0

    def stop(self):
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._r.join(timeout=10)
        if not self.summary:
            raise RuntimeError("respload: no summary")
        return self.summary


def respload_load(build, port, keys):
    p = subprocess.run(
        [str(build / "bench" / "respload"), "load", "--port", str(port), "--keys", str(keys)],
        capture_output=True, text=True, check=True, timeout=3600,
    )  # fmt: skip
    return json.loads(p.stdout)


# ---------------------------------------------------------------- part 1: restore


def is_rkv(scenario):
    return scenario.startswith("rkv")


def start_for(scenario, build, workdir, port, args, restore=False):
    if is_rkv(scenario):
        store = workdir / "store"
        lazy = ("--restore-pages", "lazy") if restore and scenario == "rkv-lazy" else ()
        return RkvStack(build, workdir, port, name="restorebench", cpu=args.server_cpu, snapshot_dir=store,
                        interval=args.snapshot_interval, durability="async",
                        restore_from=store if restore else None, tag="after" if restore else "before",
                        rkv_args=args.rkv_args.split(), sup_args=lazy).start()  # fmt: skip
    extra = AOF_REPLAY if scenario == "redis-aof" else ()
    return RedisServer(workdir, port, extra, cpu=args.server_cpu).start()


def run_restore(scenario, build, keys, args, workdir):
    port = free_port()
    srv = start_for(scenario, build, workdir, port, args)
    client = None
    raw = {"scenario": scenario, "keys": keys}
    try:
        srv.wait_serving()
        t = time.monotonic()
        raw["loaded"] = respload_load(build, port, keys)
        raw["load_s"] = round(time.monotonic() - t, 2)
        t = time.monotonic()
        if is_rkv(scenario):
            raw["checkpoint"] = srv.checkpoint(tag="bench")
        elif scenario == "redis-rdb":
            resp(port, "SAVE", timeout=3600)
        else:
            time.sleep(2.0)  # appendfsync everysec: synced within a second or two of the last write
        raw["persist_s"] = round(time.monotonic() - t, 2)
        print(
            f"  loaded {keys:,} keys in {raw['load_s']} s, made durable in {raw['persist_s']} s", flush=True
        )
        client = GetClient(build, port, keys, args.bucket_ms)
        time.sleep(args.steady)
        raw["loadavg_before"] = loadavg()
        raw["cpu_pressure_before"] = cpu_pressure()
        # what is on disk for these keys (GETs write nothing)
        if is_rkv(scenario):
            raw["disk"] = {"store": store_summary(build, workdir / "store")}
        elif scenario == "redis-rdb":
            raw["disk"] = {"rdb_bytes": du_bytes(workdir / "dump.rdb")}
        else:
            raw["disk"] = {"aof_bytes": du_bytes(workdir / "appendonlydir")}
        t_kill, _ = srv.kill9()
        raw["t_kill"] = t_kill
        pre = client.rate_since(t_kill - args.steady + 1.0, t_kill - 0.05)
        if is_rkv(scenario) and not args.no_gc:
            # the store folded to its newest snapshot, on a copy (the restore reads the store as it was)
            copy = workdir / "store-copy"
            subprocess.run(["cp", "-a", "--reflink=auto", str(workdir / "store"), str(copy)], check=True)
            raw["disk"]["store_keep1_bytes"] = store_gc_keep1(build, copy)
            shutil.rmtree(copy, ignore_errors=True)
        raw["drop_caches_s"] = drop_caches() if not args.no_drop_caches else None
        t0 = time.monotonic()
        srv2 = start_for(scenario, build, workdir, port, args, restore=True)
        raw["t0"] = t0
        try:
            t90 = None
            while True:
                time.sleep(0.25)
                el = time.monotonic() - t0
                if srv2.proc.poll() is not None:
                    raise RuntimeError(f"{scenario}: the restarted server exited with {srv2.proc.returncode}")
                if t90 is None and pre > 0:
                    t90 = live_t90(client, t0, pre)
                if el >= args.after_max or (t90 is not None and el >= t90 + args.after_t90):
                    break
            raw["summary"] = client.stop()
            client = None
            raw["dbsize_after"] = resp(port, "DBSIZE", timeout=600)
            raw["server"] = server_word(scenario, srv2, workdir)
            raw["server"]["t0_to_spawn_ms"] = spawn_ms(srv2, t0) if is_rkv(scenario) else None
        finally:
            srv2.stop()
    finally:
        if client:
            client.stop()
        if srv.proc.poll() is None:
            srv.kill9()
    return raw


def live_t90(client, t0, pre):
    n = max(1, round(T90_WINDOW_S / client.bucket_s))
    rel = [(client.t_created + b * client.bucket_s - t0, h / client.bucket_s) for b, _g, h in client.live]
    return t90_of([r for r, _ in rel], [e for _, e in rel], pre, client.bucket_s, n)


def t90_of(rel, eff, pre, bucket_s, n):
    for i, r in enumerate(rel):
        win = eff[i : i + n]
        if r >= 0 and len(win) == n and eff[i] >= 0.9 * pre and sum(win) / n >= 0.9 * pre:
            return r + bucket_s
    return None


def spawn_ms(srv, t0):
    """t0 to the spawn of the restored app: the supervisor read the store
    meanwhile (t_ns is CLOCK_MONOTONIC, as time.monotonic())."""
    sp = srv.events("spawn")
    return round((sp[0]["t_ns"] / 1e9 - t0) * 1000, 1) if sp else None


def server_word(scenario, srv, workdir):
    out = {}
    if is_rkv(scenario):
        ev = srv.events()
        st = [e for e in ev if e.get("supervisor") == "start"]
        rs = [e for e in ev if e.get("supervisor") == "restore"]
        sp = [e for e in ev if e.get("supervisor") == "spawn"]
        up = [e for e in ev if e.get("supervisor") == "up"]
        if rs:
            keep = ("id", "snapshot", "bytes", "read_ms", "index", "index_of", "index_deltas")
            keep += ("index_ms", "fold_ms")
            out["restore"] = {k: rs[0].get(k) for k in keep}
        if st and sp:
            out["start_to_spawn_ms"] = round((sp[0]["t_ns"] - st[0]["t_ns"]) / 1e6, 1)
        sn = [e for e in ev if e.get("supervisor") == "snapshot"]
        out["snapshots_after"] = {
            "count": len(sn),
            "stop_us_max": max([e["stop_us"] for e in sn] or [0]),
            "full_took_ms": next((e["took_ms"] for e in sn if e["kind"] == "full"), None),
        }
        if up:
            out["up"] = {k: up[0].get(k) for k in ("kind", "code", "restart_us", "preserved_bytes")}
        lz = [e for e in ev if e.get("supervisor") == "lazy_restore" and e.get("state") == "done"]
        if lz and st:
            keep = ("faulted_pages", "faulted_around_pages", "filled_pages", "max_fault_us", "took_ms")
            out["lazy"] = {k: lz[0].get(k) for k in keep}
            out["lazy"]["all_in_ms"] = round((lz[0]["t_ns"] - st[0]["t_ns"]) / 1e6, 1)
        ready = srv.rkv_log("ready")
        if ready:
            out["rkv_ready"] = {k: ready[-1].get(k) for k in ("start", "keys", "ready_ms", "reason")}
        v = srv.rkv_log("verified")
        if v:
            out["rkv_verified"] = {k: v[-1].get(k) for k in ("verify_ms", "check_ms")}
    else:
        log = (workdir / "redis.log").read_text(errors="replace") if (workdir / "redis.log").exists() else ""
        out["loaded"] = [
            ln.split("DB loaded from ")[1].strip() for ln in log.splitlines() if "DB loaded from" in ln
        ]
    return out


def analyse_restore(raw, args):
    s = raw["summary"]
    t0c = s["t0_ns"] / 1e9
    bucket_s = s["bucket_ms"] / 1000
    bk = s["buckets"]  # [get, hit, miss, set, wr, err]
    t0, t_kill = raw["t0"], raw["t_kill"]
    rel = [t0c + i * bucket_s - t0 for i in range(len(bk))]
    eff = [b[1] / bucket_s for b in bk]
    pre_idx = [
        i for i, r in enumerate(rel) if t_kill - args.steady + 1.0 - t0 <= r and r + bucket_s <= t_kill - t0
    ]
    pre = sum(eff[i] for i in pre_idx) / len(pre_idx) if pre_idx else 0.0
    # first success after t0: the end of the client's gap that holds t0
    first = None
    for a, b in s["gaps"]:
        if a / 1e9 <= t0 < b / 1e9:
            first = b / 1e9 - t0
    if first is None:  # no gap recorded across t0: the first bucket after t0 that served
        first = next((r for r, b in zip(rel, bk, strict=True) if r >= 0 and b[0]), None)
    n = max(1, round(T90_WINDOW_S / bucket_s))
    t90 = t90_of(rel, eff, pre, bucket_s, n)
    tail = [eff[i] for i, r in enumerate(rel) if r >= rel[-1] - 2.0]
    post = sum(tail) / len(tail) if tail else None
    d = raw["disk"]
    return {
        "scenario": raw["scenario"],
        "label": SCENARIOS[raw["scenario"]],
        "keys": raw["keys"],
        "round": raw["round"],
        "load_s": raw["load_s"],
        "persist_s": raw["persist_s"],
        "pre_get_per_s": round(pre),
        "post_get_per_s": None if post is None else round(post),
        "first_get_ms": None if first is None else round(first * 1000, 1),
        "t90_s": None if t90 is None else round(t90, 3),
        "observed_s": round(rel[-1] + bucket_s, 1),
        "dbsize_after": raw["dbsize_after"],
        "drop_caches_s": raw["drop_caches_s"],
        "disk": d,
        "disk_bytes": d.get("store", {}).get("du_bytes") or d.get("rdb_bytes") or d.get("aof_bytes"),
        "server": raw["server"],
        "checkpoint": raw.get("checkpoint"),
        "errors": sum(b[5] for b in bk),
        "loadavg_before": raw["loadavg_before"],
        "cpu_pressure_before": raw["cpu_pressure_before"],
        "bucket_ms": s["bucket_ms"],
        "series": {"rel_s": [round(r, 4) for r in rel], "get_per_s": [round(e) for e in eff]},
    }


# ---------------------------------------------------------------- part 2: lost acked writes


class Writer(threading.Thread):
    """One connection SETting L<c>:<i> = v<i>, i = 0, 1, ... in batches of
    pipeline, closed loop; acks[(last i of the batch, monotonic)]."""

    def __init__(self, port, c, pipeline, max_writes, deadline):
        super().__init__(daemon=True)
        self.port, self.c, self.p, self.max, self.deadline = port, c, pipeline, max_writes, deadline
        self.acks = []
        self.sent = 0  # keys sent so far (acknowledged or not)
        self.stop_ev = threading.Event()
        self.error = None

    def key(self, i):
        return b"L%d:%09d" % (self.c, i)

    def run(self):
        try:
            s = socket.create_connection((HOST, self.port), timeout=30)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            i = 0
            buf = b""
            while not self.stop_ev.is_set() and i < self.max and time.monotonic() < self.deadline:
                batch = []
                for j in range(i, i + self.p):
                    k, v = self.key(j), b"v%d" % j
                    batch.append(b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(k), k, len(v), v))
                s.sendall(b"".join(batch))
                self.sent = i + self.p
                got = 0
                while got < self.p:
                    b = s.recv(65536)
                    if not b:
                        raise ConnectionError("closed")
                    buf += b
                    got += buf.count(b"\r\n")
                    if b"-" in buf:
                        raise RuntimeError(f"error reply {buf[:80]!r}")
                    buf = buf[buf.rfind(b"\r\n") + 2 :]
                i += self.p
                self.acks.append((i - 1, time.monotonic()))
            s.close()
        except (OSError, ConnectionError) as e:
            self.error = repr(e)  # the kill: expected


def mget_present(port, keys, expect):
    """Which of keys hold their expected value (MGET in chunks)."""
    out = []
    with socket.create_connection((HOST, port), timeout=120) as s, s.makefile("rb") as f:
        for a in range(0, len(keys), 1000):
            ks = keys[a : a + 1000]
            cmd = [b"*%d\r\n$4\r\nMGET\r\n" % (len(ks) + 1)] + [b"$%d\r\n%s\r\n" % (len(k), k) for k in ks]
            s.sendall(b"".join(cmd))
            hdr = f.readline()
            assert hdr.startswith(b"*"), hdr
            for k in ks:
                ln = f.readline()
                if ln.startswith(b"$-1"):
                    out.append(False)
                    continue
                v = f.read(int(ln[1:]) + 2)[:-2]
                out.append(v == expect[k])
    return out


def run_lost(variant, build, args, workdir):
    cfg = LOST[variant]
    port = free_port()
    store = workdir / "store"
    interval = cfg["interval"] or args.sync_interval
    srv = RkvStack(build, workdir, port, name="lostbench", cpu=args.server_cpu, snapshot_dir=store,
                   interval=interval, durability=cfg["durability"], tag="before",
                   rkv_args=args.rkv_args.split()).start()  # fmt: skip
    raw = {"variant": variant, "interval": interval}
    writers = []
    try:
        srv.wait_serving()
        if args.lost_preload:
            respload_load(build, port, args.lost_preload)
        srv.checkpoint()
        t_start = time.monotonic()
        deadline = t_start + args.lost_seconds + 30
        writers = [Writer(port, c, args.lost_pipeline, args.lost_max_writes, deadline)
                   for c in range(args.lost_conns)]  # fmt: skip
        for w in writers:
            w.start()
        time.sleep(args.lost_seconds)
        raw["loadavg"] = loadavg()
        t_kill, wall_kill = srv.kill9()
        for w in writers:
            w.stop_ev.set()
            w.join(timeout=30)
        raw["load_s"] = round(t_kill - t_start, 3)
    finally:
        if srv.proc.poll() is None:
            srv.kill9()
    raw["drop_caches_s"] = drop_caches() if not args.no_drop_caches else None
    # restore, without snapshots (only to read back)
    back = RkvStack(build, workdir, port, name="lostcheck", cpu=args.server_cpu, restore_from=store,
                    tag="after").start()  # fmt: skip
    try:
        back.wait_serving()
        rs = back.events("restore")
        snap_id = rs[0]["id"] if rs else None
        created = snapshot_created(build, store, snap_id) if snap_id else None
        acked_total = lost = applied_unacked = 0
        lost_ack_times = []
        for w in writers:
            acked = w.acks[-1][0] + 1 if w.acks else 0
            n = max(w.sent, acked)
            keys = [w.key(i) for i in range(n)]
            present = mget_present(port, keys, {w.key(i): b"v%d" % i for i in range(n)})
            ack_t = {}
            j = 0
            for last, t in w.acks:  # the ack time of each key: its batch's
                while j <= last:
                    ack_t[j] = t
                    j += 1
            for i in range(n):
                if i < acked:
                    acked_total += 1
                    if not present[i]:
                        lost += 1
                        lost_ack_times.append(ack_t[i])
                elif present[i]:
                    applied_unacked += 1
        raw.update({
            "acked": acked_total,
            "lost": lost,
            "applied_unacked": applied_unacked,
            "ack_rate_per_s": round(acked_total / max(1e-3, raw["load_s"])),
            "loss_window_ms": round((t_kill - min(lost_ack_times)) * 1000, 1) if lost_ack_times else 0.0,
            "newest_lost_ack_before_kill_ms": round((t_kill - max(lost_ack_times)) * 1000, 1)
            if lost_ack_times else None,
            "snapshot_restored": snap_id,
            "snapshot_age_at_kill_ms": round((wall_kill - created) * 1000, 1) if created else None,
            "writer_errors": sorted({w.error for w in writers if w.error}),
            "snapshots_taken": len(srv.events("snapshot")),
        })  # fmt: skip
    finally:
        back.stop()
    return raw


# ---------------------------------------------------------------- report


def restore_table(rows, args):
    out = [
        "### Restore after the machine died",
        "",
        "t0: the restore (or redis-server) launched, after SIGKILL of the whole stack and "
        f"`drop_caches`. GET client: `respload run --write-pct 0`, {CLIENT['conns']} connections x "
        f"{CLIENT['pipeline']} pipelined GETs, {args.bucket_ms} ms buckets. *first GET*: t0 to the first "
        "successful reply. *t90*: t0 to the end of the first bucket from which 500 ms average >= 90% of the "
        f"GET rate of the {args.steady:g} s before the kill. Medians over the rounds "
        "(all rounds in the JSON).",
        "",
        "| keys | scenario | rounds | first GET | t90 | GET/s before → after | the server's word "
        "| keys back | made durable in | on disk |",
        "|---:|---|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for keys in sorted({r["keys"] for r in rows}):
        for sc in SCENARIOS:
            rs = [r for r in rows if r["keys"] == keys and r["scenario"] == sc]
            if not rs:
                continue
            never = sum(r["t90_s"] is None for r in rs)
            t90 = fmt(median([r["t90_s"] for r in rs]), ".2f") + " s" + (f" ({never} never)" if never else "")
            word = word_cell(rs[0])
            disk = median([r["disk_bytes"] for r in rs])
            keep1 = median([r["disk"].get("store_keep1_bytes") for r in rs])
            dcell = f"{mib(disk):,.1f} MiB" if disk else "—"
            if keep1:
                dcell += f" (newest only {mib(keep1):,.1f})"
            out.append(
                f"| {keys:,} | {SCENARIOS[sc]} | {len(rs)} "
                f"| {fmt(median([r['first_get_ms'] for r in rs]), ',.0f')} ms "
                f"| {t90} | {fmt(median([r['pre_get_per_s'] for r in rs]), ',.0f')} → "
                f"{fmt(median([r['post_get_per_s'] for r in rs]), ',.0f')} | {word} "
                f"| {', '.join(format(r['dbsize_after'], ',') for r in rs)} "
                f"| {fmt(median([r['persist_s'] for r in rs]), '.2f')} s | {dcell} |"
            )
    for keys in sorted({r["keys"] for r in rows}):
        out += ["", f"![restore timeline, {keys:,} keys]({args.name}_{keys}.png)"]
    return out


def word_cell(r):
    s = r["server"]
    if is_rkv(r["scenario"]):
        parts = []
        if "restore" in s:
            rs = s["restore"]
            parts.append(f"restored {mib(rs.get('bytes') or 0):,.0f} MiB")
            if rs.get("index"):
                how = rs["index"]
                if rs.get("index_of"):
                    how += f" (of {rs['index_of'][:12]}, {rs.get('index_deltas')} deltas after)"
                parts.append(f"store read in {rs.get('read_ms')} ms, {how}")
        if s.get("t0_to_spawn_ms") is not None:
            parts.append(f"app spawned at {s['t0_to_spawn_ms']:,.0f} ms")
        if "rkv_ready" in s:
            parts.append(f"rkv {s['rkv_ready'].get('start')} ready in {s['rkv_ready'].get('ready_ms')} ms")
        if "lazy" in s:
            lz = s["lazy"]
            parts.append(
                f"every page in at {lz['all_in_ms']:,.0f} ms ({lz['faulted_pages']:,} touched first, "
                f"slowest fault {lz['max_fault_us']:,} us)"
            )
        if "rkv_verified" in s:
            parts.append(f"its table check done at {s['rkv_verified'].get('verify_ms')} ms")
        sa = s.get("snapshots_after") or {}
        if sa.get("count"):
            parts.append(
                f"{sa['count']} snapshots while observed, longest stop {sa['stop_us_max'] / 1000:,.1f} ms"
            )
        return "; ".join(parts) or "?"
    return "; ".join(s.get("loaded") or ["?"])


def lost_table(rows, args):
    out = [
        "",
        "### Acknowledged writes lost when the whole stack dies under load",
        "",
        f"{args.lost_conns} writer connections, each SETting fresh keys in order, {args.lost_pipeline} per "
        f"batch, for {args.lost_seconds:g} s over {args.lost_preload:,} preloaded keys; then SIGKILL of the "
        "supervisor and rkv, drop_caches, `rekindle restore`, every acknowledged key read back. "
        "*loss window*: the kill minus the acknowledgement of the oldest lost write. *snapshot age*: "
        "the kill minus the cut of "
        "the snapshot restored. sync must lose 0.",
        "",
        "| config | round | acked (rate) | lost | loss window | snapshot age at the kill "
        "| applied, not acked |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        bad = " **FAIL**" if r["variant"] == "sync" and r["lost"] else ""
        out.append(
            f"| {LOST[r['variant']]['label']} | {r['round'] + 1} "
            f"| {r['acked']:,} ({r['ack_rate_per_s']:,}/s) | {r['lost']:,}{bad} "
            f"| {r['loss_window_ms']:,.1f} ms | {fmt(r['snapshot_age_at_kill_ms'], ',.1f')} ms "
            f"| {r['applied_unacked']:,} |"
        )
    return out


def plot_restore(rows, keys, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib: no PNG", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(11, 5))
    first = min(r["round"] for r in rows if r["keys"] == keys)
    for r in rows:
        if r["keys"] != keys or r["round"] != first:
            continue
        x = [t + r["bucket_ms"] / 1000 for t in r["series"]["rel_s"]]
        ys = trailing_mean(r["series"]["get_per_s"], max(1, PLOT_SMOOTH_MS // r["bucket_ms"]))
        (line,) = ax.plot(x, [e / 1000 for e in ys], lw=1.0, label=r["label"].replace("`", ""))
        ax.axhline(r["pre_get_per_s"] / 1000 * 0.9, color=line.get_color(), ls=":", lw=0.8)
        if r["first_get_ms"] is not None:
            ax.axvline(r["first_get_ms"] / 1000, color=line.get_color(), ls="--", lw=0.8)
    ax.axvline(0, color="k", lw=1)
    ax.set_xlabel("s since the restart after the machine died (t0); dashed: first GET, dotted: 90% of before")
    ax.set_ylabel(f"GET/s (thousands; mean of the last {PLOT_SMOOTH_MS} ms)")
    ax.set_ylim(bottom=0)
    ax.set_xlim(-1.0, None)
    ax.legend(loc="lower right", fontsize=9)
    ax.set_title(f"Restore after SIGKILL of the stack + drop_caches, {keys:,} keys of 100 B")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------- main


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build", type=Path)
    ap.add_argument("--parts", nargs="+", choices=["restore", "lost"], default=["restore", "lost"])
    ap.add_argument("--keys", type=int, nargs="+", default=[1_000_000, 5_000_000])
    ap.add_argument("--scenarios", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--steady", type=float, default=5.0, help="s of GETs before the kill")
    ap.add_argument("--after-max", type=float, default=120.0, help="s after t0 at most")
    ap.add_argument("--after-t90", type=float, default=2.0, help="s observed after t90")
    ap.add_argument("--bucket-ms", type=int, default=10, help="the GET client's buckets (divides 100)")
    ap.add_argument("--snapshot-interval", default="1s", help="rkv's snapshots in part restore")
    ap.add_argument("--sync-interval", default="100ms", help="--snapshot-interval of the sync config")
    ap.add_argument("--lost-variants", nargs="+", choices=list(LOST), default=list(LOST))
    ap.add_argument("--lost-seconds", type=float, default=10.0)
    ap.add_argument("--lost-preload", type=int, default=1_000_000)
    ap.add_argument("--lost-conns", type=int, default=4)
    ap.add_argument("--lost-pipeline", type=int, default=16)
    ap.add_argument("--lost-max-writes", type=int, default=5_000_000, help="per connection")
    ap.add_argument("--rkv-args", default="")
    ap.add_argument("--no-drop-caches", action="store_true")
    ap.add_argument("--no-gc", action="store_true", help="skip `rekindle gc --keep 1` of the store")
    ap.add_argument("--server-cpu", default="0")
    ap.add_argument("--client-cpu", default="1")
    ap.add_argument("--quick", action="store_true", help="smoke run: 100k keys, 1 round, short phases")
    ap.add_argument("--self-check", action="store_true", help="run --quick into a temp dir and check it")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--name", default="restore")
    a = ap.parse_args(argv)
    if a.quick:
        a.keys, a.repeat, a.steady, a.after_max = [100_000], 1, 2.0, 30.0
        a.lost_seconds, a.lost_preload = 2.0, 100_000
    if not 1 <= a.bucket_ms <= 100 or 100 % a.bucket_ms:
        ap.error("--bucket-ms: a divisor of 100")
    return a


def main(argv=None):
    args = parse(argv)
    if args.self_check:
        return self_check(args)
    build = args.build.resolve()
    for p in (build / "bin" / "rekindle", build / "examples" / "rkv", build / "bench" / "respload"):
        if not p.exists():
            sys.exit(f"{p} missing: run make all")
    pin_self(args.client_cpu)
    t_all = time.monotonic()
    restore_rows, lost_rows = [], []
    if "restore" in args.parts:
        for keys in args.keys:
            for rnd in range(args.repeat):
                k = rnd % len(args.scenarios)
                for sc in args.scenarios[k:] + args.scenarios[:k]:
                    print(f"restore: {sc}, {keys:,} keys, round {rnd + 1}/{args.repeat}", flush=True)
                    with tempfile.TemporaryDirectory(prefix=f"restore-{sc}-") as tmp:
                        raw = run_restore(sc, build, keys, args, Path(tmp))
                    raw["round"] = rnd
                    row = analyse_restore(raw, args)
                    print(
                        "  " + json.dumps({k: v for k, v in row.items() if k not in ("series", "disk")}),
                        flush=True,
                    )
                    restore_rows.append(row)
    if "lost" in args.parts:
        for rnd in range(args.repeat):
            for v in args.lost_variants:
                print(f"lost: {v}, round {rnd + 1}/{args.repeat}", flush=True)
                with tempfile.TemporaryDirectory(prefix=f"lost-{v}-") as tmp:
                    row = run_lost(v, build, args, Path(tmp))
                row["round"] = rnd
                print("  " + json.dumps(row), flush=True)
                lost_rows.append(row)
    mach = machine()
    command = "python3 bench/restore_bench.py " + " ".join(sys.argv[1:] if argv is None else argv)
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {
        "command": command,
        "machine": mach,
        "wall_s": round(time.monotonic() - t_all, 1),
        "args": {k: str(v) for k, v in vars(args).items()},
        "restore": restore_rows,
        "lost": lost_rows,
    }
    (args.out / f"{args.name}.json").write_text(json.dumps(doc, indent=1))
    md = ["## Restore after the machine dies, and lost acknowledged writes (rkv, Redis 7)", "",
          f"Command: `{command}`  ", f"Machine: {machine_line(mach)}  ",
          f"Servers pinned to CPU {args.server_cpu}, clients and harness to CPU {args.client_cpu}; loopback. "
          "Noisy shared VM unless said otherwise.", ""]  # fmt: skip
    if restore_rows:
        md += restore_table(restore_rows, args)
        for keys in sorted({r["keys"] for r in restore_rows}):
            plot_restore(restore_rows, keys, args.out / f"{args.name}_{keys}.png")
    if lost_rows:
        md += lost_table(lost_rows, args)
    text = "\n".join(md) + "\n"
    (args.out / f"{args.name}.md").write_text(text)
    print(text)
    return doc


def self_check(args):
    """The quick mode, into a temp dir, and what it must show."""
    with tempfile.TemporaryDirectory(prefix="restore-check-") as d:
        doc = main([str(args.build), "--quick", "--out", d, "--name", "check"])
        problems = []
        for sc in SCENARIOS:
            rs = [r for r in doc["restore"] if r["scenario"] == sc]
            if len(rs) != 1:
                problems.append(f"restore {sc}: {len(rs)} rows")
                continue
            r = rs[0]
            if r["dbsize_after"] != 100_000:
                problems.append(f"restore {sc}: {r['dbsize_after']} keys back")
            if r["first_get_ms"] is None or r["t90_s"] is None or not r["pre_get_per_s"]:
                problems.append(f"restore {sc}: first GET {r['first_get_ms']}, t90 {r['t90_s']}")
            if not r["disk_bytes"]:
                problems.append(f"restore {sc}: nothing on disk")
        for v in LOST:
            rs = [r for r in doc["lost"] if r["variant"] == v]
            if len(rs) != 1 or not rs[0]["acked"]:
                problems.append(f"lost {v}: {rs}")
            elif v == "sync" and rs[0]["lost"]:
                problems.append(f"lost sync: {rs[0]['lost']} acknowledged writes lost")
        for f in ("check.md", "check.json", "check_100000.png"):
            if not (Path(d) / f).exists() or not (Path(d) / f).stat().st_size:
                problems.append(f"{f} missing")
        if problems:
            print("SELF-CHECK FAILED:\n  " + "\n  ".join(problems))
            sys.exit(1)
        print("self-check ok: 3 restores, 3 lost-write runs, md/json/png written")
    return doc


if __name__ == "__main__":
    main()
