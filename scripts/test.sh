#!/usr/bin/env bash
# Runs every test, after the same set-up as the server (scripts/setup.sh). Benchmarks run once each, as tests.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cargo test --locked --workspace --all-targets "$@"
