#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0 OR MIT
#
# check-driver.sh [--full] [--kver KVER] [--keep] SOURCE...
#
# Compiles the wic hook against NVIDIA open kernel-module sources, each SOURCE a tree
# apply-hook.sh accepts or Debian's nvidia-open-kernel.tar.xz. Each is copied into a scratch
# directory (SOURCE itself is never changed), patched with apply-hook.sh, and the hook's objects
# (uvm_wic.o and the NVIDIA files the patch touches) are built with the kernel's extra warnings
# (W=1). Any warning or error in our code fails the check: in uvm_wic.c, uvm_wic.h and
# uvm_wic_hook.h, or on a line the patch adds; NVIDIA's own warnings are listed, not counted.
#
# --full also builds nvidia.ko and the patched nvidia-uvm.ko (with a stub RM object where the
# tree has no nv-kernel.o_binary: a checkout builds it from src/), then wic_shim.ko against
# their Module.symvers, and checks that every uvm_wic_* symbol wic_shim imports is exported by
# nvidia-uvm with the same CRC. The modules are only built: loading them needs a GPU. When
# NVIDIA's own nvidia.ko does not build against the kernel (an error in its nvidia/ sources,
# none in nvidia-uvm's), nvidia-uvm.ko is built alone, its references to nvidia.ko unresolved,
# and the result says so.
#
# --kver picks the installed kernel headers (default: the newest under /lib/modules with a
# build directory); --keep leaves the scratch directories. Prints one line per SOURCE and exits
# non-zero when any failed; exit 2 alone means every failure was a release the hook does not
# support (apply-hook.sh's 2), while a supported release the patch does not fit is a failure.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
full=0
keep=0
kver=

usage() {
	echo "usage: check-driver.sh [--full] [--kver KVER] [--keep] SOURCE..." >&2
	exit 1
}

while (($#)); do
	case $1 in
	--full) full=1 ;;
	--keep) keep=1 ;;
	--kver)
		(($# >= 2)) || usage
		kver=$2
		shift
		;;
	--) shift; break ;;
	-*) usage ;;
	*) break ;;
	esac
	shift
done
(($#)) || usage

if [[ -z $kver ]]; then
	kver=$(find /lib/modules -mindepth 2 -maxdepth 2 -name build -printf '%h\n' 2>/dev/null |
		xargs -rn1 basename | sort -V | tail -n 1)
fi
kbuild=/lib/modules/$kver/build
[[ -n $kver && -d $kbuild ]] || { echo "check-driver: no kernel headers (/lib/modules/KVER/build); install them or pass --kver" >&2; exit 1; }
# As NVIDIA's Makefile finds them: Debian splits its headers into the source (-common) and
# the output tree.
ksrc=$kbuild
for d in "/lib/modules/$kver/source" "$kbuild/source"; do
	if [[ -d $d ]]; then
		ksrc=$(cd "$d" && pwd -P)
		break
	fi
done
kout=$(cd "$kbuild" && pwd -P)
# The kernel's name for this machine's architecture.
case $(uname -m) in
x86_64) karch=x86_64 ;;
aarch64) karch=arm64 ;;
*) karch=$(uname -m) ;;
esac
# The kernel's compiler, as NVIDIA's Makefile takes it (CONFIG_CC_VERSION_TEXT).
cc=$(sed -n 's/^CONFIG_CC_VERSION_TEXT="\([^ "]*\).*/\1/p' "$kout/.config" 2>/dev/null)
command -v "${cc:-cc}" >/dev/null || cc=cc
jobs=$(nproc)

# The new-file line numbers of the lines a patch adds, as "FILE:LINE" (FILE relative to
# kernel-open/).
added_lines() {
	awk '
	/^\+\+\+ / { file = $2; sub(/^b\/kernel-open\//, "", file); next }
	/^@@ / { split($3, n, ","); line = substr(n[1], 2); next }
	/^\+/ { print file ":" line; line++; next }
	/^ / { line++ }
	' "$1"
}

# The warnings and errors of a build log that are ours, one per line: gcc's and the C
# kernel-doc's "FILE:LINE[:COL]: warning: ...", and the Python kernel-doc's "Warning: FILE:LINE ...".
ours() {
	local log=$1 added=$2
	grep -iE '(warning|error):' "$log" | while IFS= read -r msg; do
		local loc=${msg%%: *}
		if [[ $msg =~ ^[Ww]arning:\ ([^ ]+) ]]; then
			loc=${BASH_REMATCH[1]}
		fi
		local file=${loc%%:*}
		local rest=${loc#*:}
		local line=${rest%%:*}
		file=${file#"$work/kernel-open/"}
		file=${file#"$ko/"}
		case $file in
		*/uvm_wic.c | */uvm_wic.h | */uvm_wic_hook.h | uvm_wic.c | uvm_wic.h | uvm_wic_hook.h) echo "$msg" ;;
		*) grep -qxF "$file:$line" "$added" && echo "$msg" ;;
		esac
	done || true
}

# build_clean LOG WHAT COMMAND...: runs a build into LOG; fails (keeping the scratch directory)
# when it fails or when any warning or error in it is ours. Uses check_one's locals.
build_clean() {
	local log=$1 what=$2
	shift 2
	if ! "$@" >"$log" 2>&1; then
		grep -E 'error' "$log" | head -n 20 >&2
		echo "FAIL $source: NVIDIA $version: $what do not build (log: $log)"
		keep_work=1
		return 1
	fi
	none_of_ours "$log" "$what"
}

# Fails when the build log LOG (of WHAT) has a warning in our code.
none_of_ours() {
	local log=$1 what=$2 mine
	mine=$(ours "$log" "$work/added")
	if [[ -n $mine ]]; then
		echo "$mine" >&2
		echo "FAIL $source: NVIDIA $version: warnings in our code building $what (above; log: $log)"
		keep_work=1
		return 1
	fi
}

check_one() {
	local source=$1
	work=$(mktemp -d "${TMPDIR:-/tmp}/wic-check-driver.XXXXXX")
	# -L: a checkout's nvidia/nv-kernel.o_binary is a link into its src/ build.
	if [[ -f $source ]]; then
		tar -xf "$source" -C "$work" || { echo "FAIL $source: cannot unpack it"; return 1; }
		# Debian's tarball: modules/nvidia-open-kernel/ is a kernel-open tree.
		ko=$(find "$work" -maxdepth 4 -type d -name nvidia-uvm -printf '%h\n' | head -n 1)
		ko=${ko:-$work}
	elif [[ -d $source/kernel-open ]]; then
		cp -aL "$source/kernel-open" "$work/" || { echo "FAIL $source: cannot copy it"; return 1; }
		ko=$work/kernel-open
	else
		cp -aL "$source/." "$work/kernel-open" || { echo "FAIL $source: cannot copy it"; return 1; }
		ko=$work/kernel-open
	fi
	[[ -d $ko/nvidia-uvm ]] || { echo "FAIL $source: no nvidia-uvm in it"; return 1; }

	local applied status=0
	applied=$("$here/apply-hook.sh" "$ko" 2>&1) || status=$?
	if ((status)); then
		echo "$applied" >&2
		echo "$( ((status == 2)) && echo UNSUPPORTED || echo FAIL) $source: ${applied##*apply-hook: }"
		((status == 2)) && return 2
		return 1
	fi
	local version patch_file
	version=$(sed -n 's/^apply-hook: NVIDIA \([^:]*\):.*/\1/p' <<<"$applied")
	patch_file=$(sed -n 's/^apply-hook: NVIDIA [^:]*: \([^ ]*\) applied.*/\1/p' <<<"$applied")
	added_lines "$here/$patch_file" >"$work/added"
	# Checked, not assumed: check_one runs without errexit (it is called in a condition).
	if [[ -z $version || -z $patch_file || ! -s $work/added ]]; then
		echo "FAIL $source: cannot tell the release or the patch apply-hook.sh used: $applied"
		return 1
	fi

	# The hook's objects, with W=1: uvm_wic.o and the NVIDIA .c files the patch touches.
	local objs=(nvidia-uvm/uvm_wic.o)
	while read -r f; do objs+=("${f%.c}.o"); done < <(sed -n 's#^+++ b/kernel-open/\(.*\.c\)$#\1#p' "$here/$patch_file")
	local log=$work/objects.log
	build_clean "$log" "the hook's objects" make -C "$ksrc" KBUILD_OUTPUT="$kout" M="$ko" ARCH="$karch" \
		CC="$cc" NV_KERNEL_SOURCES="$ksrc" NV_KERNEL_OUTPUT="$kout" NV_KERNEL_MODULES="nvidia nvidia-uvm" \
		W=1 -j"$jobs" "${objs[@]}" || return 1
	local theirs
	theirs=$(grep -cE 'warning:' "$log" || true)
	local result="NVIDIA $version ($patch_file): ${#objs[@]} objects with W=1, no warning of ours"
	((theirs == 0)) || result+=" ($theirs of NVIDIA's own)"

	if ((full)); then
		local stub=()
		if [[ ! -e $ko/nvidia/nv-kernel.o_binary ]]; then
			# A checkout builds the RM core from src/; for a compile check an empty object does.
			echo | "$cc" -c -x c - -o "$ko/nvidia/nv-kernel.o_binary" ||
				{ echo "FAIL $source: cannot compile the stand-in RM object"; return 1; }
			stub=(KBUILD_MODPOST_WARN=1)
			result+=", stub RM object"
		fi
		if ! make -C "$ko" KERNEL_UNAME="$kver" NV_KERNEL_MODULES="nvidia nvidia-uvm" "${stub[@]}" \
			-j"$jobs" modules >"$work/modules.log" 2>&1; then
			# NVIDIA's own nvidia.ko may not build against a kernel newer than its release
			# knows (an interface changed under it), which says nothing of the hook: then
			# nvidia-uvm.ko is built alone, its references to nvidia.ko left unresolved, as
			# with the stub RM object. An error in nvidia-uvm is a failure.
			local theirs_error
			theirs_error=$(grep -E 'error:' "$work/modules.log" | grep -E '/nvidia/[^ /]+\.c:' | head -n 1)
			if [[ -z $theirs_error ]] || grep -E 'error:' "$work/modules.log" | grep -qE 'nvidia-uvm/|uvm_wic'; then
				grep -E 'error' "$work/modules.log" | head -n 20 >&2
				echo "FAIL $source: NVIDIA $version: nvidia.ko and nvidia-uvm.ko do not build (log: $work/modules.log)"
				keep_work=1
				return 1
			fi
			build_clean "$work/modules-uvm.log" "nvidia-uvm.ko alone" make -C "$ko" KERNEL_UNAME="$kver" \
				NV_KERNEL_MODULES="nvidia-uvm" KBUILD_MODPOST_WARN=1 -j"$jobs" modules || return 1
			theirs_error=${theirs_error#*/nvidia/}
			result+="; nvidia.ko not built: NVIDIA's own source does not build against this kernel (nvidia/${theirs_error%%: *}); nvidia-uvm.ko built alone"
		else
			result+="; nvidia.ko and nvidia-uvm.ko built"
			none_of_ours "$work/modules.log" "nvidia.ko and nvidia-uvm.ko" || return 1
		fi
		mkdir -p "$work/wic/ffi" && cp -a "$repo/shim" "$work/wic/shim" &&
			cp -a "$repo/ffi/include" "$work/wic/ffi/include" ||
			{ echo "FAIL $source: cannot copy the shim's sources"; return 1; }
		make -C "$work/wic/shim" clean >/dev/null 2>&1 || true
		log=$work/shim.log
		if ! make -C "$work/wic/shim" KVER="$kver" UVM_SYMVERS="$ko/Module.symvers" >"$log" 2>&1 ||
			grep -qE 'warning|undefined' "$log"; then
			cat "$log" >&2
			echo "FAIL $source: NVIDIA $version: wic_shim.ko does not build cleanly against nvidia-uvm's Module.symvers"
			keep_work=1
			return 1
		fi
		# Every uvm_wic_* the shim imports, with its CRC, against nvidia-uvm's exports.
		local exports imports missing=0 sym crc
		# CRCs as numbers: modpost writes them zero-padded in Module.symvers, not in .mod.c.
		exports=$(awk '$2 ~ /^uvm_wic_/ && $3 ~ /nvidia-uvm$/ { print $2, $1 }' "$ko/Module.symvers" |
			while read -r sym crc; do echo "$sym $((crc))"; done)
		imports=$(sed -n 's/.*{ *\(0x[0-9a-f]*\), *"\(uvm_wic_[a-z_]*\)" *}.*/\2 \1/p' "$work/wic/shim/wic_shim.mod.c" |
			while read -r sym crc; do echo "$sym $((crc))"; done)
		[[ -n $imports ]] || { echo "FAIL $source: wic_shim imports no uvm_wic_* symbol with a CRC (no MODVERSIONS?)"; return 1; }
		while read -r sym crc; do
			if ! grep -qx "$sym $crc" <<<"$exports"; then
				echo "  $sym $crc: nvidia-uvm exports $(grep "^$sym " <<<"$exports" || echo nothing)" >&2
				missing=1
			fi
		done <<<"$imports"
		if ((missing)); then
			echo "FAIL $source: NVIDIA $version: wic_shim's imports do not match nvidia-uvm's exports (above)"
			keep_work=1
			return 1
		fi
		result+="; wic_shim.ko built, $(wc -l <<<"$imports") imports match nvidia-uvm's $(wc -l <<<"$exports") uvm_wic_* exports and CRCs"
	fi
	echo "PASS $source: $result"
}

failed=0
unsupported_only=1
for source in "$@"; do
	status=0
	keep_work=$keep
	check_one "$source" || status=$?
	((status == 0)) || failed=1
	((status == 0 || status == 2)) || unsupported_only=0
	if ((keep_work)); then
		echo "  (kept: $work)" >&2
	else
		rm -rf "$work"
	fi
done
((failed)) || exit 0
((unsupported_only)) && exit 2
exit 1
