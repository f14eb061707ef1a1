#!/usr/bin/env bash
# Installs the KServe Python model server the peer benchmark runs
# (bench/peers/kserve_numpy, bench/kserve_peer.sh), pinned, into its own
# virtual environment (default build/kserve-peer-venv). Its own, because
# kserve 0.21 needs protobuf >= 6 and grpcio >= 1.73 while tritonclient
# 2.40 (perf_analyzer's wheel, build/kserve-venv) wants protobuf 3.
# Every package is pinned: bench/peers/kserve_numpy/requirements.txt is the
# pip freeze of what kserve==0.21.0 resolved to (Python 3.11, 2026-11-25).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-build/kserve-peer-venv}
if ! "$venv/bin/python" -c "import kserve, numpy, grpc" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check --no-deps \
    -r bench/peers/kserve_numpy/requirements.txt
fi
echo "kserve peer in $venv"
