"""The redo log on a full disk (issue 13: "full disk ... a clear error and
loses nothing"): rkv --durability sync --sync-via redo with its store on a
small tmpfs that a filler file fills.  The writer cannot start its next
file, says so once (redo_write_failed), and the app's appends fail; rkv
then closes the log and makes its writes durable by snapshots, which fail
too (no_space): its replies are held, never sent before their writes are
durable.  Once the filler is removed the writer's next try succeeds
(redo_write_recovered), the held replies go out, and a restore after the
whole stack is killed finds every acknowledged write."""

import subprocess
import threading
import time

import pytest
import redis
from rkv_harness import Rkv
from test_rkv_durability import fill_disk, restored
from test_snapshots import kill_stack


def test_a_full_disk_holds_replies_and_loses_no_acknowledged_write(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    m = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(mnt)], capture_output=True,
                       check=False)  # fmt: skip
    if m.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {m.stderr.decode().strip()}")
    store = mnt / "store"
    try:
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
            assert not lost, f"{len(lost)} of {len(keys)} acknowledged writes lost: {lost[:5]}"
            # the writes after the last snapshot came back by the replay
            # (`rekindle restore` without --snapshot-dir replays too)
            replays = back.supervisor_events("redo_replay")
            assert replays and replays[-1]["records"] > 0, "the restore replayed nothing"
        finally:
            back.close()
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
