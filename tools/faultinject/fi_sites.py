#!/usr/bin/env python3
"""Lists the fault sites built into a program (section rekindle_fi_sites,
which every instrumented object carries), as a JSON array; with --trace,
only the sites a traced run executed, each with its count ("in the code a
workload executes", where a campaign picks its faults).

    fi_sites.py PROGRAM [--trace TRACE_OR_COUNTS] [--type TYPE]
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fi_trace import TraceError, read_counts  # noqa: E402

TYPES = (
    "comparison-inversion",
    "missing-assignment",
    "wrong-operand",
    "missing-if",
    "uninitialized-variable",
    "wrong-result-stored",
    "missing-call",
)


class SitesError(Exception):
    def __init__(self, reason, msg):
        super().__init__(f"reason={reason}: {msg}")
        self.reason = reason


def read_sites(program):
    """Every site in PROGRAM, in link order."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "sites"
        p = subprocess.run(
            ["objcopy", "-O", "binary", "--only-section=rekindle_fi_sites", str(program), str(out)],
            capture_output=True,
            text=True,
            check=False,
        )
        if p.returncode != 0:
            raise SitesError("objcopy_failed", f"{program}: {p.stderr.strip()}")
        text = out.read_text() if out.exists() else ""
    if not text:
        raise SitesError("not_instrumented", f"{program} has no rekindle_fi_sites section")
    return [json.loads(line) for line in text.splitlines() if line]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("program")
    ap.add_argument("--trace", help="keep only the sites this trace saw executed")
    ap.add_argument("--type", choices=TYPES, help="keep only sites of this fault type")
    args = ap.parse_args()
    try:
        sites = read_sites(args.program)
        if args.trace:
            counts = read_counts(args.trace)
            sites = [dict(s, count=counts[s["id"]]) for s in sites if s["id"] in counts]
    except (OSError, SitesError, TraceError) as e:
        print(f"fi_sites: {e}", file=sys.stderr)
        return 2
    if args.type:
        sites = [s for s in sites if s["type"] == args.type]
    json.dump(sites, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
