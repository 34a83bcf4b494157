#!/usr/bin/env bash
# The fault campaign's instrumented servers, in $FAULTS (default
# build/faults), each built with rekindle-fi-cc and linked with
# bench/faults/fi_shim.c (uninstrumented) and the wraps it needs:
#   rkv-fi                       rkv (examples/rkv), the flags of `make rkv-fi`
#   redis/rekindle/src/redis-server   the Redis port, by examples/redis/build.sh
# Usage: bench/faults/build.sh [rkv|redis|all]   (default all)
# examples/redis/build.sh takes the compiler from the environment (CC) and
# extra link flags through dpkg-buildflags (DEB_LDFLAGS_APPEND); it is not
# edited.  The Redis source cache (debsrc, apt, redis-7.0.15) is copied from
# $BUILD when $FAULTS has none, so nothing is fetched again.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=${BUILD:-build}
FAULTS=${FAULTS:-$BUILD/faults}
what=${1:-all}
case "$what" in rkv | redis | all) ;; *) echo "build.sh: usage: $0 [rkv|redis|all]" >&2; exit 2 ;; esac
mkdir -p "$FAULTS"
BUILD=$(cd "$BUILD" && pwd)
FAULTS=$(cd "$FAULTS" && pwd)
FI_CC=$BUILD/bin/rekindle-fi-cc
WRAPS=-Wl,--wrap=rk_init,--wrap=rk_unsafe_begin,--wrap=rk_unsafe_end

make -s BUILD="$BUILD" runtime faultinject >/dev/null
[ -x "$FI_CC" ] || { echo "build.sh: $FI_CC missing" >&2; exit 1; }
shim=$FAULTS/fi_shim.o
if [ ! -f "$shim" ] || [ bench/faults/fi_shim.c -nt "$shim" ]; then
	clang-19 -O2 -g -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE -Iruntime/include -c bench/faults/fi_shim.c -o "$shim"
fi

if [ "$what" != redis ]; then
	out=$FAULTS/rkv-fi
	srcs=(examples/rkv/*.c)
	if [ ! -x "$out" ] || [ -n "$(find examples/rkv "$shim" "$BUILD/lib/librekindle.a" "$FI_CC" -newer "$out" -print -quit)" ]; then
		rm -rf "$out.fisites.d"
		# relative sources from the repository root, as `make rkv-fi`: the same site ids
		"$FI_CC" -O2 -g -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE -pthread -Iruntime/include \
			"${srcs[@]}" "$shim" -o "$out" "$WRAPS" "$BUILD/lib/librekindle.a" -pthread -lm
	fi
	echo "build.sh: $out" >&2
fi

if [ "$what" != rkv ]; then
	for d in debsrc apt redis-7.0.15; do
		if [ ! -e "$FAULTS/$d" ] && [ -e "$BUILD/$d" ]; then cp -a "$BUILD/$d" "$FAULTS/$d"; fi
	done
	# examples/redis/build.sh builds the runtime in $FAULTS with `make
	# runtime`: built here first with the usual compiler, it is up to date
	# there and not rebuilt with CC below.
	make -s BUILD="$FAULTS" runtime >/dev/null
	BUILD="$FAULTS" CC="$FI_CC" DEB_LDFLAGS_APPEND="$WRAPS $shim" bash examples/redis/build.sh rekindle
	echo "build.sh: $FAULTS/redis/rekindle/src/redis-server" >&2
fi
