#!/usr/bin/env bash
# Works on a patch series of examples/redis as git commits.
#   examples/redis/patches.sh unpack DIR [SERIES_DIR]
#       DIR: a git repository of the unpacked Debian source (build/redis-7.0.15)
#       with one commit per patch of SERIES_DIR/series (default
#       examples/redis/patches), subject and body from the patch's header
#   examples/redis/patches.sh export DIR [SERIES_DIR]
#       writes the commits after DIR's "base" tag back as SERIES_DIR's
#       patches, in order, named by the series (one commit per patch, in the
#       series' order): "Subject: ..." header, the body, "---", git diff
# Edit in DIR (git commit --fixup, git rebase -i --autosquash base), then
# export; build.sh sees the changed patches and makes a new tree.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
cmd=${1:-}
dir=${2:-}
series_dir=${3:-examples/redis/patches}
[ -n "$cmd" ] && [ -n "$dir" ] || { echo "usage: $0 unpack|export DIR [SERIES_DIR]" >&2; exit 2; }
series_dir=$(cd "$series_dir" && pwd)
patches=$(grep -v -e '^#' -e '^$' "$series_dir/series")
g() { git -C "$dir" -c user.name=patches.sh -c user.email=patches.sh@localhost "$@"; }
case "$cmd" in
unpack)
	[ ! -e "$dir" ] || { echo "patches.sh: $dir exists" >&2; exit 1; }
	src=$BUILD/redis-7.0.15
	[ -d "$src" ] || { echo "patches.sh: no $src (make redis-port fetches it)" >&2; exit 1; }
	cp -a "$src" "$dir"
	g init -q
	g add -A -f >/dev/null
	g commit -qm base
	g tag base
	for p in $patches; do
		g apply "$series_dir/$p"
		g add -A -f
		# the header: everything before the first "---" line
		sed -n '/^---$/q;p' "$series_dir/$p" | sed '1s/^Subject: //' | g commit -q -F -
	done
	g log --oneline base..HEAD
	;;
export)
	mapfile -t commits < <(g rev-list --reverse base..HEAD)
	mapfile -t names <<<"$patches"
	[ "${#commits[@]}" = "${#names[@]}" ] ||
		{ echo "patches.sh: ${#commits[@]} commits after base, ${#names[@]} patches in the series" >&2; exit 1; }
	for i in "${!commits[@]}"; do
		c=${commits[$i]}
		{
			printf 'Subject: '
			printf "%s\n" "$(g log -1 --format=%B "$c")"
			echo ---
			g diff --no-color "$c~1" "$c"
		} >"$series_dir/${names[$i]}"
		echo "patches.sh: ${names[$i]}"
	done
	;;
*) echo "usage: $0 unpack|export DIR [SERIES_DIR]" >&2; exit 2 ;;
esac
