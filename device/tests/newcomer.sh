#!/usr/bin/env bash
# The newcomer's loop (newcomer.cu) for every host-producer transport, with 64 KiB batches, and
# for push also with 4 KiB and 1 MiB batches and without coalesce(). Fails when a run is wrong,
# or when push, coalesced, takes more than 1.25x the bulk copy of the same bytes for 64 KiB
# batches (the target device/README.md states). poll and alg1 stream 64 MiB, the others 512.
# Usage: device/tests/newcomer.sh [NEWCOMER_BINARY]   (default: builds newcomer.cu with nvcc)
# Reads the GPU's state; never changes its settings.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
binary=${1:-}
if [[ -z $binary ]]; then
	source "$here/../bench/nvcc.sh" newcomer.sh
	binary=$(mktemp -d)/newcomer
	"$nvcc" -O2 -arch=sm_90 -std=c++17 -I "$here/../include" -I "$here/../../ffi/include" \
		-o "$binary" "$here/newcomer.cu"
fi
failed=0
run() { "$binary" "$@" || failed=1; }
run push 65536 --coalesce --max-over-bulk 1.25
run push 65536
run push 4096 --coalesce
run push 1048576 --coalesce
run poll 65536 --total 64
run alg1 65536 --total 64
run mapped 65536
run tagged 65536 --coalesce
run tagged 65536
exit $failed
