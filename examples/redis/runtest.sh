#!/usr/bin/env bash
# Runs Redis's own test suite (./runtest, tcl 8.6) against a tree that
# examples/redis/build.sh built: stock or rekindle (the port).
#   examples/redis/runtest.sh stock|rekindle [--subset] [runtest options...]
# Leaves out what examples/redis/excluded.txt lists for that tree, with its
# reason.  --subset runs the units of SUBSET_UNITS only (the part of the
# suite `make test` runs).  The log goes to $BUILD/redis/results/.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
BUILD=$(cd "$BUILD" && pwd)
kind=${1:-}
case "$kind" in stock | rekindle) ;; *) echo "runtest.sh: usage: $0 stock|rekindle [--subset] [runtest options]" >&2; exit 2 ;; esac
shift
tree=$BUILD/redis/$kind
[ -x "$tree/src/redis-server" ] || { echo "runtest.sh: no $tree/src/redis-server (run examples/redis/build.sh $kind)" >&2; exit 1; }
command -v tclsh8.6 >/dev/null || { echo "runtest.sh: tclsh8.6 missing (scripts/deps.sh installs tcl8.6)" >&2; exit 1; }

# Units small enough for `make test` that cover every data type, expiry,
# keyspace commands and MULTI/EXEC.
SUBSET_UNITS=(unit/type/string unit/type/incr unit/type/list unit/type/hash unit/type/set unit/type/zset
	unit/type/stream unit/expire unit/keyspace unit/multi)

args=(--clients "${REDIS_TEST_CLIENTS:-2}")
if [ "${1:-}" = --subset ]; then
	shift
	for u in "${SUBSET_UNITS[@]}"; do args+=(--single "$u"); done
fi
while IFS='|' read -r spec _reason; do
	read -r tr what name <<<"$spec"
	[ -n "${tr:-}" ] || continue
	case "$tr" in '#'*) continue ;; both) ;; "$kind") ;; *) continue ;; esac
	name=$(sed 's/[[:space:]]*$//' <<<"$name")
	case "$what" in
	unit) args+=(--skipunit "$name") ;;
	test) args+=(--skiptest "$name") ;;
	*) echo "runtest.sh: excluded.txt: unknown kind '$what'" >&2; exit 1 ;;
	esac
done <examples/redis/excluded.txt

# The suite finds a server's BGSAVE or AOF-rewrite child as its first child
# (get_child_pid 0: pgrep -P) and kills it; the runtime's standing teardown
# helper (runtime/src/teardown.c, a CLONE_VM child for the whole incarnation)
# would be that first child.  The suite's servers run without it: restarts
# are as correct, only the old address space is torn down on the restart path.
if [ "$kind" = rekindle ]; then export REKINDLE_SYNC_TEARDOWN=1; fi

mkdir -p "$BUILD/redis/results"
log=$BUILD/redis/results/$kind-runtest.log
echo "runtest.sh: $tree: ./runtest ${args[*]} $* (log: $log)" >&2
cd "$tree"
set +e
./runtest "${args[@]}" "$@" 2>&1 | sed -u 's/\x1b\[[0-9;]*m//g' | tee "$log" | grep -E '^\[(err|exception|ok)\]|All tests passed|tests failed' | grep -v '^\[ok\]'
rc=${PIPESTATUS[0]}
set -e
echo "runtest.sh: $kind: $(grep -c '^\[ok\]' "$log") ok, $(grep -c '^\[err\]' "$log") err, $(grep -c '^\[exception\]' "$log") exception, $(grep -c '^\[skip\]' "$log") skipped; exit $rc" >&2
exit "$rc"
