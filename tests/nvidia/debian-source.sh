#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0 OR MIT
#
# debian-source.sh DIR [PACKAGE...] - download Debian's NVIDIA open kernel-module packages
#
# Downloads PACKAGE (default: nvidia-open-kernel-source) from the contrib component of Debian
# trixie, which carries the 550 branch (bookworm's 535 is not supported by the hook), into DIR,
# and unpacks each into DIR/PACKAGE/. The apt entry is derived from the system's own sources
# (the Debian archive's URI and keyring found there, else Debian's redirector), and apt runs on a private list, state and
# cache under DIR: the system's apt configuration is left alone and nothing is installed.
# Prints the .deb files' paths.
set -euo pipefail

(($# >= 1)) || { echo "usage: debian-source.sh DIR [PACKAGE...]" >&2; exit 1; }
dir=$(mkdir -p "$1" && cd "$1" && pwd)
shift
packages=("${@:-nvidia-open-kernel-source}")
suite=trixie

command -v apt-get >/dev/null || { echo "debian-source: no apt-get: not a Debian system" >&2; exit 1; }

# The Debian archive of the system's sources (one-line entries and enabled deb822 stanzas): the
# first URI on a debian.org host ending in /debian, so that a third party's repository for
# Debian (Docker's, say) or the security archive is never taken. Without one, Debian's own
# redirector, with the archive keyring.
uri=
keyring=
while IFS= read -r file; do
	case $file in
	*.list)
		line=$(grep -E '^deb[[:space:]]' "$file" | grep -E '://[^/ ]*debian\.org/debian/?[[:space:]]' | head -n 1) || true
		[[ -n $line ]] || continue
		uri=$(awk '{ for (i = 2; i <= NF; i++) if ($i ~ /^[a-z+]+:\/\//) { print $i; exit } }' <<<"$line")
		keyring=$(sed -n 's/.*signed-by=\([^] ]*\).*/\1/p' <<<"$line")
		;;
	*.sources)
		# One stanza per paragraph: its URI and keyring, unless it says Enabled: no.
		read -r uri keyring < <(awk '
			function flush() { if (u != "" && enabled) { print u, k; done = 1; exit } u = ""; k = ""; enabled = 1 }
			BEGIN { enabled = 1 }
			/^[[:space:]]*$/ { flush(); next }
			tolower($1) == "enabled:" && tolower($2) == "no" { enabled = 0 }
			tolower($1) == "uris:" { for (i = 2; i <= NF; i++) if ($i ~ /:\/\/[^\/]*debian\.org\/debian\/?$/) { u = $i; break } }
			tolower($1) == "signed-by:" && NF == 2 { k = $2 }
			END { if (!done) flush() }' "$file") || true
		;;
	esac
	[[ -z $uri ]] || break
done < <(ls /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null)
uri=${uri:-http://deb.debian.org/debian}
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
