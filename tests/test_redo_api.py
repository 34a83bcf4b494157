"""The redo log's C API (rk_redo_append/flush/durable/replay) through
tests/apps/redo_counter.c, a counter whose every increment is a record,
under `rekindle run --snapshot-dir`: two cases rkv does not reach on
purpose.

- The newest snapshot was taken before the app created its arena: the
  records after it must build the arena from empty (rkv once replayed only
  into a keyspace that came back from the snapshot, and lost every write
  logged after such a cut).
- A crash loop goes back to before the loop: the snapshot from before the
  looping incarnation began, and the records up to where it began (not
  none of them, and not the looping incarnation's own).
- The app faults inside its replay: the snapshot alone (without the rest
  of the records) must not be kept as a warm state, neither by the
  runtime's restart in place (the restored arenas count as open regions
  until the replay returns) nor by the supervisor's; the snapshot is
  restored again, and the next replay brings every record back once."""

import contextlib
import json
import os
import queue
import signal
import subprocess
import threading
import time

from supervisor_harness import BUILD
from test_snapshots import REKINDLE, lines_until, rekindle

COUNTER = BUILD / "apps" / "redo_counter"


def supervise(tmp_path, sup, events, app, *args, name="redoc"):
    """`rekindle SUP... --name NAME --events EVENTS -- APP ARGS...` (sup:
    the verb and its options, `run --snapshot-dir D`, `restore --from D`),
    its stdout a pipe, with the runtime dir under tmp_path."""
    env = dict(os.environ, REKINDLE_RUNTIME_DIR=str(tmp_path / "run"))
    return subprocess.Popen(
        [str(REKINDLE), *map(str, sup), "--name", name, "--events", str(events),
         "--", str(app), *map(str, args)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
    )  # fmt: skip


def stack(tmp_path, store, events, *args, sup=()):
    return supervise(tmp_path, ("run", "--snapshot-dir", store, "--snapshot-interval", "50ms", *sup), events,
                     COUNTER, *args)  # fmt: skip


class Lines:
    """The app's stdout, read by one thread for the whole run."""

    def __init__(self, proc):
        self.q, self.seen = queue.Queue(), []
        threading.Thread(target=lambda: [self.q.put(x) for x in proc.stdout], daemon=True).start()

    def until(self, pred, seconds):
        deadline = time.monotonic() + seconds
        while not any(pred(x) for x in self.seen):
            try:
                self.seen.append(self.q.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                break
        return [json.loads(x) for x in self.seen if x.startswith("{")]


def events(path, kind):
    if not path.exists():
        return []
    return [e for e in map(json.loads, path.read_text().splitlines()) if e.get("supervisor") == kind]


def kill(sup, ev):
    """SIGKILL to the supervisor and every app it spawned."""
    sup.kill()
    sup.wait(timeout=10)
    for e in events(ev, "spawn"):
        with contextlib.suppress(ProcessLookupError):
            os.kill(e["pid"], signal.SIGKILL)


def acked_until_killed(sup, ev, n):
    """Reads n acknowledgements, then kills the stack; the last n."""
    lines = lines_until(sup, f'{{"app":"acked","n":{n},', 30)
    kill(sup, ev)
    acked = [json.loads(x) for x in lines if x.startswith('{"app":"acked"')]
    assert acked and acked[-1]["n"] == n, f"only {len(acked)} increments acknowledged: {lines[-3:]}"
    return acked


def check(sup, ev):
    lines = lines_until(sup, '{"app":"check"', 30)
    kill(sup, ev)
    got = [json.loads(x) for x in lines if x.startswith('{"app":"check"')]
    assert got, f"the restored app did not report: {lines[-5:]}"
    return got[-1]


def test_records_after_a_snapshot_taken_before_the_arena_build_it(tmp_path):
    store, ev = tmp_path / "store", tmp_path / "ev1.jsonl"
    acked = acked_until_killed(stack(tmp_path, store, ev, "--incs", "50", "--early"), ev, 50)
    assert all(a["at"] > 0 for a in acked), "the increments were not logged"
    snaps = json.loads(rekindle("snapshots", store, "--json").stdout)["snapshots"]
    # the log kept them durable: no interval snapshot after the first, which
    # holds no arena (what this test is about)
    assert len(snaps) == 1 and snaps[0]["redo"]["at"] == 0, snaps
    ev2 = tmp_path / "ev2.jsonl"
    got = check(stack(tmp_path, store, ev2, "--check"), ev2)
    assert got["replayed"] == 50 and got["n"] == 50, got


def test_a_death_inside_the_replay_restores_the_snapshot_again(tmp_path):
    store, ev = tmp_path / "store", tmp_path / "ev1.jsonl"
    acked = acked_until_killed(stack(tmp_path, store, ev, "--incs", "30"), ev, 30)
    # the first may have gone through a snapshot (the log opens at the first)
    logged = sum(a["at"] > 0 for a in acked)
    assert logged >= 25, acked
    ev2, once = tmp_path / "ev2.jsonl", tmp_path / "died-once"
    # no crash-loop window: a fault right after the restored start would
    # otherwise be a loop, restored whatever the runtime's own decision
    sup = stack(tmp_path, store, ev2, "--check", "--die-in-replay-once", str(once),
                sup=("--crashloop-window", "0"))  # fmt: skip
    got = check(sup, ev2)
    assert once.exists(), "the first replay did not die"
    # the snapshot again, and the records after it once: not the snapshot
    # kept warm without them, nor records applied twice
    replays = events(ev2, "redo_replay")
    assert len(replays) >= 2, replays
    assert got["n"] == 30 and got["replayed"] == replays[-1]["records"] > 0, (got, replays)


def test_a_crash_loop_replays_up_to_where_the_loop_began(tmp_path):
    store, ev = tmp_path / "store", tmp_path / "ev.jsonl"
    once = tmp_path / "crashed-once"
    sup = stack(tmp_path, store, ev, "--incs", "30", "--crash-when-warm-after", "10", str(once))
    try:
        out = Lines(sup)
        got = out.until(lambda x: x.startswith('{"app":"acked","n":30,'), 30)
        assert any(x.get("n") == 30 for x in got), got[-3:]
        # SIGKILL the app alone: the supervisor restarts it warm, the new
        # incarnation logs 10 more and faults within the crash-loop window;
        # then the restore: its replay is the third "replayed" line
        os.kill(events(ev, "spawn")[-1]["pid"], signal.SIGKILL)
        got = out.until(lambda x: sum(y.startswith('{"app":"replayed"') for y in out.seen) >= 3, 30)
        replayed = [x for x in got if x["app"] == "replayed"]
    finally:
        kill(sup, ev)
    assert once.exists(), "the warm incarnation did not crash"
    ups = events(ev, "up")
    assert ups[-1]["code"] == "restored" and "loop" in ups[-1]["decision"], [u["decision"] for u in ups]
    # 30 before the loop; the looping incarnation's 10 are not brought back
    assert replayed and replayed[-1]["n"] == 30, replayed


def test_a_cold_restart_does_not_continue_the_line(tmp_path):
    """A cold start drops the state: its records would not follow the
    line's snapshots, so it closes the log and its first snapshot opens a
    new line (continuing the old one, a restore from that line's snapshot
    after the machine died would apply the new records to the old state)."""
    store, ev = tmp_path / "store", tmp_path / "ev.jsonl"
    sup = stack(tmp_path, store, ev, "--incs", "20", sup=("--snapshot-events", "every"))
    try:
        out = Lines(sup)
        out.until(lambda x: x.startswith('{"app":"acked","n":20,'), 30)
        env = dict(os.environ, REKINDLE_RUNTIME_DIR=str(tmp_path / "run"))
        done = subprocess.run([str(REKINDLE), "restart", "--cold", "redoc"], capture_output=True, text=True,
                              env=env, timeout=30, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr
        got = out.until(lambda x: sum(y.startswith('{"app":"acked","n":20,') for y in out.seen) >= 2, 30)
        second = [x for x in got if x["app"] == "acked"][20:]
        assert len(second) == 20 and second[0]["n"] == 1, second[:2]  # from empty: cold
        # the lines of each incarnation's snapshots (their cuts, whenever
        # their commits ended): the cold one's are new
        lines = {}
        for snap in json.loads(rekindle("snapshots", store, "--json").stdout)["snapshots"]:
            lines.setdefault(snap["generation"] > 0, set()).add(snap["redo"]["line"])
        assert lines.get(True) and not (lines[True] & lines[False]), lines
    finally:
        kill(sup, ev)
    ev2 = tmp_path / "ev2.jsonl"
    got = check(stack(tmp_path, store, ev2, "--check"), ev2)
    assert got["n"] == 20, got


def test_without_a_supervisor_there_is_no_log(tmp_path):
    """rk_redo_append says -ENOTSUP when no supervisor gave the process a
    ring (the app must not believe its records are kept)."""
    env = dict(os.environ, REKINDLE_RUNTIME_DIR=str(tmp_path / "run"))
    p = subprocess.run([str(COUNTER), "--incs", "1"], capture_output=True, text=True, env=env, timeout=30,
                       check=False)  # fmt: skip
    assert p.returncode == 1 and "Operation not supported" in p.stderr, (p.returncode, p.stderr)
