#!/usr/bin/env bash
# Boots an installed Debian kernel under qemu (KVM when available) with a small busybox
# initramfs holding wic's kernel modules and the given binaries, runs one command inside it and
# judges the run by the command's exit status and the kernel's log. See tests/vm/README.md.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: tests/vm/run.sh --out DIR [options] [-- COMMAND [ARGS...]]
       tests/vm/run.sh --check

  --out DIR           results: DIR/console.log, files the command sends back, DIR/work (initramfs)
  --bin PATH          copy an executable to /bin in the guest, with the shared libraries it needs
  --file SRC:DEST     copy a file or directory to DEST (an absolute path) in the guest
  --timeout SECONDS   wall-clock limit for the whole boot (default 300)
  --no-modules        do not build or load wic_shim.ko / wic_fakegpu.ko
  --check             report which prerequisites are missing, install nothing, exit 0 if none
  -h, --help          this text

Without COMMAND the guest starts an interactive shell on the terminal.
Environment: WIC_VM_KVER (kernel release to boot), WIC_VM_IGNORE (extended regex of kernel log
lines not to count as failures), WIC_VM_MEM (MiB, default 1024), WIC_VM_SMP (default 2),
WIC_VM_ACCEL (kvm or tcg; default kvm when /dev/kvm is usable).
EOF
}

die() {
    printf 'wic-vm: error: %s\n' "$*" >&2
    exit 2
}
note() { printf 'wic-vm: %s\n' "$*" >&2; }

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

out=
bins=()
files=()
timeout_s=300
modules=1
check_only=0
command_args=()
while (($#)); do
    case $1 in
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    --bin) bins+=("${2:?--bin needs a path}"); shift 2 ;;
    --file) files+=("${2:?--file needs SRC:DEST}"); shift 2 ;;
    --timeout) timeout_s=${2:?--timeout needs seconds}; shift 2 ;;
    --no-modules) modules=0; shift ;;
    --check) check_only=1; shift ;;
    -h | --help) usage; exit 0 ;;
    --) shift; command_args=("$@"); break ;;
    *) usage >&2; die "unknown argument: $1" ;;
    esac
done
if ! [[ $timeout_s =~ ^[1-9][0-9]*$ ]]; then die "--timeout wants a positive number of seconds"; fi

# --- Prerequisites --------------------------------------------------------------------------

is_root() { [[ $(id -u) == 0 ]]; }
can_install() { is_root && command -v apt-get >/dev/null; }

apt_install() {
    note "installing $* (apt-get)"
    local apt=(apt-get -y -q -o DPkg::Lock::Timeout=600 install --no-install-recommends)
    if ! DEBIAN_FRONTEND=noninteractive "${apt[@]}" "$@" >&2; then
        DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout=600 update >&2 || true
        DEBIAN_FRONTEND=noninteractive "${apt[@]}" "$@" >&2 || die "apt-get install $* failed"
    fi
}

# The newest kernel release with both an image in /boot and headers to build modules against.
find_kver() {
    local image kver
    for image in /boot/vmlinuz-*; do
        [[ -e $image ]] || continue
        kver=${image#/boot/vmlinuz-}
        [[ -d /lib/modules/$kver/build ]] && printf '%s\n' "$kver"
    done | sort -V | tail -n 1
}

kernel_ok() { [[ -n $1 && -r /boot/vmlinuz-$1 && -d /lib/modules/$1/build ]]; }
busybox_ok() { [[ -x /bin/busybox ]] && ! ldd /bin/busybox >/dev/null 2>&1; }
tool_ok() { command -v "$1" >/dev/null; }

# name:package:test pairs for the tools.
tools=(qemu-system-x86_64:qemu-system-x86 cpio:cpio gzip:gzip timeout:coreutils flock:util-linux)
((modules)) && tools+=(make:make)

missing() {
    local kver=${WIC_VM_KVER:-$(find_kver)} entry
    if ! kernel_ok "$kver"; then
        if [[ -n ${WIC_VM_KVER:-} ]]; then
            echo "kernel $kver (linux-image-$kver linux-headers-$kver; /boot/vmlinuz-$kver must be readable)"
        else
            echo "a kernel image with headers (linux-image-amd64 linux-headers-amd64)"
        fi
    fi
    busybox_ok || echo "a static /bin/busybox (busybox-static)"
    for entry in "${tools[@]}"; do
        tool_ok "${entry%%:*}" || echo "${entry%%:*} (${entry#*:})"
    done
}

if ((check_only)); then
    gaps=$(missing)
    if [[ -n $gaps ]]; then
        while read -r gap; do echo "missing: $gap"; done <<<"$gaps"
        exit 1
    fi
    echo "all prerequisites present (kernel ${WIC_VM_KVER:-$(find_kver)})"
    exit 0
fi

[[ -n $out ]] || { usage >&2; die "--out DIR is required"; }

ensure_prerequisites() {
    local kver=${WIC_VM_KVER:-$(find_kver)} entry want=()
    if ! kernel_ok "$kver"; then
        if [[ -n ${WIC_VM_KVER:-} ]]; then
            want+=("linux-image-$kver" "linux-headers-$kver")
        else
            want+=(linux-image-amd64 linux-headers-amd64)
        fi
    fi
    busybox_ok || want+=(busybox-static)
    for entry in "${tools[@]}"; do
        tool_ok "${entry%%:*}" || want+=("${entry#*:}")
    done
    ((${#want[@]})) || return 0
    can_install || die "missing prerequisites: $(missing | paste -sd ';' -); install them (as root: apt-get install ${want[*]})"
    apt_install "${want[@]}"
    local gaps
    gaps=$(missing)
    [[ -z $gaps ]] || die "still missing after installing: $gaps"
}
ensure_prerequisites
kver=${WIC_VM_KVER:-$(find_kver)}
kernel=/boot/vmlinuz-$kver

# --- Output directory -------------------------------------------------------------------------

# Only a directory this script made before (marked) or an empty one is emptied.
mkdir -p "$out"
out=$(cd "$out" && pwd)
if [[ -n $(ls -A "$out") && ! -e $out/.wic-vm ]]; then
    die "$out is not empty and was not made by this script; refusing to clear it"
fi
find "$out" -mindepth 1 -delete
touch "$out/.wic-vm"
work=$out/work
root=$work/root
mkdir -p "$root"

# --- Kernel modules ---------------------------------------------------------------------------

mkdir -p "$root/lib/wic"
if ((modules)); then
    note "building the kernel modules against $kver"
    # Kbuild writes into the source tree: one build at a time.
    flock "$repo/shim" make -C "$repo/shim" KVER="$kver" FAKEGPU=1 >"$work/modules.log" 2>&1 || {
        cat "$work/modules.log" >&2
        die "building the kernel modules failed"
    }
    for ko in "$repo/shim/test/wic_fakegpu.ko" "$repo/shim/wic_shim.ko"; do
        [[ -f $ko ]] || die "the module build did not produce $ko"
        cp "$ko" "$root/lib/wic/"
    done
fi

# --- Initramfs --------------------------------------------------------------------------------

mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,dev,proc,sys,tmp,run,root,etc,lib64}
chmod 1777 "$root/tmp"
cp /bin/busybox "$root/bin/busybox"
while read -r applet; do
    [[ $applet == bin/busybox || -e $root/$applet ]] && continue
    ln -s /bin/busybox "$root/$applet"
done < <(/bin/busybox --list-full)
# With a console node in the archive the kernel hands /init its stdio; /init also reopens
# /dev/console after mounting devtmpfs, for when this is not run as root.
mknod -m 600 "$root/dev/console" c 5 1 2>/dev/null || true
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$root/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"

# Copies a host file to the same path in the guest (following links).
copy_same_path() {
    [[ -e $root$1 ]] && return 0
    mkdir -p "$root$(dirname "$1")"
    cp -L "$1" "$root$1"
}

copy_bin() {
    local bin=$1 lib
    [[ -f $bin && -x $bin ]] || die "--bin $bin: not an executable file"
    rm -f "$root/bin/$(basename "$bin")"
    cp -L "$bin" "$root/bin/"
    # ldd lists "name => /path (addr)" and "/path (addr)" (the loader); static binaries fail it.
    while read -r lib; do
        copy_same_path "$lib"
    done < <(ldd "$bin" 2>/dev/null | sed -nE 's|.*=> (/[^ ]+) .*|\1|p; s|^[[:space:]]*(/[^ ]+) \(0x.*|\1|p')
}
for bin in "${bins[@]}"; do copy_bin "$bin"; done

for spec in "${files[@]}"; do
    [[ $spec == *:* ]] || die "--file $spec: want SRC:DEST"
    src=${spec%:*}
    dest=${spec##*:}
    [[ $dest == /* ]] || die "--file $spec: DEST must be an absolute path"
    [[ -e $src ]] || die "--file $spec: $src does not exist"
    [[ $dest == */ ]] && dest=$dest$(basename "$src")
    mkdir -p "$root$(dirname "$dest")"
    rm -rf "${root:?}$dest"
    cp -RL "$src" "$root$dest"
done

# Quotes a word for sh.
squote() { printf "'%s'" "${1//\'/\'\\\'\'}"; }
quoted=
for arg in "${command_args[@]}"; do quoted+=" $(squote "$arg")"; done

cat >"$root/init" <<EOF
#!/bin/busybox sh
# Generated by tests/vm/run.sh.
export PATH=/bin:/sbin:/usr/bin:/usr/sbin HOME=/root TERM=linux
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
ln -sf /proc/self/fd /dev/fd
ln -sf /proc/self/fd/0 /dev/stdin
ln -sf /proc/self/fd/1 /dev/stdout
ln -sf /proc/self/fd/2 /dev/stderr
hostname wic-vm
# Warnings and worse reach the console as they happen, the rest only the dmesg dump.
echo 5 >/proc/sys/kernel/printk
for module in wic_fakegpu wic_shim; do
    if [ -e /lib/wic/\$module.ko ]; then
        insmod /lib/wic/\$module.ko || echo "WIC-VM: insmod \$module.ko failed with status \$?"
    fi
done
echo "WIC-VM: booted \$(uname -r)"
set --$quoted
cd /
if [ \$# -eq 0 ]; then
    setsid cttyhack sh -l
    status=\$?
elif command -v "\$1" >/dev/null 2>&1; then
    ( "\$@" ) </dev/null
    status=\$?
else
    ( sh -c "\$*" ) </dev/null
    status=\$?
fi
echo "WIC-VM-EXIT: \$status"
echo "WIC-VM-TAINT: \$(cat /proc/sys/kernel/tainted)"
echo WIC-VM-DMESG-BEGIN
dmesg
echo WIC-VM-DMESG-END
sync
poweroff -f
while :; do sleep 60; done
EOF
chmod 755 "$root/init"

initrd=$work/initramfs.cpio.gz
(cd "$root" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --owner=0:0 --quiet) | gzip -1 >"$initrd"

# --- Boot -------------------------------------------------------------------------------------

# KVM needs /dev/kvm and hardware virtualization behind it (kvm_intel or kvm_amd): some nested
# setups offer a /dev/kvm that only runs specially built guest kernels (kvm_pvm, for one).
accel=${WIC_VM_ACCEL:-}
if [[ -z $accel ]]; then
    if [[ ! -r /dev/kvm || ! -w /dev/kvm ]]; then
        note "no usable /dev/kvm: emulating the CPU (tcg), which is much slower"
        accel=tcg
    elif [[ ! -d /sys/module/kvm_intel && ! -d /sys/module/kvm_amd ]]; then
        note "/dev/kvm is not backed by kvm_intel or kvm_amd: emulating the CPU (tcg), which is much slower (WIC_VM_ACCEL=kvm forces KVM)"
        accel=tcg
    else
        accel=kvm
    fi
fi
case $accel in
kvm) accel_args=(-enable-kvm -cpu host) ;;
tcg) accel_args=(-accel tcg) ;;
*) die "WIC_VM_ACCEL must be kvm or tcg" ;;
esac

append="console=ttyS0 rdinit=/init quiet loglevel=4 printk.time=1 panic=-1 panic_on_warn=0"
qemu=(qemu-system-x86_64 "${accel_args[@]}" -m "${WIC_VM_MEM:-1024}" -smp "${WIC_VM_SMP:-2}"
    -nodefaults -display none -no-reboot
    -kernel "$kernel" -initrd "$initrd" -append "$append")
log=$out/console.log
note "booting $kver ($accel, timeout ${timeout_s}s); console in $log"
start=$(date +%s%N)
set +e
if ((${#command_args[@]})); then
    timeout --kill-after=10 "$timeout_s" "${qemu[@]}" -serial stdio </dev/null | sed -u 's/\r//g' | tee "$log"
    qemu_status=${PIPESTATUS[0]}
else
    timeout --foreground --kill-after=10 "$timeout_s" "${qemu[@]}" -serial mon:stdio | sed -u 's/\r//g' | tee "$log"
    qemu_status=${PIPESTATUS[0]}
fi
set -e
elapsed_ms=$((($(date +%s%N) - start) / 1000000))
elapsed=$(printf '%d.%03d' $((elapsed_ms / 1000)) $((elapsed_ms % 1000)))

# --- Verdict ----------------------------------------------------------------------------------

failures=()

# Files sent back: WIC-VM-FILE-BEGIN NAME ... WIC-VM-FILE-END NAME. Kernel messages (lines
# starting with a printk timestamp) that land inside a block are left out.
if ! file_errors=$(awk -v dir="$out" '
    function bad(msg) { print msg; failed = 1 }
    /^WIC-VM-FILE-BEGIN / {
        if (open != "") bad("file " open ": WIC-VM-FILE-BEGIN before its end")
        name = $2
        if (name !~ /^[A-Za-z0-9._-]+$/ || name == "." || name == ".." || name == "console.log" || name == "work" || name == ".wic-vm") {
            bad("file name not allowed: " name); open = ""; skipping = 1; next
        }
        open = name; skipping = 0; path = dir "/" name; printf "" > path; next
    }
    /^WIC-VM-FILE-END / {
        if (open == "" && !skipping) bad("WIC-VM-FILE-END without a begin: " $2)
        else if (open != "" && $2 != open) bad("file " open ": ended as " $2)
        if (open != "") close(path)
        open = ""; skipping = 0; next
    }
    open != "" && !/^\[ *[0-9]+\.[0-9]+\] / { print > path }
    END { if (open != "") bad("file " open ": no WIC-VM-FILE-END"); exit failed }
' "$log"); then
    failures+=("files sent back: $file_errors")
fi

if [[ $qemu_status == 124 || $qemu_status == 137 ]]; then
    failures+=("timed out after ${timeout_s}s")
elif [[ $qemu_status != 0 ]]; then
    failures+=("qemu exited with status $qemu_status")
fi

exit_line=$(grep -a -m1 '^WIC-VM-EXIT: ' "$log" || true)
if [[ -z $exit_line ]]; then
    failures+=("no WIC-VM-EXIT line: the command did not finish")
elif [[ ${exit_line#WIC-VM-EXIT: } != 0 ]]; then
    failures+=("the command exited with status ${exit_line#WIC-VM-EXIT: }")
fi

load_failures=$(grep -a '^WIC-VM: insmod ' "$log" || true)
[[ -z $load_failures ]] || failures+=("a module did not load:"$'\n'"$load_failures")

# Taint flags that mean trouble: B (bad page), D (oops), W (warning), L (soft lockup).
taint=$(sed -n 's/^WIC-VM-TAINT: \([0-9]*\)$/\1/p' "$log" | head -n 1)
if [[ -n $taint ]] && ((taint & (32 | 128 | 512 | 16384))); then
    failures+=("the kernel is tainted ($taint: bad page, oops, warning or soft lockup)")
fi

# Kernel messages carry a printk timestamp; only those are searched, so the command's own
# output may say WARNING.
problems='WARNING:|BUG:|Oops|general protection fault|Kernel panic|Call Trace:|UBSAN:|KASAN:|KFENCE:|RCU stall|rcu: INFO:|detected stall|hung_task|INFO: task|soft lockup|hard LOCKUP|kernel BUG at'
expected='module verification failed|loading out-of-tree module taints kernel'
[[ -n ${WIC_VM_IGNORE:-} ]] && expected+="|$WIC_VM_IGNORE"
# The dmesg dump repeats what the console showed live: each message is listed once.
kernel_problems=$(grep -a -n -E '\[ *[0-9]+\.[0-9]{6}\] ' "$log" | grep -a -E "$problems" | grep -a -v -E "$expected" |
    awk '!seen[substr($0, index($0, ":") + 1)]++' || true)
if [[ -n $kernel_problems ]]; then
    failures+=("the kernel log reports problems:"$'\n'"$kernel_problems")
fi

if ((${#failures[@]})); then
    printf 'WIC-VM: FAIL (%s, %s s)\n' "$accel" "$elapsed" >&2
    printf '  %s\n' "${failures[@]}" >&2
    exit 1
fi
printf 'WIC-VM: PASS (%s, %s s)\n' "$accel" "$elapsed" >&2
