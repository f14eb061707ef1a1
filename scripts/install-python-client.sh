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
if [ ! -x "$venv/bin/pytest" ] ||
  ! "$venv/bin/python" -c "import grpc, numpy, ml_dtypes" 2>/dev/null; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check \
    grpcio==1.85.3 protobuf==7.36.2 numpy==2.4.6 ml_dtypes==0.5.4 pytest==9.2.0
fi
stamp=$(cat client/python/pyproject.toml client/python/setup.py proto/posenc/v1/posenc.proto \
  $(find client/python/src -name '*.py' -o -name py.typed | sort) | sha256sum | cut -c1-16)
if [ "$(cat "$venv/posenc-client.stamp" 2>/dev/null)" != "$stamp" ]; then
  # A stale in-tree build directory could carry removed modules into the wheel.
  rm -rf client/python/build
  "$venv/bin/pip" install -q --disable-pip-version-check --force-reinstall --no-deps ./client/python
  echo "$stamp" > "$venv/posenc-client.stamp"
fi
echo "python client in $venv"
