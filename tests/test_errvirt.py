"""Error virtualization (tools/errvirt, docs/errvirt.md): the pass's lit
tests; the run-time's end-to-end unit program (real crashes that must come
back as library errors, with memory, registers and the calls' effects
undone); the cases that must not be recovered (a second fault in the same
window, a fault after an irrecoverable call), each dying with its reason
code; and rkv built with the pass: a request that crashes gets an error
reply while the process and every other connection carry on, and a crash
after a write falls back to the warm restart."""

import errno
import json
import os
import signal
import subprocess
import sys
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
    assert int(fb["gate_pc"], 16) != 0  # the campaign places the fault by its transaction's gate
    if closed_by:
        assert fb["closed_by"] == "ev_irrecoverable_call" and fb["closed_by_call"] == closed_by


def test_a_socket_write_is_masked_only_when_asked():
    """A reply written to a socket, then a crash in the same transaction:
    by default the bytes left and the window closed at the write (a
    fallback); with REKINDLE_EV_MASK_SOCKET_WRITES=1 the crash rolls back to
    just after the write, which fails with ECONNRESET, and the socket is
    shut down: the peer has the reply, then end of stream, and the next
    write fails with EPIPE."""
    need(UNIT)
    p = subprocess.run([str(UNIT), "socket-write"], capture_output=True, text=True, timeout=60, check=False)
    assert p.returncode == -signal.SIGSEGV, p.stdout + p.stderr
    (fb,) = ev_lines(p.stderr, "fallback")
    assert fb["reason"] == "ev_window_closed" and fb["closed_by_call"] == "write", fb

    env = dict(os.environ, REKINDLE_EV_MASK_SOCKET_WRITES="1", REKINDLE_EV_REPORT="1")
    p = subprocess.run([str(UNIT), "socket-write"], capture_output=True, text=True, timeout=60, check=False,
                       env=env)  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    seen = dict(kv.split("=") for kv in p.stdout.split())
    assert seen == {"ret": str(-errno.ECONNRESET), "state": "1", "peer": "reply", "eof": "0", "again": "-1",
                    "again_errno": str(errno.EPIPE)}, seen  # fmt: skip
    (inj,) = ev_lines(p.stderr, "injected")
    assert inj["gate"] == "write" and inj["masked_output"] == 1 and inj["compensation"] == "shutdown"
    assert not ev_lines(p.stderr, "fallback")
    (rep,) = ev_lines(p.stderr, "report")
    assert rep["output_gates"] >= 1 and rep["output_injections"] == 1, rep


@pytest.mark.parametrize("mode", ["file-write", "stderr-socket-write"])
def test_a_write_that_is_not_a_peers_is_never_masked(mode, tmp_path):
    """The same with masking on, to a regular file, and to standard error
    made a socket (journald's, under systemd): neither is a peer's
    connection, so the write still ends the window and the crash falls
    back (the fallback line goes to a file: stderr is the socket)."""
    need(UNIT)
    env = dict(os.environ, REKINDLE_EV_MASK_SOCKET_WRITES="1")
    log = tmp_path / "stderr"
    with open(log, "w") as err:
        p = subprocess.run([str(UNIT), mode], stdout=subprocess.PIPE, stderr=err, text=True, timeout=60,
                           check=False, env=env)  # fmt: skip
    text = log.read_text()
    assert p.returncode == -signal.SIGSEGV, p.stdout + text
    assert "survived" not in p.stdout + text
    assert not ev_lines(text, "injected")
    if mode == "file-write":
        (fb,) = ev_lines(text, "fallback")
        assert fb["reason"] == "ev_window_closed" and fb["closed_by_call"] == "write", fb


PROBE_UNIT = BUILD / "errvirt" / "unit" / "ev_probe_unit"


def run_probe_unit(env):
    """ev_probe_unit with address randomization off (the gate pcs stay the
    same from run to run, as in the fault campaign): its counts, events."""
    p = subprocess.run(
        ["setarch", "x86_64", "-R", str(PROBE_UNIT)],
        capture_output=True, text=True, timeout=60, check=False, env=env,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    counts = dict(kv.split("=") for kv in p.stdout.split())
    return {k: int(v) for k, v in counts.items()}, p.stderr


def test_gate_probe_tells_a_diverting_handler_from_a_retry(tmp_path):
    """The gate trace names the two open sites (ten passes each) and the
    probe makes each fail once, on its third pass, as a recovery would:
    the diverting loop sees EACCES at i = 2 and goes on to a malloc (the
    next gate is another site), the retrying loop calls the same open again
    (same = 1); the compensation closed what each open had opened."""
    sys.path.insert(0, str(ROOT / "tools" / "errvirt"))
    from ev_gates import read_gates

    need(PROBE_UNIT)
    trace = tmp_path / "gates"
    quiet, _ = run_probe_unit(dict(os.environ, REKINDLE_EV_GATE_TRACE=str(trace)))
    assert quiet["errors"] == quiet["retries"] == 0
    opens = sorted(pc for pc, (name, n) in read_gates(trace).items() if name == "open" and n == 10)
    assert len(opens) == 2, read_gates(trace)
    verdicts = {}
    for pc in opens:
        counts, err = run_probe_unit(dict(os.environ, REKINDLE_EV_PROBE_GATE=f"{pc:#x}:3"))
        (probe,) = ev_lines(err, "probe")
        (injected,) = ev_lines(err, "injected")
        (after,) = ev_lines(err, "probe_next")
        assert int(probe["gate_pc"], 16) == pc and probe["pass"] == 3
        assert injected["gate"] == "open" and injected["errno"] == errno.EACCES
        assert counts["leaked"] == 0, err
        verdicts[pc] = (after["same"], after["gate"], counts)
    same = sorted(v[0] for v in verdicts.values())
    assert same == [0, 1], verdicts
    for flag, gate, counts in verdicts.values():
        if flag:  # the retry: no error reached the program, one more pass
            assert counts["retries"] == 1 and counts["errors"] == 0 and counts["retry_opened"] == 10
        else:  # the diverting handler ran once, on the third pass
            assert gate == "malloc"
            assert counts["errors"] == 1 and counts["first_error_at"] == 2 and counts["divert_opened"] == 9


def test_gate_probe_refuses_a_malformed_value():
    need(PROBE_UNIT)
    counts, err = run_probe_unit(dict(os.environ, REKINDLE_EV_PROBE_GATE="0x12zz"))
    (off,) = ev_lines(err, "disabled")
    assert off["reason"] == "ev_bad_probe_gate" and off["variable"] == "REKINDLE_EV_PROBE_GATE"
    assert counts["errors"] == counts["retries"] == 0


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


def test_rkv_requests_keep_their_windows_open(tmp_path):
    """The recovery surface, end to end: rkv's requests call nothing that
    the library model does not know (an unknown call closes the window, and
    a crash after it restarts instead of becoming an error).  rk_hugepages_step,
    called in rkv's loop, once closed the window of nearly every request:
    2,000 unknown closes in 2,000 requests."""
    need(RKV_EV)
    s = Rkv(tmp_path, *NO_SAVE, exe=RKV_EV, env={"REKINDLE_EV_REPORT": "1"})
    c = s.client(single_connection_client=True)
    for i in range(1000):
        c.set(f"k{i}", i)
        assert c.get(f"k{i}") == str(i).encode()
    c.close()
    stops_cleanly(s)
    (rep,) = ev_lines(s.stderr(), "report")
    assert rep["gates"] >= 2000, rep
    assert rep["closed_unknown"] < 50, [e for e in ev_lines(s.stderr(), "closer")]
    s.close()


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
