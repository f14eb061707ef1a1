#!/usr/bin/env bash
# The GPU checks (issues 3, 9), for the device tool (a lent GPU).
#
# Here (no GPU needed), build with CUDA and pack the binaries:
#   scripts/build.sh && scripts/gpu-pack.sh      (-> .gpu/bundle.tar.xz, ~16 MB)
#   (.gpu/ is git-ignored; pass it in the device tool's `carry`)
# There, from the repository root, two calls (each step has its own timeout
# below): suites and bench (about 2 minutes on an H100), then serving
# (about 5 minutes):
#   tar -C .gpu -xJf .gpu/bundle.tar.xz &&
#     bash scripts/gpu-check.sh .gpu/bundle suites bench
#   tar -C .gpu -xJf .gpu/bundle.tar.xz && bash scripts/gpu-check.sh .gpu/bundle serving
# and, with device time left, ncu peers sanitizers.
# Peers need Liger-Kernel as a wheel in .whl/ (carried, installed with
# pip --target; see bench/RESULTS.md), or they run without it.
# Steps: suites, memcheck, racecheck, synccheck, initcheck (sanitizers: all
# four), bench, bench-base, serving, ncu, peers, copy; none named: all but
# serving, bench-base and copy, in that order. `copy` (about 40 s) times the
# host CPU's memcpy against posenc::CopyHostBytes (posenc-bench-cpu
# --only=copy, into summary.txt): whether this host has glibc's slow
# `rep movsb` case that CopyHostBytes avoids (docs/shared-memory.md).
#
# Files under $OUT, 8 over all steps (the device tool takes back at most 8):
#   summary.txt     device facts, one verdict line per step, the benchmark and
#                   peer tables, the Nsight Compute figures (also on stdout)
#   suites.txt      the four suites' output
#   sanitizers.txt  compute-sanitizer's output, tool after tool
#   ncu.txt         Nsight Compute's report on one RoPE, sinusoidal and bias kernel each
#   gpu_bench.json  posenc-bench-gpu's figures
#   gpu_bench_base.json  the same from the baseline binary (bench-base)
#   peers.json      rope_peers.py's figures
#   serving.csv     bench/gpu_serving.sh's figures (served calls)
# Every step runs under its own `timeout` (seconds; override with the
# environment: TIMEOUT_SUITE per suite, TIMEOUT_SANITIZER per tool and
# binary, TIMEOUT_BENCH, TIMEOUT_NCU, TIMEOUT_PEERS). Test counts come from
# gtest's per-test lines; a sanitizer step that ran no CUDA test fails.
# Exits 1 when a step failed.
set -uo pipefail
bundle=${1:?usage: gpu-check.sh BUNDLE_DIR [STEP...]}
shift
out=${OUT:-/tmp/gpu-check}
mkdir -p "$out"
export POSENC_HF_FIXTURES=$PWD/tests/conformance/hf/hf_fixtures.json
lib="$bundle/lib"
summary="$out/summary.txt"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0

t_suite=${TIMEOUT_SUITE:-150}
t_sanitizer=${TIMEOUT_SANITIZER:-120}
t_bench=${TIMEOUT_BENCH:-180}
t_ncu=${TIMEOUT_NCU:-120}
t_peers=${TIMEOUT_PEERS:-300}
t_serving=${TIMEOUT_SERVING:-400}
t_copy=${TIMEOUT_COPY:-120}

say() { echo "$*" | tee -a "$summary"; }
verdict() {  # verdict NAME OK DETAIL: one line per step; a failure fails the run
  if [ "$2" = 1 ]; then
    say "PASS $1: $3"
  else
    say "FAIL $1: $3"
    failures=$((failures + 1))
  fi
}
timed_out() { [ "$1" = 124 ] || [ "$1" = 137 ]; }

# gtest's per-test result lines end in "(N ms)"; its closing summary repeats
# the failed and skipped names without one, so only the former are counted.
count() { grep -cE "^\[ *$1 *\] .* \([0-9]+ ms\)\$" "$2"; }
counts() {  # counts LOG: "ran R (P passed, F failed, S skipped)"
  local p f s
  p=$(count OK "$1")
  f=$(count FAILED "$1")
  s=$(count SKIPPED "$1")
  echo "ran $((p + f)) ($p passed, $f failed, $s skipped)"
}

# The CUDA instances of a suite: parameterised tests print as
# "Backends/BackendTest." then "  RopeEveryScaling/3  # GetParam() = "cuda"",
# and gtest filters match names only, so the names are collected from
# --gtest_list_tests (plus any test whose own name says CUDA, except those
# that check the no-GPU answer and skip where a GPU is visible).
cuda_tests() {  # cuda_tests BINARY > names, one per line
  "$bundle/run" "$1" --gtest_list_tests 2>/dev/null | awk '
    /^[^ ]/ { suite = $1; next }
    /^  / {
      name = suite $1
      if (name ~ /WithoutGpu|OnFakeRuntime/) next
      if ($0 ~ /GetParam\(\) = "cuda"/ || name ~ /[Cc][Uu][Dd][Aa]/) print name
    }'
}

device_facts() {
  {
    echo "== $(date -u +%FT%TZ) gpu-check.sh $*"
    nvidia-smi --query-gpu=name,driver_version,memory.total,ecc.mode.current,clocks.max.sm \
      --format=csv 2>&1 || echo "nvidia-smi failed: no GPU visible?"
    # The host CPU picks the CPU kernels' clone (AVX-512, AVX2 or baseline),
    # which the CUDA results are compared with bit for bit.
    echo "host CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)," \
      "$(nproc) threads, avx512f: $(grep -qw avx512f /proc/cpuinfo && echo yes || echo no)," \
      "avx2: $(grep -qw avx2 /proc/cpuinfo && echo yes || echo no)"
  } | tee -a "$summary"
}

step_suites() {
  : > "$out/suites.txt"
  local t rc log names
  for t in backend_conformance_test hf_agreement_test bloom_left_padding_test e2e_test \
           kserve_cuda_shared_memory_test; do
    if [ ! -x "$bundle/bin/$t" ]; then
      verdict "suite $t" 0 "not in the bundle"
      continue
    fi
    log="$tmp/$t.log"
    names="$tmp/$t.cuda"
    cuda_tests "$t" > "$names"
    timeout -k 10 "$t_suite" "$bundle/run" "$t" > "$log" 2>&1
    rc=$?
    { echo "===== $t (exit $rc)"; cat "$log"; } >> "$out/suites.txt"
    # CUDA instances that ran and passed (not skipped): the point of a GPU.
    local cuda_ok
    cuda_ok=$(grep -E '^\[       OK \] ' "$log" | awk '{print $4}' | grep -cxFf "$names")
    local detail
    detail="$(counts "$log"); CUDA instances passed: $cuda_ok of $(wc -l < "$names"); exit $rc"
    timed_out "$rc" && detail="$detail; timed out after ${t_suite}s"
    local ok=0
    [ "$rc" = 0 ] && [ "$(count FAILED "$log")" = 0 ] && ok=1
    # Where the suite has CUDA instances, a GPU run must have passed every
    # one: a skip there is a proof not made (the H200 run of 2026-11-27
    # skipped the CUDA IPC test and still said PASS).
    if [ -s "$names" ] && [ "$cuda_ok" != "$(wc -l < "$names")" ]; then ok=0; fi
    verdict "suite $t" "$ok" "$detail"
  done
}

# The first of the candidates that is executable, or nothing.
first_tool() {
  local c
  for c in "$@"; do
    if [ -x "$c" ]; then
      echo "$c"
      return
    fi
  done
}

sanitizer_bin=""
step_sanitizer() {  # step_sanitizer TOOL
  local tool=$1 t names filter log rc errors n
  if [ -z "$sanitizer_bin" ]; then
    sanitizer_bin=$(first_tool "$(command -v compute-sanitizer)" \
      /usr/local/cuda/bin/compute-sanitizer)
    : > "$out/sanitizers.txt"
  fi
  if [ -z "$sanitizer_bin" ]; then
    verdict "compute-sanitizer $tool" 0 "compute-sanitizer not found"
    return
  fi
  for t in backend_conformance_test hf_agreement_test bloom_left_padding_test; do
    [ -x "$bundle/bin/$t" ] || continue
    names="$tmp/$t.cuda"
    cuda_tests "$t" > "$names"
    n=$(wc -l < "$names")
    if [ "$n" = 0 ]; then
      verdict "compute-sanitizer $tool $t" 0 "no CUDA tests found in --gtest_list_tests"
      continue
    fi
    filter=$(paste -sd: "$names")
    log="$tmp/$t.$tool.log"
    LD_LIBRARY_PATH="$lib" timeout -k 10 "$t_sanitizer" "$sanitizer_bin" --tool "$tool" \
      --error-exitcode 9 "$bundle/bin/$t" --gtest_filter="$filter" > "$log" 2>&1
    rc=$?
    { echo "===== compute-sanitizer --tool $tool $t, $n tests selected (exit $rc)"; cat "$log"; } \
      >> "$out/sanitizers.txt"
    # "========= ERROR SUMMARY: 3 errors", or racecheck's "RACECHECK
    # SUMMARY: 0 hazards displayed (0 errors, 0 warnings)"; none when killed.
    errors=$(sed -nE -e 's/.*ERROR SUMMARY: ([0-9]+) error.*/\1/p' \
      -e 's/.*RACECHECK SUMMARY: .*\(([0-9]+) error.*/\1/p' "$log" | tail -n 1)
    local ran ok=0 detail
    ran=$(($(count OK "$log") + $(count FAILED "$log")))
    detail="$(counts "$log") of $n selected; sanitizer errors: ${errors:-no summary}; exit $rc"
    timed_out "$rc" && detail="$detail; timed out after ${t_sanitizer}s"
    [ "$ran" = 0 ] && detail="$detail; no test ran"
    if [ "$rc" = 0 ] && [ "${errors:-x}" = 0 ] && [ "$ran" -gt 0 ] &&
      [ "$(count FAILED "$log")" = 0 ]; then
      ok=1
    fi
    verdict "compute-sanitizer $tool $t" "$ok" "$detail"
  done
}

step_bench() {
  local rc
  say "--- posenc-bench-gpu"
  timeout -k 10 "$t_bench" "$bundle/run" posenc-bench-gpu --json="$out/gpu_bench.json" \
    > "$tmp/bench.log" 2>&1
  rc=$?
  tee -a "$summary" < "$tmp/bench.log"
  local ok=0
  [ "$rc" = 0 ] && [ -s "$out/gpu_bench.json" ] && ok=1
  verdict "posenc-bench-gpu" "$ok" "exit $rc$(timed_out "$rc" && echo "; timed out after ${t_bench}s")"
}

step_copy() {
  local rc
  say "--- posenc-bench-cpu --only=copy (host CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2))"
  timeout -k 10 "$t_copy" "$bundle/run" posenc-bench-cpu --only=copy --reps=5 \
    > "$tmp/copy.log" 2>&1
  rc=$?
  tee -a "$summary" < "$tmp/copy.log"
  local ok=0
  [ "$rc" = 0 ] && grep -q CopyHostBytes "$tmp/copy.log" && ok=1
  verdict "posenc-bench-cpu --only=copy" "$ok" "exit $rc$(timed_out "$rc" && echo "; timed out after ${t_copy}s")"
}

# The same benchmark built from another commit (scripts/gpu-pack.sh with
# POSENC_BASE_BENCH), run right after `bench` on the same GPU: the A/B of a
# kernel change. Skipped when the bundle has none.
step_bench_base() {
  local rc
  if [ ! -x "$bundle/bin/posenc-bench-gpu-base" ]; then
    say "SKIP bench-base: no posenc-bench-gpu-base in the bundle"
    return
  fi
  say "--- posenc-bench-gpu-base (the baseline commit's kernels)"
  timeout -k 10 "$t_bench" "$bundle/run" posenc-bench-gpu-base \
    --json="$out/gpu_bench_base.json" > "$tmp/bench_base.log" 2>&1
  rc=$?
  tee -a "$summary" < "$tmp/bench_base.log"
  local ok=0
  [ "$rc" = 0 ] && [ -s "$out/gpu_bench_base.json" ] && ok=1
  verdict "posenc-bench-gpu-base" "$ok" "exit $rc$(timed_out "$rc" && echo "; timed out after ${t_bench}s")"
}

step_ncu() {
  local ncu rc kernel
  ncu=$(first_tool "$(command -v ncu)" /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu)
  if [ -z "$ncu" ]; then
    say "SKIP ncu: Nsight Compute (ncu) is not installed"
    return
  fi
  : > "$out/ncu.txt"
  # One launch of each kernel: the first timed one of its case (the bench
  # warms up with 5 and times 30): RoPE bf16 NEOX and GPT-J 16384 tokens
  # (launches 6 and 41), the bf16 sinusoidal add, ALiBi + causal added to
  # bf16 logits. posenc-bench-gpu has no
  # repetition flag; the unprofiled launches run at full speed, only the
  # profiled one is replayed. Clocks are left as found (--clock-control
  # none), as the benchmark sees them; caches are still flushed between
  # replays.
  local case skip
  for case in RopeKernel:5 RopeKernel:40 AbsoluteKernel:5 BiasKernel:5; do
    kernel=${case%:*}
    skip=${case#*:}
    LD_LIBRARY_PATH="$lib" timeout -k 10 "$t_ncu" "$ncu" --target-processes all \
      --clock-control none --kernel-name "regex:$kernel" --launch-skip "$skip" --launch-count 1 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
      --section ComputeWorkloadAnalysis --section WarpStateStats --section LaunchStats \
      --metrics dram__bytes.sum.per_second,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,dram__bytes_read.sum,dram__bytes_write.sum \
      "$bundle/bin/posenc-bench-gpu" > "$tmp/ncu.$case.txt" 2>&1
    rc=$?
    { echo "===== $kernel, launch $((skip + 1)) (exit $rc)"; cat "$tmp/ncu.$case.txt"; } >> "$out/ncu.txt"
    say "--- Nsight Compute, $kernel launch $((skip + 1)) ($("$ncu" --version | tail -n 1))"
    grep -E "$kernel|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per Thread|Issue Slots Busy|Executed Ipc Active|dram__bytes|dram__throughput|sm__warps_active|smsp__inst_executed.sum|Stall|ERR_|==ERROR==" \
      "$tmp/ncu.$case.txt" | head -n 30 | tee -a "$summary"
    local ok=0 detail="exit $rc"
    if [ "$rc" = 0 ] && grep -q 'Achieved Occupancy' "$tmp/ncu.$case.txt" &&
      grep -qE 'Memory Throughput|dram__bytes.sum.per_second' "$tmp/ncu.$case.txt"; then
      ok=1
    fi
    grep -q ERR_NVGPUCTRPERM "$tmp/ncu.$case.txt" &&
      detail="$detail; performance counters are restricted to admin users on this machine"
    timed_out "$rc" && detail="$detail; timed out after ${t_ncu}s"
    verdict "ncu $kernel launch $((skip + 1)) memory throughput and occupancy" "$ok" "$detail"
  done
}

# Served calls end to end (issue 24): bench/gpu_serving.sh with the
# bundle's posenc-server and perf_analyzer; CPU and GPU servers, socket,
# system and CUDA shared memory, decode / 1 MiB / prefill, 1, 4, 16 callers.
step_serving() {
  local rc
  if [ ! -x "$bundle/bin/posenc-server" ] || [ ! -x "$bundle/bin/perf_analyzer" ]; then
    verdict "serving" 0 "posenc-server or perf_analyzer is not in the bundle"
    return
  fi
  say "--- served calls (perf_analyzer, rope_qk)"
  timeout -k 10 "$t_serving" bash bench/gpu_serving.sh "$bundle" "$out/serving.csv" \
    > "$tmp/serving.log" 2>&1
  rc=$?
  tee -a "$summary" < "$tmp/serving.log"
  local points failed cuda
  points=$(tail -n +2 "$out/serving.csv" 2> /dev/null | wc -l)
  failed=$(grep -c FAILED "$out/serving.csv" 2> /dev/null)
  cuda=$(grep -c '^cuda,[a-z0-9]*,cuda,[0-9]*,[0-9]' "$out/serving.csv" 2> /dev/null)
  local ok=0
  [ "$rc" = 0 ] && [ "$points" -gt 0 ] && [ "$cuda" -gt 0 ] && ok=1
  verdict "serving" "$ok" "exit $rc; $points points, $failed failed, $cuda through CUDA shared memory$(timed_out "$rc" && echo "; timed out after ${t_serving}s")"
}

step_peers() {
  local rc
  if ! python3 -c 'import torch' > /dev/null 2>&1; then
    say "SKIP peers: python3 cannot import torch here"
    return
  fi
  say "--- RoPE peers"
  PYTHONUNBUFFERED=1 timeout -k 10 "$t_peers" python3 bench/peers/rope_peers.py \
    --json "$out/peers.json" > "$tmp/peers.log" 2>&1
  rc=$?
  tee -a "$summary" < "$tmp/peers.log"
  local ok=0
  [ "$rc" = 0 ] && [ -s "$out/peers.json" ] && ok=1
  verdict "peers" "$ok" "exit $rc$(timed_out "$rc" && echo "; timed out after ${t_peers}s")"
}

: > "$summary"
steps=("$@")
[ ${#steps[@]} = 0 ] && steps=(suites sanitizers bench ncu peers)
device_facts "${steps[@]}"
for s in "${steps[@]}"; do
  case $s in
    suites) step_suites ;;
    sanitizers) for tool in memcheck racecheck synccheck initcheck; do step_sanitizer "$tool"; done ;;
    memcheck | racecheck | synccheck | initcheck) step_sanitizer "$s" ;;
    bench) step_bench ;;
    bench-base) step_bench_base ;;
    serving) step_serving ;;
    ncu) step_ncu ;;
    peers) step_peers ;;
    copy) step_copy ;;
    *) verdict "$s" 0 "unknown step (suites, sanitizers, memcheck, racecheck, synccheck, initcheck, bench, bench-base, serving, ncu, peers, copy)" ;;
  esac
done
files=$(find "$out" -type f | wc -l)
say "== $failures step(s) failed; $files file(s) under $out"
[ "$failures" = 0 ]
