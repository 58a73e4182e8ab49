#!/usr/bin/env bash
# Serves the bundled models on :8080 (INFERD_PORT), after scripts/setup.sh: digits for /predict, MiniLM for
# /embed. Extra arguments go to `inferd serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export INFERD_DEFAULT_MODEL=${INFERD_DEFAULT_MODEL:-digits}
export INFERD_DEFAULT_EMBED_MODEL=${INFERD_DEFAULT_EMBED_MODEL:-minilm}
exec cargo run --locked --release -p inferd-server --bin inferd -- serve "$@"
