"""The error-virtualization part of `make demo` (docs/errvirt.md): rkv built
with `rekindle-ev-cc` (build/examples/rkv-ev).  A request that always
crashes (rkv's test-only `DEBUG crash-after-alloc`) is rolled back to its
last library call, malloc, which then returns NULL: rkv's own error path
answers "-ERR out of memory".  The process never stops, and another client's
connection is the same one before and after."""

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


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Conn:
    """One RESP connection, kept open."""

    def __init__(self, port):
        for _ in range(500):
            try:
                self.s = socket.create_connection(("127.0.0.1", port), timeout=10)
                self.f = self.s.makefile("rb")
                return
            except OSError:
                time.sleep(0.02)
        raise SystemExit("demo: rkv-ev did not answer")

    def cmd(self, *args):
        out = b"*%d\r\n" % len(args)
        for arg in args:
            b = str(arg).encode()
            out += b"$%d\r\n%s\r\n" % (len(b), b)
        self.s.sendall(out)
        line = self.f.readline().rstrip(b"\r\n").decode()
        if line.startswith("$") and line != "$-1":
            data = self.f.read(int(line[1:]) + 2)[:-2].decode()
            return data
        return line


def main():
    exe = BUILD / "examples" / "rkv-ev"
    if not exe.exists():
        raise SystemExit(f"demo: {exe} missing (make rkv-ev)")
    tmp = Path(tempfile.mkdtemp(prefix="rekindle-demo-ev-"))
    port = free_port()
    err = open(tmp / "stderr.log", "w")  # noqa: SIM115 - handed to the child
    env = dict(os.environ, REKINDLE_RUNTIME_DIR=str(tmp / "run"))
    proc = subprocess.Popen(
        [str(exe), "--port", str(port), "--dir", str(tmp), "--save", "", "--enable-debug", "yes"],
        stdout=subprocess.DEVNULL, stderr=err, env=env,
    )  # fmt: skip
    try:
        other, victim = Conn(port), Conn(port)
        other.cmd("SET", "greeting", "hello")
        before = other.cmd("CLIENT", "ID").lstrip(":")
        for i in range(3):
            reply = victim.cmd("DEBUG", "crash-after-alloc", f"payload{i}")
            print(f"  crashing request #{i + 1}: rkv answered {reply!r}")
        after = other.cmd("CLIENT", "ID").lstrip(":")
        value = other.cmd("GET", "greeting")
        err.flush()
        lines = [
            json.loads(x)
            for x in (tmp / "stderr.log").read_text().splitlines()
            if x.startswith('{"rekindle_ev"')
        ]
        rec = [e for e in lines if e["rekindle_ev"] == "recovered"]
        alive = "still running" if proc.poll() is None else "GONE"
        print(f"  the other client: same connection (client id {before}, then {after}), "
              f"GET greeting = {value!r}; rkv pid {proc.pid} {alive}")  # fmt: skip
        if rec:
            e = rec[-1]
            print(f"  each crash was rolled back to its last library call ({e['gate']}), which returned "
                  f"its error instead: {len(rec)} recoveries, no restart")  # fmt: skip
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
        err.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
