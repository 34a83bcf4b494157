#!/usr/bin/env python3
"""Initial sync of a standby that joins late (issue 14, speed: "initial sync
time of a standby at 5 M keys"), Rekindle against a Redis 7 replica, on the
same network-namespace hosts as bench/failover_bench.py.

Rekindle: etcd on e1, `rekindle run --cluster` with rkv on n1 (async
replication, rkv --durability async, a snapshot every second), N keys loaded
(bench/respload.c), one more second for the snapshot that holds them; then
n2 is started and the time is taken from its start to its first
`replica_applied` event: the newest snapshot received whole, every chunk
checked, published in its store (fsynced) and acknowledged.  (The hot
image is written from it right after.)

Redis: redis-server 7 on r1 (no persistence), N keys loaded the same way,
then a replica started on r2 with --replicaof; the time from its start to
INFO replication saying master_link_status:up and
master_sync_in_progress:0.  Redis 7 syncs disklessly by default (an RDB
streamed from a fork), with repl-diskless-sync-delay 0 here.

    python3 bench/initial_sync_bench.py build --keys 5000000 --repeat 2

Writes bench/results/NAME.{json,md}.  Needs root, etcd-server, redis-server."""

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import failover_bench as fb  # noqa: E402 - the hosts and Redis helpers of the failover bench


def respload(build, host, ip, port, keys, log):
    """Loads keys k:0.. into the server at ip:port from `host`'s namespace."""
    p = host.popen([build / "bench" / "respload", "load", "--host", ip, "--port", port, "--keys", keys], log)
    if p.wait(timeout=1800) != 0:
        raise RuntimeError(f"respload failed: {Path(log).read_text()[-500:]}")


def dir_bytes(d):
    return sum(f.stat().st_size for f in Path(d).rglob("*") if f.is_file())


def rkv_round(ch, build, net, keys):
    etcd = ch.Etcd(net, net.host("e1"))
    common = dict(replication="async", durability="async", snapshot_interval="1s", lease_ttl=2)
    n1 = ch.Node(net, net.host("n1"), etcd, "n1", **common)
    n1.wait_event("up", timeout=60)
    respload(build, n1.host, n1.host.ip, n1.port, keys, net.tmp / "load-n1.log")
    t_loaded = time.monotonic_ns()
    # a snapshot taken after the load: the one a joining standby receives
    n1.wait_event("snapshot", lambda e: e["t_ns"] > t_loaded + 1_000_000_000, timeout=120)
    t0 = time.monotonic_ns()
    n2 = ch.Node(net, net.host("n2"), etcd, "n2", **common)
    following = n2.wait_event("following", timeout=60)
    applied = n2.wait_event("replica_applied", timeout=1800)
    return {
        "system": "rekindle",
        "keys": keys,
        "sync": following.get("sync"),
        "join_to_applied_ms": round((applied["t_ns"] - t0) / 1e6, 1),
        "store_bytes_n1": dir_bytes(n1.store),
        "store_bytes_n2": dir_bytes(n2.store),
    }


def redis_round(build, net, keys):
    import redis

    r1, r2 = net.host("r1"), net.host("r2")
    d1, d2 = net.tmp / "r1", net.tmp / "r2"
    d1.mkdir(exist_ok=True)
    d2.mkdir(exist_ok=True)
    r1.popen(fb.redis_argv(r1, d1), d1 / "stdout.log")
    c1 = redis.Redis(host=r1.ip, port=fb.REDIS_PORT, socket_timeout=10)
    fb.wait_for("redis on r1", lambda: fb.quiet(c1.ping), 30)
    respload(build, r1, r1.ip, fb.REDIS_PORT, keys, net.tmp / "load-r1.log")
    used = c1.info("memory")["used_memory"]
    t0 = time.monotonic()
    r2.popen(fb.redis_argv(r2, d2, ["--replicaof", r1.ip, fb.REDIS_PORT]), d2 / "stdout.log")
    c2 = redis.Redis(host=r2.ip, port=fb.REDIS_PORT, socket_timeout=10)

    def synced():
        info = fb.quiet(c2.info, "replication")
        return info and info.get("master_link_status") == "up" and not info.get("master_sync_in_progress")

    fb.wait_for("the replica synced", synced, 1800, period=0.01)
    took = time.monotonic() - t0
    return {
        "system": "redis",
        "keys": keys,
        "join_to_synced_ms": round(took * 1e3, 1),
        "used_memory_primary": used,
        "replica_keys": c2.dbsize(),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build")
    ap.add_argument("--keys", type=int, default=5_000_000)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--systems", nargs="+", default=["rekindle", "redis"], choices=["rekindle", "redis"])
    ap.add_argument("--name", default="initial-sync")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()
    build = Path(args.build).resolve()
    ch = fb.harness(build)
    rows = []
    load0 = fb.loadavg()
    for rnd in range(args.repeat):
        for system in args.systems:
            tmp = Path(subprocess.check_output(["mktemp", "-d", "/tmp/initsync-XXXXXX"], text=True).strip())
            net = ch.Net(tmp)
            try:
                row = (
                    rkv_round(ch, build, net, args.keys)
                    if system == "rekindle"
                    else redis_round(build, net, args.keys)
                )
            finally:
                net.close()
                shutil.rmtree(tmp, ignore_errors=True)  # stores of the size measured
            row["round"] = rnd
            rows.append(row)
            print(json.dumps(row), flush=True)
    load1 = fb.loadavg()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps({"rows": rows, "load": [load0, load1]}, indent=1))
    rk = [r["join_to_applied_ms"] for r in rows if r["system"] == "rekindle"]
    rd = [r["join_to_synced_ms"] for r in rows if r["system"] == "redis"]
    med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    lines = [
        "## Initial sync of a standby that joins late",
        "",
        f"`python3 bench/initial_sync_bench.py build --keys {args.keys} --repeat {args.repeat}`; "
        f"load average before / after: {load0} / {load1}.",
        "",
        "| system | keys | join → synced, ms (median) | runs | sent |",
        "|---|---:|---:|---|---|",
    ]
    if rk:
        sizes = [r["store_bytes_n2"] for r in rows if r["system"] == "rekindle"]
        lines.append(
            f"| Rekindle (full snapshot, then its hot image) | {args.keys:,} | {med(rk):,.0f} | "
            f"{', '.join(f'{x:,.0f}' for x in rk)} | standby store {med(sizes) / 2**20:,.0f} MiB |"
        )
    if rd:
        mem = [r["used_memory_primary"] for r in rows if r["system"] == "redis"]
        lines.append(
            f"| Redis 7 replica (diskless RDB) | {args.keys:,} | {med(rd):,.0f} | "
            f"{', '.join(f'{x:,.0f}' for x in rd)} | primary used_memory {med(mem) / 2**20:,.0f} MiB |"
        )
    (out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
