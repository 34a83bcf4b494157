"""Clients find the new primary without being changed (issue 14;
docs/failover.md, "Clients find the primary: the Sentinel endpoint"): every
node runs `rekindle run --cluster ... --sentinel-addr`, and an unmodified
redis-py `Sentinel(...).master_for(...)` client (and redis-cli) finds the
primary of each term through it.  The answers come from etcd: a node whose
lease is gone is never named."""

import os
import socket
import subprocess
import threading
import time

import pytest
import redis
from cluster_harness import REKINDLE, RKV, Etcd, Net, Node, sh
from history import History, check_no_acked_write_lost
from redis.backoff import ConstantBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel

from conftest import BUILD

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root"),
    pytest.mark.skipif(
        not (BUILD / "bin" / "rekindle").exists() or not RKV.exists(), reason="run make first"
    ),
]

SENTINEL_PORT = 52379


@pytest.fixture
def net(tmp_path):
    n = Net(tmp_path)
    try:
        yield n
    finally:
        n.close()


def sentinel_node(net, etcd, name, **kw):
    host = net.host(name)
    extra = ("--sentinel-addr", f"{host.ip}:{SENTINEL_PORT}", *kw.pop("extra", ()))
    return Node(net, host, etcd, name, extra=extra, **kw)


def redis_cli(ip, port, *args):
    r = sh("redis-cli", "-h", ip, "-p", port, *args, check=False)
    return r.stdout.strip()


class MasterPoller:
    """Asks one sentinel `SENTINEL get-master-addr-by-name rkv` over and
    over (bounded), recording (t_sent ns, answer)."""

    def __init__(self, ip, port, seconds=30):
        self.answers = []
        self.stop = threading.Event()
        self.ip, self.port, self.seconds = ip, port, seconds
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        c = redis.Redis(self.ip, self.port, socket_timeout=2, socket_connect_timeout=1)
        deadline = time.monotonic() + self.seconds
        while not self.stop.is_set() and time.monotonic() < deadline:
            t = time.monotonic_ns()
            try:
                a = c.sentinel_get_master_addr_by_name("rkv")
            except (redis.ConnectionError, redis.TimeoutError):
                time.sleep(0.05)
                continue
            self.answers.append((t, (a[0].decode(), a[1]) if a else None))
            time.sleep(0.02)

    def close(self):
        self.stop.set()
        self.thread.join(timeout=10)


def test_unmodified_sentinel_client_follows_a_failover(net):
    """Two nodes, sync replication, a sentinel on each.  An unmodified
    redis-py Sentinel client writes; the primary's host is killed; the
    same client object, through its retry, finds the new primary through
    the surviving sentinel, and every acknowledged write is there.  No
    sentinel answer sent after the new term began names the old primary."""
    etcd = Etcd(net, net.host("e1"))
    n1 = sentinel_node(net, etcd, "n1")
    n1.wait_event("up")
    n2 = sentinel_node(net, etcd, "n2")
    n2.wait_event("following", lambda e: e["epoch"] == 1)
    n2.wait_event("sentinel_listen")
    addr1, addr2 = (n1.host.ip, 6379), (n2.host.ip, 6379)

    sentinels = [(n1.host.ip, SENTINEL_PORT), (n2.host.ip, SENTINEL_PORT)]
    s = Sentinel(sentinels, socket_timeout=2, socket_connect_timeout=1)
    assert s.discover_master("rkv") == (n1.host.ip, 6379)
    assert s.discover_slaves("rkv") == []  # standbys run no app
    assert redis_cli(n2.host.ip, SENTINEL_PORT, "SENTINEL", "get-master-addr-by-name", "rkv").split() == [
        n1.host.ip, "6379"
    ]  # fmt: skip
    # each sentinel knows the other (from etcd)
    others = s.sentinels[0].sentinel_sentinels("rkv")
    assert [(o["ip"], o["port"]) for o in others] in ([sentinels[0]], [sentinels[1]])
    state = s.sentinels[0].sentinel_master("rkv")
    assert state["is_master"] and not state["is_sdown"] and state["config-epoch"] == 1

    # One client object for the whole test; its retry covers the failover.
    # redis-py 8.1's retry of a command in flight when the primary dies
    # reconnects to the same address (Connection.connect_check_health uses
    # the connection's host); the next command asks the sentinels again.
    # So the write in flight at the kill may end in an error (outcome
    # unknown), and every later one goes to the new primary.
    master = s.master_for(
        "rkv", socket_timeout=5, socket_connect_timeout=1,
        retry=Retry(ConstantBackoff(0.1), 30),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError],
    )  # fmt: skip
    hist = History()
    for i in range(200):
        assert hist.write("c0", master, f"k:{i}", str(i))

    # the same client object writes on through the failover (bounded)
    def writer():
        deadline = time.monotonic() + 60
        for i in range(200, 600):
            if time.monotonic() > deadline:
                return
            hist.write("c0", master, f"k:{i}", str(i))

    poller = MasterPoller(n2.host.ip, SENTINEL_PORT)
    w = threading.Thread(target=writer, daemon=True)
    try:
        w.start()
        while hist.count() < 250:
            assert w.is_alive(), "the writer stopped before the kill"
            time.sleep(0.005)
        n1.host.kill()
        t_kill = time.monotonic_ns()
        elected = n2.wait_event("elected")
        assert elected["epoch"] == 2
        # sync: the new primary acknowledges once a standby has the writes;
        # the old host comes back and rejoins as its standby
        n1.start()
        w.join(timeout=90)
        assert not w.is_alive(), "the writer did not finish"
    finally:
        poller.close()
    not_ok = [o for o in hist.ops if o.outcome != "ok"]
    assert len(hist.ops) == 600
    assert len(not_ok) <= 1 and all(o.outcome == "unknown" for o in not_ok), not_ok
    after = [o for o in hist.acked() if o.t_start > elected["t_ns"]]
    assert len(after) >= 300, f"only {len(after)} writes acknowledged by the new primary"
    assert master.connection_pool.master_address == addr2
    assert s.discover_master("rkv") == addr2
    assert redis_cli(n2.host.ip, SENTINEL_PORT, "SENTINEL", "get-master-addr-by-name", "rkv").split() == [
        n2.host.ip, "6379"
    ]  # fmt: skip
    state = s.sentinels[0].sentinel_master("rkv")
    assert state["config-epoch"] == 2 and state["runid"] == "n2"

    # never the deposed primary once the new term exists: every answer to a
    # request sent after the election names n2 (or nobody)
    late = [(t, a) for t, a in poller.answers if t > elected["t_ns"] and a not in (addr2, None)]
    assert not late, f"a sentinel named the deposed primary after the new term began: {late[:3]}"
    # ... and between the kill and the election, it named n1 or nobody
    assert all(a in (addr1, addr2, None) for _, a in poller.answers)
    assert any(t > t_kill for t, _ in poller.answers)

    reader = redis.Redis(n2.host.ip, 6379, socket_timeout=10)
    assert check_no_acked_write_lost(hist, reader) == 600 - len(not_ok)


def test_sentinel_answers_and_refuses(net):
    """The commands clients use answer as Sentinel does; bad ones get RESP
    errors (a protocol error closes the connection), never a crash; the
    standalone `rekindle sentinel` answers the same from etcd."""
    etcd = Etcd(net, net.host("e1"))
    n1 = sentinel_node(net, etcd, "n1")
    n1.wait_event("up")
    ip, port = n1.host.ip, SENTINEL_PORT
    assert redis_cli(ip, port, "PING") == "PONG"
    assert redis_cli(ip, port, "ROLE").split() == ["sentinel", "rkv"]
    assert "master0:name=rkv,status=ok,address=" + f"{ip}:6379" in redis_cli(ip, port, "INFO")
    assert redis_cli(ip, port, "SENTINEL", "get-master-addr-by-name", "nosuch") == ""
    assert "No such master" in redis_cli(ip, port, "SENTINEL", "master", "nosuch")
    assert "wrong number of arguments" in redis_cli(ip, port, "SENTINEL", "get-master-addr-by-name")
    assert "unknown or unsupported SENTINEL subcommand" in redis_cli(ip, port, "SENTINEL", "monitor", "x")
    assert "rekindle failover" in redis_cli(ip, port, "SENTINEL", "failover", "rkv")
    assert "unknown command 'set'" in redis_cli(ip, port, "SET", "a", "b")
    assert redis_cli(ip, port, "SENTINEL", "ckquorum", "rkv").startswith("OK")
    # RESP3 (HELLO 3) and RESP2 clients both parse the master's state
    for proto in (2, 3):
        c = redis.Redis(ip, port, protocol=proto, socket_timeout=2)
        m = c.sentinel_masters()["rkv"]
        assert m["is_master"] and m["ip"] == ip and int(m["port"]) == 6379, m

    def raw(data):
        with socket.create_connection((ip, port), timeout=2) as s:
            s.sendall(data)
            out = b""
            while True:
                try:
                    b = s.recv(4096)
                except TimeoutError:
                    return out, False
                if not b:
                    return out, True
                out += b

    for bad in (b"*x\r\n", b"*1\r\n:5\r\n", b"*1\r\n$99999999\r\n", b"*1\r\n$2\r\nabcd\r\n",
                b'PING "open\r\n'):  # fmt: skip
        out, closed = raw(bad)
        assert out.startswith(b"-ERR Protocol error"), (bad, out)
        assert closed, bad
    # pipelined requests, inline and multibulk, answered in order
    out, _ = raw(b"PING\r\n*2\r\n$4\r\nPING\r\n$2\r\nhi\r\nQUIT\r\n")
    assert out == b"+PONG\r\n$2\r\nhi\r\n+OK\r\n"
    bad_events = n1.events("sentinel_bad_request")
    assert {e["code"] for e in bad_events} >= {"bad_length", "expected_bulk", "too_long", "missing_crlf"}
    # the node still serves
    assert redis_cli(ip, port, "SENTINEL", "get-master-addr-by-name", "rkv").split() == [ip, "6379"]

    # the standalone command, in the root namespace on the bridge's address
    bridge_ip = f"{net.subnet}.254"
    events = net.tmp / "sentinel-events.jsonl"
    p = subprocess.Popen(
        [REKINDLE, "sentinel", "--cluster", etcd.url, "--listen", f"{bridge_ip}:{SENTINEL_PORT}",
         "--events", events, "rkv"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while "sentinel_listen" not in (events.read_text() if events.exists() else ""):
            assert time.monotonic() < deadline and p.poll() is None, p.stderr.read() if p.stderr else ""
            time.sleep(0.05)
        got = redis_cli(bridge_ip, SENTINEL_PORT, "SENTINEL", "get-master-addr-by-name", "rkv").split()
        assert got == [ip, "6379"]
        # n1's sentinel is listed from etcd; this one publishes none
        s = Sentinel([(bridge_ip, SENTINEL_PORT)], socket_timeout=2)
        assert [(o["ip"], o["port"]) for o in s.sentinels[0].sentinel_sentinels("rkv")] == [(ip, port)]
        assert s.discover_master("rkv") == (ip, 6379)
    finally:
        p.terminate()
        assert p.wait(timeout=10) == 0
    # bad usage is a usage error
    r = sh(REKINDLE, "sentinel", "--cluster", etcd.url, "--listen", "x", check=False)
    assert r.returncode == 2 and "NAME" in r.stderr
