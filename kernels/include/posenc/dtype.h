// Element types on the wire and in kernels, and exact conversions between
// float32 and the 16-bit formats (round-to-nearest-even, as SPEC §1 requires).
#ifndef POSENC_DTYPE_H_
#define POSENC_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "posenc/codes.h"
#include "posenc/host_device.h"

namespace posenc {

size_t SizeOf(DType dtype);
const char* DTypeName(DType dtype);
inline bool IsFloating(DType d) {
  return d == DType::kFloat32 || d == DType::kFloat16 || d == DType::kBFloat16;
}
inline bool IsInteger(DType d) { return d == DType::kInt32 || d == DType::kInt64; }

POSENC_HOST_DEVICE uint32_t FloatBits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}
POSENC_HOST_DEVICE float BitsFloat(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// Conversions are written without branches (every candidate computed, one
// selected) so that loops over them vectorise; the CPU and CUDA kernels use
// these same functions, bit for bit.

// bfloat16 is the top half of a float32; rounding adds 0x7fff plus the lowest
// kept bit so that ties go to even. NaN keeps a quiet payload.
POSENC_HOST_DEVICE uint16_t FloatToBFloat16(float f) {
  const uint32_t u = FloatBits(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x40u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}
POSENC_HOST_DEVICE float BFloat16ToFloat(uint16_t h) {
  return BitsFloat(static_cast<uint32_t>(h) << 16);
}

// IEEE binary16 with round-to-nearest-even, subnormals and overflow to inf.
POSENC_HOST_DEVICE uint16_t FloatToHalf(float f) {
  const uint32_t bits = FloatBits(f);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t u = bits & 0x7fffffffu;
  // Normal halves: rebias the exponent (127 -> 15) and round half to even.
  const uint32_t normal = ((u + 0xc8000fffu + ((u >> 13) & 1u)) >> 13) & 0xffffu;
  // Below the smallest normal half (2^-14): adding 0.5 puts the half's
  // subnormal ulp (2^-24) at the float's ulp, so the FPU rounds for us.
  const uint32_t subnormal = (FloatBits(BitsFloat(u) + 0.5f) - 0x3f000000u) & 0xffffu;
  uint32_t r = u < 0x38800000u ? subnormal : normal;
  r = u >= 0x477ff000u ? 0x7c00u : r;  // >= 65520 rounds to inf
  r = u > 0x7f800000u ? 0x7e00u : r;   // NaN stays NaN (quiet)
  return static_cast<uint16_t>(sign | r);
}
POSENC_HOST_DEVICE float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  // Subnormal or zero: value = mant * 2^-24, exact in float.
  const float small = static_cast<float>(mant) * 5.9604644775390625e-8f;
  const uint32_t small_bits = FloatBits(small) | sign;
  const uint32_t big_bits = sign | (exp == 0x1fu ? 0x7f800000u : (exp + 112u) << 23) | (mant << 13);
  return BitsFloat(exp == 0 ? small_bits : big_bits);
}

// Storage types the kernels are templated on.
struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

// Element i of a buffer of floating `dtype` (FLOAT32, FLOAT16, BFLOAT16),
// for code that knows the dtype only at run time. Stores round to nearest
// even. REQUIRES: IsFloating(dtype).
inline float LoadElement(DType dtype, const void* data, int64_t i) {
  const auto* p = static_cast<const unsigned char*>(data);
  if (dtype == DType::kFloat32) {
    float f;
    std::memcpy(&f, p + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p + 2 * i, 2);
  return dtype == DType::kFloat16 ? HalfToFloat(h) : BFloat16ToFloat(h);
}
inline void StoreElement(DType dtype, void* data, int64_t i, float v) {
  auto* p = static_cast<unsigned char*>(data);
  if (dtype == DType::kFloat32) {
    std::memcpy(p + 4 * i, &v, 4);
    return;
  }
  const uint16_t h = dtype == DType::kFloat16 ? FloatToHalf(v) : FloatToBFloat16(v);
  std::memcpy(p + 2 * i, &h, 2);
}

// The same on the host and the GPU, bit for bit: both backends store
// through these.
POSENC_HOST_DEVICE float ToFloat(float v) { return v; }
POSENC_HOST_DEVICE float ToFloat(Half v) { return HalfToFloat(v.bits); }
POSENC_HOST_DEVICE float ToFloat(BFloat16 v) { return BFloat16ToFloat(v.bits); }

template <typename T>
POSENC_HOST_DEVICE T FromFloat(float v);
template <>
POSENC_HOST_DEVICE float FromFloat<float>(float v) {
  return v;
}
template <>
POSENC_HOST_DEVICE Half FromFloat<Half>(float v) {
  return Half{FloatToHalf(v)};
}
template <>
POSENC_HOST_DEVICE BFloat16 FromFloat<BFloat16>(float v) {
  return BFloat16{FloatToBFloat16(v)};
}

}  // namespace posenc

#endif  // POSENC_DTYPE_H_
