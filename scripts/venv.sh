#!/usr/bin/env bash
# scripts/venv.sh DIR REQUIREMENTS: makes the Python venv DIR with the pinned REQUIREMENTS, and remakes it whenever
# that file changes (a copy kept inside the venv says what it was made from). Used by setup.sh, test.sh and
# benches/compare.sh.
#
# The packages are installed by uv (pinned, from PyPI, into the venv itself), not by pip: the test command's venv took
# pip 124 s and 115 s of CPU on a fresh machine, taken from the cargo build it runs beside, where uv takes 7 s. uv
# writes no bytecode at install (Python compiles what it imports, when it first does), and keeps its downloads in
# .cache/uv.
set -euo pipefail
UV_VERSION=0.13.9
dir=$1
requirements=$2
if ! cmp -s "$requirements" "$dir/requirements.txt" 2>/dev/null; then
    echo "venv: installing $requirements into $dir" >&2
    rm -rf "$dir"
    python3 -m venv "$dir"
    "$dir/bin/python" -m pip install --quiet --disable-pip-version-check "uv==$UV_VERSION"
    UV_CACHE_DIR=${UV_CACHE_DIR:-$(realpath -m "${INFERD_CACHE_DIR:-$(dirname "$0")/../.cache}")/uv} \
        "$dir/bin/uv" pip install --quiet --python "$dir/bin/python" -r "$requirements"
    cp "$requirements" "$dir/requirements.txt"
fi
