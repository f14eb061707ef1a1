#!/usr/bin/env bash
# Packs what a lent GPU runs (scripts/gpu-check.sh) into .gpu/bundle.tar.xz,
# small enough for the device tool's 64 MiB carry: the test suites, the GPU
# benchmark, posenc-server and perf_analyzer (from scripts/install-kserve-
# tools.sh's venv) with their libraries (../shared/tools/gpu-bundle), and
# the libcudart.so.12 perf_analyzer links to. Unpacked there with
#   tar -C .gpu -xJf .gpu/bundle.tar.xz
# (run after scripts/build.sh; .gpu/ is git-ignored).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${POSENC_BUILD_DIR:-build}
venv=$build/kserve-venv
scripts/install-kserve-tools.sh "$venv" > /dev/null
cudart=$(find "$venv" -name 'libcudart.so.12' | head -1)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
# POSENC_BASE_BENCH=PATH: another commit's posenc-bench-gpu, packed as
# posenc-bench-gpu-base so that gpu-check.sh's bench-base step times both
# kernels on the same GPU in the same call (an A/B of a kernel change).
# POSENC_BASE_COMMIT=REV builds that binary first, from REV in a worktree of
# its own under the build directory (a minute or two: the benchmark alone).
base=()
if [ -n "${POSENC_BASE_COMMIT:-}" ]; then
  tree=$PWD/$build/base-$(git rev-parse --short "$POSENC_BASE_COMMIT")
  if [ ! -x "$tree/build/bench/posenc-bench-gpu" ]; then
    rm -rf "$tree"
    git worktree prune
    git worktree add --detach "$tree" "$POSENC_BASE_COMMIT" > /dev/null
    cmake -S "$tree" -B "$tree/build" -DCMAKE_BUILD_TYPE=Release -DPOSENC_BUILD_TESTS=OFF \
      -DPOSENC_BUILD_SERVER=OFF > "$tree.cmake.log"
    cmake --build "$tree/build" -j2 --target posenc-bench-gpu > "$tree.build.log"
  fi
  POSENC_BASE_BENCH=$tree/build/bench/posenc-bench-gpu
fi
if [ -n "${POSENC_BASE_BENCH:-}" ]; then
  mkdir -p "$stage/base"
  cp -L "$POSENC_BASE_BENCH" "$stage/base/posenc-bench-gpu-base"
  base=("$stage/base/posenc-bench-gpu-base")
fi
LD_LIBRARY_PATH=$(dirname "$cudart") ../shared/tools/gpu-bundle "$stage/bundle" \
  "$build/tests/conformance/backend_conformance_test" \
  "$build/tests/conformance/hf_agreement_test" \
  "$build/tests/conformance/bloom_left_padding_test" \
  "$build/tests/system/e2e_test" \
  "$build/server/kserve/kserve_cuda_shared_memory_test" \
  "$build/bench/posenc-bench-gpu" \
  "$build/bench/posenc-bench-cpu" \
  "$build/server/posenc-server" \
  "$venv/bin/perf_analyzer" "${base[@]}"
cp "$cudart" "$stage/bundle/lib/"
mkdir -p .gpu
rm -rf .gpu/bundle .gpu/bundle.tar.xz
tar -C "$stage" -cJf .gpu/bundle.tar.xz bundle
ls -la .gpu/bundle.tar.xz
