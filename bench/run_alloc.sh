#!/usr/bin/env bash
# The arena allocator against glibc malloc on the same multithreaded
# workloads (bench/alloc_bench.c); writes bench/results/alloc.md and
# bench/results/alloc.jsonl.  The backends run interleaved, round after
# round, so drift on a noisy machine hits both alike; the table gives medians.
# Usage: bash bench/run_alloc.sh BUILD_DIR [ROUNDS] [OPS]
set -euo pipefail
BUILD=${1:-build}
ROUNDS=${2:-5}
OPS=${3:-4000000}
BIN="$BUILD/bench/alloc_bench"
SEED=1
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
mkdir -p bench/results
# workload:threads; xfer needs producer/consumer pairs, so no 1-thread run
CONFIGS=(mix:1 mix:2 mix:4 xfer:2 xfer:4)
for round in $(seq 1 "$ROUNDS"); do
	for c in "${CONFIGS[@]}"; do
		w=${c%%:*}
		t=${c##*:}
		# alternate which backend goes first, so neither always runs second
		order=(rk glibc)
		[ $((round % 2)) -eq 0 ] && order=(glibc rk)
		for b in "${order[@]}"; do
			echo "round $round: $w threads=$t backend=$b" >&2
			"$BIN" --backend "$b" --workload "$w" --threads "$t" --ops "$OPS" --seed "$SEED" |
				sed "s/^{/{\"round\":$round,/" >>"$OUT/all.jsonl"
		done
	done
done
python3 bench/alloc_table.py "$OUT/all.jsonl" "bash bench/run_alloc.sh $BUILD $ROUNDS $OPS" |
	tee bench/results/alloc.md
cp "$OUT/all.jsonl" bench/results/alloc.jsonl
