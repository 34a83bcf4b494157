"""Regression tests of rkv defects from the issue tracker, each against real
processes, redis-py and plain RESP sockets, and a real Redis 7 to compare
with, loopback only:
glob patterns that took exponential time, a rejected snapshot that the
next save overwrote, the accept loop that spun when out of fds, a corrupt
entry that a warm start kept, query buffers that never shrank, and
misleading messages (--arena-size units, OOM without maxmemory)."""

import json
import os
import pwd
import random
import resource
import selectors
import shutil
import signal
import socket
import stat
import struct
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import redis
from rkv_harness import RKV, Rkv, resp
from supervisor_harness import free_port

NO_SAVE = ("--save", "")


@pytest.fixture
def rkv(tmp_path):
    s = Rkv(tmp_path, *NO_SAVE)
    yield s
    s.close()


# ---- 1. glob patterns: linear, and Redis's semantics -------------------------


@pytest.fixture
def real_redis(tmp_path):
    """A real Redis 7 on a free loopback port, to compare answers with."""
    if not shutil.which("redis-server"):
        pytest.fail("redis-server missing: run scripts/deps.sh")
    port = free_port()
    workdir = tmp_path / "redis"
    workdir.mkdir()
    argv = [
        "redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir),
        "--save", "", "--appendonly", "no", "--daemonize", "no",
        "--logfile", str(workdir / "redis.log"),
    ]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    c = redis.Redis(port=port, socket_timeout=20)
    deadline = time.monotonic() + 15
    while True:
        try:
            c.ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise
            time.sleep(0.02)
    yield c
    c.close()
    proc.terminate()
    proc.wait(timeout=15)


PATHOLOGICAL = "*a*a*a*a*a*a*a*a*a*a*a*a*b"


def test_pathological_glob_answers_at_once(rkv):
    # 5 s, not the harness's 20: without the fix this reply never comes
    c = redis.Redis(port=rkv.port, socket_timeout=5)
    c.set("a" * 200, "v")
    c.set("a" * 40 + "b", "v")  # the one key that matches both patterns
    t0 = time.monotonic()
    assert c.keys(PATHOLOGICAL) == [b"a" * 40 + b"b"]
    assert time.monotonic() - t0 < 0.1
    stars = "*a" * 30 + "*b"  # SCAN MATCH with 31 stars
    t0 = time.monotonic()
    assert c.scan(0, match=stars, count=1000) == (0, [b"a" * 40 + b"b"])
    assert time.monotonic() - t0 < 0.1
    c.close()


def test_long_pattern_against_a_long_key_answers_in_time(rkv):
    """KEYS "*", 100 KB of "a", "b" against a key of 200 KB of "a"s took about
    10^10 steps: two minutes with the loop blocked.  Past the last star the
    pattern can only match the key's end, so that is now one try, with the
    right answer both ways.  A long part between two stars is still
    searched for, and a match gives up (no match, logged) after its work
    limit, as Redis gives up on a pattern nested deeper than 1000 stars."""
    c = rkv.client()  # no retries: a KEYS that timed out is not sent again
    long_a, tail = b"a" * 200_000, b"a" * 100_000 + b"b"
    c.set(long_a, "v")
    t0 = time.monotonic()
    assert c.keys(b"*" + tail) == []
    assert c.scan(0, match=b"*" + tail, count=100) == (0, [])
    c.set(long_a + b"b", "v")
    assert c.keys(b"*" + tail) == [long_a + b"b"]
    assert not rkv.log("glob_gave_up")
    c.delete(long_a + b"b")
    assert c.keys(b"*" + tail + b"*") == []  # between two stars: the limit
    assert c.scan(0, match=b"*" + tail + b"*", count=100) == (0, [])
    assert time.monotonic() - t0 < 10  # each took about 2 minutes
    gave_up = rkv.log("glob_gave_up")[0]
    assert (gave_up["pattern_bytes"], gave_up["key_bytes"]) == (len(tail) + 2, len(long_a))
    assert gave_up["answer"] == "no match"
    assert sorted(c.keys("*a")) == [long_a] and c.keys("a*b") == []  # short ones as ever
    c.close()


# Pattern pieces that exercise every rule: stars, '?', classes (negated,
# ranges in both orders, escapes, a ']' that opens a class, unterminated),
# escapes, and bytes above 0x7f (ranges compare as signed char in Redis).
ALPHABET = b"aab-]\\^[\x80\xff"


def random_token(rng):
    kind = rng.choice("**??lllle[[[")
    if kind == "*":
        return b"*"
    if kind == "?":
        return b"?"
    if kind == "l":
        return bytes([rng.choice(ALPHABET)])
    if kind == "e":
        return b"\\" + bytes([rng.choice(ALPHABET)])
    body = b"^" if rng.random() < 0.3 else b""
    for _ in range(rng.randint(0, 3)):
        if rng.random() < 0.4:
            body += bytes([rng.choice(ALPHABET), ord("-"), rng.choice(ALPHABET)])
        elif rng.random() < 0.2:
            body += b"\\" + bytes([rng.choice(ALPHABET)])
        else:
            body += bytes([rng.choice(ALPHABET)])
    return b"[" + body + (b"]" if rng.random() < 0.9 else b"")


def random_pattern(rng):
    p = b"".join(random_token(rng) for _ in range(rng.randint(1, 14)))
    if rng.random() < 0.1:
        p += b"\\"  # a backslash that ends the pattern
    if rng.random() < 0.1:
        p += b"[a"  # a class that never closes
    return p


def test_glob_fuzz_agrees_with_redis(rkv, real_redis):
    """Seeded random patterns, heavy in stars and classes, against random
    keys: rkv answers each at once and exactly as Redis 7 does."""
    rng = random.Random(20220301)
    ours = redis.Redis(port=rkv.port, socket_timeout=5)
    keys = {b""} | {bytes(rng.choice(ALPHABET) for _ in range(rng.randint(1, 40))) for _ in range(150)}
    keys |= {b"a" * 120, b"a" * 119 + b"b"}
    for server in (ours, real_redis):
        server.mset(dict.fromkeys(keys, b"v"))
    patterns = [random_pattern(rng) for _ in range(600)]
    patterns += [b"*a" * n + b"*b" for n in (5, 20, 40)] + [b"**", b"?", b"[", b"[^", b"\\", b"[]]", b"[a-]"]
    slowest = 0.0
    for p in patterns:
        t0 = time.monotonic()
        got = sorted(ours.keys(p))
        slowest = max(slowest, time.monotonic() - t0)
        assert got == sorted(real_redis.keys(p)), f"pattern {p!r}"
    # each KEYS walks ~150 keys: milliseconds; exponential time takes seconds
    assert slowest < 1.0
    ours.close()


# ---- 2. a snapshot rkv could not load is kept, never overwritten ----------------


def files_holding(d, data):
    return [p for p in d.iterdir() if p.is_file() and p.read_bytes() == data]


def saved_snapshot(tmp_path, n=300):
    """The bytes of a real snapshot of n keys (about 30 KB), written by rkv."""
    s = Rkv(tmp_path, *NO_SAVE)
    with s.client() as c:
        c.mset({f"key:{i}": "v" * 80 for i in range(n)})
        assert c.save()
    s.close()
    return (tmp_path / "rkv.snap").read_bytes()


def test_truncated_snapshot_is_moved_aside_not_overwritten(tmp_path):
    snap = tmp_path / "rkv.snap"
    torn = saved_snapshot(tmp_path)[:-100]
    snap.write_bytes(torn)
    # earlier rejected files under the names rkv would pick now: never replaced
    now = int(time.time())
    decoys = {tmp_path / f"rkv.snap.rejected-{t}": b"earlier %d" % t for t in range(now - 1, now + 5)}
    for path, data in decoys.items():
        path.write_bytes(data)
    s = Rkv(tmp_path)  # the default save points: SIGTERM saves
    with s.client() as c:
        assert c.dbsize() == 0
    s.close()
    assert files_holding(tmp_path, torn), "the rejected snapshot was overwritten"
    rejected = s.log("snapshot_rejected")[0]
    assert rejected["code"] == "corrupt" and rejected["action"] == "starting empty"
    assert "checksum mismatch" in rejected["why"]
    assert Path(rejected["kept_as"]).read_bytes() == torn  # byte for byte
    assert all(path.read_bytes() == data for path, data in decoys.items())
    assert s.log("shutdown")[0]["saved"] is True  # a new rkv.snap beside it
    assert snap.read_bytes() != torn


def test_periodic_bgsave_does_not_overwrite_a_rejected_snapshot(tmp_path):
    torn = saved_snapshot(tmp_path)[:-100]
    (tmp_path / "rkv.snap").write_bytes(torn)
    s = Rkv(tmp_path, "--save", "1 1")  # a BGSAVE 1 s after the first change
    try:
        with s.client() as c:
            c.set("k", "v")
        assert s.wait_log("bgsave_done")["ok"] is True
        assert files_holding(tmp_path, torn), "the periodic BGSAVE overwrote the rejected snapshot"
    finally:
        s.close()


def test_snapshot_path_that_is_a_directory_is_moved_aside(tmp_path):
    (tmp_path / "rkv.snap").mkdir()
    (tmp_path / "rkv.snap" / "inside").write_bytes(b"keep me")
    s = Rkv(tmp_path)
    with s.client() as c:
        c.set("k", "v")
    s.close()
    rejected = s.log("snapshot_rejected")[0]
    assert rejected["code"] == "not_regular" and "directory" in rejected["why"]
    assert (Path(rejected["kept_as"]) / "inside").read_bytes() == b"keep me"
    assert s.log("shutdown")[0]["saved"] is True
    s2 = Rkv(tmp_path, *NO_SAVE)
    try:
        assert s2.client().get("k") == b"v"  # the shutdown save took its place
    finally:
        s2.close()


def test_fifo_at_the_snapshot_path_does_not_block_the_start(tmp_path):
    """A FIFO at the path, with no writer: open() used to wait for one
    forever.  It is not a regular file: moved aside at once, like a
    directory, and rkv starts empty."""
    os.mkfifo(tmp_path / "rkv.snap")
    s = Rkv(tmp_path)  # waits 15 s for "ready"
    with s.client() as c:
        c.set("k", "v")
    s.close()
    assert s.log("ready")[0]["ready_ms"] < 5000
    rejected = s.log("snapshot_rejected")[0]
    assert rejected["code"] == "not_regular" and "FIFO" in rejected["why"]
    assert rejected["action"] == "starting empty"
    assert stat.S_ISFIFO(os.lstat(rejected["kept_as"]).st_mode)
    assert s.log("shutdown")[0]["saved"] is True
    assert (tmp_path / "rkv.snap").is_file()


def drop_to_nobody():
    nobody = pwd.getpwnam("nobody")
    os.setgroups([])
    os.setgid(nobody.pw_gid)
    os.setuid(nobody.pw_uid)


def run_rkv_until_exit(d, *args, preexec_fn=None):
    """rkv in the foreground, expected to exit at once: (status, stderr)."""
    run = d / "run"
    run.mkdir(mode=0o777, exist_ok=True)
    run.chmod(0o777)
    env = {k: v for k, v in os.environ.items() if k not in ("LISTEN_FDS", "LISTEN_PID")}
    env["REKINDLE_RUNTIME_DIR"] = str(run)
    argv = [str(RKV), "--port", str(free_port()), "--dir", str(d), *args]
    p = subprocess.run(
        argv, capture_output=True, text=True, timeout=30, env=env, preexec_fn=preexec_fn, check=False
    )
    lines = [json.loads(x) for x in p.stderr.splitlines() if x.startswith('{"rkv":"snapshot_rejected"')]
    return p.returncode, p.stderr, lines


def assert_left_alone(d, data):
    """The snapshot is where it was, byte for byte, and nothing was moved aside."""
    assert (d / "rkv.snap").read_bytes() == data
    assert not list(d.glob("rkv.snap.rejected-*"))


def test_unreadable_snapshot_refuses_to_start(tmp_path):
    """rkv as nobody, the snapshot root's and mode 600 in a directory
    nobody may write: it used to be moved aside, and the next save wrote an
    empty rkv.snap in its place.  It may be fine: rkv refuses to start,
    says why, and leaves it as it is (Redis exits too)."""
    data = saved_snapshot(tmp_path)
    d = Path(tempfile.mkdtemp(prefix="rkv-nobody-"))  # tmp_path's parents are root's alone
    try:
        d.chmod(0o777)
        (d / "rkv.snap").write_bytes(data)
        (d / "rkv.snap").chmod(0o600)
        status, err, lines = run_rkv_until_exit(d, preexec_fn=drop_to_nobody)
        assert status == 1
        assert f"cannot read the snapshot {d / 'rkv.snap'}: cannot open: Permission denied (errno 13)" in err
        assert len(lines) == 1 and lines[0]["code"] == "unreadable" and lines[0]["errno"] == 13
        assert lines[0]["action"] == "refusing to start" and "kept_as" not in lines[0]
        assert '"rkv":"ready"' not in err
        assert_left_alone(d, data)
    finally:
        shutil.rmtree(d)


def test_snapshot_that_does_not_fit_the_arena_refuses_to_start(tmp_path):
    """A valid snapshot of 2 MB, and --arena-size 1mb: rkv says to raise
    --arena-size and refuses to start; the file stays."""
    s = Rkv(tmp_path, *NO_SAVE)
    with s.client() as c:
        c.mset({f"key:{i}": "v" * 1024 for i in range(2000)})
        assert c.save()
    s.close()
    data = (tmp_path / "rkv.snap").read_bytes()
    status, err, lines = run_rkv_until_exit(tmp_path, "--arena-size", "1mb")
    assert status == 1 and "raise --arena-size (now 1048576 bytes)" in err
    assert len(lines) == 1 and lines[0]["code"] == "no_room" and lines[0]["action"] == "refusing to start"
    assert "valid, but out of memory after" in lines[0]["why"]
    assert_left_alone(tmp_path, data)


def limit_data_to_16mb():
    resource.setrlimit(resource.RLIMIT_DATA, (16 << 20, 16 << 20))


def test_snapshot_rkv_has_no_memory_to_read_refuses_to_start(tmp_path):
    """A valid 32 MB snapshot, and rkv's private memory limited to 16 MB
    (RLIMIT_DATA; the arena is shared memory): reading it fails with
    ENOMEM, which is not the file's fault and not no_room (the arena is
    large): refused, the file left as it is."""
    s = Rkv(tmp_path, *NO_SAVE)
    with s.client() as c:
        assert c.set("big", b"x" * (32 << 20)) and c.save()
    s.close()
    data = (tmp_path / "rkv.snap").read_bytes()
    status, err, lines = run_rkv_until_exit(tmp_path, preexec_fn=limit_data_to_16mb)
    assert status == 1 and "(errno 12); refusing to start" in err
    assert len(lines) == 1 and lines[0]["code"] == "unreadable" and lines[0]["errno"] == 12
    assert_left_alone(tmp_path, data)


def test_snapshot_that_cannot_be_moved_aside_stops_the_start(tmp_path):
    """Torn, in a directory rkv (nobody) cannot write: it refuses to start
    rather than run where a save could replace the file."""
    torn = saved_snapshot(tmp_path)[:-100]
    d = Path(tempfile.mkdtemp(prefix="rkv-nobody-"))
    try:
        d.chmod(0o755)
        (d / "rkv.snap").write_bytes(torn)
        (d / "rkv.snap").chmod(0o644)
        status, err, lines = run_rkv_until_exit(d, preexec_fn=drop_to_nobody)
        assert status == 1
        assert "nor move it aside (Permission denied); refusing to start" in err
        assert len(lines) == 1 and lines[0]["code"] == "corrupt" and lines[0]["action"] == "refusing to start"
        assert (d / "rkv.snap").read_bytes() == torn
    finally:
        shutil.rmtree(d)


# ---- 4. out of fds: maxclients fits the limit, and nothing spins ------------------


def limit_fds_to_64():
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))  # hard too: rkv cannot raise it


def cpu_seconds(pid):
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def read_until_closed(socks, want, timeout):
    """What each socket received; stops when want of them were closed by
    the server, or at the timeout.  Returns (received, closed)."""
    got, closed = {x: b"" for x in socks}, set()
    with selectors.DefaultSelector() as sel:
        for x in socks:
            sel.register(x, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        while len(closed) < want and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=0.2):
                data = key.fileobj.recv(4096)
                got[key.fileobj] += data
                if not data:
                    closed.add(key.fileobj)
                    sel.unregister(key.fileobj)
    return got, closed


def test_clients_over_the_fd_limit_are_refused_without_spinning(tmp_path):
    """ulimit -n 64: maxclients becomes 64 - 32, the clients over it get
    Redis's error and are closed, the others are served, and rkv neither
    spins nor floods its log."""
    s = Rkv(tmp_path, *NO_SAVE, preexec_fn=limit_fds_to_64)
    socks = []
    try:
        socks = [socket.create_connection(("127.0.0.1", s.port), timeout=10) for _ in range(100)]
        cpu0 = cpu_seconds(s.proc.pid)
        time.sleep(2)
        assert cpu_seconds(s.proc.pid) - cpu0 < 0.3  # the accept loop that spun took ~1.8 s
        lowered = [e for e in s.log("warning") if e.get("what") == "maxclients"]
        assert lowered and lowered[0]["requested"] == 10000 and lowered[0]["maxclients"] == 32
        got, refused = read_until_closed(socks, want=100 - 32, timeout=10)
        assert len(refused) == 100 - 32
        assert all(got[x] == b"-ERR max number of clients reached\r\n" for x in refused)
        served = [x for x in socks if x not in refused]
        for x in served:
            x.sendall(resp("PING"))
        assert all(x.recv(64) == b"+PONG\r\n" for x in served)
        # a slot that frees up takes a new client (redis-py, after rkv saw the close)
        served[0].close()
        deadline = time.monotonic() + 10
        while True:
            try:
                with s.client() as c:
                    assert c.set("after", "1") and c.info("clients")["maxclients"] == 32
                    assert c.info("stats")["rejected_connections"] >= 100 - 32
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        assert len(s.stderr().splitlines()) < 100
    finally:
        for x in socks:
            x.close()
        s.close()


# ---- 5a. a corrupt entry found by the warm start's check ------------------------

# struct entry: next, xprev, xnext, hash, expire_ms (8 bytes each), then
# klen, vlen, cap (u32 each), then the key and the value.
KLEN_BEFORE_KEY, VLEN_BEFORE_KEY, CAP_BEFORE_KEY = 12, 8, 4


def arena_fd_path(pid):
    """/proc path of the process's keyspace arena memfd."""
    for fd in os.listdir(f"/proc/{pid}/fd"):
        path = f"/proc/{pid}/fd/{fd}"
        try:
            if os.readlink(path).startswith("/memfd:rekindle:keyspace"):
                return path
        except FileNotFoundError:
            continue
    raise AssertionError(f"no keyspace memfd in /proc/{pid}/fd")


def corrupt_vlen(pid, key, vlen, bad_vlen):
    """Writes bad_vlen into the arena entry of key (found by its bytes)."""
    with open(arena_fd_path(pid), "r+b") as f:
        data = f.read()
        at = data.find(key)
        assert at > 0 and data.find(key, at + 1) < 0, "the key is in the arena once"
        klen, old, cap = struct.unpack_from("<III", data, at - KLEN_BEFORE_KEY)
        assert (klen, old) == (len(key), vlen) and klen + vlen <= cap
        f.seek(at - VLEN_BEFORE_KEY)
        f.write(struct.pack("<I", bad_vlen))


def wait_cold_ready(s, timeout=15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        cold = [e for e in s.log("ready") if e["start"] == "cold"]
        if cold:
            return cold[0]
        time.sleep(0.02)
    raise AssertionError(f"no cold start; stderr:\n{s.stderr()[-4000:]}")


@pytest.mark.parametrize("sweep", ["no", "yes"])
def test_entry_longer_than_its_block_makes_the_warm_start_cold(tmp_path, sweep):
    """vlen 0x7fffff in one arena entry, then SIGKILL under the supervisor:
    the warm start's check (in slices while serving, or the mark pass)
    finds it, goes cold with the reason logged, and the snapshot brings the
    key back whole; GET does not crash."""
    s = Rkv(tmp_path, *NO_SAVE, "--recovery-sweep", sweep, supervised=True)
    try:
        key, value = b"corrupt-me:%d" % random.getrandbits(48), b"v" * 100
        c = s.client()
        c.mset({f"key:{i}": f"value:{i}" for i in range(500)})
        c.set(key, value)
        assert c.save()
        c.close()
        pid = s.app_pid()
        corrupt_vlen(pid, key, len(value), 0x7FFFFF)
        os.kill(pid, signal.SIGKILL)
        failed = s.wait_log("recovery_check_failed")
        assert failed["why"] == "an entry whose key and value lengths exceed its block"
        cold = wait_cold_ready(s)
        assert cold["keys"] == 501  # reloaded from the snapshot
        assert "lengths exceed its block" in s.runtime_events("start")[-1]["reason"]
        c = s.wait_serving()
        assert c.get(key) == value and c.get("key:7") == b"value:7"
        assert c.dbsize() == 501
        starts = len(s.log("ready"))
        assert c.get(key) == value and len(s.log("ready")) == starts  # no crash, no restart
    finally:
        s.close()


# ---- 5b. a request that reaches a broken chain before the check does ------------

ENTRY = struct.Struct("<QQQQqIII")  # next, xprev, xnext, hash, expire_ms, klen, vlen, cap; then data
CAP_AT = ENTRY.size - 4
DB_MAGIC = struct.pack("<Q", 0x726B762D64623031)  # "rkv-db01"
DB_HEAD = struct.Struct("<QQQQQ")  # magic, seed, buckets, mask, count
COUNT_AT = 32
TABLE_KEYS = 1 << 16  # the table's size exactly: the next new key doubles it


class Arena:
    """The keyspace arena of a stopped rkv, read and written through its
    memfd: an address is the arena's base plus the offset in the file."""

    def __init__(self, pid):
        self.path = arena_fd_path(pid)
        starts = []
        for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
            if "rekindle:keyspace" in line:
                addr, _, offset = line.split()[:3]
                starts.append(int(addr.split("-")[0], 16) - int(offset, 16))
        self.base = min(starts)
        self.data = Path(self.path).read_bytes()
        self.db = self.data.find(DB_MAGIC)
        assert self.db >= 0 and self.data.find(DB_MAGIC, self.db + 1) < 0, "one db header in the arena"
        _, _, self.buckets, self.mask, self.count = DB_HEAD.unpack_from(self.data, self.db)

    def head(self, b):
        return struct.unpack_from("<Q", self.data, self.buckets - self.base + 8 * b)[0]

    def entry(self, addr):
        """(next, key, cap) of the entry at addr."""
        at = addr - self.base
        nxt, _, _, _, _, klen, _, cap = ENTRY.unpack_from(self.data, at)
        return nxt, self.data[at + ENTRY.size : at + ENTRY.size + klen], cap

    def write(self, at, data):
        with open(self.path, "r+b") as f:
            f.seek(at)
            f.write(data)

    def last_quarter_pair(self):
        """An entry X in the last quarter of the buckets, where the check in
        slices comes last, with an entry Y behind it: (X's address, Y's key)."""
        for b in range(self.mask, self.mask * 3 // 4, -1):
            x = self.head(b)
            if x and self.entry(x)[0]:
                return x, self.entry(self.entry(x)[0])[1]
        raise AssertionError("no chain of two in the last quarter of the table")


def fill_table(c):
    """TABLE_KEYS keys: a table of exactly TABLE_KEYS buckets, full."""
    for start in range(0, TABLE_KEYS, 4096):
        c.mset({f"key:{i}": "v" for i in range(start, min(start + 4096, TABLE_KEYS))})


def stop_app(s):
    pid = s.app_pid()
    os.kill(pid, signal.SIGSTOP)
    return pid


def queue_request(s, *args):
    """A connection with one request, waiting in the listening socket's
    backlog for the next incarnation."""
    sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
    sock.sendall(resp(*args))
    return sock


def reply_or_close(sock):
    """What the server sent before it closed the connection, or None if it
    neither answered nor closed within the socket's timeout."""
    out = b""
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return out
            out += data
    except TimeoutError:
        return out or None
    finally:
        sock.close()


def kill_stuck_apps(s):
    """SIGKILLs any rkv the supervisor of s still has as a child (one that
    spins in a cycle ignores SIGTERM), before the supervisor is stopped."""
    for e in s.supervisor_events("spawn"):
        try:
            stat = Path(f"/proc/{e['pid']}/stat").read_text()
        except FileNotFoundError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == s.proc.pid:
            os.kill(e["pid"], signal.SIGKILL)


def assert_cold_after_check(s, why):
    failed = s.wait_log("recovery_check_failed")
    assert why in failed["why"]
    assert wait_cold_ready(s)["keys"] == 0  # no snapshot: --save ""
    assert s.wait_serving().dbsize() == 0


@pytest.mark.parametrize("request_kind", ["GET", "SCAN", "KEYS", "SET", "FLUSHALL", "SAVE"])
def test_cycle_reached_by_a_request_before_the_check_goes_cold(tmp_path, request_kind):
    """One entry's next pointer made to point at itself, in the last quarter
    of a table of 65536 keys; SIGKILL under the supervisor, with a request
    waiting in the backlog that walks that chain (GET of the key behind it),
    some chains (SCAN) or all of them (KEYS, a SET that doubles the table,
    FLUSHALL, SAVE).  The request runs before the check in slices gets
    there: it used to follow the cycle forever, at 100% CPU.  Now the chain
    is checked first: the start goes cold, with the reason logged."""
    s = Rkv(tmp_path, *NO_SAVE, supervised=True)
    try:
        with s.client() as c:
            fill_table(c)
        arena = Arena(stop_app(s))
        assert (arena.mask, arena.count) == (TABLE_KEYS - 1, TABLE_KEYS)
        x, behind = arena.last_quarter_pair()
        arena.write(x - arena.base, struct.pack("<Q", x))  # x->next = x
        args = {
            "GET": ["GET", behind],
            "SCAN": ["SCAN", 0, "MATCH", "no-such-key", "COUNT", 10 * TABLE_KEYS],
            "KEYS": ["KEYS", "no-such-key"],
            "SET": ["SET", "one-more-key", "v"],
            "FLUSHALL": ["FLUSHALL"],
            "SAVE": ["SAVE"],
        }[request_kind]
        sock = queue_request(s, *args)
        os.kill(s.app_pid(), signal.SIGKILL)
        assert reply_or_close(sock) == b"", "the request was answered, or hung"
        assert_cold_after_check(s, "a cycle")
    finally:
        kill_stuck_apps(s)
        s.close()


def test_set_cannot_write_past_a_block_before_the_check(tmp_path):
    """An entry in the last quarter of the table claims 8 KB of room (cap)
    in a block of about a hundred bytes; a SET of 5000 bytes to its key
    waits in the backlog across SIGKILL.  It used to be written in place,
    past the block, before the check in slices got there; now the entry is
    checked against its block first and the start goes cold."""
    s = Rkv(tmp_path, *NO_SAVE, supervised=True)
    try:
        with s.client() as c:
            fill_table(c)
        arena = Arena(stop_app(s))
        x, _ = arena.last_quarter_pair()
        _, key, cap = arena.entry(x)
        assert cap < 256
        arena.write(x - arena.base + CAP_AT, struct.pack("<I", 8192))
        sock = queue_request(s, "SET", key, "x" * 5000)
        os.kill(s.app_pid(), signal.SIGKILL)
        assert reply_or_close(sock) == b"", "the SET was answered, or hung"
        assert_cold_after_check(s, "lengths exceed its block")
    finally:
        kill_stuck_apps(s)
        s.close()


@pytest.mark.parametrize("sweep", ["no", "yes"])
def test_cycle_with_a_corrupt_count_ends_the_check(tmp_path, sweep):
    """A cycle, and a count of 2^62 that no longer bounds a chain: the check
    (in slices, or the mark pass) still ends, bounded by what the arena can
    hold, and the start goes cold; the check in slices used to spin."""
    s = Rkv(tmp_path, *NO_SAVE, "--recovery-sweep", sweep, supervised=True)
    try:
        with s.client() as c:
            fill_table(c)
        arena = Arena(stop_app(s))
        x, _ = arena.last_quarter_pair()
        arena.write(x - arena.base, struct.pack("<Q", x))
        arena.write(arena.db + COUNT_AT, struct.pack("<Q", 1 << 62))
        os.kill(s.app_pid(), signal.SIGKILL)
        assert_cold_after_check(s, "a cycle" if sweep == "no" else "an entry reached twice")
    finally:
        kill_stuck_apps(s)
        s.close()


# ---- 6. query buffers shrink --------------------------------------------------


def rss_anon(pid):
    """Private anonymous memory of pid in bytes (the arena is shared memory)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon in /proc/PID/status")


def test_query_buffers_of_idle_clients_shrink(rkv):
    """8 connections each SET 50 MB and stay open, idle: rkv's private
    memory falls back well below 8 x 50 MB, and each connection still works."""
    big = b"x" * (50 << 20)
    clients = [rkv.client() for _ in range(8)]
    try:
        for i, c in enumerate(clients):
            assert c.set(f"big:{i}", big)
        deadline = time.monotonic() + 10
        while rss_anon(rkv.proc.pid) > 150 << 20 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert rss_anon(rkv.proc.pid) < 150 << 20  # was 400 MB until the clients closed
        for i, c in enumerate(clients):
            assert c.strlen(f"big:{i}") == len(big) and c.set(f"small:{i}", "v")
        assert clients[0].get("big:7") == big  # a big reply still goes out whole
    finally:
        for c in clients:
            c.close()


def test_idle_query_buffers_under_1mb_shrink_in_cron(rkv):
    """40 connections each SET a 900 KB value and stay open, idle.  Each
    query buffer grew to 1 MiB, not over it, so it is not freed as soon as
    its request ran (that is the path above); cron shrinks it once the
    connection has been idle for 2 s.  rkv's private memory falls back by
    nearly all of the 40 MB, well before the clients close."""
    value = b"x" * (900 << 10)
    pid = rkv.proc.pid
    before = rss_anon(pid)
    socks = [socket.create_connection(("127.0.0.1", rkv.port), timeout=10) for _ in range(40)]
    try:
        for i, x in enumerate(socks):
            x.sendall(resp("SET", f"k{i}", value))
        for x in socks:
            got = b""
            while len(got) < 5:
                got += x.recv(5 - len(got))
            assert got == b"+OK\r\n"
        assert rss_anon(pid) > before + (30 << 20)  # 40 buffers of 1 MiB
        deadline = time.monotonic() + 10  # idle 2 s, each looked at once a second
        while rss_anon(pid) > before + (8 << 20) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert rss_anon(pid) < before + (8 << 20)
        for i, x in enumerate(socks[:3]):  # the connections still work
            x.sendall(resp("STRLEN", f"k{i}"))
            assert x.recv(64) == b":%d\r\n" % len(value)
    finally:
        for x in socks:
            x.close()


# ---- 8a. messages that say what is wrong ---------------------------------------------


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("--arena-size", "64tb", "unknown unit 'tb' (expected b, k, kb, m, mb, g or gb)"),
        ("--arena-size", "16384gb", "more than the 16 TiB of address space Rekindle reserves for arenas"),
        ("--arena-size", str((16 << 40) - (2 << 20) + 1), "at most 17592183947264 bytes"),
        ("--arena-size", "99999999999999999999", "more than 2^64 bytes"),
        ("--arena-size", "512kb", "expected at least 1mb"),
        ("--arena-size", "lots", "expected bytes like 100mb or 1gb"),
        ("--maxmemory", "2tb", "unknown unit 'tb'"),
    ],
)
def test_size_options_say_what_is_wrong(option, value, message):
    p = subprocess.run([str(RKV), option, value], capture_output=True, text=True, timeout=10, check=False)
    assert p.returncode == 1 and message in p.stderr
    assert ("at least 1mb" in p.stderr) == (value == "512kb")  # said only when it is the problem


def test_largest_arena_size_is_accepted():
    """16 TiB less 2 MiB parses (--version then exits before the arena is made)."""
    argv = [str(RKV), "--arena-size", str((16 << 40) - (2 << 20)), "--version"]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    assert p.returncode == 0 and p.stdout.startswith("rkv v=")


def test_full_arena_without_maxmemory_does_not_blame_maxmemory(tmp_path):
    s = Rkv(tmp_path, *NO_SAVE, "--arena-size", "1mb")
    try:
        with s.client() as c:
            with pytest.raises(redis.exceptions.OutOfMemoryError) as e:
                for i in range(100):
                    c.set(f"k{i}", "x" * 65536)
            assert "out of memory: the keyspace arena is full (--arena-size)" in str(e.value)
            assert "maxmemory" not in str(e.value)
            assert c.get("k0") == b"x" * 65536  # what fitted is still there
            assert c.delete("k0") == 1 and c.set("k0", "small")  # and room comes back
    finally:
        s.close()
