#!/usr/bin/env bash
# DAMON on/off experiment: bare and warm restarts interleaved, per state.
set -u
B=/work/main/build/bench/restart_bench
S=/sys/kernel/mm/damon/admin/kdamonds/0/state
OUT=/tmp/damon/all.jsonl; : > $OUT
for round in 1 2 3; do
  for st in on off; do
    echo $st > $S; sleep 1
    for mb in 1024 8192; do
      k=10; [ $mb -ge 4096 ] && k=5
      $B bare --restarts $k | sed "s/^{/{\"damon\":\"$st\",\"size_mb\":$mb,/" >> $OUT
      $B warm --size-mb $mb --restarts $k | sed "s/^{/{\"damon\":\"$st\",/" >> $OUT
    done
  done
done
echo on > $S
