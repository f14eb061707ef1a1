#!/usr/bin/env bash
# Runs the Python client's pytest suite in the venv of
# scripts/install-python-client.sh against a posenc-server binary.
#   run_tests.sh VENV POSENC_SERVER [pytest args...]
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
venv=$1
export POSENC_SERVER=$2
shift 2
"$root/scripts/install-python-client.sh" "$venv" > /dev/null
venv=$(cd "$venv" && pwd)
POSENC_SERVER=$(realpath "$POSENC_SERVER")
# From outside the source tree, so `import posenc` is the installed package.
cd "$(mktemp -d)"
trap 'rm -rf "$PWD"' EXIT
"$venv/bin/python" -m pytest -q -s -p no:cacheprovider "$root/client/python/tests" "$@"
