"""An idle server under --hang-timeout: the runtime tells it how long it may
block between two heartbeats (rk_heartbeat_interval_ms, a third of the
timeout), so one that waits for requests with that timeout stays up however
long it idles; one that blocks with no timeout is, correctly, taken for
hung (the README says to use the interval)."""

import time

from supervisor_harness import SERVICE

HANG = ("--hang-timeout", "600ms", "--check-interval", "100ms")


def test_idle_server_that_waits_for_the_interval_stays_up(supervise):
    sup = supervise(*HANG, app=[SERVICE, "--block", "interval"])
    sup.wait_up(0)
    state = sup.state()
    assert state["heartbeat_interval_ms"] == 200
    time.sleep(3 * 0.6 + 0.5)  # idle for three timeouts and more
    assert not sup.events("failure"), sup.events("failure")
    assert sup.state()["generation"] == 0


def test_idle_server_that_blocks_without_a_timeout_is_taken_for_hung(supervise):
    sup = supervise(*HANG, app=[SERVICE, "--block", "forever"])
    sup.wait_up(0)
    sup.command("state")  # one beat, then it blocks in poll(-1)
    failure = sup.wait_event("failure", timeout=10)
    assert failure["kind"] == "hang", failure


def test_unsupervised_or_without_hang_timeout_the_interval_is_unbounded(supervise):
    sup = supervise(app=[SERVICE, "--block", "interval"])
    sup.wait_up(0)
    assert sup.state()["heartbeat_interval_ms"] == -1
