"""`rekindle run` under systemd, played by the test: a NOTIFY_SOCKET that keeps
the fds sent with FDSTORE=1 (and drops them on FDSTOREREMOVE=1), then a
second supervisor started the way systemd restarts a service, with the
stored fds in LISTEN_FDS / LISTEN_FDNAMES.  The app's preserved state must
survive the death of the supervisor itself."""

import array
import os
import signal
import socket
import subprocess
import time

from supervisor_harness import REKINDLE, SERVICE, free_port, service_command


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
            except TimeoutError:
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


def test_fd_store_keeps_preserved_state_across_a_supervisor_restart(tmp_path):
    tmp = tmp_path
    sd = FakeSystemd(str(tmp / "notify"))
    env = dict(os.environ, NOTIFY_SOCKET=sd.path, REKINDLE_RUNTIME_DIR=str(tmp / "run"))
    port = free_port()
    args = [
        "run",
        "--name",
        "fdstore",
        "--events",
        str(tmp / "events.jsonl"),
        "--listen",
        f"127.0.0.1:{port}",
        "--",
        str(SERVICE),
        "--entries",
        "1000",
    ]

    # 1. first supervisor: READY=1 and the held fds parked in the store
    first = subprocess.Popen([str(REKINDLE), *args], env=env, start_new_session=True)
    assert sd.wait_for(lambda: any(m.get("READY") == "1" for m in sd.messages)), sd.messages
    assert service_command(port, "set 3 333")["ok"]
    before = service_command(port, "state")
    assert sd.wait_for(lambda: "rekindle-manifest" in sd.store and "rekindle-arena-table" in sd.store), (
        sd.store
    )
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

    # The shell puts them at 3.. as systemd does, from copies at 200.. so
    # that no source is overwritten before it is used.
    high = [200 + i for i in range(len(fds))]
    for fd, h in zip(fds, high, strict=True):
        os.dup2(fd, h, inheritable=True)
    moves = " ".join(f"{3 + i}<&{h} {h}<&-" for i, h in enumerate(high))
    env2 = dict(env, LISTEN_FDS=str(len(fds)), LISTEN_FDNAMES=":".join(names))
    second = subprocess.Popen(
        ["/bin/bash", "-c", f'LISTEN_PID=$$ exec "$0" "$@" {moves}', str(REKINDLE), *args],
        env=env2,
        pass_fds=high,
        start_new_session=True,
    )
    for h in high:
        os.close(h)
    after = service_command(port, "state")
    ok = after["kind"] == "warm" and after["sets"] == before["sets"] and after["sum"] == before["sum"]
    os.killpg(second.pid, signal.SIGTERM)
    second.wait(timeout=20)
    assert ok, (
        f"state not preserved across a supervisor restart: {before} -> {after}\n"
        + (tmp / "events.jsonl").read_text()
    )
