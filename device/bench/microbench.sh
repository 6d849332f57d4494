#!/usr/bin/env bash
# Builds and runs one of the benchmarks that write JSON lines (NAME.cu in this folder) on a
# machine with an NVIDIA GPU.
#
# Usage: device/bench/microbench.sh NAME [OUTPUT_DIR] [OPTIONS...]
#        (NAME: transport, stall_cost or corun; default OUTPUT_DIR: $OUT if set, else
#        target/NAME; OPTIONS go to the benchmark: --quick, for transport --spin,
#        --streaming, --launch or --peer, for corun --peer)
#
# Writes to OUTPUT_DIR: NAME.jsonl (one JSON object per measurement, the first naming the GPU,
# driver API version and date), NAME.txt (the table it printed) and device.txt.
# Reads the GPU's state; changes none of its settings.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
name=${1:?usage: microbench.sh NAME [OUTPUT_DIR] [OPTIONS...]}
shift
if [[ ! -f "$here/$name.cu" ]]; then
    echo "microbench.sh: no benchmark $name ($here/$name.cu)" >&2
    exit 2
fi
out=""
if [[ $# -gt 0 && $1 != -* ]]; then
    out=$1
    shift
fi
out="${out:-${OUT:-$repo/target/$name}}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
build="$repo/target/device-bench"
mkdir -p "$build"

source "$here/nvcc.sh" "$name"

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/device.txt"
"$nvcc" -O2 -arch=sm_90 -std=c++17 -I "$repo/device/include" -I "$repo/ffi/include" \
    -o "$build/$name" "$here/$name.cu" -lcuda
"$build/$name" "$@" "$out/$name.jsonl" | tee "$out/$name.txt"
