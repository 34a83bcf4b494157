"""Stage-based progress recovery end to end: examples/kmeans crashes (a NULL
pointer write) inside each stage, inside a hook, or in the middle of a
progress-record update; the runtime restarts it warm; it resumes from the
last completed stage of the interrupted iteration and ends with centroids
bit-identical to an uninterrupted run.  The scratch and checkpoint modes
(cold restarts) must agree too, and a foreign or corrupt progress record
must make the job start over instead of resuming."""

import os
import re
import subprocess

import pytest

from conftest import BUILD, Run, json_lines

ITERS = 6
CRASH_ITER = 3
SIZE = ("--points", 200000, "--dims", 16, "--k", 16, "--iters", ITERS)


def kmeans(*args, env=None):
    exe = BUILD / "examples" / "kmeans"
    if not exe.exists():
        pytest.fail(f"{exe} missing: run `make` first")
    full_env = dict(os.environ)
    for var in ("REKINDLE_MANIFEST_FD", "KMEANS_T0", "REKINDLE_STAGES_TEAR_AT"):
        full_env.pop(var, None)
    full_env.update(env or {})
    p = subprocess.run(
        [str(exe), *map(str, SIZE), *map(str, args)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=60,
        check=False,  # the exit status is asserted by the caller
    )
    run = Run(
        p.returncode, p.stdout, p.stderr, json_lines(p.stdout, "kmeans"), json_lines(p.stderr, "rekindle")
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert len(run.states) == 1, run.stdout
    return run


def result(run):
    return run.states[-1]


def iterations_after_restart(run):
    """Iteration numbers that the last incarnation completed, in order."""
    last = run.stdout.rsplit("incarnation ", 1)[1]
    return [int(m) for m in re.findall(r"^iteration (\d+):", last, re.M)]


@pytest.fixture(scope="module")
def reference():
    return result(kmeans())


def test_uninterrupted_run(reference):
    assert reference["iterations"] == ITERS
    assert reference["restarts"] == 0 and reference["resumed"] is False
    assert reference["stages_run"] == 3 * ITERS and reference["stages_skipped"] == 0
    assert reference["inertia"] > 0


# (crash spec, index of the stage it resumes at, its phase, restore hooks run)
CRASHES = [
    ("assign:0.5", 0, "running", 0),
    ("update:0.5", 1, "running", 1),
    ("update:1", 1, "running", 1),  # all work done, the record not yet updated
    ("preserve:0.5", 1, "preserving", 0),
    ("converge:1", 2, "running", 0),
]


@pytest.mark.parametrize("spec,stage,phase,restores", CRASHES, ids=[c[0] for c in CRASHES])
def test_crash_in_each_stage_resumes_there_with_identical_result(reference, spec, stage, phase, restores):
    run = kmeans("--crash-at", f"{CRASH_ITER}:{spec}")
    res = result(run)
    assert res["hash"] == reference["hash"] and res["inertia"] == reference["inertia"]
    assert res["restarts"] == 1 and res["resumed"] is True
    assert res["stages_skipped"] == stage, "the completed stages of the iteration are not run again"
    assert res["restores"] == restores
    (start,) = [s for s in run.events_of("start") if s["generation"] == 1]
    assert start["kind"] == "warm"
    (resume,) = [e for e in run.events_of("progress") if e["what"] == "resume"]
    assert resume["iteration"] == CRASH_ITER and resume["stage"] == stage and resume["phase"] == phase
    assert resume["stage_name"] == ["assign", "update", "converge"][stage]
    # the new incarnation did not start again from iteration 0
    assert iterations_after_restart(run) == list(range(CRASH_ITER, ITERS))


def test_crash_inside_the_restore_hook_restores_again(reference):
    run = kmeans("--crash-at", f"{CRASH_ITER}:update:0.5", "--crash-at", f"{CRASH_ITER}:restore:0.5")
    res = result(run)
    assert res["hash"] == reference["hash"]
    assert res["restarts"] == 2 and res["restores"] == 1
    assert run.stdout.count(f"restore: centroids of iteration {CRASH_ITER} put back") == 2
    resumes = [e for e in run.events_of("progress") if e["what"] == "resume"]
    assert [(e["iteration"], e["stage_name"], e["phase"]) for e in resumes] == [
        (CRASH_ITER, "update", "running")
    ] * 2


def test_crash_in_the_first_and_last_stage_of_the_job(reference):
    first = kmeans("--crash-at", "0:assign:0")
    assert result(first)["hash"] == reference["hash"]
    assert iterations_after_restart(first) == list(range(ITERS))
    last = kmeans("--crash-at", f"{ITERS - 1}:converge:1")
    assert result(last)["hash"] == reference["hash"]
    assert result(last)["stages_run"] == 1 and result(last)["stages_skipped"] == 2


# Record updates, counted from 1: the reset at the start, then per iteration
# running assign, done, preserving update, running, done, running converge,
# done, end (2..9 in iteration 0, 10..17 in iteration 1).
@pytest.mark.parametrize("update", [2, 4, 5, 6, 9, 12])
def test_torn_progress_update_falls_back_to_the_previous_state(reference, update):
    run = kmeans(env={"REKINDLE_STAGES_TEAR_AT": str(update)})
    res = result(run)
    assert res["hash"] == reference["hash"]
    assert res["restarts"] == 1 and res["resumed"] is True
    (restart,) = run.events_of("restart")
    assert restart["mode"] == "warm" and "torn progress update" in restart["reason"]
    (resume,) = [e for e in run.events_of("progress") if e["what"] == "resume"]
    # the torn update never became current: the job resumes at the state
    # before it (update n publishes state n, so resume shows state n-1)
    before = {
        2: (0, 0, "", "idle"),
        4: (0, 1, "", "idle"),
        5: (0, 1, "update", "preserving"),
        6: (0, 1, "update", "running"),
        9: (0, 3, "", "idle"),  # all three stages done, the iteration not ended
        12: (1, 1, "", "idle"),
    }[update]
    assert (resume["iteration"], resume["stage"], resume["stage_name"], resume["phase"]) == before


def test_scratch_mode_restarts_cold_from_iteration_zero(reference):
    run = kmeans("--mode", "scratch", "--crash-at", f"{CRASH_ITER}:update")
    res = result(run)
    assert res["hash"] == reference["hash"]
    assert res["restarts"] == 1 and res["resumed"] is False
    assert [s["kind"] for s in run.events_of("start")] == ["fresh", "cold"]
    assert iterations_after_restart(run) == list(range(ITERS))


def test_checkpoint_mode_resumes_from_the_last_checkpoint(reference, tmp_path):
    ckpt = tmp_path / "km.ckpt"
    run = kmeans(
        "--mode",
        "checkpoint",
        "--checkpoint-every",
        2,
        "--checkpoint-file",
        ckpt,
        "--crash-at",
        f"{CRASH_ITER}:update",
    )
    res = result(run)
    assert res["hash"] == reference["hash"]
    assert [s["kind"] for s in run.events_of("start")] == ["fresh", "cold"]
    assert "checkpoint: resuming after iteration 1" in run.stdout
    assert iterations_after_restart(run) == list(range(2, ITERS))
    assert not ckpt.exists(), "a completed job removes its checkpoint"


def test_foreign_progress_record_is_discarded_and_the_job_starts_over():
    """The parameters change under the job (a new seed after the crash): the
    record's fingerprint differs, so the job starts over and ends exactly
    as an uninterrupted run with the new seed."""
    run = kmeans("--crash-at", f"{CRASH_ITER}:update", "--reseed-after-crash", 7)
    other = result(kmeans("--seed", 7))
    res = result(run)
    assert res["seed"] == 7 and res["hash"] == other["hash"]
    assert res["resumed"] is False
    (discard,) = [e for e in run.events_of("progress") if e["what"] == "discard"]
    assert "fingerprint" in discard["reason"] and "starting over" in discard["reason"]
    assert "other job parameters" in run.stdout
    assert iterations_after_restart(run) == list(range(ITERS))


def test_corrupt_progress_record_is_discarded_and_the_job_starts_over(reference):
    run = kmeans("--crash-at", f"{CRASH_ITER}:update", "--corrupt-progress-after-crash")
    res = result(run)
    assert res["hash"] == reference["hash"]
    assert res["resumed"] is False and res["restarts"] == 1
    (discard,) = [e for e in run.events_of("progress") if e["what"] == "discard"]
    assert "corrupt record" in discard["reason"]
    assert "setup: kept" in run.stdout, "the input survives even when the progress does not"
    assert iterations_after_restart(run) == list(range(ITERS))
