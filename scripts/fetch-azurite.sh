#!/usr/bin/env bash
# Installs Azurite, the Azure Storage emulator (npm), into .cache/azurite once: the remote-repository tests
# (tests/python/test_remote.py) serve models from its Blob service.
set -euo pipefail
cd "$(dirname "$0")/.."
AZURITE_VERSION=3.37.0
dir=${INFERD_CACHE_DIR:-.cache}/azurite
if [ "$(cat "$dir/version" 2>/dev/null)" != "$AZURITE_VERSION" ] || [ ! -x "$dir/node_modules/.bin/azurite-blob" ]; then
    echo "azurite: installing $AZURITE_VERSION into $dir" >&2
    rm -rf "$dir"
    mkdir -p "$dir"
    npm install --prefix "$dir" --no-audit --no-fund --loglevel=error --cache "$dir/npm-cache" \
        "azurite@$AZURITE_VERSION" >&2
    rm -rf "$dir/npm-cache"
    echo "$AZURITE_VERSION" >"$dir/version"
fi
