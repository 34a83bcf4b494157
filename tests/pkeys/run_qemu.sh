#!/usr/bin/env bash
# Boots pkeys_check as /init of a tiny initramfs under QEMU TCG, whose
# emulated CPU has PKU, and prints the guest console.  Exit status: 0 when the
# guest printed "PKEYS_CHECK_DONE failed=0", 1 on failures, 2 on a setup or
# boot problem, 77 when qemu or a kernel image is missing (skip).
#
#   tests/pkeys/run_qemu.sh [BUILD]          (BUILD defaults to build)
#   env: PKEYS_KERNEL=/boot/vmlinuz-...      kernel to boot (the newest in /boot)
#        PKEYS_CPU="max"                     QEMU -cpu model
#        PKEYS_TIMEOUT=120                   seconds for the whole boot
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
OUT=$BUILD/pkeys
CC=${CC:-cc}

if ! command -v qemu-system-x86_64 >/dev/null; then
	echo "SKIP: qemu-system-x86_64 not installed (tests/pkeys/deps.sh installs it)" >&2
	exit 77
fi
KERNEL=${PKEYS_KERNEL:-$(ls -1v /boot/vmlinuz-* 2>/dev/null | tail -n 1 || true)}
if [ -z "$KERNEL" ] || [ ! -r "$KERNEL" ]; then
	echo "SKIP: no readable kernel image in /boot (linux-image-amd64; tests/pkeys/deps.sh)" >&2
	exit 77
fi
for t in cpio gzip; do
	command -v "$t" >/dev/null || { echo "SKIP: $t not installed" >&2; exit 77; }
done
if [ ! -f "$BUILD/lib/librekindle.a" ]; then
	echo "ERROR: $BUILD/lib/librekindle.a missing: make BUILD=$BUILD runtime" >&2
	exit 2
fi

mkdir -p "$OUT/root"
# static: the initramfs has no libc
$CC -O2 -g -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE -pthread -Iruntime/include -static \
	tests/pkeys/pkeys_check.c -o "$OUT/root/init" "$BUILD/lib/librekindle.a" -pthread
mkdir -p "$OUT/root/proc" "$OUT/root/dev"
(cd "$OUT/root" && find . -print0 | cpio --null -o -H newc --quiet --owner=0:0) | gzip -1 >"$OUT/initrd.gz"

# TCG (not KVM): the host CPU has no PKU (or REKINDLE_PKEYS_QEMU=1 asked for
# the emulated run on one that has), TCG emulates it with -cpu max.  One host
# thread for both vCPUs (thread=single): with a thread per vCPU a guest kernel
# patching its own text was once seen panicking at boot on a stale int3
# (tests/test_power_cut.py says more).
set +e
timeout "${PKEYS_TIMEOUT:-120}" qemu-system-x86_64 -accel tcg,thread=single -cpu "${PKEYS_CPU:-max}" -smp 2 -m 512 \
	-nographic -no-reboot -monitor none -serial stdio -nic none \
	-kernel "$KERNEL" -initrd "$OUT/initrd.gz" \
	-append "console=ttyS0 quiet loglevel=1 panic=-1" </dev/null | tr -d '\r' | tee "$OUT/console.log"
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -ne 0 ]; then
	echo "ERROR: qemu exited $rc (124 = timeout)" >&2
	exit 2
fi
if grep -q '^PKEYS_CHECK_DONE failed=0' "$OUT/console.log"; then
	exit 0
elif grep -q '^PKEYS_CHECK_DONE' "$OUT/console.log"; then
	exit 1
fi
echo "ERROR: the guest did not finish (no PKEYS_CHECK_DONE line)" >&2
exit 2
