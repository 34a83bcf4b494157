#!/usr/bin/env python3
"""Reads errvirt's gate trace: the file a run with REKINDLE_EV_GATE_TRACE=PATH
keeps mapped (runtime/ev_probe.c; the layout is struct ev_gate_trace_header
and struct ev_gate_slot in runtime/ev_internal.h).  Prints
"<gate pc> <call> <count>" per gate call site passed, most passed first.

    ev_gates.py TRACE
"""

import argparse
import re
import struct
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
MAGIC = b"RKEVGAT1"
HEADER = struct.Struct("<8sQ")  # struct ev_gate_trace_header
SLOT = struct.Struct("<QQQ")  # struct ev_gate_slot: pc, fn, count


class GateTraceError(Exception):
    """A file that is not a gate trace; .reason is stable."""

    def __init__(self, reason, msg):
        super().__init__(f"reason={reason}: {msg}")
        self.reason = reason


def model_names():
    """The library model's call names by index (include/libmodel.def)."""
    text = (HERE / "include" / "libmodel.def").read_text()
    return re.findall(r"^EV_FN\((\w+),", text, re.M)


def read_gates(path):
    """{pc: (call name, count)} for every gate site passed."""
    data = Path(path).read_bytes()
    if len(data) < HEADER.size or not data.startswith(MAGIC):
        raise GateTraceError("not_a_gate_trace", f"{path} does not start with {MAGIC.decode()}")
    _, slots = HEADER.unpack_from(data)
    if len(data) < HEADER.size + slots * SLOT.size:
        raise GateTraceError("short_gate_trace", f"{path}: {len(data)} bytes for {slots} slots")
    names = model_names()
    out = {}
    for i in range(slots):
        pc, fn, count = SLOT.unpack_from(data, HEADER.size + i * SLOT.size)
        if pc:
            out[pc] = (names[fn] if fn < len(names) else f"fn{fn}", count)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    args = ap.parse_args()
    try:
        gates = read_gates(args.trace)
    except (OSError, GateTraceError) as e:
        print(f"ev_gates: {e}", file=sys.stderr)
        return 2
    for pc, (name, count) in sorted(gates.items(), key=lambda kv: -kv[1][1]):
        print(f"{pc:#x} {name} {count}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
