"""Error virtualization (tools/errvirt, docs/errvirt.md): the pass's lit
tests; the run-time's end-to-end unit program (real crashes that must come
back as library errors, with memory, registers and the calls' effects
undone); the cases that must not be recovered (a second fault in the same
window, a fault after an irrecoverable call), each dying with its reason
code; and rkv built with the pass: a request that crashes gets an error
reply while the process and every other connection carry on, and a crash
after a write falls back to the warm restart."""

import json
import signal
import subprocess
from pathlib import Path

import pytest
import redis
from rkv_harness import Rkv

from conftest import BUILD, ROOT

PLUGIN = BUILD / "lib" / "rekindle-errvirt.so"
UNIT = BUILD / "errvirt" / "unit" / "ev_unit"
RKV_EV = BUILD / "examples" / "rkv-ev"
LIT = Path("/usr/lib/llvm-19/build/utils/lit/lit.py")
NO_SAVE = ("--save", "")


def need(path):
    if not path.exists():
        pytest.fail(f"{path} missing: run `make errvirt build/examples/rkv-ev` first")


def ev_lines(text, kind=None):
    out = [json.loads(line) for line in text.splitlines() if line.startswith('{"rekindle_ev"')]
    return [e for e in out if kind is None or e["rekindle_ev"] == kind]


def test_pass_ir(tmp_path):
    need(PLUGIN)
    p = subprocess.run(
        ["python3", str(LIT), "-q", "--param", f"plugin={PLUGIN}", "--param", f"exec_root={tmp_path}",
         str(ROOT / "tools" / "errvirt" / "test")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr


def test_runtime_recovers_and_undoes():
    need(UNIT)
    p = subprocess.run([str(UNIT)], capture_output=True, text=True, timeout=60, check=False)
    assert p.returncode == 0, p.stderr
    assert "all checks passed" in p.stdout
    recovered = ev_lines(p.stderr, "recovered")
    injected = ev_lines(p.stderr, "injected")
    # memory, registers, frame, hole, stack words, popped hole, open, socket, pipe, fopen, read,
    # mmap, fresh, defer, formatting (strftime, strerror_r), clock (no gate: back to malloc),
    # module (getloadavg, dlclose)
    assert len(recovered) == len(injected) == 17, p.stderr
    assert {e["gate"] for e in injected} == {
        "malloc",
        "open",
        "socket",
        "pipe",
        "fopen",
        "read",
        "mmap",
        "posix_memalign",
    }
    assert not ev_lines(p.stderr, "fallback")
    assert all(e["reason"] == "ev_recovered" and e["rollback_ns"] < 1_000_000 for e in recovered)


@pytest.mark.parametrize(
    ("mode", "reason", "closed_by"),
    [("second-fault", "ev_second_fault", None), ("irrecoverable", "ev_window_closed", "write")],
)
def test_runtime_declines(mode, reason, closed_by):
    need(UNIT)
    p = subprocess.run([str(UNIT), mode], capture_output=True, text=True, timeout=60, check=False)
    assert p.returncode == -signal.SIGSEGV, p.stderr
    assert "survived" not in p.stderr
    (fb,) = ev_lines(p.stderr, "fallback")
    assert fb["reason"] == reason
    if closed_by:
        assert fb["closed_by"] == "ev_irrecoverable_call" and fb["closed_by_call"] == closed_by


@pytest.fixture
def rkv_ev(tmp_path):
    need(RKV_EV)
    s = Rkv(tmp_path, *NO_SAVE, "--enable-debug", "yes", exe=RKV_EV)
    yield s
    s.close()


def stops_cleanly(s):
    """SIGTERM ends the server at once, with status 0 (a deferred call gone
    wrong would show here as a double free and a restart)."""
    s.proc.send_signal(signal.SIGTERM)
    assert s.proc.wait(timeout=10) == 0, s.stderr()[-2000:]
    assert "double free" not in s.stderr()


def test_rkv_crash_becomes_error_reply(rkv_ev):
    other = rkv_ev.client(single_connection_client=True)
    victim = rkv_ev.client(single_connection_client=True)
    other.set("k", "v")
    other_id = other.client_id()
    for i in range(3):  # a persistent fault: every time it comes back
        with pytest.raises(redis.ResponseError, match="out of memory"):
            victim.execute_command("DEBUG", "crash-after-alloc", f"payload{i}")
        assert victim.ping()
        assert other.get("k") == b"v"
        other.set(f"after{i}", i)
    assert other.client_id() == other_id  # the same connection throughout
    assert rkv_ev.proc.poll() is None
    err = rkv_ev.stderr()
    assert not rkv_ev.runtime_events("restart")
    assert len(rkv_ev.runtime_events("start")) == 1
    rec = ev_lines(err, "recovered")
    assert len(rec) == 3 and all(e["gate"] == "malloc" and e["pid"] == rkv_ev.proc.pid for e in rec)
    assert [e["compensation"] for e in ev_lines(err, "injected")] == ["free_ret"] * 3
    stops_cleanly(rkv_ev)


def test_rkv_crash_after_write_restarts_warm(rkv_ev):
    c = rkv_ev.client()
    c.set("k", "v")
    with pytest.raises(redis.ConnectionError):
        c.execute_command("DEBUG", "SEGFAULT")  # logs a line (a write) first
    rkv_ev.ready(2)
    assert rkv_ev.wait_serving().get("k") == b"v"
    (fb,) = ev_lines(rkv_ev.stderr(), "fallback")
    assert fb["reason"] == "ev_window_closed" and fb["closed_by_call"] == "write"
    (restart,) = rkv_ev.runtime_events("restart")
    assert restart["mode"] == "warm" and restart["signal"] == "SIGSEGV"
    stops_cleanly(rkv_ev)
