#!/usr/bin/env python3
"""The first GET after a cold lazy restore, A/B between rekindle binaries
(issue 13): one store of --keys keys made once, then restored again and
again, each round with every binary in turn (the order alternates), each
restore from a fresh copy of that store with the page cache dropped.

restore_bench.py measures the whole story (load, kill, restore, t90) with
one binary; this one holds the store and everything else fixed, so that
two versions of the supervisor can be told apart on a noisy machine.

Per restore: t0 (the `taskset ... rekindle restore` launched, after
`drop_caches`) to the first GET answered (a fresh connection every 1 ms
until one answers a GET of a random loaded key); from the supervisor's
events: the app's spawn and `up`, and the restore event's read_ms,
index_ms, fold_ms.

  python3 bench/restore_ab.py BUILD NAME=REKINDLE [NAME=REKINDLE ...]
      [--keys 5000000] [--rounds 5] [--work DIR] [--out DIR] [--name NAME]

BUILD gives rkv and respload; each REKINDLE is a supervisor binary, copied
in turn into a private copy of BUILD/bin.  Writes NAME.{json,md} under
--out (bench/results)."""

import argparse
import json
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import restore_bench as rb  # noqa: E402
from snapshot_common import HOST, RESULTS, drop_caches, free_port, loadavg  # noqa: E402


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build", type=Path)
    ap.add_argument("variants", nargs="+", help="NAME=PATH of a rekindle binary")
    ap.add_argument("--keys", type=int, default=5_000_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--work", type=Path, help="keep the store here (reused when it exists)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--name", default="restore-ab")
    ap.add_argument("--server-cpu", default="0")
    ap.add_argument("--client-cpu", default="1")
    a = ap.parse_args(argv)
    a.variants = [v.split("=", 1) for v in a.variants]
    if any(len(v) != 2 or not Path(v[1]).is_file() for v in a.variants):
        ap.error("each variant is NAME=PATH of an existing rekindle binary")
    return a


class Opts:
    """What restore_bench.start_for reads from its arguments."""

    def __init__(self, cpu):
        self.server_cpu, self.snapshot_interval, self.rkv_args = cpu, "1s", ""


def private_build(build, work):
    """BUILD's programs with a bin/ of our own, where each variant goes."""
    mine = work / "build"
    if not mine.exists():
        mine.mkdir(parents=True)
        for d in ("examples", "bench", "lib"):
            (mine / d).symlink_to((build / d).resolve())
        (mine / "bin").mkdir()
    return mine


def make_store(build, work, keys, opts):
    pristine = work / "pristine"
    if pristine.exists():
        return pristine
    port = free_port()
    srv = rb.start_for("rkv", build, work, port, opts)
    try:
        srv.wait_serving()
        print("loaded", rb.respload_load(build, port, keys), flush=True)
        srv.checkpoint(tag="bench")
        time.sleep(8)  # the indexer indexes the newest snapshot (at most every 2 s, nice 10)
    finally:
        srv.kill9()
    (work / "store").rename(pristine)
    return pristine


def first_get(port, keys, t0, deadline_s=60):
    key = b"k:%08d" % random.randrange(keys)  # respload's key names
    req = b"*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n" % (len(key), key)
    while time.monotonic() - t0 < deadline_s:
        try:
            with socket.create_connection((HOST, port), timeout=5) as s:
                s.sendall(req)
                if s.recv(64).startswith(b"$1"):
                    return (time.monotonic() - t0) * 1000
        except OSError:
            pass
        time.sleep(0.001)
    return None


def one_restore(build, work, pristine, keys, opts):
    shutil.rmtree(work / "store", ignore_errors=True)
    shutil.rmtree(work / "run", ignore_errors=True)
    for f in list(work.glob("events-after*")) + list(work.glob("stderr-after*")):
        f.unlink()
    subprocess.run(["cp", "-a", str(pristine), str(work / "store")], check=True)
    drop_caches()
    time.sleep(1.0)
    port = free_port()
    load = loadavg()
    t0 = time.monotonic()
    srv = rb.start_for("rkv-lazy", build, work, port, opts, restore=True)
    try:
        ms = first_get(port, keys, t0)
        time.sleep(0.5)
        ev = srv.events()
    finally:
        srv.kill9()

    def at(kind):
        e = [x for x in ev if x.get("supervisor") == kind]
        return round((e[0]["t_ns"] / 1e9 - t0) * 1000, 1) if e else None

    rs = next((x for x in ev if x.get("supervisor") == "restore"), {})
    return {
        "first_get_ms": None if ms is None else round(ms, 1),
        "spawn_ms": at("spawn"),
        "up_ms": at("up"),
        **{k: rs.get(k) for k in ("read_ms", "chain_ms", "index_ms", "fold_ms", "index")},
        "loadavg": load,
    }


def med(rows, k):
    xs = [r[k] for r in rows if r.get(k) is not None]
    return round(statistics.median(xs), 1) if xs else None


def table(rows, names):
    out = ["| binary | first GET, median (all) | app spawned | spawn to up | store read | index | fold |",
           "|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for n in names:
        rs = [r for r in rows if r["variant"] == n]
        for r in rs:
            r["spawn_to_up_ms"] = None if None in (r["up_ms"], r["spawn_ms"]) else r["up_ms"] - r["spawn_ms"]
        every = ", ".join(f"{r['first_get_ms']:.0f}" for r in rs if r["first_get_ms"] is not None)
        out.append(
            f"| {n} | {med(rs, 'first_get_ms')} ms ({every}) | {med(rs, 'spawn_ms')} ms | "
            f"{med(rs, 'spawn_to_up_ms')} ms | {med(rs, 'read_ms')} ms | {med(rs, 'index_ms')} ms | "
            f"{med(rs, 'fold_ms')} ms |"
        )
    return "\n".join(out) + "\n"


def main(argv=None):
    a = parse(argv)
    rb.pin_self(a.client_cpu)
    work = a.work or Path(tempfile.mkdtemp(prefix="restore-ab-"))
    work.mkdir(parents=True, exist_ok=True)
    build = private_build(a.build.resolve(), work)
    opts = Opts(a.server_cpu)
    shutil.copy(a.variants[0][1], build / "bin" / "rekindle")
    pristine = make_store(build, work, a.keys, opts)
    rows = []
    for rnd in range(a.rounds):
        order = a.variants if rnd % 2 == 0 else a.variants[::-1]
        for name, path in order:
            shutil.copy(path, build / "bin" / "rekindle")
            row = {"variant": name, "round": rnd, **one_restore(build, work, pristine, a.keys, opts)}
            print(json.dumps(row), flush=True)
            rows.append(row)
    names = [n for n, _ in a.variants]
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / f"{a.name}.json").write_text(json.dumps({"keys": a.keys, "variants": dict(a.variants),
                                                       "rows": rows}, indent=1))  # fmt: skip
    md = table(rows, names)
    (a.out / f"{a.name}.md").write_text(
        f"# {a.name}: first GET after a cold lazy restore, {a.keys:,} keys, {a.rounds} rounds\n\n{md}"
    )
    print(md)
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if all(r["first_get_ms"] is not None for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
