#!/usr/bin/env bash
# Sets up, builds and runs every test (labels cpu, gpu, e2e). GPU cases skip
# cleanly where no device is visible.
set -euo pipefail
cd "$(dirname "$0")/.."
# The tests drive Python tools (the Python client, tritonclient, grpcurl,
# the deploy checks) in virtual environments of their own.
scripts/install-deps.sh python3 python3-venv
# Tests on, whatever an earlier configure of the build directory said (the
# Dockerfile's arguments turn them off); a run with none is an error.
POSENC_CMAKE_ARGS="${POSENC_CMAKE_ARGS:-} -DPOSENC_BUILD_TESTS=ON -DPOSENC_KERNEL_TESTS=ON" \
  scripts/build.sh
cd "${POSENC_BUILD_DIR:-build}"
ctest --output-on-failure --no-tests=error -j "$(nproc)" --timeout 600 "$@"
