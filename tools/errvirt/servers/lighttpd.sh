#!/usr/bin/env bash
# Builds lighttpd 1.4.69 from Debian's source package (bookworm), its code
# unchanged, with the error-virtualization pass (ev: rekindle-ev-cc), with
# the fault injector and errvirt both (fi-ev: rekindle-fi-ev-cc, the fault
# campaign's build; faults go into the executable, not the modules), or, as
# the baseline, plain clang-19 with the same flags (clang).
#
#   tools/errvirt/servers/lighttpd.sh ev|fi-ev|clang
#
# Out: $BUILD/errvirt/lighttpd-KIND/inst/sbin/lighttpd and its modules in
# inst/lib (run with -m .../inst/lib).  A minimal feature set: no PCRE2,
# zlib, bzip2 or TLS, so nothing beyond the toolchain is needed.  Rebuilt
# only when the source or the compiler changed (a stamp file).
set -euo pipefail
kind=${1:-}
case "$kind" in ev | fi-ev | clang) ;; *) echo "lighttpd.sh: reason=usage: $0 ev|fi-ev|clang" >&2; exit 2 ;; esac
BUILD=${BUILD:-build}
BUILD=$(cd "$BUILD" && pwd)
PKG_VERSION=1.4.69-1
src=$(BUILD=$BUILD bash scripts/fetch-debian-source.sh lighttpd "$PKG_VERSION")
out=$BUILD/errvirt/lighttpd-$kind
case "$kind" in
ev)
	cc=$BUILD/bin/rekindle-ev-cc
	libs=("$BUILD/lib/rekindle-errvirt.so" "$BUILD/lib/librekindle-ev.a")
	;;
fi-ev)
	cc=$BUILD/bin/rekindle-fi-ev-cc
	libs=("$BUILD/lib/rekindle-errvirt.so" "$BUILD/lib/librekindle-ev.a" "$BUILD/lib/rekindle-faultinject.so" "$BUILD/lib/librekindle-fi.a")
	;;
clang) cc=clang-19 ;;
esac
if [ "$kind" = clang ]; then
	tool=$(clang-19 --version | head -1)
else
	[ -x "$cc" ] || { echo "lighttpd.sh: reason=errvirt_missing: $cc (run 'make errvirt faultinject')" >&2; exit 2; }
	tool=$(sha256sum "${libs[@]}" | sha256sum | cut -d' ' -f1)
fi
want="$(cat "$src/.fetch-debian-source.stamp") $kind $tool"
if [ -f "$out/stamp" ] && [ "$(cat "$out/stamp")" = "$want" ] && [ -x "$out/inst/sbin/lighttpd" ]; then
	exit 0
fi
rm -rf "$out"
mkdir -p "$out/obj"
# the same flags both ways: frame pointers are what the pass keeps anyway
flags="-O2 -g -fno-omit-frame-pointer"
(
	cd "$out/obj"
	"$src/configure" CC="$cc" CFLAGS="$flags" --prefix="$out/inst" --libdir="$out/inst/lib" \
		--without-pcre2 --without-zlib --without-bzip2 --without-openssl >"$out/configure.log" 2>&1 ||
		{ echo "lighttpd.sh: reason=configure_failed: see $out/configure.log" >&2; exit 1; }
	make -j"$(nproc)" >"$out/make.log" 2>&1 && make install >>"$out/make.log" 2>&1 ||
		{ echo "lighttpd.sh: reason=build_failed: see $out/make.log" >&2; exit 1; }
)
echo "$want" >"$out/stamp"
echo "lighttpd.sh: built $out/inst/sbin/lighttpd ($kind)"
