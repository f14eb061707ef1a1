// Absolute encodings on the GPU: y = x * x_scale + PE[pos], one block per
// token (grid-stride), threads over frequency pairs (sinusoidal) or channels
// (learned). The arithmetic mirrors cpu_absolute.cc operation for operation,
// including the double recomputation of 16-bit elements the cancellation
// bound flags.
#include "angle.h"
#include "cuda_kernels.h"
#include "element.cuh"

namespace posenc::cuda {
namespace {

// Writes element e from its float32 encoding `pe`, recomputing with the
// float64 encoding `precise()` where a 16-bit result could miss an ulp.
template <typename T, typename Precise>
__device__ __forceinline__ void Put(const AbsoluteParams& p, T* y, int64_t e, float pe,
                                    Precise precise) {
  using E = Element<T>;
  const float xs = static_cast<float>(p.x_scale);
  if (!p.has_input) {
    float r = pe;
    if constexpr (E::kSixteenBit) {
      if (fabsf(pe) < posenc::internal::kCancellationBound) r = static_cast<float>(precise());
    }
    y[e] = E::FromFloat(r);
    return;
  }
  const float x = E::Load(y[e]);
  const float u = x * xs;
  float r = u + pe;
  if constexpr (E::kSixteenBit) {
    if (fabsf(r) < posenc::internal::kCancellationBound * (fabsf(u) + fabsf(pe) + 1.0f)) {
      r = static_cast<float>(static_cast<double>(x) * p.x_scale + precise());
    }
  }
  y[e] = E::FromFloat(r);
}

template <typename T>
__global__ void AbsoluteKernel(AbsoluteParams p) {
  const int64_t half = p.dim / 2;
  for (int64_t t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {
    T* y = static_cast<T*>(p.x) + t * p.dim;
    const int64_t pos = p.positions[t];
    if (p.table != nullptr) {
      const float* row = p.table + pos * p.dim;
      for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x) {
        Put<T>(p, y, i, row[i], [&] { return static_cast<double>(row[i]); });
      }
      continue;
    }
    for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
      const double angle = static_cast<double>(pos) * p.omega[i];
      float s, c;
      posenc::internal::SinCos(angle, &s, &c);
      auto precise = [angle](bool want_sin) {
        double sd, cd;
        posenc::internal::SinCosPrecise(angle, &sd, &cd);
        return want_sin ? sd : cd;
      };
      Put<T>(p, y, p.interleaved ? 2 * i : i, s, [&] { return precise(true); });
      Put<T>(p, y, p.interleaved ? 2 * i + 1 : half + i, c, [&] { return precise(false); });
    }
    if (p.dim % 2 == 1 && threadIdx.x == 0) Put<T>(p, y, p.dim - 1, 0.0f, [] { return 0.0; });
  }
}

}  // namespace

cudaError_t LaunchAbsolute(const AbsoluteParams& p, cudaStream_t stream) {
  if (p.num_tokens == 0 || p.dim == 0) return cudaSuccess;
  const unsigned blocks =
      static_cast<unsigned>(p.num_tokens < (1 << 24) ? p.num_tokens : (1 << 24));
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
