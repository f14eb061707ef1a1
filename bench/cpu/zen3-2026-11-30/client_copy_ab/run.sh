#!/usr/bin/env bash
# A/B of the C++ client's copies out of its shared-memory slices: OLD is
# posenc-bench-shm built at fc61897 (memcpy), NEW at this commit
# (CopyHostBytes), alternated, against one server of this commit.
#   run.sh OLD_BENCH NEW_BENCH OUT_DIR [ROUNDS]
set -euo pipefail
root=$(cd "$(dirname "$0")/../../../.." && pwd)
old=$1 new=$2 out=$3 rounds=${4:-4}
mkdir -p "$out"
work=$(mktemp -d)
"$root/build/server/posenc-server" --listen=127.0.0.1:0 --port_file="$work/port" \
  --metrics_listen= --enable_system_shared_memory \
  --max_request_bytes=$((128 << 20)) > "$work/server.log" 2>&1 &
pid=$!
trap 'kill "$pid"; wait "$pid" || true; rm -rf "$work"' EXIT
for _ in $(seq 300); do [ -s "$work/port" ] && break; sleep 0.1; done
for r in $(seq "$rounds"); do
  for which in old new; do
    bin=$old; [ "$which" = new ] && bin=$new
    echo "# round $r $which load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/$which.csv"
    for w in decode "1 MiB"; do
      "$bin" --target="127.0.0.1:$(cat "$work/port")" --server_pid="$pid" --rounds=1 \
        --calls=2000 --only="$w" --paths=shared_memory >> "$out/$which.csv"
    done
  done
done
