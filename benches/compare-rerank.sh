#!/usr/bin/env bash
# The reranking figures of benches/README.md, from one run on this machine: a cross-encoder of
# ms-marco-MiniLM-L-6-v2's shapes (6 layers, hidden 384; XLM-R family, one logit), fixed-seed weights as an ONNX
# graph (models/make_text_heads.py --bench, made here into .cache/bench-models/reranker-bench), served by
#   1. the Python peer a user would hand-roll (benches/python/fastapi_rerank.py: FastAPI + tokenizers + onnxruntime,
#      each request's pairs one batch, no batching across requests), tuned (2 uvicorn workers of one ONNX Runtime
#      thread) and with default settings (1 worker, ONNX Runtime's own threads), and
#   2. inferd (the same file, the same ONNX Runtime),
# both driven by the same inferd-bench load (TEI's /rerank, a short query and 20 passages per request from a fixed
# set of mixed lengths) at 1, 16 and 64 clients; and
#   3. inferd's engine-only limit: the same pairs tokenized once, run by one ONNX Runtime session on every core
#      in batches of 8, 16, 32 and 64 of the closest lengths, padded to their longest, with no HTTP, no queue and
#      no tokenizing; the limit is the best of them.
# Throughput is pairs scored per second. Each pair of servers is measured ROUNDS times, interleaved, and the table
# takes the medians. Each run lasts DURATION seconds (30: at 64 clients the peers take 10 s and more a request).
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-30}
WARMUP=${WARMUP:-2}
ROUNDS=${ROUNDS:-3}
OUT=${OUT:-benches/results}
PORT=${PORT:-18080}
PASSAGES=${PASSAGES:-20}
MODEL=reranker-bench
DIR=.cache/bench-models/$MODEL
mkdir -p "$OUT"

./scripts/setup.sh
cargo build --release --locked -p inferd-server -p inferd-benches
BENCH=target/release/inferd-bench
INFERD=target/release/inferd
./scripts/venv.sh .cache/benchenv benches/python/requirements-bench.txt
./scripts/venv.sh .cache/modelenv benches/python/requirements-models.txt
STAMP="$DIR/.made-by-$(cat models/make_text_heads.py "$0" | sha256sum | cut -c1-16)"
if [ ! -f "$STAMP" ]; then
    rm -rf "$DIR"
    .cache/modelenv/bin/python models/make_text_heads.py --bench "$(dirname "$DIR")"
    # Tuned from the engine's own curve on a 2-core CPU (the engine-only rows below): batches of 16 to 20 pairs
    # score the most per second, larger ones less (more padding, longer attention); two sessions of one thread
    # each keep both cores busy between batches. A request's passages queue one entry each: 64 clients of 20
    # passages need room for 1280.
    cat >"$DIR/model.toml" <<'TOML'
backend = "onnx"
file = "model.onnx"
task = "rerank"
instances = 2

[onnx]
intra_op_threads = 1

[batching]
max_batch_size = 16
max_queue_size = 4096
TOML
    touch "$STAMP"
fi

. benches/lib.sh
: >"$OUT/rerank-padding.txt"
for r in $(seq "$ROUNDS"); do
    for peer in "fastapi-rerank 2 1" "fastapi-default-rerank 1 0"; do
        read -r name workers threads <<<"$peer"
        echo "== round $r/$ROUNDS: FastAPI + tokenizers + onnxruntime ($name), $MODEL"
        MODEL=$DIR/model.onnx TOKENIZER=$DIR/tokenizer.json INTRA_OP_THREADS=$threads \
            .cache/benchenv/bin/uvicorn --workers "$workers" --loop uvloop --http httptools --app-dir benches/python \
            fastapi_rerank:app --host 127.0.0.1 --port "$PORT" --log-level warning &
        SERVER_PID=$!
        wait_ready
        "$BENCH" http --url "http://127.0.0.1:$PORT" --model "$MODEL" --path /rerank --protocol rerank \
            --rows "$PASSAGES" --sweep 1,16,64 --warmup "$WARMUP" --duration "$DURATION" --out "$OUT" --quiet \
            --name "$name-r$r"
        stop_server
    done

    echo "== round $r/$ROUNDS: inferd, $MODEL"
    "$INFERD" serve --host 127.0.0.1 --port "$PORT" --log warn --models "$DIR" &
    SERVER_PID=$!
    wait_ready
    "$BENCH" http --url "http://127.0.0.1:$PORT" --model "$MODEL" --protocol rerank --rows "$PASSAGES" \
        --sweep 1,16,64 --warmup "$WARMUP" --duration "$DURATION" --out "$OUT" --quiet --name "inferd-rerank-r$r"
    curl -fsS "http://127.0.0.1:$PORT/metrics" | python3 -c "import sys
t = {l.split('{')[0]: float(l.split()[-1]) for l in sys.stdin if l.startswith('inferd_batch_') and 'model=\"$MODEL\"' in l}
print(t.get('inferd_batch_tokens_total', 0), t.get('inferd_batch_padded_tokens_total', 0))" >>"$OUT/rerank-padding.txt"
    stop_server

    echo "== round $r/$ROUNDS: engine only, $MODEL"
    "$BENCH" engine --model-dir "$DIR" --batch-sizes 8,16,32,64 --intra-op-threads "$(nproc)" --warmup 1 \
        --duration 5 --out "$OUT" \
        --name "engine-rerank-r$r"
done

args=()
for c in 0 1 2; do
    args+=("$(median fastapi-rerank "r[$c]['rows_per_s']")" "$(median fastapi-rerank "r[$c]['latency_us']['p99']/1e3")"
        "$(median inferd-rerank "r[$c]['rows_per_s']")" "$(median inferd-rerank "r[$c]['latency_us']['p50']/1e3")"
        "$(median inferd-rerank "r[$c]['latency_us']['p99']/1e3")" "$(median fastapi-default-rerank "r[$c]['rows_per_s']")")
done
engine=()
for b in 0 1 2 3; do
    engine+=("$(median engine-rerank "r[$b]['rows_per_s']")" "$(median engine-rerank "r[$b]['padding_waste']")")
done
python3 - "$ROUNDS" "$PASSAGES" "$OUT/rerank-padding.txt" "${engine[@]}" "${args[@]}" <<'PY' | tee "$OUT/rerank-targets.txt"
import sys
rounds, passages, padding = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
figures = list(map(float, sys.argv[4:]))
engine, rows = figures[:8], [figures[8 + i * 6:8 + (i + 1) * 6] for i in range(3)]
real = padded = 0.0
for line in open(padding):
    a, b = map(float, line.split())
    real, padded = real + a, padded + b
print(f"reranker-bench (ms-marco-MiniLM-L-6-v2's shapes, ONNX FP32), a query and {passages} passages per request; "
      f"pairs/s, medians of {rounds} interleaved rounds.")
print(f"{'clients':>7} {'peer pairs/s':>12} {'p99 ms':>7} {'inferd pairs/s':>14} {'p50 ms':>7} {'p99 ms':>7}"
      f" {'default peer pairs/s':>20}")
for clients, (pp, pp99, ip, ip50, ip99, dp) in zip((1, 16, 64), rows):
    print(f"{clients:>7} {pp:>12.1f} {pp99:>7.1f} {ip:>14.1f} {ip50:>7.1f} {ip99:>7.1f} {dp:>20.1f}")
print("engine only, one session on every core: " + "; ".join(
    f"batch {b}: {engine[2 * i]:.1f} pairs/s (padding {engine[2 * i + 1]:.2f})" for i, b in enumerate((8, 16, 32, 64))))
best = max(engine[0::2])
inferd64, peer64, default64 = rows[2][2], rows[2][0], rows[2][5]
ratio = lambda a, b: a / b if b else float("inf")
targets = [
    ("c=64: inferd / engine-only best batch", ratio(inferd64, best), ">= 0.85", ratio(inferd64, best) >= 0.85),
    ("c=64: inferd / Python peer, tuned", ratio(inferd64, peer64), ">= 1", ratio(inferd64, peer64) >= 1),
    ("c=64: inferd / Python peer, defaults", ratio(inferd64, default64), ">= 1", ratio(inferd64, default64) >= 1),
    ("padding waste of inferd's batches", ratio(padded, real), "<= 1.3", ratio(padded, real) <= 1.3),
]
print(f"{'target':<40} {'value':>8}  {'goal':<8} met")
for name, value, goal, met in targets:
    print(f"{name:<40} {value:>8.3f}  {goal:<8} {'yes' if met else 'NO'}")
PY
