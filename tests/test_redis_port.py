"""Redis 7.0.15 (Debian's source, examples/redis) on Rekindle, as real
processes: every data type and expiry kept through DEBUG SEGFAULT (restart
in place) and through SIGKILL under `rekindle run`; a crash inside a
mutation (EXEC of a transaction) goes cold with its reason, and Redis loads
its RDB.  `make test` builds the port first (examples/redis/build.sh)."""

import os
import signal
import socket
import subprocess
import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from conftest import BUILD, ROOT, arena_pmd_kb, shmem_huge_denied

PORT_SERVER = BUILD / "redis" / "rekindle" / "src" / "redis-server"
HANG = ("--hang-timeout", "2s")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_args(port, workdir):
    return [
        str(PORT_SERVER),
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        str(workdir),
        "--enable-debug-command",
        "yes",
        "--daemonize",
        "no",
        "--logfile",
        "",
    ]


def client(port, timeout=10.0):
    """A client once the server answers PING (it may be restarting)."""
    deadline = time.monotonic() + timeout
    while True:
        # no retries: redis-py would send DEBUG SEGFAULT again after the restart
        c = redis.Redis(host="127.0.0.1", port=port, socket_timeout=5, retry=Retry(NoBackoff(), 0))
        try:
            c.ping()
            return c
        except (redis.ConnectionError, redis.BusyLoadingError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def fill_every_type(c):
    c.set("str", "hello")
    c.set("int", 42)  # a shared integer object
    c.set("big", "x" * 100_000)  # a large argv: the query buffer itself
    c.append("str", " world")
    c.incrby("counter", 7)
    c.rpush("list", *[f"e{i}" for i in range(300)])  # past the listpack size
    c.lpush("smalllist", "a", "b")
    c.hset("hash", mapping={f"f{i}": f"v{i}" for i in range(200)})
    c.hset("smallhash", "f", "v")
    c.sadd("set", *[f"m{i}" for i in range(200)])
    c.sadd("intset", 1, 2, 3)
    c.zadd("zset", {f"z{i}": i for i in range(200)})
    c.zadd("smallzset", {"a": 1.5})
    c.xadd("stream", {"f": "v"}, id="1-1")
    c.xadd("stream", {"g": "w"}, id="2-1")
    c.xgroup_create("stream", "grp", id="0")
    c.xreadgroup("grp", "consumer", {"stream": ">"}, count=1)
    c.set("ttl", "v", ex=1000)
    c.pfadd("hll", "a", "b", "c")
    c.select(3)
    c.set("db3", "three")
    c.select(0)


def snapshot(c):
    """Every key of db 0 and db 3 by its DUMP (type and contents) and whether
    it has a TTL."""
    out = {}
    for db in (0, 3):
        c.execute_command("SELECT", db)
        for k in c.keys("*"):
            out[(db, k)] = (c.dump(k), c.pttl(k) > 0)
    c.execute_command("SELECT", 0)
    return out


def crash(c, *command):
    with pytest.raises(redis.ConnectionError):
        c.execute_command(*command)


class Standalone:
    def __init__(self, tmp_path, *extra):
        """extra: more options for the server (a later one wins)."""
        if not PORT_SERVER.exists():
            pytest.fail(f"{PORT_SERVER} missing: run `make redis` first")
        self.port = free_port()
        self.log = open(tmp_path / "redis.log", "w+")  # noqa: SIM115 - closed in close()
        args = server_args(self.port, tmp_path) + list(extra)
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)

    def text(self):
        self.log.flush()
        return open(self.log.name).read()

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture
def standalone(tmp_path):
    s = Standalone(tmp_path)
    yield s
    s.close()


def test_every_type_survives_debug_segfault_in_place(standalone):
    c = client(standalone.port)
    fill_every_type(c)
    before = snapshot(c)
    assert len(before) == 16  # 15 in db 0, 1 in db 3
    crash(c, "DEBUG", "SEGFAULT")
    c = client(standalone.port)
    assert snapshot(c) == before
    assert c.get("str") == b"hello world" and c.get("int") == b"42"
    assert 990 < c.ttl("ttl") <= 1000
    # a group's pending entry survives with its consumer
    assert c.xpending("stream", "grp")["pending"] == 1
    assert standalone.proc.poll() is None  # restarted in place, same process
    log = standalone.text()
    assert "Rekindle: warm start (generation 1)" in log and "Rekindle: 16 keys kept" in log
    # the warm keyspace takes writes again, and a second crash keeps them
    c.set("after", "yes")
    c.lpush("list", "new")
    before = snapshot(c)
    time.sleep(1.2)  # past the crash-loop window of the warm start
    crash(c, "DEBUG", "SEGFAULT")
    c = client(standalone.port)
    assert snapshot(c) == before
    assert "Rekindle: warm start (generation 2)" in standalone.text()


def test_stored_argv_strings_are_kept_warm(standalone):
    """The argv strings a write stores as they are (SET and its variants,
    GETSET, MSET, MSETNX, APPEND of a new key, also inside EXEC and a
    script) are copied into the arena where they are stored (patch 0006),
    not before every write: each is back after a crash, with its
    encoding, and no value entered the keyspace from the heap."""
    c = client(standalone.port)
    values = {
        "emb": b"e" * 40,  # embstr
        "raw": b"r" * 100,  # raw: robj and sds
        "num": b"12345678901",  # int-encoded in place by tryObjectEncoding
        "big": b"b" * 100_000,  # the query buffer itself
    }
    for k, v in values.items():
        c.set(k, v)
    c.setnx("nx", b"n" * 60)
    c.execute_command("SETEX", "ex", 1000, b"x" * 60)
    c.psetex("px", 1_000_000, b"p" * 60)
    c.set("gs", "old")
    assert c.getset("gs", b"g" * 60) == b"old"
    assert c.set("sg", b"s" * 60, get=True) is None
    c.mset({"m1": b"1" * 60, "m2": b"2" * 60})
    c.msetnx({"mn1": b"3" * 60, "mn2": b"4" * 60})
    c.append("ap", b"a" * 60)
    p = c.pipeline(transaction=True)
    p.set("inexec", b"i" * 60)
    p.execute()
    c.eval("redis.call('SET', KEYS[1], ARGV[1])", 1, "inscript", b"l" * 60)
    before = snapshot(c)
    encodings = {k: c.object("encoding", k) for k in values}
    assert encodings == {"emb": b"embstr", "raw": b"raw", "num": b"int", "big": b"raw"}
    crash(c, "DEBUG", "SEGFAULT")
    c = client(standalone.port)
    assert snapshot(c) == before
    assert {k: c.get(k) for k in values} == values
    assert {k: c.object("encoding", k) for k in values} == encodings
    log = standalone.text()
    assert "Rekindle: warm start (generation 1)" in log, log[-2000:]
    assert "value-off-arena" not in log


def test_a_value_from_outside_the_arena_turns_warm_restarts_off(tmp_path):
    """A replica's full sync loads the master's RDB outside any scope (a
    known gap, examples/redis/README.md): its values are on the heap, and
    the check where values enter the keyspace (patch 0006) turns warm
    restarts off with a reason instead of keeping pointers that would
    dangle: the crash that follows is a cold start."""
    (tmp_path / "m").mkdir()
    (tmp_path / "r").mkdir()
    master, replica = Standalone(tmp_path / "m"), Standalone(tmp_path / "r")
    try:
        m = client(master.port)
        m.set("synced", b"v" * 100)
        r = client(replica.port)
        r.execute_command("REPLICAOF", "127.0.0.1", master.port)
        deadline = time.monotonic() + 20
        while r.get("synced") is None:
            assert time.monotonic() < deadline, replica.text()[-2000:]
            time.sleep(0.05)
        log = replica.text()
        assert "Rekindle: value-off-arena" in log, log[-2000:]
        crash(r, "DEBUG", "SEGFAULT")
        client(replica.port)
        assert "Rekindle: cold start" in replica.text(), replica.text()[-2000:]
    finally:
        replica.close()
        master.close()


def test_keyspace_check_passes_a_sound_keyspace(tmp_path, monkeypatch):
    # REDIS_REKINDLE_VERIFY_KEYSPACE=1 (patch 0005) walks every db dict and
    # every hash/set/zset dict at a warm start and goes cold on a misplaced
    # key or a wrong count: a sound keyspace of every type, with the db dict
    # in the middle of a rehash, must stay warm (the check that finds bad
    # state: test_fault_campaign.py)
    monkeypatch.setenv("REDIS_REKINDLE_VERIFY_KEYSPACE", "1")
    s = Standalone(tmp_path)
    try:
        c = client(s.port)
        fill_every_type(c)
        before = snapshot(c)
        # then 1,100 keys in one command: the dict grows at 1,024 and each
        # later add moves one bucket, so the crash finds it rehashing (the
        # snapshot's lookups, each a rehash step, come before)
        many = {f"k{i}".encode(): b"%d" % i for i in range(1100)}
        c.mset(many)
        assert b"Hash table 1 stats (rehashing target)" in c.execute_command("DEBUG", "HTSTATS", "0")
        crash(c, "DEBUG", "SEGFAULT")
        c = client(s.port)
        after = snapshot(c)
        assert {k: v for k, v in after.items() if k[1] not in many} == before
        assert c.mget(list(many)) == list(many.values())
        log = s.text()
        assert "Rekindle: warm start (generation 1)" in log, log[-2000:]
        assert "keyspace check failed" not in log
        assert f"Rekindle: {len(before) + len(many)} keys kept" in log
    finally:
        s.close()


def test_the_keyspace_is_kept_in_huge_pages_across_a_warm_restart(standalone):
    """Patch 0009: the keyspace arena is collapsed into huge pages as the
    heap grows (where the kernel allows a collapse of shmem), and after a
    warm restart the new image maps it with them: a fault per 2 MiB, not
    per 4 KiB."""
    c = client(standalone.port)
    # 24 MiB in 48 commands: the top pass runs between them (beforeSleep)
    values = {f"v{i}": bytes([65 + i % 26]) * (512 << 10) for i in range(48)}
    for k, v in values.items():
        c.set(k, v)
    if shmem_huge_denied():
        # the refusal is logged from cron, within a tick
        deadline = time.monotonic() + 10
        while "Rekindle: hugepages-off" not in standalone.text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "Rekindle: hugepages-off" in standalone.text()
        return
    pid = c.info("server")["process_id"]
    assert arena_pmd_kb(pid, "redis-keyspace") >= 8 << 10, standalone.text()[-2000:]
    crash(c, "DEBUG", "SEGFAULT")
    c = client(standalone.port)
    assert "Rekindle: warm start (generation 1)" in standalone.text()
    for k, v in values.items():  # each read maps its value again
        assert c.get(k) == v
    pid = c.info("server")["process_id"]
    assert arena_pmd_kb(pid, "redis-keyspace") >= 8 << 10, "the new mapping has huge pages"


def test_hugepages_no_keeps_the_keyspace_in_small_pages(tmp_path, monkeypatch):
    monkeypatch.setenv("REDIS_REKINDLE_HUGEPAGES", "no")
    s = Standalone(tmp_path)
    try:
        c = client(s.port)
        for i in range(48):
            c.set(f"v{i}", b"x" * (512 << 10))
        assert arena_pmd_kb(c.info("server")["process_id"], "redis-keyspace") == 0
        assert "Rekindle: hugepages-off: REDIS_REKINDLE_HUGEPAGES=no" in s.text()
    finally:
        s.close()


def test_memory_accounting_adopts_the_warm_keyspace(standalone):
    c = client(standalone.port)
    c.execute_command("DEBUG", "POPULATE", 20000, "k", 100)
    used = c.info("memory")["used_memory"]
    crash(c, "DEBUG", "SEGFAULT")
    c = client(standalone.port)
    assert c.dbsize() == 20000
    after = c.info("memory")["used_memory"]
    # not counted from zero: the kept keys are in used_memory again
    assert after > used // 2, (used, after)
    c.flushall()
    assert c.info("memory")["used_memory"] < after // 2


def test_a_crash_inside_exec_goes_cold_and_loads_the_rdb(standalone):
    c = client(standalone.port)
    c.set("saved", "1")
    c.rpush("savedlist", "a", "b")
    c.save()
    c.set("unsaved", "1")
    p = c.pipeline(transaction=True)  # MULTI ... EXEC: EXEC is one mutation
    p.set("in-exec", "1")
    p.execute_command("DEBUG", "SEGFAULT")
    with pytest.raises(redis.ConnectionError):
        p.execute()
    c = client(standalone.port)
    assert c.get("saved") == b"1" and c.lrange("savedlist", 0, -1) == [b"a", b"b"]
    assert c.get("unsaved") is None and c.get("in-exec") is None
    log = standalone.text()
    assert "Rekindle: cold start (unsafe_region_open" in log, log[-3000:]
    assert "DB loaded from disk" in log


# A crash inside a consumer group's change, where the stream was found with
# a read lookup (patch 0008): command -> (the rax call gdb stops it in, its
# caller, hits to let pass, the command).  XACK: between the removal from
# the group's PEL and the one from the consumer's; XCLAIM and XAUTOCLAIM:
# between the removal from alice's PEL and the insertion into bob's;
# XREADGROUP: the group's last id moved and 3-1 in the group's PEL, not yet
# in bob's.
GROUP_CHANGES = {
    "XACK": ("raxRemove", "xackCommand", 1, lambda c: c.xack("s", "g", "1-1")),
    "XCLAIM": ("raxInsert", "xclaimCommand", 0, lambda c: c.xclaim("s", "g", "bob", 0, ["1-1"])),
    "XAUTOCLAIM": ("raxInsert", "xautoclaimCommand", 0, lambda c: c.xautoclaim("s", "g", "bob", 0, count=1)),
    "XREADGROUP": ("raxTryInsert", "streamReplyWithRange", 1, lambda c: c.xreadgroup("g", "bob", {"s": ">"})),
}


def pel(c):
    """The group's pending entries: id, owner and deliveries."""
    pending = c.xpending_range("s", "g", "-", "+", 10)
    return [(e["message_id"], e["consumer"], e["times_delivered"]) for e in pending]


@pytest.mark.parametrize("command", sorted(GROUP_CHANGES))
def test_a_crash_inside_a_consumer_group_change_goes_cold_and_replays_the_aof(tmp_path, command):
    """gdb stops the server inside the command's change of the group (the
    entry then in one PEL of the two, or in neither) and sends it to address
    0: the fault lands in an open unsafe region, so the restart is cold, and
    the AOF (appendfsync always) brings back every acknowledged write, not
    the crashed command.  Before patch 0008 these commands opened no region,
    and the restart was warm onto the half-changed PELs."""
    func, caller, ignore, run = GROUP_CHANGES[command]
    s = Standalone(tmp_path, "--appendonly", "yes", "--appendfsync", "always")
    try:
        c = client(s.port)
        c.xadd("s", {"f": "v"}, id="1-1")
        c.xadd("s", {"f": "w"}, id="2-1")
        c.xgroup_create("s", "g", id="0")
        c.xreadgroup("g", "alice", {"s": ">"})
        c.xadd("s", {"f": "x"}, id="3-1")  # not delivered yet: XREADGROUP's
        before = pel(c)
        time.sleep(1.2)  # past the crash-loop window of a start
        gdb = subprocess.Popen(
            ["gdb", "-p", str(s.proc.pid), "-batch", "-nx", "-ex", "set pagination off",
             "-ex", f'break {func} if $_caller_is("{caller}")', "-ex", f"ignore 1 {ignore}",
             "-ex", "continue", "-ex", "bt 2", "-ex", "set var $pc = 0", "-ex", "detach"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        try:
            seen = []
            for line in gdb.stdout:  # set while the server is stopped: no race
                seen.append(line)
                if line.startswith("Breakpoint 1 at"):
                    break
            else:
                pytest.fail("gdb set no breakpoint:\n" + "".join(seen))
            with pytest.raises(redis.ConnectionError):
                run(c)
            out = "".join(seen) + gdb.communicate(timeout=60)[0]
        finally:
            if gdb.poll() is None:
                gdb.kill()
                gdb.wait()
        assert f"in {caller} (" in out, out[-2000:]  # stopped inside the change
        c = client(s.port, timeout=30)
        log = s.text()
        assert "Rekindle: cold start (unsafe_region_open" in log, log[-3000:]
        assert "DB loaded from append only file" in log
        assert pel(c) == before == [(b"1-1", b"alice", 1), (b"2-1", b"alice", 1)]
        assert c.xack("s", "g", "1-1") == 1  # the group works on
        delivered = c.xreadgroup("g", "carol", {"s": ">"})[0][1]
        assert [entry_id for entry_id, _ in delivered] == [b"3-1"]  # the last id did not move
    finally:
        s.close()


def test_a_transaction_crashing_before_its_first_change_is_warm(standalone):
    """EXEC allocates from the arena throughout, but its unsafe region opens
    only at its first change of the keyspace: a crash before it is warm."""
    c = client(standalone.port)
    c.set("kept", "1")
    p = c.pipeline(transaction=True)
    p.get("kept")
    p.execute_command("DEBUG", "SEGFAULT")
    with pytest.raises(redis.ConnectionError):
        p.execute()
    c = client(standalone.port)
    assert c.get("kept") == b"1"
    log = standalone.text()
    assert "Rekindle: warm start (generation 1)" in log, log[-3000:]


def test_swapdb_and_flushall_async_are_kept_warm(standalone):
    """SWAPDB and FLUSHALL ASYNC replace the db dicts: the warm keyspace is
    the swapped and flushed one (the root follows the dicts)."""
    c = client(standalone.port)
    c.set("in0", "a")
    c.execute_command("SELECT", 1)
    c.set("in1", "b")
    c.execute_command("SWAPDB", 0, 1)
    crash(c, "DEBUG", "SEGFAULT")
    c = client(standalone.port)
    assert c.keys("*") == [b"in1"]
    c.execute_command("SELECT", 1)
    assert c.keys("*") == [b"in0"]
    c.execute_command("FLUSHALL", "ASYNC")
    c.set("after-flush", "1")
    time.sleep(1.2)  # past the crash-loop window of the warm start
    crash(c, "DEBUG", "SEGFAULT")
    c = client(standalone.port)
    c.execute_command("SELECT", 1)
    assert c.keys("*") == [b"after-flush"]
    c.execute_command("SELECT", 0)
    assert c.keys("*") == []
    assert "Rekindle: warm start (generation 2)" in standalone.text()


def test_warm_after_sigkill_under_rekindle_run(supervise, tmp_path):
    if not PORT_SERVER.exists():
        pytest.fail(f"{PORT_SERVER} missing: run `make redis` first")
    sup = supervise(*HANG, app=server_args(0, tmp_path))
    # the server's own --port is the supervisor's: it listens on LISTEN_FDS
    first = sup.wait_up(0, timeout=20)
    c = client(sup.port)
    fill_every_type(c)
    before = snapshot(c)
    time.sleep(1.2)
    os.kill(first["pid"], signal.SIGKILL)
    up = sup.wait_up(1, timeout=20)
    assert up["kind"] == "warm" and up["pid"] != first["pid"], up
    decision = sup.wait_event("decision")
    assert (decision["mode"], decision["path"], decision["code"]) == ("warm", "respawn", "all_checks_passed")
    c = client(sup.port)
    assert snapshot(c) == before
    # and a fault in place under the supervisor
    time.sleep(1.2)
    crash(c, "DEBUG", "SEGFAULT")
    up = sup.wait_up(2, timeout=20)
    assert up["kind"] == "warm", up
    assert snapshot(client(sup.port)) == before
    assert not sup.events("giveup")


def test_redis_own_suite_subset_passes_on_the_port():
    """The data-type, expiry, keyspace and MULTI units of Redis's own test
    suite (examples/redis/runtest.sh --subset) against the port."""
    if not PORT_SERVER.exists():
        pytest.fail(f"{PORT_SERVER} missing: run `make redis` first")
    script = ROOT / "examples" / "redis" / "runtest.sh"
    p = subprocess.run(
        ["bash", str(script), "rekindle", "--subset"],
        capture_output=True,
        text=True,
        env={**os.environ, "BUILD": str(BUILD)},
        timeout=1500,
        check=False,
    )
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    assert "All tests passed" in (BUILD / "redis" / "results" / "rekindle-runtest.log").read_text()
