#!/usr/bin/env bash
# Sets up, builds and runs every test (labels cpu, gpu, e2e). GPU cases skip
# cleanly where no device is visible.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
cd "${POSENC_BUILD_DIR:-build}"
ctest --output-on-failure -j "$(nproc)" --timeout 600 "$@"
