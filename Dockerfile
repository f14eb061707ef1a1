# syntax=docker/dockerfile:1
# posenc container images. Every RUN step calls a script CI also runs.
#
#   docker build -t posenc:cpu .                 # CPU image (the default, last stage)
#   docker build --target cuda -t posenc:cuda .  # CUDA image for GPU nodes
#
# Build, bundle and install are separate RUN steps on purpose: each is a
# cache layer (DL3059 is ignored for that reason).
#
# Both run as the non-root user 10001, need no writable root filesystem, and
# serve gRPC on 50051 and Prometheus metrics on 8002 (Triton's metrics port; 9090 is Prometheus's own).

ARG CUDA_VERSION=13.0.0
# The CUDA stages' bases. scripts/image-test.sh, which has no registry, swaps
# in local stand-ins made from Debian's archive and the CUDA toolkit CI
# already has (same toolkit version, same paths under /usr/local/cuda).
ARG CUDA_DEVEL_IMAGE=nvidia/cuda:${CUDA_VERSION}-devel-ubuntu24.04
ARG CUDA_RUNTIME_IMAGE=nvidia/cuda:${CUDA_VERSION}-base-ubuntu24.04

# ---------------------------------------------------------------- CUDA ----
FROM ${CUDA_DEVEL_IMAGE} AS build-cuda
WORKDIR /src
COPY scripts/install-deps.sh scripts/
RUN ["scripts/install-deps.sh"]
COPY . .
ENV POSENC_CMAKE_ARGS="-DPOSENC_REQUIRE_CUDA=ON -DPOSENC_BUILD_TESTS=OFF -DPOSENC_BUILD_BENCH=OFF"
RUN ["scripts/build.sh"]
# hadolint ignore=DL3059
RUN ["scripts/bundle-runtime.sh", "/opt/posenc", "build/server/posenc-server", "build/client/posenc-cli"]

FROM ${CUDA_RUNTIME_IMAGE} AS cuda
COPY --from=build-cuda /opt/posenc /opt/posenc
ENV LD_LIBRARY_PATH=/opt/posenc/lib \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 10001:10001
EXPOSE 50051 8002
ENTRYPOINT ["/opt/posenc/bin/posenc-server"]

# ----------------------------------------------------------------- CPU ----
FROM debian:12 AS build-cpu
WORKDIR /src
COPY scripts/install-deps.sh scripts/
RUN ["scripts/install-deps.sh"]
COPY . .
ENV POSENC_CMAKE_ARGS="-DPOSENC_ENABLE_CUDA=OFF -DPOSENC_BUILD_TESTS=OFF -DPOSENC_BUILD_BENCH=OFF"
RUN ["scripts/build.sh"]
# hadolint ignore=DL3059
RUN ["scripts/bundle-runtime.sh", "/opt/posenc", "build/server/posenc-server", "build/client/posenc-cli"]

FROM debian:12-slim AS cpu
COPY --from=build-cpu /opt/posenc /opt/posenc
ENV LD_LIBRARY_PATH=/opt/posenc/lib
USER 10001:10001
EXPOSE 50051 8002
ENTRYPOINT ["/opt/posenc/bin/posenc-server"]
