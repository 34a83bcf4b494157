"""Real Redis bugs re-created in 7.0.15 (examples/redis/bugs: PHOENIX's R1,
R3 and R4), each triggered by its client command sequence, on the port under
`rekindle run` and on stock Redis with the same bug:

  R1  SORT_RO z BY nosort LIMIT 2 <LONG_MAX>: integer overflow, OOM panic
      (SIGABRT) in a read command: the port comes back warm, every key kept;
  R3  GET|SET as a command name: NULL dereference (SIGSEGV) in the
      unknown-command check, before any command runs: warm, every key kept;
  R4  two XREADGROUP BLOCK consumers of one group, then XADD: endless loop
      in handleClientsBlockedOnKeys, inside the keyspace mutation that
      serves blocked clients.  The supervisor's hang timeout catches it;
      the state may be half changed, so the restart is cold with the reason
      logged, and Redis replays its AOF (appendfsync always): every
      acknowledged write is back (the XADD that hung was never
      acknowledged).

Stock Redis with the same bugs: R1 and R3 kill the process (without
persistence, a restart has an empty keyspace); R4 hangs it for good (no
reply to anyone; nothing restarts it).  The builds: examples/redis/build.sh
rekindle-bugs and stock-bugs (the fixture runs them; a few seconds when up
to date, about 2 min each otherwise)."""

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import redis
from test_redis_port import client, fill_every_type, free_port, server_args, snapshot

from conftest import BUILD, ROOT

# Two more builds of Redis (about 2 min each on 2 cores): run by `make
# test-redis-bugs` (and `make test-redis`), not by `make test`, which must
# fit CI's time.
pytestmark = pytest.mark.skipif(
    os.environ.get("REKINDLE_REDIS_BUGS") != "1",
    reason="R1/R3/R4 need two more Redis builds: make test-redis-bugs runs them",
)

BUGGY_PORT = BUILD / "redis" / "rekindle-bugs" / "src" / "redis-server"
BUGGY_STOCK = BUILD / "redis" / "stock-bugs" / "src" / "redis-server"
LONG_MAX = 2**63 - 1


@pytest.fixture(scope="module")
def builds():
    for kind in ("rekindle-bugs", "stock-bugs"):
        p = subprocess.run(
            ["bash", str(ROOT / "examples" / "redis" / "build.sh"), kind],
            capture_output=True,
            text=True,
            env={**os.environ, "BUILD": str(BUILD)},
            timeout=1200,
            check=False,
        )
        assert p.returncode == 0, p.stderr[-3000:]


def trigger_r1(c):
    c.zadd("bug:z", {"a": 1, "b": 2, "c": 3})
    with pytest.raises(redis.ConnectionError):
        c.execute_command("SORT_RO", "bug:z", "BY", "nosort", "LIMIT", 2, LONG_MAX)


def trigger_r3(c):
    with pytest.raises(redis.ConnectionError):
        c.execute_command("GET|SET")


def raw(port, *args):
    """Sends a command on a connection of its own and leaves it open."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    parts = [b"$%d\r\n%s\r\n" % (len(a), a) for a in map(str.encode, args)]
    s.sendall(b"*%d\r\n" % len(args) + b"".join(parts))
    return s


def trigger_r4(c, port):
    c.xgroup_create("bug:s", "g", id="$", mkstream=True)
    blocked = [
        raw(port, "XREADGROUP", "GROUP", "g", f"c{i}", "BLOCK", "0", "STREAMS", "bug:s", ">") for i in (1, 2)
    ]
    deadline = time.monotonic() + 5
    while c.info("clients")["blocked_clients"] < 2:
        assert time.monotonic() < deadline, "the consumers never blocked"
        time.sleep(0.01)
    before = logical(c)
    adder = raw(port, "XADD", "bug:s", "*", "f", "v")  # never answered: the server loops
    return before, [*blocked, adder]


def logical(c):
    """Every key of db 0 and 3 by its contents (a replayed AOF rebuilds the
    same data, not the same DUMP bytes: set order, stream delivery times)."""
    read = {
        b"string": c.get,
        b"list": lambda k: c.lrange(k, 0, -1),
        b"hash": c.hgetall,
        b"set": lambda k: sorted(c.smembers(k)),
        b"zset": lambda k: c.zrange(k, 0, -1, withscores=True),
        b"stream": lambda k: (c.xrange(k), [g["name"] for g in c.xinfo_groups(k)]),
    }
    out = {}
    for db in (0, 3):
        c.execute_command("SELECT", db)
        for k in c.keys("*"):
            t = c.type(k)
            out[(db, k)] = (t, read[t](k), c.pttl(k) > 0)
    c.execute_command("SELECT", 0)
    return out


def answers(port, timeout=1.0):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


@pytest.mark.parametrize("bug", ["R1", "R3"])
def test_read_path_crash_restarts_warm_with_every_key(builds, supervise, tmp_path, bug):
    sup = supervise("--hang-timeout", "2s", app=[str(BUGGY_PORT), *server_args(0, tmp_path)[1:]])
    sup.wait_up(0, timeout=20)
    c = client(sup.port)
    fill_every_type(c)
    c.set("bug:acked", "yes")
    time.sleep(1.2)  # past the warm start's crash-loop window
    (trigger_r1 if bug == "R1" else trigger_r3)(c)
    up = sup.wait_up(1, timeout=20)
    decision = sup.wait_event("decision")
    assert (up["kind"], decision["mode"], decision["code"]) == ("warm", "warm", "all_checks_passed"), decision
    # R1: Redis's OOM panic ends in a deliberate fault of its own (SIGSEGV)
    # or SIGABRT; R3: the NULL dereference
    assert up["reason"] in ("signal SIGSEGV", "signal SIGABRT"), up
    sup.out.flush()
    out = Path(sup.out.name).read_text()  # the server's log (--logfile "")
    if bug == "R1":
        assert "Out Of Memory allocating" in out
    kept = 17 + (bug == "R1")
    assert "Rekindle: warm start (generation 1)" in out and f"Rekindle: {kept} keys kept" in out
    c = client(sup.port)
    after = snapshot(c)
    assert c.get("bug:acked") == b"yes" and len(after) == kept, sorted(after)
    # the warm keyspace takes writes again
    c.set("bug:after", "1")
    assert c.get("bug:after") == b"1"


def test_r4_hang_is_caught_and_the_cold_restart_replays_the_aof(builds, supervise, tmp_path):
    args = server_args(0, tmp_path)[1:]
    args[args.index("--appendonly") + 1] = "yes"
    args += ["--appendfsync", "always"]
    sup = supervise("--hang-timeout", "1s", app=[str(BUGGY_PORT), *args])
    first = sup.wait_up(0, timeout=20)
    c = client(sup.port)
    fill_every_type(c)
    before, conns = trigger_r4(c, sup.port)
    failure = sup.wait_event("failure", timeout=20)
    assert failure["kind"] == "hang", failure
    up = sup.wait_up(1, timeout=30)
    restart = sup.wait_event("decision")
    # the loop is inside the mutation that serves blocked clients: cold,
    # and the supervisor says why
    assert up["kind"] == "cold" and restart["mode"] == "cold", (up, restart)
    assert up["reason"].startswith("hang"), up
    assert restart["code"] == "unsafe_region_open", restart
    c = client(sup.port, timeout=30)
    assert logical(c) == before  # every acknowledged write, from the AOF
    assert c.xinfo_groups("bug:s")[0]["name"] == b"g"
    assert first["pid"] != up["pid"] or up["kind"] == "cold"
    for s in conns:
        s.close()


def stock(tmp_path, name):
    port = free_port()
    d = tmp_path / name
    d.mkdir()
    argv = [str(BUGGY_STOCK), *server_args(port, d)[1:], "--crash-memcheck-enabled", "no"]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), port, argv


def test_stock_redis_with_the_same_bugs_dies_or_hangs(builds, tmp_path):
    for bug, sig in (("R1", signal.SIGABRT), ("R3", signal.SIGSEGV)):
        proc, port, argv = stock(tmp_path, bug)
        try:
            c = client(port)
            fill_every_type(c)
            (trigger_r1 if bug == "R1" else trigger_r3)(c)
            assert proc.wait(timeout=20) == -sig
            # restarted as systemd would: no persistence, nothing left
            proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            assert client(port).dbsize() == 0
        finally:
            proc.kill()
            proc.wait()
    proc, port, _ = stock(tmp_path, "R4")
    try:
        c = client(port)
        fill_every_type(c)
        _, conns = trigger_r4(c, port)
        time.sleep(0.5)
        assert not answers(port) and proc.poll() is None  # alive, looping, serving no one
        for s in conns:
            s.close()
    finally:
        proc.kill()
        proc.wait()
