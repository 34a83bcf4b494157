"""Review of the first snapshot after a restore being a delta of the
restored snapshot (snapshot/baseline.rs, cut.rs copy_changed): in each
case below the delta must restore to the app's arena byte for byte (read
live through /proc right after the cut, the app idle), and name the right
parent.  rkv under `rekindle run --snapshot-dir` (a run from its store
restores its newest snapshot), through unmodified redis-py."""

import contextlib
import json
import os
import signal
import subprocess
import threading
import time

import pytest
import redis
from rkv_harness import Rkv
from supervisor_harness import REKINDLE

DEBUG_ON = ("--enable-debug", "yes")  # DEBUG SEGFAULT, for a crash in place
BIG = b"PUNCHME-" * (4 << 17)  # 4 MiB: freeing it punches pages out of the memfd


def rekindle(*args, env=None, timeout=60):
    return subprocess.run(
        [str(REKINDLE), *map(str, args)],
        capture_output=True, text=True, timeout=timeout, env=env, check=False,
    )  # fmt: skip


def snapshotting(tmp_path, store, *extra, interval="0"):
    return Rkv(
        tmp_path, *DEBUG_ON, supervised=True,
        sup=("run", "--snapshot-dir", str(store), "--snapshot-interval", interval, *extra),
    )  # fmt: skip


def checkpoint(r, *tags):
    # a checkpoint before the incarnation's agent said HELLO is refused
    # (agent_not_ready): wait for it
    pid, deadline = r.app_pid(), time.monotonic() + 15
    while not [e for e in r.supervisor_events("snapshot_agent") if e.get("pid") == pid]:
        assert time.monotonic() < deadline, "no snapshot agent"
        time.sleep(0.01)
    args = ["checkpoint", "rkv", "--wait", "--json"]
    for t in tags:
        args += ["--tag", t]
    p = rekindle(*args, env=r.env)
    assert p.returncode == 0, p.stdout + p.stderr
    reply = json.loads(p.stdout)
    assert reply["ok"] and reply["durable"], reply
    return reply


def kill_stack(r):
    """SIGKILL the supervisor and the app: nothing runs that holds a memfd."""
    app = r.app_pid()
    os.kill(r.proc.pid, signal.SIGKILL)
    os.kill(app, signal.SIGKILL)
    r.proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(app, 0)
        except ProcessLookupError:
            break
        time.sleep(0.01)
    r.close()


def sparse_read(path, length):
    """The first `length` bytes of a sparse file, reading its data extents."""
    out = bytearray(length)
    with open(path, "rb") as f:
        fd, at = f.fileno(), 0
        while at < length:
            try:
                start = os.lseek(fd, at, os.SEEK_DATA)
            except OSError:
                break
            if start >= length:
                break
            end = min(os.lseek(fd, start, os.SEEK_HOLE), length)
            out[start:end] = os.pread(fd, end - start, start)
            at = end
    return bytes(out)


def live_keyspace(r):
    """The app's keyspace arena now: (its memfd's size, its bytes)."""
    pid = r.app_pid()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/memfd:rekindle:keyspace "):
            path = f"/proc/{pid}/fd/{fd}"
            size = os.path.getsize(path)
            return size, sparse_read(path, size)
    raise AssertionError(f"no keyspace memfd in pid {pid}")


def exported_keyspace(tmp_path, store, snap_id, size):
    out = tmp_path / f"{snap_id}.bin"
    p = rekindle("store-export", f"{store}@{snap_id}", "--region", f"keyspace={out}")
    assert p.returncode == 0, p.stderr
    data = sparse_read(out, size)
    out.unlink()
    return data


def checkpoint_read_live(r):
    """A checkpoint, and the live keyspace arena read just before and just
    after it: (reply, size, before, after).  rkv may touch its arena in
    the background (a timer), so only pages equal in both reads are known
    to hold at the cut what they hold now."""
    s0, before = live_keyspace(r)
    reply = checkpoint(r)
    s1, after = live_keyspace(r)
    size = max(s0, s1)
    return reply, size, before.ljust(size, b"\0"), after.ljust(size, b"\0")


def same_bytes(what, got, before, after):
    """The snapshot's arena equals the live one on every page that did not
    change across the checkpoint (nearly all)."""
    pages = range(0, len(after), 4096)
    stable = [i for i in pages if before[i : i + 4096] == after[i : i + 4096]]
    assert len(stable) >= len(pages) - 16, f"{what}: {len(pages) - len(stable)} pages moved"
    bad = [i // 4096 for i in stable if got[i : i + 4096] != after[i : i + 4096]]
    if bad:
        pytest.fail(f"{what}: {len(bad)} pages differ from the live arena, first {bad[:10]}")


def fill(c, n=600):
    c.set("big", BIG)
    for i in range(0, n, 200):
        c.mset({f"k{j}": f"value {j} " + "x" * 300 for j in range(i, i + 200)})


def change_after_restore(c):
    """Frees the big value (its pages punched), zeroes nothing by hand but
    overwrites, deletes and adds keys."""
    c.delete("big")
    for j in range(0, 600, 7):
        c.set(f"k{j}", "changed")
    for j in range(1, 600, 11):
        c.delete(f"k{j}")
    for j in range(50):
        c.set(f"new{j}", "n" * 500)


def base_store(tmp_path):
    """A store whose newest snapshot holds `fill`'s keys; nothing runs."""
    store = tmp_path / "store"
    r = snapshotting(tmp_path / "a", store)
    try:
        fill(r.client())
        base = checkpoint(r)
    finally:
        kill_stack(r)
    return store, base


def test_the_first_delta_after_a_restore_is_the_arena_byte_for_byte(tmp_path):
    """Pages punched (a 4 MiB value freed), overwritten, and new after a
    restore: the delta of the restored snapshot holds the live arena."""
    store, base = base_store(tmp_path)
    again = snapshotting(tmp_path / "b", store)
    try:
        assert again.wait_log("ready")["start"] == "warm"
        c = again.client()
        # (not GET: rkv stops answering a connection after a 4 MiB reply)
        assert c.strlen("big") == len(BIG)
        change_after_restore(c)
        first, size, before, after = checkpoint_read_live(again)
    finally:
        kill_stack(again)
    assert first["base"] == "restored" and first["parent"] == base["id"], first
    assert after.count(b"PUNCHME-PUNCHME-") < BIG.count(b"PUNCHME-PUNCHME-")  # punched
    same_bytes("the first delta", exported_keyspace(tmp_path, store, first["id"], size), before, after)


def test_a_restored_app_that_crashes_before_its_first_snapshot(tmp_path):
    """The restored app changes its arena, dies in place and restarts warm
    before any snapshot: the baseline (what the memfds held at the restore)
    is still the parent's content, and the next incarnation's first
    snapshot, a delta of it, holds the arena as the new incarnation left it."""
    store, base = base_store(tmp_path)
    again = snapshotting(tmp_path / "b", store, "--crashloop-window", "0")
    try:
        assert again.wait_log("ready")["start"] == "warm"
        c = again.client()
        c.delete("big")
        for j in range(0, 600, 5):
            c.set(f"k{j}", "before the crash")
        with pytest.raises(redis.ConnectionError):  # the server died mid-reply
            c.execute_command("DEBUG", "SEGFAULT")
        c = again.wait_serving()
        assert c.get("k5") == b"before the crash" and c.get("big") is None
        for j in range(3, 600, 13):
            c.set(f"k{j}", "after the crash")
        first, size, before, after = checkpoint_read_live(again)
    finally:
        kill_stack(again)
    assert first["parent"] == base["id"], first
    assert first["base"] == "restored", first
    same_bytes("after a crash", exported_keyspace(tmp_path, store, first["id"], size), before, after)


def test_rollback_to_the_newest_then_to_an_older_snapshot(tmp_path):
    """A rollback to the newest snapshot: the next snapshot is a delta of
    it; a rollback to an older one: full (a delta would fork the line).
    Both hold the live arena."""
    store = tmp_path / "store"
    r = snapshotting(tmp_path / "a", store)
    try:
        c = r.client()
        fill(c)
        old = checkpoint(r, "old")
        c.delete("big")
        c.set("after-old", "1")
        newest = checkpoint(r)
        for what, spec, want_base, parent in (
            ("to the newest", newest["id"], "restored", newest["id"]),
            ("to an older one", "old", "none", None),
        ):
            pid = r.app_pid()
            p = rekindle("rollback", "rkv", spec, "--json", env=r.env)
            assert p.returncode == 0, p.stdout + p.stderr
            deadline = time.monotonic() + 15
            while r.app_pid() in (pid, None):
                assert time.monotonic() < deadline, "no restored incarnation"
                time.sleep(0.02)
            c = r.wait_serving()
            change_after_restore(c)
            snap, size, before, after = checkpoint_read_live(r)
            assert snap["base"] == want_base, (what, snap)
            if parent:
                assert snap["parent"] == parent, (what, snap)
            same_bytes(what, exported_keyspace(tmp_path, store, snap["id"], size), before, after)
        why = r.supervisor_events("snapshot_baseline")
        assert [(e["id"], e["code"]) for e in why] == [(old["id"], "baseline_not_newest")], why
    finally:
        r.close()


def test_retention_keeping_one_drops_the_restored_parent(tmp_path):
    """--snapshot-keep 1: once the first delta after a restore commits, its
    parent goes and the delta is rewritten full; it still holds the arena,
    and a restore of it gives the app's keys back."""
    store, base = base_store(tmp_path)
    again = snapshotting(tmp_path / "b", store, "--snapshot-keep", "1")
    try:
        c = again.client()
        change_after_restore(c)
        first, size, before, after = checkpoint_read_live(again)
        deadline = time.monotonic() + 15
        while (store / "snapshots" / f"{base['id']}.json").exists():
            assert time.monotonic() < deadline, "retention kept the parent"
            time.sleep(0.05)
    finally:
        kill_stack(again)
    assert first["base"] == "restored" and first["parent"] == base["id"], first
    same_bytes("after retention", exported_keyspace(tmp_path, store, first["id"], size), before, after)
    back = Rkv(tmp_path / "c", supervised=True, sup=("restore", "--from", str(store)))
    try:
        c = back.client()
        assert c.get("big") is None and c.get("k7") == b"changed" and c.get("k1") is None
        assert c.get("k2") == b"value 2 " + b"x" * 300 and c.get("new3") == b"n" * 500
    finally:
        back.close()


def test_the_first_delta_under_writes_is_a_consistent_cut(tmp_path):
    """While the first snapshot after a restore reads and hashes every page
    (and its cut follows), one client overwrites the restored keys in order,
    each write acknowledged: the delta restores exactly a prefix of those
    writes (a page hashed as unchanged and written after is reported by the
    agent and copied at the cut)."""
    store = tmp_path / "store"
    n = 40_000
    r = snapshotting(tmp_path / "a", store)
    try:
        c = r.client()
        for i in range(0, n, 2000):
            c.mset({f"k{j}": f"old {j} " + "o" * 300 for j in range(i, i + 2000)})
        checkpoint(r)
    finally:
        kill_stack(r)

    again = snapshotting(tmp_path / "b", store)
    stop = threading.Event()
    written = []

    def writer():
        w = again.client()
        for j in range(n):
            if stop.is_set():
                return
            w.set(f"k{j}", f"new {j}")
            written.append(j)

    try:
        again.client().ping()
        th = threading.Thread(target=writer)
        th.start()
        while len(written) < 200:
            time.sleep(0.005)
        first = checkpoint(again)
        time.sleep(0.2)
        stop.set()
        th.join(timeout=60)
        done = len(written)
    finally:
        kill_stack(again)
    assert first["base"] == "restored", first
    assert 0 < done < n, done

    back = Rkv(tmp_path / "c", supervised=True, sup=("restore", "--from", f"{store}@{first['id']}"))
    try:
        c = back.client()
        vals = c.mget([f"k{j}" for j in range(n)])
        new = [v.startswith(b"new ") for v in vals]
        m = new.index(False) if False in new else n
        assert all(new[:m]) and not any(new[m:]), f"not a prefix: {m} new then {sum(new[m:])} more"
        assert 200 <= m <= done, (m, done)
        assert vals[m - 1] == f"new {m - 1}".encode()
        assert m == n or vals[m] == f"old {m} ".encode() + b"o" * 300
    finally:
        back.close()


DURABLE = REKINDLE.parent.parent / "apps" / "durable"


def durable_stack(store, events, env, *app_args):
    """durable.c under `rekindle run` (snapshots on its rk_checkpoint
    requests; a run starts from its store's newest snapshot)."""
    return subprocess.Popen(
        [str(REKINDLE), "run", "--name", "durable", "--events", str(events),
         "--snapshot-dir", str(store), "--snapshot-interval", "0",
         "--", str(DURABLE), *app_args],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
    )  # fmt: skip


def kill_durable_stack(sup, events):
    sup.kill()
    sup.wait(timeout=10)
    pids = [json.loads(x)["pid"] for x in events.read_text().splitlines() if '"spawn"' in x]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    for pid in pids:  # gone, not only signalled: the next run reuses the name
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.01)


def lines_until(proc, prefix, seconds):
    """The app's lines up to the first that starts with prefix (read by a
    thread, so a stalled app does not block the test past `seconds`)."""
    got, done = [], threading.Event()

    def pump():
        for line in proc.stdout:
            got.append(line)
            if line.startswith(prefix):
                break
        done.set()

    threading.Thread(target=pump, daemon=True).start()
    done.wait(seconds)
    return list(got)


def durable_check(store, spec, env, tmp_path):
    """durable --check restored from `spec` (the newest if empty)."""
    err = tmp_path / "check.err"
    with open(err, "w") as e:
        back = subprocess.Popen(
            [str(REKINDLE), "restore", "--from", f"{store}@{spec}" if spec else str(store),
             "--name", "durable", "--events", str(tmp_path / "check.jsonl"), "--", str(DURABLE), "--check"],
            stdout=subprocess.PIPE, stderr=e, text=True, env=env,
        )  # fmt: skip
    try:
        lines = lines_until(back, '{"app":"check"', 30)
    finally:
        back.send_signal(signal.SIGTERM)
        back.wait(timeout=20)
    checks = [json.loads(x) for x in lines if x.startswith('{"app":"check"')]
    assert checks, (lines, err.read_text()[-2000:])
    return checks[0]


def test_a_refused_first_snapshot_after_a_restore_is_retried_as_a_delta(tmp_path):
    """The restored app's first snapshots are refused (an unsafe region held
    open 1.5 s, region_open) while it writes: the baseline is kept for the
    retry, which is a delta of the restored snapshot holding both what the
    snapshot had and what was written since."""
    store = tmp_path / "store"
    env = dict(os.environ, REKINDLE_RUNTIME_DIR=str(tmp_path / "run"))
    ev1 = tmp_path / "ev1.jsonl"
    sup = durable_stack(store, ev1, env, "--writes", "300", "--threads", "1")
    try:
        lines = lines_until(sup, '{"app":"done"', 60)
        assert any(x.startswith('{"app":"done"') for x in lines), lines[-3:]
    finally:
        kill_durable_stack(sup, ev1)
    base = durable_check(store, "", env, tmp_path)
    assert base["set"] == 300 and base["wrong"] == 0, base

    ev2 = tmp_path / "ev2.jsonl"
    sup = durable_stack(store, ev2, env, "--writes", "400", "--threads", "2", "--slow-region-ms", "1500")
    try:
        lines = lines_until(sup, '{"app":"done"', 60)
        assert any(x.startswith('{"app":"done"') for x in lines), lines[-3:]
    finally:
        kill_durable_stack(sup, ev2)
    events = [json.loads(x) for x in ev2.read_text().splitlines()]
    kinds = [e.get("supervisor") for e in events]
    assert "restore" in kinds, kinds
    failed = [i for i, e in enumerate(events) if e.get("supervisor") == "snapshot_failed"]
    snaps = [i for i, e in enumerate(events) if e.get("supervisor") == "snapshot"]
    assert failed and snaps and failed[0] < snaps[0], "the first snapshot was not refused first"
    assert {events[i]["code"] for i in failed} == {"region_open"}, [events[i] for i in failed]
    first = events[snaps[0]]
    assert first["base"] == "restored" and first["parent"] == base["restored"], first
    # the refused attempt's first report used the tracking from the restore's
    # mapping: the retry cannot claim it again, so it reads and compares
    assert first["tracked_from_map"] == 0 and first["unchanged_pages"] > 0, first
    got = durable_check(store, first["id"], env, tmp_path)
    assert got["wrong"] == 0 and got["set"] >= 300, got
    assert durable_check(store, "", env, tmp_path)["set"] == 400


def test_gc_between_the_restore_and_the_first_snapshot(tmp_path):
    """`rekindle gc --keep 1` on the store after the restore and before the
    first snapshot: the restored snapshot (the newest) stays, rewritten full
    as its parent goes; the first snapshot is still a delta of it and holds
    the live arena."""
    store = tmp_path / "store"
    r = snapshotting(tmp_path / "a", store)
    try:
        c = r.client()
        fill(c)
        checkpoint(r)
        c.set("k3", "in the second")
        second = checkpoint(r)
        assert not second["full"], second
    finally:
        kill_stack(r)
    again = snapshotting(tmp_path / "b", store)
    try:
        c = again.client()
        assert c.get("k3") == b"in the second"
        p = rekindle("gc", store, "--keep", "1", "--json")
        assert p.returncode == 0, p.stdout + p.stderr
        rep = json.loads(p.stdout)
        assert rep["kept"] == [second["id"]] and rep["rewritten"] == [second["id"]], rep
        change_after_restore(c)
        first, size, before, after = checkpoint_read_live(again)
    finally:
        kill_stack(again)
    assert first["base"] == "restored" and first["parent"] == second["id"], first
    same_bytes("after gc", exported_keyspace(tmp_path, store, first["id"], size), before, after)


def rollback(r, spec):
    pid = r.app_pid()
    p = rekindle("rollback", "rkv", spec, "--json", env=r.env)
    assert p.returncode == 0, p.stdout + p.stderr
    deadline = time.monotonic() + 15
    while r.app_pid() == pid:
        assert time.monotonic() < deadline, "no restored incarnation"
        time.sleep(0.02)
    return r.wait_serving()


def test_two_rollbacks_in_a_row_before_a_snapshot(tmp_path):
    """Two rollbacks to the newest snapshot with changes between them and
    no snapshot: the second baseline replaces the first, and the first
    snapshot after it is a delta of the newest holding the live arena."""
    store = tmp_path / "store"
    r = snapshotting(tmp_path / "a", store)
    try:
        fill(r.client())
        newest = checkpoint(r)
        c = rollback(r, newest["id"])
        change_after_restore(c)  # lost: the next rollback drops it
        c = rollback(r, newest["id"])
        assert c.strlen("big") == len(BIG) and c.get("new1") is None
        for j in range(0, 600, 3):
            c.set(f"k{j}", "third incarnation")
        c.delete("big")
        snap, size, before, after = checkpoint_read_live(r)
        assert snap["base"] == "restored" and snap["parent"] == newest["id"], snap
        same_bytes("two rollbacks", exported_keyspace(tmp_path, store, snap["id"], size), before, after)
    finally:
        r.close()
