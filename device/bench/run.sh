#!/usr/bin/env bash
# Builds and runs the GPU calibration benchmarks, then derives a calibration file for the emulator.
#
# Usage: device/bench/run.sh [OUTPUT_DIR]     (default: $OUT if set, else target/calibration)
#
# Writes to OUTPUT_DIR: calibration-results.json (every raw number, with the GPU's identity),
# calibration-gpu.toml (emu's calibration with the measured constants), calibrate.log, derive.log.
# Reads the GPU's settings and changes none of them.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="${1:-${OUT:-$repo/target/calibration}}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
build="$repo/target/device-bench"
mkdir -p "$build"

source "$here/nvcc.sh" run.sh
python="${PYTHON:-python3}"

echo "== GPU"
nvidia-smi --query-gpu=name,driver_version --format=csv
"$nvcc" --version | tail -n 2

echo "== build"
"$nvcc" -O2 -arch=sm_90 -std=c++17 -o "$build/calibrate" "$here/calibrate.cu"

echo "== measure"
"$build/calibrate" "$out/calibration-results.json" 2>&1 | tee "$out/calibrate.log"

echo "== derive"
"$python" "$here/derive.py" "$out/calibration-results.json" "$repo/emu/calibration.toml" \
    "$out/calibration-gpu.toml" 2>&1 | tee "$out/derive.log"

echo "== done: $out/calibration-gpu.toml, $out/calibration-results.json"
