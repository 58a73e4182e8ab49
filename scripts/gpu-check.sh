#!/usr/bin/env bash
# The GPU check: runs every GPU path of inferd on a machine with an NVIDIA GPU, from the bundle that
# scripts/gpu-bundle.sh made, and ends with one table (also written to RESULTS/table.md). Exits 1 if any check
# failed. What it runs and checks is in gpu_check.py, beside this script in the bundle.
#
#   gpu-check.sh target/gpu-bundle/inferd-gpu.tar.xz [RESULTS]   # unpacks the bundle into a temporary folder
#   inferd-gpu/gpu-check.sh [RESULTS]                            # from an unpacked bundle
#
# The machine needs the NVIDIA driver, NVIDIA's cuBLAS, cuRAND, CUDA runtime and NVRTC libraries (from its Python's
# nvidia-* wheels, or on LD_LIBRARY_PATH), and python3; nothing is downloaded. RESULTS defaults to
# /tmp/inferd-gpu-check.
set -euo pipefail
command -v python3 >/dev/null || { echo "gpu-check: python3 is needed (its standard library only)" >&2; exit 2; }
if [ $# -gt 0 ] && [[ $1 == *.tar.xz ]]; then
    archive=$1
    shift
    unpacked=$(mktemp -d)
    trap 'rm -rf "$unpacked"' EXIT
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="tar")' "$archive" "$unpacked"
    python3 "$unpacked/inferd-gpu/gpu_check.py" --bundle "$unpacked/inferd-gpu" "$@"
else
    here=$(cd "$(dirname "$0")" && pwd)
    [ -x "$here/bin/inferd" ] || { echo "gpu-check: run it from the bundle, or give it the bundle's archive" >&2; exit 2; }
    exec python3 "$here/gpu_check.py" --bundle "$here" "$@"
fi
