#!/usr/bin/env bash
# The HTTP floor (benches/floor.py): inferd on digits against nginx answering the same bytes, at 1 and 64 clients.
# Installs Debian's nginx-light where no nginx is (as root, from the Debian mirror), builds the release binaries,
# then runs the comparison; extra arguments go to floor.py (--duration, --rounds).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nginx >/dev/null && [ ! -x /usr/sbin/nginx ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "floor: nginx is missing; install Debian's nginx-light (apt-get install nginx-light) and run again" >&2
        exit 1
    fi
    apt-get install -y --no-install-recommends nginx-light >/dev/null || {
        apt-get update >/dev/null
        apt-get install -y --no-install-recommends nginx-light >/dev/null
    }
    # The package starts its own nginx on port 80 where a service manager runs it: the bench starts its own.
    service nginx stop >/dev/null 2>&1 || true
fi
./scripts/setup.sh
cargo build --release --locked -p inferd-server -p inferd-benches
python3 benches/floor.py "$@"
