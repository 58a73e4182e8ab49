#!/usr/bin/env bash
# What a model costs in memory: for each bundled model served alone, and for the whole bundled repository, the
# server's resident memory (VmRSS) once ready (loaded and warmed), after LOAD seconds of 64 clients, and AFTER
# seconds once the load stops, with the peak (VmHWM). What a model adds is its idle RSS less that of the server
# serving `digits` alone (a model of 39 KB: the server itself), set against its weight files' size. One run, release
# build; a model's load is its own protocol (tensors, embed, rerank, TEI's predict, a picture).
#   LOAD=60 AFTER=60 MODELS="digits minilm-int8" ./benches/memory.sh
# A MODELS entry with a slash is a folder elsewhere: MODELS="digits .cache/bench-architectures/mpnet" measures the
# architecture benchmark's models (benches/make_architectures.py).
# INFERD=path measures another build of the server (an A/B), the load generator still this tree's.
set -euo pipefail
cd "$(dirname "$0")/.."
LOAD=${LOAD:-60}
AFTER=${AFTER:-60}
OUT=${OUT:-benches/results}
PORT=${PORT:-18080}
MODELS=${MODELS:-digits digits-candle digits-fp16 digits-fp16-candle minilm minilm-int8 reranker classifier orientation}
REPOSITORY=${REPOSITORY:-yes}
mkdir -p "$OUT"

./scripts/setup.sh
./scripts/fetch-test-models.sh
cargo build --release --locked -p inferd-server -p inferd-benches
BENCH=target/release/inferd-bench
INFERD=${INFERD:-target/release/inferd}
. benches/lib.sh
work=$(mktemp -d)
trap 'stop_server; rm -rf "$work"' EXIT
echo '{"inputs": ["the server is fast", "it is slow and it breaks", "nothing to say about it"]}' >"$work/classify.json"

# load MODEL CLIENTS: drives MODEL with its own protocol for LOAD seconds.
load() {
    local model=$1 clients=$2 args
    case $model in
        minilm* | mpnet | modernbert | nomic | gte | qwen3) args=(--protocol embed --rows 4) ;;
        reranker) args=(--protocol rerank --rows 8) ;;
        classifier) args=(--body "$work/classify.json" --path /models/classifier/predict) ;;
        orientation) args=(--protocol image --body tests/data/photos/rocket.jpg) ;;
        *) args=(--protocol predict --rows 1) ;;
    esac
    "$BENCH" http --url "http://127.0.0.1:$PORT" --model "$model" "${args[@]}" --concurrency "$clients" --warmup 1 \
        --duration "$LOAD" --quiet --out "$work" --name "$model-$clients" >/dev/null
}

rss() { awk -v key="$2:" '$1 == key {print $2 * 1024}' "/proc/$1/status"; }

# measure NAME REPOSITORY MODEL...: one server, its memory idle, after the load of each MODEL (run at once, 64
# clients shared among them) and after AFTER seconds of rest.
measure() {
    local name=$1 repo=$2
    shift 2
    "$INFERD" serve --host 127.0.0.1 --port "$PORT" --grpc-port 0 --log warn --models "$repo" &
    SERVER_PID=$!
    wait_ready
    sleep 2
    local idle idle_anon
    idle=$(rss "$SERVER_PID" VmRSS)
    idle_anon=$(rss "$SERVER_PID" RssAnon)
    local clients=$((64 / $#)) pids=()
    for model in "$@"; do
        load "$model" "$clients" &
        pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid"; done
    local loaded rested rested_anon peak
    loaded=$(rss "$SERVER_PID" VmRSS)
    sleep "$AFTER"
    rested=$(rss "$SERVER_PID" VmRSS)
    rested_anon=$(rss "$SERVER_PID" RssAnon)
    peak=$(rss "$SERVER_PID" VmHWM)
    stop_server
    local weights=0
    if [ -f "$repo/model.toml" ]; then
        weights=$(find -L "$repo" -maxdepth 1 \( -name '*.onnx' -o -name '*.safetensors' \) -printf '%s\n' |
            awk '{s += $1} END {print s + 0}')
    fi
    echo "{\"name\": \"$name\", \"weights\": ${weights:-0}, \"idle\": $idle, \"loaded\": $loaded, \"rested\": $rested, \"peak\": $peak, \"idle_anon\": $idle_anon, \"rested_anon\": $rested_anon}" \
        >>"$OUT/memory.jsonl"
    echo "== $name: idle $((idle >> 20)) MiB, after load $((loaded >> 20)) MiB, rested $((rested >> 20)) MiB, peak $((peak >> 20)) MiB"
}

: >"$OUT/memory.jsonl"
for model in $MODELS; do
    case $model in
        # A folder elsewhere (the architecture benchmark's models: .cache/bench-architectures/NAME).
        */*) measure "$(basename "$model")" "$model" "$(basename "$model")" ;;
        *) measure "$model" "models/$model" "$model" ;;
    esac
done
if [ "$REPOSITORY" = yes ]; then
    measure repository models digits minilm minilm-int8 orientation
fi

python3 - "$OUT/memory.jsonl" "$LOAD" "$AFTER" <<'PY' | tee "$OUT/memory.txt"
import json, sys
runs = [json.loads(line) for line in open(sys.argv[1])]
load, after = sys.argv[2], sys.argv[3]
base = next((r["idle"] for r in runs if r["name"] == "digits"), None)
mib = lambda b: b / 2**20
print(f"Resident memory (MiB): idle once ready, after {load} s of 64 clients, {after} s after the load, and the peak;")
print("then the anonymous part alone (heap and stacks: RssAnon) idle and rested, the rest being pages of files, the")
print("binary's and libraries' code above all, which a load touches once and the kernel may drop.")
print(f"{'served':<20} {'weights':>8} {'idle':>7} {'adds':>7} {'goal':>7} {'loaded':>7} {'rested':>7} {'peak':>7}"
      f"  {'adds <= goal':<13} {'rested <= idle + 10 %':<22} {'anon':>7} {'rested':>7}  anon + 10 %")
for r in runs:
    adds = None if base is None or r["name"] == "repository" else r["idle"] - base
    goal = None if adds is None else r["weights"] + 32 * 2**20
    fits = "-" if adds is None or r["name"] == "digits" else ("yes" if adds <= goal else "NO")
    back = "yes" if r["rested"] <= 1.1 * r["idle"] else "NO"
    fmt = lambda v: f"{mib(v):>7.1f}" if v is not None else f"{'-':>7}"
    anon, anon_rested = r.get("idle_anon"), r.get("rested_anon")
    anon_back = "-" if anon is None else ("yes" if anon_rested <= 1.1 * anon else "NO")
    print(f"{r['name']:<20} {mib(r['weights']):>8.1f} {mib(r['idle']):>7.1f} {fmt(adds)} {fmt(goal)} "
          f"{mib(r['loaded']):>7.1f} {mib(r['rested']):>7.1f} {mib(r['peak']):>7.1f}  {fits:<13} {back:<22} "
          f"{fmt(anon)} {fmt(anon_rested)}  {anon_back}")
PY
