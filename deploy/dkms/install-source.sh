#!/bin/sh
# SPDX-License-Identifier: GPL-2.0 OR MIT
#
# install-source.sh DIR [VERSION] - puts wic's DKMS source into DIR (/usr/src/wic-VERSION for
# `dkms add wic/VERSION`): dkms.conf (its PACKAGE_VERSION set to VERSION when given),
# dkms-build.sh and the sources they build from, and nothing a build left in the repository.
set -eu

repo=$(cd "$(dirname "$0")/../.." && pwd)
case ${1:-} in
'' | -h | --help)
	echo "usage: install-source.sh DIR [VERSION]  (e.g. /usr/src/wic-0.1.0 0.1.0)" >&2
	exit 2
	;;
esac
dir=$1
version=${2:-}

install -d "$dir/shim/include" "$dir/shim/nvidia-uvm" "$dir/ffi/include"
if [ -n "$version" ]; then
	sed "s/^PACKAGE_VERSION=.*/PACKAGE_VERSION=\"$version\"/" "$repo/deploy/dkms/dkms.conf" >"$dir/dkms.conf"
	chmod 0644 "$dir/dkms.conf"
else
	install -m 0644 "$repo/deploy/dkms/dkms.conf" "$dir/dkms.conf"
fi
install -m 0755 "$repo/deploy/dkms/dkms-build.sh" "$dir/dkms-build.sh"
for f in Kbuild Makefile wic_shim.c wic_hold.h wic_validate.h; do
	install -m 0644 "$repo/shim/$f" "$dir/shim/$f"
done
install -m 0644 "$repo/shim/include/uvm_wic.h" "$dir/shim/include/uvm_wic.h"
for f in "$repo"/shim/nvidia-uvm/*.patch "$repo/shim/nvidia-uvm/uvm_wic.c" "$repo/shim/nvidia-uvm/uvm_wic_hook.h"; do
	install -m 0644 "$f" "$dir/shim/nvidia-uvm/"
done
install -m 0755 "$repo/shim/nvidia-uvm/apply-hook.sh" "$dir/shim/nvidia-uvm/apply-hook.sh"
install -m 0644 "$repo/ffi/include/wic_abi.h" "$dir/ffi/include/wic_abi.h"
echo "wic's DKMS source is in $dir"
