#!/usr/bin/env bash
# SPDX-License-Identifier: MIT OR Apache-2.0
#
# device/bringup.sh [--bin DIR] [--socket PATH] [--nvcc NVCC] [--arch ARCH] [--gpus LIST] [--user USER]
#                   [--kill-wicd] [--calibration FILE]
#
# The bring-up test of a machine with the patched driver: is the fault transport there, and
# does it work? Run as root on the GPU machine, from the repository (or with --bin pointing at
# wicd, wicctl and libwic.a built elsewhere; default target/release). In order:
#
#   hook          nvidia-uvm is loaded and exports the wic hook (uvm_wic_register); on the stock
#                 driver this fails at once and nothing else runs
#   shim          wic_shim is loaded (/dev/wic), with its max_hold_ms
#   wicd          a wicd serving the shim backend: the one on --socket if it answers, else one
#                 started here (it negotiates the ABI with wic_shim at start and refuses another)
#   service       the wicd on the socket is the installed service: its user (wicd) and its unit's
#                 sandbox; a wicd started here is not (WARN: start wicd.socket for a full pass)
#   access        a user outside the socket's group is refused (the service's wicd only)
#   gpu-sharing   each GPU (of --gpus) against the deployment rule (wicd gpus: EXCLUSIVE_PROCESS
#                 or MIG); WARN, not FAIL, for a shared GPU
#   gpu-ids       nvidia-uvm's ids of the consumer's and the producer's GPU (wic::uvm_gpu_id)
#   batches, calibration
#                 wicd's command batches to the module timed (wicctl stats before and after the
#                 CUDA program's channels of 1-, 16- and 64-page runs) and fitted by wicd
#                 calibrate into the emulator's daemon.submission_ns and daemon.per_page_ns:
#                 written into a calibration file for this machine (--calibration FILE, default
#                 target/bringup/calibration.toml) that `wicd demo --calibration FILE` reads
#   attach, host, timeout, close, gpu-producer, neighbour, process-kill, daemon-death
#                 the CUDA cases of device/tests/bringup.cu (built here with nvcc): bytes checked,
#                 fault -> wake percentiles, a timeout, a channel close, a GPU producer's copy where
#                 two GPUs have peer access, another process's faulting kernel beside a held fault
#                 (what the hold costs it), a process killed with a fault held (gone within a
#                 second, the GPU still running), and wicd killed during a held wait (only a wicd
#                 this script started, or with --kill-wicd)
#
# --gpus LIST runs the CUDA cases on those GPUs alone, the consumer first and the producer
# second: CUDA_VISIBLE_DEVICES's form, UUIDs (GPU-..., MIG-...) or indexes, e.g.
# --gpus GPU-f8b6392b-54c8-ef74-2dc3-c6ed7bde1ec5,GPU-6871d114-5c34-a5ec-0b30-451b680ec522. Without
# it they run on the first two GPUs CUDA sees: on a shared server, name GPUs no one else uses.
#
# --user USER runs the CUDA cases as USER, a member of the socket's group, as applications run
# (default: the user sudo ran this for, if that user is in the group); as root they WARN.
#
# Prints one table and exits 0 only when every check passed: 1 when one failed, 3 when none
# failed but one warned or was skipped (not a full pass: a shared GPU, one GPU where a case needs
# two), 2 for bad arguments. A wicd it started is stopped however it ends, interrupted included.
set -uo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
bin=$repo/target/release
socket=${WIC_SOCKET:-/run/wic/wicd.sock}
nvcc=${NVCC:-nvcc}
arch=native # nvcc's -arch: the GPUs of this machine
kill_wicd=0
gpus=
user=
calibration=$repo/target/bringup/calibration.toml

while (($#)); do
	case $1 in
	--bin) bin=${2:?--bin DIR}; shift ;;
	--socket) socket=${2:?--socket PATH}; shift ;;
	--nvcc) nvcc=${2:?--nvcc NVCC}; shift ;;
	--arch) arch=${2:?--arch ARCH}; shift ;;
	--gpus) gpus=${2:?--gpus LIST}; shift ;;
	--user) user=${2:?--user USER}; shift ;;
	--kill-wicd) kill_wicd=1 ;;
	--calibration) calibration=${2:?--calibration FILE}; shift ;;
	*) echo "usage: device/bringup.sh [--bin DIR] [--socket PATH] [--nvcc NVCC] [--arch ARCH] [--gpus LIST] [--user USER] [--kill-wicd] [--calibration FILE]" >&2; exit 2 ;;
	esac
	shift
done

rows=()
row() { rows+=("$1|$2|$3"); }
work=$(mktemp -d "${TMPDIR:-/tmp}/wic-bringup.XXXXXX")
own_wicd=

stop_own_wicd() {
	if [[ -n $own_wicd ]] && kill -0 "$own_wicd" 2>/dev/null; then
		kill -TERM "$own_wicd" 2>/dev/null
		wait "$own_wicd" 2>/dev/null
	fi
	own_wicd=
}
# However the script ends (an error, a signal, a lost terminal), the wicd started here must not
# stay holding /dev/wic.
trap 'stop_own_wicd; rm -rf "$work"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

finish() {
	stop_own_wicd
	printf '%-14s %-6s %s\n' CHECK RESULT DETAIL
	local status=0 r name result detail
	for r in "${rows[@]}"; do
		IFS='|' read -r name result detail <<<"$r"
		printf '%-14s %-6s %s\n' "$name" "$result" "$detail"
		case $result in
		FAIL) status=1 ;;
		WARN | SKIP) ((status == 1)) || status=3 ;;
		esac
	done
	rm -rf "$work"
	exit "$status"
}

# hook: the patched nvidia-uvm, or nothing else can run. nvidia-uvm loads with the first CUDA
# process; nvidia-modprobe loads it as CUDA would.
if [[ ! -d /sys/module/nvidia_uvm ]] && command -v nvidia-modprobe >/dev/null; then
	nvidia-modprobe -u -c=0 >/dev/null 2>&1
fi
if [[ ! -d /sys/module/nvidia_uvm ]]; then
	row hook FAIL "nvidia-uvm is not loaded (no NVIDIA driver, or no CUDA process has loaded it yet: modprobe nvidia-uvm)"
	finish
fi
uvm_version=$(cat /sys/module/nvidia_uvm/version 2>/dev/null || echo "of unknown version")
if ! grep -qE '[[:space:]]uvm_wic_register($|[[:space:]])' /proc/kallsyms; then
	row hook FAIL "nvidia-uvm $uvm_version has no wic hook (it exports no uvm_wic_register): this is NVIDIA's stock driver; install the patched nvidia-uvm (deploy/dkms/README.md)"
	finish
fi
row hook PASS "nvidia-uvm $uvm_version exports the wic hook"

# versions: nvidia-uvm built from another release than the nvidia module it runs on.
nvidia_version=$(cat /sys/module/nvidia/version 2>/dev/null)
if [[ $uvm_version != "$nvidia_version" ]]; then
	row versions FAIL "nvidia-uvm $uvm_version runs on nvidia ${nvidia_version:-(not loaded)}: rebuild wic for the installed driver (deploy/dkms/README.md)"
	finish
fi
row versions PASS "nvidia and nvidia-uvm are both $uvm_version"

# shim
if [[ ! -d /sys/module/wic_shim || ! -c /dev/wic ]]; then
	row shim FAIL "wic_shim is not loaded (modprobe wic_shim)"
	finish
fi
row shim PASS "wic_shim loaded, /dev/wic present, max_hold_ms $(cat /sys/module/wic_shim/parameters/max_hold_ms 2>/dev/null)"

# wicd on the shim backend: the running one, or one of our own.
for tool in wicd wicctl libwic.a; do
	[[ -e $bin/$tool ]] || { row wicd FAIL "$bin/$tool missing (cargo build --release, or --bin DIR)"; finish; }
done
status=$("$bin/wicctl" --socket "$socket" --timeout-ms 3000 status --json 2>/dev/null)
if [[ -n $status ]]; then
	backend=$(sed -n 's/.*"backend": *"\([a-z]*\)".*/\1/p' <<<"$status")
	pid=$(sed -n 's/.*"pid": *\([0-9]*\).*/\1/p' <<<"$status")
	if [[ $backend != shim ]]; then
		row wicd FAIL "the wicd on $socket serves the $backend backend, not shim"
		finish
	fi
	row wicd PASS "the running wicd (pid $pid) on $socket, shim backend"
	((kill_wicd)) || pid=
else
	if [[ $(id -u) != 0 ]]; then
		row wicd FAIL "no wicd answers on $socket, and only root can start one on /dev/wic"
		finish
	fi
	socket=$work/wicd.sock
	"$bin/wicd" serve --backend shim --socket "$socket" >"$work/wicd.log" 2>&1 &
	own_wicd=$!
	pid=$own_wicd
	for _ in $(seq 100); do
		[[ -S $socket ]] && break
		kill -0 "$own_wicd" 2>/dev/null || break
		sleep 0.1
	done
	if [[ ! -S $socket ]]; then
		row wicd FAIL "wicd serve --backend shim did not start: $(tail -n 1 "$work/wicd.log")"
		own_wicd=
		finish
	fi
	row wicd PASS "wicd started here (pid $pid) on the shim backend: the module's ABI agreed"
fi

# service: the applications' wicd is the installed unit's, as its user inside its sandbox.
wicd_pid=${own_wicd:-$(sed -n 's/.*"pid": *\([0-9]*\).*/\1/p' <<<"$status")}
if [[ -n $own_wicd ]]; then
	row service WARN "the wicd started here runs as root without the unit's sandbox: start the service (systemctl start wicd.socket) for a full pass"
else
	wicd_uid=$(awk '/^Uid:/ { print $2 }' "/proc/$wicd_pid/status" 2>/dev/null)
	unit=$(sed -n 's/^[0-9]*:[^:]*:.*\/\([^/]*\.service\)$/\1/p' "/proc/$wicd_pid/cgroup" 2>/dev/null | head -n 1)
	if [[ $wicd_uid == "$(id -u wicd 2>/dev/null)" && $unit == wicd.service ]]; then
		row service PASS "wicd (pid $wicd_pid) runs as user wicd in wicd.service's sandbox"
	else
		row service WARN "wicd (pid $wicd_pid) runs as uid ${wicd_uid:-?} in ${unit:-no service unit}, not as wicd.service's user wicd"
	fi
fi

# The group the socket lets in, and whether a user is in it.
group=$(stat -c %G "$socket" 2>/dev/null)
in_group() { id -nG "$1" 2>/dev/null | tr ' ' '\n' | grep -qx "$group"; }

# access: the socket's group decides who reaches wicd. nobody runs a copy of wicctl (wherever
# the repository is), which it must be able to run, so that only wicctl's own refusal counts.
if [[ -n $own_wicd ]]; then
	row access SKIP "the wicd started here listens on a private socket"
elif ! id nobody >/dev/null 2>&1; then
	row access SKIP "no user nobody here to try as an outsider"
elif in_group nobody; then
	row access SKIP "nobody is in the socket's group $group: no outsider to try"
elif ! install -m 0755 "$bin/wicctl" "$work/wicctl" || ! chmod 0755 "$work" ||
	! runuser -u nobody -- "$work/wicctl" --version >/dev/null 2>&1; then
	row access WARN "user nobody cannot run $work/wicctl (a noexec or private TMPDIR?): the outsider was not tried"
elif outsider=$(runuser -u nobody -- "$work/wicctl" --socket "$socket" --timeout-ms 3000 status 2>&1); then
	row access FAIL "user nobody, outside group $group, reached wicd on $socket: check service.socket_mode and socket_group"
elif grep -q "cannot connect to wicd at .*permission denied" <<<"$outsider"; then
	row access PASS "user nobody, outside group $group, is refused on $socket"
else
	row access WARN "user nobody was not refused for want of permission: $outsider"
fi

# gpu-sharing: the deployment rule, GPU by GPU: those of --gpus when it names them all by their
# GPU- UUIDs (an index or a MIG instance does not say which of NVML's GPUs it is: then every
# GPU), and every line that is not a GPU's (an error of wicd gpus).
judged=()
by_uuid=0
if [[ -n $gpus ]]; then
	by_uuid=1
	for gpu in ${gpus//,/ }; do
		[[ $gpu == GPU-* ]] || by_uuid=0
	done
fi
listed() {
	((by_uuid)) && [[ $1 == "GPU "* ]] || return 0
	local gpu
	for gpu in ${gpus//,/ }; do
		if [[ $1 == *"$gpu"* ]]; then
			judged+=("$gpu")
			return 0
		fi
	done
	return 1
}
while IFS= read -r line; do
	listed "$line" || continue
	case $line in
	*"safe for held faults"*) row gpu-sharing PASS "$line" ;;
	*shared:*) row gpu-sharing WARN "$line (docs/operations.md, Held faults and GPU time-slicing)" ;;
	*) row gpu-sharing WARN "$line" ;;
	esac
done < <("$bin/wicd" gpus 2>&1)
# Only when every entry is a GPU- UUID: otherwise every GPU was judged, and nothing was recorded.
if ((by_uuid)); then
	for gpu in ${gpus//,/ }; do
		if [[ " ${judged[*]+${judged[*]}} " != *" $gpu "* ]]; then
			row gpu-sharing WARN "$gpu of --gpus: NVML (wicd gpus) reports no such GPU"
		fi
	done
fi

# The CUDA cases.
if ! "$nvcc" -O2 -arch="$arch" -std=c++17 -I"$repo/device/include" -I"$repo/ffi/include" \
	"$repo/device/tests/bringup.cu" "$bin/libwic.a" -lcuda -lpthread -ldl -lm -o "$work/bringup" >"$work/nvcc.log" 2>&1; then
	row build FAIL "nvcc: $(head -n 1 "$work/nvcc.log")"
	finish
fi
if [[ -n $gpus ]]; then
	export CUDA_VISIBLE_DEVICES=$gpus
fi
# As an application runs: a user of the socket's group, not root (only with the service's wicd,
# whose socket that group reaches).
as_user=()
if [[ -z $own_wicd && -z $pid ]]; then
	if [[ -n $user ]] && ! in_group "$user"; then
		row cases FAIL "--user $user is not in the socket's group $group (usermod -aG $group $user)"
		finish
	fi
	# Else the user sudo ran this for, if that user is in the group.
	if [[ -z $user && -n ${SUDO_USER:-} && ${SUDO_USER:-} != root ]] && in_group "$SUDO_USER"; then
		user=$SUDO_USER
	fi
	if [[ -n $user ]]; then
		chmod 0755 "$work" "$work/bringup"
		as_user=(runuser -u "$user" --)
		row user PASS "the CUDA cases run as $user, a member of group $group"
	else
		row user WARN "the CUDA cases run as root: --user USER (a member of the socket's group) runs them as applications run"
	fi
elif [[ -z $own_wicd ]]; then
	row user WARN "--kill-wicd: the CUDA cases run as root, which may kill the service's wicd"
elif [[ -n $user ]]; then
	row user WARN "--user $user not used: the wicd started here listens on a private socket, so the cases run as root"
fi
# calibration: before the cases, one of which may kill wicd. The stats are cumulative: the
# difference of two snapshots is what wicd submitted meanwhile, the batches case's channels and,
# on the service's wicd, any other client's.
stats() { "$bin/wicctl" --socket "$socket" --timeout-ms 3000 stats --json >"$1" 2>"$work/stats.err"; }
consumer_gpu=${gpus%%,*} # the GPU the batches run on: --gpus's first, else CUDA's first
machine="$(nvidia-smi --query-gpu=name --format=csv,noheader ${consumer_gpu:+-i "$consumer_gpu"} 2>/dev/null | head -n 1), patched nvidia-uvm $uvm_version, device/bringup.sh $(date -u +%F)"
if ! stats "$work/stats-before.json"; then
	row calibration FAIL "wicctl stats: $(head -n 1 "$work/stats.err")"
else
	timeout 120 ${as_user[@]+"${as_user[@]}"} "$work/bringup" --batches "$socket" >"$work/batches.log" 2>&1
	batches_rc=$?
	batches=$(grep -m 1 '^CASE batches ' "$work/batches.log")
	if ((batches_rc != 0)) || [[ $batches != "CASE batches PASS "* ]]; then
		detail=${batches#CASE batches FAIL }
		[[ $batches == "CASE batches FAIL "* ]] || detail="bringup --batches exited $batches_rc: $(tail -n 1 "$work/batches.log")"
		row batches FAIL "$detail"
		row calibration SKIP "no batches to time"
	elif ! stats "$work/stats-after.json"; then
		row batches PASS "${batches#CASE batches PASS }"
		row calibration FAIL "wicctl stats: $(head -n 1 "$work/stats.err")"
	else
		row batches PASS "${batches#CASE batches PASS }"
		mkdir -p "$(dirname "$calibration")"
		if "$bin/wicd" calibrate --before "$work/stats-before.json" --after "$work/stats-after.json" \
			--machine "$machine" --out "$calibration" >"$work/calibrate.log" 2>&1; then
			fitted=$(grep -E '^  daemon\.(submission|per_page)_ns' "$work/calibrate.log" | sed 's/^ *//' | paste -sd ';' -)
			row calibration PASS "$calibration: ${fitted//;/, } (wicd demo --calibration reads it)"
		else
			# The fault transport works; only the measurement did not come out (too few or too
			# alike batches, noise): not a failed machine.
			row calibration WARN "wicd calibrate: $(tail -n 1 "$work/calibrate.log")"
		fi
	fi
fi
timeout 300 ${as_user[@]+"${as_user[@]}"} "$work/bringup" "$socket" ${pid:+"$pid"} >"$work/cases.log" 2>&1
rc=$?
while read -r tag name result detail; do
	[[ $tag == CASE ]] && row "$name" "$result" "$detail"
done <"$work/cases.log"
if ((rc == 124)); then
	row cases FAIL "the CUDA cases did not end within 300 s (a warp never woke)"
elif ((rc != 0)) && ! grep -q ' FAIL ' "$work/cases.log"; then
	row cases FAIL "bringup exited $rc: $(tail -n 1 "$work/cases.log")"
fi
finish
