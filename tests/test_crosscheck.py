"""Cross-check validation: after a warm restart the ledger app serves at once
from its preserved arena while a validator replays the journal (the app's
default recovery) and compares.  A match keeps the incarnation; a mismatch
(a silently corrupted preserved value) hot-switches to the validated state,
which a client sees as the right value coming back.  The validator must see
the state as it was at the restart even while clients write during the check
(userfaultfd write protection, one page copy per first write)."""

import os
import signal
import subprocess
import time

import pytest
from supervisor_harness import free_port, service_command, wait_generation

from conftest import BUILD, json_lines

LEDGER = BUILD / "apps" / "ledger"


class Ledger:
    def __init__(self, tmp_path, *extra):
        self.port = free_port()
        self.err_path = tmp_path / "stderr.txt"
        self.err = open(self.err_path, "w+")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [str(LEDGER), "--port", str(self.port), "--journal", str(tmp_path / "journal"), *map(str, extra)],
            stdout=subprocess.DEVNULL,
            stderr=self.err,
            env={"REKINDLE_CRASHLOOP_MS": "0", "PATH": "/usr/bin:/bin"},
        )

    def cmd(self, line, expect_reply=True):
        return service_command(self.port, line, expect_reply=expect_reply)

    def get(self, i):
        return self.cmd(f"get {i}")["v"]

    def events(self, kind=None):
        evs = json_lines(self.err_path.read_text(), "rekindle")
        return [e for e in evs if kind is None or e["rekindle"] == kind]

    def wait_crosscheck(self, result, count=1, timeout=20.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = [e for e in self.events("crosscheck") if e["result"] == result]
            if len(got) >= count:
                return got[-1]
            time.sleep(0.02)
        raise AssertionError(f"no crosscheck {result}: {self.err_path.read_text()}")

    def wait_generation(self, generation):
        return wait_generation(self.port, generation, self.err_path)

    def close(self):
        self.proc.kill()
        self.proc.wait()
        self.err.close()


@pytest.fixture
def ledger(tmp_path):
    apps = []

    def start(*extra):
        app = Ledger(tmp_path, *extra)
        apps.append(app)
        return app

    yield start
    for a in apps:
        a.close()


def fill(app, n=50, stride=997):
    """Writes spread over many pages of the arena; returns what was written."""
    send = app.cmd if hasattr(app, "cmd") else app.command
    want = {}
    for k in range(n):
        i, v = (k * stride) % 100000, 1000 + k
        assert send(f"set {i} {v}")["ok"]
        want[i] = v
    return want


def test_no_check_on_a_fresh_start(ledger):
    app = ledger("--crosscheck")
    assert app.wait_generation(0)["crosscheck"] == "none"
    assert app.events("crosscheck")[0]["result"] == "skipped"


def test_match_keeps_the_warm_incarnation(ledger):
    app = ledger("--crosscheck")
    want = fill(app)
    app.cmd("segv", expect_reply=False)
    state = app.wait_generation(1)
    assert state["kind"] == "warm", state
    done = app.wait_crosscheck("match")
    assert done["why"] == ""
    assert app.cmd("state")["crosscheck"] == "match"
    assert app.cmd("state")["generation"] == 1, "no hot switch after a match"
    assert all(app.get(i) == v for i, v in want.items())


def test_writes_during_validation_do_not_reach_the_validator(ledger):
    """The validator compares the state at the restart: clients that change
    values (on many pages) while it works must not make it see a mismatch,
    and their writes stay."""
    app = ledger("--crosscheck", "--check-delay-ms", 1500)
    fill(app)
    app.cmd("segv", expect_reply=False)
    app.wait_generation(1)
    assert app.cmd("state")["crosscheck"] == "running"
    later = {}
    for k in range(200):
        i, v = (k * 503) % 100000, 5_000_000 + k
        # write, but bypass the journal half the time: if those writes leaked
        # into the validator's view it would report a mismatch
        line = f"set {i} {v}" if k % 2 else f"corrupt {i} {v}"
        assert app.cmd(line)["ok"]
        later[i] = v
    done = app.wait_crosscheck("match")
    assert done["pages_copied"] > 0, done
    assert app.cmd("state")["generation"] == 1
    assert all(app.get(i) == v for i, v in later.items()), "writes made during the check are kept"


def test_mismatch_hot_switches_to_the_validated_state(ledger):
    app = ledger("--crosscheck", "--check-delay-ms", 800)
    want = fill(app)
    assert app.cmd("corrupt 7 999")["ok"]  # preserved state now disagrees with the journal
    app.cmd("segv", expect_reply=False)
    state = app.wait_generation(1)
    assert state["kind"] == "warm"
    # speculative: the client is served at once, from the corrupted state
    assert app.get(7) == 999
    assert app.cmd("state")["crosscheck"] == "running"
    after = app.wait_generation(2)
    mismatch = app.wait_crosscheck("mismatch")
    assert "v[7]: preserved 999, recovered 0" in mismatch["why"], mismatch
    assert after["kind"] == "warm" and after["reason"] == "cross-check mismatch", after
    assert "hot switch to the validated state" in after["decision"], after
    assert after["ledger"] != state["ledger"], "the validated copy lives in another arena"
    # the client now sees the validated value, and everything else intact
    assert app.get(7) == 0
    assert all(app.get(i) == v for i, v in want.items())
    # the validated incarnation is not checked again
    assert app.cmd("state")["crosscheck"] == "none"
    assert app.events("crosscheck")[-1]["result"] == "skipped"
    # and a later failure restarts warm from the validated arena
    app.cmd("segv", expect_reply=False)
    again = app.wait_generation(3)
    assert again["kind"] == "warm" and again["ledger"] == after["ledger"]
    app.wait_crosscheck("match")
    assert app.get(7) == 0


def test_a_failing_validator_leaves_the_warm_state_in_use(ledger, tmp_path):
    """The default recovery cannot run (its journal is gone): no verdict,
    logged as failed; the warm incarnation keeps serving its state."""
    app = ledger("--crosscheck", "--check-delay-ms", 300)
    want = fill(app, n=5)
    app.cmd("segv", expect_reply=False)
    app.wait_generation(1)
    (tmp_path / "journal").unlink()
    done = app.wait_crosscheck("failed")
    assert "default recovery failed" in done["why"], done
    state = app.cmd("state")
    assert state["crosscheck"] == "failed" and state["generation"] == 1
    assert all(app.get(i) == v for i, v in want.items())


def test_hot_switch_under_the_supervisor_then_respawn_from_the_validated_arena(supervise, tmp_path):
    """SIGKILL under `rekindle run`: respawned warm, the check finds the
    corruption and hot-switches in place; the supervisor then holds the
    validated arena, so the next SIGKILL comes back warm from it."""
    journal = tmp_path / "journal"
    app = [LEDGER, "--journal", journal, "--crosscheck", "--check-delay-ms", 300]
    sup = supervise("--crashloop-window", "0ms", app=app)
    sup.wait_up(0)
    want = fill(sup, n=10)
    assert sup.command("corrupt 7 999")["ok"]
    os.kill(sup.command("state")["pid"], signal.SIGKILL)
    sup.wait_up(1)
    sup.wait_up(2)  # the hot switch: an in-place restart the supervisor watches
    after = sup.command("state")
    assert after["reason"] == "cross-check mismatch" and after["kind"] == "warm", after
    assert sup.command("get 7")["v"] == 0
    os.kill(after["pid"], signal.SIGKILL)
    sup.wait_up(3)
    again = sup.command("state")
    assert again["kind"] == "warm" and again["ledger"] == after["ledger"], again
    assert sup.command("get 7")["v"] == 0
    assert all(sup.command(f"get {i}")["v"] == v for i, v in want.items())
