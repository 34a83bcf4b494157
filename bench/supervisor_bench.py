"""Restart times under `rekindle run`, from the supervisor's own events.

For each preserved size, one supervisor runs the service test app holding
that many MiB in its arena, and each round restarts it three ways:

  kill      SIGKILL: the supervisor detects the death, decides warm, forks
            the next incarnation and hands it the arena fds (respawn path)
  segv      a fault: the runtime restarts in place; the supervisor watches
  cold      `rekindle restart --cold`: the app rebuilds its state (the
            baseline a warm restart is measured against)

Reported per size and way: detection→up (the new incarnation's rk_init
returned) and detection→ready (it called rk_ready), medians over rounds.
The supervisor's overhead is the respawn path minus the in-place path.

Usage: python3 bench/supervisor_bench.py BUILD [--sizes 1024 8192] [--rounds 5]
Writes bench/results/supervisor.md and supervisor.jsonl."""

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Run:
    def __init__(self, build, size_mb, workdir):
        self.build = build
        self.events_path = workdir / f"events-{size_mb}.jsonl"
        self.port = free_port()
        self.settle_s = 0.5 + size_mb / 4096
        self.env = dict(os.environ, REKINDLE_RUNTIME_DIR=str(workdir / "run"))
        self.env.pop("NOTIFY_SOCKET", None)
        cmd = [
            str(build / "bin" / "rekindle"),
            "run",
            "--name",
            "bench",
            "--events",
            str(self.events_path),
            # latency, not the crash-loop policy: every restart warm, no backoff, no giving up
            "--crashloop-window",
            "0ms",
            "--backoff-initial",
            "0ms",
            "--max-restarts",
            "1000",
            "--listen",
            f"127.0.0.1:{self.port}",
            "--",
            str(build / "apps" / "service"),
            "--entries",
            "1000",
            "--fill-mb",
            str(size_mb),
        ]
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def events(self, kind):
        if not self.events_path.exists():
            return []
        lines = self.events_path.read_text().splitlines()
        return [e for e in map(json.loads, filter(None, lines)) if e.get("supervisor") == kind]

    def wait(self, kind, pred, timeout=300):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [e for e in self.events(kind) if pred(e)]
            if found:
                return found[0]
            if self.proc.poll() is not None:
                raise RuntimeError(f"supervisor exited {self.proc.returncode}")
            time.sleep(0.01)
        raise RuntimeError(f"timed out waiting for {kind}")

    def send(self, line):
        for _ in range(1000):
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=60) as s:
                    s.sendall(line.encode() + b"\n")
                    return
            except OSError:
                time.sleep(0.01)
        raise RuntimeError("service unreachable")

    def restart(self, how, generation):
        """Triggers one restart; returns the restart event of that generation."""
        # Let the previous restart's background work (the old address space's
        # teardown, dropped arenas freed) finish: one restart is measured, not
        # a storm of them on two cores.
        time.sleep(self.settle_s)
        if how == "cold":
            subprocess.run(
                [str(self.build / "bin" / "rekindle"), "restart", "bench", "--cold"],
                env=self.env,
                check=True,
                capture_output=True,
            )
        else:
            self.send(how)
        ready = self.wait("ready", lambda e: e.get("generation") == generation)
        ev = self.wait("restart", lambda e: e.get("generation") == generation)
        # The runtime's own clock: rk_restart() entry (in place) or the
        # supervisor's detection (respawn) to rk_init() return.
        up = self.wait("up", lambda e: e.get("generation") == generation)
        ev = {**ev, "runtime_us": up.get("restart_us")}
        # From the failure: detect_us is rk_restart() entry -> the supervisor
        # noticing (in place), 0 when only the supervisor saw the death.
        detect = ev.get("detect_us") or 0
        ready_us = ev.get("ready_us") or ready.get("ready_us")
        return {
            **ev,
            "up_us": detect + ev["spawn_us"],
            "ready_us": None if ready_us is None else detect + ready_us,
        }

    def close(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)


def measure(build, sizes, rounds, workdir):
    rows = []
    for size in sizes:
        print(f"{size} MiB: filling", flush=True)
        run = Run(build, size, workdir)
        try:
            run.wait("ready", lambda e: e.get("generation") == 0)
            gen = 0
            for r in range(rounds):
                for how in ("kill", "segv", "cold"):
                    gen += 1
                    ev = run.restart(how, gen)
                    row = {
                        "size_mb": size,
                        "how": how,
                        "round": r,
                        "path": ev.get("path"),
                        "mode": ev.get("mode"),
                        "up_us": ev.get("up_us"),
                        "runtime_us": ev.get("runtime_us"),
                        "ready_us": ev.get("ready_us"),
                    }
                    print(json.dumps(row), flush=True)
                    rows.append(row)
        finally:
            run.close()
    return rows


def table(rows, command):
    def med(how, size, key):
        vals = [r[key] for r in rows if r["how"] == how and r["size_mb"] == size and r[key] is not None]
        return statistics.median(vals) / 1000 if vals else float("nan")

    sizes = sorted({r["size_mb"] for r in rows})
    out = [
        "### Restart under `rekindle run`",
        "",
        f"Command: `{command}`  ",
        f"Machine: {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, Linux {platform.release()}  ",
        f"Medians over {len({r['round'] for r in rows})} rounds, ms. *rk_init*: the runtime's own clock from "
        "rk_restart() entry (in place) or the supervisor's detection of the death (respawn) to the new "
        "incarnation's rk_init() return. *ready*: the supervisor's clock from the failure to rk_ready().",
        "",
        "| preserved | SIGKILL → respawn warm: rk_init / ready | fault → in place warm: rk_init / ready "
        "| supervisor overhead (respawn − in place, rk_init) | cold restart: ready | cold / warm ready |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for s in sizes:
        k_rt, k_ready = med("kill", s, "runtime_us"), med("kill", s, "ready_us")
        i_rt, i_ready = med("segv", s, "runtime_us"), med("segv", s, "ready_us")
        cold = med("cold", s, "ready_us")
        label = f"{s // 1024} GiB" if s >= 1024 else f"{s} MiB"
        out.append(
            f"| {label} | {k_rt:.2f} / {k_ready:.2f} | {i_rt:.2f} / {i_ready:.2f} "
            f"| {k_rt - i_rt:+.2f} | {cold:.0f} | {cold / k_ready:.0f}x |"
        )
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build", type=Path)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 8192])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    build = args.build.resolve()
    with tempfile.TemporaryDirectory() as tmp:
        rows = measure(build, args.sizes, args.rounds, Path(tmp))
    command = (
        f"python3 bench/supervisor_bench.py {args.build} --sizes {' '.join(map(str, args.sizes))} "
        f"--rounds {args.rounds}"
    )
    results = ROOT / "bench" / "results"
    results.mkdir(parents=True, exist_ok=True)
    (results / "supervisor.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    md = table(rows, command)
    (results / "supervisor.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
