// Element types on the device: loads to float and round-to-nearest-even
// stores from float, matching the CPU backend's posenc::ToFloat/FromFloat.
#ifndef POSENC_KERNELS_CUDA_ELEMENT_CUH_
#define POSENC_KERNELS_CUDA_ELEMENT_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace posenc::cuda {

template <typename T>
struct Element;

template <>
struct Element<float> {
  static constexpr bool kSixteenBit = false;
  static __device__ __forceinline__ float Load(float v) { return v; }
  static __device__ __forceinline__ float FromFloat(float v) { return v; }
};

template <>
struct Element<__half> {
  static constexpr bool kSixteenBit = true;
  static __device__ __forceinline__ float Load(__half v) { return __half2float(v); }
  static __device__ __forceinline__ __half FromFloat(float v) { return __float2half_rn(v); }
};

template <>
struct Element<__nv_bfloat16> {
  static constexpr bool kSixteenBit = true;
  static __device__ __forceinline__ float Load(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __forceinline__ __nv_bfloat16 FromFloat(float v) {
    return __float2bfloat16_rn(v);
  }
};

// 16 bytes of T moved as one load or store.
template <typename T>
struct alignas(16) Vec16 {
  static constexpr int kSize = 16 / sizeof(T);
  T v[kSize];
};

}  // namespace posenc::cuda

#endif  // POSENC_KERNELS_CUDA_ELEMENT_CUH_
