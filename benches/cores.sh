#!/usr/bin/env bash
# Cores follow the work: what a busy model gets with idle and busy neighbours, from one run on this machine (release
# build, the load generator on the same cores):
#   1. minilm-int8 at 64 clients (one of the text benchmark's sentences a request) served alone and in the bundled
#      repository (models/: three ONNX models and three on candle), ROUNDS interleaved: bundled / alone;
#   2. minilm-int8 and wide at 32 clients each, at once, on one server that serves both, against each alone on the
#      same server, with the server's CPU over each window (100 % = one core);
#   3. digits at 1 client (its p50) while minilm-int8 is busy at 64 clients, in the bundled repository.
# BASELINE=DIR runs 1 and 3 with DIR/inferd as well (an earlier build), in the same rounds, so the two can be set
# side by side. Prints the table; the result files go to OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10}
WARMUP=${WARMUP:-2}
ROUNDS=${ROUNDS:-3}
OUT=${OUT:-benches/results/cores}
PORT=${PORT:-18080}
BASELINE=${BASELINE:-}
mkdir -p "$OUT"

./scripts/setup.sh
cargo build --release --locked -p inferd-server -p inferd-benches
BENCH=target/release/inferd-bench
. benches/lib.sh
work=$(mktemp -d)
trap 'stop_server; rm -rf "$work"' EXIT
ln -s "$PWD/models/minilm-int8" "$PWD/.cache/models/wide" "$work/"
TICKS=$(getconf CLK_TCK)

start() { # start BINARY MODELS
    "$1" serve --host 127.0.0.1 --port "$PORT" --grpc-port 0 --log warn --models "$2" \
        --onnxruntime-lib .cache/onnxruntime/libonnxruntime.so.1.31.1 &
    SERVER_PID=$!
    wait_ready
}
load() { # load NAME MODEL CLIENTS [SECONDS]: closed-loop load on MODEL with its own protocol
    local protocol=predict
    [ "$2" = minilm-int8 ] && protocol=embed
    "$BENCH" http --url "http://127.0.0.1:$PORT" --model "$2" --protocol "$protocol" --rows 1 --concurrency "$3" \
        --warmup "$WARMUP" --duration "${4:-$DURATION}" --quiet --out "$OUT" --name "$1" >/dev/null
}
cpu() { awk '{print $14 + $15}' "/proc/$SERVER_PID/stat"; }
percent() { # percent TICKS_BEFORE: the server's CPU since, as % of one core over DURATION + WARMUP
    python3 -c "import sys; print(round((int(sys.argv[1]) - int(sys.argv[2])) / int(sys.argv[3]) / (int(sys.argv[4]) + int(sys.argv[5])) * 100))" \
        "$(cpu)" "$1" "$TICKS" "$DURATION" "$WARMUP"
}
busy_neighbour() { # busy_neighbour NAME BINARY: digits at 1 client while minilm-int8 is at 64, bundled repository
    start "$2" models
    load "$1-busy" minilm-int8 64 $((DURATION + WARMUP + 2)) &
    local busy=$!
    sleep 2
    load "$1-digits-c1" digits 1
    wait "$busy"
    stop_server
}

binaries=("new=target/release/inferd")
[ -n "$BASELINE" ] && binaries+=("old=$BASELINE/inferd")
for r in $(seq "$ROUNDS"); do
    for entry in "${binaries[@]}"; do
        side=${entry%%=*} binary=${entry#*=}
        echo "== round $r/$ROUNDS, $side: minilm-int8 at 64 clients alone, then in the bundled repository" >&2
        start "$binary" "$work/minilm-int8"
        load "$side-alone-r$r" minilm-int8 64
        stop_server
        start "$binary" models
        load "$side-bundled-r$r" minilm-int8 64
        stop_server
        echo "== round $r/$ROUNDS, $side: digits at 1 client beside a busy minilm-int8" >&2
        busy_neighbour "$side-r$r" "$binary"
    done
    echo "== round $r/$ROUNDS: minilm-int8 and wide at 32 clients, each alone, then both at once" >&2
    start target/release/inferd "$work"
    for model in minilm-int8 wide; do
        before=$(cpu)
        load "pair-$model-alone-r$r" "$model" 32
        percent "$before" >"$OUT/pair-$model-alone-r$r.cpu"
    done
    before=$(cpu)
    load "pair-minilm-int8-both-r$r" minilm-int8 32 &
    other=$!
    load "pair-wide-both-r$r" wide 32
    wait "$other"
    percent "$before" >"$OUT/pair-both-r$r.cpu"
    stop_server
done

python3 - "$OUT" "$ROUNDS" "${#binaries[@]}" <<'PY' | tee "$OUT/cores.txt"
import json, pathlib, statistics, sys
out, rounds, sides = pathlib.Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
def figure(name, key):
    return statistics.median(json.loads((out / f"{name}-r{r}.json").read_text())[0][key] for r in range(1, rounds + 1))
def p50(name):
    return statistics.median(
        json.loads((out / f"{name}-r{r}-digits-c1.json").read_text())[0]["latency_us"]["p50"] / 1e3
        for r in range(1, rounds + 1))
def cpu(name):
    return statistics.median(int((out / f"{name}-r{r}.cpu").read_text()) for r in range(1, rounds + 1))
print(f"Medians of {rounds} interleaved rounds; rows/s; the server's CPU in % of one core.")
for side in ["new", "old"][:sides]:
    alone, bundled = figure(f"{side}-alone", "rows_per_s"), figure(f"{side}-bundled", "rows_per_s")
    print(f"{side}: minilm-int8 c=64 alone {alone:.1f}, bundled {bundled:.1f}: bundled / alone {bundled / alone:.3f}"
          f" (goal >= 0.95)")
    print(f"{side}: digits c=1 p50 beside a busy minilm-int8: {p50(side):.3f} ms")
for model in ["minilm-int8", "wide"]:
    alone, both = figure(f"pair-{model}-alone", "rows_per_s"), figure(f"pair-{model}-both", "rows_per_s")
    print(f"{model} c=32: alone {alone:.1f} (CPU {cpu(f'pair-{model}-alone')} %), beside the other {both:.1f}: "
          f"{both / alone:.3f} of alone (goal >= 0.4)")
print(f"both at once: the server's CPU {cpu('pair-both')} %")
PY
