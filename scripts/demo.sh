#!/usr/bin/env bash
# The main demo: a 1M-entry cache crashes twice and comes back warm each time,
# then a crash inside the allocator shows the cold fallback with its reason,
# then the supervisor brings a SIGKILLed server back warm, then durable
# snapshots bring a server back after the whole stack is gone, a standby
# takes over when the primary's host dies, and error virtualization turns a
# crashing request into an error reply.
set -euo pipefail
BUILD=${1:-build}
events=$(mktemp)
trap 'rm -f "$events"' EXIT

echo "== warm restart: a cache of 1,000,000 x 100-byte values, crashing twice"
"$BUILD/examples/warm_cache" --entries 1000000 --crashes 2 2>"$events"
echo
echo "== what the runtime logged (one JSON line per event on stderr):"
grep '^{"rekindle"' "$events" | cut -c1-220
echo
echo "== cold fallback: a use-after-free corrupts the allocator's free list, the"
echo "   next allocation faults inside the runtime, so the arenas are not trusted"
REKINDLE_CRASHLOOP_MS=0 "$BUILD/apps/crashy" --objects 1000 --crash 0:in-runtime 2>"$events" |
	python3 -c '
import json, sys
for line in sys.stdin:
    s = json.loads(line)
    msg = "  incarnation %d: %s start, list %s (%d objects)" % (s["generation"], s["kind"], s["state"], s["objects"])
    print(msg + ("; decision: " + s["decision"] if s["generation"] else ""))
'
echo
echo "== under the supervisor: SIGKILL (no handler can run) and the state still comes back"
echo "   warm, from the arena fds that 'rekindle run' held"
python3 scripts/demo_supervisor.py "$BUILD"
echo
echo "== the machine dies: durable snapshots. rkv runs under 'rekindle run --snapshot-dir',"
echo "   which writes only the pages written since the last snapshot, at a consistent cut;"
echo "   and with the redo log, each write's record is on disk before its reply goes out"
python3 scripts/demo_snapshots.py "$BUILD"
echo
echo "== a host dies: failover. Two 'rekindle run --cluster' nodes and etcd on loopback;"
echo "   the standby receives every snapshot and takes over warm"
python3 scripts/demo_failover.py "$BUILD"
echo
echo "== error virtualization: rkv built with rekindle-ev-cc; a request that always crashes"
echo "   becomes an error reply, and the process and every other connection go on"
python3 scripts/demo_errvirt.py "$BUILD"
echo
echo "Benchmarks: make bench (results in docs/results.md). Tests: make test."
