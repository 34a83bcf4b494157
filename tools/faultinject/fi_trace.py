#!/usr/bin/env python3
"""Reads the fault injector's execution counters: the live file a traced
run keeps mapped (REKINDLE_FAULT_TRACE=<path> -> <path>.counts, intact after
a crash or SIGKILL) or the text list a normal exit writes (<path>).  Prints
"<site id> <count>" per executed site, like the text list.

    fi_trace.py TRACE_OR_COUNTS
"""

import argparse
import mmap
import struct
import sys
from pathlib import Path

MAGIC = b"RKFITRC1"
HEADER = struct.Struct("<8sQII")  # struct trace_record in runtime/rk_fi_rt.c


class TraceError(Exception):
    """A trace file that is not what the runtime writes; .reason is stable."""

    def __init__(self, reason, msg):
        super().__init__(f"reason={reason}: {msg}")
        self.reason = reason


def read_counts(path):
    """{site id: count} for executed sites, from either file format."""
    data = Path(path).read_bytes()
    if data.startswith(MAGIC):
        return _read_binary(data)
    return _read_text(data.decode(), path)


def _read_binary(data):
    page = mmap.PAGESIZE
    out = {}
    at = 0
    while at + HEADER.size <= len(data):
        magic, mhash, nsites, _ = HEADER.unpack_from(data, at)
        if magic != MAGIC:  # a record the process had not finished making
            break
        counts = struct.unpack_from(f"<{nsites}Q", data, at + HEADER.size)
        for i, c in enumerate(counts):
            if c:
                out[f"{mhash:016x}:{i}"] = c
        size = HEADER.size + 8 * nsites
        at += (size + page - 1) // page * page
    return out


def _read_text(text, path):
    out = {}
    for n, line in enumerate(text.splitlines(), 1):
        parts = line.split()
        if len(parts) != 2 or ":" not in parts[0] or not parts[1].isdigit():
            raise TraceError("bad_trace_line", f"{path}:{n}: {line!r} is not '<site id> <count>'")
        out[parts[0]] = int(parts[1])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    args = ap.parse_args()
    try:
        counts = read_counts(args.trace)
    except (OSError, TraceError) as e:
        print(f"fi_trace: {e}", file=sys.stderr)
        return 2
    for site, c in counts.items():
        print(site, c)
    return 0


if __name__ == "__main__":
    sys.exit(main())
