"""System tests of `rekindle run`: a real supervisor around the real service
app, killed and faulted in each way the supervisor must handle.  Each test
asserts the decision, its reason and the preserved data afterwards."""

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from supervisor_harness import SERVICE, free_port

# Crashes in quick succession stay warm unless a test is about the window.
NO_WINDOW = ("--crashloop-window", "0ms")


def up_and_set(sup):
    """Waits for the first incarnation, changes preserved state, returns it."""
    sup.wait_up(0)
    assert sup.command("set 5 777")["ok"]
    before = sup.state()
    assert before["generation"] == 0 and before["kind"] == "fresh" and before["supervised"]
    assert before["sets"] == 1
    return before


def assert_preserved(before, after):
    assert after["kind"] == "warm", after
    assert after["verified"], after
    assert after["table"] == before["table"], "same address after a warm restart"
    assert after["sets"] == before["sets"] and after["sum"] == before["sum"]


# ---- deaths the app cannot handle: the supervisor's held fds keep the state ---


def test_sigkill_restarts_warm_from_the_fds_the_supervisor_holds(supervise):
    sup = supervise(*NO_WINDOW)
    before = up_and_set(sup)
    sup.command("kill", expect_reply=False)
    up = sup.wait_up(1)
    after = sup.state()
    assert after["pid"] != before["pid"], "a respawn is a new process"
    assert_preserved(before, after)
    failure = sup.wait_event("failure")
    assert failure["kind"] == "signal" and failure["signal"] == "SIGKILL"
    decision = sup.wait_event("decision")
    assert decision["mode"] == "warm", decision
    restart = sup.wait_event("restart")
    assert restart["path"] == "respawn" and restart["mode"] == "warm"
    assert restart["preserved_bytes"] > 0
    assert up["kind"] == "warm"


def test_fault_with_no_handler_running_restarts_warm(supervise):
    sup = supervise(*NO_WINDOW)
    before = up_and_set(sup)
    sup.command("segv-nohandler", expect_reply=False)
    sup.wait_up(1)
    assert_preserved(before, sup.state())
    assert sup.wait_event("failure")["signal"] == "SIGSEGV"


@pytest.mark.parametrize("fault,signame", [("segv", "SIGSEGV"), ("abort", "SIGABRT")])
def test_fault_restarts_in_place_and_the_supervisor_observes(supervise, fault, signame):
    sup = supervise(*NO_WINDOW)
    before = up_and_set(sup)
    sup.command(fault, expect_reply=False)
    sup.wait_up(1)
    after = sup.state()
    assert after["pid"] == before["pid"], "an in-place restart keeps the pid"
    assert_preserved(before, after)
    assert after["reason"] == f"signal {signame}"
    restart = sup.wait_event("restart")
    assert restart["path"] == "in-place" and restart["mode"] == "warm"
    assert sup.wait_event("failure")["signal"] == signame


def test_non_zero_exit_restarts(supervise):
    sup = supervise(*NO_WINDOW)
    before = up_and_set(sup)
    sup.command("exit 3", expect_reply=False)
    sup.wait_up(1)
    failure = sup.wait_event("failure")
    assert failure["kind"] == "exit" and failure["exit_code"] == 3
    assert_preserved(before, sup.state())


# ---- failures only the supervisor can see -----------------------------------------


def test_hang_is_detected_and_restarted(supervise):
    sup = supervise("--hang-timeout", "300ms", *NO_WINDOW)
    before = up_and_set(sup)
    sup.command("hang")
    sup.wait_up(1, timeout=15)
    failure = sup.wait_event("failure")
    assert failure["kind"] == "hang"
    after = sup.state()
    assert after["reason"].startswith("hang"), after
    assert_preserved(before, after)


def test_failed_in_place_exec_is_reported_and_the_app_is_watched_again(supervise, tmp_path):
    """After RESTARTING the exec fails (EACCES) and the app carries on: the
    runtime says RESTART_FAILED, so the supervisor watches it again and sees
    the hang that follows (it used to wait for a HELLO that never came)."""
    exe = tmp_path / "service"
    shutil.copy2(SERVICE, exe)
    sup = supervise("--hang-timeout", "300ms", *NO_WINDOW, app=[exe, "--entries", "1000"])
    before = up_and_set(sup)
    sup.command("exec-fail-hang")
    failed = sup.wait_event("restart_failed")
    assert failed["errno"] == 13, failed  # EACCES
    assert "carries on" in failed["what"]
    sup.wait_up(1, timeout=15)
    sup.wait_event("failure", lambda e: e["kind"] == "hang")
    after = sup.state()
    assert after["reason"].startswith("hang"), after
    assert_preserved(before, after)


def test_hang_that_ignores_the_restart_signal_is_killed_and_respawned(supervise):
    sup = supervise("--hang-timeout", "300ms", "--kill-timeout", "300ms", *NO_WINDOW)
    before = up_and_set(sup)
    sup.command("hang-masked")
    sup.wait_up(1, timeout=15)
    assert sup.wait_event("failure")["kind"] == "hang"
    assert sup.wait_event("kill")["pid"] == before["pid"]
    restart = sup.wait_event("restart")
    assert restart["path"] == "respawn" and restart["mode"] == "warm", restart
    after = sup.state()
    assert after["pid"] != before["pid"]
    assert_preserved(before, after)


def test_leak_triggers_a_warm_rejuvenation(supervise):
    sup = supervise("--max-rss", "64M", "--check-interval", "100ms", *NO_WINDOW)
    before = up_and_set(sup)
    # no reply awaited: the rejuvenation may cut the request short (a beating
    # app gets the restart signal once its heartbeat has been still for
    # --check-interval, and touching 128 MB can take longer than that)
    sup.command("leak 128", expect_reply=False)
    sup.wait_up(1, timeout=15)
    assert sup.wait_event("failure")["kind"] == "leak"
    after = sup.state()
    assert after["reason"].startswith("leak"), after
    assert_preserved(before, after)


def test_app_requested_restart_is_warm(supervise):
    sup = supervise(*NO_WINDOW)
    before = up_and_set(sup)
    sup.command("restart", expect_reply=False)
    sup.wait_up(1)
    after = sup.state()
    assert after["reason"] == "app: rejuvenation"
    assert_preserved(before, after)
    assert sup.wait_event("failure")["kind"] == "request"


# ---- when warm is not safe ------------------------------------------------------------


@pytest.mark.parametrize("how", ["unsafe-kill", "unsafe-segv"])
def test_death_inside_an_unsafe_region_goes_cold(supervise, how):
    sup = supervise(*NO_WINDOW)
    up_and_set(sup)
    sup.command(how, expect_reply=False)
    sup.wait_up(1)
    after = sup.state()
    assert after["kind"] == "cold" and after["sets"] == 0, "state dropped, app's own recovery ran"
    assert "unsafe region open in arena table" in after["decision"], after


def test_corrupt_arena_header_goes_cold(supervise):
    sup = supervise(*NO_WINDOW)
    up_and_set(sup)
    sup.command("corrupt-kill", expect_reply=False)
    sup.wait_up(1)
    decision = sup.wait_event("decision")
    assert decision["mode"] == "cold" and "header" in decision["reason"], decision
    after = sup.state()
    assert after["kind"] == "cold" and after["sets"] == 0


def test_warm_disabled_by_the_app_goes_cold(supervise):
    sup = supervise(*NO_WINDOW)
    up_and_set(sup)
    sup.command("nowarm-kill", expect_reply=False)
    sup.wait_up(1)
    decision = sup.wait_event("decision")
    assert decision["mode"] == "cold" and "disabled by the app" in decision["reason"], decision
    assert sup.state()["kind"] == "cold"


def test_second_failure_within_the_window_after_a_warm_restart_goes_cold(supervise):
    sup = supervise("--crashloop-window", "5s")
    before = up_and_set(sup)
    sup.command("kill", expect_reply=False)
    sup.wait_up(1)
    assert_preserved(before, sup.state())
    sup.command("kill", expect_reply=False)
    sup.wait_up(2)
    decision = sup.wait_event("decision", count=2)
    assert decision["mode"] == "cold" and "second failure" in decision["reason"], decision
    assert sup.state()["kind"] == "cold"


def test_crash_loop_backs_off_and_gives_up(supervise):
    sup = supervise(
        "--max-restarts",
        "3",
        "--backoff-initial",
        "50ms",
        "--backoff-max",
        "1s",
        app=["/bin/sh", "-c", "kill -SEGV $$"],
    )
    assert sup.proc.wait(timeout=30) == 1
    spawns = sup.events("spawn")
    assert len(spawns) == 4, spawns  # the first start and 3 restarts
    backoffs = [s["backoff_ms"] for s in spawns[1:]]
    assert backoffs == sorted(backoffs) and backoffs[-1] > backoffs[0], backoffs
    giveup = sup.wait_event("giveup")
    assert "3" in json.dumps(giveup)


# ---- sockets and control ----------------------------------------------------------


def test_listening_socket_is_held_across_a_respawn(supervise):
    """The supervisor owns the listening socket: a client that connects while
    the app is dead is queued, not refused, and is served by the next one."""
    sup = supervise(*NO_WINDOW)
    up_and_set(sup)
    sup.command("kill", expect_reply=False)
    sup.wait_event("failure")
    with socket.create_connection(("127.0.0.1", sup.port), timeout=10) as s:
        s.sendall(b"state\n")
        reply = json.loads(s.makefile().readline())
    assert reply["generation"] == 1 and reply["kind"] == "warm"


def test_control_socket_status_ps_restart_and_stop(supervise, tmp_path):
    sup = supervise(*NO_WINDOW, name="ctl")
    before = up_and_set(sup)
    sock = sup.runtime_dir / "ctl.sock"
    assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(sup.runtime_dir).st_mode) == 0o700
    status = json.loads(sup.cli("status", "ctl", "--json").stdout)
    assert status["name"] == "ctl" and status["pid"] == before["pid"]
    ps = sup.cli("ps", "--json").stdout
    assert "ctl" in ps
    sup.cli("restart", "ctl", "--warm")
    sup.wait_up(1)
    assert_preserved(before, sup.state())
    sup.cli("restart", "ctl", "--cold")
    sup.wait_up(2)
    assert sup.state()["kind"] == "cold"
    sup.cli("stop", "ctl")
    assert sup.proc.wait(timeout=20) == 0
    sup.wait_event("stop")


def test_garbage_on_the_control_socket_gets_errors_and_changes_nothing(supervise):
    sup = supervise(name="junk")
    sup.wait_up(0)
    sock = str(sup.runtime_dir / "junk.sock")
    for payload in [
        b"not json\n",
        b'{"cmd":"format-disk"}\n',
        b"\x00\xff\xfe garbage\n",
        b'{"cmd":"restart","mode":"lukewarm"}\n',
        b"[1,2,3]\n",
        b"x" * 70000 + b"\n",
        b"\n",  # the docs promise every line a reply
        b'{"cmd":"status","cmd":"stop"}\n',  # duplicate keys: refused, not a stop
    ]:
        with socket.socket(socket.AF_UNIX) as c:
            c.settimeout(5)
            c.connect(sock)
            c.sendall(payload)
            reply = json.loads(c.makefile().readline())
            assert reply["ok"] is False and reply["error"], reply
    assert sup.proc.poll() is None
    assert json.loads(sup.cli("status", "junk", "--json").stdout)["generation"] == 0
    assert sup.events("failure") == []


def test_garbage_from_the_app_side_gets_an_error_and_changes_nothing(supervise):
    """A process speaking nonsense on REKINDLE_SUPERVISOR_FD cannot confuse
    the supervisor: each bad message gets an ERROR reply."""
    liar = Path(__file__).parent / "apps" / "liar.py"
    sup = supervise(app=[sys.executable, str(liar)])
    assert sup.proc.wait(timeout=20) == 0, sup.stderr()
    sup.out.flush()
    assert "errors 5" in Path(sup.out.name).read_text()


def test_metrics_endpoint_counts_restarts(supervise):
    port = free_port()
    sup = supervise("--metrics", f"127.0.0.1:{port}", *NO_WINDOW)
    up_and_set(sup)
    sup.command("kill", expect_reply=False)
    sup.wait_up(1)
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert "rekindle_preserved_bytes" in text
    restarts = [line for line in text.splitlines() if line.startswith("rekindle_restarts_total{")]
    assert any('mode="warm"' in line and line.endswith(" 1") for line in restarts), restarts
    assert "rekindle_downtime_seconds_bucket" in text


def test_run_without_a_program_is_a_usage_error():
    from supervisor_harness import REKINDLE

    p = subprocess.run([str(REKINDLE), "run"], capture_output=True, text=True, check=False)
    assert p.returncode == 2 and "PROGRAM" in (p.stderr + p.stdout).upper()


def test_service_app_is_built():
    assert SERVICE.exists()


def test_restart_timing_is_reported(supervise):
    sup = supervise(*NO_WINDOW)
    up_and_set(sup)
    t0 = time.monotonic()
    sup.command("kill", expect_reply=False)
    sup.wait_up(1)
    restart = sup.wait_event("restart")
    for key in ("detect_us", "spawn_us"):
        assert isinstance(restart[key], int) and restart[key] >= 0, restart
    assert restart["spawn_us"] < (time.monotonic() - t0) * 1e6


NOBODY_CONNECT = """
import json, socket, sys
c = socket.socket(socket.AF_UNIX)
c.settimeout(5)
try:
    c.connect(sys.argv[1])
except PermissionError:
    print("EACCES")
    sys.exit(0)
c.sendall(b'{"cmd":"stop"}\\n')
print(c.makefile().readline().strip() or "closed")
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or not Path("/usr/bin/setpriv").exists(), reason="needs root and setpriv"
)
def test_control_socket_refuses_other_users(supervise):
    """File modes keep other users out; behind them the supervisor checks the
    peer's uid itself (tested by loosening the modes, as a mistake would)."""
    shared = Path(tempfile.mkdtemp(prefix="rekindle-priv-"))
    try:
        shared.chmod(0o755)
        sup = supervise(name="priv", env={"REKINDLE_RUNTIME_DIR": str(shared / "run")})
        sup.wait_up(0)
        sock = shared / "run" / "priv.sock"

        def as_nobody():
            p = subprocess.run(
                [
                    "setpriv",
                    "--reuid=65534",
                    "--regid=65534",
                    "--clear-groups",
                    "/usr/bin/python3",
                    "-c",
                    NOBODY_CONNECT,
                    str(sock),
                ],
                capture_output=True,
                text=True,
                timeout=20,
                check=False,
            )
            return p.stdout.strip()

        assert as_nobody() == "EACCES"
        (shared / "run").chmod(0o755)
        sock.chmod(0o666)
        reply = as_nobody()
        assert reply == "closed" or json.loads(reply)["ok"] is False, reply
        assert sup.proc.poll() is None, "a stranger's stop was obeyed"
    finally:
        shutil.rmtree(shared, ignore_errors=True)


# ---- messages for other users ------------------------------------------------------

needs_root_and_setpriv = pytest.mark.skipif(
    os.geteuid() != 0 or not Path("/usr/bin/setpriv").exists(), reason="needs root and setpriv"
)


def rekindle_as_nobody(*args, env):
    from supervisor_harness import REKINDLE

    p = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(REKINDLE), *args],
        capture_output=True,
        text=True,
        timeout=20,
        env=env,
        check=False,
    )
    return p.returncode, p.stderr


@needs_root_and_setpriv
def test_a_runtime_dir_of_another_user_says_what_to_do():
    """A non-root user without XDG_RUNTIME_DIR lands on /run/rekindle, which
    is root's: the error says which variable to set or whom to run as."""
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_RUNTIME_DIR", "REKINDLE_RUNTIME_DIR")}
    code, err = rekindle_as_nobody("run", "--", "/bin/true", env=env)
    assert code == 1, err
    assert "/run/rekindle" in err and "set XDG_RUNTIME_DIR" in err and "run as root" in err, err
    shared = Path(tempfile.mkdtemp(prefix="rekindle-dir-"))
    try:
        shared.chmod(0o755)
        (shared / "run").mkdir(mode=0o700)
        code, err = rekindle_as_nobody(
            "run", "--", "/bin/true", env={**env, "REKINDLE_RUNTIME_DIR": str(shared / "run")}
        )
        assert code == 1, err
        assert "belongs to uid 0, not to us (uid 65534)" in err, err
        assert "set REKINDLE_RUNTIME_DIR to a directory of your own, or run as root" in err, err
    finally:
        shutil.rmtree(shared, ignore_errors=True)


@needs_root_and_setpriv
def test_status_of_a_supervisor_of_another_user_says_permission_denied(supervise):
    """Root's supervisor, seen by another user: the socket is there but out
    of reach (its directory, then the socket itself), which is not "no
    supervisor named"."""
    shared = Path(tempfile.mkdtemp(prefix="rekindle-priv-"))
    try:
        shared.chmod(0o755)
        run_dir = shared / "run"
        sup = supervise(name="rootsvc", env={"REKINDLE_RUNTIME_DIR": str(run_dir)})
        sup.wait_up(0)
        env = {**os.environ, "REKINDLE_RUNTIME_DIR": str(run_dir)}
        for _ in ("directory 0700", "socket 0600"):
            code, err = rekindle_as_nobody("status", "rootsvc", env=env)
            assert code == 1, err
            assert "no supervisor named" not in err, err
            assert f"permission denied at {run_dir}/rootsvc.sock" in err, err
            assert "run as root" in err, err
            run_dir.chmod(0o755)  # then only the socket's own mode keeps us out
        assert sup.proc.poll() is None
    finally:
        shutil.rmtree(shared, ignore_errors=True)


# ---- the control socket under load ------------------------------------------------


def raise_nofile(want):
    """Raises RLIMIT_NOFILE's soft limit to `want` if the hard limit allows;
    returns the old limits, to restore."""
    import resource

    old = resource.getrlimit(resource.RLIMIT_NOFILE)
    soft, hard = old
    if soft < want:
        if hard != resource.RLIM_INFINITY and hard < want:
            pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < {want}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return old


def test_idle_control_connections_cannot_lock_out_status_and_stop(supervise):
    """3,000 idle connections (a leaking client, a flood) used to fill the
    table and refuse everyone else for as long as they stayed: now each
    newcomer evicts the connection idle the longest."""
    import resource

    sup = supervise(name="flood")
    sup.wait_up(0)
    sock = str(sup.runtime_dir / "flood.sock")
    old = raise_nofile(3000 + 512)
    idle = []
    try:
        for _ in range(3000):
            c = socket.socket(socket.AF_UNIX)
            c.settimeout(10)
            c.connect(sock)
            idle.append(c)
        t0 = time.monotonic()
        status = json.loads(sup.cli("status", "flood", "--json").stdout)
        assert status["name"] == "flood" and status["pid"], status
        assert time.monotonic() - t0 < 3, "status was not prompt"
        t0 = time.monotonic()
        out = sup.cli("stop", "flood").stdout
        assert "flood: stopped" in out
        assert time.monotonic() - t0 < 5, "stop was not prompt"
        assert sup.proc.wait(timeout=20) == 0
        # the oldest idle connections were evicted with a word, not dropped silently
        first = idle[0].makefile("rb").readline()
        assert b"too many control connections" in first, first
    finally:
        for c in idle:
            c.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, old)


def test_an_idle_control_connection_is_closed_after_the_timeout(supervise):
    sup = supervise(name="idle", app=["sleep", "30"])
    sock = sup.runtime_dir / "idle.sock"
    deadline = time.monotonic() + 10
    while not sock.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    with socket.socket(socket.AF_UNIX) as c:
        c.settimeout(15)
        c.connect(str(sock))
        t0 = time.monotonic()
        line = c.makefile("rb").readline()
        waited = time.monotonic() - t0
    reply = json.loads(line)
    assert reply["ok"] is False and "no complete request line" in reply["error"], reply
    assert 4 < waited < 9, waited
    assert sup.proc.poll() is None


# ---- a supervisor killed under its app ----------------------------------------------


def process_gone(pid):
    """True once pid has exited (a zombie nobody reaped counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat[stat.rfind(")") + 2] in "ZX"


def test_a_new_run_next_to_the_orphan_of_a_sigkilled_supervisor_refuses_and_says_what_to_do(supervise):
    """SIGKILL the supervisor: its app serves on, unsupervised, holding the
    port. `status` says the supervisor is gone and names the app; a new
    `rekindle run` of the name refuses (code orphan_app) with the app's pid
    and the command to stop it, instead of failing on `Address already in
    use`. Once the orphan is gone, the next run replaces the stale socket."""
    from supervisor_harness import REKINDLE

    sup = supervise(name="orph")
    before = up_and_set(sup)
    orphan = before["pid"]
    run = [
        str(REKINDLE),
        "run",
        "--name",
        "orph",
        "--events",
        str(sup.events_path.with_name("events2.jsonl")),
        "--listen",
        f"127.0.0.1:{sup.port}",
        "--",
        str(SERVICE),
        "--entries",
        "1000",
    ]
    second = None
    try:
        sup.proc.kill()
        sup.proc.wait(timeout=10)
        assert sup.state()["pid"] == orphan, "the app serves on, unsupervised"

        p = sup.cli("status", "orph", check=False)
        assert p.returncode == 1, p.stderr
        assert 'the supervisor "orph" is not running: stale socket at' in p.stderr, p.stderr
        assert f"its app still runs unsupervised: pid {orphan}" in p.stderr, p.stderr
        assert "Connection refused" not in p.stderr, p.stderr
        ps = sup.cli("ps").stdout
        line = next((x for x in ps.splitlines() if x.startswith("orph ")), "")
        assert "orphaned" in line and str(orphan) in line, ps

        p = subprocess.run(run, env=sup.env, capture_output=True, text=True, timeout=30, check=False)
        assert p.returncode == 1, p.stderr
        assert p.stderr.startswith("rekindle: orphan_app: "), p.stderr
        assert f"pid {orphan} (service)" in p.stderr and f"`kill {orphan}`" in p.stderr, p.stderr
        assert "Address already in use" not in p.stderr, p.stderr
        event = json.loads(sup.events_path.with_name("events2.jsonl").read_text().splitlines()[-1])
        assert event["supervisor"] == "error" and event["code"] == "orphan_app", event
        assert event["pids"] == [orphan], event
        assert sup.state()["pid"] == orphan, "the refusal left the orphan alone"

        os.kill(orphan, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while not process_gone(orphan):
            assert time.monotonic() < deadline, "the orphan did not die"
            time.sleep(0.02)
        second = subprocess.Popen(run, env=sup.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        state = sup.state()  # retried until the new app answers on the port
        assert state["pid"] != orphan and state["generation"] == 0, state
        status = json.loads(sup.cli("status", "orph", "--json").stdout)
        assert status["supervisor_pid"] == second.pid, status
        sup.cli("stop", "orph")
        assert second.wait(timeout=20) == 0
    finally:
        if not process_gone(orphan):
            os.kill(orphan, signal.SIGKILL)
        if second is not None and second.poll() is None:
            second.kill()
            second.wait()
