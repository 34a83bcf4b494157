#!/usr/bin/env bash
# Fetches a Debian source package with apt and unpacks it, without touching
# the system's apt configuration: apt reads a private deb-src list and keeps
# its lists and cache under $BUILD/apt.  The download lands in $BUILD/debsrc;
# `dpkg-source -x` (which applies Debian's own patches) unpacks it into
# $BUILD/PACKAGE-UPSTREAM (e.g. build/redis-7.0.15).
#
#   scripts/fetch-debian-source.sh PACKAGE [VERSION]
#
# VERSION is a source version as apt spells it (epoch optional:
# 5:7.0.15-1~deb12u10 or 7.0.15-1~deb12u10); without it, the newest in the
# private lists.  Cached: when the .dsc and every file it lists are in
# $BUILD/debsrc with the .dsc's SHA-256 sums, nothing is downloaded, and an
# unpacked tree made from that same .dsc is left as it is.
#
# Errors go to stderr as "fetch-debian-source: REASON: detail", REASON one
# of: usage, missing-tool, apt-update-failed, no-such-source,
# no-such-version, download-failed, checksum-mismatch, unpack-failed.
# Environment: BUILD (default: build), DEB_MIRROR and DEB_SECURITY_MIRROR
# (the archive URLs), DEB_SUITE (default: bookworm).
set -euo pipefail

die() {
	echo "fetch-debian-source: $1: $2" >&2
	exit 1
}

[ $# -ge 1 ] && [ $# -le 2 ] || die usage "usage: $0 PACKAGE [VERSION]"
pkg=$1
want=${2:-}
[[ $pkg =~ ^[a-z0-9][a-z0-9.+-]+$ ]] || die usage "'$pkg' is not a Debian package name"
[ -z "$want" ] || [[ $want =~ ^([0-9]+:)?[A-Za-z0-9.+~-]+$ ]] || die usage "'$want' is not a Debian version"

for tool in apt-get apt-cache dpkg-source sha256sum; do
	command -v "$tool" >/dev/null 2>&1 || die missing-tool "$tool not found (scripts/deps.sh installs dpkg-dev)"
done

BUILD=${BUILD:-build}
mkdir -p "$BUILD"
BUILD=$(cd "$BUILD" && pwd)
suite=${DEB_SUITE:-bookworm}
mirror=${DEB_MIRROR:-http://deb.debian.org/debian}
security=${DEB_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
aptdir=$BUILD/apt
srcdir=$BUILD/debsrc
mkdir -p "$aptdir/lists/partial" "$aptdir/cache/archives/partial" "$srcdir"

# The private sources: Debian's main archive, its updates and its security
# archive, source indices only.  Rewritten each run (cheap) so a change of
# suite or mirror takes effect.
cat >"$aptdir/sources.list" <<EOF
deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $suite main
deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $suite-updates main
deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $security $suite-security main
EOF

apt_opts=(
	-o "Dir::Etc::sourcelist=$aptdir/sources.list"
	-o "Dir::Etc::sourceparts=-"
	-o "Dir::State::Lists=$aptdir/lists"
	-o "Dir::Cache=$aptdir/cache"
	-o "Acquire::Languages=none"
	-o "APT::Get::List-Cleanup=true"
	# apt downloads as the unprivileged _apt user, which may not reach the
	# build tree; this tree is ours, so download as ourselves.
	-o "APT::Sandbox::User=$(id -un)"
)

# The version without its epoch, as it appears in file names.
noepoch() { echo "${1#*:}"; }

# The files a .dsc lists (Checksums-Sha256: "SUM SIZE NAME"), one "SUM  NAME" a line.
dsc_files() {
	awk '/^Checksums-Sha256:/ { on = 1; next } /^[^ ]/ { on = 0 } on && NF == 3 { print $1 "  " $3 }' "$1"
}

# True when the .dsc and every file it lists are present with their sums.
cached_ok() {
	local dsc=$1
	[ -f "$dsc" ] || return 1
	local list
	list=$(dsc_files "$dsc")
	[ -n "$list" ] || return 1
	(cd "$srcdir" && sha256sum --quiet --status -c - <<<"$list")
}

# Resolve the version: the one asked for, or the newest in the private lists
# (updating them only when they are absent).
have_lists() { compgen -G "$aptdir/lists/*Sources*" >/dev/null; }
apt_update() {
	echo "fetch-debian-source: apt-get update (private lists in $aptdir)" >&2
	apt-get "${apt_opts[@]}" -qq update >"$aptdir/update.log" 2>&1 ||
		die apt-update-failed "apt-get update failed (no network or no archive at $mirror?); see $aptdir/update.log: $(grep -E '^(E|W):' "$aptdir/update.log" | head -3 | tr '\n' ' ')"
	# apt-get update exits 0 when a source could not be reached; check.
	if grep -qE '^(E:|W: Failed to fetch)' "$aptdir/update.log"; then
		die apt-update-failed "$(grep -E '^(E:|W: Failed to fetch)' "$aptdir/update.log" | head -3 | tr '\n' ' ')"
	fi
	have_lists || die apt-update-failed "apt-get update fetched no Sources index from $mirror"
}

version=$want
if [ -z "$version" ]; then
	have_lists || apt_update
	version=$(apt-cache "${apt_opts[@]}" showsrc "$pkg" 2>/dev/null | awk '/^Version:/ { print $2 }' | sort -V | tail -1)
	[ -n "$version" ] || die no-such-source "no source package '$pkg' in $suite (private lists in $aptdir)"
fi
v=$(noepoch "$version")
dsc=$srcdir/${pkg}_$v.dsc

if cached_ok "$dsc"; then
	echo "fetch-debian-source: $pkg $v cached in $srcdir" >&2
else
	# The version must be in the lists; refresh them once if it is not.
	versions() { apt-cache "${apt_opts[@]}" showsrc "$pkg" 2>/dev/null | awk '/^Version:/ { print $2 }'; }
	# the listed version (with its epoch) whose epoch-less form is $v
	find_full() { versions | awk -v v="$v" '{ w = $0; sub(/^[0-9]+:/, "", w) } w == v { print; exit }'; }
	full=
	have_lists && full=$(find_full)
	if [ -z "$full" ]; then
		apt_update
		full=$(find_full)
	fi
	all=$(versions)
	[ -n "$all" ] || die no-such-source "no source package '$pkg' in $suite"
	[ -n "$full" ] || die no-such-version "$pkg $version is not in $suite (available: $(tr '\n' ' ' <<<"$all"))"
	echo "fetch-debian-source: downloading $pkg $full into $srcdir" >&2
	(cd "$srcdir" && apt-get "${apt_opts[@]}" -qq source --download-only "$pkg=$full") >"$aptdir/source.log" 2>&1 ||
		die download-failed "apt-get source $pkg=$full failed; see $aptdir/source.log: $(grep -E '^(E|W):' "$aptdir/source.log" | head -3 | tr '\n' ' ')"
	[ -f "$dsc" ] || die download-failed "apt-get source left no $dsc"
	cached_ok "$dsc" || die checksum-mismatch "a file listed in $dsc does not match its SHA-256 sum"
fi

# Unpack into $BUILD/PACKAGE-UPSTREAM, once per .dsc: a stamp holds the
# .dsc's sum, so a tree from another download is unpacked again.
upstream=${v%-*}
dest=$BUILD/$pkg-$upstream
stamp=$dest/.fetch-debian-source.stamp
sum=$(sha256sum "$dsc" | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$sum" ]; then
	echo "fetch-debian-source: $dest already unpacked" >&2
else
	rm -rf "$dest" "$dest.tmp"
	dpkg-source -x "$dsc" "$dest.tmp" >"$aptdir/unpack.log" 2>&1 ||
		die unpack-failed "dpkg-source -x $dsc failed; see $aptdir/unpack.log"
	echo "$sum" >"$dest.tmp/.fetch-debian-source.stamp"
	mv "$dest.tmp" "$dest"
	echo "fetch-debian-source: unpacked $pkg $v into $dest" >&2
fi
echo "$dest"
