#!/usr/bin/env bash
# Proves that the GPU build compiles: `cargo check --features cuda`, which builds candle's CUDA kernels with nvcc.
# Debian has no CUDA toolkit, so nvcc comes from NVIDIA's CUDA 13 wheels on PyPI (about 100 MB), unpacked once into
# .cache/cuda13: a second run downloads nothing. No GPU or driver is needed: `cargo check` links nothing.
# CUDA_COMPUTE_CAP picks the kernels' target (90: H100; CUDA 13 compiles for 75 and newer only).
set -euo pipefail
cd "$(dirname "$0")/.."

WHEELS=(nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-cuda-runtime==13.0.96
        nvidia-cuda-cccl==13.0.85)
CUDA_DIR=.cache/cuda13
STAMP="$CUDA_DIR/installed: ${WHEELS[*]}"
if [ ! -f "$STAMP" ]; then
    echo "check-cuda: fetching the CUDA 13 compiler wheels into $CUDA_DIR" >&2
    rm -rf "$CUDA_DIR"
    python3 -m pip install --quiet --disable-pip-version-check --no-deps --target "$CUDA_DIR/site" "${WHEELS[@]}"
    touch "$STAMP"
fi
export CUDA_ROOT="$PWD/$CUDA_DIR/site/nvidia/cu13"
export CUDA_PATH="$CUDA_ROOT"
export PATH="$CUDA_ROOT/bin:$PATH"
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
nvcc --version | tail -n 2 >&2
# Its own target folder, so the CPU build's artefacts stay valid.
cargo check --locked -p inferd-server --features cuda --target-dir target/cuda
