#!/usr/bin/env bash
# Runs the KServe v2 client tests (test_kserve_clients.py) with the pinned
# clients from scripts/install-kserve-tools.sh against a posenc-server binary.
#   run_kserve_tests.sh VENV POSENC_SERVER [pytest args...]
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
venv=$1
server=$2
shift 2
"$root/scripts/install-kserve-tools.sh" "$venv" > /dev/null
venv=$(cd "$venv" && pwd)
cudart=$(dirname "$(find "$venv" -name 'libcudart.so.12' | head -1)")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Our protocol files as descriptors, compared with tritonclient's own.
protoc -I "$root/proto" --include_imports --descriptor_set_out="$work/kserve.desc" \
  "$root/proto/kserve/grpc_service.proto"
export POSENC_KSERVE_DESCRIPTORS=$work/kserve.desc
export POSENC_SERVER=$server PERF_ANALYZER=$venv/bin/perf_analyzer
export LD_LIBRARY_PATH=$cudart${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
"$venv/bin/python" -m pytest -q -s -p no:cacheprovider "$root/tests/system/kserve" "$@"
