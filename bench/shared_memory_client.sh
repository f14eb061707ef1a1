#!/usr/bin/env bash
# The C++ client with shared memory (kRequire) against the same client on the
# socket (kOff), against one posenc-server started with
# --enable_system_shared_memory (and room for the 80 MiB prefill request):
# posenc-bench-shm prints one CSV line per workload, round and path.
#   bench/shared_memory_client.sh [ROUNDS] [CALLS] [BENCH FLAGS...]   (after scripts/build.sh)
# e.g. bench/shared_memory_client.sh 3 4000 --only=tiny --paths=shared_memory
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
"$root/build/server/posenc-server" --listen=127.0.0.1:0 --port_file="$work/port" \
  --metrics_listen= --enable_system_shared_memory \
  --max_request_bytes=$((128 << 20)) > "$work/server.log" 2>&1 &
pid=$!
trap 'kill "$pid"; wait "$pid" || true; rm -rf "$work"' EXIT
for _ in $(seq 300); do [ -s "$work/port" ] && break; sleep 0.1; done
"$root/build/bench/posenc-bench-shm" --target="127.0.0.1:$(cat "$work/port")" \
  --server_pid="$pid" --rounds="${1:-3}" --calls="${2:-200}" "${@:3}"
