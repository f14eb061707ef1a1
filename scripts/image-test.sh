#!/usr/bin/env bash
# Builds the CPU image from the Dockerfile without a container daemon, runs it
# the way a pod runs it, and talks to it; CI runs this after the tests.
#
#   scripts/image-test.sh            # needs root (mounts), Debian's packages
#
# How, since these machines have no Docker engine:
#   1. the base images come from Debian's archive: mmdebstrap makes a minbase
#      bookworm root (with the doc/man/locale excludes of Debian's -slim
#      images) and buildah tags it debian:12 and debian:12-slim, so no
#      registry is pulled from;
#   2. `buildah bud --isolation=chroot --storage-driver=vfs` builds the
#      Dockerfile's `cpu` target, every RUN step as written;
#   3. deploy/tests/check_image.py mounts the image read-only and starts its
#      ENTRYPOINT with its Env as user 10001 (what deploy/base asks of a pod:
#      runAsUser 10001, readOnlyRootFilesystem), then checks health,
#      reflection, a RoPE call against a float64 reference, /metrics and a
#      SIGTERM drain, and reports the image's size and contents;
#   4. the same for the `cuda` target on stand-in bases (see below), unless
#      POSENC_IMAGE_CUDA=0 (what .ci/run sets, for CI's time).
# Everything lives under one scratch directory removed at exit
# (POSENC_IMAGE_KEEP=1 keeps it).
set -euo pipefail
cd "$(dirname "$0")/.."

[ "$(id -u)" -eq 0 ] || { echo "image-test: needs root (mount, chroot)" >&2; exit 2; }
scripts/install-deps.sh buildah mmdebstrap uidmap
scripts/install-test-tools.sh build/tools-venv >/dev/null
[ -x build/client/posenc-cli ] || { echo "image-test: build first (scripts/build.sh)" >&2; exit 2; }

work=$(mktemp -d "${TMPDIR:-/tmp}/posenc-image.XXXXXX")
buildah=(buildah --root "$work/storage" --runroot "$work/run" --storage-driver vfs)
cleanup() {
  if [ "${POSENC_IMAGE_KEEP:-0}" = 1 ]; then
    echo "image-test: kept $work"
    return
  fi
  "${buildah[@]}" rm --all >/dev/null 2>&1 || true
  "${buildah[@]}" rmi --all --force >/dev/null 2>&1 || true
  # vfs layers can hold read-only directories; make them removable first.
  chmod -R u+w "$work" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

started=$(date +%s)
echo "image-test: base images from Debian's archive"
mmdebstrap --variant=minbase --quiet \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
  bookworm "$work/rootfs.tar" \
  "deb http://deb.debian.org/debian bookworm main" \
  "deb http://deb.debian.org/debian bookworm-updates main" \
  "deb http://deb.debian.org/debian-security bookworm-security main" </dev/null
base=$("${buildah[@]}" from scratch)
"${buildah[@]}" add "$base" "$work/rootfs.tar" / >/dev/null
"${buildah[@]}" config --cmd /bin/bash "$base"
"${buildah[@]}" commit --quiet "$base" docker.io/library/debian:12 >/dev/null
"${buildah[@]}" tag docker.io/library/debian:12 docker.io/library/debian:12-slim
"${buildah[@]}" rm "$base" >/dev/null
rm -f "$work/rootfs.tar"
echo "image-test: bases ready in $(($(date +%s) - started)) s"

echo "image-test: buildah bud --target cpu"
built=$(date +%s)
"${buildah[@]}" bud --quiet --isolation=chroot --pull=never --layers=false \
  --target cpu -t localhost/posenc:cpu . >"$work/bud.log" 2>&1 || {
  tail -50 "$work/bud.log"
  echo "image-test: image build failed" >&2
  exit 1
}
echo "image-test: image built in $(($(date +%s) - built)) s"

check=(build/tools-venv/bin/python deploy/tests/check_image.py --buildah="${buildah[*]}"
  --cli=build/client/posenc-cli --grpcurl=build/tools-venv/bin/grpcurl --work="$work")
"${check[@]}" --image=localhost/posenc:cpu --base=docker.io/library/debian:12-slim

# The CUDA stages, as far as a machine without a GPU or NVIDIA's registry
# goes: their bases are stand-ins (Debian plus the toolkit CI compiles with,
# at the same paths; the runtime base is plain Debian since cudart is linked
# statically and the driver comes from the node). Every RUN step of the
# Dockerfile's cuda target runs, nvcc included; then the bundle's libraries
# must all resolve by ldd inside the image, and the server must start and
# serve from the CPU when no GPU is visible (AUTO) and refuse to start when
# told --default_backend=cuda (what the gpu overlay relies on).
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
if [ "${POSENC_IMAGE_CUDA:-1}" = 1 ] && [ -x "$nvcc" ]; then
  # Ask nvcc where its toolkit is: the nvcc found on PATH may be a wrapper
  # script (a CI machine's /usr/local/bin/nvcc execs the real one), whose
  # own directory is not the toolkit.
  cuda_root=$("$nvcc" --dryrun -c -x cu /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -1)
  cuda_root=$(readlink -f "${cuda_root:-$(dirname "$(readlink -f "$nvcc")")/..}")
  if [ ! -f "$cuda_root/bin/nvcc" ] || [ ! -f "$cuda_root/include/cuda_runtime.h" ]; then
    echo "image-test: $nvcc names $cuda_root as its toolkit, which has no bin/nvcc or include/cuda_runtime.h" >&2
    exit 1
  fi
  echo "image-test: CUDA stand-in bases from $cuda_root"
  # The compiler, headers and runtime only: the math libraries (cuBLAS,
  # cuDNN, ...) posenc does not link are left out. The toolkit goes in as a
  # plain directory at /usr/local/cuda with hard links stored as copies: a
  # CI machine's tar held /usr/local/cuda as a link to /usr/local/cuda-13.0,
  # which buildah's copier could not create ("link ...: operation not
  # permitted"); a tree with no links at its top cannot fail that way.
  tar -C "$cuda_root" -cf "$work/cuda.tar" --hard-dereference \
    --transform='flags=r;s,^\.,usr/local/cuda,' \
    --exclude='libcublas*' --exclude='libcudnn*' --exclude='libcufft*' --exclude='libcusolver*' \
    --exclude='libcusparse*' --exclude='libcurand*' --exclude='libnccl*' --exclude='libnvblas*' \
    --exclude='libcupti*' --exclude='libnvperf*' --exclude='libnvrtc*' --exclude='libnvJitLink*' \
    --exclude='libcheckpoint*' --exclude='libnpp*' --exclude='libnvjpeg*' --exclude='libpcsampling*' \
    --exclude=dist-info --exclude=doc --exclude=extras --exclude='nsight*' \
    --exclude=compute-sanitizer --exclude=libnvvp .
  devel=$("${buildah[@]}" from --pull-never docker.io/library/debian:12)
  "${buildah[@]}" add "$devel" "$work/cuda.tar" / >/dev/null
  "${buildah[@]}" config --env PATH=/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env CUDA_HOME=/usr/local/cuda "$devel"
  "${buildah[@]}" commit --quiet "$devel" localhost/cuda-devel-standin >/dev/null
  "${buildah[@]}" rm "$devel" >/dev/null
  rm -f "$work/cuda.tar"
  cuda_built=$(date +%s)
  "${buildah[@]}" bud --quiet --isolation=chroot --pull=never --layers=false --target cuda \
    --build-arg CUDA_DEVEL_IMAGE=localhost/cuda-devel-standin \
    --build-arg CUDA_RUNTIME_IMAGE=docker.io/library/debian:12-slim \
    -t localhost/posenc:cuda . >"$work/bud-cuda.log" 2>&1 || {
    tail -50 "$work/bud-cuda.log"
    echo "image-test: CUDA image build failed" >&2
    exit 1
  }
  echo "image-test: CUDA image built in $(($(date +%s) - cuda_built)) s"
  "${check[@]}" --image=localhost/posenc:cuda --base=docker.io/library/debian:12-slim --cuda
else
  echo "image-test: no nvcc here; the CUDA stages were not built"
fi
echo "image-test: passed in $(($(date +%s) - started)) s"
