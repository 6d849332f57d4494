#!/bin/sh
# SPDX-License-Identifier: GPL-2.0 OR MIT
#
# dkms-build.sh KERNELVER [JOBS]
#
# Run by DKMS (MAKE[0] in dkms.conf) in its build directory, a copy of /usr/src/wic-VERSION:
#   1. copies the local NVIDIA 580.x kernel module source into ./nvidia-src,
#   2. applies shim/nvidia-uvm/0001-uvm-wic-hook.patch, adds uvm_wic.c, uvm_wic_hook.h, uvm_wic.h,
#   3. builds nvidia.ko and nvidia-uvm.ko from it (only nvidia-uvm.ko is installed),
#   4. builds shim/wic_shim.ko against nvidia-uvm's Module.symvers.
# Nothing is downloaded.
#
# The NVIDIA source is taken from, in this order: $WIC_NVIDIA_SRC, the first line of
# /etc/wic/nvidia-src, or the only /usr/src/nvidia-580.* directory. It is either a
# kernel-open-like directory (with nvidia-uvm/ and nvidia/nv-kernel.o_binary, as installed by
# the driver package) or an open-gpu-kernel-modules checkout whose `make modules` has been run
# once (kernel-open/ is used).
set -eu

kver=${1:?usage: dkms-build.sh KERNELVER [JOBS]}
jobs=${2:-$(nproc 2>/dev/null || echo 1)}
here=$(pwd)

die() {
	echo "wic dkms: $*" >&2
	exit 1
}

src=${WIC_NVIDIA_SRC:-}
if [ -z "$src" ] && [ -r /etc/wic/nvidia-src ]; then
	src=$(head -n 1 /etc/wic/nvidia-src)
fi
if [ -z "$src" ]; then
	set -- /usr/src/nvidia-580.*
	if [ "$#" -ne 1 ] || [ ! -d "$1" ]; then
		die "set WIC_NVIDIA_SRC or /etc/wic/nvidia-src to the NVIDIA 580.x source (found: $*)"
	fi
	src=$1
fi
[ -d "$src/kernel-open/nvidia-uvm" ] && src=$src/kernel-open
if [ ! -d "$src/nvidia-uvm" ] || [ ! -f "$src/Kbuild" ]; then
	die "$src is not an NVIDIA kernel module source tree (no nvidia-uvm/ or Kbuild)"
fi
[ -e "$src/nvidia/nv-kernel.o_binary" ] ||
	die "$src/nvidia/nv-kernel.o_binary missing (run 'make modules' in the checkout first)"

version=$(sed -n 's/.*NV_VERSION_STRING=\\"\([0-9.]*\)\\".*/\1/p' "$src/Kbuild" | head -n 1)
case $version in
580.*) ;;
*) die "NVIDIA source version '$version' is not 580.x" ;;
esac
echo "wic dkms: NVIDIA $version from $src, kernel $kver"

# Fresh copy; -L resolves the nv-kernel.o_binary symlink of a checkout.
rm -rf nvidia-src
cp -rL "$src" nvidia-src
# Drop objects of an earlier build (possibly for another kernel).
make -C nvidia-src KERNEL_UNAME="$kver" clean >/dev/null 2>&1 || true

patch -d nvidia-src -p2 --forward --batch < shim/nvidia-uvm/0001-uvm-wic-hook.patch ||
	die "the hook patch does not apply to NVIDIA $version"
cp shim/nvidia-uvm/uvm_wic.c shim/nvidia-uvm/uvm_wic_hook.h shim/include/uvm_wic.h \
	nvidia-src/nvidia-uvm/

# KERNEL_UNAME lets NVIDIA's Makefile find split source/build header trees (Debian, Ubuntu).
make -C nvidia-src KERNEL_UNAME="$kver" NV_KERNEL_MODULES="nvidia nvidia-uvm" \
	-j"$jobs" modules

grep -q 'uvm_wic_register' nvidia-src/Module.symvers ||
	die "nvidia-uvm.ko was built without the uvm_wic exports"

make -C shim KVER="$kver" UVM_SYMVERS="$here/nvidia-src/Module.symvers"
