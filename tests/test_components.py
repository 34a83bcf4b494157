"""Unsafe regions per component: a failure that finds one arena half-changed
drops only that arena when the app declared it independent, and the rest stays
warm; a half-changed dependent arena still makes the whole restart cold.  Both
restart paths: in place (the runtime decides in its fault handler) and respawn
(the supervisor decides from the control block after a SIGKILL).  The service
app keeps a "table" arena (dependent) and a "sessions" arena (independent)."""

import subprocess

import pytest
from supervisor_harness import SERVICE, free_port, service_command, wait_generation

NO_WINDOW = ("--crashloop-window", "0ms")


class Standalone:
    """The service app on its own port, no supervisor: restarts are in place."""

    def __init__(self, tmp_path):
        self.port = free_port()
        self.err_path = tmp_path / "stderr.txt"
        self.err = open(self.err_path, "w+")  # noqa: SIM115 - closed in close()
        env = {"REKINDLE_CRASHLOOP_MS": "0", "PATH": "/usr/bin:/bin"}
        self.proc = subprocess.Popen(
            [str(SERVICE), "--port", str(self.port), "--entries", "1000"],
            stdout=subprocess.DEVNULL,
            stderr=self.err,
            env=env,
        )

    def command(self, line, expect_reply=True):
        return service_command(self.port, line, expect_reply=expect_reply)

    def state(self):
        return self.command("state")

    def wait_generation(self, generation):
        return wait_generation(self.port, generation, self.err_path)

    def close(self):
        self.proc.kill()
        self.proc.wait()
        self.err.close()


@pytest.fixture
def standalone(tmp_path):
    s = Standalone(tmp_path)
    yield s
    s.close()


def set_both(app):
    assert app.command("set 5 777")["ok"]
    assert app.command("sess 42")["ok"]
    before = app.state()
    assert before["sets"] == 1 and before["logins"] == 42
    return before


def assert_sessions_dropped_table_warm(before, after):
    assert after["kind"] == "warm", after
    assert after["verified"] and after["sets"] == before["sets"] and after["sum"] == before["sum"]
    assert after["table"] == before["table"]
    assert after["sessions_preserved"] is False and after["logins"] == 0, "sessions came back empty"
    assert after["arenas_dropped"] == 1, after
    assert "unsafe region open in arena sessions" in after["decision"], after
    assert "dropped alone" in after["decision"], after


# ---- in place -----------------------------------------------------------------


def test_in_place_fault_inside_an_independent_arena_drops_only_it(standalone):
    before = set_both(standalone)
    standalone.wait_generation(0)
    standalone.command("sess-unsafe-segv", expect_reply=False)
    after = standalone.wait_generation(1)
    assert_sessions_dropped_table_warm(before, after)


def test_in_place_fault_inside_the_dependent_arena_goes_cold(standalone):
    set_both(standalone)
    standalone.command("unsafe-segv", expect_reply=False)
    after = standalone.wait_generation(1)
    assert after["kind"] == "cold" and after["sets"] == 0 and after["logins"] == 0, after
    assert "unsafe region open in arena table" in after["decision"], after


def test_in_place_fault_outside_regions_keeps_both(standalone):
    before = set_both(standalone)
    standalone.command("segv", expect_reply=False)
    after = standalone.wait_generation(1)
    assert after["kind"] == "warm" and after["sessions_preserved"] is True
    assert after["logins"] == 42 and after["sets"] == before["sets"]
    assert after["arenas_dropped"] == 0


def test_in_place_fault_inside_a_region_after_a_warm_restart_goes_cold(standalone):
    """The warm start itself runs allocator critical sections (slot claimed
    early in rk_init): the regions of the new incarnation must still count."""
    set_both(standalone)
    standalone.command("segv", expect_reply=False)
    assert standalone.wait_generation(1)["kind"] == "warm"
    standalone.command("unsafe-segv", expect_reply=False)
    after = standalone.wait_generation(2)
    assert after["kind"] == "cold" and after["sets"] == 0, after
    assert "unsafe region open in arena table" in after["decision"], after


def test_failure_hook_can_drop_a_safe_component(standalone):
    before = set_both(standalone)
    standalone.command("hook-drop-segv", expect_reply=False)
    after = standalone.wait_generation(1)
    assert after["kind"] == "warm" and after["sets"] == before["sets"]
    assert after["sessions_preserved"] is False and after["logins"] == 0
    assert "failure hook dropped a component" in after["decision"], after


def test_failure_hook_can_choose_cold(standalone):
    set_both(standalone)
    standalone.command("hook-cold-segv", expect_reply=False)
    after = standalone.wait_generation(1)
    assert after["kind"] == "cold" and after["sets"] == 0
    assert "failure hook chose a cold restart" in after["decision"], after


# ---- respawn by the supervisor ---------------------------------------------------


def test_sigkill_inside_an_independent_arena_drops_only_it(supervise):
    sup = supervise(*NO_WINDOW)
    sup.wait_up(0)
    before = set_both(sup)
    sup.command("sess-unsafe-kill", expect_reply=False)
    sup.wait_up(1)
    decision = sup.wait_event("decision")
    assert decision["mode"] == "warm", decision
    dropped = sup.wait_event("arena_dropped")
    assert dropped["arenas"] == "sessions", dropped
    after = sup.state()
    assert_sessions_dropped_table_warm(before, after)


def test_sigkill_inside_the_dependent_arena_still_goes_cold(supervise):
    sup = supervise(*NO_WINDOW)
    sup.wait_up(0)
    set_both(sup)
    sup.command("unsafe-kill", expect_reply=False)
    sup.wait_up(1)
    after = sup.state()
    assert after["kind"] == "cold" and after["sets"] == 0 and after["logins"] == 0
    assert "unsafe region open in arena table" in after["decision"], after


def test_sigkill_inside_a_region_after_a_warm_respawn_goes_cold(supervise):
    sup = supervise(*NO_WINDOW)
    sup.wait_up(0)
    set_both(sup)
    sup.command("kill", expect_reply=False)
    sup.wait_up(1)
    assert sup.state()["kind"] == "warm"
    sup.command("unsafe-kill", expect_reply=False)
    sup.wait_up(2)
    after = sup.state()
    assert after["kind"] == "cold" and after["sets"] == 0, after
    assert "unsafe region open in arena table" in after["decision"], after


def test_sigkill_outside_regions_keeps_both(supervise):
    sup = supervise(*NO_WINDOW)
    sup.wait_up(0)
    before = set_both(sup)
    sup.command("kill", expect_reply=False)
    sup.wait_up(1)
    after = sup.state()
    assert after["kind"] == "warm" and after["logins"] == 42 and after["sets"] == before["sets"]
    assert after["sessions_preserved"] is True
