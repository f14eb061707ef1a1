#!/usr/bin/env bash
# Makes the virtual environment the Python client's tests run in (default
# build/python-client-venv): pinned grpcio, protobuf, numpy, ml_dtypes and
# pytest from PyPI, then `pip install ./client/python` as a user would (an
# isolated build that fetches grpcio-tools and generates the stubs). The
# package is reinstalled whenever its sources or proto/ change.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-build/python-client-venv}
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"  # ctest may start two users of the venv at once
flock 9
scripts/install-deps.sh python3-venv > /dev/null
pins="grpcio==1.85.3 protobuf==7.36.2 numpy==2.4.6 ml_dtypes==0.5.4 pytest==9.2.0"
if [ "$(cat "$venv/pins.stamp" 2>/dev/null)" != "$pins" ] ||
  ! "$venv/bin/python" -c "import grpc, numpy, ml_dtypes, pytest" 2>/dev/null; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  # shellcheck disable=SC2086  # one argument per pin
  "$venv/bin/pip" install -q --disable-pip-version-check $pins
  echo "$pins" > "$venv/pins.stamp"
fi
stamp=$(cat client/python/pyproject.toml client/python/setup.py proto/posenc/v1/posenc.proto \
  $(find client/python/src -name '*.py' -o -name py.typed | sort) | sha256sum | cut -c1-16)
if [ "$(cat "$venv/posenc-client.stamp" 2>/dev/null)" != "$stamp" ]; then
  # Built from a copy (pip builds a directory in place): nothing is written
  # into the source tree, so two build directories' runs cannot race there,
  # and no stale build output of an earlier run reaches the wheel.
  copy=$(mktemp -d)
  trap 'rm -rf "$copy"' EXIT
  mkdir -p "$copy/client" "$copy/proto/posenc/v1"
  cp proto/posenc/v1/posenc.proto "$copy/proto/posenc/v1/"
  cp -r client/python "$copy/client/"
  rm -rf "$copy/client/python/build" "$copy"/client/python/src/*.egg-info
  "$venv/bin/pip" install -q --disable-pip-version-check --force-reinstall --no-deps \
    "$copy/client/python"
  echo "$stamp" > "$venv/posenc-client.stamp"
fi
echo "python client in $venv"
