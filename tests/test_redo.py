"""rkv `--durability sync --sync-via redo` on Rekindle's redo log (issue 13):
each write command's record goes to the ring `rekindle run --snapshot-dir
DIR` gives the app, its reply waits until the supervisor's writer has the
record on disk (DIR/redo), and a start from the newest snapshot (after the
whole stack died, or after a crash inside an unsafe region) replays the
records after it.  Interval snapshots wait for --redo-snapshot-bytes of
records while the log is open; a record too large for the ring goes
through a snapshot instead; a damaged log refuses the start."""

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import redis
from rkv_harness import RKV, Rkv
from supervisor_harness import REKINDLE, free_port
from test_rkv_durability import Call
from test_snapshots import checkpoint, kill_stack, rekindle

REDO = ("--durability", "sync", "--sync-via", "redo")
# redo files are created whole (zeros, fsync'd): small ones keep the tests'
# disk traffic low, and a load crosses from one file into the next
SMALL_SEGMENTS = {"REKINDLE_REDO_SEGMENT_BYTES": str(256 << 10)}
BATCH_HEAD = 40  # store/redo.rs: magic u32, len u32, line u64, at u64, blake3[..16]
HEADER = 4096
BATCH_MAGIC = 0x42444552


def redo_rkv(tmp_path, store, *rkv_args, interval="50ms", run_args=(), env=None):
    """rkv logging its writes, under `rekindle run --snapshot-dir store`
    (which starts it from the newest snapshot when store holds one)."""
    return Rkv(
        tmp_path, *REDO, *rkv_args, supervised=True, env=env,
        sup=("run", "--snapshot-dir", str(store), "--snapshot-interval", interval,
             "--snapshot-events", "every", *run_args),
    )  # fmt: skip


class Load:
    """threads redis-py clients; each SETs its own keys in order and INCRs
    a shared counter after each SET, until stopped or the connection dies.
    Counts what was acknowledged and what was sent (at most one command
    per thread is in flight when the stack dies)."""

    def __init__(self, r, prefix, threads=4, ops=1_000_000, value_pad=40):
        self.prefix = prefix
        self.acked = [[] for _ in range(threads)]  # the i of each acked SET
        self.incr_sent = [0] * threads
        self.incr_acked = [0] * threads
        self.incr_max = [0] * threads  # the largest value an INCR replied
        self.stop = threading.Event()
        self.pad = value_pad
        self.errors = []
        self.ws = [threading.Thread(target=self._run, args=(r, t, ops), daemon=True) for t in range(threads)]
        for w in self.ws:
            w.start()

    def key(self, t, i):
        return f"{self.prefix}{t}:{i}"

    def value(self, t, i):
        return f"v{self.prefix}{t}:{i}:".encode() + b"x" * (i % self.pad)

    def _run(self, r, t, ops):
        try:
            c = r.client()
            for i in range(ops):
                if self.stop.is_set():
                    return
                c.set(self.key(t, i), self.value(t, i))
                self.acked[t].append(i)
                self.incr_sent[t] += 1
                v = c.incr("counter")
                self.incr_acked[t] += 1
                self.incr_max[t] = max(self.incr_max[t], v)
        except (redis.ConnectionError, redis.TimeoutError):
            return  # the stack died
        except redis.RedisError as e:
            self.errors.append(repr(e))

    def acks(self):
        return sum(map(len, self.acked))

    def wait(self, min_acks, min_seconds, max_seconds):
        """Until min_acks SETs were acknowledged and min_seconds passed
        (at most max_seconds)."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < max_seconds:
            if self.acks() >= min_acks and time.monotonic() - t0 >= min_seconds:
                break
            if self.errors or not any(w.is_alive() for w in self.ws):
                break
            time.sleep(0.01)
        assert not self.errors, self.errors
        assert self.acks() >= min_acks, f"only {self.acks()} SETs acknowledged in {max_seconds} s"

    def join(self):
        self.stop.set()
        for w in self.ws:
            w.join(timeout=30)
        assert not any(w.is_alive() for w in self.ws), "a client thread did not end"
        assert not self.errors, self.errors

    def missing(self, c):
        """The acknowledged SETs whose value is not there."""
        lost = []
        for t, ids in enumerate(self.acked):
            for at in range(0, len(ids), 500):
                part = ids[at : at + 500]
                got = c.mget([self.key(t, i) for i in part])
                lost += [(t, i) for i, v in zip(part, got, strict=True) if v != self.value(t, i)]
        return lost


@contextlib.contextmanager
def stopped(pid):
    """The supervisor SIGSTOPped (its redo writer and snapshot engine with
    it): nothing becomes durable until it goes on."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def snapshot_events(r):
    return r.supervisor_events("snapshot")


def replays(r):
    return r.supervisor_events("redo_replay")


def check_replay_reported(back, records):
    """The supervisor's records are what the runtime applied and rkv ran."""
    rt = back.runtime_events("redo_replay")
    # the snapshot restored and what rkv started with say why, if not
    why = (back.supervisor_events("restore")[-1:], back.log("ready")[-1:])
    assert rt and rt[-1]["records"] == records, (records, rt, why)
    mine = back.log("redo_replay")
    assert mine and mine[-1]["records"] == records, (records, mine, why)


def test_acknowledged_writes_survive_the_stack_dying_through_the_replay(tmp_path):
    """Guards against: a reply sent before its record is durable (an acked
    SET or INCR missing after the restart), a replay that skips records or
    re-applies records the snapshot already holds (the counter would then
    overshoot what was ever sent), and interval snapshots taken while the
    log is open (50 ms interval: dozens during the load without the
    deferral)."""
    store = tmp_path / "store"
    r = redo_rkv(tmp_path / "a", store)
    load = None
    try:
        c = r.client()
        # the log opens at the incarnation's first cut: once this SET is
        # acknowledged (through the log, or through that cut), it is open
        assert c.set("first", "1") is True
        time.sleep(0.2)
        before = len(snapshot_events(r))
        t0 = time.monotonic()
        load = Load(r, "a")
        load.wait(min_acks=400, min_seconds=2.5, max_seconds=20)
        during = len(snapshot_events(r)) - before
        took = time.monotonic() - t0
        kill_stack(r)
    finally:
        if load:
            load.join()
        r.close()
    # 50 ms interval: about took/0.05 snapshots if nothing deferred them
    assert during <= 3, f"{during} snapshots in {took:.1f} s of writes with the redo log open"
    back = redo_rkv(tmp_path / "b", store)
    try:
        rp = replays(back)
        assert rp and rp[-1]["records"] > 0, rp
        records = rp[-1]["records"]
        # every INCR and SET after the snapshot: enough that a second
        # application of them would overshoot the in-flight slack
        assert records >= 2 * len(load.ws), records
        check_replay_reported(back, records)
        c = back.client()
        assert c.get("first") == b"1"
        lost = load.missing(c)
        assert not lost, f"{len(lost)} of {load.acks()} acknowledged SETs lost, first {lost[:5]}"
        counter = int(c.get("counter"))
        low = max(sum(load.incr_acked), *load.incr_max)
        high = sum(load.incr_sent)
        assert low <= counter <= high, (low, counter, high)
    finally:
        back.close()


def test_two_deaths_in_a_row_keep_everything_acknowledged(tmp_path):
    """Killed, started from the store (replay), written to more (first
    through a snapshot while the new incarnation's log is closed, then
    through its new line), killed again, started again.  Guards against:
    the second incarnation's writes lost (its line not based on a durable
    snapshot, or the old line's files removed too early), the first
    incarnation's writes replayed twice onto a snapshot that holds them
    already (counter above what was sent), and records of the old line
    replayed onto the new line's snapshot."""
    store = tmp_path / "store"
    loads = []
    lines = []
    for n, name in enumerate(("a", "b")):
        r = redo_rkv(tmp_path / name, store, env=SMALL_SEGMENTS)
        load = None
        try:
            if n == 1:
                rp = replays(r)
                assert rp and rp[-1]["records"] > 0, rp
                lines.append(rp[-1]["line"])
                check_replay_reported(r, rp[-1]["records"])
            c = r.client()
            assert c.set(f"first{n}", n) is True
            load = Load(r, name)
            loads.append(load)
            load.wait(min_acks=300, min_seconds=1.5, max_seconds=20)
            kill_stack(r)
        finally:
            if load:
                load.join()
            r.close()
    back = redo_rkv(tmp_path / "c", store, env=SMALL_SEGMENTS)
    try:
        rp = replays(back)
        assert rp and rp[-1]["records"] > 0, rp
        lines.append(rp[-1]["line"])
        assert lines[0] != lines[1], f"the second incarnation logged on the first's line: {lines}"
        check_replay_reported(back, rp[-1]["records"])
        c = back.client()
        assert c.get("first0") == b"0" and c.get("first1") == b"1"
        for load in loads:
            lost = load.missing(c)
            assert not lost, f"{load.prefix}: {len(lost)} of {load.acks()} acknowledged SETs lost: {lost[:5]}"
        counter = int(c.get("counter"))
        low = max(sum(sum(x.incr_acked) for x in loads), *(v for x in loads for v in x.incr_max))
        high = sum(sum(x.incr_sent) for x in loads)
        assert low <= counter <= high, (low, counter, high)
    finally:
        back.close()


def test_a_crash_in_a_mutation_restores_the_newest_and_replays_after_it(tmp_path):
    """DEBUG CRASH-IN-MUTATION dies inside an unsafe region: the supervisor
    starts rkv from the newest snapshot, which was taken before the writes
    below (the log defers interval snapshots), and hands it the records
    after it.  Guards against: the records not replayed after a restore in
    the running supervisor (keys acked before the crash missing), the
    half-done change kept, and records applied twice (counter not exact:
    one client, nothing in flight)."""
    store = tmp_path / "store"
    r = redo_rkv(tmp_path / "a", store, "--enable-debug", "yes", run_args=("--crashloop-window", "0"))
    try:
        c = r.client()
        assert c.set("first", "1") is True  # the log is open once this is acked
        time.sleep(0.2)
        n = 40
        for i in range(n - 1):
            assert c.set(f"k{i}", i) is True
            assert c.incr("counter") == i + 1
        # a logged write is answered only once its record is on disk
        with stopped(r.proc.pid):
            setter = Call(lambda: r.client().set(f"k{n - 1}", n - 1))
            assert not setter.answered_within(1.0), "a logged SET was acknowledged with the writer stopped"
        assert setter.answered_within(30) and setter.value is True, setter.error
        assert c.incr("counter") == n
        with pytest.raises(redis.ConnectionError):
            c.execute_command("DEBUG", "CRASH-IN-MUTATION", "half-linked")
        ready = r.wait_log("ready", count=2)
        assert ready["start"] == "warm", ready
        handed = [e for e in r.runtime_events("restart") if e.get("mode") == "snapshot"]
        assert handed and handed[-1]["code"] == "unsafe_region_open", r.runtime_events("restart")
        rp = replays(r)
        # every write after the snapshot that opened the log (the
        # incarnation's first, before or for "first"): no interval snapshot
        # came in between (the log defers them), so 2 per i, and "first"
        # unless its own snapshot opened the log
        assert rp and 2 * n <= rp[-1]["records"] <= 2 * n + 1, rp
        decision = [e for e in r.supervisor_events("decision") if e.get("code") == "restored"]
        assert decision and "unsafe region open" in decision[-1]["reason"], r.supervisor_events("decision")
        # the records replayed are those after the snapshot it started from
        up = r.supervisor_events("up")[-1]
        assert up["code"] == "restored" and up["reason"] == rp[-1]["snapshot"], (up, rp[-1])
        check_replay_reported(r, rp[-1]["records"])
        c = r.wait_serving()
        got = c.mget([f"k{i}" for i in range(n)])
        assert got == [str(i).encode() for i in range(n)], got
        assert c.get("counter") == str(n).encode()
        assert c.get("half-linked") is None and c.dbsize() == n + 2
        # the restored incarnation logs again (a new line at its first cut)
        for i in range(10):
            assert c.set(f"after{i}", i) is True
        kill_stack(r)
    finally:
        r.close()
    back = redo_rkv(tmp_path / "b", store)
    try:
        c = back.client()
        assert c.mget([f"after{i}" for i in range(10)]) == [str(i).encode() for i in range(10)]
        assert c.get("counter") == str(n).encode() and c.dbsize() == n + 12
    finally:
        back.close()


def test_a_record_too_large_for_the_ring_goes_through_a_snapshot(tmp_path):
    """A 64 KiB ring takes records of a quarter of it at most (16 KiB with
    their 4-byte heads): a 40 KiB SET is made durable by a snapshot
    (rk_redo_gap closes the log, the snapshot that acknowledges the SET
    opens a new line), and the writes after it are logged again, through
    a ring they wrap several times.  Guards against: the big write
    acknowledged before anything holds it durably (it is answered while
    the supervisor is stopped), logged after all (it does not move rkv's
    snapshot write epoch), an off-by-one in the size limit, small writes
    logged while the log is closed and replayed without the big one under
    them, the log never reopening (nothing to replay after the restart),
    and records torn where they wrap the ring."""
    store = tmp_path / "store"
    env = {"REKINDLE_REDO_RING_BYTES": str(64 << 10), **SMALL_SEGMENTS}
    big = os.urandom(20 << 10).hex().encode()  # 40 KiB
    edge = {}
    load = None
    r = redo_rkv(tmp_path / "a", store, env=env)
    try:
        c = r.client()
        for i in range(20):
            assert c.set(f"s{i}", i) is True
        w0 = c.info("persistence")["rekindle_write_epoch"]
        with stopped(r.proc.pid):
            setter = Call(lambda: r.client().set("big", big))
            assert not setter.answered_within(1.0), "the big SET was acknowledged with the supervisor stopped"
        assert setter.answered_within(30) and setter.value is True, setter.error
        w1 = c.info("persistence")["rekindle_write_epoch"]
        assert w1 > w0, f"the big SET did not go through a snapshot (write epoch {w0} -> {w1})"
        for i in range(20, 60):
            assert c.set(f"s{i}", i) is True
        assert c.info("persistence")["rekindle_write_epoch"] == w1, "the small SETs were not logged"
        # the limit exactly: rkv's record of a SET is its clock (8), argc
        # (4), and each argument's u32 length and bytes (durability.c)
        limit = (64 << 10) // 4 - 4
        for name, size in (("edge-in", limit), ("edge-out", limit + 1)):
            c.set(name, b"e" * (size - (12 + 4 + 3 + 4 + len(name) + 4)))
            edge[name] = c.info("persistence")["rekindle_write_epoch"]
        assert edge["edge-in"] == w1, "a record of rk_redo_max() bytes was not logged"
        assert edge["edge-out"] > w1, "a record over rk_redo_max() was logged"
        assert c.get("big") == big
        load = Load(r, "w")
        load.wait(min_acks=1500, min_seconds=0, max_seconds=20)  # 150 KB of records
        kill_stack(r)
    finally:
        if load:
            load.join()
        r.close()
    back = redo_rkv(tmp_path / "b", store, env=env)
    try:
        c = back.client()
        assert c.get("big") == big
        got = c.mget([f"s{i}" for i in range(60)])
        assert got == [str(i).encode() for i in range(60)], got
        assert c.strlen("edge-in") > 16000 and c.strlen("edge-out") > 16000
        lost = load.missing(c)
        assert not lost, f"{len(lost)} of {load.acks()} acknowledged SETs lost, first {lost[:5]}"
        counter = int(c.get("counter"))
        assert max(sum(load.incr_acked), *load.incr_max) <= counter <= sum(load.incr_sent), counter
        # the writes after the last gap came back through the reopened log
        rp = replays(back)
        assert rp and rp[-1]["records"] >= 2 * sum(load.incr_acked), rp
        check_replay_reported(back, rp[-1]["records"])
    finally:
        back.close()


def tree(d):
    """Every file under d: relative path -> (size, sha256)."""
    out = {}
    for p in sorted(Path(d).rglob("*")):
        if p.is_file():
            out[str(p.relative_to(d))] = (p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest())
    return out


def newest_manifest(store):
    """The newest published snapshot's manifest (its JSON before the
    checksum line)."""
    ms = sorted((store / "snapshots").glob("*.json"))
    assert ms, "no published snapshot"
    text = ms[-1].read_text()
    return json.JSONDecoder().raw_decode(text)[0]


def batches(path):
    """(file offset, payload length, stream position) of each batch of a
    redo file."""
    data = path.read_bytes()
    out = []
    off = HEADER
    while off + BATCH_HEAD <= len(data):
        magic = int.from_bytes(data[off : off + 4], "little")
        if magic != BATCH_MAGIC:
            break
        n = int.from_bytes(data[off + 4 : off + 8], "little")
        at = int.from_bytes(data[off + 16 : off + 24], "little")
        out.append((off, n, at))
        off += BATCH_HEAD + n
    return out


def supervised_run(tmp_path, rkv_args, run_args, until=None, timeout=30):
    """`rekindle run RUN_ARGS -- rkv RKV_ARGS` in the foreground until it
    ends, or until until(events, stderr) holds (then it is stopped with
    SIGTERM).  Returns (exit status or None if stopped, stderr, events).
    Whatever it spawned is killed, on every path."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    events_path = tmp_path / "events.jsonl"
    err_path = tmp_path / "stderr.txt"
    port = free_port()
    env = dict(os.environ)
    for k in ("REKINDLE_MANIFEST_FD", "LISTEN_FDS", "LISTEN_PID", "NOTIFY_SOCKET"):
        env.pop(k, None)
    env["REKINDLE_RUNTIME_DIR"] = str(tmp_path / "run")
    cmd = [
        str(REKINDLE), "run", "--name", "rkv", "--events", str(events_path), *map(str, run_args),
        "--listen", f"127.0.0.1:{port}", "--", str(RKV), "--port", str(port), "--dir", str(tmp_path),
        *rkv_args,
    ]  # fmt: skip

    def events():
        if not events_path.exists():
            return []
        text = events_path.read_text()
        return [json.loads(x) for x in text[: text.rfind("\n") + 1].splitlines() if x.strip()]

    status = None
    with open(err_path, "w") as err:
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)
        try:
            deadline = time.monotonic() + timeout
            while p.poll() is None:
                if until and until(events(), err_path.read_text()):
                    p.send_signal(signal.SIGTERM)
                    p.wait(timeout=15)
                    break
                assert time.monotonic() < deadline, f"`rekindle run` went on for {timeout} s"
                time.sleep(0.02)
            else:
                status = p.returncode
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            for e in events():
                if e.get("supervisor") == "spawn":
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(e["pid"], signal.SIGKILL)
    return status, err_path.read_text(), events()


def test_a_corrupt_log_refuses_the_start_and_changes_nothing(tmp_path):
    """A batch that fails its check with a good batch after it is damage,
    not a torn tail.  Guards against: starting without the records (their
    replies went out: acknowledged writes silently dropped), a start that
    "repairs" the log or the store (truncating or removing files the
    operator needs to look at), and a refusal that does not say what to
    do; then, the documented way out (moving DIR/redo aside) works."""
    store = tmp_path / "store"
    r = redo_rkv(tmp_path / "a", store, env={"REKINDLE_REDO_SEGMENT_BYTES": str(1 << 20)})
    try:
        c = r.client()
        assert c.set("first", "1") is True
        checkpoint(r)  # the newest snapshot: it has "first", the log the rest
        for i in range(30):  # one client, one at a time: a batch each
            assert c.set(f"k{i}", i) is True
        # a snapshot rkv asks for (while its log is closed) is journaled
        # and published once idle: wait for that, so that the start below
        # has nothing to fold into DIR/snapshots
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            v = rekindle("verify", store, "--json")
            assert v.returncode == 0, v.stdout + v.stderr
            if json.loads(v.stdout)["journal"]["records"] == 0:
                break
            time.sleep(0.1)
        else:
            pytest.fail("the journal was not folded")
        kill_stack(r)
    finally:
        r.close()
    mark = newest_manifest(store).get("redo")
    assert mark, "the newest snapshot has no redo mark"
    line = f"{mark['line']:016x}"
    files = sorted((store / "redo").glob(f"{line}-*.redo"))
    assert files, sorted((store / "redo").iterdir())
    target = files[-1]  # the line's last file: always read by a replay
    # the first batch the replay needs (at or after the snapshot's
    # position), with another after it
    bs = [b for b in batches(target) if b[2] >= mark["at"]]
    assert len(bs) >= 2, f"{target.name} has {len(bs)} batches after position {mark['at']}"
    off, n, _ = bs[0]
    data = bytearray(target.read_bytes())
    data[off + BATCH_HEAD + n // 2] ^= 0x5A
    target.write_bytes(bytes(data))
    redo_before = tree(store / "redo")
    snaps_before = tree(store / "snapshots")

    status, err, ev = supervised_run(
        tmp_path / "b", REDO, ("--snapshot-dir", store, "--snapshot-interval", "50ms")
    )
    assert status != 0, f"started on a corrupt redo log; stderr:\n{err[-2000:]}"
    assert "redo_corrupt" in err, err[-2000:]
    assert str(store / "redo") in err and "aside" in err, err[-2000:]
    assert not [e for e in ev if e.get("supervisor") == "spawn"], "rkv was started"
    assert tree(store / "redo") == redo_before, "the refused start changed DIR/redo"
    assert tree(store / "snapshots") == snaps_before, "the refused start changed DIR/snapshots"

    shutil.move(str(store / "redo"), str(tmp_path / "redo.aside"))
    back = redo_rkv(tmp_path / "c", store)
    try:
        assert not replays(back), replays(back)
        c = back.client()
        assert c.get("first") == b"1"  # the snapshot's
        assert c.mget([f"k{i}" for i in range(30)]) == [None] * 30  # only the log had them
        assert c.set("again", "1") is True
    finally:
        back.close()


def test_sync_via_needs_a_valid_name_and_the_redo_log(tmp_path):
    """Guards against: a misspelt --sync-via taken silently (rkv would
    acknowledge through snapshots, or not at all, against the operator's
    choice), and --sync-via redo under a supervisor that gives no redo log
    starting anyway with a durability it cannot provide."""
    p = subprocess.run(
        [str(RKV), "--port", str(free_port()), "--dir", str(tmp_path), "--durability", "sync",
         "--sync-via", "nonsense"],
        capture_output=True, text=True, timeout=20, check=False,
    )  # fmt: skip
    # rkv's usage errors exit 1 (die_usage), as a bad --durability does
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert "bad --sync-via 'nonsense': expected snapshots or redo" in p.stderr, p.stderr

    # no --snapshot-dir: rkv refuses at once (exit 1, and says why); the
    # supervisor would go on restarting it, so it is stopped after the first
    def exited(events, _err):
        return any(e.get("supervisor") == "exit" for e in events)

    _, err, ev = supervised_run(tmp_path / "nosnap", REDO, (), until=exited)
    first = next(e for e in ev if e.get("supervisor") == "exit")
    assert first["exit_code"] == 1 and first["uptime_ms"] < 5000, first
    assert "rkv: --durability sync needs Rekindle's snapshots" in err, err[-2000:]
    assert '"code":"no_snapshots"' in err, err[-2000:]
    assert '{"rkv":"ready"' not in err, "rkv served without the durability it was asked for"


def mset_load(r, rounds=300, seconds=20):
    """rounds MSETs of 16 keys of 1 KiB (a record of 16 KiB each), 2 ms
    apart, at most seconds; returns the redo positions of the snapshots
    taken meanwhile."""
    c = r.client()
    assert c.set("first", "1") is True  # the log is open once this is acked
    time.sleep(0.2)
    before = len(snapshot_events(r))
    value = b"v" * 1024
    end = time.monotonic() + seconds
    for n in range(rounds):
        assert c.mset({f"k{n}:{j}": value for j in range(16)}) is True
        assert time.monotonic() < end, f"only {n} MSETs in {seconds} s"
        time.sleep(0.002)
    time.sleep(0.1)
    evs = snapshot_events(r)
    assert before >= 1, "the log was open before any snapshot"
    return [e["redo_at"] for e in evs[before - 1 :]]


def test_interval_snapshots_wait_for_redo_snapshot_bytes(tmp_path):
    """--snapshot-interval 20ms: with the default --redo-snapshot-bytes
    (64M) 4.8 MiB of records take no interval snapshot; with 64K the same
    load takes many, each at least 64 KiB of records after the one before.
    Guards against the deferral not happening (a snapshot per interval
    while the log keeps the writes durable), against it never ending (a
    restore would replay an unbounded log), and against it counting
    something else than the bytes logged since the last snapshot."""
    marks = {}
    for name, extra in (("default", ()), ("64K", ("--redo-snapshot-bytes", "64K"))):
        r = redo_rkv(tmp_path / name, tmp_path / f"store-{name}", interval="20ms", run_args=extra)
        try:
            marks[name] = mset_load(r)
        finally:
            r.close()
    # marks[...][0]: the snapshot before the load (the incarnation's first)
    assert len(marks["default"]) - 1 <= 1, marks["default"]
    # distinct positions: a snapshot asked for before the log opened (the
    # first SET's, whose event may come after `before` was counted under
    # load) stands at the same position as the one before it
    taken = sorted(set(marks["64K"]))
    assert len(taken) - 1 >= 5, taken
    steps = [b - a for a, b in zip(taken, taken[1:], strict=False)]
    assert min(steps) >= 64 << 10, f"a snapshot after less than 64 KiB of records: {steps}"
