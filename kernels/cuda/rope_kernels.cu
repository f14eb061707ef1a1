// RoPE on the GPU. One block per token (grid-stride): the block forms the
// token's cos/sin once in shared memory, then its threads rotate every head
// of query and key, 16 bytes per load and store when alignment allows.
#include <type_traits>

#include "angle.h"
#include "cuda_kernels.h"
#include "element.cuh"

namespace posenc::cuda {
namespace {

__device__ __forceinline__ int64_t HeadOffset(const RopeParams& p, int64_t t, int h, int heads) {
  if (p.layout == kBHSD) {
    const int64_t b = t / p.seq_len, s = t % p.seq_len;
    return ((b * heads + h) * p.seq_len + s) * p.head_dim;
  }
  return (t * heads + h) * p.head_dim;
}

// The arithmetic type for outputs of type T, as on the CPU: float for
// float32 outputs (judged by relative norm), double for 16-bit outputs (one
// ulp per element, also where x*c - y*s cancels).
template <typename T>
using AccOf = typename std::conditional<Element<T>::kSixteenBit, double, float>::type;

// kWidth elements per thread item: 16 bytes (vector path) or the minimum
// (1 pair for NEOX, 2 elements for GPT-J).
template <typename T, int kStyle, int kWidth>
__global__ void RopeKernel(RopeParams p) {
  using E = Element<T>;
  using Acc = AccOf<T>;
  extern __shared__ __align__(16) unsigned char smem[];
  const int half = p.rotary_dim / 2;
  Acc* cos_s = reinterpret_cast<Acc*>(smem);  // [half] s cos
  Acc* sin_s = cos_s + half;                  // [half] +-s sin
  // NEOX: an item is kWidth pairs (x[i..], x[i+half..]); GPT-J: kWidth
  // consecutive elements, kWidth / 2 pairs.
  const int items_per_head = kStyle == kNeox ? half / kWidth : p.rotary_dim / kWidth;
  const int heads = p.query_heads + (p.key != nullptr ? p.key_heads : 0);

  for (int64_t t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {
    const int set = p.token_freq_set != nullptr ? p.token_freq_set[t] : 0;
    const double* f = p.inv_freq + static_cast<int64_t>(set) * half;
    const double scale = p.attention_scale[set];
    const double sign = p.inverse ? -scale : scale;
    const int64_t* pos = p.positions + t * p.num_axes;
    for (int k = threadIdx.x; k < half; k += blockDim.x) {
      const double angle = static_cast<double>(pos[p.num_axes == 1 ? 0 : p.slot_axis[k]]) * f[k];
      if constexpr (E::kSixteenBit) {
        double s, c;
        posenc::internal::SinCosPrecise(angle, &s, &c);
        cos_s[k] = c * scale;
        sin_s[k] = s * sign;
      } else {
        float s, c;
        posenc::internal::SinCos(angle, &s, &c);
        cos_s[k] = c * static_cast<float>(scale);
        sin_s[k] = s * static_cast<float>(sign);
      }
    }
    __syncthreads();
    auto rotate = [&](int k, T& x, T& y) {
      const Acc u = E::Load(x), v = E::Load(y);
      x = E::FromFloat(static_cast<float>(u * cos_s[k] - v * sin_s[k]));
      y = E::FromFloat(static_cast<float>(v * cos_s[k] + u * sin_s[k]));
    };

    for (int w = threadIdx.x; w < heads * items_per_head; w += blockDim.x) {
      const int h = w / items_per_head, item = w % items_per_head;
      T* head = h < p.query_heads
                    ? static_cast<T*>(p.query) + HeadOffset(p, t, h, p.query_heads)
                    : static_cast<T*>(p.key) + HeadOffset(p, t, h - p.query_heads, p.key_heads);
      if constexpr (kStyle == kNeox) {
        const int i0 = item * kWidth;
        T xs[kWidth], ys[kWidth];
        if constexpr (kWidth * sizeof(T) == 16) {
          *reinterpret_cast<Vec16<T>*>(xs) = *reinterpret_cast<const Vec16<T>*>(head + i0);
          *reinterpret_cast<Vec16<T>*>(ys) = *reinterpret_cast<const Vec16<T>*>(head + half + i0);
        } else {
#pragma unroll
          for (int j = 0; j < kWidth; ++j) {
            xs[j] = head[i0 + j];
            ys[j] = head[half + i0 + j];
          }
        }
#pragma unroll
        for (int j = 0; j < kWidth; ++j) rotate(i0 + j, xs[j], ys[j]);
        if constexpr (kWidth * sizeof(T) == 16) {
          *reinterpret_cast<Vec16<T>*>(head + i0) = *reinterpret_cast<const Vec16<T>*>(xs);
          *reinterpret_cast<Vec16<T>*>(head + half + i0) = *reinterpret_cast<const Vec16<T>*>(ys);
        } else {
#pragma unroll
          for (int j = 0; j < kWidth; ++j) {
            head[i0 + j] = xs[j];
            head[half + i0 + j] = ys[j];
          }
        }
      } else {
        const int e0 = item * kWidth;
        T xs[kWidth];
        if constexpr (kWidth * sizeof(T) == 16) {
          *reinterpret_cast<Vec16<T>*>(xs) = *reinterpret_cast<const Vec16<T>*>(head + e0);
        } else {
#pragma unroll
          for (int j = 0; j < kWidth; ++j) xs[j] = head[e0 + j];
        }
#pragma unroll
        for (int j = 0; j < kWidth; j += 2) rotate((e0 + j) / 2, xs[j], xs[j + 1]);
        if constexpr (kWidth * sizeof(T) == 16) {
          *reinterpret_cast<Vec16<T>*>(head + e0) = *reinterpret_cast<const Vec16<T>*>(xs);
        } else {
#pragma unroll
          for (int j = 0; j < kWidth; ++j) head[e0 + j] = xs[j];
        }
      }
    }
    __syncthreads();  // cos_s/sin_s are rewritten for the next token
  }
}

template <typename T, int kStyle>
cudaError_t LaunchTyped(const RopeParams& p, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  const int half = p.rotary_dim / 2;
  const size_t smem = 2 * static_cast<size_t>(half) * sizeof(AccOf<T>);
  if (smem > 48 * 1024) return cudaErrorInvalidValue;
  const int heads = p.query_heads + (p.key != nullptr ? p.key_heads : 0);
  // 16-byte accesses need every head, and the NEOX second half, aligned.
  const bool vector =
      p.head_dim % kVec == 0 && (kStyle == kNeox ? half % kVec == 0 : p.rotary_dim % kVec == 0);
  const int width = vector ? kVec : (kStyle == kNeox ? 1 : 2);
  const int items = heads * (kStyle == kNeox ? half / width : p.rotary_dim / width);
  const int threads = items >= 256 ? 256 : 128;
  const unsigned blocks =
      static_cast<unsigned>(p.num_tokens < (1 << 24) ? p.num_tokens : (1 << 24));
  if (vector) {
    RopeKernel<T, kStyle, kVec><<<blocks, threads, smem, stream>>>(p);
  } else {
    RopeKernel<T, kStyle, kStyle == kNeox ? 1 : 2><<<blocks, threads, smem, stream>>>(p);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchStyle(const RopeParams& p, cudaStream_t stream) {
  return p.style == kNeox ? LaunchTyped<T, kNeox>(p, stream) : LaunchTyped<T, kGptj>(p, stream);
}

}  // namespace

cudaError_t LaunchRope(const RopeParams& p, cudaStream_t stream) {
  if (p.num_tokens == 0 || p.rotary_dim == 0) return cudaSuccess;
  switch (p.dtype) {
    case kF32:
      return LaunchStyle<float>(p, stream);
    case kF16:
      return LaunchStyle<__half>(p, stream);
    case kBF16:
      return LaunchStyle<__nv_bfloat16>(p, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace posenc::cuda
