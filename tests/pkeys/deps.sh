#!/usr/bin/env bash
# Installs what the pkeys tests need, only where missing.  Where the host
# CPU has PKU and the kernel turned it on (pku and ospke in /proc/cpuinfo),
# the checks run natively and need nothing more than the build.  Where it
# has not (or REKINDLE_PKEYS_QEMU=1 asks for the emulated run anyway): QEMU
# (TCG emulates PKU), a Debian kernel image to boot (the file only: the host
# is never booted from it), cpio for the initramfs, and the static libc.
# strace and gzip everywhere (bench/run_unsafe.py counts syscalls).
# Idempotent.
set -euo pipefail

need_apt=()
have() { command -v "$1" >/dev/null 2>&1; }
host_pku() { grep -qw pku /proc/cpuinfo 2>/dev/null && grep -qw ospke /proc/cpuinfo 2>/dev/null; }
have gzip || need_apt+=(gzip)
have strace || need_apt+=(strace)
if ! host_pku || [ "${REKINDLE_PKEYS_QEMU:-0}" != 0 ]; then
	have qemu-system-x86_64 || need_apt+=(qemu-system-x86)
	have cpio || need_apt+=(cpio)
	compgen -G '/boot/vmlinuz-*' >/dev/null || need_apt+=(linux-image-amd64)
	# gcc -static needs libc.a (libc6-dev ships it on Debian)
	[ -e "$(cc -print-file-name=libc.a 2>/dev/null)" ] && [ "$(cc -print-file-name=libc.a)" != libc.a ] ||
		need_apt+=(libc6-dev)
fi
if [ "${#need_apt[@]}" -gt 0 ]; then
	echo "pkeys deps: installing ${need_apt[*]} (apt)" >&2
	if [ "$(id -u)" -ne 0 ]; then
		echo "pkeys deps: need root to apt-get install ${need_apt[*]}" >&2
		exit 1
	fi
	apt-get update -qq
	# the kernel package's postinst hooks (initramfs-tools, bootloader) are
	# not wanted here: only the vmlinuz file is used
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi
