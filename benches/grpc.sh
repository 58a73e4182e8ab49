#!/usr/bin/env bash
# KServe v2 over gRPC against KServe v2 over HTTP with binary tensors, one server, one run, one load generator:
# Triton's own perf_analyzer (scripts/fetch-perf-analyzer.sh), `-i grpc` against `-i http` (its HTTP mode sends and
# asks for binary tensors). For each model (digits; wide, from benches/make_wide.py) and each concurrency (1, 64),
# in ROUNDS rounds, the protocols take turns leading (round 1 HTTP then gRPC, round 2 gRPC then HTTP, ...). Each run
# gives requests/s, p50 and p99 latency (perf_analyzer's, µs), and the server's CPU time per request: user + system
# from /proc/PID/stat around the whole perf_analyzer run, over the requests the server counted in the same window
# (inferd_requests_total, every series of the model), with perf_analyzer's own CPU per request beside it, since it
# shares the two cores. Prints the medians over the rounds and gRPC/HTTP for each figure; writes every run and the
# medians to $OUT/grpc.json and the table to $OUT/grpc.txt.
#   benches/grpc.sh
# Environment: ROUNDS (3), INTERVAL (2000: perf_analyzer's measurement window, ms; each run measures three),
#   MODELS ("digits wide"), CONCURRENCY ("1 64"), PROTOCOLS ("http grpc": "http" alone for a build without gRPC),
#   PORT (18082), GRPC_PORT (18083), OUT (benches/results), INFERD (a built inferd binary; by default the release
#   build, made here).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
INTERVAL=${INTERVAL:-2000}
MODELS=${MODELS:-digits wide}
CONCURRENCY=${CONCURRENCY:-1 64}
PROTOCOLS=${PROTOCOLS:-http grpc}
PORT=${PORT:-18082}
GRPC_PORT=${GRPC_PORT:-18083}
OUT=${OUT:-benches/results}
mkdir -p "$OUT"

./scripts/setup.sh
./scripts/fetch-perf-analyzer.sh
PERF_ANALYZER=.cache/perf-analyzer/bin/perf_analyzer
if [ -z "${INFERD:-}" ]; then
    cargo build --release --locked -p inferd-server
    INFERD=target/release/inferd
fi
RUNS=$(mktemp -d)
. benches/lib.sh
trap 'stop_server; rm -rf "$RUNS"' EXIT

model_dir() { case $1 in wide) echo .cache/models/wide ;; *) echo "models/$1" ;; esac; }
grpc_on() { case " $PROTOCOLS " in *" grpc "*) return 0 ;; *) return 1 ;; esac; }

start_inferd() { # start_inferd MODEL
    local grpc=()
    grpc_on && grpc=(--grpc-port "$GRPC_PORT")
    "$INFERD" serve --host 127.0.0.1 --port "$PORT" "${grpc[@]}" --log warn --models "$(model_dir "$1")" \
        --onnxruntime-lib .cache/onnxruntime/libonnxruntime.so.1.31.1 &
    SERVER_PID=$!
    wait_ready
    if grpc_on; then
        for _ in $(seq 100); do
            (exec 3<>"/dev/tcp/127.0.0.1/$GRPC_PORT") 2>/dev/null && return 0
            sleep 0.1
        done
        echo "grpc.sh: nothing listens on the gRPC port $GRPC_PORT" >&2
        exit 1
    fi
}

url() { if [ "$1" = grpc ]; then echo "127.0.0.1:$GRPC_PORT"; else echo "127.0.0.1:$PORT"; fi; }

# perf_analyzer's stability check is switched off (-s 1000: any spread passes), so that every run measures exactly
# three windows and exits 0: with the check on, a run that stays unstable for --max-trials windows exits 2 without
# writing its CSV, and this machine is noisy. Rounds and medians take care of the noise, as in compare.sh. Zero
# inputs: perf_analyzer's "random" fills FP32 tensors with random bit patterns (values up to 1e38, NaN now and then),
# which inferd refuses or overflows to infinities that it refuses to answer with.
pa_args() { # pa_args PROTOCOL MODEL CONCURRENCY INTERVAL_MS
    echo -m "$2" -i "$1" -u "$(url "$1")" --concurrency-range "$3:$3" --measurement-interval "$4" \
        --stability-percentage 1000 --input-data zero
}

measure() { # measure PROTOCOL MODEL CONCURRENCY ROUND ORDER: one measured run, into $RUNS/NAME.json
    python3 - "$RUNS" "$SERVER_PID" "http://127.0.0.1:$PORT/metrics" "$PERF_ANALYZER" "$@" $(pa_args "$1" "$2" "$3" "$INTERVAL") <<'PY'
import csv, json, os, re, resource, subprocess, sys, time, urllib.request
runs, pid, metrics_url, pa = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
protocol, model, concurrency, rnd, order = sys.argv[5:10]
args = sys.argv[10:]
name = f"{model}-c{concurrency}-{protocol}-r{rnd}"
ticks = os.sysconf("SC_CLK_TCK")

def served():  # every inferd_requests_total series of the model, whatever its protocol and code
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("inferd_requests_total{") and f'model="{model}"' in line)

def cpu_s():  # utime + stime of the server, every thread
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / ticks

csv_path = f"{runs}/{name}.csv"
count0 = served()
client0 = resource.getrusage(resource.RUSAGE_CHILDREN)
cpu0, t0 = cpu_s(), time.monotonic()
proc = subprocess.run([pa, *args, "-f", csv_path], capture_output=True, text=True)
cpu1, t1 = cpu_s(), time.monotonic()
client1 = resource.getrusage(resource.RUSAGE_CHILDREN)
count1 = served()
log = proc.stdout + proc.stderr
if proc.returncode != 0 or not os.path.exists(csv_path):
    sys.exit(f"grpc.sh: perf_analyzer {' '.join(args)} exited {proc.returncode}:\n{log}")
with open(csv_path) as f:
    row = next(csv.DictReader(f))  # the first row: the one concurrency measured
pa_count = int(re.search(r"Request count: (\d+)", log).group(1))
server_count = count1 - count0
count, source = server_count, "server inferd_requests_total"
if server_count < pa_count:  # the server does not count these requests in its metrics: perf_analyzer's count
    count, source = pa_count, "perf_analyzer (the server's inferd_requests_total did not count them)"
client_cpu = (client1.ru_utime + client1.ru_stime) - (client0.ru_utime + client0.ru_stime)
result = {
    "model": model, "protocol": protocol, "concurrency": int(concurrency), "round": int(rnd), "order": int(order),
    "perf_analyzer_args": args,
    "throughput_rps": float(row["Inferences/Second"]),
    "latency_us": {k: int(row[f"{k} latency"]) for k in ("p50", "p90", "p95", "p99")},
    "measured_requests": pa_count,
    "window_s": t1 - t0,
    "window_requests": count, "window_requests_from": source,
    "server_cpu_s": cpu1 - cpu0,
    "server_cpu_us_per_request": (cpu1 - cpu0) / count * 1e6,
    "client_cpu_us_per_request": client_cpu / count * 1e6,
    "csv": row,
}
json.dump(result, open(f"{runs}/{name}.json", "w"), indent=2)
print(f"  {name}: {result['throughput_rps']:,.0f} req/s, p50 {result['latency_us']['p50']} us, "
      f"p99 {result['latency_us']['p99']} us, server {result['server_cpu_us_per_request']:.1f} us CPU/req")
PY
}

for r in $(seq "$ROUNDS"); do
    # Odd rounds lead with the first protocol of PROTOCOLS, even rounds with the last.
    if [ $((r % 2)) = 1 ]; then order=$PROTOCOLS; else order=$(echo "$PROTOCOLS" | tr ' ' '\n' | tac | xargs); fi
    for model in $MODELS; do
        echo "== round $r/$ROUNDS: $model, $order"
        start_inferd "$model"
        # Warm up each protocol at the highest concurrency (not recorded): the engine, the allocator, connections.
        for p in $order; do
            "$PERF_ANALYZER" $(pa_args "$p" "$model" "${CONCURRENCY##* }" 500) >/dev/null ||
                { echo "grpc.sh: the $p warm-up failed" >&2; exit 1; }
        done
        for c in $CONCURRENCY; do
            i=0
            for p in $order; do
                i=$((i + 1))
                measure "$p" "$model" "$c" "$r" "$i"
            done
        done
        stop_server
    done
done

python3 - "$RUNS" "$OUT/grpc.json" "$ROUNDS" "$INTERVAL" "$PROTOCOLS" "$("$PERF_ANALYZER" --version 2>&1)" \
    <<'PY' | tee "$OUT/grpc.txt"
import json, pathlib, platform, statistics, sys, time
runs = sorted((json.loads(p.read_text()) for p in pathlib.Path(sys.argv[1]).glob("*.json")),
              key=lambda r: (r["round"], r["model"], r["concurrency"], r["order"]))
target, rounds, interval, protocols, version = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5].split(), sys.argv[6]
figures = {  # name: (how to read it from a run, how to print it)
    "req/s": (lambda r: r["throughput_rps"], "{:,.0f}"),
    "p50 us": (lambda r: r["latency_us"]["p50"], "{:,.0f}"),
    "p99 us": (lambda r: r["latency_us"]["p99"], "{:,.0f}"),
    "server CPU us/req": (lambda r: r["server_cpu_us_per_request"], "{:.1f}"),
    "client CPU us/req": (lambda r: r["client_cpu_us_per_request"], "{:.1f}"),
}
summary = []
for model in dict.fromkeys(r["model"] for r in runs):
    for c in sorted({r["concurrency"] for r in runs if r["model"] == model}):
        row = {"model": model, "concurrency": c}
        for p in protocols:
            mine = [r for r in runs if (r["model"], r["concurrency"], r["protocol"]) == (model, c, p)]
            row[p] = {k: statistics.median(get(r) for r in mine) for k, (get, _) in figures.items()}
        if "http" in row and "grpc" in row:
            row["grpc/http"] = {k: row["grpc"][k] / row["http"][k] if row["http"][k] else None for k in figures}
        summary.append(row)
json.dump({
    "benchmark": "benches/grpc.sh: KServe v2 gRPC against HTTP binary, perf_analyzer, one inferd per model",
    "date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "host": platform.node(), "perf_analyzer": version,
    "rounds": rounds, "measurement_interval_ms": interval, "medians": summary, "runs": runs,
}, open(target, "w"), indent=2)
print(f"Medians of {rounds} rounds, perf_analyzer ({version}), 3 windows of {interval} ms per run.")
cols = ["req/s", "p50 us", "p99 us", "server CPU us/req", "client CPU us/req"]
print(f"{'model':<8} {'c':>3} {'protocol':<10}" + "".join(f" {c:>17}" for c in cols))
for row in summary:
    for key in [*protocols, "grpc/http"]:
        if key not in row:
            continue
        cells = [("{:.3f}" if key == "grpc/http" else figures[c][1]).format(row[key][c]) if row[key][c] is not None
                 else "-" for c in cols]
        print(f"{row['model']:<8} {row['concurrency']:>3} {key:<10}" + "".join(f" {v:>17}" for v in cells))
PY
