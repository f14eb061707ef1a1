#!/usr/bin/env bash
# Installs the KServe v2 / Triton clients the kserve tests drive posenc with,
# pinned, into a virtual environment (default build/kserve-venv):
# tritonclient[grpc] 2.40.0, whose wheel ships perf_analyzer; the CUDA
# runtime library perf_analyzer links (libcudart.so.12, from NVIDIA's wheel;
# no GPU is used); numpy and pytest. perf_analyzer also needs Debian's
# libb64-0d, installed through install-deps.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-build/kserve-venv}
# Tests that share this venv run in parallel under ctest: one installs while
# the others wait, so none runs a tool pip is rewriting (checkov died of
# SIGBUS that way on a fresh machine).
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
scripts/install-deps.sh libb64-0d > /dev/null
if [ ! -x "$venv/bin/perf_analyzer" ] || [ ! -x "$venv/bin/pytest" ] ||
  ! "$venv/bin/python" -c "import tritonclient.grpc, numpy" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check \
    "tritonclient[grpc]==2.40.0" grpcio==1.85.3 protobuf==3.20.3 \
    nvidia-cuda-runtime-cu12==12.4.127 numpy==2.4.6 pytest==9.2.0
fi
echo "kserve tools in $venv/bin"
