#!/usr/bin/env bash
# scripts/fuzz.sh [SECONDS] [HARNESS...]
# Fuzzes each libFuzzer harness (default: all) for SECONDS (default 600)
# from its seed corpus, in the clang ASan+UBSan build scripts/sanitize.sh
# uses (build-asan; configured here if missing), and prints a markdown row
# per harness for tests/fuzz/RESULTS.md. New inputs go to
# build-asan/fuzz/<harness>/corpus; copy the interesting ones into the seed
# corpus by hand (`<harness> -merge=1 tests/fuzz/<harness> <that dir>`).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
shift || true
harnesses=("$@")
[ ${#harnesses[@]} -gt 0 ] || harnesses=(request_fuzz kserve_request_fuzz kserve_model_file_fuzz kserve_log_settings_fuzz kserve_trace_settings_fuzz safetensors_fuzz npy_fuzz hf_config_fuzz trace_context_fuzz memory_limit_fuzz decoded_size_fuzz)
build=${POSENC_ASAN_DIR:-build-asan}
scripts/install-deps.sh
scripts/install-deps.sh clang libclang-rt-14-dev llvm-14
if [ ! -f "$build/CMakeCache.txt" ]; then
  CC=clang CXX=clang++ cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DPOSENC_ENABLE_CUDA=OFF -DPOSENC_BUILD_BENCH=OFF -DPOSENC_SANITIZE=address,undefined \
    -DPOSENC_BUILD_FUZZERS=ON
fi
cmake --build "$build" -j "$(nproc)" --target "${harnesses[@]}"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
echo "| harness | seconds | executions | exec/s | corpus units | new crashes |"
echo "| --- | --- | --- | --- | --- | --- |"
for h in "${harnesses[@]}"; do
  bin=$(find "$build" -type f -name "$h" -perm -u+x | head -1)
  work="$build/fuzz/$h"
  mkdir -p "$work"
  if tests/fuzz/run_fuzzer.sh "$bin" "tests/fuzz/$h" "tests/fuzz/$h.dict" "$seconds" "$work" \
       >"$work.out" 2>&1; then crashed=0; else crashed=1; fi
  runs=$(awk '/stat::number_of_executed_units/ {print $2}' "$work/stats")
  rate=$(awk '/stat::average_exec_per_sec/ {print $2}' "$work/stats")
  units=$(find "$work/corpus" "tests/fuzz/$h" -type f | wc -l)
  echo "| $h | $seconds | ${runs:-?} | ${rate:-?} | $units | $crashed |"
  [ $crashed -eq 0 ] || { tail -40 "$work.out"; exit 1; }
done
