#!/usr/bin/env bash
# Installs everything posenc needs to build and test on Debian 12, or, given
# package names, just those (scripts/sanitize.sh asks for clang this way).
# Idempotent: packages already present are skipped by apt. Runs as root or via sudo.
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libpng-dev zlib1g-dev prometheus-cpp-dev openssl libssl-dev
  libb64-0d
)

if [ $# -gt 0 ]; then packages=("$@"); fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all packages present"
  exit 0
fi

sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install-deps: installed ${missing[*]}"
