#!/usr/bin/env bash
# Issue 3's GPU checks in one call of the device tool.
#
# Here (no GPU needed), build with CUDA and bundle the binaries:
#   scripts/build.sh
#   ../shared/tools/gpu-bundle .gpu/bundle build/tests/backend_conformance_test \
#     build/tests/hf_agreement_test build/tests/e2e_test build/bench/posenc-bench-gpu
#   (.gpu/ is git-ignored; pass it in the device tool's `carry`)
# There, from the repository root:
#   bash scripts/gpu-check.sh .gpu/bundle
# Writes at most 8 files under $OUT: device facts, the three suites (CUDA
# cases run where a GPU is visible), compute-sanitizer memcheck and
# racecheck, posenc-bench-gpu and the PyTorch / torch.compile / Liger peers.
set -uo pipefail
bundle=${1:?usage: gpu-check.sh BUNDLE_DIR}
out=${OUT:-/tmp/gpu-check}
mkdir -p "$out"
export POSENC_HF_FIXTURES=$PWD/tests/hf/hf_fixtures.json
lib="$bundle/lib"

nvidia-smi > "$out/device.txt" 2>&1
for t in backend_conformance_test hf_agreement_test e2e_test; do
  "$bundle/run" "$t" > "$out/$t.txt" 2>&1
  echo "$t: $(tail -n 3 "$out/$t.txt" | tr '\n' ' ')"
done
for tool in memcheck racecheck; do
  LD_LIBRARY_PATH="$lib" compute-sanitizer --tool "$tool" --error-exitcode 9 \
    "$bundle/bin/backend_conformance_test" --gtest_filter='*cuda*:*Cuda*' > "$out/sanitizer-$tool.txt" 2>&1
  echo "compute-sanitizer $tool: exit $? ($(grep -c 'ERROR SUMMARY: 0 errors' "$out/sanitizer-$tool.txt") clean summaries)"
done
"$bundle/run" posenc-bench-gpu --json="$out/gpu_bench.json" | tee -a "$out/device.txt"
PYTHONUNBUFFERED=1 python3 bench/peers/rope_peers.py --json "$out/peers.json" | tee -a "$out/device.txt"
