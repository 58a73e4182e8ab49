#!/usr/bin/env bash
# Installs Triton's load generator perf_analyzer into .cache/perf-analyzer/ (INFERD_CACHE_DIR), with a wrapper at
# .cache/perf-analyzer/bin/perf_analyzer; benches/grpc.sh and tests/python/test_perf_analyzer.py run it against
# inferd's KServe v2 gRPC and HTTP endpoints. Safe to run again: a stamp makes a second run do nothing.
#
# The binary ships in the `perf-analyzer` wheel on PyPI, built for glibc 2.38 (manylinux_2_38; without the platform
# flags pip picks an empty 0.1.0 stub). This machine's Debian 12 has glibc 2.36, so Debian 13 (trixie)'s loader and
# the libraries the binary needs (libc6, libstdc++6, libgcc-s1, libssl3t64 with libzstd1, zlib1g) are fetched with
# apt-get download, unpacked next to it, and the wrapper runs it through that loader. apt runs on a private
# configuration, lists and cache under the cache folder, so it needs no root and leaves the machine's own apt
# alone; it checks the packages against trixie's signed index (the machine's debian-archive-keyring holds trixie's
# keys). The Debian mirror is the one /etc/apt names (PERF_ANALYZER_DEBIAN_MIRROR overrides it).
set -euo pipefail
cd "$(dirname "$0")/.."

PA_VERSION=2.60.0
PA_WHEEL=perf_analyzer-$PA_VERSION-py3-none-manylinux_2_38_x86_64.whl
PA_SHA256=23ef56b107ae9233e5cf09fbdf508dd9b936a52f1bae2f63f53c8117087b3f25
CUDART_VERSION=13.0.96
DEBIAN_SUITE=trixie
DEBIAN_PACKAGES="libc6 libstdc++6 libgcc-s1 libssl3t64 libzstd1 zlib1g"
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg

CACHE_DIR=${INFERD_CACHE_DIR:-$PWD/.cache}
DIR=$CACHE_DIR/perf-analyzer
STAMP="$DIR/.made-by-$(sha256sum scripts/fetch-perf-analyzer.sh | cut -c1-16)"
if [ -f "$STAMP" ] && [ -x "$DIR/bin/perf_analyzer" ]; then
    echo "fetch-perf-analyzer: perf_analyzer $PA_VERSION at $DIR/bin/perf_analyzer" >&2
    exit 0
fi
[ "$(uname -m)" = x86_64 ] || { echo "fetch-perf-analyzer: the perf-analyzer wheel is x86_64 only" >&2; exit 1; }
for tool in apt-get dpkg-deb python3; do
    command -v "$tool" >/dev/null || { echo "fetch-perf-analyzer: needs $tool (a Debian machine)" >&2; exit 1; }
done
[ -r "$KEYRING" ] || { echo "fetch-perf-analyzer: needs $KEYRING (package debian-archive-keyring)" >&2; exit 1; }

mirror=${PERF_ANALYZER_DEBIAN_MIRROR:-}
if [ -z "$mirror" ]; then
    # The first Debian archive that /etc/apt names, in either format ("deb URI suite ..." or deb822 "URIs: URI").
    mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null |
        sed -e 's/#.*//' -e 's/\[[^]]*\]//' |
        awk '$1 == "deb" || $1 == "URIs:" { for (i = 2; i <= NF; i++) if ($i ~ /^(https?|file):\/\/.*\/debian\/?$/) { print $i; exit } }'
        ) || true
    mirror=${mirror:-http://deb.debian.org/debian}
fi

echo "fetch-perf-analyzer: fetching perf-analyzer==$PA_VERSION (PyPI) and Debian $DEBIAN_SUITE's $DEBIAN_PACKAGES ($mirror)" >&2
start=$(date +%s)
WORK=$CACHE_DIR/perf-analyzer.partial
rm -rf "$WORK"
mkdir -p "$WORK"/{wheel,debs,sysroot,libexec,bin,apt/empty,apt/state/lists/partial,apt/cache/archives/partial}
trap 'rm -rf "$WORK"' EXIT

# The wheel, checked against the hash of the file PyPI serves (a release's files never change there).
python3 -m pip download --quiet --disable-pip-version-check --no-cache-dir --no-deps --only-binary=:all: \
    --python-version 3.12 --platform manylinux_2_38_x86_64 --dest "$WORK/wheel" "perf-analyzer==$PA_VERSION"
[ -f "$WORK/wheel/$PA_WHEEL" ] || { echo "fetch-perf-analyzer: pip did not fetch $PA_WHEEL" >&2; exit 1; }
echo "$PA_SHA256  $WORK/wheel/$PA_WHEEL" | sha256sum --check --quiet
python3 - "$WORK/wheel/$PA_WHEEL" "$WORK/libexec/perf_analyzer" <<'PY'
import pathlib, sys, zipfile
wheel, target = sys.argv[1], pathlib.Path(sys.argv[2])
with zipfile.ZipFile(wheel) as z:
    target.write_bytes(z.read("perf_analyzer/bin/perf_analyzer"))
target.chmod(0o755)
PY
# perf_analyzer opens libcudart.so whenever --shared-memory is given, `system` too (it calls nothing in it then):
# the CUDA runtime from NVIDIA's wheel on PyPI (2 MB), the one scripts/cuda-toolkit.sh installs, beside the libraries.
python3 -m pip download --quiet --disable-pip-version-check --no-cache-dir --no-deps --only-binary=:all: \
    --dest "$WORK/wheel" "nvidia-cuda-runtime==$CUDART_VERSION"

# Debian trixie's libraries, through apt on a configuration of its own: APT_CONFIG is read first, and it points the
# machine-wide parts (/etc/apt/apt.conf.d, sources, preferences) at an empty folder.
apt=$WORK/apt
touch "$apt/state/status"
echo "deb [signed-by=$KEYRING] $mirror $DEBIAN_SUITE main" > "$apt/sources.list"
cat > "$apt/apt.conf" <<EOF
Dir::Etc::main "/dev/null";
Dir::Etc::parts "$apt/empty";
Dir::Etc::sourcelist "$apt/sources.list";
Dir::Etc::sourceparts "$apt/empty";
Dir::Etc::preferences "/dev/null";
Dir::Etc::preferencesparts "$apt/empty";
Dir::State "$apt/state";
Dir::State::status "$apt/state/status";
Dir::Cache "$apt/cache";
Dir::Log "$apt/log";
APT::Architecture "amd64";
APT::Architectures { "amd64"; };
Acquire::Languages "none";
APT::Sandbox::User "root";
Debug::NoLocking "true";
EOF
export APT_CONFIG=$apt/apt.conf
apt-get -q update >"$apt/update.log" 2>&1 || { cat "$apt/update.log" >&2; exit 1; }
(cd "$WORK/debs" && apt-get -q download $DEBIAN_PACKAGES) >"$apt/download.log" 2>&1 ||
    { cat "$apt/download.log" >&2; exit 1; }
for deb in "$WORK"/debs/*.deb; do
    dpkg-deb --extract "$deb" "$WORK/sysroot"
    dpkg-deb --show --showformat='${Package} ${Version}\n' "$deb" >> "$WORK/VERSIONS"
done
unset APT_CONFIG
rm -rf "$apt" "$WORK/sysroot/usr/share"
echo "perf-analyzer $PA_VERSION (PyPI, $PA_WHEEL)" >> "$WORK/VERSIONS"
lib=$WORK/sysroot/usr/lib/x86_64-linux-gnu
[ -x "$lib/ld-linux-x86-64.so.2" ] || { echo "fetch-perf-analyzer: no loader in $DEBIAN_SUITE's libc6" >&2; exit 1; }
python3 - "$WORK"/wheel/nvidia_cuda_runtime-"$CUDART_VERSION"-*.whl "$lib/libcudart.so" <<'PY'
import pathlib, sys, zipfile
wheel, target = sys.argv[1], pathlib.Path(sys.argv[2])
with zipfile.ZipFile(wheel) as z:
    target.write_bytes(z.read("nvidia/cu13/lib/libcudart.so.13"))
PY
echo "nvidia-cuda-runtime $CUDART_VERSION (PyPI): libcudart.so" >> "$WORK/VERSIONS"

# The wrapper: trixie's loader, its libraries first on the search path (dlopen'ed NSS modules included), and its
# own iconv modules. perf_analyzer has no --help (it rejects it with exit 99 and prints its usage only when -m is
# missing): the wrapper answers --help and -h with that usage and exit 0.
cat > "$WORK/bin/perf_analyzer" <<'EOF'
#!/bin/sh
# Made by scripts/fetch-perf-analyzer.sh: Triton's perf_analyzer (built for glibc 2.38) run through the loader and
# libraries of Debian trixie unpacked beside it. Arguments and exit status are perf_analyzer's own.
here=$(dirname "$(readlink -f "$0")")/..
lib=$here/sysroot/usr/lib/x86_64-linux-gnu
export GCONV_PATH="$lib/gconv"
if [ "$#" = 1 ] && { [ "$1" = --help ] || [ "$1" = -h ]; }; then
    "$lib/ld-linux-x86-64.so.2" --library-path "$lib" --argv0 perf_analyzer "$here/libexec/perf_analyzer" 2>&1 |
        grep -v '^Error: Failed to parse -m'
    exit 0
fi
exec "$lib/ld-linux-x86-64.so.2" --library-path "$lib" --argv0 perf_analyzer "$here/libexec/perf_analyzer" "$@"
EOF
chmod +x "$WORK/bin/perf_analyzer"
version=$("$WORK/bin/perf_analyzer" --version 2>&1) || { echo "fetch-perf-analyzer: $version" >&2; exit 1; }
case $version in "Perf Analyzer Version"*) ;; *) echo "fetch-perf-analyzer: unexpected: $version" >&2; exit 1 ;; esac

rm -rf "$DIR"
mv "$WORK" "$DIR"
trap - EXIT
touch "$STAMP"
echo "fetch-perf-analyzer: perf_analyzer $PA_VERSION ($version) at $DIR/bin/perf_analyzer," \
    "$(du -sh "$DIR" | cut -f1), in $(($(date +%s) - start)) s" >&2
