"""Failover (issue 14, docs/failover.md): hosts are network namespaces on a
bridge of the test's own, etcd (etcd-server 3.4) runs on a host of its own,
and every host runs `rekindle run --cluster ... -- rkv --durability sync`.
Clients are unmodified redis-py in the test process; each records its
operations with CLOCK_MONOTONIC times (the same clock as the events'
t_ns on this machine), and a history checker asserts: every acknowledged
write is on the new primary, each writer's keys there form a prefix (a
consistent cut), and no acknowledgement came from the old primary after it
was fenced or after the new primary was elected."""

import json
import os
import socket
import threading
import time

import pytest
import redis
from cluster_harness import REKINDLE, RKV, Etcd, Net, Node, cluster_status, sh

from conftest import BUILD

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root"),
    pytest.mark.skipif(
        not (BUILD / "bin" / "rekindle").exists() or not RKV.exists(), reason="run make first"
    ),
]


@pytest.fixture
def net(tmp_path):
    n = Net(tmp_path)
    try:
        yield n
    finally:
        n.close()


def two_nodes(net, offsets=(0, 0), **kw):
    """etcd, then n1 (elected: term 1), then n2 following it, synced;
    offsets: each one's clock offset (s)."""
    kw.pop("clock_offset_s", None)
    etcd = Etcd(net, net.host("e1"))
    n1 = Node(net, net.host("n1"), etcd, "n1", clock_offset_s=offsets[0], **kw)
    n1.wait_event("role", lambda e: e.get("role") == "primary" and e.get("epoch") == 1)
    n1.wait_event("up")
    n2 = Node(net, net.host("n2"), etcd, "n2", clock_offset_s=offsets[1], **kw)
    n2.wait_event("following", lambda e: e["epoch"] == 1)
    # acknowledged once n2 has it
    assert n1.client(timeout=15).set("hello", "1") is True
    n2.wait_event("replica_applied")
    return etcd, n1, n2


class History:
    """Writers' recorded operations: (writer, index, t_ack monotonic ns)."""

    def __init__(self):
        self.acked = []
        self.lock = threading.Lock()

    def ack(self, w, i):
        with self.lock:
            self.acked.append((w, i, time.monotonic_ns()))

    def count(self):
        with self.lock:
            return len(self.acked)


def run_writers(node, hist, stop, writers=4, per_writer=5000, seconds=30):
    """Each writer SETs w<t>:<i> = <i> in order on its own connection until
    stop, an error, or its bounds (count and time)."""

    def writer(t):
        c = node.client(timeout=5)
        deadline = time.monotonic() + seconds
        for i in range(per_writer):
            if stop.is_set() or time.monotonic() > deadline:
                return
            try:
                c.set(f"w{t}:{i}", str(i))
            except (redis.ConnectionError, redis.TimeoutError):
                return
            hist.ack(t, i)

    threads = [threading.Thread(target=writer, args=(t,), daemon=True) for t in range(writers)]
    for th in threads:
        th.start()
    return threads


def wait_acks(hist, n, timeout=20):
    deadline = time.monotonic() + timeout
    while hist.count() < n:
        assert time.monotonic() < deadline, f"only {hist.count()} acknowledgements"
        time.sleep(0.01)


def check_history(node, hist, writers=4):
    """No acknowledged write lost; each writer's keys a prefix."""
    c = node.client(timeout=10)
    by_writer = {}
    for w, i, _ in hist.acked:
        by_writer[w] = max(by_writer.get(w, -1), i)
    for w in range(writers):
        top = by_writer.get(w, -1)
        probe = top + 50  # unacknowledged writes may be there too
        values = c.mget([f"w{w}:{i}" for i in range(probe + 1)])
        present = [v is not None for v in values]
        missing = [i for i in range(top + 1) if not present[i]]
        assert not missing, f"writer {w}: acknowledged writes lost: {missing[:10]} (of {top + 1})"
        # a consistent cut: what is there is a prefix
        first_gap = present.index(False) if False in present else len(present)
        assert not any(present[first_gap:]), f"writer {w}: keys after a gap at {first_gap}"
        for i in range(top + 1):
            assert values[i] == str(i).encode()


def test_sync_reply_waits_for_a_standby(net):
    """--replication sync: a write's reply is held until a standby has the
    snapshot holding it; a standby that joins releases it (one raw
    connection, so that no client gives up or reconnects meanwhile)."""
    etcd = Etcd(net, net.host("e1"))
    n1 = Node(net, net.host("n1"), etcd, "n1")
    n1.wait_event("up")
    with socket.create_connection((n1.host.ip, n1.port), timeout=1.0) as s:
        s.sendall(b"*3\r\n$3\r\nSET\r\n$4\r\nheld\r\n$1\r\n1\r\n")
        with pytest.raises(TimeoutError):
            s.recv(100)  # no standby: not acknowledged
        Node(net, net.host("n2"), etcd, "n2")
        s.settimeout(20)
        t0 = time.monotonic()
        assert s.recv(100) == b"+OK\r\n"
        print(f"released {time.monotonic() - t0:.2f} s after the standby started")
    joined = n1.wait_event("standby_joined")
    assert joined["standby"] == "n2" and joined["sync"] == "full"
    assert n1.client(timeout=10).get("held") == b"1"
    st = cluster_status(etcd)
    assert st["leader"]["node"] == "n1" and st["epoch"] == 1


def test_kill_primary_loses_no_acknowledged_write(net):
    """kill -9 of the primary's host under load: the standby is elected
    (term 2) once the lease runs out, starts warm from what it received,
    and holds every acknowledged write; the old primary, started again,
    rejoins as a standby, incrementally from the newest snapshot both
    stores hold of term 1 (its own newer commits, never acknowledged, go)."""
    etcd, n1, n2 = two_nodes(net)
    hist, stop = History(), threading.Event()
    threads = run_writers(n1, hist, stop)
    wait_acks(hist, 300)
    n1.host.kill()
    t_kill = time.monotonic_ns()
    stop.set()
    for th in threads:
        th.join(timeout=10)
    elected = n2.wait_event("role", lambda e: e.get("role") == "primary", timeout=20)
    assert elected["epoch"] == 2
    up = n2.wait_event("up", timeout=20)
    assert up["code"] == "restored", up
    check_history(n2, hist)
    # no acknowledgement from the old primary after it died or n2 was elected
    assert all(t <= t_kill for _, _, t in hist.acked)
    st = cluster_status(etcd)
    assert st["epoch"] == 2 and st["leader"]["node"] == "n2"
    failover_ms = (up["t_ns"] - t_kill) / 1e6
    print(f"failover: {failover_ms:.0f} ms from kill to serving, {hist.count()} writes acknowledged")
    # the old primary comes back: a standby of term 2, resumed from the
    # common snapshot of term 1, not resynchronised whole
    n1.start()
    fol = n1.wait_event("following", lambda e: e["epoch"] == 2, timeout=20)
    assert fol["sync"] == "incremental_after_term_change", fol
    assert not (n1.store.parent / "snaps.diverged").exists()
    # and n2's writes are acknowledged again, with n1 as its standby
    c = n2.client(timeout=10)
    assert c.set("after", "1") is True
    n1.wait_event("replica_applied", lambda e: e["epoch"] == 2, timeout=20)
    assert c.get("w0:0") == b"0"


@pytest.mark.parametrize("offsets", [(0, 0), (100_000, 7)], ids=["same-clock", "clocks-offset"])
def test_primary_cut_off_from_etcd_fences_itself(net, offsets):
    """The primary loses etcd (the standby and clients still reach it): it
    kills its app before its lease can expire, the standby is elected only
    after that, and every write the old primary acknowledged is on the new
    one.  Healed, the old primary rejoins as a standby.  With the hosts'
    monotonic clocks far apart (time namespaces: n1 100,000 s ahead, n2
    7 s), the same holds: only durations on each host's own clock count.
    The lease path alone (--heartbeat-timeout 0): with the early takeover
    on, a stream that stalls for its timeout on a loaded machine lets the
    standby take the term before the fence (safe in sync mode:
    test_early_takeover.py), which is not the bound tested here."""
    etcd, n1, n2 = two_nodes(net, offsets=offsets, extra=("--heartbeat-timeout", "0"))
    hist, stop = History(), threading.Event()
    threads = run_writers(n1, hist, stop)
    wait_acks(hist, 200)
    t_cut = time.monotonic_ns()
    n1.host.block(etcd.host)
    fence = n1.wait_event("fence", timeout=10)
    elected = n2.wait_event("role", lambda e: e.get("role") == "primary", timeout=20)
    # each host's t_ns back on the test's clock
    fence = {**fence, "t_ns": fence["t_ns"] - n1.clock_offset_ns}
    elected = {**elected, "t_ns": elected["t_ns"] - n2.clock_offset_ns}
    stop.set()
    for th in threads:
        th.join(timeout=10)
    assert elected["epoch"] == 2
    # the fence came within the lease (2 s) and before the election
    assert fence["t_ns"] - t_cut < 2_000_000_000, (fence["t_ns"] - t_cut) / 1e6
    assert fence["t_ns"] < elected["t_ns"]
    # no acknowledgement from the old primary once the new one was elected
    # (replies it sent before its kill may still be on their way at the fence)
    late = [a for a in hist.acked if a[2] > elected["t_ns"]]
    assert not late, f"{len(late)} acknowledgements after the election"
    n2.wait_event("up", timeout=20)
    check_history(n2, hist)
    fenced = n1.wait_event("fenced", timeout=10)
    assert fenced["code"] == "lease_unconfirmed"
    n1.host.unblock(etcd.host)
    n1.wait_event("following", lambda e: e["epoch"] == 2, timeout=20)
    # it resumed from the common snapshot of term 1: the next commit comes
    assert n2.client(timeout=10).set("after", "1") is True
    n1.wait_event("replica_applied", lambda e: e["epoch"] == 2, timeout=20)
    # each node reports itself every 250 ms (and at once on a new role)
    deadline = time.monotonic() + 5
    while True:
        st = cluster_status(etcd)
        roles = {n["node"]: n["role"] for n in st["nodes"]}
        if roles == {"n1": "standby", "n2": "primary"}:
            break
        assert time.monotonic() < deadline, st
        time.sleep(0.05)
    assert st["leader"]["node"] == "n2"


def test_standby_crash_and_rejoin_during_load(net):
    """The standby's host dies under load: sync replies wait (no standby
    has them); it comes back, rejoins incrementally (its store is of the
    current term), the held replies are released, and after a failover to
    it every acknowledged write is there."""
    etcd, n1, n2 = two_nodes(net)
    hist, stop = History(), threading.Event()
    threads = run_writers(n1, hist, stop, seconds=40)
    wait_acks(hist, 150)
    n2.host.kill()
    time.sleep(0.5)
    before = hist.count()
    time.sleep(1.0)
    assert hist.count() == before, "acknowledged with no standby"
    n2.start()
    n2.wait_event("following", lambda e: e["sync"] == "incremental", timeout=20)
    wait_acks(hist, before + 150, timeout=20)
    stop.set()
    for th in threads:
        th.join(timeout=10)
    joined = [e for e in n1.events("standby_joined") if e["standby"] == "n2"]
    assert [e["sync"] for e in joined] == ["full", "incremental"], joined
    # its hot image did not hold the parent of the first snapshot after the
    # rejoin: it was read whole from the store once
    n2.wait_event("hot_image", lambda e: e["state"] == "rebuilt", timeout=20)
    # n2 holds it all: fail over to it
    n1.host.kill()
    elected = n2.wait_event("role", lambda e: e.get("role") == "primary", timeout=20)
    n2.wait_event("up", timeout=20)
    restore = n2.wait_event("restore", lambda e: e["t_ns"] > elected["t_ns"])
    assert restore["from"] == "hot_image", restore
    check_history(n2, hist)


def test_partition_from_the_standby_only(net):
    """Primary and standby cannot reach each other, both reach etcd: the
    primary keeps its term and holds sync replies; the standby is not
    elected (the leader key exists); healed, replication resumes and the
    held replies are released."""
    etcd, n1, n2 = two_nodes(net)
    hist, stop = History(), threading.Event()
    threads = run_writers(n1, hist, stop, seconds=40)
    wait_acks(hist, 150)
    n1.host.block(n2.host)
    time.sleep(0.5)
    before = hist.count()
    time.sleep(2.5)  # longer than the lease: nobody may be elected
    assert hist.count() == before, "acknowledged without the standby"
    assert not n2.events("role") or all(e["role"] == "standby" for e in n2.events("role"))
    assert not n1.events("fence")
    st = cluster_status(etcd)
    assert st["leader"]["node"] == "n1" and st["epoch"] == 1
    n2.wait_event("replica_lost", timeout=10)
    n1.host.unblock(n2.host)
    wait_acks(hist, before + 150, timeout=20)
    stop.set()
    for th in threads:
        th.join(timeout=10)
    check_history(n1, hist)


def test_async_failover_serves_a_consistent_prefix(net):
    """--replication async, rkv --durability async: replies go out at once;
    after kill -9 the standby serves warm, what it lost is only the tail of
    each writer (its state is a consistent cut), and the loss is reported."""
    etcd, n1, n2 = two_nodes(net, replication="async", durability="async", snapshot_interval="20ms")
    hist, stop = History(), threading.Event()
    threads = run_writers(n1, hist, stop)
    wait_acks(hist, 400)
    n1.host.kill()
    stop.set()
    for th in threads:
        th.join(timeout=10)
    n2.wait_event("role", lambda e: e.get("role") == "primary" and e["epoch"] == 2, timeout=20)
    up = n2.wait_event("up", timeout=20)
    assert up["code"] == "restored"
    c = n2.client(timeout=10)
    lost = 0
    for w in range(4):
        acked = [i for ww, i, _ in hist.acked if ww == w]
        top = max(acked, default=-1)
        values = c.mget([f"w{w}:{i}" for i in range(top + 1)])
        present = [v is not None for v in values]
        first_gap = present.index(False) if False in present else len(present)
        assert not any(present[first_gap:]), f"writer {w}: not a prefix"
        lost += len(present) - first_gap
    print(f"async failover: {lost} of {hist.count()} acknowledged writes lost (the replication lag)")


def failover_cmd(etcd, *args):
    r = sh(REKINDLE, "failover", "--cluster", etcd.url, "rkv", "--json", *args, check=False)
    return r.returncode, json.loads(r.stdout)


def test_planned_failover_and_back(net):
    """rekindle failover: the primary hands its term over under load with
    no acknowledged write lost, the old primary stands by and is
    resynchronised, and the term can be handed back; a target that is not
    a standby in sync is refused with its code."""
    etcd, n1, n2 = two_nodes(net)
    rc, out = failover_cmd(etcd, "--to", "n1")
    assert rc == 1 and out["code"] == "already_primary", out
    rc, out = failover_cmd(etcd, "--to", "n9")
    assert rc == 1 and out["code"] == "not_in_sync", out
    hist, stop = History(), threading.Event()
    threads = run_writers(n1, hist, stop)
    wait_acks(hist, 200)
    rc, out = failover_cmd(etcd, "--to", "n2")
    stop.set()
    for th in threads:
        th.join(timeout=10)
    assert rc == 0, out
    assert out["from"]["node"] == "n1" and out["to"]["node"] == "n2" and out["to"]["epoch"] == 2
    assert n1.wait_event("fenced")["code"] == "handed_over"
    up = n2.wait_event("up", timeout=20)
    assert up["code"] == "restored"
    check_history(n2, hist)
    print(f"planned failover: {out['took_ms']} ms until the new term")
    # back: n1 must first be a standby in sync with term 2 (resumed from
    # the common snapshot of term 1, and named in term 2's in-sync set)
    n1.wait_event("following", lambda e: e["epoch"] == 2, timeout=20)
    deadline = time.monotonic() + 10
    while True:
        st = cluster_status(etcd)
        n = {x["node"]: x for x in st["nodes"]}["n1"]
        named = st["insync"]["epoch"] == 2 and "n1" in st["insync"]["standbys"]
        if (n["role"], n["epoch"], n["lag_snapshots"], named) == ("standby", 2, 0, True):
            break
        assert time.monotonic() < deadline, (n, st["insync"])
        time.sleep(0.1)
    rc, out = failover_cmd(etcd)
    assert rc == 0 and out["to"]["node"] == "n1" and out["to"]["epoch"] == 3, out
    n1.wait_event("up", lambda e: e["code"] == "restored", timeout=20)
    assert n1.client(timeout=10).get("w0:0") == b"0"
