#!/usr/bin/env bash
# Runs every test, after the same set-up as the server (scripts/setup.sh):
#  1. cargo test: unit, end-to-end and binary tests; each benchmark once;
#  2. the Python client tests (Triton's own HTTP client against the inferd binary step 1 built), in .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cargo test --locked --workspace --all-targets "$@"

# The venv is remade whenever the pinned requirements change.
if ! cmp -s tests/python/requirements.txt .venv/requirements.txt 2>/dev/null; then
    echo "test: installing the Python client tests' requirements into .venv" >&2
    rm -rf .venv
    python3 -m venv .venv
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -r tests/python/requirements.txt
    cp tests/python/requirements.txt .venv/requirements.txt
fi
INFERD_BIN=target/debug/inferd .venv/bin/python -m pytest -q -p no:cacheprovider tests/python
