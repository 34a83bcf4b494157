#!/usr/bin/env python3
"""Plays systemd for `rekindle run` to check the fd store round trip without
systemd: a NOTIFY_SOCKET that keeps the fds sent with FDSTORE=1 (and drops
them on FDSTOREREMOVE=1), then a second supervisor started the way systemd
restarts a service, with the stored fds in LISTEN_FDS / LISTEN_FDNAMES.
The app's preserved state must survive the supervisor's own death.

    python3 supervisor/systemd/fake_systemd_check.py [BUILD_DIR]

Exits 0 and prints "fdstore round trip: ok" on success."""

import array
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BUILD = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[2] / "build")
REKINDLE = BUILD / "bin" / "rekindle"
SERVICE = BUILD / "apps" / "service"


class FakeSystemd:
    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.sock.settimeout(0.05)
        self.path = path
        self.store = {}  # name -> [fd]
        self.messages = []

    def pump(self):
        while True:
            try:
                data, anc, _flags, _addr = self.sock.recvmsg(4096, socket.CMSG_SPACE(64 * 4))
            except (TimeoutError, socket.timeout):
                return
            fds = array.array("i")
            for level, kind, cdata in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.frombytes(cdata[: len(cdata) - (len(cdata) % fds.itemsize)])
            kv = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
            self.messages.append(kv)
            name = kv.get("FDNAME", "stored")
            if kv.get("FDSTOREREMOVE") == "1":
                for fd in self.store.pop(name, []):
                    os.close(fd)
            elif kv.get("FDSTORE") == "1":
                self.store.setdefault(name, []).extend(fds)
            else:
                for fd in fds:
                    os.close(fd)

    def wait_for(self, pred, timeout=10):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.pump()
            if pred():
                return True
        return False


def command(port, line):
    deadline = time.monotonic() + 10
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(line.encode() + b"\n")
                r = s.makefile().readline()
                if r:
                    return json.loads(r)
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"no reply to {line!r}")
        time.sleep(0.05)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    tmp = Path(tempfile.mkdtemp(prefix="rk-fake-systemd-"))
    sd = FakeSystemd(str(tmp / "notify"))
    env = dict(os.environ, NOTIFY_SOCKET=sd.path, REKINDLE_RUNTIME_DIR=str(tmp / "run"))
    port = free_port()
    args = ["run", "--name", "fdstore", "--events", str(tmp / "events.jsonl"), "--listen", f"127.0.0.1:{port}",
            "--", str(SERVICE), "--entries", "1000"]

    # 1. first supervisor: READY=1 and the held fds parked in the store
    first = subprocess.Popen([str(REKINDLE), *args], env=env, start_new_session=True)
    assert sd.wait_for(lambda: any(m.get("READY") == "1" for m in sd.messages)), sd.messages
    assert command(port, "set 3 333")["ok"]
    before = command(port, "state")
    assert sd.wait_for(lambda: "rekindle-manifest" in sd.store and "rekindle-arena-table" in sd.store), sd.store
    # 2. the supervisor dies hard; systemd (KillMode=control-group) kills the app too
    os.killpg(first.pid, signal.SIGKILL)
    os.kill(before["pid"], signal.SIGKILL)
    first.wait()
    time.sleep(0.2)
    sd.pump()
    # 3. systemd restarts the unit: stored fds come back as LISTEN_FDS from fd 3
    names, fds = [], []
    for name, lst in sd.store.items():
        for fd in lst:
            names.append(name)
            fds.append(fd)

    def hand_over():
        for i, fd in enumerate(fds):
            os.dup2(fd, 100 + i)
        for i in range(len(fds)):
            os.dup2(100 + i, 3 + i)
            os.close(100 + i)

    env2 = dict(env, LISTEN_FDS=str(len(fds)), LISTEN_FDNAMES=":".join(names))
    second = subprocess.Popen(
        ["/bin/sh", "-c", 'LISTEN_PID=$$ exec "$0" "$@"', str(REKINDLE), *args],
        env=env2, preexec_fn=hand_over, pass_fds=[3 + i for i in range(len(fds))], start_new_session=True,
    )
    after = command(port, "state")
    ok = after["kind"] == "warm" and after["sets"] == before["sets"] and after["sum"] == before["sum"]
    os.killpg(second.pid, signal.SIGTERM)
    second.wait(timeout=20)
    if not ok:
        print("events:", (tmp / "events.jsonl").read_text())
        raise SystemExit(f"state not preserved across a supervisor restart: {before} -> {after}")
    print("fdstore round trip: ok", after["kind"], "generation", after["generation"])


if __name__ == "__main__":
    main()
