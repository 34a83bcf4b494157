#!/usr/bin/env bash
# Warm-restart latency against a bare fork+exec, for 4 MiB .. 8 GiB of
# preserved, written data; writes bench/results/restart.md.
# Usage: bash bench/run_restart.sh BUILD_DIR [SIZES_MB...]
set -euo pipefail
BUILD=${1:-build}
shift || true
SIZES=("$@")
[ "${#SIZES[@]}" -gt 0 ] || SIZES=(4 64 1024 8192)
BIN="$BUILD/bench/restart_bench"
OUT=$(mktemp -d)
mkdir -p bench/results
for round in 1 2 3; do
	for mb in "${SIZES[@]}"; do
		k=10
		[ "$mb" -ge 4096 ] && k=4
		echo "round $round: bare fork+exec (back to back, and after a read pass over ${mb} MiB);" \
			"warm ${mb} MiB x$k (as is, without the exec page pool, sync teardown, prefault)" >&2
		"$BIN" bare --restarts "$k" | sed "s/^{/{\"size_mb\":$mb,\"variant\":\"bare\",/" >>"$OUT/all.jsonl"
		"$BIN" bare --restarts "$k" --read-mb "$mb" |
			sed "s/^{/{\"size_mb\":$mb,\"variant\":\"bare_read\",/" >>"$OUT/all.jsonl"
		"$BIN" warm --size-mb "$mb" --restarts "$k" | sed 's/^{/{"variant":"warm",/' >>"$OUT/all.jsonl"
		REKINDLE_EXEC_POOL_KB=0 "$BIN" warm --size-mb "$mb" --restarts "$k" |
			sed 's/^{/{"variant":"nopool",/' >>"$OUT/all.jsonl"
		REKINDLE_SYNC_TEARDOWN=1 "$BIN" warm --size-mb "$mb" --restarts "$k" |
			sed 's/^{/{"variant":"sync",/' >>"$OUT/all.jsonl"
		"$BIN" warm --size-mb "$mb" --restarts 2 --prefault | sed 's/^{/{"variant":"prefault",/' >>"$OUT/all.jsonl"
	done
done
python3 bench/restart_table.py "$OUT/all.jsonl" "bash bench/run_restart.sh $BUILD ${SIZES[*]}" | tee bench/results/restart.md
cp "$OUT/all.jsonl" bench/results/restart.jsonl
rm -rf "$OUT"
