"""`rekindle restart` of an app that does not beat right now.  The request
waits for the app's next rk_heartbeat() only while the app beats; an app
whose heartbeat has been still for a check interval, or that sleeps in the
kernel long past its usual beat, gets the restart signal at once (the
runtime acts on it from wherever the app is).  Before, such an app waited a
fixed second for a heartbeat that could not come.

The time from the request to the signal is read from the supervisor's own
event timestamps (t_ns), so a loaded machine does not blur it."""

import sys
import time

from conftest import BUILD

KILL_TIMEOUT = ("--kill-timeout", "10s")
NO_WINDOW = ("--crashloop-window", "0ms")

# The old wait for a heartbeat was 1 s; the signal now follows the request
# within one pass of the poll loop.
AT_ONCE_S = 0.5


def restart_and_time(sup):
    """`rekindle restart` and the new incarnation's `up`: returns the wall
    time it took, and the failure and signal events."""
    t0 = time.monotonic()
    sup.cli("restart", sup.name)
    sup.wait_up(1, timeout=15)
    elapsed = time.monotonic() - t0
    failure = sup.wait_event("failure")
    assert failure["kind"] == "request", failure
    return elapsed, failure, sup.events("signal")


def test_an_app_whose_heartbeat_stopped_gets_the_restart_signal_at_once(supervise):
    """The service app stops beating and spins ("hang"); with hang detection
    off nothing else notices, and no heartbeat will take the request."""
    sup = supervise("--hang-timeout", "0", *KILL_TIMEOUT, *NO_WINDOW)
    sup.wait_up(0)
    assert sup.command("set 3 42")["ok"]
    assert sup.command("hang")["ok"]
    time.sleep(0.8)  # longer than the check interval (500 ms): the heartbeat is still
    elapsed, failure, signals = restart_and_time(sup)
    assert len(signals) == 1, signals
    waited = (signals[0]["t_ns"] - failure["t_ns"]) / 1e9
    assert waited < AT_ONCE_S, f"the restart signal waited {waited:.3f} s for a heartbeat"
    assert signals[0]["reason"] == failure["reason"], signals
    assert elapsed < 3.0, f"restart took {elapsed:.1f} s (--kill-timeout 10s)"
    assert sup.events("kill") == []
    restart = sup.wait_event("restart")
    assert restart["path"] == "in-place" and restart["mode"] == "warm", restart
    after = sup.state()
    assert after["generation"] == 1 and after["verified"], after


# An app on the runtime (through ctypes) that beats three times after
# rk_init, then sleeps in epoll_wait for good: idle in the kernel.
IDLE_APP = """
import ctypes, select, sys
lib = ctypes.CDLL(sys.argv[1])
argv = [a.encode() for a in sys.orig_argv]
r = lib.rk_init(len(argv), (ctypes.c_char_p * (len(argv) + 1))(*argv, None), None)
if r < 0:
    sys.exit(f"rk_init: {r}")
lib.rk_ready()
for _ in range(3):
    lib.rk_heartbeat()
select.epoll().poll()
"""


def test_an_app_asleep_in_the_kernel_gets_the_restart_signal_at_once(supervise, tmp_path):
    """Its last beat is younger than the (long) check interval, but it has
    missed many of its usual beats and every thread sleeps in a system call:
    /proc says it is idle."""
    app = tmp_path / "idle_app.py"
    app.write_text(IDLE_APP)
    lib = BUILD / "lib" / "librekindle.so"
    assert lib.exists(), f"{lib} missing: run `make` first"
    sup = supervise(
        "--check-interval", "5s", *KILL_TIMEOUT, *NO_WINDOW, app=[sys.executable, app, lib], name="idle"
    )
    sup.wait_event("ready", lambda e: e.get("generation") == 0)
    time.sleep(0.5)
    elapsed, failure, signals = restart_and_time(sup)
    assert len(signals) == 1, signals
    waited = (signals[0]["t_ns"] - failure["t_ns"]) / 1e9
    assert waited < AT_ONCE_S, f"the restart signal waited {waited:.3f} s for a heartbeat"
    assert elapsed < 3.0, f"restart took {elapsed:.1f} s (--kill-timeout 10s)"
    assert sup.wait_event("restart")["path"] == "in-place"


def test_an_app_that_beats_still_restarts_at_a_heartbeat(supervise):
    """The service app beats every 10 ms from its poll loop: the request is
    taken at a heartbeat, and no signal is sent."""
    sup = supervise(*KILL_TIMEOUT, *NO_WINDOW)
    sup.wait_up(0)
    time.sleep(1.0)  # a settled beat
    elapsed, _failure, signals = restart_and_time(sup)
    assert signals == [], signals
    assert elapsed < 3.0
    assert sup.wait_event("restart")["path"] == "in-place"
