"""rkv --durability none|async|sync on Rekindle's snapshots (issue 13):
with sync no acknowledged write is lost when the whole stack dies, with
async it may be (the control that shows the first test can fail); SAVE and
BGSAVE are checkpoints; the modes that need snapshots refuse to run without."""

import contextlib
import errno
import json
import os
import random
import signal
import subprocess
import threading
import time

import pytest
import redis
from rkv_harness import RKV, Rkv
from supervisor_harness import free_port
from test_snapshots import checkpoint, kill_stack, rekindle


def durable_rkv(tmp_path, store, mode, interval="0", run_args=()):
    return Rkv(
        tmp_path, "--durability", mode, supervised=True,
        sup=("run", "--snapshot-dir", str(store), "--snapshot-interval", interval, *run_args),
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
        app = back.app_pid()
    finally:
        back.close()
    # the restore folded the journal (its fsyncs started the store's
    # threads) and still stops its app on SIGTERM: none is left running
    assert back.supervisor_events("stop"), "the supervisor did not stop on SIGTERM"
    assert not pid_alive(app), f"the restored app {app} outlived its supervisor"


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


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
        # tracked arenas stay in small pages (a huge page would be reported
        # written whole): the runtime's huge pages policy stops, and says so
        c.set("big", "x" * (8 << 20))
        deadline = time.monotonic() + 10
        while True:
            off = [e for e in r.runtime_events("hugepages") if e["state"] == "off"]
            if off or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert off and off[0]["errno"] == errno.EPERM, r.stderr()[-2000:]
        info = c.info("memory")
        assert info["arena_hugepages"] == "the keyspace is in durable snapshots (small pages)"
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


def test_a_crash_inside_a_mutation_restores_the_newest_snapshot_not_cold(tmp_path):
    """A crash inside an unsafe region would restart cold and drop the
    keyspace; with a store, the runtime leaves the restart to the
    supervisor, which starts rkv from the newest snapshot: with sync, every
    acknowledged write is there, and the half-done SET is not."""
    store = tmp_path / "store"
    r = Rkv(
        tmp_path / "a", "--durability", "sync", "--enable-debug", "yes", supervised=True,
        sup=("run", "--snapshot-dir", str(store), "--snapshot-interval", "0", "--crashloop-window", "0"),
    )  # fmt: skip
    try:
        c = r.client()
        for i in range(300):
            c.set(f"k{i}", i)
        with pytest.raises(redis.ConnectionError):
            c.execute_command("DEBUG", "CRASH-IN-MUTATION", "half-linked")
        ready = r.wait_log("ready", count=2)
        assert ready["start"] == "warm" and ready["keys"] == 300
        handed = [e for e in r.runtime_events("restart") if e.get("mode") == "snapshot"]
        assert handed and handed[-1]["code"] == "unsafe_region_open"
        cold = r.supervisor_events("cold_restore")
        assert not cold or cold[-1].get("result") != "failed", cold
        decision = [e for e in r.supervisor_events("decision") if e.get("code") == "restored"]
        assert decision and "unsafe" in decision[-1]["reason"], r.supervisor_events("decision")
        c = r.wait_serving()
        assert [c.get(f"k{i}") for i in (0, 150, 299)] == [b"0", b"150", b"299"]
        assert c.get("half-linked") is None and c.dbsize() == 300
        # the restore's memfds are sealed against shrinking as the runtime's
        # are, so a group commit's cut copies through the engine's views;
        # a memfd without the seal would be read with pread and logged
        # (the checkpoint after it: its events are written by then)
        for i in range(20):
            c.set(f"after{i}", i)
        checkpoint(r)
        assert not r.supervisor_events("snapshot_view"), r.supervisor_events("snapshot_view")
    finally:
        r.close()


class Call:
    """fn() on a thread of its own; .done after it returned, .value then."""

    def __init__(self, fn):
        self.value = self.error = None
        self.t = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self.t.start()

    def _run(self, fn):
        try:
            self.value = fn()
        except redis.RedisError as e:
            self.error = e

    def answered_within(self, seconds):
        self.t.join(seconds)
        return not self.t.is_alive()


def test_sync_holds_a_read_only_behind_writes_of_the_keys_it_reads(tmp_path):
    """With the snapshot engine stopped (the supervisor SIGSTOPped) a SET's
    reply waits for a snapshot that cannot come.  Meanwhile a GET of another
    key is answered, while a GET of the SET's key, an MGET naming it, and a
    command of no key (DBSIZE) wait like the SET.  Resumed, every one of
    them is answered, the held ones with the SET's value."""
    store = tmp_path / "store"
    r = durable_rkv(tmp_path / "a", store, "sync")

    def client():
        return r.client()  # a 20 s timeout: longer than the engine is stopped

    try:
        c = r.client()
        assert c.set("other", "1") is True and c.set("k", "old") is True
        os.kill(r.proc.pid, signal.SIGSTOP)
        try:
            setter = Call(lambda: client().set("k", "new"))
            assert not setter.answered_within(1.0), "a SET was acknowledged with no snapshot engine running"
            free = Call(lambda: client().get("other"))
            assert free.answered_within(10.0), "a GET of a key nobody writes waited for another key's write"
            assert free.value == b"1", free.error
            held = {
                "get k": Call(lambda: client().get("k")),
                "mget": Call(lambda: client().mget("other", "k")),
                "dbsize": Call(lambda: client().dbsize()),
            }
            for name, call in held.items():
                early = f"{name} was answered before the write it may read was durable"
                assert not call.answered_within(1.0), early
        finally:
            os.kill(r.proc.pid, signal.SIGCONT)
        assert setter.answered_within(30) and setter.value is True, setter.error
        for name, call in held.items():
            assert call.answered_within(30) and call.error is None, (name, call.error)
        assert held["get k"].value == b"new"
        assert held["mget"].value == [b"1", b"new"]
        assert held["dbsize"].value == 2
    finally:
        r.close()


def test_sync_holds_reads_of_every_key_written_past_the_pending_table(tmp_path):
    """More keys written while nothing becomes durable than rkv's table of
    pending keys holds (2,048): a GET of the first key written and of the
    last still wait for the write, then are answered with it."""
    store = tmp_path / "store"
    r = durable_rkv(tmp_path / "a", store, "sync")
    n = 5000
    try:
        c = r.client()
        assert c.set("other", "1") is True
        os.kill(r.proc.pid, signal.SIGSTOP)
        try:
            mset = Call(lambda: r.client().mset({f"k{i}": i for i in range(n)}))
            assert not mset.answered_within(1.0), "an MSET was acknowledged with no snapshot engine running"
            first = Call(lambda: r.client().get("k0"))
            last = Call(lambda: r.client().get(f"k{n - 1}"))
            assert not first.answered_within(1.0), "a read of a key written before the overflow went out"
            assert not last.answered_within(0.1), "a read of a key written after the overflow went out"
        finally:
            os.kill(r.proc.pid, signal.SIGCONT)
        assert mset.answered_within(30) and mset.value is True, mset.error
        assert first.answered_within(30) and first.value == b"0", first.error
        assert last.answered_within(30) and last.value == str(n - 1).encode(), last.error
        assert r.client().get("other") == b"1"
    finally:
        r.close()


def test_sync_does_not_spin_while_a_released_client_stays_silent(tmp_path):
    """After a write's reply is released, rkv waits a moment for that client's
    next command before asking for the next snapshot (group commit).  A client
    that never sends again must not keep rkv busy: idle, it uses little CPU."""
    store = tmp_path / "store"
    r = durable_rkv(tmp_path / "a", store, "sync")
    try:
        silent = r.client()
        assert silent.set("a", "1") is True  # released, then silent
        other = r.client()
        for i in range(20):  # writes while the silent one is still awaited
            assert other.set(f"b{i}", i) is True
        pid = r.app_pid()

        def cpu_s():
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

        c0 = cpu_s()
        time.sleep(2.0)
        used = cpu_s() - c0
        assert used < 0.5, f"rkv used {used:.2f} s of CPU in 2 s with nothing to do"
        assert silent.get("a") == b"1" and other.get("b19") == b"19"
    finally:
        r.close()


def journal_records(store):
    v = rekindle("verify", store, "--json")
    assert v.returncode == 0, v.stdout + v.stderr
    return json.loads(v.stdout)["journal"]["records"]


def spaced_sync_writes_stay_journaled_until_idle(tmp_path, run_args=()):
    """One client's SETs, 20 ms apart for 3 s, each a group commit of its
    own in the journal: none is folded meanwhile.  Once the writes stop,
    the idle engine folds them all.  Returns the store."""
    store = tmp_path / "store"
    r = durable_rkv(tmp_path / "a", store, "sync", run_args=run_args)
    try:
        c = r.client()
        n = 0
        t_end = time.monotonic() + 3.0
        while time.monotonic() < t_end:
            assert c.set(f"k{n}", n) is True
            n += 1
            time.sleep(0.02)
        held = journal_records(store)
        # the first writes may share the incarnation's first, full snapshot
        assert held >= n - 5, f"{n} writes, {held} journal records: folded while writes kept coming"
        deadline = time.monotonic() + 10
        while journal_records(store) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert journal_records(store) == 0, "the journal was not folded once the writes stopped"
        assert c.get(f"k{n - 1}") == str(n - 1).encode()
        deadline = time.monotonic() + 5
        while not (folds := r.supervisor_events("journal_folded")) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [f["when"] for f in folds] == ["idle"], folds
        assert folds[0]["records"] >= held and folds[0]["published"] >= 1, folds
        return store
    finally:
        r.close()


def test_sync_journal_is_folded_when_idle_not_between_writes(tmp_path):
    """A fold holds every reply for 100-250 ms; it used to run whenever the
    engine's poll timed out, such as when the location indexer's 2 s came
    due between two writes."""
    spaced_sync_writes_stay_journaled_until_idle(tmp_path)


def test_sync_with_snapshot_keep_journals_writes_and_keeps_n_once_idle(tmp_path):
    """--snapshot-keep's retention used to run after every snapshot, a
    journaled one too, and a gc folds the journal first: every sync write
    paid a fold and a gc.  Retention runs after published snapshots and
    idle folds now, and still leaves at most N."""
    store = spaced_sync_writes_stay_journaled_until_idle(tmp_path, ("--snapshot-keep", "2"))
    # the gc follows the fold that emptied the journal
    deadline = time.monotonic() + 10
    while (n := snapshot_count(store)) > 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert 1 <= n <= 2, f"{n} snapshots kept with --snapshot-keep 2"


def test_sync_after_a_warm_restart_holds_reads_until_the_inherited_state_is_durable(tmp_path):
    """A SET whose snapshot never came (the engine stopped) is in the arena
    when rkv is killed: the warm restart keeps it, but it is not durable, and
    its client had no reply.  Until this incarnation's first snapshot, a GET
    of that key, which would show the undurable value, waits."""
    store = tmp_path / "store"
    r = durable_rkv(tmp_path / "a", store, "sync")
    try:
        c = r.client()
        assert c.set("k", "old") is True
        app = r.app_pid()
        os.kill(r.proc.pid, signal.SIGSTOP)
        try:
            setter = Call(lambda: r.client().set("k", "new"))
            assert not setter.answered_within(1.0)
            os.kill(app, signal.SIGKILL)
        finally:
            os.kill(r.proc.pid, signal.SIGCONT)
        assert setter.answered_within(30) and setter.error is not None  # never acknowledged
        assert r.wait_log("ready", count=2)["start"] == "warm"
        t_stop = time.monotonic_ns()
        os.kill(r.proc.pid, signal.SIGSTOP)
        try:
            get = Call(lambda: r.client().get("k"))
            early = get.answered_within(1.0)
        finally:
            os.kill(r.proc.pid, signal.SIGCONT)
        assert get.answered_within(30) and get.value == b"new", get.error
        if early:
            # legitimate only if this incarnation's first snapshot was
            # published before the supervisor stopped: the engine may take
            # it at once (the request of the killed incarnation's held SET),
            # within milliseconds of the "ready" line this test waits for
            spawned = r.supervisor_events("spawn")[-1]["t_ns"]
            before_stop = [e for e in r.supervisor_events("snapshot") if spawned < e["t_ns"] < t_stop]
            assert before_stop, "a warm restart's undurable state was read before a snapshot"
    finally:
        r.close()


def write_until_aborted(r, threads=4, seconds=20):
    """threads clients SET their own keys in order until the supervisor
    dies (its store fault hook aborts it); then the app is killed.  Returns
    the acknowledged keys, counted when the supervisor was found dead."""
    acked = [[] for _ in range(threads)]

    def writer(t):
        c = r.client()
        for i in range(1_000_000):
            try:
                c.set(f"t{t}:{i}", i)
            except (redis.ConnectionError, redis.TimeoutError):
                return
            acked[t].append(i)

    ws = [threading.Thread(target=writer, args=(t,), daemon=True) for t in range(threads)]
    for w in ws:
        w.start()
    with contextlib.suppress(subprocess.TimeoutExpired):
        r.proc.wait(timeout=seconds)
    # no reply is released once the engine is gone: these are all of them
    got = {t: list(a) for t, a in enumerate(acked)}
    died = r.proc.poll()
    if died is None:
        kill_stack(r)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.kill(r.app_pid(), signal.SIGKILL)
        r.close()
    for w in ws:
        w.join(timeout=30)
    return got, died


def test_sync_journal_killed_at_every_point_loses_no_acknowledged_write(tmp_path):
    """rkv --durability sync's group commits go to the store's journal (one
    record, one fdatasync).  The supervisor is aborted just before its Nth
    store step (REKINDLE_STORE_FAULT_AT): while the journal is created,
    while a record is written, before its fdatasync.  A restore (which
    folds the journal first, ignoring a torn last record) finds every
    acknowledged write; the journal was really used (records folded)."""
    journal_aborts = 0
    folded = 0
    points = list(range(6, 70, 4))
    for n in points:
        store = tmp_path / f"store{n}"
        r = Rkv(
            tmp_path / f"a{n}", "--durability", "sync", supervised=True,
            env={"REKINDLE_STORE_FAULT_AT": str(n)},
            sup=("run", "--snapshot-dir", str(store), "--snapshot-interval", "0"),
        )  # fmt: skip
        r.wait_serving()
        acked, died = write_until_aborted(r)
        err = (r.dir / "rkv.err").read_text(errors="replace")
        assert died is not None, f"point {n}: the supervisor did not abort"
        if "aborting before journal-" in err:
            journal_aborts += 1
        if not any(acked.values()):
            continue  # aborted before the first snapshot: nothing was acknowledged
        back = restored(tmp_path / f"b{n}", store)
        try:
            c = back.client()
            assert back.wait_log("ready")["start"] == "warm", f"point {n}"
            lost = missing(c, acked)
            assert not lost, f"point {n}: {len(lost)} acknowledged writes lost, first {lost[:5]}"
            ev = back.supervisor_events("restore")[-1]
            if ev.get("journal") and ev["journal"]["records"] > 0:
                folded += 1
        finally:
            back.close()
    assert journal_aborts >= len(points) // 2, f"only {journal_aborts} aborts in the journal"
    assert folded >= len(points) // 2, f"only {folded} restores folded journal records"


def value_of(t, i):
    """3,000 bytes zstd cannot shrink, the same for the same key."""
    return random.Random(t * 10_000_000 + i).randbytes(3000)


def pipelined_writer(r, t, stop, acked, total=200_000):
    """Client t SETs t{t}:{i} to value_of(t, i), 8 a pipeline, until stop
    is set or the connection goes; acked gets each i acknowledged."""
    c = r.client()
    for base in range(0, total, 8):
        if stop.is_set():
            return
        p = c.pipeline(transaction=False)
        for i in range(base, base + 8):
            p.set(f"t{t}:{i}", value_of(t, i))
        try:
            p.execute()
        except (redis.ConnectionError, redis.TimeoutError):
            return
        acked.extend(range(base, base + 8))


def background_folds(r):
    return [f for f in r.supervisor_events("journal_folded") if f["when"] == "background"]


def load_until_folds(r, n, least_s, most_s=90):
    """While writers load r: until n background folds of the journal
    happened and least_s passed (most_s at most; a slow machine takes
    longer to fill the files)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < most_s:
        if time.monotonic() - t0 >= least_s and len(background_folds(r)) >= n:
            return
        time.sleep(0.2)


def batch_writer(r, stop, acked, make_batch, limit):
    """SETs each dict make_batch() returns, in one pipeline, until stop is
    set, limit keys were written or the connection goes; acked gets each
    acknowledged batch."""
    c = r.client()
    n = 0
    while not stop.is_set() and n < limit:
        batch = make_batch()
        p = c.pipeline(transaction=False)
        for k, v in batch.items():
            p.set(k, v)
        try:
            p.execute()
        except (redis.ConnectionError, redis.TimeoutError):
            return
        acked.update(batch)
        n += len(batch)


def test_sync_writes_past_a_full_journal_file_survive_the_stack_dying(tmp_path):
    """Four clients pipeline SETs of incompressible values until the first
    journal file (64 MiB) fills: appends move to the second while the first
    is folded on a thread of its own (a snapshot is published mid-load).
    Writes go on, then the supervisor and rkv are SIGKILLed, the fold
    perhaps half done: a restore reads both files in order and finds every
    acknowledged write, byte for byte."""
    store = tmp_path / "store"
    r = durable_rkv(tmp_path / "a", store, "sync")
    acked = [[] for _ in range(4)]
    stop = threading.Event()
    ws = [
        threading.Thread(target=pipelined_writer, args=(r, t, stop, acked[t]), daemon=True) for t in range(4)
    ]
    for w in ws:
        w.start()
    published = 0
    deadline = time.monotonic() + 90
    while published < 2 and time.monotonic() < deadline:
        time.sleep(0.25)
        published = snapshot_count(store)
    time.sleep(0.3)  # appends into the second file, the fold perhaps running
    got = {t: list(a) for t, a in enumerate(acked)}
    kill_stack(r)
    stop.set()
    for w in ws:
        w.join(timeout=10)
    n = sum(map(len, got.values()))
    assert published >= 2, f"no journal file filled in 90 s ({n} writes acknowledged)"
    # both files created at 1; a switch makes the second's generation higher
    gens = [int.from_bytes((store / f).read_bytes()[16:24], "little") for f in ("journal", "journal-b")]
    assert max(gens) >= 2, f"appends never moved to the second journal file: generations {gens}"
    back = restored(tmp_path / "b", store)
    try:
        c = back.client()
        assert back.wait_log("ready")["start"] == "warm"
        lost = []
        for t, ids in got.items():
            for k in range(0, len(ids), 500):
                chunk = ids[k : k + 500]
                vals = c.mget([f"t{t}:{i}" for i in chunk])
                lost += [(t, i) for i, v in zip(chunk, vals, strict=True) if v != value_of(t, i)]
        assert not lost, f"{len(lost)} of {n} acknowledged writes lost, first {lost[:5]}"
    finally:
        back.close()


def test_sync_load_takes_no_interval_snapshot_and_indexes_only_published_ones(tmp_path):
    """Under a steady --durability sync load, every snapshot is a journaled
    group commit: one the 10 ms interval made due is not taken (published,
    it would fold the journal on the reply path, 100-300 ms, as the largest
    latencies at -P 16 showed), since each group commit cuts every write
    anyway.  The location indexer is given published snapshots only (it was
    given journaled ids, which have no manifest: `not_found` events)."""
    store = tmp_path / "store"
    r = durable_rkv(tmp_path / "a", store, "sync", "10ms", ("--snapshot-events", "every"))
    stop = threading.Event()
    try:
        ws = [threading.Thread(target=pipelined_writer, args=(r, t, stop, []), daemon=True) for t in range(4)]
        for w in ws:
            w.start()
        time.sleep(3)
        stop.set()
        for w in ws:
            w.join(timeout=10)
        snaps = r.supervisor_events("snapshot")
        journaled = [k for k, e in enumerate(snaps) if e["journaled"]]
        assert len(journaled) >= 20, f"{len(journaled)} journaled snapshots of {len(snaps)}"
        during = snaps[journaled[0] : journaled[-1] + 1]
        # a group commit of more than 16 MiB (the keyspace's table grown)
        # goes to a pack, as docs/store.md says: not an interval snapshot
        published = [e["id"] for e in during if not e["journaled"] and e["new_bytes"] < 16 << 20]
        assert not published, f"published mid-load: {published} ({len(during)} snapshots)"
        lost = [e for e in r.supervisor_events("location_index") if e["code"] == "not_found"]
        assert not lost, lost
    finally:
        r.close()


def test_sync_writes_through_many_reuses_of_both_journal_files_survive_the_stack_dying(tmp_path):
    """With 2 MiB journal files (REKINDLE_JOURNAL_BYTES), four clients
    pipeline 1-8 values of 200-3,000 incompressible bytes at a time, so both
    files fill and are reused many times with records of every size.  No
    background fold fails: each fold of a reused file used to, taking what
    a reset left of longer records for a torn tail (journal_corrupt), and
    the foreground fold after it dropped the other file's records, acked
    ones.  Then the stack is SIGKILLed, and a restore finds every
    acknowledged write, byte for byte."""
    store = tmp_path / "store"
    r = Rkv(
        tmp_path / "a", "--durability", "sync", supervised=True,
        env={"REKINDLE_JOURNAL_BYTES": str(2 << 20)},
        sup=("run", "--snapshot-dir", str(store), "--snapshot-interval", "0"),
    )  # fmt: skip
    acked = [{} for _ in range(4)]
    stop = threading.Event()

    def writer(t):
        rnd = random.Random(t)
        i = 0

        def batch():
            nonlocal i
            b = {f"t{t}:{i + j}": rnd.randbytes(rnd.randint(200, 3000)) for j in range(rnd.randint(1, 8))}
            i += len(b)
            return b

        batch_writer(r, stop, acked[t], batch, 200_000)

    ws = [threading.Thread(target=writer, args=(t,), daemon=True) for t in range(4)]
    for w in ws:
        w.start()
    load_until_folds(r, 4, 4)
    got = [dict(a) for a in acked]
    failed = r.supervisor_events("snapshot_failed")
    folds = background_folds(r)
    kill_stack(r)
    stop.set()
    for w in ws:
        w.join(timeout=10)
    assert not failed, failed
    assert len(folds) >= 4, f"{len(folds)} background folds: the files were not reused"
    back = restored(tmp_path / "b", store)
    try:
        c = back.client()
        assert back.wait_log("ready")["start"] == "warm"
        want = {k: v for a in got for k, v in a.items()}
        keys = list(want)
        lost = []
        for at in range(0, len(keys), 500):
            part = keys[at : at + 500]
            lost += [k for k, v in zip(part, c.mget(part), strict=True) if v != want[k]]
        assert not lost, f"{len(lost)} of {len(keys)} acknowledged writes lost or changed: {lost[:5]}"
    finally:
        back.close()


@pytest.mark.parametrize("shadow", ["default", "0", "checkpoints"])
def test_sync_overwrites_journaled_as_deltas_survive_the_stack_dying(tmp_path, shadow):
    """Four clients overwrite 3,000 keys of 100-byte values again and again
    under `--durability sync` with 2 MiB journal files: a page written by
    one group commit and again by a later one is journaled as the bytes
    that changed (`delta_pages` in the snapshot events), and the background
    folds rebuild the pages from the deltas.  Then the stack is SIGKILLed,
    and a restore finds every acknowledged write, byte for byte.  With
    REKINDLE_SNAPSHOT_SHADOW_BYTES=0 no page is journaled as a delta.
    "checkpoints": `rekindle checkpoint --wait` publishes snapshots between
    the group commits, and the commits right after them still go as
    deltas (the shadow follows a published snapshot of the snapshot it is
    of)."""
    store = tmp_path / "store"
    env = {"REKINDLE_JOURNAL_BYTES": str(2 << 20)}
    if shadow == "0":
        env["REKINDLE_SNAPSHOT_SHADOW_BYTES"] = shadow
    r = Rkv(
        tmp_path / "a", "--durability", "sync", supervised=True, env=env,
        sup=("run", "--snapshot-dir", str(store), "--snapshot-interval", "0", "--snapshot-events", "every"),
    )  # fmt: skip
    acked = [{} for _ in range(4)]
    stop = threading.Event()

    def writer(t):
        rnd = random.Random(t)
        # acked: the keys written; their last values are read at the end
        batch_writer(
            r,
            stop,
            acked[t],
            lambda: {f"k{rnd.randrange(3000)}": rnd.randbytes(100) for _ in range(16)},
            400_000,
        )

    refused = []

    def checkpoints():
        while not stop.wait(0.3):
            p = rekindle("checkpoint", "rkv", "--wait", "--json", env=r.env)
            if p.returncode != 0:
                refused.append(p.stdout + p.stderr)

    ws = [threading.Thread(target=writer, args=(t,), daemon=True) for t in range(4)]
    if shadow == "checkpoints":
        ws.append(threading.Thread(target=checkpoints, daemon=True))
    for w in ws:
        w.start()
    # with checkpoints, each publishes what the journal holds (no file fills)
    load_until_folds(r, 0 if shadow == "checkpoints" else 2, 5)
    stop.set()
    for w in ws:
        w.join(timeout=30)
    every = r.supervisor_events("snapshot")
    snaps = [e for e in every if e.get("journaled")]
    # the first group commit after each published snapshot
    after_published = [
        b for a, b in zip(every, every[1:], strict=False) if not a.get("journaled") and b.get("journaled")
    ]
    folds = background_folds(r)
    failed = r.supervisor_events("snapshot_failed")
    c = r.client()
    final = {}
    keys = sorted({k for a in acked for k in a})
    for at in range(0, len(keys), 500):
        part = keys[at : at + 500]
        final.update(zip(part, c.mget(part), strict=True))
    kill_stack(r)
    assert not failed, failed
    deltas = sum(e.get("delta_pages", 0) for e in snaps)
    if shadow == "0":
        assert deltas == 0, deltas
    else:
        assert deltas > 1000, f"{deltas} pages journaled as deltas in {len(snaps)} commits"
    if shadow == "default":
        assert len(folds) >= 2, f"{len(folds)} background folds of delta records"
    if shadow == "checkpoints":
        assert not refused, refused
        assert len(after_published) >= 5, f"{len(after_published)} group commits right after a checkpoint"
        first = sum(e.get("delta_pages", 0) for e in after_published)
        assert first > 0, f"no delta in the {len(after_published)} group commits right after a checkpoint"
    back = restored(tmp_path / "b", store)
    try:
        assert back.wait_log("ready")["start"] == "warm"
        c = back.client()
        got = {}
        for at in range(0, len(keys), 500):
            part = keys[at : at + 500]
            got.update(zip(part, c.mget(part), strict=True))
        wrong = [k for k in keys if got[k] != final[k]]
        assert not wrong, f"{len(wrong)} of {len(keys)} keys differ after the restore: {wrong[:5]}"
    finally:
        back.close()


@contextlib.contextmanager
def small_tmpfs(tmp_path, size):
    """A tmpfs of `size` at tmp_path/small, unmounted after (the test is
    skipped where none can be mounted): a disk small enough to fill."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    m = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], capture_output=True,
                       check=False)  # fmt: skip
    if m.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {m.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill_disk(path):
    """Writes path until its file system is full, to the last block (a
    write of a few KiB must fail too)."""
    with open(path, "wb", buffering=0) as f:
        for size in (1 << 20, 1 << 16, 1 << 12, 1 << 9, 1):
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e


def test_pages_of_snapshots_that_fail_on_a_full_disk_go_into_the_next(tmp_path):
    """Interval snapshots into a store on a small tmpfs that a filler file
    has filled: they fail (no_space) after the agent's scan has reset the
    pages written since the last one.  Those pages must be carried to the
    next snapshot: after the filler is removed, a checkpoint (with nothing
    written since the failures) is the only snapshot that can hold the
    overwrites made before them.  The stack is SIGKILLed, and a restore
    finds every key as last written."""
    with small_tmpfs(tmp_path, "64m") as mnt:
        store = mnt / "store"
        r = durable_rkv(tmp_path / "a", store, "none", interval="50ms")
        try:
            c = r.client()
            rnd = random.Random(7)
            keys = [f"k{i}" for i in range(3000)]
            c.mset({k: rnd.randbytes(200) for k in keys})
            checkpoint(r)
            fill_disk(mnt / "filler")
            before = len(r.supervisor_events("snapshot_failed"))
            last = {k: rnd.randbytes(200) for k in keys}
            c.mset(last)
            deadline = time.monotonic() + 30
            while len(r.supervisor_events("snapshot_failed")) == before and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.5)  # and the interval's attempts after it
            failed = r.supervisor_events("snapshot_failed")[before:]
            assert failed, "no snapshot failed on the full disk"
            assert {f["code"] for f in failed} == {"no_space"}, failed
            (mnt / "filler").unlink()
            checkpoint(r)
            kill_stack(r)
        finally:
            r.close()
        back = restored(tmp_path / "b", store)
        try:
            c = back.client()
            got = dict(zip(keys, c.mget(keys), strict=True))
            wrong = [k for k in keys if got[k] != last[k]]
            assert not wrong, f"{len(wrong)} of {len(keys)} keys not as last written: {wrong[:5]}"
        finally:
            back.close()


def test_retention_put_off_under_short_intervals_runs_at_the_stop(tmp_path):
    """--snapshot-keep's retention reads every kept map and every pack
    index: after each 10 ms snapshot of a large store it left time for about
    one snapshot a second.  It now runs after a snapshot only once it has
    had less than a tenth of the engine's time since the last, so some
    snapshots of this run have their retention put off (`put_off` in
    `snapshot_gc`), and the store still ends with exactly N (one put off
    runs at the latest when the engine is idle or stops)."""
    store = tmp_path / "store"
    r = durable_rkv(
        tmp_path / "a", store, "async", interval="10ms",
        run_args=("--snapshot-keep", "3", "--snapshot-events", "every"),
    )  # fmt: skip
    try:
        c = r.client()
        value = b"v" * 200
        # a store of some 25,000 pages: a retention takes milliseconds
        p = c.pipeline(transaction=False)
        for i in range(0, 400_000, 5_000):
            p.mset({f"k{j}": value for j in range(i, i + 5_000)})
        p.execute()
        end = time.monotonic() + 2
        i = 0
        while time.monotonic() < end:
            c.set(f"k{i * 7919 % 400_000}", b"w" * 200)
            i += 1
    finally:
        r.close()
    assert r.supervisor_events("stop"), "the supervisor did not stop on SIGTERM"
    assert len(r.supervisor_events("snapshot")) >= 20
    gcs = r.supervisor_events("snapshot_gc")
    assert any(g["put_off"] > 0 for g in gcs), gcs[-5:]
    assert snapshot_count(store) == 3


def snapshots_once_durable(r, c, seconds=10):
    """The snapshot events once every write acknowledged so far is durable,
    as the app itself learns it: rk_durable_epoch() (INFO's
    rekindle_durable_epoch) at the epoch of the last write.  (Once the
    writes stop, interval snapshots find nothing changed and are not
    taken: the wait is not for one more snapshot.)"""
    want = int(c.info("persistence")["rekindle_write_epoch"])
    deadline = time.monotonic() + seconds
    while int(c.info("persistence")["rekindle_durable_epoch"]) < want:
        if time.monotonic() > deadline:
            pytest.fail(f"the writes up to epoch {want} never became durable: {c.info('persistence')}")
        time.sleep(0.02)
    return r.supervisor_events("snapshot")


def test_interval_snapshots_journaled_under_publish_every_survive_the_stack_dying(tmp_path):
    """--snapshot-publish-every: 20 ms snapshots go to the store's journal
    (one append and one fdatasync each, not three files and three fsync
    rounds), and a fold on its own thread publishes them every 500 ms,
    while the app runs.  Writes acknowledged before rkv learns they are
    durable come back after the whole stack is killed (the restore folds
    the journal first)."""
    store = tmp_path / "store"
    r = durable_rkv(
        tmp_path / "a", store, "async", interval="20ms",
        run_args=("--snapshot-publish-every", "500ms", "--snapshot-events", "every"),
    )  # fmt: skip
    try:
        c = r.client()
        n = 0
        held = 0
        end = time.monotonic() + 2.5
        while time.monotonic() < end:
            c.mset({f"k{n + i}": n + i for i in range(50)})
            n += 50
            held = max(held, journal_records(store))
            time.sleep(0.01)
        snaps = snapshots_once_durable(r, c)
        folds = r.supervisor_events("journal_folded")
        listed = snapshot_count(store)
    finally:
        kill_stack(r)
    journaled = [s for s in snaps if s["journaled"]]
    assert len(journaled) >= 40, f"{len(journaled)} journaled of {len(snaps)} snapshots"
    published = [s for s in snaps if not s["journaled"] and s["kind"] != "full"]
    assert not published, f"interval snapshots published: {published[:2]}"
    assert held > 0, "the journal never held a record"
    # published in the background while the app ran, about every 500 ms
    background = [f for f in folds if f["when"] == "background"]
    assert len(background) >= 2, folds
    assert all(f["published"] >= 1 for f in background), background
    assert listed >= 2, f"{listed} snapshots listed while the app ran"
    back = restored(tmp_path / "b", store)
    try:
        c = back.client()
        got = c.mget([f"k{i}" for i in range(n)])
        lost = [i for i, v in enumerate(got) if v != str(i).encode()]
        assert not lost, f"{len(lost)} of {n} keys lost, first {lost[:5]}"
    finally:
        back.close()


def test_publish_every_is_refused_below_the_interval_or_without_one(tmp_path):
    store = tmp_path / "store"
    for args, says in [
        (("--snapshot-interval", "100ms", "--snapshot-publish-every", "50ms"), "shorter than"),
        (("--snapshot-interval", "0", "--snapshot-publish-every", "1s"), "needs continuous snapshots"),
        (("--snapshot-publish-every", "soon"), "'soon'"),
    ]:
        p = rekindle("run", "--snapshot-dir", store, *args, "--", "/bin/true")
        assert p.returncode == 2 and says in p.stderr, (args, p.returncode, p.stderr)
    assert not store.exists(), "a refused run created the store"


def test_publish_every_publishes_the_snapshot_after_a_large_one(tmp_path):
    """Under --snapshot-publish-every an interval snapshot after one that
    copied more than 8,192 pages is published, not journaled (back-to-back
    large snapshots gain nothing from the journal, and its fold compressed
    their pages again); the snapshots after a small one go to the journal
    again.  Every write comes back after the stack is killed."""
    store = tmp_path / "store"
    r = durable_rkv(
        tmp_path / "a", store, "async", interval="20ms",
        run_args=("--snapshot-publish-every", "10s", "--snapshot-events", "every"),
    )  # fmt: skip
    try:
        c = r.client()

        def trickle(seconds):  # small writes: an interval snapshot each
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                c.set("tick", time.monotonic_ns())
                time.sleep(0.01)

        trickle(0.5)
        value = b"b" * 3000
        c.mset({f"big{i}": value for i in range(15_000)})  # about 11,000 pages, one cut
        trickle(0.5)
        c.set("after", "1")
        snaps = snapshots_once_durable(r, c)
    finally:
        kill_stack(r)
    snaps = [s for s in snaps if s["kind"] != "full"]
    pages = [s["precopy_pages"] + s["cut_pages"] for s in snaps]
    large = [i for i in range(len(snaps) - 1) if pages[i] > 8192]
    assert large, f"no snapshot of more than 8,192 pages: {max(pages)}"
    # each one after a large one is published, each one after a small one
    # journaled (the first, the incarnation's full one, is left out)
    rule = [(snaps[i]["journaled"], pages[i - 1] <= 8192) for i in range(1, len(snaps))]
    bad = [i + 1 for i, (j, s) in enumerate(rule) if j != s]
    keys = ("journaled", "precopy_pages", "cut_pages", "rounds")
    assert not bad, [(pages[i - 1], {k: snaps[i][k] for k in keys}) for i in bad]
    assert sum(j for j, _ in rule) >= 20, "too few journaled snapshots"
    back = restored(tmp_path / "b", store)
    try:
        c = back.client()
        assert c.get("after") == b"1"
        got = c.mget([f"big{i}" for i in range(15_000)])
        assert all(v == value for v in got), sum(v != value for v in got)
    finally:
        back.close()
