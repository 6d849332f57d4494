#!/usr/bin/env bash
# Builds and runs everything of device/ on a machine with an NVIDIA GPU (stock driver):
# the CMake build and install, a project that finds the installed package, the transport test,
# the misuse test, the newcomer's loop per transport (tests/newcomer.sh),
# the transport benchmark, the applications in every mode (median of REPS runs each), the
# inter-GPU applications where there are two GPUs, each application's bound
# (bench/bounds.py), the cost of fault-stalled warps to the warps beside them
# (bench/stall_cost.cu), and the calibration benchmarks.
# Usage: device/run.sh [OUT_DIR] [REPS]    Results and logs go to OUT_DIR (default target/device).
# SKIP (environment): steps to leave out, among transport (the benchmark), apps, stall and calibration,
# e.g. SKIP="calibration" to stay within a shorter time limit. APP_LIMIT: seconds after which an
# application counts as stuck (default 600).
# Reads the GPU's state; never changes its settings.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-${OUT:-target/device}}
reps=${2:-7}
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
skip=" ${SKIP:-} "
wanted() { [[ $skip != *" $1 "* ]]; }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"
nvcc --version | tail -1 | tee -a "$out/device.txt"

echo "== build, install, find_package"
cmake -S "$here" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release >"$out/build.log" 2>&1
cmake --build "$work/build" >>"$out/build.log" 2>&1
cmake --install "$work/build" --prefix "$work/prefix" >>"$out/build.log" 2>&1
cmake -S "$here/tests/find_package" -B "$work/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" >>"$out/build.log" 2>&1
cmake --build "$work/consumer" >>"$out/build.log" 2>&1
"$work/consumer/uses_wic" && echo "find_package(wic) project builds and runs"

echo "== transport test"
"$work/build/transport_test" | tee "$out/transport_test.txt"
echo "== misuse test"
"$work/build/misuse_test" | tee "$out/misuse_test.txt"
echo "== newcomer's loop"
bash "$here/tests/newcomer.sh" "$work/build/newcomer" | tee "$out/newcomer.txt"

if wanted transport; then
	echo "== transport benchmark"
	bash "$here/bench/transport.sh" "$out/transport"
fi

# An application that has not ended after this long is stuck (a wait without a timeout).
app_limit=${APP_LIMIT:-600}

failed=()
if wanted apps; then
	echo "== applications (median of $reps runs)"
	: >"$out/apps.txt"
	for app in c_srs c_cg c_fe c_h3d; do
		for mode in nowait push poll alg1 launch; do
			# An incorrect result is reported and the rest still run; the script fails at the end.
			timeout "$app_limit" "$work/build/$app" "$mode" "$reps" | tee -a "$out/apps.txt" || failed+=("$app $mode")
		done
	done

	echo "== inter-GPU applications (median of $reps runs)"
	gpus=$(nvidia-smi -L | grep -c '^GPU ' || true)
	if ((gpus >= 2)); then
		: >"$out/apps-2gpu.txt"
		for app in g_stn g_kmn g_c2d g_gem g_bs g_bfs; do
			for mode in nowait push tagged picked poll alg1; do
				# 77: the application found no two GPUs with peer access, and says so.
				rc=0
				timeout "$app_limit" "$work/build/$app" "$mode" "$reps" | tee -a "$out/apps-2gpu.txt" || rc=$?
				if ((rc != 0 && rc != 77)); then
					failed+=("$app $mode")
				fi
			done
		done
	else
		echo "skipped: nvidia-smi lists $gpus GPU(s), they need 2" | tee "$out/apps-2gpu.txt"
	fi

	echo "== bounds"
	if wanted transport; then
		apps_files=("$out/apps.txt")
		[[ -s "$out/apps-2gpu.txt" ]] && apps_files+=("$out/apps-2gpu.txt")
		python3 "$here/bench/bounds.py" "${apps_files[@]}" "$out/transport/transport.jsonl" | tee "$out/bounds.md"
	else
		echo "skipped: they need the transport benchmark's bulk copy of the same run"
	fi
fi

if wanted stall; then
	echo "== stall cost"
	bash "$here/bench/microbench.sh" stall_cost "$out/stall_cost"
fi

if wanted calibration; then
	echo "== calibration benchmarks"
	bash "$here/bench/run.sh" "$out/bench"
fi

if ((${#failed[@]})); then
	echo "FAILED: ${failed[*]}" >&2
	exit 1
fi
