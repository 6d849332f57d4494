#!/bin/sh
# SPDX-License-Identifier: GPL-2.0 OR MIT
#
# dkms-build.sh KERNELVER [JOBS]
#
# Run by DKMS (MAKE[0] in dkms.conf) in its build directory, a copy of /usr/src/wic-VERSION:
#   1. finds the NVIDIA open kernel-module source of the installed driver and copies it into
#      ./nvidia-src,
#   2. puts the wic hook into its nvidia-uvm (shim/nvidia-uvm/apply-hook.sh: the patch of the
#      driver's branch, uvm_wic.c, uvm_wic_hook.h, uvm_wic.h; an unsupported release is refused,
#      naming it),
#   3. builds nvidia.ko and nvidia-uvm.ko from it (only nvidia-uvm.ko is installed, as
#      nvidia-uvm-wic.ko),
#   4. builds shim/wic_shim.ko against nvidia-uvm's Module.symvers.
# Nothing is downloaded.
#
# The NVIDIA source is $WIC_NVIDIA_SRC, else the first line of /etc/wic/nvidia-src, else found
# where driver packages put it (README.md): NVIDIA's .run and CUDA-repository DKMS source
# /usr/src/nvidia-<version>, Debian's nvidia-open-kernel-dkms /usr/src/nvidia-current-open-
# <version>, Debian's nvidia-open-kernel-source /usr/src/nvidia-open-kernel.tar.xz. When several
# are there, the one of the installed nvidia.ko's version is taken. It is a kernel-open tree with
# the prebuilt nvidia/nv-kernel.o_binary, Debian's tarball of one, or an open-gpu-kernel-modules
# checkout whose `make modules` has been run once (its kernel-open/ is used).
set -eu

case ${1:-} in
'' | -*)
	echo "usage: dkms-build.sh KERNELVER [JOBS] (run by DKMS: deploy/dkms/README.md)" >&2
	exit 2
	;;
esac
kver=$1
jobs=${2:-$(nproc 2>/dev/null || echo 1)}
here=$(pwd)

die() {
	echo "wic dkms: $*" >&2
	exit 1
}

# The version of a source: its Kbuild's NV_VERSION_STRING, or for Debian's tarball the version
# of the package that installed it.
source_version() {
	case $1 in
	*.tar.xz) dpkg-query -W -f '${Version}' nvidia-open-kernel-source 2>/dev/null | sed 's/-[^-]*$//' ;;
	*)
		k=$1/Kbuild
		[ -f "$k" ] || k=$1/kernel-open/Kbuild
		sed -n 's/.*NV_VERSION_STRING=\\"\([0-9][0-9.]*\)\\".*/\1/p' "$k" 2>/dev/null | head -n 1
		;;
	esac
}

src=${WIC_NVIDIA_SRC:-}
if [ -z "$src" ] && [ -r /etc/wic/nvidia-src ]; then
	src=$(head -n 1 /etc/wic/nvidia-src)
fi
if [ -z "$src" ]; then
	# The driver this kernel's modules come from, when one is installed (Debian names its
	# module nvidia-current or nvidia-current-open).
	driver=
	for module in nvidia nvidia-current-open nvidia-current; do
		driver=$(modinfo -k "$kver" -F version "$module" 2>/dev/null || true)
		[ -z "$driver" ] || break
	done
	found=
	versions=
	src=
	# Trees before the tarball: the same release as both is taken from the tree.
	for candidate in /usr/src/nvidia-[0-9]* /usr/src/nvidia-current-open-[0-9]* \
		/usr/src/nvidia-open-kernel.tar.xz; do
		[ -e "$candidate" ] || continue
		v=$(source_version "$candidate")
		[ -n "$v" ] || continue
		if [ -n "$driver" ] && [ "$v" != "$driver" ]; then
			continue
		fi
		found="$found $candidate ($v)"
		case " $versions " in
		*" $v "*) ;;
		*)
			versions="$versions $v"
			[ -n "$src" ] || src=$candidate
			;;
		esac
	done
	[ -n "$src" ] || die "no NVIDIA open kernel-module source${driver:+ of the installed driver $driver} under /usr/src: install the driver's source package or set WIC_NVIDIA_SRC or /etc/wic/nvidia-src (README.md)"
	[ "$(echo $versions | wc -w)" -eq 1 ] || die "NVIDIA sources of several releases under /usr/src:$found; set WIC_NVIDIA_SRC or /etc/wic/nvidia-src to the one of the installed driver"
fi
[ -e "$src" ] || die "$src does not exist"

# A fresh copy; -L resolves the nv-kernel.o_binary symlink of a checkout.
rm -rf nvidia-src
case $src in
*.tar.xz)
	rm -rf nvidia-src.tmp
	mkdir nvidia-src.tmp
	tar -xf "$src" -C nvidia-src.tmp
	tree=$(find nvidia-src.tmp -maxdepth 3 -type d -name nvidia-uvm | head -n 1)
	[ -n "$tree" ] || die "$src holds no nvidia-uvm/"
	mv "$(dirname "$tree")" nvidia-src
	rm -rf nvidia-src.tmp
	;;
*)
	[ -d "$src/kernel-open/nvidia-uvm" ] && src=$src/kernel-open
	[ -d "$src/nvidia-uvm" ] && [ -f "$src/Kbuild" ] ||
		die "$src is not an NVIDIA kernel module source tree (no nvidia-uvm/ or Kbuild)"
	cp -rL "$src" nvidia-src
	;;
esac
[ -e nvidia-src/nvidia/nv-kernel.o_binary ] ||
	die "$src has no nvidia/nv-kernel.o_binary (in a checkout, run 'make modules' once first)"
# Drop objects of an earlier build (possibly for another kernel).
make -C nvidia-src KERNEL_UNAME="$kver" clean >/dev/null 2>&1 || true

bash shim/nvidia-uvm/apply-hook.sh nvidia-src || die "the wic hook cannot be put into this NVIDIA source (above)"

# KERNEL_UNAME lets NVIDIA's Makefile find split source/build header trees (Debian, Ubuntu).
make -C nvidia-src KERNEL_UNAME="$kver" NV_KERNEL_MODULES="nvidia nvidia-uvm" \
	-j"$jobs" modules

grep -q 'uvm_wic_register' nvidia-src/Module.symvers ||
	die "nvidia-uvm.ko was built without the uvm_wic exports"

make -C shim KVER="$kver" UVM_SYMVERS="$here/nvidia-src/Module.symvers"
