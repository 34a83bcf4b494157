#!/usr/bin/env bash
# What the power-cut test (tests/test_power_cut.py) needs, fetched only where
# missing.  Idempotent.
#
#   tests/powercut/deps.sh [BUILD]          (BUILD defaults to build)
#
# On the host (apt-get install, as root, only what is missing): QEMU, cpio,
# gzip, xz, mkfs.ext4, modinfo.  For the guest, without installing anything on the
# host: a Debian kernel new enough for durable snapshots (userfaultfd's
# async write-protect and PAGEMAP_SCAN need Linux 6.7; bookworm's own 6.1
# has neither, so the newest linux-image-6.12.*+deb12-amd64-unsigned, from
# bookworm-security or bookworm-backports) and busybox-static (the guest's
# shell).  Both are `apt-get download`ed into $BUILD/powercut/debs and
# unpacked with dpkg-deb -x into $BUILD/powercut/kernel and
# $BUILD/powercut/busybox; a second run finds them there and fetches
# nothing.  When the configured apt sources have no such kernel, a private
# sources list (bookworm-security and bookworm-backports, lists kept in
# $BUILD/powercut/apt, as scripts/fetch-debian-source.sh does for sources)
# is used; the system's apt configuration is never changed.
#
# Exit status: 0 ready, 77 something cannot be had (the test skips, with the
# reason on stderr), 1 any other failure.
# Environment: DEB_MIRROR, DEB_SECURITY_MIRROR (archive URLs of the private
# list), DEB_SUITE (default bookworm), POWERCUT_PRIVATE_APT=1 (use the
# private list even when the configured sources have a kernel).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
mkdir -p "$BUILD/powercut"
OUT=$(cd "$BUILD/powercut" && pwd)

skip() {
	echo "powercut deps: SKIP: $*" >&2
	exit 77
}
die() {
	echo "powercut deps: ERROR: $*" >&2
	exit 1
}
have() { command -v "$1" >/dev/null 2>&1; }

# --- host tools ---
need_apt=()
have qemu-system-x86_64 || need_apt+=(qemu-system-x86)
have cpio || need_apt+=(cpio)
have gzip || need_apt+=(gzip)
have xz || need_apt+=(xz-utils)
have mkfs.ext4 || [ -x /sbin/mkfs.ext4 ] || need_apt+=(e2fsprogs)
# modinfo: the guest's modules are put in with their dependencies
have modinfo || [ -x /sbin/modinfo ] || need_apt+=(kmod)
if [ "${#need_apt[@]}" -gt 0 ]; then
	if [ "$(id -u)" -ne 0 ] || ! have apt-get; then
		skip "missing ${need_apt[*]} and cannot apt-get install them (not root, or no apt)"
	fi
	echo "powercut deps: installing ${need_apt[*]} (apt)" >&2
	apt-get update -qq || true
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null ||
		skip "apt-get install ${need_apt[*]} failed"
fi
have qemu-system-x86_64 || skip "qemu-system-x86_64 not installed"

# --- the guest's kernel and busybox, downloaded, never installed ---
kernel_ready() { compgen -G "$OUT/kernel/boot/vmlinuz-*" >/dev/null && [ -f "$OUT/kernel/.unpacked" ]; }
busybox_ready() { [ -x "$OUT/busybox/bin/busybox" ] && [ -f "$OUT/busybox/.unpacked" ]; }
if kernel_ready && busybox_ready; then
	exit 0
fi
for t in apt-get apt-cache dpkg-deb; do
	have "$t" || skip "$t not found: the guest kernel comes from Debian's archive"
done

mkdir -p "$OUT/debs" "$OUT/apt/lists/partial" "$OUT/apt/cache/archives/partial"
suite=${DEB_SUITE:-bookworm}
mirror=${DEB_MIRROR:-http://deb.debian.org/debian}
security=${DEB_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
cat >"$OUT/apt/sources.list" <<EOF
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $suite main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $suite-backports main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $security $suite-security main
EOF
private=(
	-o "Dir::Etc::sourcelist=$OUT/apt/sources.list"
	-o "Dir::Etc::sourceparts=-"
	-o "Dir::State::Lists=$OUT/apt/lists"
	-o "Dir::Cache=$OUT/apt/cache"
	-o "Acquire::Languages=none"
)
# apt downloads as the unprivileged _apt user, which may not reach the build
# tree; this tree is ours, so download as ourselves.
sandbox=(-o "APT::Sandbox::User=$(id -un)")

# The newest 6.7+ generic amd64 kernel that the given apt options can
# download (a name may be known with no version left to fetch).
kernel_re='^linux-image-(6\.([7-9]|[1-9][0-9])|[7-9]\.[0-9]+)\.[0-9]+\+deb[0-9]+-amd64-unsigned$'
newest_kernel() {
	local name
	for name in $(apt-cache "$@" search --names-only "$kernel_re" 2>/dev/null | awk '{ print $1 }' | sort -rV); do
		if apt-cache "$@" policy "$name" 2>/dev/null | awk '/Candidate:/ && $2 != "(none)" { ok = 1 } END { exit !ok }'; then
			echo "$name"
			return
		fi
	done
}

download() { # download PKG [apt options]: the .deb into $OUT/debs, its path on stdout
	local pkg=$1
	shift
	rm -f "$OUT/debs/${pkg}_"*.deb
	(cd "$OUT/debs" && apt-get "$@" "${sandbox[@]}" -qq download "$pkg") >"$OUT/debs/download.log" 2>&1 ||
		return 1
	compgen -G "$OUT/debs/${pkg}_*.deb" | head -n 1
}

opts=()
pkg=
[ "${POWERCUT_PRIVATE_APT:-0}" != 0 ] || pkg=$(newest_kernel)
if [ -z "$pkg" ]; then
	echo "powercut deps: no 6.7+ kernel in the configured apt sources (or POWERCUT_PRIVATE_APT): private list in $OUT/apt" >&2
	apt-get "${private[@]}" "${sandbox[@]}" -qq update >"$OUT/apt/update.log" 2>&1 ||
		skip "apt-get update of the private list failed (no network?): see $OUT/apt/update.log"
	opts=("${private[@]}")
	pkg=$(newest_kernel "${opts[@]}")
	[ -n "$pkg" ] || skip "no linux-image-6.7+ amd64 package in $suite, $suite-security or $suite-backports"
fi

if ! kernel_ready; then
	echo "powercut deps: downloading $pkg into $OUT/debs" >&2
	deb=$(download "$pkg" "${opts[@]}") || skip "apt-get download $pkg failed: $(tail -n 3 "$OUT/debs/download.log")"
	rm -rf "$OUT/kernel"
	dpkg-deb -x "$deb" "$OUT/kernel" || die "dpkg-deb -x $deb failed"
	compgen -G "$OUT/kernel/boot/vmlinuz-*" >/dev/null || die "$deb holds no /boot/vmlinuz-*"
	echo "$pkg" >"$OUT/kernel/.unpacked"
fi
if ! busybox_ready; then
	echo "powercut deps: downloading busybox-static into $OUT/debs" >&2
	deb=$(download busybox-static "${opts[@]}") || skip "apt-get download busybox-static failed: $(tail -n 3 "$OUT/debs/download.log")"
	rm -rf "$OUT/busybox"
	dpkg-deb -x "$deb" "$OUT/busybox" || die "dpkg-deb -x $deb failed"
	[ -x "$OUT/busybox/bin/busybox" ] || die "$deb holds no /bin/busybox"
	touch "$OUT/busybox/.unpacked"
fi
echo "powercut deps: kernel $(cat "$OUT/kernel/.unpacked"), busybox in $OUT" >&2
