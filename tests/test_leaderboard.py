"""examples/leaderboard, the server of docs/porting.md: the plain-malloc and
the Rekindle versions answer the same protocol the same way; the Rekindle
one, under `rekindle run --listen --hang-timeout 1s`, keeps its scores across
a crash (in place) and a SIGKILL (respawn), idles without being taken for
hung, and starts empty, cold, after a death inside a region.  Real
processes, loopback only; every wait is bounded.  And docs/porting.md
quotes the example as it is."""

import json
import os
import re
import signal
import socket
import subprocess
import time

import pytest
from supervisor_harness import free_port

from conftest import BUILD, ROOT

LEADERBOARD = BUILD / "examples" / "leaderboard"
PLAIN = BUILD / "examples" / "leaderboard_plain"
HANG = ("--hang-timeout", "1s", "--check-interval", "100ms")


def connect(port, timeout=10.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=timeout)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def session(port, lines, timeout=10.0):
    """Sends the lines on one connection; returns one reply per line (the
    lines of a `top` reply joined by newlines, END included)."""
    with connect(port, timeout) as s:
        s.sendall("".join(line + "\n" for line in lines).encode())
        f = s.makefile("r", newline="\n")
        replies = []
        for line in lines:
            reply = f.readline()
            assert reply.endswith("\n"), f"no reply to {line!r} (got {replies[-3:]})"
            if line.startswith("top") and not reply.startswith("ERR"):
                while not reply.endswith("END\n"):
                    more = f.readline()
                    assert more, f"unterminated reply to {line!r}"
                    reply += more
            replies.append(reply.rstrip("\n"))
        return replies


def ask(port, line, timeout=10.0):
    """One request; retried on a new connection while the server restarts."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return session(port, [line], timeout=2.0)[0]
        except (OSError, AssertionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def send_and_die(port, line):
    """Sends a command that kills the server; returns once its connection is closed."""
    with connect(port) as s:
        s.sendall(line.encode() + b"\n")
        while s.recv(4096):
            pass


def fill(port, n):
    """Players p0..p{n-1}; p{i} gets i % 97 + 1 points, then i % 13 - 6 more."""
    lines = [f"score p{i} {i % 97 + 1}" for i in range(n)] + [f"score p{i} {i % 13 - 6}" for i in range(n)]
    for start in range(0, len(lines), 2000):
        for r in session(port, lines[start : start + 2000]):
            assert not r.startswith("ERR"), r


def expected_totals(n):
    return {f"p{i}": (i % 97 + 1) + (i % 13 - 6) for i in range(n)}


def board_view(port):
    """What a client sees: the count, the top 100, a few players."""
    return session(port, ["players", "top 100", "get p0", "get p7", "get p1999", "get nobody"])


class Standalone:
    """A server on its own port, without the supervisor."""

    def __init__(self, tmp_path, exe, *args):
        if not exe.exists():
            pytest.fail(f"{exe} missing: run `make` first")
        self.port = free_port()
        self.err_path = tmp_path / f"{exe.name}.stderr"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LISTEN_", "REKINDLE_MANIFEST"))}
        with open(self.err_path, "w") as err:
            self.proc = subprocess.Popen(
                [str(exe), "--port", str(self.port), *args], stdout=subprocess.DEVNULL, stderr=err, env=env
            )
        ask(self.port, "players")

    def stderr(self):
        return self.err_path.read_text()

    def events(self, kind):
        lines = [json.loads(x) for x in self.stderr().splitlines() if x.startswith('{"rekindle"')]
        return [e for e in lines if e["rekindle"] == kind]

    def close(self):
        self.proc.kill()
        self.proc.wait(timeout=10)


@pytest.fixture
def standalone(tmp_path):
    started = []

    def start(exe, *args):
        s = Standalone(tmp_path, exe, *args)
        started.append(s)
        return s

    yield start
    for s in started:
        s.close()


def test_both_versions_are_built():
    for exe in (LEADERBOARD, PLAIN):
        assert exe.exists() and os.access(exe, os.X_OK), f"{exe} missing: run `make`"


SCRIPT = [
    "players",
    "top 5",
    "get alice",
    "score alice 10",
    "score bob 20",
    "score alice 15",
    "score carol 25",
    "score dave -3",
    "get alice",
    "get carol",
    "top 3",
    "top 100",
    "players",
    "score bob 5",
    "top 4",
    "score eve 0",
    "get eve",
    "score alice -1000000000",
    "top 1",
    "score alice 1000000001",
    "score " + "x" * 31 + " 1",
    "score " + "x" * 32 + " 1",
    "score frank",
    "score frank 1 2",
    "score frank one",
    "get",
    "get alice bob",
    "top 0",
    "top 101",
    "top",
    "",
    "fly away",
    "players\r",
]


def test_plain_and_rekindle_answer_the_same(standalone):
    plain = standalone(PLAIN)
    ported = standalone(LEADERBOARD)
    want = session(plain.port, SCRIPT)
    assert session(ported.port, SCRIPT) == want
    got = list(zip(SCRIPT, want, strict=True))
    assert got[:3] == [("players", "0"), ("top 5", "END"), ("get alice", "ERR no such player")]
    assert got[8] == ("get alice", "alice 25")
    # ties (bob and carol at 25 behind alice's 25) go by name
    assert got[14] == ("top 4", "1 alice 25\n2 bob 25\n3 carol 25\n4 dave -3\nEND")
    assert got[17] == ("score alice -1000000000", "alice -999999975")
    assert got[18] == ("top 1", "1 bob 25\nEND")
    for line, reply in got[19:-1]:
        assert reply.startswith("ERR") or line.startswith("score xxx"), (line, reply)
    assert got[-1] == ("players\r", "6")

    # a pipelined load, then the ranking against a model of it
    n = 2000
    fill(plain.port, n)
    fill(ported.port, n)
    view = board_view(plain.port)
    assert board_view(ported.port) == view
    totals = expected_totals(n)
    for line, reply in got:
        if line.startswith("score") and not reply.startswith("ERR"):
            name, total = reply.split()
            totals[name] = int(total)  # the script's players: the last total
    best = sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))[:100]
    assert view[0] == str(len(totals)) == str(n + 6)
    assert view[1] == "\n".join(f"{i + 1} {k} {v}" for i, (k, v) in enumerate(best)) + "\nEND"
    assert view[2:] == [f"p0 {totals['p0']}", f"p7 {totals['p7']}", f"p1999 {totals['p1999']}",
                        "ERR no such player"]


def test_scores_survive_a_crash_and_a_sigkill(supervise):
    sup = supervise(*HANG, app=[LEADERBOARD])
    first = sup.wait_up(0)
    fill(sup.port, 3000)
    before = board_view(sup.port)
    assert before[0] == "3000"

    send_and_die(sup.port, "crash")  # a NULL write outside any region
    up = sup.wait_up(1)
    assert (up["kind"], up["pid"]) == ("warm", first["pid"]), up  # restarted in place
    assert board_view(sup.port) == before

    time.sleep(1.2)  # past the crash-loop window of the warm start
    os.kill(up["pid"], signal.SIGKILL)
    up = sup.wait_up(2)
    assert up["kind"] == "warm" and up["pid"] != first["pid"], up
    decision = sup.wait_event("decision", count=2)
    assert (decision["mode"], decision["path"], decision["code"]) == ("warm", "respawn", "all_checks_passed")
    assert board_view(sup.port) == before
    assert sup.stderr().count("leaderboard: warm start: 3000 players kept") == 2
    assert not sup.events("giveup")


def test_an_idle_server_is_not_taken_for_hung(supervise):
    sup = supervise(*HANG, app=[LEADERBOARD])
    sup.wait_up(0)
    assert ask(sup.port, "score idle 1") == "idle 1"
    time.sleep(3 * 1.0 + 0.3)  # three hang timeouts without a request
    assert not sup.events("failure"), sup.events("failure")
    assert ask(sup.port, "get idle") == "idle 1"
    assert len(sup.events("up")) == 1


def test_a_death_inside_a_region_goes_cold_and_starts_empty(supervise):
    sup = supervise(*HANG, app=[LEADERBOARD])
    sup.wait_up(0)
    fill(sup.port, 100)
    send_and_die(sup.port, "crash-in-update p5 1")  # faults with p5 out of the skip list
    decision = sup.wait_event("decision")
    assert (decision["mode"], decision["code"]) == ("cold", "unsafe_region_open"), decision
    up = sup.wait_up(1)
    assert (up["kind"], up["code"]) == ("cold", "unsafe_region_open"), up
    assert ask(sup.port, "players") == "0"
    assert ask(sup.port, "get p5") == "ERR no such player"
    assert "cold start (unsafe_region_open): the scores are lost, started empty" in sup.stderr()


def test_the_check_mode_finds_the_port_keeps_the_publication_rule(standalone):
    lb = standalone(LEADERBOARD, "--check-cleanup")
    fill(lb.port, 3000)  # the hash table doubles twice: two old bucket arrays freed
    send_and_die(lb.port, "crash")
    assert ask(lb.port, "players") == "3000"
    [rec] = lb.events("recovered")
    assert rec["cleanup"] == "check"
    assert (rec["pending"], rec["pending_reached"], rec["swept_not_pending"]) == (0, 0, 0), rec
    assert rec["objects_freed"] == 0 and rec["objects_kept"] == 3000 + 2, rec  # players, board, buckets
    assert not lb.events("cleanup_check")


def guide_quotes():
    """The code blocks of docs/porting.md that follow a line
    `<!-- from PATH -->`: (PATH, their lines)."""
    lines = (ROOT / "docs" / "porting.md").read_text().splitlines()
    for i, line in enumerate(lines):
        m = re.fullmatch(r"<!-- from (\S+) -->", line)
        if m:
            assert lines[i + 1].startswith("```"), f"line {i + 2}: a code block must follow {line}"
            end = lines.index("```", i + 2)
            yield m.group(1), lines[i + 2 : end]


def test_the_guide_quotes_the_example_as_it_is():
    """Each quoted block is in its file: runs of lines separated by `...`,
    each run consecutive lines of the file (indentation aside), in order."""
    quotes = list(guide_quotes())
    assert len(quotes) >= 10
    for path, block in quotes:
        source = [x.strip() for x in (ROOT / path).read_text().splitlines()]
        runs, run = [], []
        for x in block + ["..."]:
            if x.strip() == "...":
                runs.append(run)
                run = []
            else:
                run.append(x.strip())
        at = 0
        for run in runs:
            starts = [i for i in range(at, len(source) - len(run) + 1) if source[i : i + len(run)] == run]
            assert starts, f"docs/porting.md quotes {path}, which no longer has:\n" + "\n".join(run)
            at = starts[0] + len(run)
