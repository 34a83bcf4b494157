"""The fault campaign's FIRestarter sample (tools/errvirt/fault_campaign.py
--sample noncritical; docs/errvirt.md, "Non-critical transactions"), on rkv
built with the pass: the gate trace finds the transactions a workload
executes, the probe classes them by what rkv's error handlers do, and a
fault's errvirt run places it in its transaction."""

import sys

import pytest

from conftest import BUILD, ROOT

sys.path.insert(0, str(ROOT / "tools" / "errvirt"))
import fault_campaign as fc  # noqa: E402

RKV_EV = BUILD / "examples" / "rkv-ev"


@pytest.fixture
def target(monkeypatch):
    if not RKV_EV.exists():
        pytest.fail(f"{RKV_EV} missing: run `make build/examples/rkv-ev` first")
    # as the campaign runs servers: without address randomization
    monkeypatch.setattr(fc.hs, "ARGV_PREFIX", ["setarch", "x86_64", "-R"])
    return fc.RkvTarget(RKV_EV, 400)


def test_the_probe_classes_rkvs_event_loop_critical_and_a_read_not(target, tmp_path):
    gates, names = fc.gate_profile(target, tmp_path, seed=1)
    by_call = {}
    for pc, (call, _load, work) in gates.items():
        assert work > 0
        by_call.setdefault(call, []).append(pc)
    assert {"epoll_pwait2", "read"} <= set(by_call), gates
    (loop,) = by_call["epoll_pwait2"]
    assert "main" in names[loop]
    # epoll_pwait2's error: rkv's loop waits again (a retry); a read's error:
    # the connection is dropped and rkv goes on serving the others
    assert fc.classify_gate(target, tmp_path, 1, loop, *gates[loop][1:]) == "critical: retries"
    reads = [fc.classify_gate(target, tmp_path, 1, pc, *gates[pc][1:]) for pc in by_call["read"]]
    assert "non-critical" in reads, reads


def test_a_fault_is_placed_in_its_transaction():
    recovered = {"ev": [{"rekindle_ev": "recovered", "gate_pc": "0x5555"}]}
    after_write = {
        "ev": [
            {
                "rekindle_ev": "fallback",
                "closed_by": "ev_irrecoverable_call",
                "closed_by_call": "write",
                "closed_at_pc": "0x77",
                "gate_pc": "0x5555",
            }
        ]
    }
    in_gate = {"ev": [{"rekindle_ev": "fallback", "closed_by": "ev_in_gate_call", "gate_pc": "0x66"}]}
    assert fc.transaction_of(recovered, "s") == ("gate", 0x5555)
    assert fc.transaction_of(after_write, "s") == ("after", "write", 0x77)
    assert fc.transaction_of(in_gate, "s") == ("gate", 0x66)
    assert fc.transaction_of({"ev": []}, "s") == ("unplaced", "s")
    classes = {0x5555: "critical: retries", 0x66: "non-critical"}
    # a critical transaction is left out; one after an output call, one the
    # probe never classed and a fault with no event stay in (against us)
    assert not fc.in_sample(("gate", 0x5555), classes)
    assert fc.in_sample(("gate", 0x66), classes)
    assert fc.in_sample(("gate", 0x99), classes)
    assert fc.in_sample(("after", "write", 0x77), classes)
    assert fc.in_sample(("unplaced", "s"), classes)


def test_the_gate_trace_reader_refuses_other_files(tmp_path):
    from ev_gates import GateTraceError, read_gates

    bad = tmp_path / "bad"
    bad.write_bytes(b"RKFITRC1" + bytes(64))
    with pytest.raises(GateTraceError) as e:
        read_gates(bad)
    assert e.value.reason == "not_a_gate_trace"
    short = tmp_path / "short"
    short.write_bytes(b"RKEVGAT1" + (4096).to_bytes(8, "little") + bytes(24))
    with pytest.raises(GateTraceError) as e:
        read_gates(short)
    assert e.value.reason == "short_gate_trace"
