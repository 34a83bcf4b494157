#!/usr/bin/env bash
# Where the warm-restart time goes at large sizes (docs/results.md).  Not a
# regular benchmark: it needs the instrumented build of a scratch copy,
# made against the runtime of commit 0463b0e (it does not apply to later ones):
#   git worktree add /tmp/rk-inv 0463b0e && cd /tmp/rk-inv &&
#   git apply bench/results/restart_investigation.patch && make build/bench/restart_bench
# then, from that copy: bash bench/results/restart_investigation.sh build
# Variants: bare fork+exec; bare after reading one byte per page of N MiB
# (as warm does before each restart); warm; warm after 5 fork+execs of the
# same binary (warm caches); the same with the helper's teardown delayed 5 ms.
set -euo pipefail
B=${1:-build}/bench/restart_bench
out=bench/results/restart_investigation.jsonl
tr=bench/results/restart_investigation_trace.txt
: >"$out"
: >"$tr"
for round in 1 2 3; do
	for mb in 64 1024 8192; do
		k=8
		[ "$mb" -ge 4096 ] && k=4
		echo "round $round: $mb MiB" >&2
		"$B" bare --restarts $k | sed "s/^{/{\"size_mb\":$mb,\"variant\":\"bare\",/" >>"$out"
		RK_EXP_EVICT_MB=$mb "$B" bare --restarts $k |
			sed "s/^{/{\"size_mb\":$mb,\"variant\":\"bare_after_touch\",/" >>"$out"
		RK_EXP_TRACE=1 "$B" warm --size-mb $mb --restarts $k 2> >(grep TRACE | sed "s/^/$mb warm /" >>"$tr") |
			sed 's/^{/{"variant":"warm",/' >>"$out"
		RK_EXP_TRACE=1 RK_EXP_REWARM=5 "$B" warm --size-mb $mb --restarts $k \
			2> >(grep TRACE | sed "s/^/$mb rewarmed /" >>"$tr") | sed 's/^{/{"variant":"warm_rewarmed",/' >>"$out"
		RK_EXP_TRACE=1 RK_EXP_REWARM=5 RK_EXP_DELAY=1 "$B" warm --size-mb $mb --restarts $k \
			2> >(grep TRACE | sed "s/^/$mb rewarmed_delay /" >>"$tr") |
			sed 's/^{/{"variant":"warm_rewarmed_teardown_delayed",/' >>"$out"
	done
done
