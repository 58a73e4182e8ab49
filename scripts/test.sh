#!/usr/bin/env bash
# Runs every test, after the same set-up as the server (scripts/setup.sh):
#  1. cargo test: unit, end-to-end and binary tests; each benchmark once;
#  2. the Python tests, in .venv: Triton's own HTTP client against the inferd binary step 1 built, the OpenAPI
#     document, and the deployment files (hadolint, Kubernetes schemas, azure-ai-ml, ACI, probes against inferd);
#  3. the GPU build: `cargo check --features cuda` with nvcc from the CUDA 13 wheels (scripts/check-cuda.sh; the
#     first run downloads ~100 MB and compiles candle's kernels for ~8 minutes). INFERD_SKIP_CUDA_CHECK=1 skips it
#     for a quick local run; CI never sets it.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cargo test --locked --workspace --all-targets "$@"
# The load generator, which the Python tests drive against the server.
cargo build --locked -p inferd-benches --bin inferd-bench

./scripts/venv.sh .venv tests/python/requirements.txt
INFERD_BIN=target/debug/inferd .venv/bin/python -m pytest -q -p no:cacheprovider tests/python

if [ "${INFERD_SKIP_CUDA_CHECK:-0}" = 1 ]; then
    echo "test: INFERD_SKIP_CUDA_CHECK=1: the GPU build check is skipped" >&2
else
    ./scripts/check-cuda.sh
fi
