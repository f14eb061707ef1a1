#!/usr/bin/env bash
# The Dockerfile's final stages hold only what scripts/bundle-runtime.sh packs:
# bundle the binaries, start the bundled server with only its own libraries
# beside the system ones, wait until it serves, then SIGTERM must exit 0.
#   check_bundle.sh POSENC_SERVER POSENC_CLI
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$(mktemp -d)
trap 'kill $pid 2>/dev/null || true; rm -rf "$out"' EXIT
"$root/scripts/bundle-runtime.sh" "$out/posenc" "$1" "$2"
LD_LIBRARY_PATH="$out/posenc/lib" "$out/posenc/bin/posenc-server" --listen=127.0.0.1:0 \
  --metrics_listen= --port_file="$out/port" --log_level=warn &
pid=$!
for _ in $(seq 100); do [ -s "$out/port" ] && break; sleep 0.1; done
[ -s "$out/port" ] || { echo "bundled server did not start"; exit 1; }
LD_LIBRARY_PATH="$out/posenc/lib" "$out/posenc/bin/posenc-cli" --target="127.0.0.1:$(cat "$out/port")" \
  table --dim=4 --count=2 --base=100
kill -TERM $pid
wait $pid
echo "bundled server served and exited 0 on SIGTERM"
