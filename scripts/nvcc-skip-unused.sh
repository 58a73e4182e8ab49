#!/usr/bin/env bash
# nvcc for the GPU bundle's build (scripts/gpu-bundle.sh installs it beside the toolkit's nvcc and names it in NVCC,
# which candle's kernel build runs): every argument goes to the real nvcc unchanged, except that candle-kernels'
# static library of quantised (GGUF) and mixture-of-experts kernels compiles from an empty source. inferd calls
# none of them (it runs no GGUF weights and no MoE layers), yet candle builds that library for every CUDA build: 15
# files, 7 of the build's 14 minutes on two cores. The library is left with no symbols, so were inferd's code ever to
# reach one of those kernels, the link would fail naming it: no binary is made that lacks what it calls.
set -euo pipefail
nvcc=$(dirname "$0")/nvcc
# The source is the last argument, relative to the crate's folder where candle's build gives it so.
source=${*: -1}
[[ $source = /* ]] || source=$PWD/$source
case "$source" in
*/candle-kernels-*/src/moe/*.cu | */candle-kernels-*/src/mmq_gguf/*.cu | */candle-kernels-*/src/mmvq_gguf.cu)
    empty=$(mktemp --suffix=.cu)
    trap 'rm -f "$empty"' EXIT
    "$nvcc" "${@:1:$#-1}" "$empty"
    ;;
*)
    exec "$nvcc" "$@"
    ;;
esac
