"""The snapshot store through the `rekindle` CLI, as real processes:
the writer killed at every I/O step (REKINDLE_STORE_FAULT_AT, test-only),
damaged files, a newer format, unreadable files, a full disk, send/recv
(including --follow and damaged streams), and the CLI's errors."""

import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import BUILD

REKINDLE = BUILD / "bin" / "rekindle"
PAGE = 4096


def rk(*args, env=None, input=None, preexec_fn=None, timeout=60):
    if not REKINDLE.exists():
        pytest.fail(f"{REKINDLE} missing: run `make` first")
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("REKINDLE_STORE_FAULT")}
    full_env.update(env or {})
    return subprocess.run(
        [str(REKINDLE), *map(str, args)],
        capture_output=True,
        env=full_env,
        input=input,
        timeout=timeout,
        preexec_fn=preexec_fn,
        check=False,  # the exit status is what tests check
    )


def ok(*args, **kw):
    p = rk(*args, **kw)
    assert p.returncode == 0, (args, p.stderr.decode())
    return p


def error_code(p):
    """The reason code of `rekindle: <code>: ...` on stderr."""
    m = re.search(rb"rekindle: ([a-z_]+): ", p.stderr)
    return m.group(1).decode() if m else None


def data(seed, pages, zero_every=5):
    """Deterministic region bytes: pages of pseudo-random bytes, every
    `zero_every`th page zero, and repeated pages (for dedup)."""
    out = bytearray()
    for i in range(pages):
        if i % zero_every == 0:
            out += bytes(PAGE)
        elif i % 7 == 3:
            out += bytes([seed % 251]) * PAGE
        else:
            out += os.urandom(PAGE) if seed < 0 else (f"{seed}:{i}:".encode() * PAGE)[:PAGE]
    return bytes(out)


def write(path, b):
    path.write_bytes(b)
    return path


def import_snap(store, files, *extra, env=None):
    regions = [f"--region=arena:{name}:{0x7F0000000000 + i * 0x10000000:#x}={f}" for i, (name, f) in
               enumerate(files.items())]
    return rk("store-import", store, "--app", "t", *regions, *extra, env=env)


def export(store, spec, names, out):
    out.mkdir(exist_ok=True)
    src = f"{store}@{spec}" if spec else str(store)
    p = rk("store-export", src, *[f"--region={n}={out / n}" for n in names])
    return p, {n: (out / n).read_bytes() if (out / n).exists() else None for n in names}


def verify(store):
    p = rk("verify", store, "--json")
    return p.returncode, json.loads(p.stdout)


def ids(store):
    return [s["id"] for s in json.loads(ok("snapshots", store, "--json").stdout)["snapshots"]]


@pytest.fixture
def base(tmp_path):
    """A store with a full snapshot (tag v1) and a delta on it; the files
    each holds."""
    store = tmp_path / "store"
    src = tmp_path / "src"
    src.mkdir()
    v1 = {"main": data(-1, 200), "small": data(2, 3)}
    v2 = {"main": bytearray(v1["main"]), "small": v1["small"]}
    v2["main"][50 * PAGE : 60 * PAGE] = data(3, 10, zero_every=4)
    v2["main"] = bytes(v2["main"])
    f1 = {n: write(src / f"{n}.1", b) for n, b in v1.items()}
    f2 = {n: write(src / f"{n}.2", b) for n, b in v2.items()}
    assert import_snap(store, f1, "--tag", "v1").returncode == 0
    assert import_snap(store, f2, "--parent", "v1").returncode == 0
    return {"store": store, "v1": v1, "v2": v2, "ids": ids(store), "src": src, "tmp": tmp_path}


def assert_base_intact(b, store, out):
    """Both base snapshots export byte-identical."""
    for spec, want in [(b["ids"][0], b["v1"]), (b["ids"][1], b["v2"])]:
        p, got = export(store, spec, want.keys(), out)
        assert p.returncode == 0, p.stderr.decode()
        assert got == want, f"{spec} differs"


def steps_of(op, store):
    """How many I/O steps `op` takes (REKINDLE_STORE_FAULT_TRACE)."""
    p = op(store, {"REKINDLE_STORE_FAULT_TRACE": "1"})
    assert p.returncode == 0, p.stderr.decode()
    return len(re.findall(rb"^store-step \d+", p.stderr, re.M))


def test_writer_killed_at_every_io_step_leaves_a_consistent_store(base):
    """Four writers (a delta with 6 MiB of new pages, a full snapshot, gc
    folding a delta into a full, recv of a stream), each killed before
    each of its I/O steps in turn: the store verifies (leftovers only),
    the earlier snapshots export byte-identical, and the next write works."""
    b = base
    src = b["src"]
    big = {"main": b["v2"]["main"][: 100 * PAGE] + data(-1, 1500, zero_every=50), "small": b["v2"]["small"]}
    # `main` changes size: a new shape, so every page is written
    fbig = {n: write(src / f"{n}.big", v) for n, v in big.items()}
    f1 = {n: src / f"{n}.1" for n in b["v1"]}
    stream = ok("send", f"{b['store']}@v1").stdout
    # for gc: two more deltas, so `--keep 1` deletes two and folds the newest
    gc_base = _copy(b["store"], b["tmp"] / "gc-base")
    for seed in (7, 8):
        more = {"main": write(src / f"m{seed}", data(seed, 200)), "small": src / "small.2"}
        assert import_snap(gc_base, more, "--parent", "latest").returncode == 0
    gc_ids = ids(gc_base)
    gc_want = {i: export(gc_base, i, ["main", "small"], b["tmp"] / f"gcw{i}")[1] for i in gc_ids}

    def check_base(store, out):
        assert_base_intact(b, store, out)

    def check_gc(store, out):
        for i in ids(store):
            assert export(store, i, ["main", "small"], out)[1] == gc_want[i], i
        assert gc_ids[0] in ids(store) and gc_ids[-1] in ids(store)

    def check_recv(store, out):
        if (store / "FORMAT").exists() and ids(store):
            p, got = export(store, "v1", b["v1"].keys(), out)
            assert got == b["v1"], p.stderr.decode()

    ops = [
        ("delta", b["store"], lambda s, env: import_snap(s, fbig, "--parent", "latest", env=env), check_base),
        ("full", b["store"], lambda s, env: import_snap(s, f1, "--tag", "again", env=env), check_base),
        ("gc", gc_base, lambda s, env: rk("gc", s, "--keep", "1", env=env), check_gc),
        ("recv", None, lambda s, env: rk("recv", s, input=stream, env=env), check_recv),
    ]
    points = 0
    for name, start, op, check in ops:
        root = b["tmp"] / f"crash-{name}"
        root.mkdir()
        n = steps_of(op, _copy(start, root / "count") if start else root / "count")
        assert n >= 8, f"{name}: only {n} steps"
        for k in range(1, n + 1):
            store = _copy(start, root / f"k{k}") if start else root / f"k{k}"
            p = op(store, {"REKINDLE_STORE_FAULT_AT": str(k)})
            assert p.returncode == -signal.SIGABRT, (name, k, p.returncode, p.stderr.decode()[-500:])
            points += 1
            if not (store / "FORMAT").exists():
                assert start is None, (name, k)
                continue  # recv killed while creating the store
            rc, rep = verify(store)
            assert rc == 0 and rep["ok"], (name, k, rep["errors"])
            check(store, root / f"out{k}")
            if name == "delta" and len(ids(store)) == 3:
                # published before the kill: it restores in full
                assert export(store, ids(store)[2], big.keys(), root / f"new{k}")[1] == big, k
            # the store takes the next write
            again = import_snap(store, f1)
            assert again.returncode == 0, (name, k, again.stderr.decode())
            rc, rep = verify(store)
            assert rc == 0, (name, k, rep["errors"])
    assert points >= 50, points


def _copy(store, to):
    shutil.copytree(store, to)
    return to


def test_truncated_and_flipped_files_are_refused_by_code(base):
    b = base
    store = b["store"]
    d2 = b["ids"][1]
    pack = store / "packs" / f"{d2}.pack"
    man = store / "snapshots" / f"{d2}.json"
    orig_pack, orig_man = pack.read_bytes(), man.read_bytes()
    cases = []
    for cut in range(0, len(orig_pack), max(1, len(orig_pack) // 23)):
        cases.append((pack, orig_pack[:cut], "pack_corrupt"))
    for cut in range(0, len(orig_man), max(1, len(orig_man) // 17)):
        cases.append((man, orig_man[:cut], "manifest_truncated"))
    for at in range(0, len(orig_man) - 80, max(1, len(orig_man) // 11)):
        flipped = bytearray(orig_man)
        flipped[at] ^= 0x04
        cases.append((man, bytes(flipped), "manifest_corrupt"))
    chunk = bytearray(orig_pack)
    chunk[20] ^= 0x01
    cases.append((pack, bytes(chunk), "chunk_checksum"))
    index = bytearray(orig_pack)
    index[-64 - 20] ^= 0x01
    cases.append((pack, bytes(index), "pack_corrupt"))
    for i, (path, content, code) in enumerate(cases):
        path.write_bytes(content)
        rc, rep = verify(store)
        assert rc == 1 and code in [e["code"] for e in rep["errors"]], (i, path.name, code, rep["errors"])
        restorable = {s["id"]: s["restorable"] for s in rep["snapshots"]}
        assert restorable.get(b["ids"][0]) is True, (i, code)
        p, _ = export(store, d2, ["main"], b["tmp"] / "bad")
        assert p.returncode == 1 and error_code(p) == code, (i, code, p.stderr.decode())
        assert_base_intact_first(b, store)
        pack.write_bytes(orig_pack)
        man.write_bytes(orig_man)
    assert verify(store)[0] == 0


def assert_base_intact_first(b, store):
    p, got = export(store, b["ids"][0], b["v1"].keys(), b["tmp"] / "good")
    assert p.returncode == 0 and got == b["v1"], p.stderr.decode()


def test_a_newer_or_foreign_store_is_refused(base):
    store = base["store"]
    (store / "FORMAT").write_text("rekindle-store\nversion 99\n")
    cmds = [("snapshots", store), ("verify", store), ("gc", store),
            ("store-export", store, "--region=main=/dev/null")]
    for args in cmds:
        p = rk(*args)
        assert p.returncode == 1 and error_code(p) == "store_newer_version", (args, p.stderr)
    (store / "FORMAT").write_text("zfs-pool\n")
    assert error_code(rk("snapshots", store)) == "store_foreign"
    (store / "FORMAT").unlink()
    assert error_code(rk("snapshots", store)) == "store_foreign"
    p = import_snap(store, {"main": base["src"] / "main.1"})
    assert p.returncode == 1 and error_code(p) == "store_foreign", "never writes over a foreign directory"


def drop_to_nobody():
    nobody = pwd.getpwnam("nobody")
    os.setgroups([])
    os.setgid(nobody.pw_gid)
    os.setuid(nobody.pw_uid)


def test_unreadable_files_give_a_clear_error(base):
    b = base
    # a world-readable copy (pytest's tmp_path is root's alone)
    top = Path(tempfile.mkdtemp(prefix="rekindle-store-perm-"))
    try:
        os.chmod(top, 0o755)
        store = _copy(b["store"], top / "store")
        out = top / "out"
        out.mkdir()
        os.chmod(out, 0o777)
        (store / "packs" / f"{b['ids'][1]}.pack").chmod(0)
        src = f"{store}@{b['ids'][1]}"
        p = rk("store-export", src, f"--region=main={out / 'm'}", preexec_fn=drop_to_nobody)
        assert p.returncode == 1 and error_code(p) == "permission_denied", p.stderr.decode()
        assert b"permission denied" in p.stderr
        p = rk("store-export", f"{store}@v1", f"--region=main={out / 'm1'}", preexec_fn=drop_to_nobody)
        assert p.returncode == 0 and (out / "m1").read_bytes() == b["v1"]["main"], p.stderr.decode()
        (store / "snapshots" / f"{b['ids'][0]}.json").chmod(0)
        p = rk("verify", store, preexec_fn=drop_to_nobody)
        assert p.returncode == 1 and b"permission_denied" in p.stdout, p.stdout.decode()
        # gc refuses to collect while a manifest cannot be read
        p = rk("gc", store, preexec_fn=drop_to_nobody)
        assert p.returncode == 1 and error_code(p) in ("permission_denied", "locked"), p.stderr.decode()
    finally:
        shutil.rmtree(top)


def test_a_full_disk_publishes_nothing_and_leaves_the_store_consistent(base, tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    m = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True,
                       check=False)
    if m.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {m.stderr.decode().strip()}")
    try:
        store = mnt / "store"
        shutil.copytree(base["store"], store)
        before = ids(store)
        big = write(tmp_path / "big", os.urandom(3 << 20))
        p = import_snap(store, {"main": big})
        assert p.returncode == 1 and error_code(p) == "no_space", p.stderr.decode()
        assert ids(store) == before
        rc, rep = verify(store)
        assert rc == 0 and rep["leftovers"] == [], rep
        assert_base_intact(base, store, tmp_path / "out")
        # a snapshot that fits still goes in
        assert import_snap(store, {"main": write(tmp_path / "s", os.urandom(64 << 10))}).returncode == 0
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_send_recv_full_since_and_damaged_streams(base, tmp_path):
    b = base
    a, c = b["store"], tmp_path / "copy"
    full = ok("send", f"{a}@v1").stdout
    assert ok("recv", c, "--json", input=full).stdout.strip() == json.dumps({"received": [b["ids"][0]]},
                                                                           separators=(",", ":")).encode()
    inc = ok("send", a, "--since", "v1").stdout
    assert len(inc) < len(full) / 3, "the increment sends only the new chunks"
    ok("recv", c, input=inc)
    assert ids(c) == b["ids"]
    assert_base_intact(b, c, tmp_path / "out")
    ok("recv", c, input=inc)  # again: already there, skipped
    assert ids(c) == b["ids"]
    # damaged: every 1/13th prefix, and a flipped byte: nothing partial
    # (the end frame is the last 37 bytes: a cut inside it comes after a
    # complete snapshot, which is published)
    end_frame = 1 + 4 + 32
    cuts = [*range(0, len(inc) - end_frame, len(inc) // 13), len(inc) - end_frame - 1, len(inc) - 1]
    flipped = inc[:100] + bytes([inc[100] ^ 1]) + inc[101:]
    cases = [(inc[:c], c >= len(inc) - end_frame) for c in cuts] + [(flipped, False)]
    for i, (bad, complete) in enumerate(cases):
        d = tmp_path / f"d{i}"
        ok("recv", d, input=full)
        p = rk("recv", d, input=bad)
        assert p.returncode == 1 and error_code(p) in ("stream_truncated", "stream_corrupt"), p.stderr
        assert ids(d) == (b["ids"] if complete else [b["ids"][0]]), i
        assert verify(d)[0] == 0
    p = rk("recv", tmp_path / "e", input=b"GARBAGE-GARBAGE-GARBAGE")
    assert error_code(p) == "stream_foreign"
    p = rk("recv", tmp_path / "f", input=inc)
    assert error_code(p) == "missing_parent"


def test_send_follow_streams_each_new_snapshot(base, tmp_path):
    b = base
    dest = tmp_path / "replica"
    send = subprocess.Popen([str(REKINDLE), "send", f"{b['store']}@v1", "--follow"], stdout=subprocess.PIPE)
    recv = subprocess.Popen([str(REKINDLE), "recv", str(dest)], stdin=send.stdout, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    send.stdout.close()
    try:
        new = write(tmp_path / "n", data(9, 40))
        for _ in range(3):
            assert import_snap(b["store"], {"main": new}, "--parent", "latest").returncode == 0
        want = ids(b["store"])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (not (dest / "FORMAT").exists() or ids(dest) != want):
            time.sleep(0.1)
        # the replica has v1 folded (full) and every later one
        assert ids(dest) == want
        p, got = export(dest, "latest", ["main"], tmp_path / "o")
        assert got["main"] == data(9, 40)
    finally:
        send.kill()
        send.wait(timeout=10)
        _, err = recv.communicate(timeout=30)
    assert recv.returncode == 1 and b"stream_truncated" in err, err


def test_gc_retention_and_listing(base, tmp_path):
    b = base
    store = b["store"]
    new = write(tmp_path / "n", data(9, 200))
    files = {"main": new, "small": b["src"] / "small.2"}
    for _ in range(3):
        assert import_snap(store, files, "--parent", "latest").returncode == 0
    listing = json.loads(ok("snapshots", store, "--json").stdout)
    assert len(listing["snapshots"]) == 5 and listing["totals"]["dedup_ratio"] > 1
    assert [s["kind"] for s in listing["snapshots"]] == ["full", "delta", "delta", "delta", "delta"]
    text = ok("snapshots", store).stdout.decode()
    assert "v1" in text and "dedup ratio" in text
    dry = json.loads(ok("gc", store, "--keep", "2", "--dry-run", "--json").stdout)
    assert dry["deleted"] == [ids(store)[1], ids(store)[2]] and len(ids(store)) == 5
    before = ids(store)
    out = {i: export(store, i, ["main", "small"], tmp_path / f"x{i}")[1] for i in before}
    rep = json.loads(ok("gc", store, "--keep", "2", "--json").stdout)
    assert rep["deleted"] == before[1:3] and rep["rewritten"] == [before[3]]
    assert ids(store) == [before[0], before[3], before[4]], "the tagged v1 stays"
    for i in ids(store):
        assert export(store, i, ["main", "small"], tmp_path / f"y{i}")[1] == out[i]
    assert verify(store)[0] == 0
    rep = json.loads(ok("gc", store, "--keep-within", "1h", "--json").stdout)
    assert rep["deleted"] == []
    # progress on stderr when asked (stderr is not a terminal here)
    p = ok("verify", store, "--progress")
    assert b"progress: verify packs" in p.stderr and b"progress: verify snapshots 3/3" in p.stderr, p.stderr


@pytest.mark.parametrize(
    "args,status,code",
    [
        (["snapshots", "/nonexistent/store"], 1, "not_found"),
        (["verify"], 2, None),
        (["gc", "{store}", "--keep", "0"], 1, "invalid_argument"),
        (["gc", "{store}", "--keep", "x"], 2, None),
        (["gc", "{store}", "--keep-within", "soon"], 2, None),
        (["send", "{store}@nosuch"], 1, "not_found"),
        (["send", "{store}", "--since", "nosuch"], 1, "not_found"),
        (["store-export", "{store}", "--region=nosuch=/dev/null"], 1, "not_found"),
        (["store-export", "{store}", "--region=main"], 2, None),
        (["store-import", "{store}", "--app", "t", "--region=disk:x:0=/dev/null"], 2, None),
        (["store-import", "{store}", "--app", "t", "--region=arena:x:zz=/dev/null"], 2, None),
        (["store-import", "{store}", "--app", "t"], 2, None),
        (["store-import", "{store}", "--app", "t", "--full", "--parent", "v1",
          "--region=arena:x:0=/etc/hostname"], 2, None),
        (["store-import", "{store}", "--app", "t", "--tag", "a b", "--region=arena:x:0=/etc/hostname"], 1,
         "invalid_argument"),
        (["store-import", "{store}", "--app", "t", "--region=arena:x:0=/nonexistent"], 1, "not_found"),
        (["store-import", "{store}", "--app", "t", "--region=arena:x:0=/dev/null"], 1, "invalid_argument"),
        (["store-import", "{store}", "--app", "t", "--parent", "nosuch", "--region=arena:x:0=/etc/hostname"],
         1, "not_found"),
    ],
)
def test_cli_errors(base, args, status, code):
    p = rk(*[a.replace("{store}", str(base["store"])) for a in args], input=b"")
    assert p.returncode == status, (args, p.returncode, p.stderr.decode())
    if code:
        assert error_code(p) == code, p.stderr.decode()
    else:
        assert p.stderr.startswith(b"error: "), p.stderr.decode()
    assert ids(base["store"]) == base["ids"], "a bad command changes nothing"


def test_a_listing_into_a_closed_pipe_ends_quietly(base):
    """`rekindle snapshots DIR | head -1`: the listing's reader goes away
    first; the command ends as other tools do (SIGPIPE), without a panic."""
    r, w = os.pipe()
    os.close(r)  # the reader is gone before the first line
    try:
        p = subprocess.run(
            [str(REKINDLE), "snapshots", str(base["store"]), "--json"],
            stdout=w, stderr=subprocess.PIPE, timeout=30, check=False,
        )  # fmt: skip
    finally:
        os.close(w)
    assert b"panicked" not in p.stderr, p.stderr.decode()
    assert p.returncode == -signal.SIGPIPE, (p.returncode, p.stderr.decode())
