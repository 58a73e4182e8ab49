#!/usr/bin/env bash
# Instructions per request, counted rather than timed (repeatable on a noisy machine): inferd (release build) serving
# `digits` runs under callgrind with counting off; after WARMUP requests it is switched on for REQUESTS sequential
# one-row `/predict` requests over one keep-alive connection, then off. Every thread of the server is counted: the
# runtime, the worker, ONNX Runtime's. Prints instructions per request and writes to OUT the callgrind profile
# (NAME.out, for callgrind_annotate or kcachegrind; not committed), its top functions (NAME-top.txt) and a one-line
# JSON.
#   REQUESTS=2000 ./benches/callgrind.sh
# INFERD=path counts another build of the server (a before and after), built here only when it is this tree's.
# LOG=filter runs it at another log filter than `warn` (the server's default is `info,ort=warn`: each request's span
# is then recorded).
set -euo pipefail
cd "$(dirname "$0")/.."
REQUESTS=${REQUESTS:-2000}
WARMUP=${WARMUP:-200}
OUT=${OUT:-benches/results}
PORT=${PORT:-18080}
NAME=${NAME:-callgrind-digits}
INFERD=${INFERD:-}
LOG=${LOG:-warn}
mkdir -p "$OUT"
command -v valgrind >/dev/null || { echo "callgrind.sh: needs valgrind (apt install valgrind)" >&2; exit 1; }

./scripts/setup.sh
if [ -z "$INFERD" ]; then
    cargo build --release --locked -p inferd-server
    INFERD=target/release/inferd
fi
profile=$OUT/$NAME.out
valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$profile" \
    "$INFERD" serve --host 127.0.0.1 --port "$PORT" --grpc-port 0 --log "$LOG" --models models/digits \
    2>"$OUT/$NAME.log" &
SERVER=$!
trap 'kill -TERM "$SERVER" 2>/dev/null || true' EXIT
for _ in $(seq 1200); do
    curl -fsS -o /dev/null "http://127.0.0.1:$PORT/health/ready" 2>/dev/null && break
    sleep 0.5
done
python3 - "$PORT" "$WARMUP" "$REQUESTS" "$SERVER" <<'PY'
import http.client, json, subprocess, sys
port, warmup, requests, pid = map(int, sys.argv[1:])
body = json.dumps({"input": [[float(i % 17) for i in range(64)]]})
conn = http.client.HTTPConnection("127.0.0.1", port)
def send(n):
    for _ in range(n):
        conn.request("POST", "/models/digits/predict", body, {"Content-Type": "application/json"})
        r = conn.getresponse()
        r.read()
        assert r.status == 200, r.status
send(warmup)
subprocess.run(["callgrind_control", "-i", "on", str(pid)], check=True, capture_output=True)
send(requests)
subprocess.run(["callgrind_control", "-i", "off", str(pid)], check=True, capture_output=True)
PY
kill -TERM "$SERVER"
wait "$SERVER" || true
trap - EXIT
total=$(awk '/^totals:/ {print $2}' "$profile")
# Where they go: the functions with the most instructions of their own (the profile itself is not committed).
callgrind_annotate --threshold=90 "$profile" 2>/dev/null | head -60 >"$OUT/$NAME-top.txt" || true
python3 - "$total" "$REQUESTS" "$OUT/$NAME.json" <<'PY'
import json, sys
total, requests, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
per = total / requests
json.dump({"instructions": total, "requests": requests, "per_request": per}, open(out, "w"))
print(f"digits /predict, one row, {requests} sequential keep-alive requests: {per:,.0f} instructions per request")
PY
