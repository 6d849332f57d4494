#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0 OR MIT
#
# apply-hook.sh TREE - put the wic hook into the nvidia-uvm of an NVIDIA open kernel-module tree
#
# TREE is a source root with kernel-open/ (a checkout of open-gpu-kernel-modules, NVIDIA's .run
# or CUDA-repo DKMS tree under /usr/src/nvidia-<version>) or a kernel-open tree itself (Debian's
# /usr/src/nvidia-current-open-<version>, or its nvidia-open-kernel.tar.xz unpacked). The
# driver's release is read from its Kbuild (NV_VERSION_STRING); the patch of its branch is
# checked to apply without a reject, then applied, and uvm_wic.c, uvm_wic_hook.h and uvm_wic.h
# are copied into nvidia-uvm/.
#
# Exit status: 0 patched; 2 a release the hook does not support; 3 a release of a supported
# branch that the patch does not fit (the driver changed: the hook needs porting); 1 other
# errors (bad arguments, a tree patched already). On 1 to 3 nothing was changed.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
supported="550, 570 (570.133.07 or later), 575, 580, 590 and 595"

die() {
	local status=$1
	shift
	echo "apply-hook: $*" >&2
	exit "$status"
}

(($# == 1)) || die 1 "usage: apply-hook.sh TREE (a source root with kernel-open/, or a kernel-open tree)"
tree=$1
if [[ -d $tree/kernel-open/nvidia-uvm ]]; then
	ko=$tree/kernel-open
elif [[ -d $tree/nvidia-uvm ]]; then
	ko=$tree
else
	die 1 "$tree has neither kernel-open/nvidia-uvm nor nvidia-uvm: not an NVIDIA open kernel-module tree"
fi

version=$(sed -n 's/.*-DNV_VERSION_STRING=\\"\([0-9][0-9.]*\)\\".*/\1/p' "$ko/Kbuild" 2>/dev/null | head -n 1)
[[ -n $version ]] || die 1 "$ko/Kbuild sets no NV_VERSION_STRING: not an NVIDIA open kernel-module tree"
[[ ! -e $ko/nvidia-uvm/uvm_wic.c ]] || die 1 "$ko/nvidia-uvm already has the wic hook (uvm_wic.c): start from an unpatched tree"

case ${version%%.*} in
550) patch_file=0001-uvm-wic-hook-550.patch ;;
570 | 575 | 580 | 590) patch_file=0001-uvm-wic-hook.patch ;;
595) patch_file=0001-uvm-wic-hook-595.patch ;;
*) die 2 "NVIDIA $version is not supported: the wic hook supports the open driver branches $supported" ;;
esac
# Within the 570 branch the fault buffer was renamed (fault_buffer_info to fault_buffer), which
# the patch's hunks name.
if ! grep -q 'uvm_fault_buffer_t fault_buffer;' "$ko/nvidia-uvm/uvm_gpu.h" && [[ $patch_file == 0001-uvm-wic-hook.patch ]]; then
	die 2 "NVIDIA $version is not supported: its nvidia-uvm still names the fault buffer fault_buffer_info, as 570 releases before 570.133.07 do; the wic hook supports $supported"
fi

# The patch's paths start with a/kernel-open/.
if ! out=$(patch -d "$ko" -p2 --dry-run --forward --batch <"$here/$patch_file" 2>&1); then
	printf '%s\n' "$out" >&2
	die 3 "$patch_file does not apply to NVIDIA $version in $ko (shown above); nothing was changed"
fi
patch -d "$ko" -p2 --forward --batch --silent --no-backup-if-mismatch <"$here/$patch_file"
cp "$here/uvm_wic.c" "$here/uvm_wic_hook.h" "$here/../include/uvm_wic.h" "$ko/nvidia-uvm/"
echo "apply-hook: NVIDIA $version: $patch_file applied to $ko/nvidia-uvm, hook files copied"
