#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0 OR MIT
#
# debian-source.sh DIR [PACKAGE...] - download Debian's NVIDIA open kernel-module packages
#
# Downloads PACKAGE (default: nvidia-open-kernel-source) from the contrib component of Debian
# trixie, which carries the 550 branch (bookworm's 535 is not supported by the hook), into DIR,
# and unpacks each into DIR/PACKAGE/. The apt entry is derived from the system's own sources
# (the Debian archive's URI and keyring found there), and apt runs on a private list, state and
# cache under DIR: the system's apt configuration is left alone and nothing is installed.
# Prints the .deb files' paths.
set -euo pipefail

(($# >= 1)) || { echo "usage: debian-source.sh DIR [PACKAGE...]" >&2; exit 1; }
dir=$(mkdir -p "$1" && cd "$1" && pwd)
shift
packages=("${@:-nvidia-open-kernel-source}")
suite=trixie

command -v apt-get >/dev/null || { echo "debian-source: no apt-get: not a Debian system" >&2; exit 1; }

# The Debian archive of the system's sources: one-line entries and deb822 stanzas. Security
# and ports archives are skipped: trixie's contrib is on the main archive.
uri=
keyring=
while IFS= read -r file; do
	case $file in
	*.list)
		line=$(grep -E '^deb[[:space:]]' "$file" | grep -v -- '-security' | grep -E '/debian/?[[:space:]]' | head -n 1) || true
		[[ -n $line ]] || continue
		uri=$(awk '{ for (i = 2; i <= NF; i++) if ($i ~ /^[a-z+]+:\/\//) { print $i; exit } }' <<<"$line")
		keyring=$(sed -n 's/.*signed-by=\([^] ]*\).*/\1/p' <<<"$line")
		;;
	*.sources)
		uri=$(awk 'tolower($1) == "uris:" { for (i = 2; i <= NF; i++) if ($i !~ /security/ && $i ~ /\/debian\/?$/) { print $i; exit } }' "$file")
		[[ -n $uri ]] || continue
		keyring=$(awk -v uri="$uri" '
			/^[[:space:]]*$/ { if (found && key) { print key; exit } found = 0; key = "" }
			tolower($1) == "uris:" { for (i = 2; i <= NF; i++) if ($i == uri) found = 1 }
			tolower($1) == "signed-by:" && NF == 2 { key = $2 }
			END { if (found && key) print key }' "$file" | head -n 1)
		;;
	esac
	[[ -z $uri ]] || break
done < <(ls /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null)
[[ -n $uri ]] || { echo "debian-source: no Debian archive in the system's apt sources" >&2; exit 1; }
keyring=${keyring:-/usr/share/keyrings/debian-archive-keyring.gpg}

apt_dir=$dir/apt
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
echo "deb [signed-by=$keyring] $uri $suite contrib" >"$apt_dir/sources.list"
opts=(-o Dir::Etc::sourcelist="$apt_dir/sources.list" -o Dir::Etc::sourceparts=- \
	-o Dir::State::Lists="$apt_dir/lists" -o Dir::Cache="$apt_dir/cache" \
	-o APT::Get::List-Cleanup=0 -o APT::Sandbox::User=root -qq)
apt-get "${opts[@]}" update >&2
cd "$dir"
apt-get "${opts[@]}" download "${packages[@]}" >&2
for package in "${packages[@]}"; do
	deb=$(ls -t "$dir/${package}"_*.deb | head -n 1)
	rm -rf "${dir:?}/$package"
	dpkg-deb -x "$deb" "$dir/$package"
	echo "$deb"
done
