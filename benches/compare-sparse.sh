#!/usr/bin/env bash
# The sparse-embedding figures of benches/README.md, from one run on this machine: SPLADE-tiny (models/splade, a real
# 2-layer BertForMaskedLM, on candle) served by inferd and driven by inferd-bench (TEI's /embed_sparse, one sentence
# per request from the text benchmark's fixed set of mixed lengths) at 1, 16 and 64 clients, against the engine-only
# limit of the same run: the same sentences tokenized once and run by the engine for their sparse weights in batches
# of 1, 16 and 64 of the closest lengths, with no HTTP, no queue, no tokenizing and no sparse answer to encode; the
# limit is the best of the three. Each pair is measured ROUNDS times, interleaved; the table takes the medians.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10}
WARMUP=${WARMUP:-2}
ROUNDS=${ROUNDS:-3}
OUT=${OUT:-benches/results}
PORT=${PORT:-18080}
MODEL=${MODEL:-splade}
mkdir -p "$OUT"

./scripts/setup.sh
cargo build --release --locked -p inferd-server -p inferd-benches
BENCH=target/release/inferd-bench
INFERD=target/release/inferd

. benches/lib.sh
for r in $(seq "$ROUNDS"); do
    echo "== round $r/$ROUNDS: inferd, $MODEL"
    "$INFERD" serve --host 127.0.0.1 --port "$PORT" --log warn --models "models/$MODEL" &
    SERVER_PID=$!
    wait_ready
    "$BENCH" http --url "http://127.0.0.1:$PORT" --model "$MODEL" --path "/models/$MODEL/embed_sparse" \
        --protocol embed --rows 1 --sweep 1,16,64 --warmup "$WARMUP" --duration "$DURATION" --out "$OUT" --quiet \
        --name "inferd-sparse-r$r"
    stop_server

    echo "== round $r/$ROUNDS: engine only, $MODEL"
    "$BENCH" engine --model-dir "models/$MODEL" --batch-sizes 1,16,64 --warmup 1 --duration 5 --out "$OUT" \
        --name "engine-sparse-r$r"
done

args=()
for c in 0 1 2; do
    args+=("$(median inferd-sparse "r[$c]['rows_per_s']")" "$(median inferd-sparse "r[$c]['latency_us']['p50']/1e3")"
        "$(median inferd-sparse "r[$c]['latency_us']['p99']/1e3")" "$(median engine-sparse "r[$c]['rows_per_s']")")
done
python3 - "$ROUNDS" "$MODEL" "${args[@]}" <<'PY' | tee "$OUT/sparse-targets.txt"
import sys
rounds, model = int(sys.argv[1]), sys.argv[2]
figures = list(map(float, sys.argv[3:]))
rows = [figures[i * 4:(i + 1) * 4] for i in range(3)]
print(f"{model} (sparse embeddings), one sentence per request from a fixed mixed-length set; medians of {rounds} "
      "interleaved rounds.")
print(f"{'clients':>7} {'inferd texts/s':>14} {'p50 ms':>7} {'p99 ms':>7} {'engine batch':>12} {'engine texts/s':>14}")
for clients, (ie, ip50, ip99, ee) in zip((1, 16, 64), rows):
    print(f"{clients:>7} {ie:>14.1f} {ip50:>7.2f} {ip99:>7.2f} {clients:>12} {ee:>14.1f}")
engine = max(r[3] for r in rows)
ratio = rows[2][0] / engine
print(f"{'target':<40} {'value':>8}  {'goal':<8} met")
print(f"{'c=64: inferd / engine-only best batch':<40} {ratio:>8.3f}  {'>= 0.85':<8} {'yes' if ratio >= 0.85 else 'NO'}")
PY
