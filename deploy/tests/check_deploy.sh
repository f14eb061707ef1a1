#!/usr/bin/env bash
# Lints the Dockerfile, renders every overlay, validates the objects against
# the Kubernetes schemas (offline), checks posenc's invariants, and runs
# checkov's Kubernetes policies on each overlay pinned by digest (as a
# production deploy pins it: a kustomization with `images: digest:`).
#   check_deploy.sh TOOLS_VENV
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
venv=$1
"$root/scripts/install-test-tools.sh" "$venv" > /dev/null
"$venv/bin/hadolint" --failure-threshold warning "$root/Dockerfile"
echo "Dockerfile: hadolint clean"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
digest=sha256:$(printf '%s' posenc | sha256sum | cut -d' ' -f1)
for overlay in cpu gpu monitoring sidecar; do
  "$venv/bin/kubectl" kustomize "$root/deploy/overlays/$overlay" > "$out/$overlay.yaml"
  "$venv/bin/kubernetes-validate" --strict -k 1.33.0 "$out/$overlay.yaml" > "$out/$overlay.log" 2>&1 ||
    { cat "$out/$overlay.log"; exit 1; }
  echo "$overlay: renders and validates against Kubernetes 1.33"
  "$venv/bin/python" "$root/deploy/tests/check_manifests.py" "$overlay" "$out/$overlay.yaml"

  # Pinned by digest through kustomize, the way docs/deploy.md tells a user to.
  mkdir -p "$out/pin-$overlay"
  rel=$(realpath --relative-to="$out/pin-$overlay" "$root/deploy/overlays/$overlay")
  printf '%s\n' "apiVersion: kustomize.config.k8s.io/v1beta1" "kind: Kustomization" \
    "resources: [$rel]" "images:" "  - name: posenc" "    newName: registry.example.com/posenc" \
    "    digest: $digest" > "$out/pin-$overlay/kustomization.yaml"
  "$venv/bin/kubectl" kustomize "$out/pin-$overlay" > "$out/$overlay-pinned.yaml"
  grep -q "image: registry.example.com/posenc@$digest" "$out/$overlay-pinned.yaml" ||
    { echo "$overlay: the image cannot be pinned by digest"; exit 1; }
  "$venv/bin/checkov" --quiet --compact --framework kubernetes -f "$out/$overlay-pinned.yaml" \
    > "$out/$overlay-checkov.log" 2>&1 || { cat "$out/$overlay-checkov.log"; exit 1; }
  echo "$overlay: pinned by digest; checkov $(grep -o 'Passed checks: [0-9]*, Failed checks: [0-9]*' "$out/$overlay-checkov.log")"
done
