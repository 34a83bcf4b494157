"""The restart's freeze: threads that reach an unsafe region or an allocator
lock while a restart decides wait for it (tests/apps/regions.c).  A restart
whose execve fails must let them go on; a thread already inside a region
goes through its nested regions, so the restart need not wait for it in
vain and stays warm."""

import os
import shutil
import subprocess

from conftest import BUILD, json_lines, run_app


def run_copy(tmp_path, *args, timeout=60):
    """Runs a copy of the regions app: exec-fail takes the execute
    permission off its own binary."""
    exe = tmp_path / "regions"
    shutil.copy2(BUILD / "apps" / "regions", exe)
    env = dict(os.environ)
    env.pop("REKINDLE_MANIFEST_FD", None)
    p = subprocess.run(
        [str(exe), *args], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )
    return p, json_lines(p.stdout, "app"), json_lines(p.stderr, "rekindle")


def test_failed_execve_releases_threads_parked_by_the_freeze(tmp_path):
    """execve fails with EACCES (the binary lost its execute permission,
    /proc/self/exe names the same file); the restart returns the error and
    the workers, parked in rk_unsafe_begin and in an allocator lock, go on.
    The next restart, with the permission back, is warm with every region
    whole."""
    p, states, events = run_copy(tmp_path, "exec-fail")
    assert states, p.stderr
    first = states[0]
    assert first["restart_rc"] == -13, first  # -EACCES
    assert first["region_worker_went_on"] and first["alloc_worker_went_on"], first
    assert first["alloc_ok"], first
    assert p.returncode == 0, p.stderr
    assert [e["what"] for e in events if e["rekindle"] == "error"] == ["restart failed: execve"]
    assert len(states) == 2, p.stderr
    after = states[1]
    assert after["kind"] == "warm", after
    assert after["balanced"] and after["regions"] > 0, after


def test_nested_region_during_the_freeze_goes_through_and_the_restart_stays_warm():
    """The restart starts while a worker is inside a region of "a"; the
    worker then opens nested regions of "b" and "a".  Parking it there would
    keep "a" open for the freeze's whole 50 ms and make the restart cold."""
    for _ in range(3):
        run = run_app("regions", "nested")
        assert run.returncode == 0, run.stderr
        assert len(run.states) == 1, run.stderr
        (after,) = run.states
        assert after["kind"] == "warm", after["decision"]
        assert after["balanced"], after
        assert after["nested_a"] == after["nested_b"] == after["regions"] > 0, after
