#!/usr/bin/env bash
# Install wic: wicd, wicctl, libwic (wic.h, and wic.cuh for CUDA code) and the systemd/udev
# integration files.
#
# Usage: deploy/install.sh [BUILD_DIR]
#   BUILD_DIR  directory holding wicd, wicctl, libwic.so, libwic.a
#              (default: target/release, relative to the repository root)
#
# Environment:
#   DESTDIR       staging root prepended to every path (default: empty).
#                 When set, no system tools (sysusers, tmpfiles, udevadm,
#                 systemctl) are run.
#   PREFIX        installation prefix for binaries, library, header and
#                 pkg-config file (default: /usr)
#   BINDIR LIBDIR INCLUDEDIR PKGCONFIGDIR   override the derived directories
#   UNITDIR       systemd units        (default: /usr/lib/systemd/system)
#   SYSUSERSDIR   sysusers.d fragments (default: /usr/lib/sysusers.d)
#   TMPFILESDIR   tmpfiles.d fragments (default: /usr/lib/tmpfiles.d)
#   UDEVRULESDIR  udev rules           (default: /usr/lib/udev/rules.d)
#   SYSCONFDIR    configuration root   (default: /etc)
#   VERSION       version written to wic.pc (default: from daemon/Cargo.toml)
set -euo pipefail

script_dir=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
repo_root=$(cd -- "$script_dir/.." && pwd)

build_dir=${1:-target/release}
case $build_dir in
    /*) ;;
    *) build_dir=$repo_root/$build_dir ;;
esac

DESTDIR=${DESTDIR:-}
PREFIX=${PREFIX:-/usr}
BINDIR=${BINDIR:-$PREFIX/bin}
LIBDIR=${LIBDIR:-$PREFIX/lib}
INCLUDEDIR=${INCLUDEDIR:-$PREFIX/include}
PKGCONFIGDIR=${PKGCONFIGDIR:-$LIBDIR/pkgconfig}
UNITDIR=${UNITDIR:-/usr/lib/systemd/system}
SYSUSERSDIR=${SYSUSERSDIR:-/usr/lib/sysusers.d}
TMPFILESDIR=${TMPFILESDIR:-/usr/lib/tmpfiles.d}
UDEVRULESDIR=${UDEVRULESDIR:-/usr/lib/udev/rules.d}
SYSCONFDIR=${SYSCONFDIR:-/etc}

if [[ -z ${VERSION:-} ]]; then
    VERSION=$(sed -n 's/^version *= *"\([^"]*\)".*/\1/p' "$repo_root/daemon/Cargo.toml" 2>/dev/null | head -n1)
    VERSION=${VERSION:-0.0.0}
fi

say() { printf '==> %s\n' "$*"; }
warn() { printf 'warning: %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }
run() { printf '    %s\n' "$*"; "$@"; }

# install_file MODE SRC DEST: install SRC as DEST (DEST without DESTDIR).
install_file() {
    run install -D -m "$1" "$2" "$DESTDIR$3"
}

have() { command -v "$1" >/dev/null 2>&1; }

[[ -d $build_dir ]] || die "build directory $build_dir does not exist (build with: cargo build --release)"

say "installing binaries from $build_dir"
for bin in wicd wicctl; do
    [[ -x $build_dir/$bin ]] || die "$build_dir/$bin not found or not executable"
    install_file 0755 "$build_dir/$bin" "$BINDIR/$bin"
done

say "installing libwic"
# The shared library under its full version, the SONAME the dynamic loader asks for (libwic.so.0.1
# for 0.1.x, ffi/libwic/build.rs) and libwic.so for the linker, both links to it.
if [[ -f $build_dir/libwic.so ]]; then
    have readelf || die "readelf (binutils) is needed to read libwic.so's SONAME"
    soname=$(readelf -d "$build_dir/libwic.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
    [[ $soname == libwic.so.* ]] || die "$build_dir/libwic.so has no SONAME libwic.so.N (built by an old tree?)"
    lib_version=$(sed -n 's/^version *= *"\([^"]*\)".*/\1/p' "$repo_root/ffi/libwic/Cargo.toml" | head -n1)
    real=libwic.so.${lib_version:?}
    [[ $real == "$soname" || $real == "$soname".* ]] || die "SONAME $soname does not fit libwic's version $lib_version"
    install_file 0755 "$build_dir/libwic.so" "$LIBDIR/$real"
    [[ $soname == "$real" ]] || run ln -sfn "$real" "$DESTDIR$LIBDIR/$soname"
    run ln -sfn "$soname" "$DESTDIR$LIBDIR/libwic.so"
else
    warn "$build_dir/libwic.so not found, skipping"
fi
if [[ -f $build_dir/libwic.a ]]; then
    install_file 0644 "$build_dir/libwic.a" "$LIBDIR/libwic.a"
else
    warn "$build_dir/libwic.a not found, skipping"
fi
if [[ -f $repo_root/ffi/include/wic.h ]]; then
    install_file 0644 "$repo_root/ffi/include/wic.h" "$INCLUDEDIR/wic.h"
else
    warn "ffi/include/wic.h not found, skipping"
fi
# The device library for CUDA code (#include <wic/wic.cuh>, which includes its parts and wic.h).
for header in "$repo_root"/device/include/wic/*.cuh; do
    install_file 0644 "$header" "$INCLUDEDIR/wic/$(basename "$header")"
done
if [[ -f $repo_root/ffi/wic.pc.in ]]; then
    printf '    generate %s from ffi/wic.pc.in (version %s)\n' "$DESTDIR$PKGCONFIGDIR/wic.pc" "$VERSION"
    mkdir -p "$DESTDIR$PKGCONFIGDIR"
    sed -e "s|@PREFIX@|$PREFIX|g" \
        -e "s|@LIBDIR@|$LIBDIR|g" \
        -e "s|@INCLUDEDIR@|$INCLUDEDIR|g" \
        -e "s|@VERSION@|$VERSION|g" \
        "$repo_root/ffi/wic.pc.in" > "$DESTDIR$PKGCONFIGDIR/wic.pc"
    chmod 0644 "$DESTDIR$PKGCONFIGDIR/wic.pc"
else
    warn "ffi/wic.pc.in not found, skipping wic.pc"
fi

say "installing systemd units into $UNITDIR"
install_file 0644 "$script_dir/wicd.socket" "$UNITDIR/wicd.socket"
install_file 0644 "$script_dir/wicd.service" "$UNITDIR/wicd.service"
install_file 0644 "$script_dir/wic-sleep.service" "$UNITDIR/wic-sleep.service"
install_file 0644 "$script_dir/wic-compute-mode.service" "$UNITDIR/wic-compute-mode.service"
install_file 0755 "$script_dir/wic-compute-mode" "/usr/lib/wic/wic-compute-mode"
if [[ $BINDIR != /usr/bin || $SYSCONFDIR != /etc ]]; then
    printf '    rewrite ExecStart= to %s/wicd serve --config %s/wic/wicd.toml\n' "$BINDIR" "$SYSCONFDIR"
    sed -i -e "s|^ExecStart=/usr/bin/wicd serve --config /etc/wic/wicd.toml|ExecStart=$BINDIR/wicd serve --config $SYSCONFDIR/wic/wicd.toml|" \
        "$DESTDIR$UNITDIR/wicd.service"
    sed -i -e "s|^ExecStart=/usr/lib/wic/wic-compute-mode /etc/wic/wicd.toml|ExecStart=/usr/bin/env WICD=$BINDIR/wicd /usr/lib/wic/wic-compute-mode $SYSCONFDIR/wic/wicd.toml|" \
        "$DESTDIR$UNITDIR/wic-compute-mode.service"
fi

say "installing sysusers.d, tmpfiles.d and udev files"
install_file 0644 "$script_dir/sysusers.d/wic.conf" "$SYSUSERSDIR/wic.conf"
install_file 0644 "$script_dir/tmpfiles.d/wic.conf" "$TMPFILESDIR/wic.conf"
install_file 0644 "$script_dir/udev/70-wic.rules" "$UDEVRULESDIR/70-wic.rules"

config=$SYSCONFDIR/wic/wicd.toml
if [[ -e $DESTDIR$config ]]; then
    say "keeping existing $DESTDIR$config"
else
    say "installing example configuration"
    install_file 0644 "$script_dir/wicd.toml" "$config"
fi

if [[ -n $DESTDIR ]]; then
    say "DESTDIR is set: not running systemd-sysusers, systemd-tmpfiles, udevadm or systemctl"
    exit 0
fi

say "applying system configuration"
if have ldconfig; then
    run ldconfig
else
    warn "ldconfig not found: run it once libwic is in $LIBDIR"
fi
if have systemd-sysusers; then
    run systemd-sysusers "$SYSUSERSDIR/wic.conf"
else
    warn "systemd-sysusers not found: create group 'wic' and system user 'wicd' (primary group wic) by hand"
fi
if have systemd-tmpfiles; then
    run systemd-tmpfiles --create "$TMPFILESDIR/wic.conf"
else
    warn "systemd-tmpfiles not found: create /run/wic (0750 root:wic) by hand"
fi
if have udevadm; then
    run udevadm control --reload-rules || warn "udevadm control --reload-rules failed"
    if [[ -e /dev/wic ]]; then
        run udevadm trigger --action=add --subsystem-match=misc --sysname-match=wic || warn "udevadm trigger failed"
    fi
fi
if have systemctl && [[ -d /run/systemd/system ]]; then
    run systemctl daemon-reload
fi

say "done; enable the daemon with: systemctl enable --now wicd.socket"
say "on a machine that suspends or hibernates, also: systemctl enable wic-sleep.service"
say "with [shim] gpus listing wic's GPUs, to set their compute mode at boot: systemctl enable wic-compute-mode.service"
