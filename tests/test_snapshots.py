"""Durable snapshots (issue 13): rkv under `rekindle run --snapshot-dir`,
`rekindle checkpoint`, and `rekindle restore` after the whole stack is gone
(supervisor and app killed, so the memfds are gone too), through unmodified
redis-py."""

import contextlib
import json
import os
import queue
import re
import signal
import subprocess
import threading
import time

import pytest
import redis
from rkv_harness import Rkv
from supervisor_harness import REKINDLE


def rekindle(*args, env=None, timeout=60):
    return subprocess.run(
        [str(REKINDLE), *map(str, args)],
        capture_output=True, text=True, timeout=timeout, env=env, check=False,
    )  # fmt: skip


DEBUG_ON = ("--enable-debug", "yes")  # DEBUG SEGFAULT, for a crash in place


def snapshotting(tmp_path, store, *extra, interval="0"):
    return Rkv(
        tmp_path, *DEBUG_ON, supervised=True,
        sup=("run", "--snapshot-dir", str(store), "--snapshot-interval", interval, *extra),
    )  # fmt: skip


def restored(tmp_path, source, *extra):
    return Rkv(tmp_path, *DEBUG_ON, supervised=True, sup=("restore", "--from", str(source), *extra))


def checkpoint(r, *tags):
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


def test_checkpoint_then_restore_the_tagged_and_the_newest(tmp_path):
    store = tmp_path / "store"
    r = snapshotting(tmp_path / "a", store)
    c = r.client()
    for i in range(200):
        c.set(f"key{i}", f"value{i}")
    first = checkpoint(r, "t1")
    assert first["full"] and first["tags"] == ["t1"]
    c.set("after", "t1")
    c.delete("key0")
    second = checkpoint(r)
    assert not second["full"] and second["parent"] == first["id"], second
    assert second["stop_us"] < 1_000_000
    r.close()

    # a crash right after the start is not a crash loop here
    old = restored(tmp_path / "b", f"{store}@t1", "--crashloop-window", "0")
    try:
        c = old.client()
        assert c.get("key77") == b"value77"
        assert c.get("key0") == b"value0"
        assert c.get("after") is None
        assert c.dbsize() == 200
        up = old.supervisor_events("up")[-1]
        assert up["kind"] == "warm" and up["code"] == "restored", up
        assert up["reason"] == first["id"]
        # the restored app takes and survives its own crash warm
        with pytest.raises(redis.ConnectionError):  # the server died mid-reply
            c.execute_command("DEBUG", "SEGFAULT")
        c = old.wait_serving()
        assert c.get("key77") == b"value77"
    finally:
        old.close()

    new = restored(tmp_path / "c", store)
    try:
        c = new.client()
        assert c.get("after") == b"t1" and c.get("key0") is None
        assert c.dbsize() == 200
    finally:
        new.close()


def test_snapshots_go_on_after_an_in_place_warm_restart(tmp_path):
    """A fault restarts rkv in place (same pid, a new address space): the
    new incarnation's agent says HELLO on the same socket, and its first
    snapshot is full (what was written before its tracking began is not
    known)."""
    store = tmp_path / "store"
    r = snapshotting(tmp_path / "a", store, "--crashloop-window", "0", interval="50ms")
    try:
        c = r.client()
        c.set("a", "1")
        checkpoint(r)
        pid = r.app_pid()
        with pytest.raises(redis.ConnectionError):  # the server died mid-reply
            c.execute_command("DEBUG", "SEGFAULT")
        c = r.wait_serving()
        assert r.app_pid() == pid  # in place
        c.set("b", "2")
        deadline = time.monotonic() + 15
        while len(r.supervisor_events("snapshot_agent")) < 2:
            assert time.monotonic() < deadline, "no agent after the restart"
            time.sleep(0.02)
        after = checkpoint(r)
        assert after["ok"]
    finally:
        r.close()
    back = restored(tmp_path / "b", store)
    try:
        c = back.client()
        assert c.get("a") == b"1" and c.get("b") == b"2"
    finally:
        back.close()


def test_rollback_restarts_the_running_app_onto_an_earlier_snapshot(tmp_path):
    store = tmp_path / "store"
    r = snapshotting(tmp_path / "a", store)
    try:
        c = r.client()
        c.set("a", "1")
        first = checkpoint(r, "good")
        c.set("a", "2")
        c.set("b", "bad")
        checkpoint(r)
        pid = r.app_pid()
        bad = rekindle("rollback", "rkv", "no-such-tag", env=r.env)
        assert bad.returncode == 1 and "not_found" in bad.stderr, bad.stderr
        assert r.app_pid() == pid and c.get("a") == b"2"  # refused: nothing changed
        p = rekindle("rollback", "rkv", "good", "--json", env=r.env)
        assert p.returncode == 0, p.stdout + p.stderr
        assert json.loads(p.stdout)["id"] == first["id"]
        deadline = time.monotonic() + 15
        while not [e for e in r.supervisor_events("up") if e.get("code") == "restored"]:
            assert time.monotonic() < deadline, "no restored incarnation"
            time.sleep(0.02)
        c = r.wait_serving()
        assert c.get("a") == b"1" and c.get("b") is None
        assert r.app_pid() != pid
        # it goes on taking snapshots from the rolled-back state; the first
        # is full, not a delta of "good", whose delta would fork the line
        again = checkpoint(r)
        assert again["full"] and again["base"] == "none", again
        why = r.supervisor_events("snapshot_baseline")
        assert [(e["id"], e["code"]) for e in why] == [(first["id"], "baseline_not_newest")], why
    finally:
        r.close()


def test_a_crash_loop_restores_the_snapshot_from_before_the_loop(tmp_path):
    """Two deaths within the crash-loop window after a warm restart would
    make the next start cold (the preserved state may be what kills it);
    with a store, the supervisor starts it from the newest snapshot taken
    before the looping incarnation began instead, and says so."""
    store = tmp_path / "store"
    r = snapshotting(tmp_path / "a", store, "--crashloop-window", "5s")
    try:
        c = r.client()
        c.set("a", "1")
        snap = checkpoint(r)
        c.set("a", "2")  # in the arena, in no snapshot
        first = r.app_pid()
        os.kill(first, signal.SIGKILL)  # a warm restart: a == 2 still
        deadline = time.monotonic() + 15
        while r.app_pid() == first or not r.supervisor_events("up")[1:]:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert r.wait_serving().get("a") == b"2"
        os.kill(r.app_pid(), signal.SIGKILL)  # again within the window: a loop
        while len(r.supervisor_events("up")) < 3:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        up = r.supervisor_events("up")[-1]
        assert up["code"] == "restored" and up["reason"] == snap["id"], up
        decision = r.supervisor_events("decision")[-1]
        assert decision["code"] == "restored" and "crash" in decision["reason"], decision
        assert r.wait_serving().get("a") == b"1"
    finally:
        r.close()


def test_an_in_place_crash_loop_restores_the_snapshot_from_before_the_loop(tmp_path):
    """The same through the runtime's own in-place restarts (DEBUG
    SEGFAULT): the first is warm in place; the second, within the window,
    would exec itself cold; with a store the runtime dies instead and the
    supervisor starts it from the snapshot taken before the loop began."""
    store = tmp_path / "store"
    r = snapshotting(tmp_path / "a", store, "--crashloop-window", "5s")
    try:
        c = r.client()
        c.set("a", "1")
        snap = checkpoint(r)
        c.set("a", "2")
        with pytest.raises(redis.ConnectionError):
            c.execute_command("DEBUG", "SEGFAULT")
        assert r.wait_log("ready", count=2)["start"] == "warm"
        c = r.wait_serving()
        assert c.get("a") == b"2"
        with pytest.raises(redis.ConnectionError):
            c.execute_command("DEBUG", "SEGFAULT")
        ready = r.wait_log("ready", count=3)
        assert ready["start"] == "warm", ready
        handed = [e for e in r.runtime_events("restart") if e.get("mode") == "snapshot"]
        assert handed and handed[-1]["code"] == "crash_loop", r.runtime_events("restart")
        up = r.supervisor_events("up")[-1]
        assert up["code"] == "restored" and up["reason"] == snap["id"], up
        assert r.wait_serving().get("a") == b"1"
    finally:
        r.close()


def test_restore_after_the_stack_dies_under_load_keeps_a_prefix(tmp_path):
    """One client writes k0, k1, ... in order, each acknowledged, while
    snapshots are taken every 20 ms; the supervisor and the app are then
    SIGKILLed together.  The newest snapshot is a consistent cut, so what
    it restores is exactly a prefix of the writes, and it holds at least
    every write acknowledged before the last `checkpoint --wait`."""
    store = tmp_path / "store"
    r = snapshotting(tmp_path / "a", store, interval="20ms")
    c = r.client()
    n = 0
    durable_upto = 0
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline and n < 200_000:
        c.set(f"k{n}", n)
        n += 1
        if n == 3000:
            checkpoint(r)
            durable_upto = n
    assert durable_upto == 3000, "too few writes in 2 s"
    kill_stack(r)

    back = restored(tmp_path / "b", store)
    try:
        c = back.client()
        size = c.dbsize()
        assert durable_upto <= size <= n
        # a prefix: the last key it has, and the first it lacks
        assert c.get(f"k{size - 1}") == str(size - 1).encode()
        assert c.get(f"k{size}") is None
        sample = [0, durable_upto - 1, size // 2, size - 1]
        assert [c.get(f"k{i}") for i in sample] == [str(i).encode() for i in sample]
    finally:
        back.close()


def sparse_read(path, length):
    """The first `length` bytes of a (sparse) file, reading only its data
    extents: an exported arena is as large as its reservation (16 GiB)."""
    out = bytearray(length)
    with open(path, "rb") as f:
        fd, at = f.fileno(), 0
        while at < length:
            try:
                start = os.lseek(fd, at, os.SEEK_DATA)
            except OSError:
                break  # no data after `at`
            if start >= length:
                break
            end = min(os.lseek(fd, start, os.SEEK_HOLE), length)
            out[start:end] = os.pread(fd, end - start, start)
            at = end
    return bytes(out)


def live_arena(pid, name):
    """The app's arena memfd, opened again through /proc."""
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith(f"/memfd:rekindle:{name} "):
            return f"/proc/{pid}/fd/{fd}"
    raise AssertionError(f"no memfd for arena {name} in pid {pid}")


def test_a_snapshot_holds_the_arena_byte_for_byte_after_frees_and_punches(tmp_path):
    """After writes, a large value freed (the allocator punches most of its
    pages out of the memfd: no page table shows that, so the cut must learn
    it from the runtime) and more writes, the snapshot's arena equals the
    live memfd byte for byte, and its first snapshot still held the value."""
    store = tmp_path / "store"
    r = snapshotting(tmp_path / "a", store)
    c = r.client()
    marker = b"PUNCHME-" * (4 << 17)  # 4 MiB
    c.set("big", marker)
    for i in range(500):
        c.set(f"k{i}", f"v{i}" * 20)
    one = checkpoint(r)
    c.delete("big")
    for i in range(0, 500, 3):
        c.set(f"k{i}", "changed")
    two = checkpoint(r)
    live_path = live_arena(r.app_pid(), "keyspace")
    size = os.path.getsize(live_path)
    live = sparse_read(live_path, size)
    r.close()

    def keyspace(snap_id):
        out = tmp_path / f"{snap_id}.bin"
        p = rekindle("store-export", f"{store}@{snap_id}", "--region", f"keyspace={out}")
        assert p.returncode == 0, p.stderr
        data = sparse_read(out, size)
        out.unlink()
        return data

    assert b"PUNCHME-PUNCHME-" in keyspace(one["id"])
    snap = keyspace(two["id"])
    assert live.count(b"PUNCHME-PUNCHME-") < marker.count(b"PUNCHME-PUNCHME-")  # punched
    assert snap == live


def test_snapshot_commands_refuse_what_they_cannot_do(tmp_path):
    plain = Rkv(tmp_path / "plain", supervised=True)
    try:
        p = rekindle("checkpoint", "rkv", "--wait", env=plain.env)
        assert p.returncode == 1
        assert "snapshots_off" in p.stderr
    finally:
        plain.close()

    missing = rekindle("restore", "--from", tmp_path / "nowhere", "--name", "x", "--", "/bin/true")
    assert missing.returncode == 1 and "not_found" in missing.stderr, missing.stderr

    # a store with no snapshot yet (a cut before the first one was durable)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "FORMAT").write_text("rekindle-store\nversion 1\n")
    empty = rekindle("restore", "--from", tmp_path / "empty", "--name", "x", "--", "/bin/true")
    assert empty.returncode == 1, empty.stderr
    assert "any snapshot (the store is empty) not found" in empty.stderr, empty.stderr

    # a store whose only pack is damaged: refused, nothing started
    store = tmp_path / "store"
    r = snapshotting(tmp_path / "a", store)
    r.client().set("a", "1")
    checkpoint(r)
    r.close()
    pack = next((store / "packs").iterdir())
    data = bytearray(pack.read_bytes())
    data[len(data) // 2] ^= 0xFF
    pack.write_bytes(bytes(data))
    bad = rekindle("restore", "--from", store, "--name", "x", "--", "/bin/true")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "cannot restore" in bad.stderr

    usage = rekindle("run", "--snapshot-interval", "1s", "--", "/bin/true")
    assert usage.returncode == 2  # --snapshot-interval needs --snapshot-dir
    bad_restore_options = [
        ("--restore-pages", "sometimes"),
        ("--restore-fill-rate", "-5"),
        ("--restore-fill-rate", "fast"),
    ]
    for bad in bad_restore_options:
        p = rekindle("restore", "--from", store, *bad, "--", "/bin/true")
        assert p.returncode == 2 and f"'{bad[1]}'" in p.stderr, p.stderr  # the error names it


DURABLE = REKINDLE.parent.parent / "apps" / "durable"


def durable_stack(store, events, env, *app_args, sup_args=(), stderr=subprocess.DEVNULL):
    """durable.c under `rekindle run --snapshot-interval 0` (snapshots on its
    rk_checkpoint requests), its stdout a text pipe."""
    return subprocess.Popen(
        [str(REKINDLE), "run", "--name", "durable", "--events", str(events),
         "--snapshot-dir", str(store), "--snapshot-interval", "0", *sup_args,
         "--", str(DURABLE), *app_args],
        stdout=subprocess.PIPE, stderr=stderr, text=True, env=env,
    )  # fmt: skip


def kill_durable_stack(sup, events):
    """SIGKILL to the supervisor and to every app it spawned."""
    sup.kill()
    sup.wait(timeout=10)
    for e in [json.loads(x) for x in events.read_text().splitlines() if '"spawn"' in x]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(e["pid"], signal.SIGKILL)


def test_no_acknowledged_write_is_lost_when_the_stack_dies(tmp_path):
    """The durable test app acknowledges each write only once the snapshot
    that holds it is on disk (rk_epoch, rk_checkpoint, rk_durable_epoch:
    group commit across 4 threads).  The supervisor and the app are
    SIGKILLed in the middle; the restored app has every acknowledged write."""
    store = tmp_path / "store"
    env = dict(os.environ, REKINDLE_RUNTIME_DIR=str(tmp_path / "run"))
    sup = durable_stack(store, tmp_path / "ev1.jsonl", env, "--writes", "100000", "--threads", "4")
    acked = set()
    deadline = time.monotonic() + 30
    while len(acked) < 400 and time.monotonic() < deadline:
        line = sup.stdout.readline()
        if not line:
            break
        if line.startswith('{"app":"acked"'):
            acked.add(json.loads(line)["i"])
    assert len(acked) >= 400, f"only {len(acked)} writes acknowledged in 30 s"
    spawn = [json.loads(x) for x in (tmp_path / "ev1.jsonl").read_text().splitlines() if x.endswith("}")]
    app = [e for e in spawn if e.get("supervisor") == "spawn"][-1]["pid"]
    os.kill(sup.pid, signal.SIGKILL)
    os.kill(app, signal.SIGKILL)
    # acknowledgements already written to the pipe before the kill count too
    acked |= {json.loads(x)["i"] for x in sup.stdout.read().splitlines() if x.startswith('{"app":"acked"')}
    sup.wait(timeout=10)

    back = subprocess.Popen(
        [str(REKINDLE), "restore", "--from", str(store), "--name", "durable",
         "--events", str(tmp_path / "ev2.jsonl"), "--", str(DURABLE), "--check"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
    )  # fmt: skip
    try:
        line = back.stdout.readline()
        while line and not line.startswith('{"app":"check"'):
            line = back.stdout.readline()
        assert line, f"the restore did not start the app: {(tmp_path / 'ev2.jsonl').read_text()[-2000:]}"
        check = json.loads(line)
        assert check["app"] == "check" and check["restored"], check
        assert check["wrong"] == 0
        # every acknowledged write is there (more may be: written and
        # snapshotted, but not yet acknowledged when the stack died)
        assert check["set"] >= len(acked)
        lost = [i for i in acked if not any(a <= i < b for a, b in check["ranges"])]
        assert not lost, f"{len(lost)} acknowledged writes lost, first {sorted(lost)[:5]}"
        # each thread wrote its slice in order: a consistent cut holds a prefix of each
        assert len(check["ranges"]) <= 4, check["ranges"]
    finally:
        back.send_signal(signal.SIGTERM)
        back.wait(timeout=20)


def test_run_starts_from_the_newest_snapshot_of_its_store(tmp_path):
    """After a reboot the same `rekindle run --snapshot-dir DIR` brings the
    app back from its store (--start-from newest, the default); --start-from
    empty starts without it; a store that cannot be read is refused, not
    replaced by an empty start."""
    store = tmp_path / "store"
    r = snapshotting(tmp_path / "a", store)
    r.client().set("k", "before the reboot")
    checkpoint(r)
    kill_stack(r)

    again = snapshotting(tmp_path / "b", store)
    try:
        assert again.wait_log("ready")["start"] == "warm"
        assert again.client().get("k") == b"before the reboot"
        ev = again.supervisor_events("restore")[-1]
        assert "starting from the newest" in ev["why"]
    finally:
        again.close()

    empty = snapshotting(tmp_path / "c", store, "--start-from", "empty")
    try:
        assert empty.wait_log("ready")["start"] == "fresh"
        assert empty.client().get("k") is None
    finally:
        empty.close()

    (store / "FORMAT").write_text("not a rekindle store\n")
    p = subprocess.run(
        [str(REKINDLE), "run", "--snapshot-dir", str(store), "--", "true"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert p.returncode == 1
    assert "cannot read the snapshot store" in p.stderr and "refusing to start" in p.stderr


def test_the_first_snapshot_after_a_restore_is_a_delta_of_it(tmp_path):
    """An app started from a snapshot holds that snapshot's pages: its first
    snapshot reads every page but stores only those that differ from it,
    as a delta of it, and that delta restores the app's data exactly."""
    store = tmp_path / "store"
    r = snapshotting(tmp_path / "a", store)
    try:
        c = r.client()
        for i in range(0, 4000, 500):
            c.mset({f"k{j}": f"value {j} " + "x" * 200 for j in range(i, i + 500)})
        base = checkpoint(r)
    finally:
        kill_stack(r)

    again = snapshotting(tmp_path / "b", store)
    try:
        assert again.wait_log("ready")["start"] == "warm"
        c = again.client()
        c.set("k7", "changed after the restore")
        c.delete("k8")
        c.set("new", "written after the restore")
        first = checkpoint(again)
        assert not first["full"] and first["base"] == "restored", first
        assert first["parent"] == base["id"], (first, base)
        ev = [e for e in again.supervisor_events("snapshot") if e["id"] == first["id"]]
        assert ev and ev[0]["base"] == "restored", ev
        # the restore's arena was tracked from its mapping on: no page was
        # read whole, only the written ones were copied
        assert first["tracked_from_map"] >= 1 and first["unchanged_pages"] == 0, first
        print("copied", ev[0]["precopy_pages"], ev[0]["cut_pages"], "of", base["pages"])
        assert ev[0]["precopy_pages"] + ev[0]["cut_pages"] < base["pages"] / 4, (ev, base)
        # the next one is an ordinary delta of its parent
        c.set("k9", "later")
        second = checkpoint(again)
        assert second["parent"] == first["id"] and second["base"] == "parent", second
    finally:
        kill_stack(again)

    back = restored(tmp_path / "c", store)
    try:
        c = back.client()
        assert c.get("k7") == b"changed after the restore"
        assert c.get("k8") is None
        assert c.get("new") == b"written after the restore"
        assert c.get("k9") == b"later"
        for j in (0, 1, 1234, 3999):
            assert c.get(f"k{j}") == f"value {j} ".encode() + b"x" * 200, j
        assert c.dbsize() == 4000
    finally:
        back.close()


def test_an_arena_opted_out_of_snapshots_comes_back_empty_from_a_restore(tmp_path):
    """RK_ARENA_NO_SNAPSHOT (durable.c's "cache" arena counts its write
    runs): a warm restart keeps it; snapshots leave it out; a restore gives
    it back empty, says why, and restores the other arena whole."""
    store = tmp_path / "store"
    env = dict(os.environ, REKINDLE_RUNTIME_DIR=str(tmp_path / "run"))
    events = tmp_path / "ev1.jsonl"
    sup = durable_stack(store, events, env, "--writes", "300", "--threads", "1")

    def next_line(proc, prefix, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, f"the app's output ended before {prefix}"
            if line.startswith(prefix):
                return json.loads(line)
        pytest.fail(f"no {prefix} in {timeout} s")

    try:
        first = next_line(sup, '{"app":"arenas"')
        assert first == {"app": "arenas", "durable": False, "cache": False, "runs": 1}
        next_line(sup, '{"app":"done"')
        spawned = [json.loads(x) for x in events.read_text().splitlines() if '"spawn"' in x]
        os.kill(spawned[-1]["pid"], signal.SIGKILL)  # a warm restart keeps both arenas
        again = next_line(sup, '{"app":"arenas"')
        assert again == {"app": "arenas", "durable": True, "cache": True, "runs": 2}, again
        next_line(sup, '{"app":"done"')
        p = rekindle("checkpoint", "durable", "--wait", "--json", env=env)
        assert p.returncode == 0, p.stdout + p.stderr
        snap = json.loads(p.stdout)["id"]
    finally:
        kill_durable_stack(sup, events)
    names = re.findall(r'"name": "([^"]+)"', (store / "snapshots" / f"{snap}.json").read_text())
    assert "durable" in names and "cache" not in names, names

    app_log = tmp_path / "app2.log"
    with open(app_log, "w") as err:
        back = subprocess.Popen(
            [str(REKINDLE), "restore", "--from", str(store), "--name", "durable",
             "--events", str(tmp_path / "ev2.jsonl"), "--", str(DURABLE), "--check"],
            stdout=subprocess.PIPE, stderr=err, text=True, env=env,
        )  # fmt: skip
    try:
        arenas = next_line(back, '{"app":"arenas"')
        assert arenas == {"app": "arenas", "durable": True, "cache": False, "runs": 0}, arenas
        check = next_line(back, '{"app":"check"')
        assert check["set"] == 300 and check["wrong"] == 0 and check["restored"] == snap, check
        dropped = [json.loads(x) for x in app_log.read_text().splitlines() if '"arena_dropped"' in x]
        assert [(d["arena"], d["why"]) for d in dropped] == [
            ("cache", "not in snapshots (RK_ARENA_NO_SNAPSHOT): restored empty")
        ], dropped
    finally:
        back.send_signal(signal.SIGTERM)
        back.wait(timeout=20)


def lines_until(proc, prefix, seconds):
    """The app's lines up to the first that starts with prefix, or all it
    printed within seconds (a stalled app prints nothing: the lines are read
    by a thread, so the wait is bounded)."""
    q = queue.Queue()

    def pump():
        for line in proc.stdout:
            q.put(line)

    threading.Thread(target=pump, daemon=True).start()
    lines, deadline = [], time.monotonic() + seconds
    while not any(x.startswith(prefix) for x in lines):
        try:
            lines.append(q.get(timeout=max(0.0, deadline - time.monotonic())))
        except queue.Empty:
            break
    return lines


def test_an_arena_mapped_huge_is_tracked_in_small_pages(tmp_path):
    """A 2 MiB range mapped by one huge page when tracking begins (durable.c
    --huge collapses the one holding its slots, as a kernel with
    shmem_enabled=always maps memfds) would be reported as 512 written pages
    for one store: the agent maps it in small pages again, says so, and each
    snapshot of a one-slot write copies a few pages, not 512."""
    store = tmp_path / "store"
    env = dict(os.environ, REKINDLE_RUNTIME_DIR=str(tmp_path / "run"))
    events, app_log = tmp_path / "ev.jsonl", tmp_path / "app.log"
    with open(app_log, "w") as err:
        sup = durable_stack(
            store, events, env, "--writes", "200", "--threads", "1", "--huge",
            sup_args=("--snapshot-events", "every"), stderr=err,
        )  # fmt: skip
    try:
        lines = lines_until(sup, '{"app":"done"', 60)
        huge = next(json.loads(x) for x in lines if x.startswith('{"app":"huge"'))
        if not huge["collapsed"]:
            pytest.skip(f"this kernel does not collapse a memfd range (errno {huge['errno']})")
        assert any(x.startswith('{"app":"done"') for x in lines), "200 writes not done in 60 s"
    finally:
        kill_durable_stack(sup, events)
    split = [json.loads(x) for x in app_log.read_text().splitlines() if '"hugepages_split"' in x]
    assert [s["arena"] for s in split] == ["durable"], split
    assert split[0]["bytes"] >= 2 << 20
    snaps = [json.loads(x) for x in events.read_text().splitlines() if '"supervisor":"snapshot"' in x]
    later = snaps[1:]  # the first reads the new arena whole
    assert len(later) >= 100, len(later)
    copied = sorted(s["precopy_pages"] + s["cut_pages"] for s in later)
    assert copied[-1] < 512, f"a one-slot snapshot copied {copied[-1]} pages"


def test_a_snapshot_refused_while_a_region_stays_open_is_asked_again(tmp_path):
    """durable.c's writers wait for each write to be durable (rk_checkpoint)
    while another thread holds an unsafe region open for 1.5 s and never
    asks for a snapshot: the snapshots they asked for are refused
    (region_open: the freeze waits 50 ms) and the engine asks again, with a
    growing delay, until one is taken: every write is acknowledged instead of
    waiting for a request that never comes."""
    store = tmp_path / "store"
    env = dict(os.environ, REKINDLE_RUNTIME_DIR=str(tmp_path / "run"))
    events = tmp_path / "ev.jsonl"
    sup = durable_stack(store, events, env, "--writes", "20", "--threads", "2", "--slow-region-ms", "1500")
    try:
        lines = lines_until(sup, '{"app":"done"', 60)
        assert any(x.startswith('{"app":"done"') for x in lines), "writes not all acknowledged in 60 s"
    finally:
        kill_durable_stack(sup, events)
    acked = sorted(json.loads(x)["i"] for x in lines if x.startswith('{"app":"acked"'))
    assert acked == list(range(20))
    failed = [json.loads(x) for x in events.read_text().splitlines() if '"snapshot_failed"' in x]
    assert failed and {f["code"] for f in failed} == {"region_open"}, failed
    order = [x.split('"app":"')[1].split('"')[0] for x in lines if x.startswith('{"app":')]
    assert order.index("slow_region_closed") < order.index("acked"), order


def test_a_checkpoint_asked_before_the_apps_agent_started_waits_for_it(tmp_path):
    # The app's snapshot agent says HELLO a second after the spawn (a shell
    # that sleeps, then execs rkv).  A checkpoint asked meanwhile waits for
    # it (up to 5 s) instead of being refused with agent_not_ready: an app
    # may answer its first requests before its agent is heard from.
    from rkv_harness import RKV
    from supervisor_harness import free_port

    inherited = ("REKINDLE_MANIFEST_FD", "LISTEN_FDS", "LISTEN_PID", "NOTIFY_SOCKET")
    env = {k: v for k, v in os.environ.items() if k not in inherited}
    env["REKINDLE_RUNTIME_DIR"] = str(tmp_path / "run")
    events, port = tmp_path / "events.jsonl", free_port()
    late_rkv = ["/bin/sh", "-c", 'sleep 1; exec "$0" "$@"', str(RKV)]
    late_rkv += ["--port", str(port), "--dir", str(tmp_path)]
    argv = [str(REKINDLE), "run", "--name", "rkv", "--events", str(events),
            "--snapshot-dir", str(tmp_path / "store"), "--snapshot-interval", "0",
            "--listen", f"127.0.0.1:{port}", "--", *late_rkv]  # fmt: skip
    sup = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while '"spawn"' not in (events.read_text() if events.exists() else ""):
            assert time.monotonic() < deadline and sup.poll() is None, "no spawn"
            time.sleep(0.01)
        p = rekindle("checkpoint", "rkv", "--wait", "--json", env=env)
        assert p.returncode == 0, p.stdout + p.stderr
        reply = json.loads(p.stdout)
        assert reply["ok"] and reply["durable"] and reply["full"], reply
        evs = [json.loads(ln) for ln in events.read_text().splitlines()]
        asked = next(e["t_ns"] for e in evs if e.get("supervisor") == "spawn")
        hello = next(e["t_ns"] for e in evs if e.get("supervisor") == "snapshot_agent")
        assert hello - asked > 500_000_000, "the agent was not late: nothing was tested"
    finally:
        sup.terminate()
        sup.wait(timeout=20)
