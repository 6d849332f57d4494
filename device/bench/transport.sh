#!/usr/bin/env bash
# Builds and runs the transport benchmark (transport.cu) on a machine with an NVIDIA GPU.
#
# Usage: device/bench/transport.sh [OUTPUT_DIR] [--quick] [--spin | --streaming | --launch | --peer]   (default: $OUT if set, else target/transport)
#
# Writes to OUTPUT_DIR: transport.jsonl (one JSON object per measurement, the first naming the
# GPU, driver API version and date) and transport.txt (the table it printed).
# Reads the GPU's state; changes none of its settings.
set -euo pipefail
exec bash "$(dirname "${BASH_SOURCE[0]}")/microbench.sh" transport "$@"
