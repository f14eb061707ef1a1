#!/usr/bin/env bash
# Installs dependencies (if missing) and builds posenc into ./build (Release).
# CUDA code is compiled whenever nvcc is found (on PATH or /usr/local/cuda).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
build_dir=${POSENC_BUILD_DIR:-build}
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release ${POSENC_CMAKE_ARGS:-}
cmake --build "$build_dir" -j "$(nproc)"
