"""Location indexes (issue 13, restore speed; docs/store.md, "Location
indexes"): the snapshot engine writes `snapshots/<id>.loc` for its newest
snapshot off the app's path, and `rekindle restore` finds every page's chunk
through it instead of folding the chain's maps and reading the packs'
indexes.  An index that is missing, torn, damaged or stale is refused with a
reason code (the restore event's `index`, and a line on stderr) and the
restore folds the chain as before: every key comes back either way.
`rekindle verify` checks an index against its snapshot; `rekindle gc`
removes it with its snapshot."""

import json
import shutil

from rkv_harness import Rkv
from test_lazy_restore import wait_event
from test_snapshots import DEBUG_ON, checkpoint, kill_stack, rekindle, restored, snapshotting

KEYS = 20000


def value(i, gen):
    return f"v{gen}-{i}-" + "y" * (i % 89)


def load(c, keys, gen):
    for k in range(0, len(keys), 1000):
        p = c.pipeline(transaction=False)
        for i in keys[k : k + 1000]:
            p.set(f"key:{i}", value(i, gen))
        p.execute()


def indexed(r, sid, timeout=60):
    """Until the engine says it wrote the index of snapshot sid."""
    e = wait_event(r, "location_index", lambda e: e.get("id") == sid, timeout=timeout)
    assert e["code"] == "index_written", e
    return e


def loaded_store(tmp_path):
    """A chain of a full snapshot and a delta, the delta indexed; keeps a
    copy of the full snapshot's index (the engine removes it once the
    delta's is written).  The stack that wrote it is gone."""
    store = tmp_path / "store"
    r = snapshotting(tmp_path / "writer", store)
    c = r.client()
    load(c, range(KEYS), 1)
    full = checkpoint(r)
    assert full["full"], full
    indexed(r, full["id"])
    old_index = tmp_path / "full.loc"
    shutil.copy(store / "snapshots" / f"{full['id']}.loc", old_index)
    # a delta: a tenth of the keys rewritten, some deleted
    load(c, range(0, KEYS, 10), 2)
    c.delete(*[f"key:{i}" for i in range(5, KEYS, 100)])
    delta = checkpoint(r)
    assert not delta["full"] and delta["parent"] == full["id"], delta
    indexed(r, delta["id"])
    kill_stack(r)
    assert not (store / "snapshots" / f"{full['id']}.loc").exists(), "the older index is removed"
    return store, full["id"], delta["id"], old_index


def expected(i):
    if i % 100 == 5:
        return None
    return value(i, 2 if i % 10 == 0 else 1).encode()


def check_every_key(r):
    c = r.client()
    got = []
    for k in range(0, KEYS, 2000):
        p = c.pipeline(transaction=False)
        for i in range(k, min(k + 2000, KEYS)):
            p.get(f"key:{i}")
        got += p.execute()
    bad = [i for i, v in enumerate(got) if v != expected(i)]
    assert not bad, f"{len(bad)} keys wrong, first {bad[:5]}"
    assert c.dbsize() == KEYS - len(range(5, KEYS, 100))


def restore_event(r):
    e = wait_event(r, "restore", lambda e: True)
    return e


def lazily(tmp_path, store):
    """A lazy restore that writes no snapshot (the store stays as it is)."""
    sup = ("restore", "--from", str(store), "--restore-pages", "lazy")
    return Rkv(tmp_path, *DEBUG_ON, supervised=True, sup=sup)


def restore_and_check(tmp_path, store, name, lazy=True):
    r = lazily(tmp_path / name, store) if lazy else restored(tmp_path / name, store)
    try:
        r.wait_serving()
        check_every_key(r)
        return restore_event(r), r.stderr()
    finally:
        r.close()


def verify(store):
    p = rekindle("verify", "--json", store, timeout=120)
    return p.returncode, json.loads(p.stdout)


def test_restores_through_the_index_or_fold_with_a_reason(tmp_path):
    store, full_id, delta_id, old_index = loaded_store(tmp_path)
    snaps = store / "snapshots"
    index = snaps / f"{delta_id}.loc"
    good = index.read_bytes()
    code, rep = verify(store)
    assert code == 0, rep

    # the newest snapshot's own index, lazily and eagerly
    for lazy in (True, False):
        ev, err = restore_and_check(tmp_path, store, f"used-{lazy}", lazy=lazy)
        assert ev["index"] == "index_used", ev
        assert ev["index_of"] == delta_id and ev["index_deltas"] == 0, ev
        assert "without a location index" not in err

    # an ancestor's index and the delta after it
    index.unlink()
    shutil.copy(old_index, snaps / f"{full_id}.loc")
    ev, _ = restore_and_check(tmp_path, store, "ancestor")
    assert ev["index"] == "index_used", ev
    assert ev["index_of"] == full_id and ev["index_deltas"] == 1, ev
    (snaps / f"{full_id}.loc").unlink()

    # none: the chain is folded, and the restore says why
    ev, err = restore_and_check(tmp_path, store, "missing")
    assert ev["index"] == "index_missing" and ev["index_of"] == "", ev
    assert "index_missing" in err

    # damaged: one flipped bit in the middle
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0x10
    index.write_bytes(bytes(bad))
    ev, err = restore_and_check(tmp_path, store, "corrupt")
    assert ev["index"] == "index_corrupt", ev
    assert "index_corrupt" in err and "checksum" in ev["index_detail"], ev
    code, rep = verify(store)
    assert code == 1 and any(e["code"] == "index_corrupt" for e in rep["errors"]), rep
    assert all(s["restorable"] for s in rep["snapshots"]), rep

    # torn: cut short
    index.write_bytes(good[:40])
    ev, _ = restore_and_check(tmp_path, store, "torn")
    assert ev["index"] == "index_truncated", ev

    # stale: the index of another version of the manifest (a full one's
    # index put under the delta's name)
    shutil.copy(old_index, index)
    ev, _ = restore_and_check(tmp_path, store, "stale")
    assert ev["index"] == "index_stale", ev

    # a corrupt index whose older sibling is sound: that one is used
    index.write_bytes(bytes(bad))
    shutil.copy(old_index, snaps / f"{full_id}.loc")
    ev, _ = restore_and_check(tmp_path, store, "older")
    assert ev["index"] == "index_used" and ev["index_of"] == full_id, ev
    assert "index_corrupt" in ev["index_detail"], ev

    # gc: the newest snapshot's index stays, the deleted one's goes, and a
    # rewritten snapshot's (stale) index goes
    index.write_bytes(good)
    p = rekindle("gc", store, "--keep", "1", timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert not (snaps / f"{full_id}.loc").exists()
    left = sorted(x.name for x in snaps.glob("*.loc"))
    assert left == [] or left == [f"{delta_id}.loc"], left
    code, rep = verify(store)
    assert code == 0, rep


def test_the_index_of_a_deleted_snapshot_is_a_leftover(tmp_path):
    store, full_id, delta_id, old_index = loaded_store(tmp_path)
    (store / "snapshots" / f"{full_id}.json").rename(tmp_path / "gone.json")
    shutil.copy(old_index, store / "snapshots" / "000000000999-20261124T000000Z.loc")
    code, rep = verify(store)
    assert any(p.endswith("000000000999-20261124T000000Z.loc") for p in rep["leftovers"]), rep
    p = rekindle("gc", store, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert not (store / "snapshots" / "000000000999-20261124T000000Z.loc").exists()
