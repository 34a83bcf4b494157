"""The supervisor part of `make demo`: `rekindle run` around the service test
app holding 256 MiB; the app is SIGKILLed and comes back warm, then an
unsafe-region death shows the supervisor choosing cold, with its reason."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BUILD = Path(sys.argv[1] if len(sys.argv) > 1 else "build").resolve()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def send(port, line, reply=True):
    for _ in range(500):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(line.encode() + b"\n")
                return json.loads(s.makefile().readline()) if reply else None
        except (OSError, ValueError):
            time.sleep(0.02)
    raise SystemExit(f"demo: no reply to {line!r}")


def wait_for(events_path, kind, generation):
    for _ in range(1000):
        if events_path.exists():
            for line in events_path.read_text().splitlines():
                e = json.loads(line)
                if e.get("supervisor") == kind and e.get("generation") == generation:
                    return e
        time.sleep(0.01)
    raise SystemExit(f"demo: no {kind} event for generation {generation}")


def show(state):
    print(
        f"  generation {state['generation']}: {state['kind']:5} pid {state['pid']}, "
        f"table at {state['table']}, {state['sets']} update(s), verified={state['verified']}"
    )


def main():
    tmp = Path(tempfile.mkdtemp(prefix="rekindle-demo-"))
    events, port = tmp / "events.jsonl", free_port()
    env = dict(os.environ, REKINDLE_RUNTIME_DIR=str(tmp / "run"))
    cmd = [
        str(BUILD / "bin" / "rekindle"),
        "run",
        "--name",
        "demo",
        "--events",
        str(events),
        "--crashloop-window",
        "0ms",
        "--listen",
        f"127.0.0.1:{port}",
        "--",
        str(BUILD / "apps" / "service"),
        "--fill-mb",
        "256",
    ]
    sup = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(events, "ready", 0)
        send(port, "set 7 4242")
        show(send(port, "state"))
        print("  kill -9 ...")
        send(port, "kill", reply=False)
        wait_for(events, "ready", 1)
        restart = wait_for(events, "restart", 1)
        up = wait_for(events, "up", 1)
        show(send(port, "state"))
        print(
            f"  supervisor: {restart['mode']} restart by {restart['path']}, the new incarnation's "
            f"rk_init returned {up['restart_us'] / 1000:.2f} ms after the death was noticed"
        )
        print("  a death inside an unsafe region (a half-done update) ...")
        send(port, "unsafe-kill", reply=False)
        wait_for(events, "ready", 2)
        lines = map(json.loads, events.read_text().splitlines())
        decisions = [e for e in lines if e.get("supervisor") == "decision"]
        show(send(port, "state"))
        print(f"  supervisor: {decisions[-1]['mode']}, because: {decisions[-1]['reason']}")
    finally:
        sup.terminate()
        sup.wait(timeout=20)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
