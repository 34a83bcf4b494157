"""Interval snapshots that find nothing changed are not taken (issue 13,
speed: a read-mostly service should pay almost nothing for 10 ms
snapshots).  The first pre-copy round of an interval snapshot is a probe:
the agent says whether any page was written, any hole punched, any region
new, or the manifest or a preserved static changed since the last cut.  If
nothing was, the engine takes no snapshot and only publishes the app's
durable epoch (its state is the last snapshot's); the count is
`rekindle_snapshots_total{result="unchanged"}`.

- rkv under a read-only load takes no snapshot, its durable epoch still
  advances, and its next write is in the next snapshot and comes back from
  a restore after the stack is killed.
- A preserved static (RK_PRESERVED) changed without any arena write is not
  "unchanged": the probe compares the statics too, and a restore finds the
  last value.
- A static changed and put back while a probe scans does not pass for
  unchanged (the probe reads the statics before its scan, with no region
  open)."""

import json
import time

from rkv_harness import Rkv
from supervisor_harness import BUILD
from test_redo_api import Lines, check, kill, stack, supervise
from test_snapshots import rekindle, restored


def published(store):
    return len(json.loads(rekindle("snapshots", store, "--json").stdout)["snapshots"])


def durable_epoch(c):
    return int(c.info("persistence")["rekindle_durable_epoch"])


def settled(store, quiet=0.3, seconds=15):
    """The number of snapshots once no new one has come for `quiet` s."""
    n, since, deadline = published(store), time.monotonic(), time.monotonic() + seconds
    while time.monotonic() - since < quiet:
        assert time.monotonic() < deadline, "snapshots kept coming with nothing written"
        time.sleep(0.05)
        m = published(store)
        if m != n:
            n, since = m, time.monotonic()
    return n


def test_a_read_only_load_takes_no_snapshot_and_the_next_write_is_in_one(tmp_path):
    store = tmp_path / "store"
    r = Rkv(tmp_path / "a", "--durability", "async", supervised=True,
            sup=("run", "--snapshot-dir", str(store), "--snapshot-interval", "10ms"))  # fmt: skip
    try:
        c = r.client()
        for i in range(100):
            c.set(f"k{i}", f"v{i}")
        before = settled(store)
        epoch = durable_epoch(c)
        # GETs for about a second (100 intervals), INFO and misses included
        t0, n = time.monotonic(), 0
        while time.monotonic() - t0 < 1.0 and n < 200_000:
            p = c.pipeline(transaction=False)
            for i in range(100):
                p.get(f"k{i}")
            p.get("missing")
            assert p.execute()[0] == b"v0"
            n += 101
        assert published(store) == before, "a snapshot was taken though nothing was written"
        assert durable_epoch(c) > epoch, "the probes did not publish the durable epoch"
        stats = c.info("stats")
        assert stats["keyspace_hits"] >= 100 * (n // 101), stats  # counted, on the heap
        c.set("after", "written")
        deadline = time.monotonic() + 10
        while published(store) == before:
            assert time.monotonic() < deadline, "the write after the read-only load was never snapshotted"
            time.sleep(0.02)
        ok = [e for e in r.supervisor_events("snapshot") if e["id"]]
        assert ok, "no snapshot event"
    finally:
        r.close()
    back = restored(tmp_path / "b", store)
    try:
        c = back.client()
        assert c.get("after") == b"written" and c.get("k99") == b"v99"
    finally:
        back.close()


def test_a_static_changed_with_no_arena_write_is_snapshotted(tmp_path):
    store, ev = tmp_path / "store", tmp_path / "ev1.jsonl"
    sup = stack(tmp_path, store, ev, "--ticks", "10")
    try:
        got = Lines(sup).until(lambda x: x.startswith('{"app":"tick","n":10}'), 30)
        assert any(x.get("n") == 10 for x in got if x["app"] == "tick"), got[-3:]
        time.sleep(0.5)  # ten intervals of 50 ms after the last tick
    finally:
        kill(sup, ev)
    ev2 = tmp_path / "ev2.jsonl"
    got = check(stack(tmp_path, store, ev2, "--check"), ev2)
    assert got["ticks"] == 10, got


RACE = BUILD / "apps" / "statics_race"


def test_a_state_changed_and_put_back_during_a_probe_is_not_unchanged(tmp_path):
    """tests/apps/statics_race.c: A sets a preserved static and waits until
    its epoch is durable; B, as soon as the agent bumps the epoch past A's,
    puts the static back and writes a page the probe's scan has passed.  A
    probe that read the statics after its scan saw them as the last cut had
    them and said nothing had changed: A was acknowledged, and a restore
    came back to the cut before A (neither A's state nor A's and B's).  The
    probe reads them with no region open, before it scans.  A few tries,
    each a fresh stack killed at A's acknowledgement."""
    for i in range(5):
        store, ev = tmp_path / f"store{i}", tmp_path / f"ev{i}.jsonl"
        sup = supervise(tmp_path, ("run", "--snapshot-dir", store, "--snapshot-interval", "10ms"), ev, RACE,
                        name="race")  # fmt: skip
        try:
            got = Lines(sup).until(lambda x: x.startswith('{"app":"acked"'), 60)
        finally:
            kill(sup, ev)
        assert any(x["app"] == "acked" for x in got), got[-3:]
        ev2 = tmp_path / f"ev{i}b.jsonl"
        back = supervise(tmp_path, ("restore", "--from", store), ev2, RACE, "--check", name="race")
        try:
            lines = Lines(back).until(lambda x: x.startswith('{"app":"check"'), 60)
            state = [x for x in lines if x["app"] == "check"]
        finally:
            kill(back, ev2)
        assert state and state[0]["restored"], state
        s = (state[0]["s1"], state[0]["marker"])
        assert s in ((1, 0), (0, 42)), f"try {i}: restored {s}: A's acknowledged write is lost"

