#!/usr/bin/env python3
"""The leaderboard of docs/porting.md (examples/leaderboard/): how long a
client waits after a crash, ported and not.

Both servers run under `rekindle run` (--stable-after 1s and a pause of
1.5 s between deaths, so no death counts as a crash loop or gets a
backoff).  Each is filled with N players through its own protocol
(pipelined `score` commands), then dies R times; "down" runs from the
death (the `crash` command sent, or the SIGKILL) to the answer of one
`get` sent on a new connection as soon as the old process is gone:

- leaderboard (Rekindle), `--listen` (the supervisor holds the socket):
  `crash`, restarted in place; SIGKILL, respawned.  The answer must be
  the player's total: the board came back.
- leaderboard_plain (no runtime, binds its own port): `crash`, respawned
  by the supervisor.  It answers "ERR no such player": it starts empty,
  and getting the N players back would take what the fill took, if the
  clients could send it all again.

Writes bench/results/leaderboard.jsonl and bench/results/leaderboard.md.

Usage: python3 bench/leaderboard_bench.py [BUILD] [--players N] [--runs R]
"""

import argparse
import json
import os
import select
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def connect(port, timeout=10.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=timeout)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.0005)


def ask(port, line, timeout=10.0):
    """One request on a new connection; retried until a reply comes."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with connect(port, timeout) as s:
                s.sendall(line.encode() + b"\n")
                reply = s.makefile().readline()
                if reply:
                    return reply.strip()
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"no reply to {line!r}")
        time.sleep(0.0005)


def fill(port, n, batch=5000):
    """Players p0..p{n-1}, player i with (i % 1000) + 1 points."""
    t0 = time.monotonic()
    with connect(port) as s:
        f = s.makefile()
        for start in range(0, n, batch):
            end = min(n, start + batch)
            s.sendall("".join(f"score p{i} {i % 1000 + 1}\n" for i in range(start, end)).encode())
            for _ in range(start, end):
                f.readline()
    return time.monotonic() - t0


class Supervised:
    def __init__(self, build, tmp, app, listen):
        self.tmp = Path(tempfile.mkdtemp(dir=tmp))
        self.port = free_port()
        self.events_path = self.tmp / "events.jsonl"
        env = dict(os.environ, REKINDLE_RUNTIME_DIR=str(self.tmp / "run"))
        env.pop("NOTIFY_SOCKET", None)
        cmd = [str(build / "bin" / "rekindle"), "run", "--name", f"lb{self.port}", "--events",
               str(self.events_path), "--stable-after", "1s", "--hang-timeout", "1s"]
        app = [str(a) for a in app]
        if listen:
            cmd += ["--listen", f"127.0.0.1:{self.port}"]
        else:
            app += ["--port", str(self.port)]
        self.err = open(self.tmp / "stderr.txt", "w")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen([*cmd, "--", *app], stdout=subprocess.DEVNULL, stderr=self.err, env=env)

    def events(self, kind):
        if not self.events_path.exists():
            return []
        out = [json.loads(x) for x in self.events_path.read_text().splitlines() if x.strip()]
        return [e for e in out if e["supervisor"] == kind]

    def wait_event(self, kind, count, timeout=30.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.events(kind)
            if len(found) >= count:
                return found[count - 1]
            time.sleep(0.02)
        raise AssertionError(f"no {kind} event #{count}: {self.events_path.read_text()}")

    def close(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.err.close()


def down_after_crash(port, probe):
    """`crash`, then the first answer once the old image is gone (its
    connections closed: the exec, or the death)."""
    with connect(port) as s:
        t0 = time.monotonic()
        s.sendall(b"crash\n")
        s.settimeout(10)
        while s.recv(4096):
            pass
    reply = ask(port, probe)
    return (time.monotonic() - t0) * 1e3, reply


def down_after_sigkill(port, pid, probe):
    fd = os.pidfd_open(pid)
    try:
        t0 = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        select.select([fd], [], [], 10)
    finally:
        os.close(fd)
    reply = ask(port, probe)
    return (time.monotonic() - t0) * 1e3, reply


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build", nargs="?", default=str(ROOT / "build"))
    ap.add_argument("--players", type=int, default=500000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    build = Path(args.build).resolve()
    n = args.players
    probe = f"get p{n - 1}"
    want = f"p{n - 1} {(n - 1) % 1000 + 1}"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, listen, deaths in (
            ("leaderboard", True, ("crash", "sigkill")),
            ("leaderboard_plain", False, ("crash",)),
        ):
            sup = Supervised(build, tmp, [build / "examples" / name], listen)
            try:
                ask(sup.port, "players")
                fill_s = fill(sup.port, n)
                assert ask(sup.port, "players") == str(n)
                rows.append({"server": name, "what": "fill", "players": n, "s": round(fill_s, 3)})
                print(f"{name}: filled {n} players in {fill_s:.2f} s", flush=True)
                deaths_so_far = 0
                for run in range(args.runs):
                    for how in deaths:
                        time.sleep(1.5)
                        if how == "crash":
                            ms, reply = down_after_crash(sup.port, probe)
                        else:
                            pid = sup.wait_event("up", deaths_so_far + 1)["pid"]
                            ms, reply = down_after_sigkill(sup.port, pid, probe)
                        deaths_so_far += 1
                        restart = sup.wait_event("restart", deaths_so_far)
                        ready = sup.wait_event("ready", deaths_so_far + 1) if listen else {}
                        players = ask(sup.port, "players")
                        row = {"server": name, "what": how, "run": run, "players": n, "down_ms": round(ms, 3),
                               "reply": reply, "players_after": int(players), "mode": restart["mode"],
                               "path": restart["path"], "ready_us": ready.get("ready_us")}
                        rows.append(row)
                        print(json.dumps(row), flush=True)
                        if name == "leaderboard":
                            assert reply == want and players == str(n), row
                            assert restart["mode"] == "warm", row
                        else:
                            assert players == "0", row
                            # the plain server must be filled again for its next crash to mean the same
                            fill(sup.port, n)
            finally:
                sup.close()
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    load = round(os.getloadavg()[0], 2)
    with open(out / "leaderboard.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps({**r, "loadavg_1m_at_end": load}) + "\n")
    lines = [
        f"# leaderboard: down time after a death, {n} players, medians of {args.runs}",
        "",
        f"`python3 bench/leaderboard_bench.py --players {n} --runs {args.runs}`; "
        f"load average at the end {load}.",
        "",
        "| server | death | restart | down, ms (median) | min-max | ready_us (median) | players after |",
        "|---|---|---|---:|---|---:|---:|",
    ]
    for name, how in (("leaderboard", "crash"), ("leaderboard", "sigkill"), ("leaderboard_plain", "crash")):
        rs = [r for r in rows if r["server"] == name and r["what"] == how]
        if not rs:
            continue
        ds = [r["down_ms"] for r in rs]
        ready = [r["ready_us"] for r in rs if r["ready_us"] is not None]
        lines.append(
            f"| {name} | {how} | {rs[0]['mode']}, {rs[0]['path']} | {statistics.median(ds):.2f} | "
            f"{min(ds):.2f}-{max(ds):.2f} | {statistics.median(ready) if ready else '-'} | "
            f"{rs[0]['players_after']} |"
        )
    for r in rows:
        if r["what"] == "fill":
            lines.append(f"\n{r['server']}: filling {n} players through the protocol took {r['s']} s.")
    (out / "leaderboard.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
