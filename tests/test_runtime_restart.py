"""End-to-end tests of warm and cold restarts: the crashy app keeps a linked
list (and RK_PRESERVED statics, a preserved range, large objects) in an arena,
dies in a chosen way, and reports what its next incarnation found."""

import os
import shutil
import signal
import socket
import struct
import subprocess
from pathlib import Path

import pytest

from conftest import BUILD, json_lines, run_app

NO_WINDOW = {"REKINDLE_CRASHLOOP_MS": "0"}  # crashes in quick succession stay warm


def first_and_second(run):
    assert len(run.states) >= 2, run.stderr
    return run.states[0], run.states[1]


@pytest.mark.parametrize(
    "kind,signame",
    [("segv", "SIGSEGV"), ("bus", "SIGBUS"), ("fpe", "SIGFPE"), ("ill", "SIGILL"), ("abort", "SIGABRT")],
)
def test_warm_restart_after_fatal_signal_preserves_contents_and_addresses(kind, signame):
    run = run_app("crashy", "--objects", 3000, "--payload", 40, "--crash", f"0:{kind}")
    assert run.returncode == 0, run.stderr
    before, after = first_and_second(run)
    assert before["kind"] == "fresh" and after["kind"] == "warm"
    assert after["pid"] == before["pid"], "a warm restart keeps the pid"
    assert after["state"] == "preserved" and after["objects"] == 3000
    assert after["head"] == before["head"] and after["arena_base"] == before["arena_base"]
    assert after["reason"] == f"signal {signame}"
    # RK_PRESERVED statics: counter carried over, pointers into the arena and
    # into the (possibly moved) load image still valid.
    assert after["statics_restored"] == 1
    assert after["incarnations_seen"] == 2
    assert after["static_head_ok"] and after["fn_ok"]
    assert after["literal"] == "literal-in-image"
    (restart,) = run.events_of("restart")
    assert restart["mode"] == "warm" and restart["signal"] == signame
    starts = run.events_of("start")
    assert [s["kind"] for s in starts] == ["fresh", "warm"]
    assert starts[1]["decision"] == "all checks passed"
    assert starts[1]["restart_us"] > 0


def test_app_requested_restart_is_warm():
    run = run_app("crashy", "--crash", "0:restart")
    _, after = first_and_second(run)
    assert after["kind"] == "warm" and after["state"] == "preserved"
    assert after["reason"] == "app: rejuvenation"


def test_app_requested_cold_restart_drops_arenas():
    run = run_app("crashy", "--crash", "0:restart-cold")
    _, after = first_and_second(run)
    assert after["kind"] == "cold" and after["state"] == "rebuilt"
    assert after["decision"] == "cold restart requested"
    assert after["statics_restored"] == 0 and after["incarnations_seen"] == 1


def test_sweep_frees_objects_of_requests_in_flight():
    run = run_app("crashy", "--objects", 500, "--inflight", 300, "--crash", "0:segv")
    before, after = first_and_second(run)
    assert after["swept_objects"] == 300
    assert after["kept_objects"] == 500
    assert after["allocated_bytes"] == before["allocated_bytes"]
    (rec,) = run.events_of("recovered")
    assert rec["objects_freed"] == 300 and rec["bytes_freed"] == after["swept_bytes"] > 0


def test_without_cleanup_nothing_is_swept():
    run = run_app("crashy", "--objects", 500, "--inflight", 300, "--crash", "0:segv", "--no-cleanup")
    _, after = first_and_second(run)
    assert after["state"] == "preserved"
    assert after["swept_objects"] == 0
    assert run.events_of("recovered")[0]["cleanup"] == "none"


def test_preserved_range_survives():
    run = run_app("crashy", "--range", "--crash", "0:segv")
    before, after = first_and_second(run)
    assert before["range"] == 2  # preserved in place
    assert after["range"] == 1  # found mapped again with its contents


def test_large_preserved_state_and_listening_socket_reusable():
    """64 MiB of 1 MiB objects survive; the old incarnation's listening socket
    is closed by the restart (fds are transient) so the port binds again."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = run_app("crashy", "--fill-mb", 64, "--listen", port, "--crash", "0:segv")
    before, after = first_and_second(run)
    assert before["listen_errno"] == 0
    assert after["kind"] == "warm" and after["fill_ok"] is True
    assert after["listen_errno"] == 0, "old listening socket leaked into the new incarnation"


def test_threads_inside_the_allocator_do_not_spoil_a_warm_restart():
    """Two threads allocate and free in the arena while main faults: the
    restart waits for their critical sections, so the restart stays warm
    and the sweep frees what they held."""
    for _ in range(5):
        run = run_app("crashy", "--objects", 2000, "--churn-threads", 2, "--crash", "0:segv")
        _, after = first_and_second(run)
        assert after["kind"] == "warm", after["decision"]
        assert after["state"] == "preserved"
        assert after["swept_objects"] > 0


@pytest.mark.parametrize(
    "kind,why",
    [
        ("in-runtime", "fault inside the rekindle runtime"),
        ("hold-lock", "died inside the allocator holding a lock"),
        ("corrupt-header", "header checksum mismatch"),
    ],
)
def test_unsafe_state_goes_cold_with_logged_reason(kind, why):
    run = run_app("crashy", "--objects", 100, "--crash", f"0:{kind}")
    assert run.returncode == 0, run.stderr
    _, after = first_and_second(run)
    assert after["kind"] == "cold" and after["state"] == "rebuilt"
    assert why in after["decision"]
    start = run.events_of("start")[1]
    assert start["kind"] == "cold" and why in start["decision"]


def test_shared_library_build_restarts_warm_and_detects_faults_inside_it():
    run = run_app("crashy-shared", "--crash", "0:segv", "--crash", "1:in-runtime", env=NO_WINDOW)
    assert [s["kind"] for s in run.states] == ["fresh", "warm", "cold"]
    assert run.states[1]["state"] == "preserved" and run.states[1]["fn_ok"]
    assert "fault inside the rekindle runtime" in run.states[2]["decision"]


def test_address_range_taken_in_new_process_goes_cold_then_warm_again():
    run = run_app("crashy", "--squat-on-restart", "--crash", "0:segv", "--crash", "1:segv", env=NO_WINDOW)
    states = run.states
    assert [s["kind"] for s in states] == ["fresh", "cold", "warm"]
    assert "already taken" in states[1]["decision"]
    assert run.events_of("warning")[0]["what"].startswith("arena address range taken")
    assert states[2]["arena_base"] != states[0]["arena_base"]
    assert states[2]["state"] == "preserved"


def test_other_file_at_the_arena_fd_is_refused():
    """Same memfd name and size, another file: the manifest names the file
    itself (device and inode), so the restart goes cold instead of using it."""
    run = run_app("crashy", "--swap-arena-on-restart", "--crash", "0:segv", env=NO_WINDOW)
    states = run.states
    assert [s["kind"] for s in states] == ["fresh", "cold"]
    assert "arena data: foreign fd" in states[1]["decision"]
    assert states[1]["state"] != "preserved"


def test_second_failure_within_window_goes_cold():
    run = run_app("crashy", "--crash", "0:segv", "--crash", "1:segv")
    assert [s["kind"] for s in run.states] == ["fresh", "warm", "cold"]
    assert "second failure" in run.states[2]["decision"]
    assert "after a warm restart" in run.states[2]["decision"]


def test_same_fault_on_preserved_data_after_a_warm_restart_goes_cold():
    """A fault that repeats on the same preserved page after a warm restart
    is the data's fault: warm again would loop, however far apart."""
    run = run_app("crashy", "--crash", "0:arena-bus", "--crash", "1:arena-bus", env=NO_WINDOW)
    assert run.returncode == 0, run.stderr
    assert [s["kind"] for s in run.states] == ["fresh", "warm", "cold"]
    restarts = run.events_of("restart")
    assert [r["mode"] for r in restarts] == ["warm", "cold"]
    assert [r["code"] for r in restarts] == ["all_checks_passed", "repeated_fault"]
    assert all(r["si_code"] == "BUS_ADRERR" and r["in"] == "data" for r in restarts), restarts
    assert run.events_of("start")[2]["code"] == "repeated_fault"
    assert restarts[0]["addr"] == restarts[1]["addr"]
    assert run.states[2]["decision"] == (
        f"same fault again after a warm restart: SIGBUS at {restarts[1]['addr']} in arena data"
    )


def test_different_faults_or_faults_outside_preserved_memory_stay_warm():
    run = run_app(
        "crashy", "--crash", "0:arena-bus", "--crash", "1:segv", "--crash", "2:segv", env=NO_WINDOW
    )
    assert run.returncode == 0, run.stderr
    assert [s["kind"] for s in run.states] == ["fresh", "warm", "warm", "warm"]
    null = run.events_of("restart")[1]
    assert null["si_code"] == "SEGV_MAPERR" and "in" not in null, null


def control_block_memfd():
    """A valid control block, as the supervisor creates it (the layout of
    docs/supervisor-protocol.md)."""
    fd = os.memfd_create("rekindle:control", 0)
    os.ftruncate(fd, 65536)
    os.pwrite(fd, struct.pack("<QII", 0x314C5254434B5200, 1, 65536), 0)
    os.pwrite(fd, struct.pack("<II", 256, 64), 192)
    return fd


def test_a_sigbus_anywhere_in_the_same_arena_again_goes_cold():
    """Past the end of the arena's file is never a legitimate access; the
    page moves as the arena grows, so any SIGBUS in the same arena counts."""
    run = run_app("crashy", "--crash", "0:arena-bus", "--crash", "1:arena-bus-far", env=NO_WINDOW)
    assert [s["kind"] for s in run.states] == ["fresh", "warm", "cold"], run.stderr
    assert run.events_of("restart")[1]["code"] == "repeated_fault"


def test_a_wild_address_outside_preserved_memory_goes_cold_the_third_time():
    """The same bad address each time, as a wild pointer kept in preserved
    data gives; a poison request gives that too, so not at the first repeat."""
    crashes = [a for g in range(3) for a in ("--crash", f"{g}:wild")]
    run = run_app("crashy", *crashes, env=NO_WINDOW)
    assert [s["kind"] for s in run.states] == ["fresh", "warm", "warm", "cold"], run.stderr
    last = run.events_of("restart")[2]
    assert last["code"] == "repeated_fault" and "3 times in a row" in last["decision"], last


def host_has_pkeys():
    flags = Path("/proc/cpuinfo").read_text().split()
    return "pku" in flags and "ospke" in flags


@pytest.mark.skipif(not host_has_pkeys(), reason="no protection keys here (tests/test_pkeys.py uses QEMU)")
def test_stray_writes_the_write_protection_stopped_stay_warm():
    """The same stray write twice: the protection stopped it, the data is
    intact, so it is not the data's fault."""
    run = run_app("crashy", "--wp", "--crash", "0:wp-stray", "--crash", "1:wp-stray", env=NO_WINDOW)
    assert [s["kind"] for s in run.states] == ["fresh", "warm", "warm"], run.stderr
    restarts = run.events_of("restart")
    assert [r["si_code"] for r in restarts] == ["SEGV_PKUERR", "SEGV_PKUERR"], restarts
    assert restarts[0]["addr"] == restarts[1]["addr"]


def test_clobbered_control_block_makes_the_restart_cold():
    fd = control_block_memfd()
    try:
        run = run_app(
            "crashy",
            "--crash",
            "0:corrupt-control",
            env={"REKINDLE_CONTROL_FD": str(fd), **NO_WINDOW},
            pass_fds=(fd,),
        )
    finally:
        os.close(fd)
    assert run.returncode == 0, run.stderr
    assert [s["kind"] for s in run.states] == ["fresh", "cold"]
    assert run.states[1]["decision"] == "control block corrupt: bad magic"
    assert run.events_of("restart")[0]["code"] == "control_block_corrupt"


def test_crash_loop_gives_up_and_dies_of_the_signal():
    crashes = [a for g in range(10) for a in ("--crash", f"{g}:segv")]
    run = run_app("crashy", *crashes)
    assert run.returncode == -signal.SIGSEGV
    (giveup,) = run.events_of("giveup")
    assert giveup["consecutive_fast_failures"] == 5
    assert len(run.states) == 5


def test_corrupt_manifest_fd_is_reported_and_starts_cold():
    run = run_app("crashy", env={"REKINDLE_MANIFEST_FD": "999"})
    (state,) = run.states
    assert state["kind"] == "cold"
    assert "is not a rekindle manifest" in state["decision"]


def test_manifest_fd_pointing_elsewhere_is_refused_and_left_open():
    """fd 0 is not ours: refused, and not closed (stdin stays usable)."""
    run = run_app("crashy", env={"REKINDLE_MANIFEST_FD": "0"})
    (state,) = run.states
    assert state["kind"] == "cold"
    assert "REKINDLE_MANIFEST_FD=0 is not a rekindle manifest" in state["decision"]


def garbage_memfd(name, size=1 << 20):
    fd = os.memfd_create(name, 0)
    os.ftruncate(fd, size)
    os.pwrite(fd, b"not ours" * 512, 0)
    return fd


def test_manifest_fd_to_another_memfd_is_refused_as_corrupt():
    fd = garbage_memfd("rekindle:manifest")
    try:
        run = run_app("crashy", env={"REKINDLE_MANIFEST_FD": str(fd)}, pass_fds=(fd,))
    finally:
        os.close(fd)
    (state,) = run.states
    assert state["kind"] == "cold"
    assert "manifest from the previous incarnation is corrupt" in state["decision"]


@pytest.mark.parametrize("kind", ["pipe", "memfd"])
def test_control_fd_that_is_not_a_control_block_is_ignored_with_a_warning(kind):
    if kind == "pipe":
        fd, other = os.pipe()
        os.close(other)
        want = "is not a rekindle control block"
    else:
        fd = garbage_memfd("rekindle:control")
        want = "control block has a foreign magic"
    try:
        run = run_app(
            "crashy", "--crash", "0:segv", env={"REKINDLE_CONTROL_FD": str(fd), **NO_WINDOW}, pass_fds=(fd,)
        )
    finally:
        os.close(fd)
    assert [s["kind"] for s in run.states] == ["fresh", "warm"]
    assert any(want in w["what"] for w in run.events_of("warning"))


def test_restarts_repeat_with_state_intact():
    crashes = [a for g in range(6) for a in ("--crash", f"{g}:segv")]
    run = run_app("crashy", "--objects", 1000, *crashes, env=NO_WINDOW)
    assert run.returncode == 0, run.stderr
    assert [s["kind"] for s in run.states] == ["fresh"] + ["warm"] * 6
    assert {s["head"] for s in run.states} == {run.states[0]["head"]}
    assert run.states[-1]["incarnations_seen"] == 7
    assert all(s["state"] == "preserved" for s in run.states[1:])
    # the manifest memfds alternate (each incarnation writes into the one of
    # two incarnations ago): from the second restart on, no fd is added
    assert len({s["open_fds"] for s in run.states[2:]}) == 1, [s["open_fds"] for s in run.states]


def test_refused_manifest_after_an_in_place_exec_goes_cold_under_the_start_name():
    """The exec of /proc/self/exe names the process "exe"; with no manifest
    to take the name from, the runtime puts back argv[0]'s."""
    run = run_app("crashy", "--crash", "0:corrupt-manifest", env=NO_WINDOW)
    # the cold start is generation 0 again, so it crashes once more (warm then)
    assert [(s["kind"], s["comm"]) for s in run.states[:2]] == [("fresh", "crashy"), ("cold", "crashy")]
    assert "manifest from the previous incarnation is corrupt" in run.states[1]["decision"]


def test_warm_restart_keeps_the_process_name():
    """The restart execs /proc/self/exe, which would name the process "exe"."""
    run = run_app("crashy", "--crash", "0:segv", env=NO_WINDOW)
    assert [(s["kind"], s["comm"]) for s in run.states] == [("fresh", "crashy"), ("warm", "crashy")]


def test_restart_runs_the_running_binary_even_if_replaced_on_disk(tmp_path):
    """An upgrade on disk before the crash: the arenas are laid out for the
    running binary, so the restart runs that one, not the file now at its path."""
    exe = tmp_path / "crashy"
    shutil.copy(BUILD / "apps" / "crashy", exe)
    shutil.copy("/bin/true", tmp_path / "other")
    p = subprocess.run(
        [str(exe), "--replace-self-with", str(tmp_path / "other"), "--crash", "0:segv"],
        capture_output=True,
        text=True,
        env={**os.environ, **NO_WINDOW},
        timeout=60,
        check=False,
    )
    states = json_lines(p.stdout, "app")
    assert [s["kind"] for s in states] == ["fresh", "warm"]
    assert states[1]["state"] == "preserved"
    assert (tmp_path / "crashy").read_bytes() == Path("/bin/true").read_bytes()  # the replacement happened


def test_forked_child_that_faults_dies_and_leaves_the_parent_alone():
    """Fatal-signal handlers survive fork: a child's fault must not restart
    (warm, on its parent's arenas and manifest); the child dies of it."""
    run = run_app("crashy", "--fork-crash")
    (fork,) = json_lines(run.stdout, "fork")
    assert fork["child_signal"] == signal.SIGSEGV
    assert [s["kind"] for s in run.states] == ["fresh"]
    assert run.returncode == 0
    (err,) = run.events_of("error")
    assert "forked child" in err["what"]


def test_range_fd_replaced_behind_the_runtime_is_refused(tmp_path):
    """The manifest names the file the runtime created, not whatever the fd
    number holds when the manifest is rewritten."""
    data = tmp_path / "data"
    run = run_app("crashy", "--range", "--steal-range-fd", data, "--crash", "0:segv", env=NO_WINDOW)
    assert [s["kind"] for s in run.states] == ["fresh", "cold"]
    assert "preserved range" in run.states[1]["decision"] and "foreign fd" in run.states[1]["decision"]
    assert data.read_bytes() == bytes(2 * 4096)  # never mapped over the range


def test_stray_shmem_fd_named_as_manifest_is_left_open():
    fd = garbage_memfd("not-rekindle")
    try:
        run = run_app("crashy", "--check-fd", fd, env={"REKINDLE_MANIFEST_FD": str(fd)}, pass_fds=(fd,))
    finally:
        os.close(fd)
    (state,) = run.states
    assert state["kind"] == "cold" and "corrupt" in state["decision"]
    assert state["check_fd_open"] == 1


def test_forked_child_that_opens_an_arena_does_not_touch_the_parents_manifest():
    """The child shares the parent's manifest memfds (and the spare the next
    incarnation writes into): it must write none of them."""
    run = run_app("crashy", "--fork-open", "--crash", "0:segv", env=NO_WINDOW)
    assert [s["kind"] for s in run.states] == ["fresh", "warm"]
    assert run.states[1]["state"] == "preserved"
    assert not [e for e in run.events_of("arena_dropped")]


def test_failure_hook_that_aborts_dies_of_sigabrt_instead_of_waiting_for_itself():
    run = run_app("crashy", "--hook-abort", "--crash", "0:segv", env=NO_WINDOW, timeout=20)
    assert run.returncode == -signal.SIGABRT
    assert any("own restart" in e["what"] for e in run.events_of("error"))


def test_teardown_helper_survives_signals_sent_to_the_apps_name():
    """`pkill -HUP app` reaches the helper (same name); it must stay, or the
    next restart tears the old address space down on its own path."""
    run = run_app("crashy", "--signal-helper", "--crash", "0:segv", env=NO_WINDOW)
    (sig,) = json_lines(run.stdout, "signal")
    assert sig["sent"] >= 1 and sig["alive"] == sig["sent"]
    assert [s["kind"] for s in run.states] == ["fresh", "warm"]


def test_inherited_arena_fd_is_close_on_exec_again_after_a_warm_restart():
    """The restart clears FD_CLOEXEC to hand the memfd on; the new image sets
    it again, so the app's own children do not inherit the arena."""
    run = run_app("crashy", "--crash", "0:segv", env=NO_WINDOW)
    assert [s["arena_fd_cloexec"] for s in run.states] == [1, 1]
