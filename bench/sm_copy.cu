#include "sm_copy.h"

namespace posenc::bench {
namespace {

constexpr int kThreads = 512;

__global__ void SmCopyKernel(uint4* __restrict__ dst, const uint4* __restrict__ src, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    dst[i] = src[i];
  }
}

}  // namespace

cudaError_t LaunchSmCopy(void* dst, const void* src, size_t bytes, int sms, cudaStream_t stream,
                         int blocks_per_sm) {
  if (bytes % sizeof(uint4) != 0 || sms <= 0 || blocks_per_sm <= 0) return cudaErrorInvalidValue;
  SmCopyKernel<<<sms * blocks_per_sm, kThreads, 0, stream>>>(
      static_cast<uint4*>(dst), static_cast<const uint4*>(src), bytes / sizeof(uint4));
  return cudaGetLastError();
}

}  // namespace posenc::bench
