#!/usr/bin/env bash
# Served calls, end to end, on one host (issue 24's figures): perf_analyzer
# (from the tritonclient 2.40.0 wheel) drives rope_qk over KServe gRPC
# against posenc-server, once per backend (--default_backend=cpu, =cuda and
# =auto, one server each; auto at 1 and 16 callers only), for three shapes,
# three ways of moving tensors and three concurrencies:
#   shapes   decode  32 x 1 x (32+8) x 128 FP32 (batch 32, one token each)
#            1mib    1 x 128 x (12+4) x 128 FP32
#            prefill 1 x 4096 x (32+8) x 128 FP32 (80 MiB)
#   paths    socket (tensors in the message), system (--shared-memory=system),
#            cuda (--shared-memory=cuda: perf_analyzer's device buffers by
#            IPC handle, computed in place; GPU server only)
#   callers  1, 4, 16
# One CSV line per point: throughput, client p50/p99, the server's own
# queue and compute times per call (its statistics extension, as
# perf_analyzer reports them) and the server process's CPU time per call.
#   bench/gpu_serving.sh BUNDLE OUT.csv
# BUNDLE holds bin/posenc-server and bin/perf_analyzer and their libraries
# (../shared/tools/gpu-bundle; perf_analyzer also needs libcudart.so.12,
# found in the bundle, then in PyTorch's nvidia-cuda-runtime wheel). Without
# a GPU the cuda server and path are skipped, so this runs anywhere.
set -uo pipefail
bundle=$(cd "${1:?usage: gpu_serving.sh BUNDLE OUT.csv}" && pwd)
out_csv=${2:?usage: gpu_serving.sh BUNDLE OUT.csv}
# Measurement windows (ms): prefill calls take tens of ms each, so their
# windows are longer.
interval_ms=${SERVING_INTERVAL_MS:-1000}
prefill_interval_ms=${SERVING_PREFILL_INTERVAL_MS:-2500}
work=$(mktemp -d)
pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2> /dev/null && wait "$pid" 2> /dev/null
  rm -rf "$work"
}
trap cleanup EXIT

# perf_analyzer's libcudart.so.12: the bundle's, else PyTorch's wheel's.
cudart=
if ! [ -e "$bundle/lib/libcudart.so.12" ]; then
  cudart=$(python3 -c 'import nvidia.cuda_runtime as m, os; print(os.path.join(list(m.__path__)[0], "lib"))' 2> /dev/null)
fi
pa() { LD_LIBRARY_PATH="$bundle/lib${cudart:+:$cudart}" "$bundle/bin/perf_analyzer" "$@"; }
has_gpu=0
command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1 && has_gpu=1

start_server() {  # start_server BACKEND: 0 when serving
  : > "$work/port"
  "$bundle/run" posenc-server --listen=127.0.0.1:0 --port_file="$work/port" \
    --metrics_listen=127.0.0.1:0 --log_level=info --default_backend="$1" \
    --enable_system_shared_memory --enable_cuda_shared_memory \
    --max_request_bytes=$((128 << 20)) --max_inflight_bytes=$((8 << 30)) \
    > "$work/server-$1.log" 2>&1 &
  pid=$!
  for _ in $(seq 300); do
    [ -s "$work/port" ] && break
    kill -0 "$pid" 2> /dev/null || { pid=; return 1; }
    sleep 0.1
  done
  [ -s "$work/port" ] || return 1
  addr=127.0.0.1:$(cat "$work/port")
  for _ in $(seq 50); do
    metrics_port=$(grep -o 'metrics on port [0-9]*' "$work/server-$1.log" | grep -o '[0-9]*$')
    [ -n "$metrics_port" ] && break
    sleep 0.1
  done
  metrics=http://127.0.0.1:$metrics_port/metrics
}
stop_server() { kill "$pid" 2> /dev/null; wait "$pid" 2> /dev/null; pid=; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
ok_calls() {
  curl -fsS "$metrics" | awk '/^posenc_requests_total\{/ && /code="OK"/ &&
    /method="ModelInfer"/ {s += $NF} END {printf "%d\n", s}'
}

echo "backend,workload,path,concurrency,throughput_per_s,p50_us,p99_us,server_queue_us,server_compute_us,server_cpu_us_per_call" > "$out_csv"
workloads=("decode|32,1,32,128|32,1,8,128" "1mib|1,128,12,128|1,128,4,128"
  "prefill|1,4096,32,128|1,4096,8,128")
backends=(cpu)
[ "$has_gpu" = 1 ] && backends+=(cuda auto)
for backend in "${backends[@]}"; do
  if ! start_server "$backend"; then
    echo "posenc-server --default_backend=$backend did not start:" >&2
    tail -5 "$work/server-$backend.log" >&2
    continue
  fi
  paths=(socket system)
  [ "$backend" = cuda ] && paths+=(cuda)  # device tensors run on the GPU whatever the default
  for w in "${workloads[@]}"; do
    IFS='|' read -r name qshape kshape <<< "$w"
    IFS=, read -r -a d <<< "$qshape"
    out_bytes=$((d[0] * d[1] * d[2] * d[3] * 4))
    window=$interval_ms
    [ "$name" = prefill ] && window=$prefill_interval_ms
    for path in "${paths[@]}"; do
      extra=()
      [ "$path" = socket ] || extra=(--shared-memory="$path" "--output-shared-memory-size=$out_bytes")
      callers=(1 4 16)
      # AUTO is there to be compared with the better of the two at each size.
      [ "$backend" = auto ] && callers=(1 16)
      for c in "${callers[@]}"; do
        t0=$(cpu_ticks)
        n0=$(ok_calls)
        measure() {  # measure WINDOW_MS
          pa -m rope_qk -i grpc -u "$addr" --shape "query:$qshape" --shape "key:$kshape" \
            "${extra[@]}" --concurrency-range="$c" --measurement-interval="$1" \
            --stability-percentage=25 --max-trials=5 -f "$work/pa.csv" > "$work/pa.log" 2>&1
        }
        measure "$window"
        rc=$?
        # Not stable, or too few calls in the window: once more, twice as long.
        if [ "$rc" = 2 ] || [ "$rc" = 3 ]; then
          measure $((2 * window))
          rc=$?
        fi
        t1=$(cpu_ticks)
        n1=$(ok_calls)
        if [ "$rc" != 0 ]; then
          echo "$backend,$name,$path,$c,FAILED (perf_analyzer exit $rc: $(tail -1 "$work/pa.log" | tr ',' ';'))" >> "$out_csv"
          continue
        fi
        cpu=$(echo "$t0 $t1 $n0 $n1 $(getconf CLK_TCK)" |
          awk '{ if ($4 > $3) printf "%.0f", ($2 - $1) * 1e6 / $5 / ($4 - $3); else printf "" }')
        python3 - "$work/pa.csv" "$backend,$name,$path" "$cpu" >> "$out_csv" << 'PY'
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    q = r.get("Server Queue", "")
    compute = sum(float(r.get(k) or 0) for k in
                  ("Server Compute Input", "Server Compute Infer", "Server Compute Output"))
    print(f"{sys.argv[2]},{r['Concurrency']},{float(r['Inferences/Second']):.1f},"
          f"{r['p50 latency']},{r['p99 latency']},{q},{compute:.0f},{sys.argv[3]}")
PY
      done
    done
  done
  stop_server
done
if command -v column > /dev/null; then column -s, -t < "$out_csv"; else cat "$out_csv"; fi
