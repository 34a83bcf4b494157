"""System tests of examples/rkv, the Redis-protocol cache on librekindle:
command semantics and Redis's error replies, pipelining, many clients,
protocol errors, warm restarts (alone after DEBUG SEGFAULT, under `rekindle
run` after SIGKILL), the cold fallback after a crash inside a mutation, and
the snapshot (round trip, corruption).  Real processes, loopback only."""

import os
import resource
import signal
import socket
import subprocess
import time

import pytest
import redis
from rkv_harness import RKV, RKV_MALLOC, Rkv, resp

from conftest import arena_pmd_kb, process_state, shmem_huge_denied

NO_SAVE = ("--save", "")
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)


@pytest.fixture
def rkv(tmp_path, request):
    s = Rkv(tmp_path, *NO_SAVE, "--enable-debug", "yes")
    yield s
    if getattr(request.node, "rep_call", None) and request.node.rep_call.failed and s.proc.poll() is None:
        # a server that stopped answering: what it was doing, and its log
        print(process_state(s.proc.pid))
        print(s.stderr()[-4000:])
    s.close()


@pytest.fixture
def r(rkv):
    c = rkv.client()
    yield c
    c.close()


def err(fn, *args):
    with pytest.raises(redis.ResponseError) as e:
        fn(*args)
    return str(e.value)


# ---- options ------------------------------------------------------------


@pytest.mark.parametrize(
    "args, message",
    [
        (["--frobnicate"], "unknown option '--frobnicate'"),
        (["--port"], "needs a value"),
        (["--port", "http"], "bad --port"),
        (["--port", "70000"], "bad --port"),
        (["--maxmemory", "lots"], "bad --maxmemory"),
        (["--save", "soon"], "bad --save"),
        (["--enable-debug", "maybe"], "bad --enable-debug"),
        (["--hugepages", "maybe"], "bad --hugepages 'maybe': expected yes or no"),
        (["--recovery-check-cpu", "0"], "bad --recovery-check-cpu '0': expected a percent, 1..100"),
        (["--recovery-check-cpu", "5x"], "bad --recovery-check-cpu '5x'"),
        (["--prefault", "1"], "bad --prefault '1': expected yes or no"),
        (["--dir", "/nonexistent/dir"], "not a directory"),
        (["--dbfilename", "a/b"], "bad --dbfilename"),
    ],
)
def test_bad_options_exit_1(args, message):
    p = subprocess.run([str(RKV), *args], capture_output=True, text=True, timeout=10, check=False)
    assert p.returncode == 1
    assert message in p.stderr
    assert '{"rekindle"' not in p.stderr  # refused before the runtime started


def test_help_and_version():
    p = subprocess.run([str(RKV), "--help"], capture_output=True, text=True, timeout=10, check=False)
    assert p.returncode == 0 and "--maxmemory" in p.stdout and "LISTEN_FDS" in p.stdout
    p = subprocess.run([str(RKV), "--version"], capture_output=True, text=True, timeout=10, check=False)
    assert p.returncode == 0 and p.stdout.startswith("rkv v=")


# ---- commands -------------------------------------------------------------


def test_strings(r):
    assert r.ping() is True
    assert r.echo("hi") == b"hi"
    assert r.get("a") is None
    assert r.set("a", "1") is True and r.get("a") == b"1"
    assert r.getset("a", "2") == b"1" and r.get("a") == b"2"
    assert r.incr("a") == 3 and r.decr("a") == 2 and r.incrby("a", -10) == -8
    assert r.incr("fresh") == 1
    assert r.append("s", "ab") == 2 and r.append("s", "cd") == 4 and r.get("s") == b"abcd"
    assert r.strlen("s") == 4 and r.strlen("none") == 0
    assert r.mset({"m1": "x", "m2": "y"}) is True
    assert r.mget("m1", "nope", "m2") == [b"x", None, b"y"]
    assert r.exists("m1", "m1", "nope") == 2
    assert r.delete("m1", "m2", "nope") == 2
    assert r.dbsize() == 3
    big = os.urandom(300_000)
    assert r.set("big", big) and r.get("big") == big
    assert r.set("bin\r\n\x00key", b"\x00\xff\r\n") and r.get("bin\r\n\x00key") == b"\x00\xff\r\n"
    assert r.flushall() is True and r.dbsize() == 0


def test_error_replies_are_redis_ones(r):
    r.set("text", "abc")
    assert err(r.execute_command, "GET") == "wrong number of arguments for 'get' command"
    unknown = "unknown command 'FOO', with args beginning with: 'a' 'b' "
    assert err(r.execute_command, "FOO", "a", "b") == unknown
    assert err(r.incr, "text") == "value is not an integer or out of range"
    assert err(r.execute_command, "INCRBY", "n", "1.5") == "value is not an integer or out of range"
    r.set("max", str(2**63 - 1))
    assert err(r.incr, "max") == "increment or decrement would overflow"
    r.set("min", str(-(2**63)))
    assert err(r.decr, "min") == "increment or decrement would overflow"
    assert err(r.execute_command, "SET", "k", "v", "NX", "XX") == "syntax error"
    assert err(r.execute_command, "SET", "k", "v", "EX", "1", "PX", "1") == "syntax error"
    assert err(r.execute_command, "SET", "k", "v", "EX", "x") == "value is not an integer or out of range"
    assert err(r.execute_command, "SET", "k", "v", "EX", "0") == "invalid expire time in 'set' command"
    assert err(r.execute_command, "MSET", "a", "1", "b") == "wrong number of arguments for 'mset' command"
    assert err(r.execute_command, "SELECT", "1") == "DB index is out of range"
    assert r.execute_command("SELECT", "0") is True
    assert err(r.execute_command, "CONFIG", "NOPE") == "unknown subcommand 'NOPE'. Try CONFIG HELP."
    assert err(r.execute_command, "SCAN", "abc") == "invalid cursor"
    assert err(r.execute_command, "EXPIRE", "text", "10", "NX", "XX").startswith("NX and XX, GT or LT")


def test_set_options(r):
    assert r.set("k", "1", nx=True) is True
    assert r.set("k", "2", nx=True) is None and r.get("k") == b"1"
    assert r.set("k", "3", xx=True) is True and r.get("k") == b"3"
    assert r.set("absent", "x", xx=True) is None and r.exists("absent") == 0
    assert r.set("k", "4", ex=100, xx=True) is True and 99 <= r.ttl("k") <= 100
    assert r.set("k", "5", keepttl=True) and r.ttl("k") > 0
    assert r.set("k", "6") and r.ttl("k") == -1  # a plain SET drops the TTL
    assert r.set("p", "1", px=1500, nx=True) and 1000 < r.pttl("p") <= 1500
    assert r.set("k", "7", get=True) == b"6"
    assert r.setnx("k", "x") is False and r.setnx("n", "x") is True
    assert r.execute_command("SETEX", "se", 50, "v") and 49 <= r.ttl("se") <= 50


def test_ttl_and_expiry(r):
    assert r.ttl("missing") == -2 and r.pttl("missing") == -2
    r.set("k", "v")
    assert r.ttl("k") == -1 and r.pttl("k") == -1
    assert r.expire("k", 100) is True and r.ttl("k") == 100
    assert r.pexpire("k", 5000) is True and 4900 < r.pttl("k") <= 5000
    assert r.persist("k") is True and r.ttl("k") == -1 and r.persist("k") is False
    assert r.expire("missing", 10) is False
    r.incr("ctr")
    r.expire("ctr", 100)
    r.incr("ctr")  # INCR keeps the TTL
    assert r.ttl("ctr") > 0
    assert r.expire("k", -1) is True and r.exists("k") == 0  # past expiry deletes
    r.set("short", "v", px=50)
    time.sleep(0.12)
    assert r.get("short") is None and r.ttl("short") == -2  # lazy expiry
    # active expiry: keys nobody touches go away by themselves
    for i in range(200):
        r.set(f"tmp{i}", "v", px=30)
    deadline = time.monotonic() + 5
    while r.dbsize() > 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert r.dbsize() == 1  # only ctr is left
    assert r.info("stats")["expired_keys"] >= 200


def test_keys_patterns_and_scan(r):
    names = ["hello", "hallo", "hxllo", "hllo", "heeeello", "h*llo", "h?x", "a-b", "key:1", "key:2"]
    for n in names:
        r.set(n, "v")

    def keys(p):
        return sorted(k.decode() for k in r.keys(p))

    assert keys("*") == sorted(names)
    assert keys("h?llo") == ["h*llo", "hallo", "hello", "hxllo"]
    assert keys("h*llo") == ["h*llo", "hallo", "heeeello", "hello", "hllo", "hxllo"]
    assert keys("h[ae]llo") == ["hallo", "hello"]
    assert keys("h[^e]llo") == ["h*llo", "hallo", "hxllo"]
    assert keys("h[a-e]llo") == ["hallo", "hello"]
    assert keys("h\\*llo") == ["h*llo"]
    assert keys("key:[12]") == ["key:1", "key:2"]
    assert keys("nomatch*") == []
    r.flushall()
    want = {f"user:{i}" for i in range(3000)} | {f"other:{i}" for i in range(500)}
    with r.pipeline(transaction=False) as p:
        for k in want:
            p.set(k, "x")
        p.execute()
    seen, cursor, calls = set(), 0, 0
    while True:
        cursor, batch = r.scan(cursor, count=100)
        seen.update(k.decode() for k in batch)
        calls += 1
        if cursor == 0:
            break
    assert seen == want and calls > 10
    matched = {k.decode() for k in r.scan_iter(match="other:*", count=50)}
    assert matched == {k for k in want if k.startswith("other:")}
    assert err(r.execute_command, "SCAN", "0", "COUNT", "0") == "syntax error"


def test_info_config_command_client(r, rkv):
    r.set("a", "1")
    r.set("b", "2", ex=100)
    info = r.info()
    assert info["loading"] == 0 and info["rdb_bgsave_in_progress"] == 0
    assert info["db0"] == {"keys": 2, "expires": 1, "avg_ttl": 0}
    assert info["rdb_changes_since_last_save"] >= 2 and "rdb_last_save_time" in info
    assert info["rekindle_start"] == "fresh" and info["tcp_port"] == rkv.port
    assert "used_memory" in r.info("memory") and "db0" not in r.info("memory")
    assert r.config_get("save") == {"save": ""}
    assert r.config_get("appendonly") == {"appendonly": "no"}
    assert set(r.config_get("*max*")) >= {"maxmemory", "maxmemory-policy"}
    assert r.command_count() > 30
    assert r.execute_command("COMMAND", "DOCS") in ([], {})
    assert r.client_setname("tester") is True and r.client_getname() == "tester"
    assert r.execute_command("CLIENT", "SETINFO", "LIB-NAME", "x") == b"OK"


def test_debug_refused_without_enable_debug(tmp_path):
    s = Rkv(tmp_path, *NO_SAVE)
    try:
        with s.client() as c:
            assert err(c.execute_command, "DEBUG", "SEGFAULT").startswith("DEBUG command not allowed.")
            assert c.ping()
    finally:
        s.close()


def test_redis_cli_and_inline_commands(rkv):
    def cli(*args):
        p = subprocess.run(
            ["redis-cli", "-p", str(rkv.port), *args], capture_output=True, text=True, timeout=10, check=True
        )
        return p.stdout.strip()

    assert cli("PING") == "PONG"
    assert cli("SET", "greeting", "hello world") == "OK"
    assert cli("GET", "greeting") == "hello world"
    assert cli("DBSIZE") == "1"
    # inline commands, as typed into telnet, with Redis's quoting
    out, closed = rkv.raw(b'PING\r\nECHO "a b\\x41"\r\n\r\nGET greeting\n', timeout=0.3)
    assert out == b"+PONG\r\n$4\r\na bA\r\n$11\r\nhello world\r\n" and not closed


def recv_exactly(s, n):
    """n bytes from socket s (fails if it closes first)."""
    got = b""
    while len(got) < n:
        d = s.recv(1 << 20)
        assert d, "connection closed"
        got += d
    return got


def test_pipelining(rkv):
    n = 5000
    req = b"".join(resp("SET", f"k{i}", f"v{i}") for i in range(n))
    req += b"".join(resp("GET", f"k{i}") for i in range(n))
    with socket.create_connection(("127.0.0.1", rkv.port), timeout=20) as s:
        s.sendall(req)  # all in one write, replies read afterwards
        want = b"+OK\r\n" * n + b"".join(b"$%d\r\nv%d\r\n" % (len(b"v%d" % i), i) for i in range(n))
        got = recv_exactly(s, len(want))
    assert got == want


def test_a_big_reply_taken_whole_by_the_socket_leaves_the_connection_read(rkv):
    """A reply over rkv's 4 MiB pause threshold that the socket takes in one
    go (the client's receive buffer holds it all, as when the client reads
    as fast as it is written) must not leave the connection unread: the
    pause was once decided before the write, and then neither EPOLLIN nor
    EPOLLOUT was asked for, and the next request hung (CI's INFO timeout
    after a 24 MB GET)."""
    size = 5 << 20
    rkv.client().set("v", b"x" * size)
    want = b"$%d\r\n" % size + b"x" * size + b"\r\n"
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", rkv.port), timeout=5) as s:
            try:
                s.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 64 << 20)
            except PermissionError:
                pytest.skip("SO_RCVBUFFORCE needs CAP_NET_ADMIN")
            s.sendall(resp("GET", "v"))
            time.sleep(0.1)  # the whole reply into our receive buffer
            assert recv_exactly(s, len(want)) == want
            s.sendall(resp("PING"))
            assert s.recv(64) == b"+PONG\r\n"


def test_many_clients(rkv):
    n = 1000
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n + 100:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    socks = [socket.create_connection(("127.0.0.1", rkv.port), timeout=20) for _ in range(n)]
    try:
        for i, s in enumerate(socks):
            s.sendall(resp("SET", f"c{i}", i))
        for s in socks:
            assert s.recv(16) == b"+OK\r\n"
        for i, s in enumerate(socks):
            s.sendall(resp("GET", f"c{i}"))
        for i, s in enumerate(socks):
            assert s.recv(64) == b"$%d\r\n%d\r\n" % (len(str(i)), i)
        with rkv.client() as c:
            assert c.dbsize() == n and c.info("clients")["connected_clients"] == n + 1
    finally:
        for s in socks:
            s.close()


@pytest.mark.parametrize(
    "bad, message",
    [
        (b"*abc\r\n", b"invalid multibulk length"),
        (b"*99999999\r\n", b"invalid multibulk length"),
        (b"*2\r\n$3\r\nSET\r\n$600000000\r\n", b"invalid bulk length"),
        (b"*1\r\n:5\r\n", b"expected '$', got ':'"),
        (b'SET "unterminated\r\n', b"unbalanced quotes in request"),
    ],
)
def test_protocol_error_closes_only_that_connection(rkv, bad, message):
    with rkv.client() as other:
        other.set("survivor", "yes")
        out, closed = rkv.raw(resp("PING") + bad + resp("PING"))
        assert out == b"+PONG\r\n-ERR Protocol error: " + message + b"\r\n" and closed
        assert other.get("survivor") == b"yes"  # the other connection keeps working
    assert rkv.log("protocol_error")


def test_maxmemory(tmp_path):
    s = Rkv(tmp_path, *NO_SAVE, "--maxmemory", "1mb")
    try:
        with s.client() as c:
            with pytest.raises(redis.exceptions.OutOfMemoryError) as e:
                for i in range(1000):
                    c.set(f"k{i}", "x" * 4096)
            assert "command not allowed when used memory > 'maxmemory'" in str(e.value)
            assert c.get("k0") == b"x" * 4096  # reads still work
            assert c.delete("k0") == 1
    finally:
        s.close()


# ---- warm restarts ------------------------------------------------------------


def fill(c, n, ttl_every=3):
    with c.pipeline(transaction=False) as p:
        for i in range(n):
            p.set(f"key:{i}", f"value:{i}" * (1 + i % 7), ex=1000 + i if i % ttl_every == 0 else None)
        p.execute()


def check_all(c, n, ttl_every=3):
    with c.pipeline(transaction=False) as p:
        for i in range(n):
            p.get(f"key:{i}")
            p.ttl(f"key:{i}")
        out = p.execute()
    for i in range(n):
        assert out[2 * i] == f"value:{i}".encode() * (1 + i % 7)
        if i % ttl_every == 0:
            assert 0 < out[2 * i + 1] <= 1000 + i
        else:
            assert out[2 * i + 1] == -1


def test_warm_restart_after_segfault_keeps_keys_and_ttls(rkv):
    n = 3000
    c = rkv.client()
    fill(c, n)
    c.set("soon", "gone", px=400)  # expires after the restart
    before = c.pttl("key:0")
    with pytest.raises(redis.ConnectionError):
        c.execute_command("DEBUG", "SEGFAULT")
    ready = rkv.ready(2)
    assert ready["start"] == "warm" and ready["keys"] == n + 1
    assert rkv.log("recovered")[0]["keys"] == n + 1
    c = rkv.wait_serving()
    check_all(c, n)
    assert c.pttl("key:0") < before  # absolute expiry: the clock kept running
    assert c.info("server")["rekindle_start"] == "warm"
    # active expiry runs in the new incarnation: DBSIZE touches no key
    deadline = time.monotonic() + 5
    while c.dbsize() > n and time.monotonic() < deadline:
        time.sleep(0.05)
    assert c.dbsize() == n
    # and the restarted server takes writes
    c.set("after", "restart")
    assert c.get("after") == b"restart"


def test_warm_restart_checks_the_table_in_the_background(rkv):
    """By default a warm start serves at once (recovery ends in O(1)) and
    checks the table in slices from the event loop; the check finishes and
    says so."""
    c = rkv.client()
    fill(c, 3000)
    with pytest.raises(redis.ConnectionError):
        c.execute_command("DEBUG", "SEGFAULT")
    ready = rkv.ready(2)
    assert ready["start"] == "warm"
    assert rkv.log("recovered")[-1]["swept_objects"] == 0, "no sweep by default"
    verified = rkv.wait_log("verified")
    assert verified["keys"] == 3000
    check_all(rkv.wait_serving(), 3000)


def test_keyspace_in_huge_pages_mapped_with_them_after_a_warm_restart(rkv):
    """The keyspace is collapsed into huge pages as it grows (where the
    kernel allows a collapse of shmem), and after a warm restart the new
    process maps it with them: a fault per 2 MiB, not per 4 KiB."""
    c = rkv.client()
    n = 6000
    fill(c, n)
    c.set("big", "x" * (24 << 20))  # past a few 2 MiB ranges of the heap
    info = c.info("memory")
    if shmem_huge_denied():
        assert info["arena_hugepages"].startswith("refused by the kernel")
        return
    assert info["arena_hugepages"] == "on"
    assert info["arena_hugepage_bytes"] >= 8 << 20
    pid = c.info("server")["process_id"]
    assert arena_pmd_kb(pid, "keyspace") >= 8 << 10
    with pytest.raises(redis.ConnectionError):
        c.execute_command("DEBUG", "SEGFAULT")
    assert rkv.ready(2)["start"] == "warm"
    c = rkv.wait_serving()
    check_all(c, n)
    assert len(c.get("big")) == 24 << 20
    rkv.wait_log("verified")
    pid = c.info("server")["process_id"]
    assert arena_pmd_kb(pid, "keyspace") >= 8 << 10, "the new mapping has huge pages"
    assert c.info("memory")["arena_hugepages"] == "on"


def test_hugepages_no_keeps_small_pages(tmp_path):
    s = Rkv(tmp_path, *NO_SAVE, "--hugepages", "no")
    try:
        c = s.client()
        c.set("big", "x" * (24 << 20))
        info = c.info("memory")
        assert info["arena_hugepages"] == "off" and info["arena_hugepage_bytes"] == 0
        assert arena_pmd_kb(c.info("server")["process_id"], "keyspace") == 0
    finally:
        s.close()


def test_recovery_sweep_yes_marks_and_sweeps_before_serving(tmp_path):
    s = Rkv(tmp_path, *NO_SAVE, "--enable-debug", "yes", "--recovery-sweep", "yes")
    try:
        c = s.client()
        fill(c, 2000)
        with pytest.raises(redis.ConnectionError):
            c.execute_command("DEBUG", "SEGFAULT")
        assert s.ready(2)["start"] == "warm"
        assert s.runtime_events("recovered")[-1]["cleanup"] == "sweep"
        assert not s.log("verified"), "the mark pass already checked everything"
        check_all(s.wait_serving(), 2000)
    finally:
        s.close()


def test_warm_restart_under_supervisor_after_sigkill(tmp_path):
    s = Rkv(tmp_path, *NO_SAVE, supervised=True)
    try:
        c = s.client()
        fill(c, 2000)
        pid = s.app_pid()
        os.kill(pid, signal.SIGKILL)
        ready = s.ready(2)
        assert ready["start"] == "warm" and ready["keys"] == 2000 and ready["listen"] == "inherited"
        c = s.wait_serving()
        check_all(c, 2000)
        assert s.app_pid() != pid
    finally:
        s.close()


def test_crash_inside_mutation_goes_cold_and_reloads_snapshot(rkv):
    c = rkv.client()
    fill(c, 500)
    assert c.save() is True
    c.set("unsaved", "lost")  # not in the snapshot
    with pytest.raises(redis.ConnectionError):
        c.execute_command("DEBUG", "CRASH-IN-MUTATION", "half-linked")
    ready = rkv.ready(2)
    assert ready["start"] == "cold" and ready["keys"] == 500
    assert "unsafe" in ready["reason"]  # the log says why
    assert rkv.runtime_events("start")[-1]["kind"] == "cold"
    c = rkv.wait_serving()
    check_all(c, 500)
    assert c.get("unsaved") is None and c.get("half-linked") is None
    assert c.dbsize() == 500


# ---- snapshot ---------------------------------------------------------------------


def test_snapshot_round_trip(tmp_path):
    s = Rkv(tmp_path, *NO_SAVE)
    try:
        c = s.client()
        fill(c, 1000)
        c.set("short", "x", px=300)  # will have expired on disk
        assert c.save() is True
        assert c.info("persistence")["rdb_changes_since_last_save"] == 0
        c.set("later", "bg")
        assert c.bgsave() is True
        deadline = time.monotonic() + 10
        while c.info("persistence")["rdb_bgsave_in_progress"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert c.info("persistence")["rdb_last_bgsave_status"] == "ok"
        assert s.log("bgsave_done")[0]["ok"] is True
        c.close()
        os.kill(s.proc.pid, signal.SIGKILL)  # no supervisor: the process is gone
        s.proc.wait()
        s.err.close()
        time.sleep(0.4)
    finally:
        s.close()
    s2 = Rkv(tmp_path, *NO_SAVE)
    try:
        ready = s2.ready()
        assert ready["start"] == "fresh" and ready["keys"] == 1001
        c = s2.client()
        check_all(c, 1000)
        assert c.get("later") == b"bg" and c.get("short") is None
        assert "1 expired skipped" in s2.log("snapshot")[0]["result"]
    finally:
        s2.close()


def test_sigterm_saves_when_save_points_are_set(tmp_path):
    s = Rkv(tmp_path, "--save", "3600 1")
    with s.client() as c:
        c.set("kept", "on shutdown")
    s.close()
    assert s.log("shutdown")[0]["saved"] is True
    s2 = Rkv(tmp_path, *NO_SAVE)
    try:
        assert s2.client().get("kept") == b"on shutdown"
    finally:
        s2.close()


def corrupt_flip(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))


def corrupt_truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])


def corrupt_magic(path):
    data = path.read_bytes()
    path.write_bytes(b"XXXXXXXX" + data[8:])


@pytest.mark.parametrize(
    "corrupt, why",
    [
        (corrupt_flip, "checksum mismatch"),
        (corrupt_truncate, "checksum mismatch"),
        (corrupt_magic, "bad magic"),
    ],
)
def test_corrupt_snapshot_is_rejected_whole(tmp_path, corrupt, why):
    s = Rkv(tmp_path, *NO_SAVE)
    with s.client() as c:
        fill(c, 300)
        c.save()
    s.close()
    corrupt(tmp_path / "rkv.snap")
    s2 = Rkv(tmp_path, *NO_SAVE)
    try:
        rejected = s2.log("snapshot_rejected")
        assert rejected and why in rejected[0]["why"] and rejected[0]["action"] == "starting empty"
        assert s2.ready()["keys"] == 0
        assert s2.client().dbsize() == 0  # nothing half-loaded
    finally:
        s2.close()


def test_plain_malloc_build_serves_and_snapshots(tmp_path):
    s = Rkv(tmp_path, *NO_SAVE, exe=RKV_MALLOC)
    try:
        with s.client() as c:
            fill(c, 200)
            assert c.save()
        assert '{"rekindle"' not in s.stderr()  # no runtime in this build
    finally:
        s.close()
    s2 = Rkv(tmp_path, *NO_SAVE, exe=RKV_MALLOC)
    try:
        check_all(s2.client(), 200)
    finally:
        s2.close()
