#!/usr/bin/env bash
# Installs the build tree into a temporary prefix, then configures, builds and
# runs a separate CMake project that finds it with find_package(posenc).
set -euo pipefail
build_dir=$1
src_dir=$(cd "$(dirname "$0")" && pwd)/consumer
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" > "$work/install.log"
# The .proto files ship for other languages and grpcurl.
test -f "$work/prefix/share/posenc/proto/posenc/v1/posenc.proto" ||
  { echo "posenc.proto not installed"; exit 1; }
test -f "$work/prefix/share/posenc/proto/kserve/grpc_service.proto" ||
  { echo "kserve/grpc_service.proto not installed"; exit 1; }
# CUDA hidden: find_package(posenc) for the client must not look for it.
cmake -S "$src_dir" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=TRUE > "$work/configure.log" ||
  { cat "$work/configure.log"; exit 1; }
cmake --build "$work/build" -j 2 > "$work/build.log" || { cat "$work/build.log"; exit 1; }
"$work/build/consumer"
