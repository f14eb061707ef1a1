#!/usr/bin/env bash
# The sanitizer and fuzzing checks CI runs after scripts/test.sh:
#  1. clang ASan + UBSan (every UB finding fatal) build of everything but
#     CUDA and the kernel library's own tests and conformance suites (the
#     third build runs those, POSENC_KERNEL_TESTS), with the libFuzzer
#     harnesses: the cpu and e2e suites (the server, clients, wire and
#     tools, and the kernels as they reach them), every seed corpus
#     replayed, and each fuzzer run for POSENC_FUZZ_SECONDS (default 20)
#     from its corpus;
#  2. clang TSan build of the concurrency tests of our own code (thread pool,
#     the kept rows of RoPE and the sinusoidal add, admission control,
#     engine, the reload gate and table reloads). gRPC from Debian is not instrumented, so
#     TSan stays away from tests that run a gRPC server;
#  3. gcc ASan + UBSan build of the kernel library and its suites (no server):
#     the loops written in x86 intrinsics, which only gcc compiles (the AVX2
#     ones natively, the AVX-512 ones through the emulated AVX-512 build,
#     docs/testing.md), under every cpu-labelled test; where nvcc is, the same
#     build has CUDA on, so those tests include the CUDA backend's host side
#     on the fake CUDA runtime (cuda_status_test, cuda_backend_test,
#     cuda_through_test: its staging, chunks, pinned and device memory and
#     through calls, and the kernels' bodies over the emulated grid),
#     instrumented (nvcc's device code is not).
# Every build is -O1 with line tables only (cmake/PosencSanitizers.cmake):
# what the sanitizers need to find and report, for less compile time than
# -O2 -g (server/kserve/service.cc under clang ASan: 28.1 s against 34.6),
# which CI's 90 minutes on two cores cannot spare.
# This also proves the code builds with clang as well as gcc.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/install-deps.sh python3 python3-venv
scripts/install-deps.sh clang libclang-rt-14-dev llvm-14
export CC=clang CXX=clang++
jobs=$(nproc)
optimise=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -DNDEBUG"
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -DNDEBUG")
common=("${optimise[@]}" -DPOSENC_ENABLE_CUDA=OFF -DPOSENC_BUILD_BENCH=OFF)

asan=${POSENC_ASAN_DIR:-build-asan}
echo "sanitize: clang ASan+UBSan build from ${SECONDS} s"
cmake -S . -B "$asan" "${common[@]}" -DPOSENC_SANITIZE=address,undefined \
  -DPOSENC_KERNEL_TESTS=OFF -DPOSENC_BUILD_FUZZERS=ON -DPOSENC_FUZZ_SECONDS="${POSENC_FUZZ_SECONDS:-20}"
cmake --build "$asan" -j "$jobs"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:symbolize=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export LSAN_OPTIONS=suppressions=$PWD/tests/sanitizers/lsan.supp:print_suppressions=0
# install.find_package builds an uninstrumented consumer; deploy checks have
# nothing to sanitize.
echo "sanitize: clang ASan+UBSan tests from ${SECONDS} s"
(cd "$asan" && ctest --output-on-failure -j "$jobs" --timeout 900 -L 'cpu|e2e|fuzz' \
  -E '^install\.')

tsan=${POSENC_TSAN_DIR:-build-tsan}
echo "sanitize: TSan build and tests from ${SECONDS} s"
cmake -S . -B "$tsan" "${common[@]}" -DPOSENC_SANITIZE=thread
cmake --build "$tsan" -j "$jobs" --target thread_pool_test row_cache_test rotation_cache_test \
  anchor_cache_test rope_through_test absolute_through_test bias_through_test admission_test \
  model_registry_test log_settings_test call_trace_test operations_test scratch_pool_test \
  reload_gate_test table_repository_test
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
timeout 600 "$tsan"/kernels/thread_pool_test
timeout 600 "$tsan"/kernels/row_cache_test
timeout 600 "$tsan"/kernels/rotation_cache_test
timeout 600 "$tsan"/kernels/anchor_cache_test
timeout 600 "$tsan"/kernels/rope_through_test
timeout 600 "$tsan"/kernels/absolute_through_test
timeout 600 "$tsan"/kernels/bias_through_test
timeout 600 "$tsan"/server/engine/admission_test
timeout 600 "$tsan"/server/engine/scratch_pool_test
timeout 600 "$tsan"/server/engine/reload_gate_test
timeout 600 "$tsan"/server/engine/table_repository_test
timeout 600 "$tsan"/server/kserve/model_registry_test
timeout 600 "$tsan"/server/kserve/log_settings_test
timeout 600 "$tsan"/server/rpc/call_trace_test
timeout 600 "$tsan"/server/v1/operations_test

gcc_asan=${POSENC_GCC_ASAN_DIR:-build-gcc-asan}
if ! command -v nvcc > /dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
gcc_cuda=OFF
if command -v nvcc > /dev/null; then
  gcc_cuda=ON
else
  echo "sanitize: no nvcc here, so the CUDA backend's host side is not sanitized"
fi
echo "sanitize: gcc ASan+UBSan build from ${SECONDS} s"
# POSENC_REQUIRE_CUDA: where nvcc is, a build that could not enable CUDA
# fails here rather than quietly leaving the CUDA backend's tests out.
CC=gcc CXX=g++ cmake -S . -B "$gcc_asan" "${optimise[@]}" -DPOSENC_BUILD_BENCH=OFF \
  -DPOSENC_ENABLE_CUDA=$gcc_cuda -DPOSENC_REQUIRE_CUDA=$gcc_cuda -DCMAKE_C_COMPILER=gcc \
  -DCMAKE_CXX_COMPILER=g++ -DPOSENC_BUILD_SERVER=OFF -DPOSENC_SANITIZE=address,undefined
cmake --build "$gcc_asan" -j "$jobs"
echo "sanitize: gcc ASan+UBSan tests from ${SECONDS} s"
(cd "$gcc_asan" && ctest --output-on-failure -j "$jobs" --timeout 900 -L cpu)
echo "sanitize: ASan+UBSan (clang, gcc over the intrinsic loops, and gcc over the CUDA backend's host side), fuzzers and TSan all passed in ${SECONDS} s"
