#!/usr/bin/env bash
# Instructions per request, counted rather than timed (repeatable on a noisy machine): inferd (release build) serving
# `digits` runs under callgrind with counting off; after WARMUP requests it is switched on for REQUESTS sequential
# one-row `/predict` requests over one keep-alive connection, then off. Every thread of the server is counted: the
# runtime, the worker, ONNX Runtime's. Prints instructions per request and writes to OUT the callgrind profile
# (NAME.out, for callgrind_annotate or kcachegrind; not committed), its top functions (NAME-top.txt) and a one-line
# JSON.
#   REQUESTS=2000 ./benches/callgrind.sh
# PROTOCOL=v2 sends the same row as KServe v2 over HTTP with a binary tensor, PROTOCOL=grpc over gRPC, both through
# Triton's own client (tritonclient, from the Python tests' .venv: scripts/venv.sh makes it where missing).
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
PROTOCOL=${PROTOCOL:-predict}
GRPC_PORT=${GRPC_PORT:-18081}
case $PROTOCOL in
    predict) PYTHON=python3 ;;
    v2 | grpc)
        [ -x .venv/bin/python ] || ./scripts/venv.sh .venv tests/python/requirements.txt
        PYTHON=.venv/bin/python
        ;;
    *) echo "callgrind.sh: PROTOCOL is predict, v2 or grpc, not $PROTOCOL" >&2; exit 1 ;;
esac
GRPC=0
[ "$PROTOCOL" = grpc ] && GRPC=$GRPC_PORT
mkdir -p "$OUT"
command -v valgrind >/dev/null || { echo "callgrind.sh: needs valgrind (apt install valgrind)" >&2; exit 1; }

./scripts/setup.sh
if [ -z "$INFERD" ]; then
    cargo build --release --locked -p inferd-server
    INFERD=target/release/inferd
fi
profile=$OUT/$NAME.out
# The requests' instructions alone: an idle runtime thread's polling between them (--poll-idle-us) is off.
INFERD_POLL_IDLE_US=0 valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$profile" \
    "$INFERD" serve --host 127.0.0.1 --port "$PORT" --grpc-port "$GRPC" --log "$LOG" --models models/digits \
    2>"$OUT/$NAME.log" &
SERVER=$!
trap 'kill -TERM "$SERVER" 2>/dev/null || true' EXIT
for _ in $(seq 1200); do
    curl -fsS -o /dev/null "http://127.0.0.1:$PORT/health/ready" 2>/dev/null && break
    sleep 0.5
done
for _ in $(seq 100); do
    [ "$GRPC" = 0 ] || (exec 3<>"/dev/tcp/127.0.0.1/$GRPC") 2>/dev/null && break
    sleep 0.1
done
"$PYTHON" - "$PORT" "$WARMUP" "$REQUESTS" "$SERVER" "$PROTOCOL" "$GRPC_PORT" <<'PY'
import http.client, json, subprocess, sys
port, warmup, requests, pid = map(int, sys.argv[1:5])
protocol, grpc_port = sys.argv[5], int(sys.argv[6])
row = [float(i % 17) for i in range(64)]
if protocol == "predict":
    body = json.dumps({"input": [row]})
    conn = http.client.HTTPConnection("127.0.0.1", port)
    def send(n):
        for _ in range(n):
            conn.request("POST", "/models/digits/predict", body, {"Content-Type": "application/json"})
            r = conn.getresponse()
            r.read()
            assert r.status == 200, r.status
else:
    import numpy as np
    if protocol == "grpc":
        import tritonclient.grpc as triton
        client, options = triton.InferenceServerClient(f"127.0.0.1:{grpc_port}"), {}
    else:
        import tritonclient.http as triton
        client, options = triton.InferenceServerClient(f"127.0.0.1:{port}"), {"binary_data": True}
    tensor = triton.InferInput("input", [1, 64], "FP32")
    tensor.set_data_from_numpy(np.array([row], dtype=np.float32), **options)
    def send(n):
        for _ in range(n):
            assert client.infer("digits", [tensor]).as_numpy("logits").shape == (1, 10)
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
python3 - "$total" "$REQUESTS" "$OUT/$NAME.json" "$PROTOCOL" <<'PY'
import json, sys
total, requests, out, protocol = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
per = total / requests
json.dump({"instructions": total, "requests": requests, "per_request": per, "protocol": protocol}, open(out, "w"))
what = {"predict": "/predict", "v2": "KServe v2 HTTP binary", "grpc": "KServe v2 gRPC"}[protocol]
print(f"digits {what}, one row, {requests} sequential keep-alive requests: {per:,.0f} instructions per request")
PY
