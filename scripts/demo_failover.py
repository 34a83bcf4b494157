"""The failover part of `make demo` (docs/failover.md): one etcd and two
`rekindle run --cluster` nodes on loopback, rkv --durability sync.  etcd
elects n1, which runs rkv; n2 stands by and receives every snapshot.  Every
write is acknowledged only once n2 has it.  Then n1's supervisor and rkv are
SIGKILLed (as if its host died): n2 hears nothing more from n1, takes the
term (etcd shows n1 silent too) and starts rkv warm from the memfds it kept
of the newest snapshot (its hot image), with every acknowledged key."""

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
RKV = BUILD / "examples" / "rkv"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(port, *args, timeout=10):
    """One RESP command on a new connection; the reply line (bulk: the value)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        out = b"*%d\r\n" % len(args)
        for arg in args:
            b = str(arg).encode()
            out += b"$%d\r\n%s\r\n" % (len(b), b)
        s.sendall(out)
        f = s.makefile("rb")
        line = f.readline().rstrip(b"\r\n").decode()
        if line.startswith("$") and line != "$-1":
            return f.read(int(line[1:]) + 2)[:-2].decode()
        return line


def events(path, kind):
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            e = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line being written
        if e.get("supervisor") == kind:
            out.append(e)
    return out


def wait(what, pred, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = pred()
        if r:
            return r
        time.sleep(0.02)
    raise SystemExit(f"demo: {what} did not happen in {timeout} s")


def start_etcd(tmp):
    client, peer = free_port(), free_port()
    url = f"http://127.0.0.1:{client}"
    log = open(tmp / "etcd.log", "w")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(
        ["etcd", "--name", "demo", "--data-dir", str(tmp / "etcd"),
         "--listen-client-urls", url, "--advertise-client-urls", url,
         "--listen-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-cluster", f"demo=http://127.0.0.1:{peer}",
         "--heartbeat-interval", "50", "--election-timeout", "500"],
        stdout=log, stderr=log,
    )  # fmt: skip
    wait("etcd's start", lambda: subprocess.run(
        ["etcdctl", "--endpoints", url, "--dial-timeout", "1s", "endpoint", "health"],
        capture_output=True, check=False).returncode == 0)  # fmt: skip
    return proc, url


def start_node(tmp, etcd, node):
    d = tmp / node
    d.mkdir()
    port, repl = free_port(), free_port()
    ev = d / "events.jsonl"
    log = open(d / "node.log", "w")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(
        [str(REKINDLE), "run", "--name", "rkv", "--events", str(ev),
         "--cluster", etcd, "--node", node, "--cluster-addr", f"127.0.0.1:{repl}",
         "--cluster-name", "rkv", "--replication", "sync", "--lease-ttl", "2",
         "--snapshot-dir", str(d / "snaps"), "--snapshot-interval", "0",
         "--listen", f"127.0.0.1:{port}",
         "--", str(RKV), "--port", str(port), "--dir", str(d), "--durability", "sync"],
        stdout=log, stderr=log, env=dict(os.environ, REKINDLE_RUNTIME_DIR=str(d / "run")),
        start_new_session=True,
    )  # fmt: skip
    return {"node": node, "proc": proc, "port": port, "events": ev}


def main():
    if not shutil.which("etcd"):
        print("  (skipped: etcd is not installed; scripts/deps.sh installs etcd-server)")
        return
    tmp = Path(tempfile.mkdtemp(prefix="rekindle-demo-failover-"))
    etcd, url = start_etcd(tmp)
    nodes = []
    try:
        n1 = start_node(tmp, url, "n1")
        nodes.append(n1)
        wait("n1's election", lambda: [e for e in events(n1["events"], "role") if e.get("role") == "primary"])
        wait("rkv on n1", lambda: events(n1["events"], "up"))
        n2 = start_node(tmp, url, "n2")
        nodes.append(n2)
        wait("n2 following n1", lambda: events(n2["events"], "following"))
        keys = 200
        for i in range(keys):
            command(n1["port"], "SET", f"order:{i}", f"paid {i}")
        print(f"  etcd elected n1; rkv runs there; n2 stands by. {keys} SETs acknowledged by n1, "
              f"each only once n2 had it (--replication sync)")  # fmt: skip
        app = events(n1["events"], "spawn")[-1]["pid"]
        t0 = time.monotonic()
        os.killpg(n1["proc"].pid, signal.SIGKILL)
        os.kill(app, signal.SIGKILL)
        n1["proc"].wait()
        print("  SIGKILL to n1's supervisor and rkv (as if n1's host died)")
        wait("n2's election", lambda: [e for e in events(n2["events"], "role") if e.get("role") == "primary"])
        wait("rkv on n2", lambda: events(n2["events"], "up"))
        took = (time.monotonic() - t0) * 1000
        up = events(n2["events"], "up")[-1]
        back = sum(command(n2["port"], "GET", f"order:{i}") == f"paid {i}" for i in range(keys))
        via = (events(n2["events"], "elected") or [{}])[-1].get("via")
        how = {
            "heartbeat_timeout": "n1 went silent (stream, etcd); n2 took the term before its lease ran out",
            "no_leader": "n1's lease ran out; etcd elected n2",
        }.get(via, "etcd elected n2")
        restore = (events(n2["events"], "restore") or [{}])[-1]
        source = "from its hot image" if restore.get("from") == "hot_image" else "from its store"
        print(f"  {how}, which started rkv {up['kind']} ({up['code']}, {source}) "
              f"{took:.0f} ms after the kill: {back} of the {keys} acknowledged keys there")  # fmt: skip
    finally:
        for n in nodes:
            if n["proc"].poll() is None:
                n["proc"].send_signal(signal.SIGTERM)
                try:
                    n["proc"].wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(n["proc"].pid, signal.SIGKILL)
        etcd.terminate()
        etcd.wait(timeout=20)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
