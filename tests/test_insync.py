"""The in-sync set in etcd (issue 14; docs/failover.md, "The in-sync set"):
three nodes, sync replication.  The primary records in etcd which standbys
it waits for; only those may take the next term, which lets a standby take
over early with another standby beside it; the other standby then rejoins
the new primary incrementally across the term change.

The assertions are on facts (events, etcd's records and lease state, the
clients' recorded history), never on durations."""

import os
import threading
import time

import pytest
from cluster_harness import (
    REKINDLE,
    RKV,
    Etcd,
    Net,
    Node,
    cluster_status,
    leader_lease,
    lease_ttl_left,
    sh,
    wait_acks,
    wait_insync,
    writers,
)
from history import History, check_no_ack_from_deposed, check_no_acked_write_lost

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


def wait_eligibility(etcd, node, want, timeout=20):
    """Until `node`'s report in etcd (rekindle cluster status --json)
    carries `want` as its eligibility."""
    deadline = time.monotonic() + timeout
    while True:
        nodes = {x["node"]: x for x in cluster_status(etcd)["nodes"]}
        got = nodes.get(node, {}).get("eligibility")
        if got == want:
            return
        assert time.monotonic() < deadline, f"{node}: eligibility {got}, not {want}"
        time.sleep(0.05)


def start_three(net, **kw):
    etcd = Etcd(net, net.host("e1"))
    n1 = Node(net, net.host("n1"), etcd, "n1", **kw)
    n1.wait_event("up")
    n2 = Node(net, net.host("n2"), etcd, "n2", **kw)
    n3 = Node(net, net.host("n3"), etcd, "n3", **kw)
    for n in (n2, n3):
        n.wait_event("following", lambda e: e["epoch"] == 1)
    # a write makes both standbys catch up with a commit of term 1
    assert n1.client(timeout=15).set("first", "1") is True
    wait_insync(etcd, lambda s: s["epoch"] == 1 and sorted(s["standbys"]) == ["n2", "n3"])
    return etcd, n1, n2, n3


def first_elected(nodes, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for n in nodes:
            got = n.events("elected")
            if got:
                return n, got[0]
        time.sleep(0.02)
    raise AssertionError("no standby was elected")


def test_three_nodes_early_takeover_and_incremental_rejoin(net):
    """kill -9 of the primary's host under load, 3 nodes, a 10 s lease: a
    standby takes the term through the early path while the old lease is
    still granted, although another standby is connected too; that other
    standby rejoins the new primary incrementally across the term change
    and is added to the new term's in-sync set; writes are acknowledged
    again with it; no acknowledged write is lost, none came from the old
    primary after the new term began."""
    etcd, n1, n2, n3 = start_three(net, lease_ttl=10)
    # each standby's own report says it may be elected (reports lag a bit)
    for n in ("n2", "n3"):
        wait_eligibility(etcd, n, {"eligible": True})
    human = sh(REKINDLE, "cluster", "status", "--cluster", etcd.url, "rkv").stdout
    assert "in sync (epoch 1): n2 n3" in human, human
    rows = {ln.split()[0]: ln for ln in human.splitlines()[2:]}
    assert " yes " in rows["n2"] and " yes " in rows["n3"], human
    old_lease = leader_lease(etcd)
    hist, stop = History(), threading.Event()
    ths = writers(n1, hist, stop)
    wait_acks(hist, 300)
    n1.host.kill()
    for t in ths:
        t.join(timeout=30)
    new, elected = first_elected([n2, n3])
    other = n3 if new is n2 else n2
    left = lease_ttl_left(etcd, old_lease)
    assert left > 0, f"the old primary's lease is gone ({left}): the takeover did not beat it"
    assert elected["epoch"] == 2 and elected["via"] == "heartbeat_timeout", elected
    took = new.wait_event("takeover", lambda e: e["code"] == "took_over")
    assert took["from"] == "n1" and took["epoch"] == 2
    assert not [e for e in new.events("takeover") if e["code"] == "other_standbys"]
    new.wait_event("up", lambda e: e["t_ns"] > elected["t_ns"])
    assert not other.events("elected"), "two standbys elected"

    # the other standby resumes from the common snapshot, not whole
    fol = other.wait_event("following", lambda e: e["epoch"] == 2, timeout=30)
    assert fol["sync"] == "incremental_after_term_change", fol
    joined = new.wait_event("standby_joined", lambda e: e["standby"] == other.id, timeout=30)
    assert joined["sync"] == "incremental_after_term_change", joined
    assert not other.events("diverged_tail_dropped") or all(
        e["count"] > 0 for e in other.events("diverged_tail_dropped")
    )
    # the new term started with an empty set; the other standby is added
    # once it has caught up, and writes are acknowledged with it
    c = new.client(timeout=15)
    assert c.set("after", "1") is True
    s = wait_insync(etcd, lambda s: s["epoch"] == 2 and other.id in s["standbys"])
    assert s["standbys"] == [other.id], s
    changed = new.wait_event("insync_changed", lambda e: other.id in e["added"])
    assert changed["epoch"] == 2
    assert c.set("after2", "2") is True
    print(f"{hist.count()} acknowledged writes before the kill; {new.id} took over")
    assert check_no_acked_write_lost(hist, new.client(timeout=10)) == hist.count()
    check_no_ack_from_deposed(hist, f"{n1.host.ip}:{n1.port}", elected["t_ns"])
    # the rejoined store is complete: after a failover to it, every write is there
    st = cluster_status(etcd)
    assert st["insync"] == {"epoch": 2, "standbys": [other.id], "primary": new.id}


def test_insync_shrinks_and_only_members_may_take_over(net):
    """n3 is cut off from the primary (not from etcd) under load: the
    primary writes it out of the in-sync set, then acknowledges with n2
    alone; n3 reports itself ineligible (not_in_sync).  The primary's host
    is killed: n2 takes the term; n3, ineligible, never campaigns and is
    never elected; n3 then follows the new primary."""
    etcd, n1, n2, n3 = start_three(net, lease_ttl=10)
    n1.host.block(n3.host)
    hist, stop = History(), threading.Event()
    ths = writers(n1, hist, stop, seconds=60)
    s = wait_insync(etcd, lambda s: s["standbys"] == ["n2"])
    assert s["epoch"] == 1
    dropped = n1.wait_event("insync_changed", lambda e: "n3" in e["dropped"])
    assert dropped["code"] in ("standby_behind", "standby_gone"), dropped
    # acknowledged after the removal: n2's acknowledgement sufficed
    n = hist.count()
    wait_acks(hist, n + 100)

    wait_eligibility(etcd, "n3", {"eligible": False, "reason": "not_in_sync"})
    n1.host.kill()
    stop.set()
    for t in ths:
        t.join(timeout=30)
    elected = n2.wait_event("elected", timeout=30)
    assert elected["epoch"] == 2, elected
    n2.wait_event("up", lambda e: e["t_ns"] > elected["t_ns"])
    # n3 suspected the same primary, but was out of the set: it found
    # itself ineligible (not_in_sync) before the new term, and never
    # campaigned (a takeover attempt would have left `raced` or `took_over`;
    # `ineligible`: it read etcd between the new term's keys)
    n3.wait_event("primary_suspect", lambda e: e["epoch"] == 1 and e["path"] == "early_takeover")
    inel = n3.wait_event("ineligible", lambda e: e["code"] == "not_in_sync")
    assert inel["t_ns"] < elected["t_ns"], (inel, elected)
    codes = {e["code"] for e in n3.events("takeover")}
    assert codes <= {"watching_etcd", "primary_alive_in_etcd", "not_in_sync", "ineligible"}, codes
    assert not n3.events("elected")
    assert cluster_status(etcd)["leader"]["node"] == "n2"
    assert check_no_acked_write_lost(hist, n2.client(timeout=10)) == hist.count()
    check_no_ack_from_deposed(hist, f"{n1.host.ip}:{n1.port}", elected["t_ns"])
    # healed (n1 is gone): n3 follows term 2, is added, writes go on with it
    n1.host.unblock(n3.host)
    n3.wait_event("following", lambda e: e["epoch"] == 2, timeout=30)
    assert n2.client(timeout=15).set("after", "1") is True
    wait_insync(etcd, lambda s: s["epoch"] == 2 and "n3" in s["standbys"])
    assert not n3.events("elected")


def test_the_primary_restarted_alone_may_take_the_next_term(net):
    """Two nodes: the standby's host dies (it stays the set's last member),
    then the primary's.  The primary, started again alone, is not named in
    the set, but it was the newest term's primary and holds every write it
    acknowledged: it takes term 2.  The standby, back, resumes from the
    common snapshot of term 1 and the acknowledged writes are all there."""
    etcd = Etcd(net, net.host("e1"))
    n1 = Node(net, net.host("n1"), etcd, "n1")
    n1.wait_event("up")
    n2 = Node(net, net.host("n2"), etcd, "n2")
    n2.wait_event("following", lambda e: e["epoch"] == 1)
    c = n1.client(timeout=15)
    for i in range(20):
        assert c.set(f"k{i}", str(i)) is True
    wait_insync(etcd, lambda s: s == {"epoch": 1, "standbys": ["n2"], "primary": "n1"})
    n2.host.kill()
    n1.host.kill()
    n1.start()
    elected = n1.wait_event("elected", lambda e: e["epoch"] == 2, timeout=30)
    assert elected["via"] == "no_leader", elected
    assert not [e for e in n1.events("ineligible") if e["t_ns"] < elected["t_ns"]
                and e["code"] == "not_in_sync" and "newest: 1" in e["why"]]  # fmt: skip
    n1.wait_event("up", lambda e: e["t_ns"] > elected["t_ns"])
    n2.start()
    fol = n2.wait_event("following", lambda e: e["epoch"] == 2, timeout=30)
    assert fol["sync"] == "incremental_after_term_change", fol
    c = n1.client(timeout=15)
    assert c.set("after", "1") is True
    assert [c.get(f"k{i}") for i in range(20)] == [str(i).encode() for i in range(20)]
    wait_insync(etcd, lambda s: s == {"epoch": 2, "standbys": ["n2"], "primary": "n1"})
