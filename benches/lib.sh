# Shared by benches/compare.sh and benches/compare-text.sh (sourced): one server at a time on $PORT, stopped on
# exit, and the median of a figure over the rounds' result files in $OUT.
SERVER_PID=
stop_server() {
    if [ -n "$SERVER_PID" ]; then
        kill -TERM "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
        SERVER_PID=
    fi
}
trap stop_server EXIT
wait_ready() {
    for _ in $(seq 600); do
        curl -fsS -o /dev/null "http://127.0.0.1:$PORT/health/ready" 2>/dev/null && return 0
        sleep 0.1
    done
    echo "$(basename "$0"): the server on :$PORT never became ready" >&2
    exit 1
}
median() { # median FILE-PREFIX EXPRESSION: the median over the rounds' result files
    python3 -c "import json,statistics,sys
print(statistics.median(eval(sys.argv[2], {'r': json.load(open(f))}) for f in sys.argv[3:]))" "$1" "$2" \
        $(for r in $(seq "$ROUNDS"); do echo "$OUT/$1-r$r.json"; done)
}
