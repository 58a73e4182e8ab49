#!/usr/bin/env bash
# benches/soak.sh: the soak (benches/soak.py) against the release build serving the digits model, for DURATION
# seconds (default 120) of mixed traffic: good clients, malformed bodies, aborted connections, slow readers,
# oversize gzip, probes. Passes when no request was lost, every answer was the one its kind calls for, and RSS
# came back near its baseline; then the server must stop cleanly on SIGTERM. Figures in $OUT/soak.json.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-120}
PORT=${PORT:-18480}
OUT=${OUT:-benches/results}
source benches/lib.sh
./scripts/setup.sh
cargo build --locked --release -p inferd-server --bin inferd
repo=$(mktemp -d)
trap 'stop_server; rm -rf "$repo"' EXIT
cp -r models/digits "$repo/"
target/release/inferd serve --host 127.0.0.1 --port "$PORT" --grpc-port 0 --models "$repo" --max-rows 4096 \
    --onnxruntime-lib .cache/onnxruntime/libonnxruntime.so.1.31.1 --log warn &
SERVER_PID=$!
wait_ready
status=0
python3 benches/soak.py --pid "$SERVER_PID" --address "127.0.0.1:$PORT" --duration "$DURATION" --max-rows 4096 \
    --out "$OUT/soak.json" || status=$?
kill -TERM "$SERVER_PID"
if ! wait "$SERVER_PID"; then
    echo "soak: the server did not exit 0 on SIGTERM" >&2
    status=1
fi
SERVER_PID=
exit "$status"
