#!/usr/bin/env bash
# Runs the KServe v2 client tests (test_kserve_clients.py) with the pinned
# clients from scripts/install-kserve-tools.sh against a posenc-server binary.
#   run_kserve_tests.sh VENV POSENC_SERVER [pytest args...]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
venv=$1
server=$2
shift 2
"$root/scripts/install-kserve-tools.sh" "$venv" > /dev/null
venv=$(cd "$venv" && pwd)
cudart=$(dirname "$(find "$venv" -name 'libcudart.so.12' | head -1)")
export POSENC_SERVER=$server PERF_ANALYZER=$venv/bin/perf_analyzer
export LD_LIBRARY_PATH=$cudart${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
exec "$venv/bin/python" -m pytest -q -s -p no:cacheprovider "$root/tests/kserve" "$@"
