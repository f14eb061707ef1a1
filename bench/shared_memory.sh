#!/usr/bin/env bash
# The KServe v2 front with and without system shared memory: the same RoPE
# (and sinusoidal, and ALiBi) requests driven closed-loop by perf_analyzer
# over ModelInfer, once with tensors in the message (socket) and once with
# --shared-memory=system (inputs and outputs in /dev/shm regions
# perf_analyzer registers), against one posenc-server started with --enable_system_shared_memory, alternating
# the two, each point measured in 2 s windows until stable. Prints one CSV
# line per workload, path, round and concurrency; server_cpu_us_per_call is
# the server process's CPU time (user + system, /proc) over the run divided
# by the calls it answered OK, so the client's own cost is left out.
#   bench/shared_memory.sh [ROUNDS]   (after scripts/build.sh and
#                                      scripts/install-kserve-tools.sh)
# POSENC_SERVER: another posenc-server binary to drive (an older commit's,
# for a before/after in the same hour; sinusoidal-x and alibi-add need one
# that reads model files' "inputs", 2026-11-30 or later). SHM_BENCH_PATHS: the paths to run
# (default "socket system_shm"); SHM_BENCH_MAX_TRIALS: perf_analyzer's
# --max-trials (default 6; more on a busy host, where 6 windows may not
# settle within 15%).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rounds=${1:-2}
venv=$root/build/kserve-venv
export LD_LIBRARY_PATH=$(dirname "$(find "$venv" -name libcudart.so.12 | head -1)")
work=$(mktemp -d)
mkdir "$work/models"
echo '{"operation": "sinusoidal", "inputs": ["x"]}' > "$work/models/sinusoidal-x.json"
echo '{"operation": "attention_bias", "inputs": ["logits"], "parameters": {"causal": true}}' \
  > "$work/models/alibi-add.json"
"${POSENC_SERVER:-$root/build/server/posenc-server}" --listen=127.0.0.1:0 --port_file="$work/port" \
  --metrics_listen=127.0.0.1:0 --log_level=info --enable_system_shared_memory \
  --max_request_bytes=$((128 << 20)) --model_dir="$work/models" \
  > "$work/server.log" 2>&1 &
pid=$!
trap 'kill "$pid"; wait "$pid" || true; rm -rf "$work"' EXIT
for _ in $(seq 300); do [ -s "$work/port" ] && break; sleep 0.1; done
addr=127.0.0.1:$(cat "$work/port")
metrics=http://127.0.0.1:$(grep -o 'metrics on port [0-9]*' "$work/server.log" | grep -o '[0-9]*$')/metrics
cpu_ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
ok_calls() {
  curl -fsS "$metrics" | awk '/^posenc_requests_total\{/ && /code="OK"/ &&
    /method="ModelInfer"/ {s += $NF} END {printf "%d\n", s}'
}
mark() { mark_ticks=$(cpu_ticks); mark_calls=$(ok_calls); }
cpu_per_call() {
  echo "$(cpu_ticks) $(ok_calls) $mark_ticks $mark_calls $(getconf CLK_TCK)" |
    awk '{printf "%.0f", ($1 - $3) * 1e6 / $5 / ($2 - $4)}'
}

# name | model | its inputs' shapes. perf_analyzer refuses shared memory
# for models with optional inputs, so it drives rope_qk (query and key, both
# required) and two repository models that take only their tensor
# (sinusoidal-x, alibi-add; --model_dir below). It sends the datatype the
# model announces, FP32, so the prefill-size request (4096 tokens x (32 +
# 8) heads x 128) is 80 MiB, the bytes of 8192 FP16 tokens; the server
# takes requests up to 128 MiB for it. 1 MiB: 128 tokens x (12 + 4) heads x
# 128 FP32. perf_analyzer's own random data (no optional input to leave
# out). SHM_BENCH_WORKLOADS: the names to run (default all).
workloads=(
  "rope_1mib|rope_qk|query:1,128,12,128 key:1,128,4,128"
  "prefill_4096x(32+8)x128|rope_qk|query:1,4096,32,128 key:1,4096,8,128"
  "sinusoidal_16mib|sinusoidal-x|x:1,4096,1024"
  "alibi_16mib|alibi-add|logits:1,16,512,512"
)
echo "workload,path,round,concurrency,throughput_per_s,p50_us,p99_us,server_cpu_us_per_call"
for w in "${workloads[@]}"; do
  IFS='|' read -r name model shapes <<< "$w"
  case " ${SHM_BENCH_WORKLOADS:-$name} " in *" $name "*) ;; *) continue ;; esac
  pa_shapes=()
  for s in $shapes; do pa_shapes+=(--shape "$s"); done
  # Output regions as large as the first input (the largest output).
  IFS=, read -r -a dims <<< "${shapes%% *}"
  dims[0]=${dims[0]#*:}
  out_bytes=4
  for d in "${dims[@]}"; do out_bytes=$((out_bytes * d)); done
  for round in $(seq "$rounds"); do
    for path in ${SHM_BENCH_PATHS:-socket system_shm}; do
      extra=()
      [ "$path" = socket ] ||
        extra=(--shared-memory=system "--output-shared-memory-size=$out_bytes")
      mark
      "$venv/bin/perf_analyzer" -m "$model" -i grpc -u "$addr" "${pa_shapes[@]}" \
        "${extra[@]}" --concurrency-range=1:4:3 \
        --measurement-interval=2000 --stability-percentage=15 --max-trials=${SHM_BENCH_MAX_TRIALS:-6} \
        -f "$work/pa.csv" > "$work/pa.log" 2>&1 || { cat "$work/pa.log"; exit 1; }
      "$venv/bin/python" - "$work/pa.csv" "$name" "$path" "$round" "$(cpu_per_call)" <<'PY'
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    print(f"{sys.argv[2]},{sys.argv[3]},{sys.argv[4]},{r['Concurrency']},"
          f"{float(r['Inferences/Second']):.1f},{r['p50 latency']},{r['p99 latency']},{sys.argv[5]}")
PY
    done
  done
done
