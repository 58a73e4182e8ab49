#!/usr/bin/env bash
# The text-embedding figures of benches/README.md, from one run on this machine: all-MiniLM-L6-v2's int8 ONNX
# export (models/minilm-int8) served by
#   1. the Python peer a user would hand-roll (benches/python/fastapi_embed.py: FastAPI + tokenizers + onnxruntime,
#      no batching across requests), tuned (2 uvicorn workers of one ONNX Runtime thread) and with default settings
#      (1 worker, ONNX Runtime's own threads), and
#   2. inferd (the same export, the same ONNX Runtime),
# both driven by the same inferd-bench load (TEI's /embed, one sentence per request from a fixed set of mixed
# lengths) at 1, 16 and 64 clients; and
#   3. inferd's engine-only limit: the same sentences tokenized once, run by the engine in batches of 1, 16 and 64
#      of the closest lengths, padded to their longest, with no HTTP, no queue and no tokenizing; the limit is the
#      best of the three;
#   4. padding waste (padded tokens / real tokens) of the batches inferd formed, from its /metrics.
# As in compare.sh, each pair is measured ROUNDS times, interleaved, and the table takes the medians.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10}
WARMUP=${WARMUP:-2}
ROUNDS=${ROUNDS:-3}
OUT=${OUT:-benches/results}
PORT=${PORT:-18080}
MODEL=${MODEL:-minilm-int8}
mkdir -p "$OUT"

./scripts/setup.sh
cargo build --release --locked -p inferd-server -p inferd-benches
BENCH=target/release/inferd-bench
INFERD=target/release/inferd
./scripts/venv.sh .cache/benchenv benches/python/requirements-bench.txt

. benches/lib.sh
sweep() { # sweep NAME: one sentence per request at 1, 16 and 64 clients
    "$BENCH" http --url "http://127.0.0.1:$PORT" --model "$MODEL" --protocol embed --rows 1 --sweep 1,16,64 \
        --warmup "$WARMUP" --duration "$DURATION" --out "$OUT" --quiet --name "$1"
}
tokens() { # tokens NAME: inferd's real and padded batch tokens so far
    curl -fsS "http://127.0.0.1:$PORT/metrics" | python3 -c "import sys
t = {l.split('{')[0]: float(l.split()[-1]) for l in sys.stdin if l.startswith('inferd_batch_') and 'model=\"$MODEL\"' in l}
print(t.get('inferd_batch_tokens_total', 0), t.get('inferd_batch_padded_tokens_total', 0))"
}

: >"$OUT/text-padding.txt"
for r in $(seq "$ROUNDS"); do
    # The peer tuned (a process per core, one ONNX Runtime thread each), then with default settings.
    for peer in "fastapi-text 2 1" "fastapi-default-text 1 0"; do
        read -r name workers threads <<<"$peer"
        echo "== round $r/$ROUNDS: FastAPI + tokenizers + onnxruntime ($name), $MODEL"
        MODEL=models/$MODEL/model.onnx TOKENIZER=models/minilm/tokenizer.json INTRA_OP_THREADS=$threads \
            .cache/benchenv/bin/uvicorn --workers "$workers" --loop uvloop --http httptools --app-dir benches/python \
            fastapi_embed:app --host 127.0.0.1 --port "$PORT" --log-level warning &
        SERVER_PID=$!
        wait_ready
        "$BENCH" http --url "http://127.0.0.1:$PORT" --model "$MODEL" --path /embed --protocol embed --rows 1 \
            --sweep 1,16,64 --warmup "$WARMUP" --duration "$DURATION" --out "$OUT" --quiet --name "$name-r$r"
        stop_server
    done

    echo "== round $r/$ROUNDS: inferd, $MODEL"
    "$INFERD" serve --host 127.0.0.1 --port "$PORT" --log warn --models "models/$MODEL" &
    SERVER_PID=$!
    wait_ready
    sweep "inferd-text-r$r"
    tokens >>"$OUT/text-padding.txt"
    stop_server

    echo "== round $r/$ROUNDS: engine only, $MODEL"
    "$BENCH" engine --model-dir "models/$MODEL" --batch-sizes 1,16,64 --warmup 1 --duration 5 --out "$OUT" \
        --name "engine-text-r$r"
done

args=()
for c in 0 1 2; do
    args+=("$(median fastapi-text "r[$c]['rows_per_s']")" "$(median fastapi-text "r[$c]['latency_us']['p50']/1e3")"
        "$(median fastapi-text "r[$c]['latency_us']['p99']/1e3")" "$(median inferd-text "r[$c]['rows_per_s']")"
        "$(median inferd-text "r[$c]['latency_us']['p50']/1e3")" "$(median inferd-text "r[$c]['latency_us']['p99']/1e3")"
        "$(median engine-text "r[$c]['rows_per_s']")" "$(median engine-text "r[$c]['padding_waste']")"
        "$(median fastapi-default-text "r[$c]['rows_per_s']")")
done
python3 - "$ROUNDS" "$MODEL" "$OUT/text-padding.txt" "${args[@]}" <<'PY' | tee "$OUT/text-targets.txt"
import sys
rounds, model, padding = int(sys.argv[1]), sys.argv[2], sys.argv[3]
figures = list(map(float, sys.argv[4:]))
rows = [figures[i * 9:(i + 1) * 9] for i in range(3)]
real = padded = 0.0
for line in open(padding):
    a, b = map(float, line.split())
    real, padded = real + a, padded + b
waste = padded / real
print(f"{model}, one sentence per request from a fixed mixed-length set; medians of {rounds} interleaved rounds.")
print(f"{'clients':>7} {'peer emb/s':>11} {'p50 ms':>7} {'p99 ms':>7} {'inferd emb/s':>13} {'p50 ms':>7} {'p99 ms':>7}"
      f" {'engine batch':>12} {'engine emb/s':>12} {'pad':>5} {'default peer emb/s':>18}")
for clients, batch, (pe, pp50, pp99, ie, ip50, ip99, ee, ew, de) in zip((1, 16, 64), (1, 16, 64), rows):
    print(f"{clients:>7} {pe:>11.1f} {pp50:>7.2f} {pp99:>7.2f} {ie:>13.1f} {ip50:>7.2f} {ip99:>7.2f}"
          f" {batch:>12} {ee:>12.1f} {ew:>5.2f} {de:>18.1f}")
peer64, inferd64, default64 = rows[2][0], rows[2][3], rows[2][8]
engine = max(r[6] for r in rows)
targets = [
    ("c=64: inferd / engine-only best batch", inferd64 / engine, ">= 0.85", inferd64 / engine >= 0.85),
    ("c=64: inferd / Python peer, tuned", inferd64 / peer64, ">= 2", inferd64 / peer64 >= 2),
    ("c=64: inferd / Python peer, defaults", inferd64 / default64, ">= 2", inferd64 / default64 >= 2),
    ("padding waste of inferd's batches", waste, "<= 1.3", waste <= 1.3),
]
print(f"{'target':<40} {'value':>8}  {'goal':<8} met")
for name, value, goal, met in targets:
    print(f"{name:<40} {value:>8.3f}  {goal:<8} {'yes' if met else 'NO'}")
PY
