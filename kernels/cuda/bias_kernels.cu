// Attention bias on the GPU: one block per (batch, head, query row), threads
// over keys. Same double-precision formula as the CPU kernel.
#include <math_constants.h>

#include "cuda_kernels.h"
#include "element.cuh"

namespace posenc::cuda {
namespace {

template <typename T>
__global__ void BiasKernel(BiasParams p) {
  using E = Element<T>;
  const int64_t rows = p.batch * p.heads * p.q_len;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t i = row % p.q_len;
    const int64_t h = (row / p.q_len) % p.heads;
    const int64_t b = row / (p.q_len * p.heads);
    const int64_t qpos = p.q_offset + i;
    const double slope = p.slopes[h];
    const int64_t k_len_b = p.k_lens[b];
    T* y = static_cast<T*>(p.out) + row * p.k_len;
    for (int64_t j = threadIdx.x; j < p.k_len; j += blockDim.x) {
      const int64_t dist = qpos - j;
      const bool masked = (p.causal && dist < 0) ||
                          (p.window > 0 && (dist < 0 || dist >= p.window)) || j >= k_len_b;
      double v = 0.0;
      if (masked) {
        v = -CUDART_INF;
      } else if (p.form == 2) {
        v = -slope * static_cast<double>(dist);
      } else if (p.form == 3) {
        v = -slope * static_cast<double>(dist < 0 ? -dist : dist);
      }
      const double out = p.add_to_logits ? static_cast<double>(E::Load(y[j])) + v : v;
      y[j] = E::FromFloat(static_cast<float>(out));
    }
  }
}

}  // namespace

cudaError_t LaunchBias(const BiasParams& p, cudaStream_t stream) {
  const int64_t rows = p.batch * p.heads * p.q_len;
  if (rows == 0 || p.k_len == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>(rows < (1 << 24) ? rows : (1 << 24));
  const int threads = p.k_len >= 256 ? 256 : (p.k_len >= 64 ? 64 : 32);
  switch (p.dtype) {
    case kF32:
      BiasKernel<float><<<blocks, threads, 0, stream>>>(p);
      break;
    case kF16:
      BiasKernel<__half><<<blocks, threads, 0, stream>>>(p);
      break;
    case kBF16:
      BiasKernel<__nv_bfloat16><<<blocks, threads, 0, stream>>>(p);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace posenc::cuda
