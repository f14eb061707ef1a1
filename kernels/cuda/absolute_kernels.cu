// Absolute encodings on the GPU: y = x * x_scale + PE[pos], one block per
// token (grid-stride), threads over frequency pairs (sinusoidal) or channels
// (learned). Arithmetic mirrors the CPU kernel operation for operation.
#include "angle.h"
#include "cuda_kernels.h"
#include "element.cuh"

namespace posenc::cuda {
namespace {

template <typename T>
__device__ __forceinline__ void Put(const AbsoluteParams& p, T* y, int64_t i,
                                    typename Element<T>::Acc pe) {
  using E = Element<T>;
  using Acc = typename E::Acc;
  if (p.has_input) {
    y[i] = E::FromFloat(static_cast<float>(static_cast<Acc>(E::Load(y[i])) *
                                               static_cast<Acc>(p.x_scale) + pe));
  } else {
    y[i] = E::FromFloat(static_cast<float>(pe));
  }
}

template <typename T>
__global__ void AbsoluteKernel(AbsoluteParams p) {
  using Acc = typename Element<T>::Acc;
  const int64_t half = p.dim / 2;
  for (int64_t t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {
    T* y = static_cast<T*>(p.x) + t * p.dim;
    const int64_t pos = p.positions[t];
    if (p.table != nullptr) {
      const float* row = p.table + pos * p.dim;
      for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x) Put<T>(p, y, i, static_cast<Acc>(row[i]));
      continue;
    }
    for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
      Acc s, c;
      posenc::internal::SinCosAcc(static_cast<double>(pos) * p.omega[i], &s, &c);
      Put<T>(p, y, p.interleaved ? 2 * i : i, s);
      Put<T>(p, y, p.interleaved ? 2 * i + 1 : half + i, c);
    }
    if (p.dim % 2 == 1 && threadIdx.x == 0) Put<T>(p, y, p.dim - 1, Acc(0));
  }
}

}  // namespace

cudaError_t LaunchAbsolute(const AbsoluteParams& p, cudaStream_t stream) {
  if (p.num_tokens == 0 || p.dim == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>(p.num_tokens < (1 << 24) ? p.num_tokens : (1 << 24));
  const int threads = p.dim >= 512 ? 256 : 128;
  switch (p.dtype) {
    case kF32:
      AbsoluteKernel<float><<<blocks, threads, 0, stream>>>(p);
      break;
    case kF16:
      AbsoluteKernel<__half><<<blocks, threads, 0, stream>>>(p);
      break;
    case kBF16:
      AbsoluteKernel<__nv_bfloat16><<<blocks, threads, 0, stream>>>(p);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace posenc::cuda
