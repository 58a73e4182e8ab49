#!/usr/bin/env bash
# scripts/image-check.sh [--cuda | --stand-ins | --build]: builds the shipped images from the unchanged
# docker/Dockerfile.cpu (and, with --cuda, docker/Dockerfile.cuda) with buildah, then runs what was built (for the CPU
# image: --stand-ins, step 1 alone, which the test command runs in the background while cargo compiles; --build, steps
# 1 and 2, which it runs in the background beside the tests, so that the run after finds the image built). Needs root
# (buildah builds as root here, with no Docker engine and no container registry), and installs buildah and debootstrap
# from Debian if missing.
#
#  1. Stand-ins for the base images the Dockerfiles name, tagged with those names (no registry is reachable): each a
#     Debian bookworm made by debootstrap, carrying what its Dockerfile stage relies on (scripts/image_standins.sh
#     says what each holds). They prove the Dockerfiles' own steps, not the real images' contents.
#  2. `buildah bud` of the Dockerfile, every stage. Cargo's registry (the host's) and the builder's target folder
#     (.cache/image/target-*) are mounted into the build's RUN steps, and unchanged stages come from buildah's layer
#     cache (.cache/image/storage-*), so a second run costs minutes; a fresh machine builds everything.
#  3. The CPU image, run as its image config says (entrypoint, CMD, environment, user), checked from outside by
#     scripts/image_check.py: readiness, /predict with the held-out digits, /embed with MiniLM against the float64
#     reference, /metrics, a non-root uid, SIGTERM drains an in-flight request and exits 0; and the image's size.
#     The CUDA image: its binary starts with no GPU and says so (scripts/image_check.py cuda).
#
# The test command (scripts/test.sh) runs the CPU image's check; the CUDA image builds candle's kernels, which would
# take the test command past its time, so it is this script's --cuda, run by hand. A failed check leaves its container
# to look into (the script prints the buildah command that lists it); the next run removes it.
set -euo pipefail
cd "$(dirname "$0")/.."

FLAVOUR=cpu
STAND_INS_ONLY=0
BUILD_ONLY=0
case "${1:-}" in
    --cuda) FLAVOUR=cuda ;;
    --stand-ins) STAND_INS_ONLY=1 ;;
    --build) BUILD_ONLY=1 ;;
    "") ;;
    *) echo "usage: scripts/image-check.sh [--cuda | --stand-ins | --build]" >&2; exit 2 ;;
esac
if [ "$(id -u)" != 0 ]; then
    echo "image-check: buildah builds as root on this machine (vfs or overlay storage, chroot isolation)" >&2
    exit 1
fi
if ! command -v buildah >/dev/null || ! command -v debootstrap >/dev/null; then
    echo "image-check: installing buildah and debootstrap (Debian)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q buildah debootstrap >/dev/null \
        || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q buildah debootstrap >/dev/null; }
fi

CACHE=$(realpath -m "${INFERD_CACHE_DIR:-$PWD/.cache}")/image
mkdir -p "$CACHE"
# One check at a time per checkout: they share the storage, the containers and the ports 8080 and 8001.
exec 9>"$CACHE/lock"
if ! flock -n 9; then
    echo "image-check: another image check is running in this checkout" >&2
    exit 1
fi
# shellcheck source=scripts/image_standins.sh
. scripts/image_standins.sh

started=$SECONDS
make_standins "$FLAVOUR"
echo "image-check: stand-ins ready after $((SECONDS - started)) s" >&2
[ "$STAND_INS_ONLY" = 0 ] || exit 0

# 2. The build, from a copy of the checkout as git sees it.
IMAGE=localhost/inferd:$FLAVOUR-check
built_at=$SECONDS
context
mounts=(-v "${CARGO_HOME:-$HOME/.cargo}/registry:/usr/local/cargo/registry" -v "$CACHE/target-$FLAVOUR:/src/target")
mkdir -p "$CACHE/target-$FLAVOUR" "${CARGO_HOME:-$HOME/.cargo}/registry"
bud "$CACHE/context/docker/Dockerfile.$FLAVOUR" -t "$IMAGE" "${mounts[@]}"
echo "image-check: $IMAGE built in $((SECONDS - built_at)) s" >&2

# A broken COPY path, from the build context or from another stage, fails the build (seconds: the stages before it
# come from the layer cache; the broken Dockerfile lies outside the context, which stays as built), so that the build
# above passing means the paths are right.
for broken in 'COPY scripts/fetch-models.sh |COPY scripts/fetch-model.sh |fetch-model.sh' \
    'COPY --from=builder /usr/local/bin/inferd |COPY --from=builder /usr/local/bin/inferd-server |inferd-server'; do
    IFS='|' read -r good bad missing <<<"$broken"
    sed "s|^$good|$bad|" "docker/Dockerfile.$FLAVOUR" >"$CACHE/Dockerfile.broken"
    if cmp -s "docker/Dockerfile.$FLAVOUR" "$CACHE/Dockerfile.broken"; then
        echo "image-check: docker/Dockerfile.$FLAVOUR has no line '$good' to break" >&2
        exit 1
    fi
    if bud "$CACHE/Dockerfile.broken" "${mounts[@]}" >"$CACHE/broken.log" 2>&1; then
        echo "image-check: docker/Dockerfile.$FLAVOUR built with a broken COPY path ($bad)" >&2
        exit 1
    fi
    if ! reason=$(grep -E "$missing.*(no such file|no items matching)" "$CACHE/broken.log" | tail -n 1); then
        tail -n 20 "$CACHE/broken.log" >&2
        echo "image-check: the broken Dockerfile failed, but not for its COPY path" >&2
        exit 1
    fi
    echo "image-check: a broken COPY path fails the build, as it should: $reason" >&2
done
[ "$BUILD_ONLY" = 0 ] || exit 0

# 3. Run it, as its config says, and check it from outside (scripts/image_check.py, in the tests' Python).
./scripts/venv.sh .venv tests/python/requirements.txt
B rm "inferd-check-$FLAVOUR" >/dev/null 2>&1 || true
container=$(B from --pull=never --name "inferd-check-$FLAVOUR" "$IMAGE")
# The image's config (Docker's, which has the HEALTHCHECK), and its size: its layers' bytes, as `docker images` counts,
# each printed with the step that made it.
size=$(B inspect --type image "$IMAGE" | python3 -c '
import json, sys
image = json.load(sys.stdin)
json.dump(image["Docker"]["config"], open(sys.argv[1], "w"), indent=1)
steps = [h.get("created_by", "") for h in image["Docker"]["history"] if not h.get("empty_layer")]
layers = [layer["size"] for layer in json.loads(image["Manifest"])["layers"]]
for i, size in enumerate(layers):
    step = steps[i] if len(steps) == len(layers) else "?"
    print(f"image-check: layer {i}: {size / 1e6:7.1f} MB  {step[:110]}", file=sys.stderr)
print(sum(layers))' "$CACHE/$FLAVOUR-config.json")
runner=("${BUILDAH[@]}" run)
if [ "$FLAVOUR" = cuda ]; then
    # No GPU here: the driver library the NVIDIA runtime would mount is the link stub, which finds no device.
    runner+=(-v "$(scripts/cuda-toolkit.sh)/lib/stubs/libcuda.so:/usr/lib/x86_64-linux-gnu/libcuda.so.1:ro")
fi
echo "image-check: a failed check leaves its container: ${BUILDAH[*]} containers" >&2
.venv/bin/python scripts/image_check.py "$FLAVOUR" "$CACHE/$FLAVOUR-config.json" "$size" "$container" -- \
    "${runner[@]}" | tee "$CACHE/$FLAVOUR-report.md"
B rm "$container" >/dev/null
echo "image-check: $FLAVOUR image checked in $((SECONDS - started)) s in all" >&2
