"""Redis 7.0.15 ported to Rekindle (examples/redis) against the same Redis
built as Debian builds it (stock), same run.

Throughput: `redis-benchmark -c 50 -t get,set,lpush,hset,zadd -d 100
-r 1000000`, without pipelining and with -P 16; the servers (no
persistence) on CPU 0, redis-benchmark on CPU 1; --repeat rounds, the two
servers in a rotated order each round (drift lands on both); medians of
requests/s and the ratio port/stock of the medians, with the range of the
same-round ratios.

Availability through a crash (bench/availability.py's client and metrics:
`respload run`, 4 connections x 32 pipelined, uniform GETs, 5% SETs,
cache-aside), the ways back after `DEBUG SEGFAULT`:
  port-warm    the port under `rekindle run --listen`: warm restart
  port-warm-4k the same with its keyspace in 4 KiB pages
               (REDIS_REKINDLE_HUGEPAGES=no): a fault per 4 KiB after it
  stock-rdb    stock, restarted at once by this harness, loads its RDB
               (SAVE --before s before the crash)
  stock-aof    stock with appendonly yes (everysec), restarted, replays its AOF
  stock-none   stock without persistence, restarted empty
Metrics: downtime, avail@5s (effective availability = GET hits/s in the
fifth second after the crash over before), t90 (crash to 90% of before).

Usage:
  python3 bench/redis_port_bench.py BUILD [--quick] [--repeat 5] [--keys 5000000]
      [--value-bytes 1100] [--skip-throughput] [--skip-availability]
Needs `make redis` (both builds) and `make all` (bench/respload).  Writes
bench/results/redis_port_bench.{jsonl,md} and redis_port_availability.png."""

import argparse
import csv
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import availability  # noqa: E402
from rkv_common import (  # noqa: E402
    ROOT,
    Server,
    free_port,
    machine,
    machine_line,
    resp,
    send_only,
    supervised_argv,
    wait_serving,
)

TESTS = ["GET", "SET", "LPUSH", "HSET", "ZADD"]
CLIENTS = 50
SERVERS = ["stock", "port"]
SCENARIOS = {
    "port-warm": "Redis port under `rekindle run`, warm restart",
    "port-warm-4k": "the same, keyspace in 4 KiB pages (REDIS_REKINDLE_HUGEPAGES=no)",
    "stock-rdb": "stock Redis, restart from its RDB",
    "stock-aof": "stock Redis, restart replaying its AOF",
    "stock-none": "stock Redis, no persistence, restart empty",
}
availability.SCENARIOS.update(SCENARIOS)  # analyse() labels rows by name


def binary(build, kind, name="redis-server"):
    return build / "redis" / ("rekindle" if kind == "port" else "stock") / "src" / name


def server_argv(build, kind, port, workdir, extra=()):
    return [
        str(binary(build, kind)),
        "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir),
        "--save", "", "--appendonly", "no", "--enable-debug-command", "yes",
        "--crash-memcheck-enabled", "no", "--daemonize", "no",
        "--logfile", str(workdir / "redis.log"), *extra,
    ]  # fmt: skip


def taskset(cpu, argv):
    return ["taskset", "-c", cpu, *argv] if shutil.which("taskset") else argv


# ---------------------------------------------------------------- throughput


def cpu_seconds(pid):
    """The process's user + system CPU time (/proc/PID/stat, clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_once(build, port, requests, pipeline, tests=TESTS):
    argv = [str(binary(build, "stock", "redis-benchmark")), "-h", "127.0.0.1", "-p", str(port)]
    argv += ["-c", str(CLIENTS), "-n", str(requests), "-t", ",".join(tests).lower(), "-d", "100"]
    argv += ["-r", "1000000", "-q", "--csv", "-P", str(pipeline)]
    out = subprocess.run(taskset("1", argv), capture_output=True, text=True, check=True).stdout
    rows = {r["test"].split()[0]: r for r in csv.DictReader(io.StringIO(out))}
    return {t: (float(rows[t]["rps"]), float(rows[t]["p99_latency_ms"])) for t in tests if t in rows}


def throughput(build, rounds, requests, requests_p, tmp):
    running = {}
    rows = []
    try:
        for kind in SERVERS:
            port = free_port()
            d = tmp / f"tput-{kind}"
            d.mkdir()
            srv = Server(f"redis-{kind}", server_argv(build, kind, port, d), d, cpu="0")
            srv.start()
            wait_serving(port, proc=srv.proc)
            running[kind] = (srv, port)
        for kind in SERVERS:  # a first pass fills the keyspace: the rounds overwrite
            bench_once(build, running[kind][1], requests_p, 16)
        for r in range(rounds):
            order = SERVERS[r % 2 :] + SERVERS[: r % 2]
            for pipeline in (1, 16):
                for kind in order:
                    n = requests if pipeline == 1 else requests_p
                    srv, port = running[kind]
                    res = {}
                    for test in TESTS:  # one test a run: the server's CPU time per request of each
                        cpu0 = cpu_seconds(srv.proc.pid)
                        rps, p99 = bench_once(build, port, n, pipeline, [test])[test]
                        cpu_ns = 1e9 * (cpu_seconds(srv.proc.pid) - cpu0) / n
                        res[test] = (rps, p99)
                        rows.append(
                            {"round": r, "server": kind, "pipeline": pipeline, "test": test, "rps": rps,
                             "p99_ms": p99, "server_cpu_ns_per_req": cpu_ns}
                        )  # fmt: skip
                    print(
                        f"round {r} P={pipeline:2d} {kind:5s} "
                        + " ".join(f"{t} {v:,.0f}" for t, (v, _) in res.items())
                    )
    finally:
        for srv, _ in running.values():
            srv.stop()
    return rows


def throughput_table(rows):
    out = [
        "| test | pipeline | stock req/s | port req/s | port/stock [range of the rounds] "
        "| p99 ms (stock / port) | server CPU ns/req (stock / port) | CPU port/stock |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for pipeline in (1, 16):
        for test in TESTS:
            by = {
                (r["round"], r["server"]): r["rps"]
                for r in rows
                if (r["pipeline"], r["test"]) == (pipeline, test)
            }
            med = {k: statistics.median([v for (_, s), v in by.items() if s == k] or [0]) for k in SERVERS}

            def median_of(field, k, test=test, pipeline=pipeline):
                mine = [
                    r[field] for r in rows if (r["pipeline"], r["test"], r["server"]) == (pipeline, test, k)
                ]
                return statistics.median(mine or [0])

            p99 = {k: median_of("p99_ms", k) for k in SERVERS}
            cpu = {k: median_of("server_cpu_ns_per_req", k) for k in SERVERS}
            rr = [by[(r, "port")] / by[(r, "stock")] for r in {r for r, _ in by} if (r, "port") in by]
            if not med["stock"] or not rr:
                continue
            out.append(
                f"| {test} | {pipeline} | {med['stock']:,.0f} | {med['port']:,.0f} "
                f"| **{med['port'] / med['stock']:.1%}** [{min(rr):.0%}–{max(rr):.0%}] "
                f"| {p99['stock']:.2f} / {p99['port']:.2f} | {cpu['stock']:,.0f} / {cpu['port']:,.0f} "
                f"| **{cpu['port'] / cpu['stock']:.3f}** |"
            )
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- availability


class Client(availability.Client):
    """availability.py's client with the value size of the load."""

    def __init__(self, build, port, keys, bucket_ms, value_bytes):
        argv = [str(build / "bench" / "respload"), "run", "--port", str(port), "--keys", str(keys)]
        argv += ["--conns", "4", "--pipeline", "32", "--write-pct", "5", "--duration", "900"]
        argv += ["--bucket-ms", str(bucket_ms), "--value-size", str(value_bytes)]
        self.bucket_s = bucket_ms / 1000
        self.proc = subprocess.Popen(taskset("1", argv), stdout=subprocess.PIPE, text=True)
        self.live, self.summary, self.t0 = [], None, time.monotonic()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()


def start_scenario(name, build, port, workdir):
    """Returns (Server, restarted_by_harness)."""
    if name in ("port-warm", "port-warm-4k"):
        env = dict(os.environ, REKINDLE_RUNTIME_DIR=str(workdir / "run"))
        if name == "port-warm-4k":
            env["REDIS_REKINDLE_HUGEPAGES"] = "no"
        env.pop("NOTIFY_SOCKET", None)
        app = server_argv(build, "port", 0, workdir)
        argv = supervised_argv(build, "redis-port-avail", port, workdir / "events.jsonl", app)
        return Server("rekindle", argv, workdir, env=env), False
    extra = ("--appendonly", "yes", "--appendfsync", "everysec") if name == "stock-aof" else ()
    return Server("redis", server_argv(build, "stock", port, workdir, extra), workdir), True


def notes(name, server, workdir):
    log = (workdir / "redis.log").read_text(errors="replace") if (workdir / "redis.log").exists() else ""
    n = {
        "loaded": [ln.split("loaded from", 1)[-1].strip() for ln in log.splitlines() if "loaded from" in ln],
        "rekindle": [ln.split("Rekindle: ", 1)[1] for ln in log.splitlines() if "Rekindle: " in ln],
        "harness_respawns": [
            {"exit_rc": rc, "respawn_ms_after_exit": round((t1 - t0) * 1000, 2)}
            for t0, rc, t1 in server.exits
        ],
    }
    ev = workdir / "events.jsonl"
    if ev.exists():
        evs = [json.loads(ln) for ln in ev.read_text().splitlines() if ln.strip()]
        n["up"] = [
            {k: e.get(k) for k in ("kind", "reason", "restart_us")}
            for e in evs
            if e.get("supervisor") == "up"
        ]
    return n


def run_one(name, build, args, workdir):
    port = free_port()
    server, respawn = start_scenario(name, build, port, workdir)
    server.start(respawn=respawn)
    try:
        wait_serving(port, proc=server.proc)
        t = time.monotonic()
        load = subprocess.run(
            taskset(
                "1",
                [str(build / "bench" / "respload"), "load", "--port", str(port), "--keys", str(args.keys)],
            )
            + ["--value-size", str(args.value_bytes)],
            capture_output=True,
            text=True,
            check=True,
        )
        print(f"  loaded {args.keys} keys in {time.monotonic() - t:.1f} s", flush=True)
        client = Client(build, port, args.keys, args.bucket_ms, args.value_bytes)
        time.sleep(args.warmup)
        t_snap = None
        if name == "stock-rdb":
            t_snap = time.monotonic()
            resp(port, "SAVE", timeout=3600)
            print(f"  SAVE took {time.monotonic() - t_snap:.1f} s", flush=True)
        client.proc.send_signal(availability.signal.SIGUSR1)
        t_mark = time.monotonic()
        time.sleep(args.before)
        loadavg = Path("/proc/loadavg").read_text().split()[:3]
        conn, t_crash = send_only(port, "DEBUG", "SEGFAULT")
        client.proc.send_signal(availability.signal.SIGUSR2)
        print("  crashed; waiting for recovery", flush=True)
        time.sleep(0.3)
        window = client.live[-round(6 / client.bucket_s) : -round(0.3 / client.bucket_s)]
        pre = sum(b[2] for b in window) / client.bucket_s / max(1, len(window))
        while True:
            time.sleep(0.5)
            el = time.monotonic() - t_crash
            t90 = availability.recovered(client.live, client.t0, t_crash, pre, client.bucket_s)
            if el >= args.after_max or (el >= args.after_min and t90 is not None and el >= t90 + 3):
                break
        conn.close()
        summary = client.stop()
        wait_serving(port, timeout=3600)
        dbsize = resp(port, "DBSIZE")
    finally:
        server.stop()
    return {
        "loaded": json.loads(load.stdout),
        "t_snap": t_snap,
        "t_mark": t_mark,
        "loadavg": loadavg,
        "cpu_pressure": None,
        "hugepages_at_crash": [],
        "rkv_args": "",
        "t_crash": t_crash,
        "summary": summary,
        "notes": notes(name, server, workdir),
        "dbsize_end": dbsize,
    }


def availability_rows(build, args):
    rows = []
    for rep in range(args.repeat_availability):
        for name in args.scenarios:
            print(f"{name}, {args.keys} keys of {args.value_bytes} B, run {rep + 1}", flush=True)
            with tempfile.TemporaryDirectory(prefix="redis-avail-") as tmp:
                raw = run_one(name, build, args, Path(tmp))
            row = {**availability.analyse(name, args.keys, raw), "run": rep + 1}
            print(
                "  " + json.dumps({k: v for k, v in row.items() if k not in ("series", "notes")}), flush=True
            )
            rows.append(row)
    return rows


def availability_table(rows):
    fmt = availability.fmt
    out = [
        "| scenario | run | before: GET/s | downtime | avail@5s | t90 | keys at the end | restart |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        n = r["notes"]
        how = "; ".join(n.get("rekindle", [])[-2:] + n.get("loaded", [])) or "—"
        never = f"> {r['observed_after_s']:.0f} s"
        down = fmt(r["downtime_ms"], ".1f", "< 2")
        out.append(
            f"| {r['label']} | {r['run']} | {r['pre_get_per_s']:,} | {down} ms "
            f"| {fmt(r['avail_5s'], '.0%')} | {fmt(r['t90_s'], '.2f', never)}"
            f"{' s' if r['t90_s'] is not None else ''} | {r['dbsize_end']:,} | {how[:160]} |"
        )
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build", type=Path)
    ap.add_argument("--repeat", type=int, default=5, help="throughput rounds")
    ap.add_argument("--requests", type=int, default=300_000, help="per test and round, -P 1")
    ap.add_argument("--requests-pipelined", type=int, default=2_000_000, help="per test and round, -P 16")
    ap.add_argument("--keys", type=int, default=5_000_000)
    ap.add_argument("--value-bytes", type=int, default=1100, help="5 M x 1100 B: about 6 GB of keyspace")
    ap.add_argument("--scenarios", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS))
    ap.add_argument("--repeat-availability", type=int, default=1)
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--before", type=float, default=30.0, help="s from the SAVE to the crash")
    ap.add_argument("--after-min", type=float, default=10.0)
    ap.add_argument("--after-max", type=float, default=600.0)
    ap.add_argument("--bucket-ms", type=int, default=100)
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--skip-availability", action="store_true")
    ap.add_argument("--quick", action="store_true", help="2 rounds of 20k/100k requests; 100k keys of 100 B")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args()
    if args.quick:
        args.repeat, args.requests, args.requests_pipelined = 2, 20_000, 100_000
        args.keys, args.value_bytes, args.before, args.after_min, args.after_max = (
            100_000,
            100,
            5.0,
            6.0,
            30.0,
        )
    args.after_min = max(args.after_min, 5.3)
    build = args.build.resolve()
    for kind in SERVERS:
        if not binary(build, kind).exists():
            sys.exit(f"{binary(build, kind)} missing: run `make redis`")
    mach = machine()
    command = "python3 bench/redis_port_bench.py " + " ".join(sys.argv[1:])
    md = [
        "## Redis 7.0.15: the Rekindle port against stock (Debian's build flags)",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine_line(mach)}",
        "",
    ]
    jsonl = []
    with tempfile.TemporaryDirectory(prefix="redis-tput-") as tmp:
        if not args.skip_throughput:
            rows = throughput(build, args.repeat, args.requests, args.requests_pipelined, Path(tmp))
            jsonl += [{"kind": "throughput", **r} for r in rows]
            md += [
                f"### Throughput: redis-benchmark -c {CLIENTS} -d 100 -r 1000000, servers on CPU 0, "
                f"client on CPU 1; medians of {args.repeat} interleaved rounds",
                "",
                throughput_table(rows),
            ]
    if not args.skip_availability:
        rows = availability_rows(build, args)
        jsonl += [{"kind": "availability", **r} for r in rows]
        png = args.out / "redis_port_availability.png"
        args.out.mkdir(parents=True, exist_ok=True)
        availability.plot(rows, args.keys, png, value_bytes=args.value_bytes)
        md += [
            f"### Availability through DEBUG SEGFAULT, {args.keys:,} keys of {args.value_bytes} B",
            "",
            availability_table(rows),
            f"![timeline]({png.name})",
            "",
        ]
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "redis_port_bench.jsonl", "w") as f:
        for r in jsonl:
            f.write(json.dumps({**r, "command": command, "machine": mach}) + "\n")
    text = "\n".join(md)
    (args.out / "redis_port_bench.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
