#!/usr/bin/env bash
# scripts/venv.sh DIR REQUIREMENTS: makes the Python venv DIR with the pinned REQUIREMENTS, and remakes it whenever
# that file changes (a copy kept inside the venv says what it was made from). Used by setup.sh, test.sh and
# benches/compare.sh.
set -euo pipefail
dir=$1
requirements=$2
if ! cmp -s "$requirements" "$dir/requirements.txt" 2>/dev/null; then
    echo "venv: installing $requirements into $dir" >&2
    rm -rf "$dir"
    python3 -m venv "$dir"
    "$dir/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements"
    cp "$requirements" "$dir/requirements.txt"
fi
