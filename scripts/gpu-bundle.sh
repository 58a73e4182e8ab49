#!/usr/bin/env bash
# Builds the GPU bundle on a machine without a GPU: everything scripts/gpu-check.sh needs to run inferd's GPU paths
# on a GPU machine that has no Rust toolchain and no network. Prints the bundle folder's path as its last line.
#
#  1. The CUDA 13 compiler from NVIDIA's wheels on PyPI (about 100 MB, once, into .cache/cuda13), and
#  2. link-time stubs of libcuda and of cuBLAS/cuRAND/NVRTC in its lib/stubs folder: scripts/cuda-toolkit.sh.
#     The binaries link there and load the real libraries on the GPU machine.
#  3. `cargo build --release --features cuda` of `inferd` and `inferd-bench`, and the GPU test executables
#     (`cargo test --release --no-run --features cuda`): as root with buildah, in the CPU image's builder on its
#     target folder (reusing what the image build compiled), else in target/cuda so the CPU build stays valid.
#     candle's kernels compile for CUDA_COMPUTE_CAP (default 90: H100 and H200), about 3 minutes the first time.
#  4. The bundle, target/gpu-bundle: binaries and tests stripped and packed with the bundled models, the test data
#     and gpu-check.sh into one xz archive, checked to be at most 60 MiB (the GPU machine takes 64 MiB in all).
#
# The test command (scripts/test.sh) runs this, so the GPU build never rots. What the GPU machine must bring itself:
# the NVIDIA driver (libcuda.so.1, libnvidia-ml.so.1, nvidia-smi), and libcublas.so.13, libcublasLt.so.13,
# libcurand.so.10 and libnvrtc.so.13 from NVIDIA's wheels (nvidia-cublas, nvidia-curand, nvidia-cuda-nvrtc), which
# gpu-check.sh finds in the machine's Python site-packages or on LD_LIBRARY_PATH.
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET_DIR=target/cuda
BUNDLE_DIR=target/gpu-bundle
MAX_BUNDLE_BYTES=$((60 * 1024 * 1024))
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
# candle's kernel build (cudaforge) runs nvcc on half the cores by default: one here, the other idle.
export CUDAFORGE_THREADS="${CUDAFORGE_THREADS:-$(nproc)}"

# The bundled models, MiniLM among them, and the Python that converts its weights.
./scripts/setup.sh

# 1-2. The compiler and the link stubs (scripts/cuda-toolkit.sh).
CUDA_ROOT=$(scripts/cuda-toolkit.sh)
export CUDA_ROOT
export CUDA_PATH="$CUDA_ROOT"
export PATH="$CUDA_ROOT/bin:$PATH"
nvcc --version | tail -n 2 >&2
# candle's static library of quantised and MoE kernels, which inferd never calls, compiles empty
# (scripts/nvcc-skip-unused.sh): it took 7 of the CUDA build's 14 minutes on two cores, 10.5 on one.
install -m 755 scripts/nvcc-skip-unused.sh "$CUDA_ROOT/bin/nvcc-skip-unused"
export NVCC="$CUDA_ROOT/bin/nvcc-skip-unused"
FEATURES=inferd-server/cuda,inferd-benches/cuda,inferd-candle/cuda

# 3. The GPU build, in one cargo invocation so that every target shares one feature resolution (and candle's kernels
# compile once): the two binaries and the GPU tests, candle's engine test (device selection, precision casts, GPU
# memory limits) and the NVML probe against nvidia-smi. Without debug line tables: the bundle strips every binary.
#
# Where buildah runs (as root: scripts/image-check.sh builds the CPU image so), the build runs in the CPU image's
# builder (the stand-in for rust:<version>-slim-bookworm, with make as the Dockerfile's builder stage has it, and g++
# for nvcc), on the image build's own target folder and at its paths (/src, and the registry at
# /usr/local/cargo/registry): the dependencies the CPU image compiled without CUDA are used again, and only what CUDA
# or the benchmarks change compiles here (some 80 crates and candle's kernels: 444 to 502 s on a fresh clone here
# after the image's build, where it was 18 minutes with the quantised kernels). Elsewhere (INFERD_GPU_BUNDLE_ON_HOST=1, or no
# buildah), on this machine in target/cuda.
artifacts=$(mktemp)
trap 'rm -f "$artifacts"' EXIT
cargo_args=(build --locked --release -p inferd-server -p inferd-benches -p inferd-candle --features "$FEATURES" --bins
    --test engine --test nvml --message-format json-render-diagnostics)
if [ "$(id -u)" = 0 ] && command -v buildah >/dev/null && [ "${INFERD_GPU_BUNDLE_ON_HOST:-0}" != 1 ]; then
    CACHE=$(realpath -m "${INFERD_CACHE_DIR:-$PWD/.cache}")/image
    mkdir -p "$CACHE"
    exec 9>"$CACHE/lock"
    flock 9
    # shellcheck source=scripts/image_standins.sh
    . scripts/image_standins.sh
    make_standins cpu
    context
    build_dir=$CACHE/target-cpu
    registry=${CARGO_HOME:-$HOME/.cargo}/registry
    mkdir -p "$build_dir" "$registry"
    ctr=$(B from --pull=never "docker.io/library/rust:$RUST_VERSION-slim-bookworm")
    trap 'rm -f "$artifacts"; B rm "$ctr" >/dev/null 2>&1 || true' EXIT
    apt_install "$ctr" make g++
    B run -v "$CACHE/context:/src" -v "$build_dir:/src/target" -v "$registry:/usr/local/cargo/registry" \
        -v "$CUDA_ROOT:$CUDA_ROOT" "$ctr" -- env CARGO_PROFILE_RELEASE_DEBUG=false CUDA_COMPUTE_CAP="$CUDA_COMPUTE_CAP" \
        CUDAFORGE_THREADS="$CUDAFORGE_THREADS" NVCC="$NVCC" CUDA_ROOT="$CUDA_ROOT" CUDA_PATH="$CUDA_ROOT" \
        PATH="$CUDA_ROOT/bin:/usr/local/cargo/bin:/usr/bin:/bin" \
        sh -c 'cd /src && exec cargo "$@"' cargo "${cargo_args[@]}" >"$artifacts"
    # The artifacts' paths, as this machine sees them. The lock stays held until they are copied out (below): an
    # image check would build the CPU binaries over them.
    sed -i "s|\"/src/target/|\"$build_dir/|g" "$artifacts"
else
    CARGO_PROFILE_RELEASE_DEBUG=false cargo "${cargo_args[@]}" --target-dir "$TARGET_DIR" >"$artifacts"
fi
mapfile -t built < <(python3 - "$artifacts" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        kind = "test" if m["profile"]["test"] else "bin"
        print(f"{kind} {m['target']['name']} {m['executable']}")
PY
)
printf '%s\n' "${built[@]}" >&2

# 4. The bundle. Link stubs never enter it; both binaries must name the driver's libcuda.so.1, and none a RUNPATH.
STAGE=$TARGET_DIR/bundle/inferd-gpu
rm -rf "$TARGET_DIR/bundle" "$BUNDLE_DIR"
mkdir -p "$STAGE/bin" "$STAGE/tests" "$STAGE/data" "$STAGE/models" "$BUNDLE_DIR"
for entry in "${built[@]}"; do
    read -r kind name path <<<"$entry"
    dest="$STAGE/bin/$name"
    [ "$kind" = test ] && dest="$STAGE/tests/$name"
    strip -o "$dest" "$path"
    if [ "$kind" = bin ] && ! readelf -d "$dest" | grep -q 'NEEDED.*\[libcuda\.so\.1\]'; then
        echo "gpu-bundle: $name does not link the CUDA driver: not a GPU build" >&2
        exit 1
    fi
    if readelf -d "$dest" | grep -qE 'RPATH|RUNPATH'; then
        echo "gpu-bundle: $name has a RUNPATH; the GPU machine's own libraries must load" >&2
        exit 1
    fi
done
# The binaries are copied out: an image check may use the target folder again.
flock -u 9 2>/dev/null || true
cp -r models/digits models/digits-candle "$STAGE/models/"
# MiniLM's weights travel in FP16 (45 MB; FP32 is 91 MB and would not fit): the check serves the same file on the
# CPU and on the GPU, so their outputs stay comparable, in FP32 and FP16 alike.
mkdir -p "$STAGE/models/minilm"
cp -r models/minilm/{model.toml,config.json,tokenizer.json,modules.json,sentence_bert_config.json,1_Pooling} \
    "$STAGE/models/minilm/"
"${INFERD_CACHE_DIR:-.cache}/modelenv/bin/python" - models/minilm/model.safetensors \
    "$STAGE/models/minilm/model.safetensors" <<'PY'
import sys
import numpy as np
from safetensors.numpy import load_file, save_file
weights = load_file(sys.argv[1])
save_file({k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in weights.items()}, sys.argv[2],
          metadata={"format": "pt", "inferd": "all-MiniLM-L6-v2 in FP16 for the GPU bundle"})
PY
# The sparse embedder (models/splade) and the token classifier (models/ner), for their candle paths in FP16: also in
# FP16, their vocabulary's rows past the first 4096 zeroed (zeros pack to nothing). The check compares the GPU with
# the CPU on the same file, so the rows each text's tokens read need not be the trained ones.
for model in splade ner; do
    mkdir -p "$STAGE/models/$model"
    cp models/$model/{model.toml,config.json,tokenizer.json} "$STAGE/models/$model/"
    "${INFERD_CACHE_DIR:-.cache}/modelenv/bin/python" - "models/$model/model.safetensors" \
        "$STAGE/models/$model/model.safetensors" <<'PY'
import sys
import numpy as np
from safetensors.numpy import load_file, save_file
weights = {k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in load_file(sys.argv[1]).items()}
for name, value in weights.items():
    if name.endswith("word_embeddings.weight"):
        value[4096:] = 0
save_file(weights, sys.argv[2], metadata={"format": "pt", "inferd": "in FP16, rows past 4096 zeroed, for the GPU bundle"})
PY
done
# The architectures past BERT's family, each a tiny model in its hub layout (tests/data/architectures, some 150 KB
# each), run in FP32, FP16 and BF16 on the GPU against FP32.
for name in mpnet modernbert nomic gte qwen3; do
    cp -r "tests/data/architectures/$name" "$STAGE/models/arch-$name"
done
# CLIP and SigLIP, tiny (tests/data/clip, some 250 KB each), and two photos they embed.
for name in clip siglip; do
    cp -r "tests/data/clip/$name" "$STAGE/models/clip-$name"
done
cp tests/data/photos/rocket.jpg tests/data/photos/camera.png "$STAGE/data/"
cp tests/data/digits_heldout.json "$STAGE/data/"
cp scripts/gpu-check.sh scripts/gpu_check.py scripts/gpu_machine.py scripts/gpu_cudashm.py "$STAGE/"
{
    echo "inferd GPU bundle"
    echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) with $(rustc --version), $(nvcc --version | tail -n 1)"
    echo "kernels for: sm_${CUDA_COMPUTE_CAP}"
    echo "the GPU machine brings: the NVIDIA driver (libcuda.so.1, libnvidia-ml.so.1, nvidia-smi); libcublas.so.13,"
    echo "  libcublasLt.so.13, libcurand.so.10, libcudart.so.13 and libnvrtc.so.13 from NVIDIA's wheels; python3"
    echo "files:"
    (cd "$STAGE" && find . -type f -printf '  %p %s\n' | sort)
} >"$STAGE/MANIFEST"
if find "$STAGE" -name 'libcu*.so*' -o -name 'libnvrtc*' -o -name '*stub*' | grep -q .; then
    echo "gpu-bundle: a CUDA library or stub is in the bundle" >&2
    exit 1
fi
# A large dictionary finds what the binaries share (candle's kernels, most of the code): 105 MB of binaries pack
# into about 10 MB. Preset 6 packs 2.3 MB smaller than preset 1 (84 s against 33 on two cores), which the GPU
# machine's 64 MiB needs now that the working tree travels beside the bundle. Python's tarfile reads it, so the
# GPU machine needs no xz.
archive="$BUNDLE_DIR/inferd-gpu.tar.xz"
tar -C "$TARGET_DIR/bundle" -cf - inferd-gpu | xz --lzma2=preset=6,dict=256MiB -T1 >"$archive"
size=$(stat -c %s "$archive")
echo "gpu-bundle: $archive: $((size / 1024 / 1024)) MiB ($(du -sm "$STAGE" | cut -f1) MiB unpacked)" >&2
if [ "$size" -gt "$MAX_BUNDLE_BYTES" ]; then
    echo "gpu-bundle: the bundle is over 60 MiB: it cannot travel to a GPU machine" >&2
    exit 1
fi
# The GPU machine takes 64 MiB in all: the bundle and the working tree that travels with it (tracked files and
# untracked ones git does not ignore).
tree=$( (git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null || true) |
    awk '{ s += $1 } END { print s + 0 }')
if [ $((size + tree)) -gt $((64 * 1024 * 1024)) ]; then
    echo "gpu-bundle: the bundle ($size bytes) and the working tree ($tree) are over the GPU machine's 64 MiB" >&2
    exit 1
fi
echo "gpu-bundle: with the working tree ($((tree / 1024)) KiB), $(((size + tree) / 1024 / 1024)) MiB of 64 travel" >&2
cd "$BUNDLE_DIR" && pwd
