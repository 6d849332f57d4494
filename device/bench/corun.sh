#!/usr/bin/env bash
# Builds and runs the co-run benchmark (corun.cu) on a machine with an NVIDIA GPU: what
# consumers waiting for a host producer (--peer: a kernel on GPU 1) cost a kernel sharing the
# GPU with them, per transport.
#
# Usage: device/bench/corun.sh [OUTPUT_DIR] [--quick] [--peer]   (default: $OUT if set, else target/corun)
#
# Writes to OUTPUT_DIR: corun.jsonl (one JSON object per row, the first naming the GPU, driver
# and date), corun.txt (the table it printed) and device.txt.
# Reads the GPU's state; changes none of its settings.
set -euo pipefail
exec bash "$(dirname "${BASH_SOURCE[0]}")/microbench.sh" corun "$@"
