#!/usr/bin/env bash
# scripts/fuzz.sh [--dev] [SECONDS] [TARGET…]: runs each cargo fuzz target (fuzz/fuzz_targets: the v2 binary, JSON and
# gRPC decoders, the /predict decoder, model.toml, the shared-memory parameters) for SECONDS (default 300), as many at once as there are cores, from
# the seeds in fuzz/seeds and the corpus grown by earlier runs (.cache/fuzz/corpus). Exits 1 on the first crash,
# leaving its input in fuzz/artifacts/TARGET/ (add it to the target's regression test, then to fuzz/seeds). The test
# command runs it for a few seconds a target, built with --dev (unoptimised: it compiles in 1.8 minutes on a fresh
# machine, where the optimised build took 3.5, and a few seconds of fuzzing need no speed); long runs are this
# script's, by hand, optimised.
#
# cargo-fuzz (pinned) is installed into .cache/tools the first time. No sanitizer (`-s none`) needs no nightly
# toolchain: the code is safe Rust, and libFuzzer's coverage instrumentation is all that is used.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=--release
if [ "${1:-}" = --dev ]; then
    profile=--dev
    shift
fi
seconds=${1:-300}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(v2_binary v2_json grpc predict model_toml shm)
tools=$PWD/.cache/tools
if [ ! -x "$tools/bin/cargo-fuzz" ]; then
    echo "fuzz: installing cargo-fuzz 0.13.1 into $tools" >&2
    # Unoptimised: it only drives cargo and libFuzzer, so its own build need not be optimised.
    cargo install --quiet --locked --debug --root "$tools" cargo-fuzz --version 0.13.1
fi
export PATH="$tools/bin:$PATH"
cd fuzz
cargo fuzz build -s none "$profile"
# run_target TARGET: fuzzes TARGET for SECONDS; on a crash, says where its input is and fails.
run_target() {
    local target=$1 corpus=../.cache/fuzz/corpus/$1 log=../.cache/fuzz/$1.log
    mkdir -p "$corpus"
    echo "fuzz: $target for ${seconds}s (log: .cache/fuzz/$target.log)" >&2
    if ! cargo fuzz run -s none "$profile" "$target" "$corpus" "seeds/$target" -- \
        -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 >"$log" 2>&1; then
        grep -E "panicked|SUMMARY|Test unit written|ERROR" "$log" >&2 || tail -n 20 "$log" >&2
        echo "fuzz: $target crashed; its input is in fuzz/artifacts/$target" >&2
        return 1
    fi
    echo "fuzz: $target: $(grep -E "^(Done|stat::new_units_added)" "$log" | tr '\n' ' ')" >&2
}
# One target a core at a time (libFuzzer's runs are single-threaded): the test command's five take 33 s where one
# after the other took 55. The first crash stops the rest.
reap() { # waits for one run to end; a crash stops the others, and the script
    running=$((running - 1))
    wait -n && return 0
    kill $(jobs -p) 2>/dev/null || true
    wait
    exit 1
}
running=0
for target in "${targets[@]}"; do
    [ "$running" -lt "$(nproc)" ] || reap
    run_target "$target" &
    running=$((running + 1))
done
while [ "$running" -gt 0 ]; do reap; done
