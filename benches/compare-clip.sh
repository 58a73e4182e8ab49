#!/usr/bin/env bash
# The CLIP figures of benches/README.md, from one run on this machine: pictures embedded per second end to end at 1
# and 16 clients, for CLIP at openai/clip-vit-base-patch32's sizes with fixed-seed random weights
# (benches/make_clip.py, into .cache/bench-clip), on scikit-image's rocket.jpg (a 640 x 427 JPEG), served by
#   1. the Python peer a user would hand-roll (benches/python/fastapi_clip.py: FastAPI + Pillow + transformers'
#      CLIPImageProcessor and CLIPModel on torch, 2 uvicorn workers of one torch thread, each picture run alone), and
#   2. inferd (the same folder, candle, the model.toml of tests/data/clip),
# both driven by the same inferd-bench load (the picture as the body, Content-Type image/jpeg); and
#   3. the engine alone: the picture made into pixels once, the vision tower run at batches of 1, 8 and 16, with no
#      HTTP, no decoding and no queue.
# Each server is measured ROUNDS times, interleaved, and the table takes the medians.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10}
WARMUP=${WARMUP:-3}
ROUNDS=${ROUNDS:-2}
OUT=${OUT:-benches/results}
PORT=${PORT:-18080}
MODELS=${MODELS:-.cache/bench-clip}
PICTURE=tests/data/photos/rocket.jpg
mkdir -p "$OUT"

./scripts/setup.sh
.cache/modelenv/bin/python benches/make_clip.py "$MODELS"
cargo build --release --locked -p inferd-server -p inferd-benches
BENCH=target/release/inferd-bench
INFERD=target/release/inferd
./scripts/venv.sh .cache/clipenv benches/python/requirements-clip.txt

. benches/lib.sh
for r in $(seq "$ROUNDS"); do
    echo "== round $r/$ROUNDS: FastAPI + transformers' CLIP on torch"
    MODEL=$MODELS/clip .cache/clipenv/bin/uvicorn --workers 2 --loop uvloop --http httptools \
        --app-dir benches/python fastapi_clip:app --host 127.0.0.1 --port "$PORT" --log-level warning &
    SERVER_PID=$!
    wait_ready
    "$BENCH" http --url "http://127.0.0.1:$PORT" --model clip --protocol image --body "$PICTURE" --sweep 1,16 \
        --warmup "$WARMUP" --duration "$DURATION" --out "$OUT" --quiet --name "fastapi-clip-r$r"
    stop_server

    echo "== round $r/$ROUNDS: inferd"
    "$INFERD" serve --host 127.0.0.1 --port "$PORT" --grpc-port 0 --log warn --models "$MODELS" &
    SERVER_PID=$!
    wait_ready
    "$BENCH" http --url "http://127.0.0.1:$PORT" --model clip --protocol image --body "$PICTURE" --sweep 1,16 \
        --warmup "$WARMUP" --duration "$DURATION" --out "$OUT" --quiet --name "inferd-clip-r$r"
    stop_server

    echo "== round $r/$ROUNDS: engine only"
    "$BENCH" engine --model-dir "$MODELS/clip" --picture "$PICTURE" --batch-sizes 1,8,16 --warmup 1 --duration 5 \
        --out "$OUT" --name "engine-clip-r$r"
done

args=()
for c in 0 1; do
    args+=("$(median fastapi-clip "r[$c]['rows_per_s']")" "$(median inferd-clip "r[$c]['rows_per_s']")"
        "$(median inferd-clip "r[$c]['latency_us']['p50']/1e3")" "$(median inferd-clip "r[$c]['latency_us']['p99']/1e3")")
done
for b in 0 1 2; do
    args+=("$(median engine-clip "r[$b]['rows_per_s']")")
done
args+=("$(median engine-clip "r[0]['prepare_ms']")")
python3 - "$ROUNDS" "$(nproc)" "${args[@]}" <<'PY' | tee "$OUT/clip-targets.txt"
import sys
rounds, cores = int(sys.argv[1]), int(sys.argv[2])
f = list(map(float, sys.argv[3:]))
rows, engine, prepare = [f[0:4], f[4:8]], f[8:11], f[11]
print(f"CLIP ViT-B/32 sizes, random weights: pictures per second, medians of {rounds} interleaved rounds")
print(f"{'clients':>7} {'peer img/s':>10} {'inferd img/s':>12} {'p50 ms':>7} {'p99 ms':>7}")
for clients, (peer, inferd, p50, p99) in zip((1, 16), rows):
    print(f"{clients:>7} {peer:>10.1f} {inferd:>12.1f} {p50:>7.1f} {p99:>7.1f}")
print("engine alone: " + "; ".join(f"batch {b}: {v:.1f} img/s" for b, v in zip((1, 8, 16), engine)))
print(f"making a picture's pixels: {prepare:.2f} ms on one thread")
print(f"{'target':<36} {'value':>8}  goal")
for name, value, goal in [("c=16: inferd / Python peer", rows[1][1] / rows[1][0], ">= 2"),
                          ("c=1: inferd / Python peer", rows[0][1] / rows[0][0], "-"),
                          ("c=16: inferd / engine alone", rows[1][1] / max(engine), "-")]:
    print(f"{name:<36} {value:>8.3f}  {goal}")
PY
