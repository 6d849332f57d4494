#!/usr/bin/env bash
# Builds and runs the transport benchmark (transport.cu) on a machine with an NVIDIA GPU.
#
# Usage: device/bench/transport.sh [OUTPUT_DIR] [--quick]   (default: $OUT if set, else target/transport)
#
# Writes to OUTPUT_DIR: transport.jsonl (one JSON object per measurement, the first naming the
# GPU, driver API version and date) and transport.txt (the table it printed).
# Reads the GPU's state; changes none of its settings.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out=""
if [[ $# -gt 0 && $1 != -* ]]; then
    out=$1
    shift
fi
out="${out:-${OUT:-$repo/target/transport}}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
build="$repo/target/device-bench"
mkdir -p "$build"

source "$here/nvcc.sh" transport.sh

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/device.txt"
"$nvcc" -O2 -arch=sm_90 -std=c++17 -I "$repo/device/include" -I "$repo/ffi/include" \
    -o "$build/transport" "$here/transport.cu" -lcuda
"$build/transport" "$@" "$out/transport.jsonl" | tee "$out/transport.txt"
