#!/usr/bin/env bash
# Builds nginx 1.22.1 from Debian's source package (bookworm), its code
# unchanged, with the error-virtualization pass (ev: rekindle-ev-cc), with
# the fault injector and errvirt both (fi-ev: rekindle-fi-ev-cc, the fault
# campaign's build), or, as the baseline, plain clang-19 with the same flags
# (clang).
#
#   tools/errvirt/servers/nginx.sh ev|fi-ev|clang
#
# Out: $BUILD/errvirt/nginx-KIND/inst/sbin/nginx.  nginx configures and
# builds inside its source tree, so each kind builds in its own copy of the
# unpacked source ($BUILD/errvirt/nginx-KIND/src); the unpacked tree itself
# stays as dpkg-source left it.  A minimal feature set: no rewrite module
# (PCRE), no gzip (zlib), no TLS, so nothing beyond the toolchain is needed.
# Rebuilt only when the source or the compiler changed (a stamp file).
set -euo pipefail
kind=${1:-}
case "$kind" in ev | fi-ev | clang) ;; *) echo "nginx.sh: reason=usage: $0 ev|fi-ev|clang" >&2; exit 2 ;; esac
BUILD=${BUILD:-build}
BUILD=$(cd "$BUILD" && pwd)
# deb12u9: the newest bookworm version the main archive serves (the
# security archive's index lists deb12u11, whose files its pool lacks).
PKG_VERSION=${NGINX_DEB_VERSION:-1.22.1-9+deb12u9}
src=$(BUILD=$BUILD bash scripts/fetch-debian-source.sh nginx "$PKG_VERSION")
out=$BUILD/errvirt/nginx-$kind
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
	[ -x "$cc" ] || { echo "nginx.sh: reason=errvirt_missing: $cc (run 'make errvirt faultinject')" >&2; exit 2; }
	tool=$(sha256sum "${libs[@]}" | sha256sum | cut -d' ' -f1)
fi
want="$(cat "$src/.fetch-debian-source.stamp") $kind $tool"
if [ -f "$out/stamp" ] && [ "$(cat "$out/stamp")" = "$want" ] && [ -x "$out/inst/sbin/nginx" ]; then
	exit 0
fi
rm -rf "$out"
mkdir -p "$out"
cp -a "$src" "$out/src"
# The same flags every way: frame pointers are what the pass keeps anyway.
# nginx's configure adds -Werror for clang; clang 19 warns where the gcc
# Debian builds with does not, so warnings stay warnings (no code change).
flags="-O2 -g -fno-omit-frame-pointer -Wno-error"
(
	cd "$out/src"
	./configure --with-cc="$cc" --with-cc-opt="$flags" --prefix="$out/inst" \
		--without-http_rewrite_module --without-http_gzip_module --without-pcre \
		>"$out/configure.log" 2>&1 ||
		{ echo "nginx.sh: reason=configure_failed: see $out/configure.log" >&2; exit 1; }
	make -j"$(nproc)" >"$out/make.log" 2>&1 && make install >>"$out/make.log" 2>&1 ||
		{ echo "nginx.sh: reason=build_failed: see $out/make.log" >&2; exit 1; }
)
echo "$want" >"$out/stamp"
echo "nginx.sh: built $out/inst/sbin/nginx ($kind)"
