"""The redo log on a full disk (issue 13: "full disk ... a clear error and
loses nothing"): rkv --durability sync --sync-via redo with its store on a
small tmpfs that a filler file fills.  The writer cannot start its next
file, says so once (redo_write_failed), and the app's appends fail; rkv
then closes the log and makes its writes durable by snapshots, which fail
too (no_space): its replies are held, never sent before their writes are
durable.  Once the filler is removed the writer's next try succeeds
(redo_write_recovered), the held replies go out, and a restore after the
whole stack is killed finds every acknowledged write.

The second test is the defect that test once hit under load: a snapshot
failing on the full disk right after the app created its arena (the one
snapshot the agent flags that arena NEW in) was followed by a delta
without the arena's pages."""

import json
import os
import subprocess
import threading
import time

import redis
from rkv_harness import Rkv
from test_redo_api import COUNTER, Lines, events, kill, supervise
from test_rkv_durability import fill_disk, restored, small_tmpfs
from test_snapshots import REKINDLE, kill_stack, lines_until


def test_a_full_disk_holds_replies_and_loses_no_acknowledged_write(tmp_path):
    with small_tmpfs(tmp_path, "32m") as mnt:
        store = mnt / "store"
        # small redo files: the writer soon needs a new one, which the full
        # disk refuses (an append into a file already made needs no space)
        r = Rkv(tmp_path / "a", "--durability", "sync", "--sync-via", "redo", supervised=True,
                env={"REKINDLE_REDO_SEGMENT_BYTES": "65536"},
                sup=("run", "--snapshot-dir", str(store), "--snapshot-interval", "100ms"))  # fmt: skip
        acked = {}
        try:
            c = r.client()
            for i in range(200):
                assert c.set(f"before:{i}", f"v{i}") is True
                acked[f"before:{i}"] = f"v{i}"
            fill_disk(mnt / "filler")
            # writes until the writer fails: each is acknowledged only once
            # durable, and the ones after the failure wait
            held = []
            failed_at = None
            stop = threading.Event()

            def writer():
                w = redis.Redis(port=r.port, socket_timeout=60)
                i = 0
                while not stop.is_set() and i < 20_000:
                    k = f"during:{i}"
                    t = time.monotonic()
                    try:
                        assert w.set(k, f"w{i}") is True
                    except redis.ConnectionError:
                        return
                    acked[k] = f"w{i}"
                    held.append((t, time.monotonic()))
                    i += 1

            th = threading.Thread(target=writer, daemon=True)
            th.start()
            deadline = time.monotonic() + 30
            while "redo_write_failed" not in r.stderr() and time.monotonic() < deadline:
                time.sleep(0.02)
            assert "redo_write_failed" in r.stderr(), (
                "the writer never failed on the full disk\n" + r.stderr()[-2000:]
            )
            assert "no_space" in r.stderr().split("redo_write_failed", 1)[1].splitlines()[0]
            failed_at = time.monotonic()
            time.sleep(1.5)  # the app's writes meanwhile: held, none acknowledged
            n_full = len(acked)
            time.sleep(0.5)
            assert len(acked) == n_full, "writes were acknowledged while nothing could be made durable"
            freed_at = time.monotonic()
            (mnt / "filler").unlink()
            deadline = time.monotonic() + 30
            while len(acked) == n_full and time.monotonic() < deadline:
                time.sleep(0.02)
            assert len(acked) > n_full, "the held replies did not go out once the disk had room"
            stop.set()
            th.join(timeout=60)
            # a reply that came back during the full period came for a write
            # started before the failure (its record was already on disk)
            late = [(t, a) for t, a in held if failed_at + 0.2 < a < freed_at]
            assert not late, f"{len(late)} replies sent while the disk was full"
            assert "redo_write_recovered" in r.stderr() or r.supervisor_events("snapshot"), r.stderr()[-2000:]
            # the snapshot that released the held replies opened the log
            # again: these are records, which the restore must replay
            for i in range(50):
                assert c.set(f"after:{i}", f"a{i}") is True
                acked[f"after:{i}"] = f"a{i}"
            kill_stack(r)
        finally:
            r.close()
        back = restored(tmp_path / "b", store)
        try:
            keys = list(acked)
            got = dict(zip(keys, back.client().mget(keys), strict=True))
            lost = [k for k in keys if got[k] is None or got[k].decode() != acked[k]]
            assert not lost, (
                f"{len(lost)} of {len(keys)} acknowledged writes lost: {lost[:5]}\n"
                f"first stack:\n{r.stderr()[-3000:]}\n{r.events_path.read_text()[-6000:]}\n"
                f"restored:\n{back.stderr()[-3000:]}\n{back.events_path.read_text()[-3000:]}"
            )
            # the writes after the last snapshot came back by the replay
            # (`rekindle restore` without --snapshot-dir replays too)
            replays = back.supervisor_events("redo_replay")
            assert replays and replays[-1]["records"] > 0, "the restore replayed nothing"
        finally:
            back.close()


def test_a_snapshot_failing_after_a_new_arena_is_followed_by_a_full_one(tmp_path):
    """The agent flags a region NEW once, in the first report after it
    began tracking it: that report's snapshot reads the region whole.  If
    that snapshot fails (here, on a full disk), the next must be full too:
    as a delta it would hold none of the arena's pages from before the
    tracking, and a restore from it would map an arena of zeros.  (Seen in
    the test above under load: the first snapshot came before rkv's arena,
    and the next one failed on the full disk; every write was lost.)
    Checkpoints only, no interval: the first snapshot (asked for by the app)
    has no arena; the disk is filled; then the app creates its arena."""
    env = dict(os.environ, REKINDLE_RUNTIME_DIR=str(tmp_path / "run"))

    def checkpoint():
        return subprocess.run([str(REKINDLE), "checkpoint", "redoc", "--wait", "--json"], capture_output=True,
                              text=True, env=env, timeout=60, check=False)  # fmt: skip

    with small_tmpfs(tmp_path, "32m") as mnt:
        store, ev, go = mnt / "store", tmp_path / "ev1.jsonl", tmp_path / "go"
        sup = supervise(tmp_path, ("run", "--snapshot-dir", store), ev, COUNTER,
                        "--early", "--arena-after", go)  # fmt: skip
        try:
            out = Lines(sup)
            got = out.until(lambda x: x.startswith('{"app":"early"'), 30)
            assert got and got[-1]["durable_epoch"] >= 1, got
            # (a store this small has no journal, journal_unavailable: the
            # app's snapshot was published; were it journaled, its fold would
            # give back the journal's space after the disk was filled)
            deadline = time.monotonic() + 30
            journaled = (store / "journal").exists()
            while journaled and not events(ev, "journal_folded") and time.monotonic() < deadline:
                time.sleep(0.02)
            # no snapshot in flight while the disk fills: one that failed
            # after it would give back the space its files had taken
            first = checkpoint()
            assert first.returncode == 0, first.stdout + first.stderr
            fill_disk(mnt / "filler")
            time.sleep(0.3)
            fill_disk(mnt / "filler2")
            go.touch()
            got = out.until(lambda x: x.startswith('{"app":"replayed"'), 30)
            assert any(x["app"] == "replayed" for x in got), got
            full = checkpoint()
            assert full.returncode != 0 and "no_space" in full.stdout, full
            (mnt / "filler").unlink()
            (mnt / "filler2").unlink()
            ok = checkpoint()
            assert ok.returncode == 0, ok.stdout + ok.stderr
            assert json.loads(ok.stdout)["full"], "the snapshot after the failed one is a delta: " + ok.stdout
        finally:
            kill(sup, ev)
        ev2 = tmp_path / "ev2.jsonl"
        back = supervise(tmp_path, ("restore", "--from", store), ev2, COUNTER, "--check")
        try:
            lines = lines_until(back, '{"app":"check"', 30)
            assert any(x.startswith('{"app":"check"') for x in lines), lines[-5:]
            deadline = time.monotonic() + 10
            while not events(ev2, "up") and time.monotonic() < deadline:
                time.sleep(0.02)
        finally:
            kill(back, ev2)
        up = events(ev2, "up")
        assert up and up[0]["code"] == "restored", f"the arena did not come back: {up[:1]}"
