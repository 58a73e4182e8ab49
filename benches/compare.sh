#!/usr/bin/env bash
# Every figure behind the performance targets, from one run on this machine (benches/README.md):
#   1. two Python baselines (benches/python/fastapi_server.py on 2 uvicorn workers, benches/python/flask_server.py on
#      2 gunicorn gthread workers) and inferd, each alone on the machine, driven by the same inferd-bench load: digits,
#      1 row per request, 64 clients; and inferd with 1 client. The target compares inferd with the faster of the two;
#   2. the engine-only limits (inferd-bench engine) for digits and wide, and inferd over HTTP against them:
#      wide at 64 clients against the engine at batch 64, and one client against the engine's single-row time;
#   3. inferd's idle resident memory with the bundled models, and after the loads;
#   4. a concurrency sweep of inferd on digits, for the plots.
# The machine is shared and its speed drifts by tens of percent from minute to minute, so each compared pair is
# measured ROUNDS times, interleaved (the baselines, then inferd, then the baselines again...), and the table takes the
# median of each side. Prints the table of ratios. The load generator shares the two cores with the server, as
# the targets say.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10}
WARMUP=${WARMUP:-2}
ROUNDS=${ROUNDS:-3}
OUT=${OUT:-benches/results}
PORT=${PORT:-18080}
mkdir -p "$OUT"

./scripts/setup.sh
cargo build --release --locked -p inferd-server -p inferd-benches
BENCH=target/release/inferd-bench
INFERD=target/release/inferd
./scripts/venv.sh .cache/benchenv benches/python/requirements-bench.txt

. benches/lib.sh
start_inferd() {
    "$INFERD" serve --host 127.0.0.1 --port "$PORT" --log warn "$@" &
    SERVER_PID=$!
    wait_ready
}
bench() {
    "$BENCH" http --url "http://127.0.0.1:$PORT" --warmup "$WARMUP" --duration "$DURATION" --out "$OUT" --quiet "$@"
}
field() { # field FILE EXPRESSION: a figure from a results file
    python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print($2)" "$OUT/$1.json"
}

EMPTY_BODY=$(mktemp)
echo '{}' >"$EMPTY_BODY"
trap 'stop_server; rm -f "$EMPTY_BODY"' EXIT

rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$SERVER_PID/status"; }
digits() { bench --model digits --path /predict --body tests/data/request.json "$@"; }

for r in $(seq "$ROUNDS"); do
    echo "== round $r/$ROUNDS: FastAPI + uvicorn + onnxruntime, digits, 64 clients"
    MODEL=models/digits/model.onnx .cache/benchenv/bin/uvicorn --workers 2 --loop uvloop --http httptools \
        --app-dir benches/python fastapi_server:app --host 127.0.0.1 --port "$PORT" --log-level warning &
    SERVER_PID=$!
    wait_ready
    digits --concurrency 64 --name "fastapi-digits-c64-r$r"
    stop_server

    echo "== round $r/$ROUNDS: Flask + gunicorn (gthread) + onnxruntime, digits, 64 clients"
    MODEL=models/digits/model.onnx .cache/benchenv/bin/gunicorn --workers 2 --worker-class gthread --threads 4 \
        --pythonpath benches/python flask_server:app --bind "127.0.0.1:$PORT" --log-level warning &
    SERVER_PID=$!
    wait_ready
    digits --concurrency 64 --name "flask-digits-c64-r$r"
    stop_server

    echo "== round $r/$ROUNDS: inferd, digits, 64 clients and 1 client; then an empty POST, 64 clients"
    start_inferd --models models/digits
    digits --concurrency 64 --name "inferd-digits-c64-r$r"
    digits --concurrency 1 --name "inferd-digits-c1-r$r"
    # The ceiling: the same server, load and connections on a route that does no model work (KServe's repository
    # index, `{}` in, one model's state out), so what the digits target asks can be set against what the HTTP
    # stack and the load generator leave on these two cores.
    bench --model digits --path /v2/repository/index --body "$EMPTY_BODY" --concurrency 64 --name "inferd-index-c64-r$r"
    stop_server
done

echo "== inferd, digits, a concurrency sweep (for the plots)"
start_inferd --models models/digits
bench --model digits --sweep 1,4,16,64,128 --name inferd-digits-sweep
stop_server

echo "== engine only, digits"
"$BENCH" engine --model-dir models/digits --batch-sizes 1,64 --warmup 1 --duration 5 --out "$OUT" --name engine-digits

for r in $(seq "$ROUNDS"); do
    echo "== round $r/$ROUNDS: engine only, wide; then inferd, wide, 64 clients"
    "$BENCH" engine --model-dir .cache/models/wide --batch-sizes 1,64 --warmup 1 --duration 5 --out "$OUT" \
        --name "engine-wide-r$r"
    start_inferd --models .cache/models/wide
    bench --model wide --concurrency 64 --name "inferd-wide-c64-r$r"
    bench --model wide --concurrency 64 --protocol v2-binary --name "inferd-wide-c64-binary-r$r"
    stop_server
done

echo "== resident memory with the bundled digits models: idle, then after a minute of load"
# The memory target is the small bundled models' (MiniLM's 90 MB of weights are measured by compare-text.sh).
DIGITS_REPO=$(mktemp -d)
for m in models/digits*/; do ln -s "$PWD/$m" "$DIGITS_REPO/"; done
start_inferd --models "$DIGITS_REPO"
sleep 2
RSS_KIB=$(rss_kib)
"$BENCH" http --url "http://127.0.0.1:$PORT" --model digits --protocol v2-binary --concurrency 64 --warmup 0 \
    --duration 60 --out "$OUT" --quiet --name inferd-digits-c64-60s >/dev/null
LOADED_RSS_KIB=$(rss_kib)
LOADED_REQUESTS=$(field inferd-digits-c64-60s 'r[0]["requests_ok"]')
stop_server

FASTAPI=$(median fastapi-digits-c64 'r[0]["throughput_rps"]')
FLASK=$(median flask-digits-c64 'r[0]["throughput_rps"]')
INFERD64=$(median inferd-digits-c64 'r[0]["throughput_rps"]')
CEILING=$(median inferd-index-c64 'r[0]["throughput_rps"]')
P50=$(median inferd-digits-c1 'r[0]["latency_us"]["p50"]/1e3')
P99=$(median inferd-digits-c1 'r[0]["latency_us"]["p99"]/1e3')
ENGINE1=$(field engine-digits 'r[0]["latency_us"]["p50"]/1e3')
WIDE_ENGINE=$(median engine-wide 'r[1]["rows_per_s"]')
WIDE=$(median inferd-wide-c64 'r[0]["rows_per_s"]')
WIDE_BINARY=$(median inferd-wide-c64-binary 'r[0]["rows_per_s"]')
python3 - "$ROUNDS" "$FASTAPI" "$FLASK" "$INFERD64" "$CEILING" "$P50" "$P99" "$ENGINE1" "$WIDE_ENGINE" "$WIDE" "$WIDE_BINARY" \
    "$RSS_KIB" "$LOADED_RSS_KIB" "$LOADED_REQUESTS" <<'PY' | tee "$OUT/targets.txt"
import sys
rounds = int(sys.argv[1])
fastapi, flask, inferd, ceiling, p50, p99, engine1, wide_engine, wide, wide_binary, rss_kib, loaded_kib, loaded_n = map(float, sys.argv[2:])
best_name, best = max(("FastAPI", fastapi), ("Flask", flask), key=lambda peer: peer[1])
rows = [
    ("digits c=64: inferd / best Python server", f"{inferd:,.0f} / {best:,.0f} req/s ({best_name})", inferd / best, ">= 10", inferd / best >= 10),
    ("  (info) inferd / FastAPI + uvicorn", f"{inferd:,.0f} / {fastapi:,.0f} req/s", inferd / fastapi, "-", None),
    ("  (info) inferd / Flask + gunicorn", f"{inferd:,.0f} / {flask:,.0f} req/s", inferd / flask, "-", None),
    ("  (info) empty POST (no model) / best Python", f"{ceiling:,.0f} / {best:,.0f} req/s", ceiling / best, "-", None),
    ("  (info) digits / empty POST, same server", f"{inferd:,.0f} / {ceiling:,.0f} req/s", inferd / ceiling, "-", None),
    ("wide c=64 JSON: inferd / engine batch 64", f"{wide:,.0f} / {wide_engine:,.0f} rows/s", wide / wide_engine, ">= 0.6", wide / wide_engine >= 0.6),
    ("wide c=64 v2 binary: inferd / engine b64", f"{wide_binary:,.0f} / {wide_engine:,.0f} rows/s", wide_binary / wide_engine, ">= 0.6", wide_binary / wide_engine >= 0.6),
    ("digits c=1: p50 - engine single row", f"{p50:.3f} - {engine1:.3f} ms", p50 - engine1, "<= 0.2 ms", p50 - engine1 <= 0.2),
    ("digits c=1: p99 / p50", f"{p99:.3f} / {p50:.3f} ms", p99 / p50, "<= 2", p99 / p50 <= 2),
    ("idle RSS, bundled digits models", f"{rss_kib / 1024:.1f} MiB", rss_kib / 1024, "<= 50 MB", rss_kib * 1024 <= 50e6),
]
print(f"Medians of {rounds} interleaved rounds (engine-only digits and the memory figures: one measurement).")
print(f"{'target':<44} {'measured':<34} {'value':>8}  {'goal':<10} met")
for name, measured, value, goal, met in rows:
    print(f"{name:<44} {measured:<34} {value:>8.3f}  {goal:<10} {'-' if met is None else 'yes' if met else 'NO'}")
print(f"RSS after {loaded_n:,.0f} requests in 60 s at 64 clients, no scrape: {loaded_kib / 1024:.1f} MiB")
PY
