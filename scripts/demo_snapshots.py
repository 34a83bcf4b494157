"""The durable-snapshot part of `make demo`: rkv under `rekindle run
--snapshot-dir` takes a snapshot every 100 ms while a client writes; then the
whole stack is SIGKILLed (supervisor and app: no process holds the memfds, as
after a reboot) and `rekindle restore` brings rkv back warm from the newest
snapshot on disk.  Then the same with `--durability sync --sync-via redo`:
replies wait for their write's record in the redo log, and the start after
the stack died replays the records after the newest snapshot."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BUILD = Path(sys.argv[1] if len(sys.argv) > 1 else "build").resolve()
REKINDLE = BUILD / "bin" / "rekindle"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(port, *args):
    """One RESP command; the reply line (enough for the demo's replies)."""
    out = b"*%d\r\n" % len(args) + b"".join(
        b"$%d\r\n%s\r\n" % (len(a), a) for a in (x.encode() for x in args)
    )
    for _ in range(500):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(out)
                f = s.makefile("rb")
                line = f.readline()
                if line.startswith(b"$") and line != b"$-1\r\n":
                    return f.readline().strip().decode()
                return line.strip().decode()
        except OSError:
            time.sleep(0.02)
    raise SystemExit(f"demo: rkv does not answer {args!r}")


def start(tmp, port, events, *sup, rkv=()):
    env = dict(os.environ, REKINDLE_RUNTIME_DIR=str(tmp / "run"))
    cmd = [str(REKINDLE), *sup, "--name", "snapdemo", "--events", str(events),
           "--listen", f"127.0.0.1:{port}", "--", str(BUILD / "examples" / "rkv"),
           "--dir", str(tmp), *rkv]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)


def events_of(path, kind):
    if not path.exists():
        return []
    return [e for e in map(json.loads, path.read_text().splitlines()) if e.get("supervisor") == kind]


def main():
    tmp = Path(tempfile.mkdtemp(prefix="rekindle-snapdemo-"))
    store, port = tmp / "store", free_port()
    try:
        ev1 = tmp / "run1.jsonl"
        sup = start(tmp, port, ev1, "run", "--snapshot-dir", str(store), "--snapshot-interval", "100ms")
        n = 20000
        pipe = b"".join(b"*3\r\n$3\r\nSET\r\n$%d\r\nuser:%d\r\n$%d\r\nscore %d\r\n"
                        % (len(str(i)) + 5, i, len(str(i)) + 6, i) for i in range(n))  # fmt: skip
        command(port, "PING")
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(pipe)
            got = b""
            while got.count(b"+OK\r\n") < n:
                got += s.recv(1 << 16)
        t = time.monotonic()
        while len(events_of(ev1, "snapshot")) < 2 and time.monotonic() - t < 10:
            time.sleep(0.05)
        time.sleep(0.3)  # a few more snapshots: the newest holds every write
        snaps = events_of(ev1, "snapshot")
        last = snaps[-1]
        print(f"  {n} keys written; snapshots every 100 ms; the last one logged: {last['kind']}, "
              f"app stopped for {last['stop_us']} us at its cut")  # fmt: skip
        app = events_of(ev1, "spawn")[-1]["pid"]
        os.kill(sup.pid, signal.SIGKILL)
        os.kill(app, signal.SIGKILL)
        sup.wait()
        print("  SIGKILL to the supervisor and to rkv: no process holds the arena now (as after a reboot)")
        listing = subprocess.run(
            [str(REKINDLE), "snapshots", str(store)], capture_output=True, text=True, check=False
        )
        print("  on disk: " + listing.stdout.strip().splitlines()[-1])
        ev2 = tmp / "run2.jsonl"
        t0 = time.monotonic()
        # lazily: rkv starts at once and each page comes in when first touched
        sup2 = start(tmp, port, ev2, "restore", "--from", str(store), "--restore-pages", "lazy")
        value = command(port, "GET", "user:12345")
        took = (time.monotonic() - t0) * 1000
        size = command(port, "DBSIZE")
        up = events_of(ev2, "up")[-1]
        print(f"  rekindle restore --from {store.name}: {up['kind']} start ({up['code']}), "
              f"first GET answered {took:.0f} ms after the command: user:12345 = {value!r}, "
              f"DBSIZE {size.lstrip(':')}")  # fmt: skip
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not [
            e for e in events_of(ev2, "lazy_restore") if e.get("state") == "done"
        ]:
            time.sleep(0.05)
        done = [e for e in events_of(ev2, "lazy_restore") if e.get("state") == "done"]
        if done:
            print(f"  it restored lazily: rkv served before its pages were read back; "
                  f"{done[0]['faulted_pages']} pages came in when first touched, "
                  f"{done[0]['filled_pages']} in the background, all in {done[0]['took_ms']} ms")  # fmt: skip
        sup2.send_signal(signal.SIGTERM)
        sup2.wait(timeout=20)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def redo_demo():
    """rkv --durability sync --sync-via redo: each reply waits until its
    write's record is on disk; the stack dies right after the last reply,
    and the restore replays the records after the newest snapshot."""
    tmp = Path(tempfile.mkdtemp(prefix="rekindle-redodemo-"))
    store, port = tmp / "store", free_port()
    sync = ("--durability", "sync", "--sync-via", "redo")
    try:
        ev1 = tmp / "run1.jsonl"
        sup = start(tmp, port, ev1, "run", "--snapshot-dir", str(store), "--snapshot-interval", "100ms",
                    rkv=sync)  # fmt: skip
        n = 500
        for _ in range(n):
            command(port, "INCR", "visits")
        app = events_of(ev1, "spawn")[-1]["pid"]
        os.kill(sup.pid, signal.SIGKILL)
        os.kill(app, signal.SIGKILL)
        sup.wait()
        print(f"  with --durability sync --sync-via redo, {n} INCRs each answered only once its record "
              "was on disk; then SIGKILL to both at once")  # fmt: skip
        ev2 = tmp / "run2.jsonl"
        sup2 = start(tmp, port, ev2, "run", "--snapshot-dir", str(store), rkv=sync)
        value = command(port, "GET", "visits")
        replay = events_of(ev2, "redo_replay")
        records = replay[-1]["records"] if replay else 0
        print(f"  started again from the store: the newest snapshot, then {records} redo records "
              f"replayed after it: visits = {value} (every acknowledged write)")  # fmt: skip
        sup2.send_signal(signal.SIGTERM)
        sup2.wait(timeout=20)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
    redo_demo()
