"""rkv --durability none|async|sync on Rekindle's snapshots (issue 13):
with sync no acknowledged write is lost when the whole stack dies, with
async it may be (the control that shows the first test can fail); SAVE and
BGSAVE are checkpoints; the modes that need snapshots refuse to run without."""

import json
import subprocess
import threading
import time

import redis
from rkv_harness import RKV, Rkv
from supervisor_harness import free_port
from test_snapshots import kill_stack, rekindle


def durable_rkv(tmp_path, store, mode, interval="0"):
    return Rkv(
        tmp_path, "--durability", mode, supervised=True,
        sup=("run", "--snapshot-dir", str(store), "--snapshot-interval", interval),
    )  # fmt: skip


def restored(tmp_path, store):
    return Rkv(tmp_path, supervised=True, sup=("restore", "--from", str(store)))


def write_until_killed(r, threads=4, min_acks=600, seconds=20):
    """threads clients each SET their own keys in order; the stack is killed
    once min_acks replies came back.  Returns the acknowledged keys."""
    acked = [[] for _ in range(threads)]
    stop = threading.Event()

    def writer(t):
        c = r.client()
        for i in range(1_000_000):
            if stop.is_set():
                return
            try:
                c.set(f"t{t}:{i}", i)
            except redis.ConnectionError:
                return
            acked[t].append(i)

    ws = [threading.Thread(target=writer, args=(t,), daemon=True) for t in range(threads)]
    for w in ws:
        w.start()
    deadline = time.monotonic() + seconds
    while sum(map(len, acked)) < min_acks and time.monotonic() < deadline:
        time.sleep(0.01)
    # the acknowledgements counted so far, taken before the kill
    got = {t: list(a) for t, a in enumerate(acked)}
    kill_stack(r)
    stop.set()
    for w in ws:
        w.join(timeout=10)
    assert sum(map(len, got.values())) >= min_acks, f"only {sum(map(len, got.values()))} acks in {seconds} s"
    return got


def missing(client, acked):
    lost = []
    for t, ids in acked.items():
        if not ids:
            continue
        keys = [f"t{t}:{i}" for i in ids]
        for i, v in zip(ids, client.mget(keys), strict=True):
            if v != str(i).encode():
                lost.append((t, i))
    return lost


def test_sync_loses_no_acknowledged_write_when_the_stack_dies(tmp_path):
    """Four clients write; every reply waits for its snapshot (group
    commit, no snapshot interval: only the replies' checkpoints).  The
    supervisor and rkv are SIGKILLed mid-load: the store has every write
    that was acknowledged."""
    store = tmp_path / "store"
    r = durable_rkv(tmp_path / "a", store, "sync")
    acked = write_until_killed(r)
    back = restored(tmp_path / "b", store)
    try:
        c = back.client()
        assert back.wait_log("ready")["start"] == "warm"
        lost = missing(c, acked)
        assert not lost, f"{len(lost)} acknowledged writes lost, first {lost[:5]}"
    finally:
        back.close()


def test_async_replies_before_durable_and_can_lose_them(tmp_path):
    """The control: with async, replies do not wait; without a snapshot
    interval nothing after the last checkpoint is on disk, so the same kill
    loses acknowledged writes (what sync exists for)."""
    store = tmp_path / "store"
    r = durable_rkv(tmp_path / "a", store, "async")
    c = r.client()
    c.set("before", "1")
    assert c.save()  # a checkpoint, waited for
    acked = write_until_killed(r, threads=2, min_acks=400)
    back = restored(tmp_path / "b", store)
    try:
        c = back.client()
        assert c.get("before") == b"1"
        assert len(missing(c, acked)) > 0
    finally:
        back.close()


def snapshot_count(store):
    if not store.exists():
        return 0  # created by the first snapshot
    p = rekindle("snapshots", store, "--json")
    assert p.returncode == 0, p.stderr
    return len(json.loads(p.stdout)["snapshots"])


def test_save_and_bgsave_are_checkpoints(tmp_path):
    store = tmp_path / "store"
    r = durable_rkv(tmp_path / "a", store, "async")
    try:
        c = r.client()
        c.set("k", "v")
        before = snapshot_count(store)
        assert c.save()
        assert snapshot_count(store) > before  # durable when SAVE answered
        info = c.info("persistence")
        assert info["rekindle_durability"] == "async"
        assert info["rekindle_durable_epoch"] >= info["rekindle_write_epoch"] >= 1
        assert info["rdb_changes_since_last_save"] == 0
        n = snapshot_count(store)
        c.set("k2", "v2")
        assert c.bgsave()
        deadline = time.monotonic() + 10
        while snapshot_count(store) == n and time.monotonic() < deadline:
            time.sleep(0.05)
        assert snapshot_count(store) > n
        assert not (tmp_path / "a" / "rkv.snap").exists()  # rkv's own file is not written
        assert r.wait_log("durability")["mode"] == "async"
    finally:
        r.close()


def test_durability_modes_need_snapshots_and_a_valid_name(tmp_path):
    for mode in ("sync", "async"):
        p = subprocess.run(
            [str(RKV), "--port", str(free_port()), "--durability", mode, "--dir", str(tmp_path)],
            capture_output=True, text=True, timeout=20, check=False,
        )  # fmt: skip
        assert p.returncode == 1
        assert f"--durability {mode} needs Rekindle's snapshots" in p.stderr
        assert '"code":"no_snapshots"' in p.stderr
    p = subprocess.run(
        [str(RKV), "--durability", "always"], capture_output=True, text=True, timeout=20, check=False
    )
    assert p.returncode == 1 and "bad --durability 'always'" in p.stderr
