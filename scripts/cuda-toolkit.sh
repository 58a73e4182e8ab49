#!/usr/bin/env bash
# Prints the path of a CUDA 13 toolkit made without a GPU or NVIDIA's installers, for the GPU bundle
# (scripts/gpu-bundle.sh) and the CUDA image's build stand-in (scripts/image-check.sh --cuda):
#  1. the compiler from NVIDIA's wheels on PyPI (nvcc, NVVM, the headers and the CUDA runtime; about 100 MB, once,
#     into .cache/cuda13);
#  2. link-time stubs of libcuda and of cuBLAS/cuRAND/NVRTC (scripts/cuda-link-stubs.sh) in its lib/stubs folder,
#     where cudarc's build looks: binaries link there and load the real libraries on a GPU machine.
# The path printed is the toolkit's root (bin/nvcc, include/, lib/, lib/stubs/, nvvm/).
set -euo pipefail
cd "$(dirname "$0")/.."

WHEELS=(nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-cuda-runtime==13.0.96
        nvidia-cuda-cccl==13.0.85)
CUDA_DIR=$(realpath -m "${INFERD_CACHE_DIR:-$PWD/.cache}")/cuda13

# 1. The compiler.
STAMP="$CUDA_DIR/installed: ${WHEELS[*]}"
if [ ! -f "$STAMP" ]; then
    echo "cuda-toolkit: fetching the CUDA 13 compiler wheels into $CUDA_DIR" >&2
    rm -rf "$CUDA_DIR"
    python3 -m pip install --quiet --disable-pip-version-check --no-deps --target "$CUDA_DIR/site" "${WHEELS[@]}"
    touch "$STAMP"
fi
CUDA_ROOT="$CUDA_DIR/site/nvidia/cu13"
# The wheel has the CUDA runtime (which candle's MoE kernels link) without the toolkit's unversioned link name.
ln -sfn libcudart.so.13 "$CUDA_ROOT/lib/libcudart.so"

# 2. The link stubs, made again whenever cudarc or the generator changes.
FEATURES=inferd-server/cuda,inferd-benches/cuda,inferd-candle/cuda
cudarc=$(cargo metadata --locked --format-version 1 --features "$FEATURES" --filter-platform "$(rustc -vV | sed -n 's/^host: //p')" \
    | python3 -c 'import json,sys,os; print(next(os.path.dirname(p["manifest_path"]) for p in json.load(sys.stdin)["packages"] if p["name"] == "cudarc"))')
STUBS="$CUDA_ROOT/lib/stubs"
STUB_STAMP="$STUBS/made-from-$(basename "$cudarc")-$(sha256sum scripts/cuda-link-stubs.sh | cut -c1-16)"
if [ ! -f "$STUB_STAMP" ]; then
    rm -rf "$STUBS"
    scripts/cuda-link-stubs.sh "$cudarc" "$STUBS"
    touch "$STUB_STAMP"
fi
echo "$CUDA_ROOT"
