# Sourced by the benchmark scripts: sets $nvcc to $NVCC, else nvcc on PATH, else
# /usr/local/cuda/bin/nvcc; exits naming the script ($1) that needed it when there is none.
nvcc="${NVCC:-$(command -v nvcc || true)}"
if [[ -z "$nvcc" && -x /usr/local/cuda/bin/nvcc ]]; then
    nvcc=/usr/local/cuda/bin/nvcc
fi
if [[ -z "$nvcc" ]]; then
    echo "$1: nvcc not found (put it on PATH or set NVCC)" >&2
    exit 1
fi
