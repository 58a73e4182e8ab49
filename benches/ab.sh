#!/usr/bin/env bash
# Two builds of inferd, A and B, on the same load in interleaved rounds: by default digits, one row per request, 64
# clients of inferd-bench on /predict (MODEL, PROTOCOL and ROWS choose another: MODEL=minilm PROTOCOL=embed ROWS=4).
# For each round and side: requests/s, and the server's own CPU time per request
# (user + system, from /proc/PID/stat, over the measured window only). Prints the medians and B/A ratios.
#   benches/ab.sh DIR_A DIR_B        each DIR holds an `inferd` binary (DIR_A's inferd-bench drives both)
# Environment: ROUNDS (3), DURATION (10 s), WARMUP (2 s), CONCURRENCY (64), PORT (18081), MODEL (digits, a folder
# of models/), PROTOCOL (predict), ROWS (1), MODEL_B (MODEL: B serves this folder of models/ instead, so that one
# binary can be compared with itself under two model.toml settings).
set -euo pipefail
cd "$(dirname "$0")/.."
A=${1:?usage: benches/ab.sh DIR_A DIR_B}
B=${2:?usage: benches/ab.sh DIR_A DIR_B}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10}
WARMUP=${WARMUP:-2}
CONCURRENCY=${CONCURRENCY:-64}
PORT=${PORT:-18081}
PROTOCOL=${PROTOCOL:-predict}
MODEL=${MODEL:-digits}
MODEL_B=${MODEL_B:-$MODEL}
ROWS=${ROWS:-1}
OUT=$(mktemp -d)
trap 'kill $SERVER_PID 2>/dev/null || true; rm -rf "$OUT"' EXIT
./scripts/setup.sh 2>/dev/null
TICKS=$(getconf CLK_TCK)

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

run() { # run SIDE DIR ROUND
    local model=$MODEL
    [ "$1" = b ] && model=$MODEL_B
    "$2/inferd" serve --host 127.0.0.1 --port "$PORT" --grpc-port 0 --log warn --models "models/$model" \
        --onnxruntime-lib .cache/onnxruntime/libonnxruntime.so.1.31.1 &
    SERVER_PID=$!
    for _ in $(seq 300); do curl -fsS -o /dev/null "http://127.0.0.1:$PORT/health/ready" 2>/dev/null && break; sleep 0.1; done
    # Warm up, then measure with the CPU counter read around the measured run alone.
    "$A/inferd-bench" http --url "http://127.0.0.1:$PORT" --model "$model" --protocol "$PROTOCOL" --rows "$ROWS" \
        --concurrency "$CONCURRENCY" --warmup 0 --duration "$WARMUP" --out "$OUT" --quiet --name warm >/dev/null
    local before after
    before=$(cpu_ticks "$SERVER_PID")
    "$A/inferd-bench" http --url "http://127.0.0.1:$PORT" --model "$model" --protocol "$PROTOCOL" --rows "$ROWS" \
        --concurrency "$CONCURRENCY" --warmup 0 --duration "$DURATION" --out "$OUT" --quiet --name "$1-$3" >/dev/null
    after=$(cpu_ticks "$SERVER_PID")
    echo "$((after - before))" > "$OUT/$1-$3.ticks"
    kill -TERM "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true
}

for r in $(seq "$ROUNDS"); do
    echo "== round $r/$ROUNDS" >&2
    run a "$A" "$r"
    run b "$B" "$r"
done

python3 - "$OUT" "$ROUNDS" "$TICKS" <<'PY'
import json, pathlib, statistics, sys
out, rounds, ticks = pathlib.Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
def side(s):
    rows = []
    for r in range(1, rounds + 1):
        report = json.loads((out / f"{s}-{r}.json").read_text())[0]
        n = report["requests_ok"]
        cpu_s = int((out / f"{s}-{r}.ticks").read_text()) / ticks
        rows.append((report["throughput_rps"], cpu_s / n * 1e6))
    return rows
a, b = side("a"), side("b")
for name, rows in (("A", a), ("B", b)):
    print(f"{name}: " + "  ".join(f"{rps:,.0f} req/s {us:.1f} us/req" for rps, us in rows))
ma = [statistics.median(x[i] for x in a) for i in range(2)]
mb = [statistics.median(x[i] for x in b) for i in range(2)]
print(f"{'median':<8} {'req/s':>10} {'server CPU us/req':>18}")
print(f"{'A':<8} {ma[0]:>10,.0f} {ma[1]:>18.1f}")
print(f"{'B':<8} {mb[0]:>10,.0f} {mb[1]:>18.1f}")
print(f"{'B/A':<8} {mb[0] / ma[0]:>10.3f} {mb[1] / ma[1]:>18.3f}")
PY
