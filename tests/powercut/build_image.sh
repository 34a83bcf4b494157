#!/usr/bin/env bash
# Builds the power-cut test's guest: an initramfs holding busybox, the guest
# init (tests/powercut/init), the kernel modules the guest needs (virtio
# disk and network, ext4), the supervisor and the apps, each dynamically
# linked program with the shared libraries ldd finds, at the same absolute
# paths (so rpaths and the ELF interpreter resolve as on the host).
#
#   tests/powercut/build_image.sh [BUILD]     (BUILD defaults to build)
#
# Needs tests/powercut/deps.sh to have run (kernel and busybox unpacked in
# $BUILD/powercut) and `make all` (the supervisor, build/apps/durable,
# build/examples/rkv).  Writes $BUILD/powercut/initrd.gz and prints the
# kernel to boot with it.  Exit status: 0, or 1 with the reason on stderr.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
BUILD=$(cd "$BUILD" && pwd)
OUT=$BUILD/powercut
ROOT=$OUT/root

die() {
	echo "powercut image: ERROR: $*" >&2
	exit 1
}

kernel=$(compgen -G "$OUT/kernel/boot/vmlinuz-*" | head -n 1) || true
[ -n "$kernel" ] || die "no kernel in $OUT/kernel: run tests/powercut/deps.sh $BUILD"
kver=${kernel##*/vmlinuz-}
mods=$OUT/kernel/lib/modules/$kver
[ -d "$mods" ] || die "no modules for $kver in $OUT/kernel"
[ -x "$OUT/busybox/bin/busybox" ] || die "no busybox in $OUT/busybox: run tests/powercut/deps.sh $BUILD"
# without it every module's dependencies would be left out unnoticed (the
# guest's insmod of ext4 then fails on unknown symbols)
modinfo=$(command -v modinfo || echo /sbin/modinfo)
[ -x "$modinfo" ] || die "no modinfo (Debian's kmod): run tests/powercut/deps.sh $BUILD"
programs=("$BUILD/bin/rekindle" "$BUILD/apps/durable")
[ -x "$BUILD/examples/rkv" ] && programs+=("$BUILD/examples/rkv")
for p in "${programs[@]}"; do
	[ -x "$p" ] || die "$p missing: make BUILD=$BUILD all"
done

rm -rf "$ROOT"
mkdir -p "$ROOT"/{bin,dev,proc,sys,tmp,run,mnt,modules,opt/rk/bin}
install -m 0755 "$OUT/busybox/bin/busybox" "$ROOT/bin/busybox"
install -m 0755 tests/powercut/init "$ROOT/init"

# Modules: the ones asked for and what they depend on (modinfo's "depends"),
# dependencies first; decompressed here, so busybox's insmod needs no xz.
# crc32c_generic: ext4 and jbd2 ask the crypto API for "crc32c" by name,
# which would need a modprobe.
order=()
declare -A seen=()
add_module() {
	local name=${1//-/_} file dep deps
	[ -z "${seen[$name]:-}" ] || return 0
	seen[$name]=1
	if grep -qE "/${name//_/[-_]}\.ko$" "$mods/modules.builtin"; then
		return 0
	fi
	file=$(find "$mods/kernel" -regextype egrep -regex ".*/${name//_/[-_]}\.ko(\.xz|\.zst|\.gz)?" | head -n 1)
	[ -n "$file" ] || die "module $name not found under $mods"
	deps=$("$modinfo" -F depends "$file") || die "modinfo $file failed"
	for dep in ${deps//,/ }; do
		add_module "$dep"
	done
	case $file in
	*.xz) xz -dc "$file" >"$ROOT/modules/$name.ko" ;;
	*.zst) zstd -qdc "$file" >"$ROOT/modules/$name.ko" ;;
	*.gz) gzip -dc "$file" >"$ROOT/modules/$name.ko" ;;
	*) cp "$file" "$ROOT/modules/$name.ko" ;;
	esac
	order+=("$name")
}
for m in crc32c_generic virtio_blk ext4 virtio_net; do
	add_module "$m"
done
printf '%s\n' "${order[@]}" >"$ROOT/modules/order"

# Programs, stripped, in /opt/rk/bin; their libraries where ldd finds them.
for p in "${programs[@]}"; do
	strip -o "$ROOT/opt/rk/bin/${p##*/}" "$p"
	for lib in $(ldd "$p" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }'); do
		mkdir -p "$ROOT$(dirname "$lib")"
		[ -e "$ROOT$lib" ] || cp -L "$lib" "$ROOT$lib"
	done
done

(cd "$ROOT" && find . -print0 | cpio --null -o -H newc --quiet --owner=0:0) | gzip -1 >"$OUT/initrd.gz.tmp"
mv "$OUT/initrd.gz.tmp" "$OUT/initrd.gz"
echo "$kernel"
