// A device-to-device copy that runs on the SMs, the second baseline of
// posenc-bench-gpu. cudaMemcpyAsync uses a copy engine, and on some parts
// the SMs' own loads and stores move more bytes per second than it does;
// the kernels are SM code, so their fair limit is an SM copy of the same
// bytes. Both baselines are measured in the same run and both ratios shown.
#ifndef POSENC_BENCH_SM_COPY_H_
#define POSENC_BENCH_SM_COPY_H_

#include <cuda_runtime.h>

#include <cstddef>

namespace posenc::bench {

// Copies `bytes` from src to dst: 16-byte loads and stores, grid-stride,
// `blocks_per_sm` x `sms` blocks. REQUIRES: both 16-byte aligned (as
// cudaMalloc gives), bytes a multiple of 16, no overlap.
cudaError_t LaunchSmCopy(void* dst, const void* src, size_t bytes, int sms, cudaStream_t stream,
                         int blocks_per_sm = 4);

}  // namespace posenc::bench

#endif  // POSENC_BENCH_SM_COPY_H_
