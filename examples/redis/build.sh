#!/usr/bin/env bash
# Builds Redis from Debian's source package, two ways, each in a tree of its
# own under $BUILD/redis/:
#   stock     the unpacked source as Debian ships it (its patches applied)
#   rekindle  the same, plus examples/redis/patches (series order), linked
#             with librekindle
#   stock-bugs, rekindle-bugs
#             stock and the port with the real bugs of examples/redis/bugs
#             (R1, R3, R4: tests/test_redis_bugs.py) applied on top
#   examples/redis/build.sh stock|rekindle|stock-bugs|rekindle-bugs
# The tree is a fresh copy of $BUILD/redis-$VERSION whenever the source or
# (for rekindle) a patch changed, then `make` builds it in place (so Redis's
# ./runtest runs against it).  The build follows debian/rules: Debian's
# compiler flags (dpkg-buildflags, hardening=+all), the system's jemalloc,
# TLS and systemd support.  The port adds -no-pie: arena objects hold
# pointers into the image (a dict's type), which must stay valid when the
# process is started again.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
mkdir -p "$BUILD"
BUILD=$(cd "$BUILD" && pwd)
PKG_VERSION=${REDIS_DEB_VERSION:-5:7.0.15-1~deb12u10}
kind=${1:-}
case "$kind" in stock | rekindle | stock-bugs | rekindle-bugs) ;; *) echo "build.sh: usage: $0 stock|rekindle|stock-bugs|rekindle-bugs" >&2; exit 2 ;; esac
port=no
case "$kind" in rekindle*) port=yes ;; esac
bugs=no
case "$kind" in *-bugs) bugs=yes ;; esac

src=$(BUILD=$BUILD bash scripts/fetch-debian-source.sh redis "$PKG_VERSION")
tree=$BUILD/redis/$kind
patches=examples/redis/patches
bugdir=examples/redis/bugs

# What the tree is made of: the unpacked source's stamp and, for the port,
# every patch in the series.
want=$(cat "$src/.fetch-debian-source.stamp")
if [ "$port" = yes ]; then
	[ -f "$patches/series" ] || { echo "build.sh: no $patches/series" >&2; exit 1; }
	want="$want $(cd "$patches" && sha256sum series $(grep -v '^#' series) | sha256sum | cut -d' ' -f1)"
fi
if [ "$bugs" = yes ]; then
	want="$want bugs $(cd "$bugdir" && sha256sum series $(grep -v '^#' series) | sha256sum | cut -d' ' -f1)"
fi
if [ ! -f "$tree/.tree-stamp" ] || [ "$(cat "$tree/.tree-stamp")" != "$want" ]; then
	echo "build.sh: new $kind tree in $tree" >&2
	rm -rf "$tree" "$tree.tmp"
	mkdir -p "$(dirname "$tree")"
	cp -a "$src" "$tree.tmp"
	apply_series() { # DIR: apply DIR/series in order
		while read -r p; do
			case "$p" in '' | '#'*) continue ;; esac
			patch -p1 -s -N --no-backup-if-mismatch -d "$tree.tmp" <"$1/$p" || { echo "build.sh: patch $p does not apply" >&2; exit 1; }
		done <"$1/series"
	}
	if [ "$port" = yes ]; then apply_series "$patches"; fi
	if [ "$bugs" = yes ]; then apply_series "$bugdir"; fi
	echo "$want" >"$tree.tmp/.tree-stamp"
	mv "$tree.tmp" "$tree"
fi

# Debian's flags, as debian/rules sets them.
eval "$(DEB_BUILD_MAINT_OPTIONS=hardening=+all \
	DEB_CFLAGS_MAINT_APPEND=-I/usr/include/liblzf \
	DEB_LDFLAGS_MAINT_APPEND='-Wl,-no-as-needed -ldl -latomic -llzf' \
	dpkg-buildflags --export=sh)"
args=(V=1 USE_SYSTEM_JEMALLOC=yes USE_SYSTEMD=yes USE_JEMALLOC=yes BUILD_TLS=yes)
if [ "$port" = yes ]; then
	make -s -C . runtime BUILD="$BUILD" >/dev/null
	args+=(REKINDLE_LIB="$BUILD/lib/librekindle.a" REKINDLE_INCLUDE="$PWD/runtime/include")
fi
jobs=$(nproc)
GIT_CEILING_DIRECTORIES=$BUILD make -C "$tree" -j"$jobs" "${args[@]}" >"$BUILD/redis/$kind.build.log" 2>&1 ||
	{ tail -30 "$BUILD/redis/$kind.build.log" >&2; echo "build.sh: $kind build failed; see $BUILD/redis/$kind.build.log" >&2; exit 1; }
echo "build.sh: $tree/src/redis-server" >&2
