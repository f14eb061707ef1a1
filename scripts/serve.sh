#!/usr/bin/env bash
# Sets up and starts posenc-server on 0.0.0.0:50051 (override with
# POSENC_LISTEN or flags passed to this script). Serves from the GPU when one
# is visible and the build has CUDA, from the CPU otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
exec "${POSENC_BUILD_DIR:-build}/server/posenc-server" "$@"
