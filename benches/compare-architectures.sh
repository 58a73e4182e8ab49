#!/usr/bin/env bash
# The architecture figures of benches/README.md, from one run on this machine: each architecture past BERT's family
# (MPNet, ModernBERT, NomicBERT, GTE, Qwen3) at MiniLM's size with fixed-seed random weights
# (benches/make_architectures.py, into .cache/bench-architectures), on candle, served by inferd and driven by
# inferd-bench (TEI's /embed, one sentence per request from the text benchmark's fixed set of mixed lengths) at 1 and
# 64 clients, against the engine-only limit of the same run: the same sentences tokenized once and run by the engine
# in batches of 1, 16 and 64 of the closest lengths (no HTTP, no queue, no tokenizing, no answer to encode); the limit
# is the best of the three. Then the engine in BF16 against FP32 on the CPU, at batch 16. Each measurement is taken
# ROUNDS times, interleaved; the table takes the medians.
#   ROUNDS=3 NAMES="mpnet modernbert" ./benches/compare-architectures.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10}
WARMUP=${WARMUP:-2}
ROUNDS=${ROUNDS:-3}
OUT=${OUT:-benches/results}
PORT=${PORT:-18080}
NAMES=${NAMES:-minilm mpnet modernbert nomic gte qwen3}
MODELS=${MODELS:-.cache/bench-architectures}
mkdir -p "$OUT"

./scripts/setup.sh
.cache/modelenv/bin/python benches/make_architectures.py "$MODELS"
cargo build --release --locked -p inferd-server -p inferd-benches
BENCH=target/release/inferd-bench
INFERD=target/release/inferd

. benches/lib.sh
work=$(mktemp -d)
trap 'stop_server; rm -rf "$work"' EXIT
# BERT's family at the same size, for comparison: all-MiniLM-L6-v2 itself.
ln -sfn "$(realpath models/minilm)" "$MODELS/minilm"
for name in $NAMES; do
    # The same model in BF16, for the engine's comparison.
    mkdir -p "$work/$name-bf16"
    for entry in "$MODELS/$name"/*; do ln -s "$(realpath "$entry")" "$work/$name-bf16/"; done
    rm "$work/$name-bf16/model.toml"
    { echo 'precision = "bf16"'; cat "$MODELS/$name/model.toml"; } >"$work/$name-bf16/model.toml"
done

for r in $(seq "$ROUNDS"); do
    for name in $NAMES; do
        echo "== round $r/$ROUNDS: inferd, $name"
        "$INFERD" serve --host 127.0.0.1 --port "$PORT" --log warn --models "$MODELS/$name" &
        SERVER_PID=$!
        wait_ready
        "$BENCH" http --url "http://127.0.0.1:$PORT" --model "$name" --path "/models/$name/embed" --protocol embed \
            --rows 1 --sweep 1,64 --warmup "$WARMUP" --duration "$DURATION" --out "$OUT" --quiet \
            --name "inferd-arch-$name-r$r"
        stop_server
        echo "== round $r/$ROUNDS: engine only, $name (FP32, then BF16)"
        "$BENCH" engine --model-dir "$MODELS/$name" --batch-sizes 1,16,64 --warmup 1 --duration 5 --out "$OUT" \
            --name "engine-arch-$name-r$r"
        "$BENCH" engine --model-dir "$work/$name-bf16" --batch-sizes 16 --warmup 1 --duration 5 --out "$OUT" \
            --name "engine-arch-$name-bf16-r$r"
    done
done

{
    echo "Each architecture at MiniLM's size (hidden 384, 6 layers, random weights), one sentence per request from a"
    echo "fixed mixed-length set; medians of $ROUNDS interleaved rounds."
    printf '%-11s %9s %8s %8s %10s %8s %8s %12s %7s %6s %9s\n' architecture "c=1 t/s" "p50 ms" "p99 ms" "c=64 t/s" \
        "p50 ms" "p99 ms" "engine t/s" ratio "met" "bf16/fp32"
    for name in $NAMES; do
        c1=$(median "inferd-arch-$name" "r[0]['rows_per_s']")
        c1p50=$(median "inferd-arch-$name" "r[0]['latency_us']['p50']/1e3")
        c1p99=$(median "inferd-arch-$name" "r[0]['latency_us']['p99']/1e3")
        c64=$(median "inferd-arch-$name" "r[1]['rows_per_s']")
        c64p50=$(median "inferd-arch-$name" "r[1]['latency_us']['p50']/1e3")
        c64p99=$(median "inferd-arch-$name" "r[1]['latency_us']['p99']/1e3")
        engine=$(median "engine-arch-$name" "max(x['rows_per_s'] for x in r)")
        fp32_16=$(median "engine-arch-$name" "r[1]['rows_per_s']")
        bf16_16=$(median "engine-arch-$name-bf16" "r[0]['rows_per_s']")
        python3 - "$name" "$c1" "$c1p50" "$c1p99" "$c64" "$c64p50" "$c64p99" "$engine" "$fp32_16" "$bf16_16" <<'PY'
import sys
name, *f = sys.argv[1:]
c1, c1p50, c1p99, c64, c64p50, c64p99, engine, fp32, bf16 = map(float, f)
ratio = c64 / engine
print(f"{name:<11} {c1:>9.1f} {c1p50:>8.2f} {c1p99:>8.2f} {c64:>10.1f} {c64p50:>8.2f} {c64p99:>8.2f} {engine:>12.1f} "
      f"{ratio:>7.3f} {'yes' if ratio >= 0.85 else 'NO':>6} {bf16 / fp32:>9.3f}")
PY
    done
    echo "ratio: inferd at c=64 over the engine's best batch (goal >= 0.85); bf16/fp32: the engine's texts/s at batch 16"
} | tee "$OUT/architecture-targets.txt"
