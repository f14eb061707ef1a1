#!/usr/bin/env bash
# posenc's KServe v2 front against the peer a user would build instead: a
# KServe Python model server (kserve 0.21, bench/peers/kserve_numpy) doing the
# same RoPE in numpy. Both are started here, pinned to the same CPUs
# (POSENC_PEER_CPUS, default 0-1), checked to give the same answers
# (peers/kserve_numpy/check.py: tritonclient vs a float64 numpy reference),
# then driven by the same perf_analyzer command (closed loop, 2 s windows until
# stable) at concurrency 1, 4 and 16, alternating servers each round.
# Prints one CSV line per server, workload, round and concurrency, then the
# ratios posenc / peer (throughput: > 1 means posenc is ahead; p50 and p99
# latency: < 1 means posenc is ahead), as ranges over the rounds.
#   bench/kserve_peer.sh [ROUNDS [FIRST]]   (default 1 round, numbered from 1;
#                                            e.g. "1 2" runs round 2 alone,
#                                            so rounds can be separate lock holds)
#   bench/kserve_peer.sh --check    (start both, check.py, stop)
# Variants (environment): POSENC_PEER_ARGS, more server.py flags (e.g.
# --predict_in_threads); POSENC_PEER_MODEL, the peer model perf_analyzer
# drives (default rope; rope_echo answers its inputs unrotated);
# POSENC_PEER_SERVERS, which to measure (default "posenc peer").
# Needs scripts/build.sh; installs scripts/install-kserve-tools.sh and
# scripts/install-kserve-peer.sh's venvs if missing. Not a ctest test.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
check_only=0
rounds=1
first=${2:-1}
case "${1:-}" in
  --check) check_only=1 ;;
  "") ;;
  *) rounds=$1 ;;
esac
cpus=${POSENC_PEER_CPUS:-0-1}
peer_model=${POSENC_PEER_MODEL:-rope}
measure=${POSENC_PEER_SERVERS:-posenc peer}
"$root/scripts/install-kserve-tools.sh" > /dev/null
"$root/scripts/install-kserve-peer.sh" > /dev/null
tools=$root/build/kserve-venv
peer_venv=$root/build/kserve-peer-venv
export LD_LIBRARY_PATH=$(dirname "$(find "$tools" -name libcudart.so.12 | head -1)")
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2> /dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2> /dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

taskset -c "$cpus" "$root/build/server/posenc-server" --listen=127.0.0.1:0 \
  --port_file="$work/port" --log_level=warning > "$work/posenc.log" 2>&1 &
pids+=($!)
# kserve takes fixed ports: two free ones, asked of the kernel.
read -r grpc_port http_port < <("$tools/bin/python" -c '
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')
taskset -c "$cpus" "$peer_venv/bin/python" "$root/bench/peers/kserve_numpy/server.py" \
  --grpc_port="$grpc_port" --http_port="$http_port" --enable_latency_logging=false \
  ${POSENC_PEER_ARGS:-} > "$work/peer.log" 2>&1 &
pids+=($!)
for _ in $(seq 300); do [ -s "$work/port" ] && break; sleep 0.1; done
posenc=127.0.0.1:$(cat "$work/port")
peer=127.0.0.1:$grpc_port
"$tools/bin/python" - "$posenc" "$peer" <<'PY' || { cat "$work/posenc.log" "$work/peer.log"; exit 1; }
import sys, time
import tritonclient.grpc as g
for url in sys.argv[1:]:
    c = g.InferenceServerClient(url)
    for _ in range(600):
        try:
            if c.is_model_ready("rope"):
                break
        except Exception:
            pass
        time.sleep(0.1)
    else:
        sys.exit(f"{url}: model rope not ready after 60 s")
PY
"$tools/bin/python" "$root/bench/peers/kserve_numpy/check.py" "$posenc" "$peer"
[ "$check_only" = 1 ] && exit 0

echo "peer: $("$peer_venv/bin/python" -c 'import importlib.metadata as m, sys; print(*[p + " " + m.version(p) for p in ("kserve", "numpy", "grpcio", "protobuf")], "python " + sys.version.split()[0], sep=", ")'); peer model $peer_model ${POSENC_PEER_ARGS:-}; posenc $(git -C "$root" rev-parse --short HEAD); perf_analyzer from tritonclient 2.40.0; CPUs $cpus of $(nproc); $(lscpu | sed -n 's/^Model name: *//p')" >&2

# name | query shape | key heads (0: none)
workloads=("prefill_1mib|1,128,16,128|0" "decode_32x1|32,1,32,128|8")
csv=$work/all.csv
echo "server,workload,round,concurrency,throughput_per_s,p50_us,p99_us" | tee "$csv"
for round in $(seq "$first" $((first + rounds - 1))); do
  for w in "${workloads[@]}"; do
    IFS='|' read -r name shape key_heads <<< "$w"
    "$tools/bin/python" - "$shape" "$key_heads" "$work/$name.json" <<'PY'
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
    # Alternate which server goes first, so drift over time favours neither.
    order=("posenc $posenc" "peer $peer")
    [ $((round % 2)) = 0 ] && order=("peer $peer" "posenc $posenc")
    for entry in "${order[@]}"; do
      read -r server addr <<< "$entry"
      [[ " $measure " == *" $server "* ]] || continue
      model=rope
      [ "$server" = peer ] && model=$peer_model
      for c in 1 4 16; do
        rm -f "$work/pa.csv"
        "$tools/bin/perf_analyzer" -m "$model" -i grpc -u "$addr" "${pa_shapes[@]}" \
          --input-data="$work/$name.json" --concurrency-range="$c:$c" \
          --measurement-interval=2000 --stability-percentage=15 --max-trials=6 \
          -f "$work/pa.csv" > "$work/pa.log" 2>&1 || {
          # No stable point within --max-trials: said, and the point left out.
          grep -q "Failed to obtain stable measurement" "$work/pa.log" ||
            { cat "$work/pa.log"; exit 1; }
          echo "$server $name round $round: no stable point at $c callers" >&2
          continue
        }
        "$tools/bin/python" - "$work/pa.csv" "$server" "$name" "$round" <<'PY' | tee -a "$csv"
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    print(f"{sys.argv[2]},{sys.argv[3]},{sys.argv[4]},{r['Concurrency']},"
          f"{float(r['Inferences/Second']):.1f},{r['p50 latency']},{r['p99 latency']}")
PY
      done
    done
  done
done
"$tools/bin/python" - "$csv" <<'PY'
import collections, csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
by = collections.defaultdict(dict)
for r in rows:
    by[(r["workload"], int(r["concurrency"]), r["round"])][r["server"]] = r
ratios = collections.defaultdict(list)
for (w, c, _), s in by.items():
    if "posenc" in s and "peer" in s:
        p, q = s["posenc"], s["peer"]
        ratios[(w, c)].append((float(p["throughput_per_s"]) / float(q["throughput_per_s"]),
                               float(p["p50_us"]) / float(q["p50_us"]),
                               float(p["p99_us"]) / float(q["p99_us"])))
rng = lambda xs: f"{min(xs):.3g}" if min(xs) == max(xs) else f"{min(xs):.3g}-{max(xs):.3g}"
print("\nworkload,concurrency,rounds,throughput posenc/peer,p50 posenc/peer,p99 posenc/peer")
for (w, c), v in sorted(ratios.items()):
    print(f"{w},{c},{len(v)},{rng([x[0] for x in v])},{rng([x[1] for x in v])},"
          f"{rng([x[2] for x in v])}")
PY
