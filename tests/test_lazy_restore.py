"""Lazy restore (issue 13; docs/snapshots.md, "Lazy restore"): `rekindle
restore --restore-pages lazy` starts rkv before its arena is read back; the
pages come in when rkv touches them (the supervisor serves the app's
userfaultfd) and in the background.  Checked through unmodified redis-py:
every key back, the pages accounted for, a crash in the middle of the
restore restarts warm with every key, and no snapshot reads a half-filled
arena."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import redis
from rkv_harness import Rkv
from supervisor_harness import REKINDLE
from test_snapshots import DEBUG_ON, checkpoint, kill_stack, rekindle, snapshotting

KEYS = 30000


def value(i):
    return f"value-{i}-" + "x" * (i % 97)


def loaded_store(tmp_path):
    """A store whose newest snapshot holds KEYS keys; the stack that wrote
    it is gone (memfds too)."""
    store = tmp_path / "store"
    r = snapshotting(tmp_path / "writer", store)
    c = r.client()
    for k in range(0, KEYS, 1000):
        p = c.pipeline(transaction=False)
        for i in range(k, min(k + 1000, KEYS)):
            p.set(f"key:{i}", value(i))
        p.execute()
    checkpoint(r)
    kill_stack(r)
    return store


def lazily(tmp_path, store, *extra):
    return Rkv(
        tmp_path, *DEBUG_ON, supervised=True,
        sup=("restore", "--from", str(store), "--snapshot-dir", str(store),
             "--restore-pages", "lazy", *extra),
    )  # fmt: skip


def wait_event(r, kind, pred, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [e for e in r.supervisor_events(kind) if pred(e)]
        if found:
            return found[-1]
        time.sleep(0.02)
    raise AssertionError(f"no {kind} event as expected in {timeout} s: {r.supervisor_events(kind)}")


def all_keys_back(c):
    for k in range(0, KEYS, 1000):
        idx = range(k, min(k + 1000, KEYS))
        got = c.mget([f"key:{i}" for i in idx])
        bad = [(i, v) for i, v in zip(idx, got, strict=True) if v != value(i).encode()]
        assert not bad, f"{len(bad)} keys wrong after the lazy restore, first {bad[0]}"
    assert c.dbsize() == KEYS


def test_a_lazy_restore_serves_before_the_pages_are_in_and_brings_them_all_back(tmp_path):
    store = loaded_store(tmp_path)
    r = lazily(tmp_path / "lazy", store)
    try:
        c = r.client()
        assert c.get("key:12345") == value(12345).encode()
        assert r.runtime_events("lazy_restore")[-1]["mode"] == "lazy"
        serving = wait_event(r, "lazy_restore", lambda e: e.get("state") == "serving")
        done = wait_event(r, "lazy_restore", lambda e: e.get("state") == "done")
        # every page of the snapshot came in once: touched by rkv or filled
        assert done["faulted_pages"] > 0 and done["filled_pages"] > 0, done
        assert in_once(done) == serving["pages"], (serving, done)
        all_keys_back(c)
        # snapshots again once it is over (none while pages were missing)
        again = checkpoint(r)
        assert again["durable"]
    finally:
        r.close()


def in_once(done):
    """The snapshot's pages that came in: each faulted, brought in with a
    fault (the present pages after it), or filled in the background."""
    return done["faulted_pages"] + done["faulted_around_pages"] + done["filled_pages"]


def test_a_fault_brings_in_the_pages_after_it(tmp_path):
    # rkv's start reads its arena's first pages one after another; with
    # the background fill slowed down, the faults bring them in, each with
    # the pages after it, not one round trip a page
    store = loaded_store(tmp_path)
    r = lazily(tmp_path / "lazy", store, "--restore-fill-rate", "2000")
    try:
        c = r.client()
        assert c.get("key:777") == value(777).encode()
        serving = wait_event(r, "lazy_restore", lambda e: e.get("state") == "serving")
        done = wait_event(r, "lazy_restore", lambda e: e.get("state") == "done", timeout=60)
        assert done["faulted_around_pages"] > 0, done
        assert done["faulted_around_pages"] <= 15 * done["faulted_pages"], done
        assert in_once(done) == serving["pages"], (serving, done)
        all_keys_back(c)
    finally:
        r.close()


def test_a_checkpoint_during_a_lazy_restore_is_refused_and_a_crash_restarts_warm(tmp_path):
    """The background fill is slowed down (--restore-fill-rate) so the
    restore is still under way: a checkpoint is refused with its code, and a
    crash in place is left to the supervisor (a new address space would map
    the arena without its missing pages), which writes the rest into the
    memfd and restarts rkv warm with every key."""
    store = loaded_store(tmp_path)
    # (a crash right after the start is not a crash loop here)
    r = lazily(tmp_path / "lazy", store, "--restore-fill-rate", "20", "--crashloop-window", "0")
    try:
        c = r.client()
        assert c.get("key:7") == value(7).encode()
        wait_event(r, "lazy_restore", lambda e: e.get("state") == "serving")
        p = rekindle("checkpoint", "rkv", "--json", env=r.env)
        assert p.returncode != 0 and '"code":"lazy_restore"' in p.stdout.replace(" ", ""), p.stdout + p.stderr
        pid = r.app_pid()
        with pytest.raises(redis.ConnectionError):  # the server died mid-reply
            c.execute_command("DEBUG", "SEGFAULT")
        c = r.wait_serving()
        restart = [e for e in r.runtime_events("restart") if e.get("mode") == "respawn"]
        assert restart, r.runtime_events("restart")
        gone = wait_event(r, "lazy_restore", lambda e: e.get("state") == "app_gone")
        filled = wait_event(r, "lazy_restore", lambda e: e.get("state") == "filled")
        assert gone["result"] == "stopped" and filled["pages"] > 0, (gone, filled)
        assert r.app_pid() != pid
        assert r.ready(2)["start"] == "warm"
        all_keys_back(c)
    finally:
        r.close()


OLD_RUNTIME = r"""
import array, json, os, socket, struct, sys
HDR = "<IHHII"
s = socket.socket(fileno=int(os.environ["REKINDLE_SUPERVISOR_FD"]))
s.settimeout(10)
s.send(struct.pack(HDR, 0x4D534B52, 2, 1, 8, 0) + struct.pack("<II", os.getpid(), 0))  # ATTACH, caps 0
fds = array.array("i")
msg, anc, _, _ = s.recvmsg(4096, socket.CMSG_SPACE(64 * fds.itemsize))
for level, kind, data in anc:
    if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
        fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
flags = struct.unpack_from("<I", msg, 16 + 316)[0]
pages = {}
for fd in fds:
    name = os.readlink(f"/proc/self/fd/{fd}")
    size = os.fstat(fd).st_size
    pages[name] = sum(os.pread(fd, 4096, off).strip(b"\0") != b"" for off in range(0, size, 4096))
print(json.dumps({"flags": flags, "pages": pages}), flush=True)
"""


def test_a_runtime_that_cannot_restore_lazily_gets_every_page_first(tmp_path):
    """ATTACH with caps 0 (a runtime older than lazy restores, here a
    script speaking the protocol): the supervisor writes every page into
    the memfds before its INHERIT, which does not say LAZY."""
    store = loaded_store(tmp_path)
    old = tmp_path / "old_runtime.py"
    old.write_text(OLD_RUNTIME)
    events = tmp_path / "events.jsonl"
    p = subprocess.run(
        [str(REKINDLE), "restore", "--from", str(store), "--name", "old", "--events", str(events),
         "--restore-pages", "lazy", "--max-restarts", "0", "--", sys.executable, str(old)],
        capture_output=True, text=True, timeout=60, check=False,
        env=dict(os.environ, REKINDLE_RUNTIME_DIR=str(tmp_path / "run")),
    )  # fmt: skip
    line = next((x for x in p.stdout.splitlines() if x.startswith('{"flags"')), None)
    assert line, p.stdout + p.stderr
    got = json.loads(line)
    assert got["flags"] == 0x1, got  # RESTORED, not LAZY
    evs = [json.loads(x) for x in events.read_text().splitlines() if '"lazy_restore"' in x]
    filled = [e for e in evs if e.get("state") == "filled"]
    assert filled and filled[0]["why"] == "runtime_not_lazy", evs
    arena = [n for n in got["pages"] if "rekindle:keyspace" in n]
    # every page of the snapshot is in the memfd: the header page and the rest
    assert arena and got["pages"][arena[0]] >= filled[0]["pages"] + 1 > 100, got


def test_a_child_forked_during_a_lazy_restore_reads_the_real_pages(tmp_path):
    """durable.c --check --fork under a lazy restore whose background fill
    is held back: the forked child reads every slot first; its faults come
    on a userfaultfd of its own (UFFD_FEATURE_EVENT_FORK) and must be served
    with the snapshot's pages, never zero ones mapped into the shared memfd."""
    durable = REKINDLE.parent.parent / "apps" / "durable"
    store = tmp_path / "store"
    env = dict(os.environ, REKINDLE_RUNTIME_DIR=str(tmp_path / "run"))
    ev1 = tmp_path / "ev1.jsonl"
    w = subprocess.Popen(
        [str(REKINDLE), "run", "--name", "durable", "--events", str(ev1), "--snapshot-dir", str(store),
         "--snapshot-interval", "0", "--", str(durable), "--writes", "1500", "--threads", "4"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
    )  # fmt: skip
    try:
        # every write made before the checkpoint (a loaded machine may take
        # long: the check below counts all 1,500)
        deadline, done = time.monotonic() + 180, False
        while not done and time.monotonic() < deadline:
            line = w.stdout.readline()
            assert line, "the writer's output ended before it was done"
            done = line.strip() == '{"app":"done"}'
        assert done, "the writer did not finish its 1,500 writes in 180 s"
        p = subprocess.run([str(REKINDLE), "checkpoint", "durable", "--wait", "--json"],
                           capture_output=True, text=True, env=env, timeout=30, check=False)  # fmt: skip
        assert p.returncode == 0, p.stdout + p.stderr
    finally:
        app = [json.loads(x)["pid"] for x in ev1.read_text().splitlines() if '"spawn"' in x]
        w.kill()
        w.wait(timeout=10)
        for pid in app:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    ev2 = tmp_path / "ev2.jsonl"
    back = subprocess.Popen(
        [str(REKINDLE), "restore", "--from", str(store), "--name", "durable", "--events", str(ev2),
         "--restore-pages", "lazy", "--restore-fill-rate", "1", "--", str(durable), "--check", "--fork"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
    )  # fmt: skip
    try:
        got = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and "check" not in got:
            line = back.stdout.readline()
            assert line, "the restored app's output ended"
            if line.startswith('{"app"'):
                e = json.loads(line)
                got[e["app"]] = e
        assert got["child_check"]["set"] == 1500, got
        assert got["check"]["set"] == 1500 and got["check"]["wrong"] == 0, got
    finally:
        back.send_signal(signal.SIGTERM)
        back.wait(timeout=20)
    gone = [json.loads(x) for x in ev2.read_text().splitlines() if '"lazy_restore"' in x]
    stats = [e for e in gone if e.get("state") in ("app_gone", "done")]
    assert stats and stats[0]["forks"] >= 1, gone
