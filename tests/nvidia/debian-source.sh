#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0 OR MIT
#
# debian-source.sh DIR [PACKAGE...] - download Debian's NVIDIA open kernel-module packages
#
# Downloads PACKAGE (default: nvidia-open-kernel-source) from the contrib component of Debian
# trixie, which carries the 550 branch (bookworm's 535 is not supported by the hook), into DIR,
# and unpacks each into DIR/PACKAGE/. The apt entry is derived from the system's own sources
# (each Debian archive's URI and keyring found there, tried in turn), and apt runs on a private list, state and
# cache under DIR: the system's apt configuration is left alone and nothing is installed.
# Prints the .deb files' paths.
set -euo pipefail

(($# >= 1)) || { echo "usage: debian-source.sh DIR [PACKAGE...]" >&2; exit 1; }
dir=$(mkdir -p "$1" && cd "$1" && pwd)
shift
packages=("${@:-nvidia-open-kernel-source}")
suite=trixie

command -v apt-get >/dev/null || { echo "debian-source: no apt-get: not a Debian system" >&2; exit 1; }

# The archives of the system's sources that may be Debian's (one-line entries and enabled deb822
# stanzas whose URI ends in /debian; the security archive's does not), each with its keyring, in
# the order apt reads them. Each is tried until one serves the packages: a third party's
# repository for Debian (Docker's, say) does not.
candidates() {
	local file
	while IFS= read -r file; do
		case $file in
		*.list)
			grep -E '^deb[[:space:]]' "$file" | awk '{
				key = ""
				if (match($0, /signed-by=[^] ]*/)) key = substr($0, RSTART + 10, RLENGTH - 10)
				for (i = 2; i <= NF; i++) if ($i ~ /^[a-z+]+:\/\/.*\/debian\/?$/) { print $i, key; next }
			}'
			;;
		*.sources)
			awk '
				function flush() { if (enabled) for (i = 1; i <= n; i++) print u[i], k; n = 0; k = ""; enabled = 1 }
				BEGIN { enabled = 1 }
				/^[[:space:]]*$/ { flush(); next }
				tolower($1) == "enabled:" && tolower($2) == "no" { enabled = 0 }
				tolower($1) == "uris:" { for (i = 2; i <= NF; i++) if ($i ~ /\/debian\/?$/) u[++n] = $i }
				tolower($1) == "signed-by:" && NF == 2 { k = $2 }
				END { flush() }' "$file"
			;;
		esac
	done < <(ls /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null)
}

apt_dir=$dir/apt
opts=(-o Dir::Etc::sourcelist="$apt_dir/sources.list" -o Dir::Etc::sourceparts=- \
	-o Dir::State::Lists="$apt_dir/lists" -o Dir::Cache="$apt_dir/cache" \
	-o APT::Get::List-Cleanup=0 -o APT::Sandbox::User=root -qq)
cd "$dir"
got=0
tried=()
while read -r uri keyring; do
	[[ -n $uri ]] || continue
	tried+=("$uri")
	rm -rf "$apt_dir"
	mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
	echo "deb [signed-by=${keyring:-/usr/share/keyrings/debian-archive-keyring.gpg}] $uri $suite contrib" >"$apt_dir/sources.list"
	if apt-get "${opts[@]}" update >&2 && apt-get "${opts[@]}" download "${packages[@]}" >&2; then
		got=1
		break
	fi
done < <(candidates)
((got)) || { echo "debian-source: none of the system's Debian archives (${tried[*]:-none found}) serves ${packages[*]} in $suite contrib" >&2; exit 1; }
for package in "${packages[@]}"; do
	deb=$(ls -t "$dir/${package}"_*.deb | head -n 1)
	rm -rf "${dir:?}/$package"
	dpkg-deb -x "$deb" "$dir/$package"
	echo "$deb"
done
