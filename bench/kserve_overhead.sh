#!/usr/bin/env bash
# The KServe v2 front's overhead against the native posenc.v1 API: the same
# RoPE requests (same tensors, default positions) driven closed-loop by
# perf_analyzer over inference.GRPCInferenceService/ModelInfer and by
# posenc-loadgen over posenc.v1.PositionalEncoding/ApplyRope, against one
# posenc-server, alternating tools, each point measured in 2 s windows until
# stable. Prints one CSV line per tool, workload, round and concurrency;
# server_cpu_us_per_call is the server process's CPU time (user + system,
# /proc) over the whole tool run divided by the calls it answered OK
# (posenc_requests_total), so the client's own cost is left out.
#   bench/kserve_overhead.sh [ROUNDS]   (after scripts/build.sh and
#                                         scripts/install-kserve-tools.sh)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rounds=${1:-2}
venv=$root/build/kserve-venv
export LD_LIBRARY_PATH=$(dirname "$(find "$venv" -name libcudart.so.12 | head -1)")
work=$(mktemp -d)
"$root/build/server/posenc-server" --listen=127.0.0.1:0 --port_file="$work/port" \
  --metrics_listen=127.0.0.1:0 --log_level=info > "$work/server.log" 2>&1 &
pid=$!
trap 'kill "$pid"; wait "$pid" || true; rm -rf "$work"' EXIT
for _ in $(seq 300); do [ -s "$work/port" ] && break; sleep 0.1; done
addr=127.0.0.1:$(cat "$work/port")
metrics=http://127.0.0.1:$(grep -o 'metrics on port [0-9]*' "$work/server.log" | grep -o '[0-9]*$')/metrics
cpu_ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
ok_calls() {
  curl -fsS "$metrics" | awk '/^posenc_requests_total\{/ && /code="OK"/ &&
    /method="(ModelInfer|ApplyRope)"/ {s += $NF} END {printf "%d\n", s}'
}
# Server CPU microseconds per OK call since the mark.
mark() { mark_ticks=$(cpu_ticks); mark_calls=$(ok_calls); }
cpu_per_call() {
  echo "$(cpu_ticks) $(ok_calls) $mark_ticks $mark_calls $(getconf CLK_TCK)" |
    awk '{printf "%.0f", ($1 - $3) * 1e6 / $5 / ($2 - $4)}'
}

# name | query shape | key heads (0: none)
workloads=("prefill_1mib|1,128,16,128|0" "decode_32x1|32,1,32,128|8")
echo "tool,workload,round,concurrency,throughput_per_s,p50_us,p99_us,server_cpu_us_per_call"
for round in $(seq "$rounds"); do
  for w in "${workloads[@]}"; do
    IFS='|' read -r name shape key_heads <<< "$w"
    "$venv/bin/python" - "$shape" "$key_heads" "$work/$name.json" <<'PY'
import base64, json, sys
import numpy as np
shape = [int(x) for x in sys.argv[1].split(",")]
kh = int(sys.argv[2])
rng = np.random.default_rng(0)
enc = lambda a: base64.b64encode(a.astype("<f4").tobytes()).decode()
d = {"query": {"b64": enc(rng.standard_normal(shape)), "shape": shape}}
if kh:
    k = shape[:2] + [kh, shape[3]]
    d["key"] = {"b64": enc(rng.standard_normal(k)), "shape": k}
json.dump({"data": [d]}, open(sys.argv[3], "w"))
PY
    pa_shapes=(--shape "query:$shape")
    [ "$key_heads" = 0 ] || pa_shapes+=(--shape "key:${shape%,*,*},$key_heads,${shape##*,}")
    mark
    "$venv/bin/perf_analyzer" -m rope -i grpc -u "$addr" "${pa_shapes[@]}" \
      --input-data="$work/$name.json" --concurrency-range=1:4 --measurement-interval=2000 \
      --stability-percentage=15 --max-trials=6 -f "$work/pa.csv" > "$work/pa.log" 2>&1 ||
      { cat "$work/pa.log"; exit 1; }
    "$venv/bin/python" - "$work/pa.csv" "$name" "$round" "$(cpu_per_call)" <<'PY'
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    if r["Concurrency"] in ("1", "2", "4"):
        print(f"perf_analyzer (v2 ModelInfer),{sys.argv[2]},{sys.argv[3]},{r['Concurrency']},"
              f"{float(r['Inferences/Second']):.0f},{r['p50 latency']},{r['p99 latency']},{sys.argv[4]}")
PY
    mark
    "$root/build/client/posenc-loadgen" --target="$addr" --op=rope --shape="$shape" \
      --key_heads="$key_heads" --dtype=fp32 --positions=index --baseline=none \
      --concurrency=1,2,4 --measurement_interval_ms=2000 --stability_percentage=15 \
      --max_trials=6 --json="$work/lg.json" > "$work/lg.log" 2>&1 ||
      [ $? = 6 ] || { cat "$work/lg.log"; exit 1; }
    "$venv/bin/python" - "$work/lg.json" "$name" "$round" "$(cpu_per_call)" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["runs"]:
    lat = r["latency_us"]
    print(f"posenc-loadgen (v1 ApplyRope),{sys.argv[2]},{sys.argv[3]},{r['concurrency']},"
          f"{r['requests_per_s']:.0f},{lat['p50']:.0f},{lat['p99']:.0f},{sys.argv[4]}")
PY
  done
done
