"""RK_ARENA_WRITE_PROTECT for real: tests/pkeys/pkeys_check.c.

Where the host CPU has PKU (and the kernel turned it on: `pku` and `ospke` in
/proc/cpuinfo), every check runs natively in test_host and each of
GUEST_PASSES must PASS.  Where it has not, test_host checks the warned
fallback, and test_pkeys_under_qemu boots pkeys_check as /init of a tiny
initramfs under QEMU TCG, whose emulated CPU (-cpu max) has PKU and OSPKE
(tests/pkeys/run_qemu.sh).  REKINDLE_PKEYS_QEMU=1 runs the QEMU boot on a
PKU host too (tests/pkeys/deps.sh then installs QEMU there as well)."""

import json
import os
import shutil
import subprocess
from glob import glob
from pathlib import Path

import pytest

from conftest import BUILD, ROOT

RUN_QEMU = ROOT / "tests" / "pkeys" / "run_qemu.sh"
CHECK_SRC = ROOT / "tests" / "pkeys" / "pkeys_check.c"

# every sub-test's checks that must PASS wherever PKU works (guest or host)
GUEST_PASSES = [
    "a.protected",
    "a.pkru-after-open",
    "b.read-outside",
    "c.stray-write-faults",
    "c.handler-pkru",
    "c.stray-write-kills",
    "d.write-in-region",
    "d.nested-inner-end",
    "d.outermost-end",
    "d.fork-in-region",
    "signal.pkru",
    "signal.region-in-handler",
    "e.rk_alloc",
    "e.rk_free",
    "e.rk_calloc",
    "e.rk_realloc",
    "e.rk_root_set-get",
    "e.still-protected",
    "f.early-thread-no-read",
    "f.new-thread-read",
    "f.new-thread-stray-write",
    "f.new-thread-region",
    "f.region-is-per-thread",
    "multi.interleaved",
    "multi.writers-in-region",
    "multi.handler-other-arena",
    "multi.after-handler",
    "multi.thread-born-in-region",
    "multi.fork-in-nested-region",
    "g.warm-after-null",
    "g.value-kept",
    "g.protected-again",
    "g.warm-after-stray-write",
    "g.stray-write-did-not-land",
    "prefault.warm-protected",
    "stages.open-protected",
    "stages.publish",
    "stages.buffer",
    "stages.stray-write-faults",
    "stages.warm",
    "stages.warm-resume",
    "stages.recovery",
    "stages.resumed-result",
    "stages.buffer-replace-reset",
    "stages.discard",
    "stages.still-protected",
    "h.bench",
]


def host_has_pku():
    """PKU in the CPU and enabled by the kernel (OSPKE): pkey_alloc works."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = line.split(":", 1)[1].split()
            return "pku" in flags and "ospke" in flags
    return False


def qemu_forced():
    return os.environ.get("REKINDLE_PKEYS_QEMU", "") not in ("", "0")


def check_passes(out):
    """Every check of GUEST_PASSES passed and none failed."""
    res = results(out)
    failed = [r[1] for r in res.values() if r[0] == "FAIL"]
    assert not failed, "\n".join(failed)
    missing = [n for n in GUEST_PASSES if res.get(n, ("", ""))[0] != "PASS"]
    assert not missing, f"no PASS for {missing}\n" + out[-4000:]
    assert "PKEYS_CHECK_DONE failed=0" in out


def results(text):
    out = {}
    for line in text.splitlines():
        for tag in ("PASS", "FAIL", "SKIP"):
            if line.startswith(tag + " "):
                name = line[len(tag) + 1 :].split(":", 1)[0]
                out[name] = (tag, line)
    return out


def test_host(tmp_path):
    lib = BUILD / "lib" / "librekindle.a"
    if not lib.exists():
        pytest.fail(f"{lib} missing: run `make` first")
    exe = tmp_path / "pkeys_check"
    subprocess.run(
        [
            os.environ.get("CC", "cc"),
            "-O2",
            "-std=c11",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-D_GNU_SOURCE",
            "-pthread",
            f"-I{ROOT / 'runtime' / 'include'}",
            str(CHECK_SRC),
            "-o",
            str(exe),
            str(lib),
            "-pthread",
        ],
        check=True,
    )
    env = {"PATH": "/usr/bin:/bin"}
    p = subprocess.run([str(exe)], capture_output=True, text=True, env=env, timeout=120, check=False)
    assert "PKEYS_CHECK_DONE failed=0" in p.stdout, p.stdout + p.stderr
    assert p.returncode == 0
    res = results(p.stdout)
    assert not [r for r in res.values() if r[0] == "FAIL"], p.stdout
    if not host_has_pku():  # the runtime warned once and left the arena writable
        assert "a.fallback" in res, p.stdout
        warnings = [
            json.loads(x)
            for x in p.stderr.splitlines()
            if x.startswith('{"rekindle":"warning"') and "write protection unavailable" in x
        ]
        assert warnings, p.stderr
        assert all(w["why"] == "no memory protection keys on this CPU or kernel" for w in warnings)
        return
    # PKU here: every check runs natively, as in the guest
    assert "INFO cpu: /proc/cpuinfo flags pku=1 ospke=1" in p.stdout, p.stdout
    check_passes(p.stdout)
    # the stray write of sub-test g is named as one, in its arena
    restarts = [json.loads(x) for x in p.stderr.splitlines() if x.startswith('{"rekindle":"restart"')]
    stray = [r for r in restarts if r.get("si_code") == "SEGV_PKUERR"]
    assert stray and all(r["in"] == "warm" for r in stray), restarts
    pre = [json.loads(x) for x in p.stderr.splitlines() if x.startswith('{"rekindle":"prefaulted"')]
    assert pre and pre[0]["bytes"] >= 64 << 20, "the pre-fault thread read the protected arena"


def test_pkeys_under_qemu():
    if host_has_pku() and not qemu_forced():
        pytest.skip("the host has PKU: test_host ran every check natively (REKINDLE_PKEYS_QEMU=1: QEMU too)")
    if not shutil.which("qemu-system-x86_64"):
        pytest.skip("qemu-system-x86_64 not installed (bash tests/pkeys/deps.sh)")
    if not glob("/boot/vmlinuz-*"):
        pytest.skip("no kernel image in /boot to boot the guest (bash tests/pkeys/deps.sh)")
    if not shutil.which("cpio"):
        pytest.skip("cpio not installed (bash tests/pkeys/deps.sh)")
    env = dict(os.environ, PKEYS_TIMEOUT="90")
    p = subprocess.run(
        ["bash", str(RUN_QEMU), str(BUILD)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    if p.returncode == 77:
        pytest.skip(p.stderr.strip())
    out = p.stdout
    assert "INFO cpu: /proc/cpuinfo flags pku=1 ospke=1" in out, out[-4000:] + p.stderr
    check_passes(out)
    assert p.returncode == 0, p.stderr
    pre = [json.loads(x) for x in out.splitlines() if x.startswith('{"rekindle":"prefaulted"')]
    assert pre and pre[0]["bytes"] >= 64 << 20, "the pre-fault thread read the protected arena"
