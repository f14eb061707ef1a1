#!/usr/bin/env bash
# Issue 26's measurements on whatever CPU this is, into one folder:
#
#   bench/cpu/issue26_run.sh OUT      # after scripts/build.sh (or scripts/test.sh)
#
# - machine.txt: lscpu, the AVX-512 flags, the commit, /proc/loadavg before and after;
# - run1-3.txt: posenc-bench-cpu --reps=21, and check.txt: issue26_check.py on them
#   (the issue's "done when": exit status 0 only when every row passes in every run);
# - sinusoidal_positions_{one,cycle16}.txt: what the sinusoidal add's tables cost here;
# - icount.txt: posenc-count-instructions (instructions per element, exact);
# - compute.txt: posenc-bench-compute (one thread, tensors in L2);
# - on an AVX-512 CPU, run_no_avx512bf16.txt (POSENC_NO_AVX512BF16=1: the bf16
#   loops of a CPU with AVX-512 but not its BF16 extension) and
#   run_no_avx512.txt (POSENC_NO_AVX512=1: the AVX2 loops), one run each, and
#   run_lane_test_{0,1}.txt and compute_lane_test_{0,1}.txt (RoPE only, and
#   posenc-bench-compute, under POSENC_LANE_TEST: bf16 NEOX's pairs tested by
#   PairsToRedo, or in 16-bit lanes);
# - emulation.txt: avx512_emulation_test, which on an AVX-512 BF16 CPU holds
#   the emulation CI tests the 512-bit loops with against the instructions,
#   then bf16_wide_native_test (both narrowings of bf16_wide.h, natively)
#   (docs/testing.md); its failure is reported, not fatal here.
#
# Measure when /proc/loadavg is quiet; the bench's ratios are to a
# read-modify-write timed in the same run, but a busy host still moves them.
# Exit status: issue26_check.py's.
set -euo pipefail

out=${1:?usage: bench/cpu/issue26_run.sh OUT}
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=$root/build/bench
for tool in posenc-bench-cpu posenc-count-instructions posenc-bench-compute; do
  [[ -x $bin/$tool ]] || { echo "missing $bin/$tool: build first (scripts/build.sh)" >&2; exit 2; }
done
mkdir -p "$out"

{
  echo "commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "date $(date -u +%FT%TZ)"
  echo "loadavg before $(cat /proc/loadavg)"
  lscpu
  echo "avx512 flags: $(grep -o 'avx512[a-z0-9_]*' /proc/cpuinfo | sort -u | tr '\n' ' ')"
} > "$out/machine.txt"

for i in 1 2 3; do
  "$bin/posenc-bench-cpu" --reps=21 > "$out/run$i.txt"
done
status=0
python3 "$root/bench/cpu/issue26_check.py" "$out"/run{1,2,3}.txt > "$out/check.txt" || status=$?

for positions in one cycle16; do
  "$bin/posenc-bench-cpu" --reps=21 --only=sinusoidal --positions=$positions \
    > "$out/sinusoidal_positions_$positions.txt"
done
"$bin/posenc-count-instructions" > "$out/icount.txt"
"$bin/posenc-bench-compute" > "$out/compute.txt"

if grep -q avx512f /proc/cpuinfo; then
  POSENC_NO_AVX512BF16=1 "$bin/posenc-bench-cpu" --reps=21 > "$out/run_no_avx512bf16.txt"
  POSENC_NO_AVX512=1 "$bin/posenc-bench-cpu" --reps=21 > "$out/run_no_avx512.txt"
  # RoPE with bfloat16 NEOX pairs tested by PairsToRedo (0) and in 16-bit
  # lanes (1), whichever this CPU takes by default (CpuTakesLaneTest).
  for lane in 0 1; do
    POSENC_LANE_TEST=$lane "$bin/posenc-bench-cpu" --reps=21 --only=rope > "$out/run_lane_test_$lane.txt"
    POSENC_LANE_TEST=$lane "$bin/posenc-bench-compute" > "$out/compute_lane_test_$lane.txt"
  done
fi

emulation_test=$root/build/tests/support/avx512_emulation_test
if [[ -x $emulation_test ]]; then
  "$emulation_test" > "$out/emulation.txt" 2>&1 || echo "avx512_emulation_test FAILED: $out/emulation.txt"
fi
narrowing_test=$root/build/kernels/bf16_wide_native_test
if [[ -x $narrowing_test ]]; then
  "$narrowing_test" >> "$out/emulation.txt" 2>&1 || echo "bf16_wide_native_test FAILED: $out/emulation.txt"
fi

echo "loadavg after $(cat /proc/loadavg)" >> "$out/machine.txt"
cat "$out/check.txt"
exit "$status"
