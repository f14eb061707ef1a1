// The per-element arithmetic of absolute encodings, y = x * x_scale + PE,
// shared by the CPU and CUDA kernels (one definition, bit-identical results).
// PE comes in float32; 16-bit results that could miss their one-ulp bar are
// recomputed in double (angle.h explains the bound).
#ifndef POSENC_KERNELS_MATH_ABSOLUTE_MATH_H_
#define POSENC_KERNELS_MATH_ABSOLUTE_MATH_H_

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "math/angle.h"
#include "math/nan.h"
#include "posenc/dtype.h"
#include "posenc/host_device.h"

namespace posenc::internal {

// Which frequency and function channel e of a sinusoidal row uses.
// INTERLEAVED: sin(p w_(e/2)) for even e, cos for odd e, so an odd d ends in
// a sin channel (SPEC 2.2; DistilBERT). CONCATENATED: the channel past
// 2 * (d/2) of an odd d is zero (fairseq).
struct SinusoidalChannel {
  int64_t frequency;  // i of w_i
  bool is_sin;
  bool is_zero;
};
POSENC_HOST_DEVICE SinusoidalChannel ChannelOf(bool interleaved, int64_t dim, int64_t e) {
  const int64_t half = dim / 2;
  if (interleaved) return SinusoidalChannel{e / 2, e % 2 == 0, false};
  if (e >= 2 * half) return SinusoidalChannel{0, false, true};
  return e < half ? SinusoidalChannel{e, true, false} : SinusoidalChannel{e - half, false, false};
}

// PE of one channel in double, for flagged 16-bit results.
POSENC_HOST_DEVICE double SinusoidalPrecise(int64_t pos, double omega, bool is_sin) {
  double s, c;
  SinCosPrecise(static_cast<double>(pos) * omega, &s, &c);
  return is_sin ? s : c;
}

// A table element (no input): PE in float, or in double where a 16-bit
// result of a tiny value could miss. `precise()` gives PE in double.
template <typename T, typename Precise>
POSENC_HOST_DEVICE T EncodingOnly(float pe, Precise precise) {
  float r = pe;
  if constexpr (!std::is_same_v<T, float>) {
    if (fabsf(pe) < kCancellationBound<T>) r = static_cast<float>(precise());
  }
  return FromFloat<T>(r);
}

// True when x * x_scale + pe, computed in float as (u = x * xs) + pe, may miss
// a 16-bit output's bar.
template <typename T>
POSENC_HOST_DEVICE bool SumNeedsPrecise(float r, float u, float pe) {
  return fabsf(r) < kCancellationBound<T> * (fabsf(u) + fabsf(pe) + 1.0f);
}

// The same test where PE is sinusoidal, so |pe| <= 1 + 2^-22: then the float
// sum's error is absolute, not relative to its terms, and one compare of |r|
// decides. PE errs from the float64 reference sin(pos w) by under 1.7 2^-22
// (phase.h: 2^-22.7 measured; the reference's own angle pos * w is rounded by
// up to 2^-22 rad at |pos| = 2^31), u = x * x_scale by 2^-24 |u|, and the sum
// by 2^-24 |r|. A sum that cancels has |u| <= |r| + 1.0001, so the error is
// at most 1.95 2^-22 + 2^-23 |r|. A result is safe when that is under a
// quarter of its 16-bit ulp (an ulp is at least 2^-8 |r| in bfloat16, 2^-11
// |r| in float16's normal range): |r| >= 2^-10 for bfloat16 leaves the error
// under 2^-11 |r|, |r| >= 2^-7 for float16 under 2^-14 |r| (and float16's
// subnormals, below 2^-14, are all flagged). Random data flags about 0.1%
// (bfloat16) where SumNeedsPrecise flags 0.35%; the fused CPU loop pays one
// compare per element for this test, and rarer fix-ups.
template <typename T>
inline constexpr float kSinusoidalSafeSum = std::is_same_v<T, BFloat16> ? 1.0f / 1024 : 1.0f / 128;
template <typename T>
POSENC_HOST_DEVICE bool SinusoidalSumNeedsPrecise(float r) {
  return fabsf(r) < kSinusoidalSafeSum<T>;
}

// Which of the two tests a sum takes: kAny for a learned table (PE of any
// size), kSinusoidal where |pe| <= 1.
enum class PeRange { kAny, kSinusoidal };

template <typename T>
POSENC_HOST_DEVICE bool NeedsPrecise(PeRange range, float r, float u, float pe) {
  return range == PeRange::kSinusoidal ? SinusoidalSumNeedsPrecise<T>(r)
                                       : SumNeedsPrecise<T>(r, u, pe);
}

// A NaN input leaves as itself, quieted (sign and payload kept), as the CPU
// computes x * x_scale + pe: x86 and Arm return a NaN operand's own value.
// A GPU returns its canonical NaN 0x7fffffff instead, so the formula says it
// outright; on the CPU the select changes nothing. A NaN the sum makes
// itself (inf * 0: an infinite x at an x_scale of 0, PE being finite) is
// 0xffc00000 on x86 and 0x7fffffff on a GPU, so it leaves as CanonicalNaN.
POSENC_HOST_DEVICE float KeepInputNaN(float x, float r) {
  return x != x ? BitsFloat(FloatBits(x) | 0x00400000u) : CanonicalNaN(r);
}

// y = x * x_scale + PE for one stored element, in place.
template <typename T, typename Precise>
POSENC_HOST_DEVICE void AddEncoding(T* y, float pe, double x_scale, PeRange range,
                                    Precise precise) {
  const float x = ToFloat(*y);
  const float u = x * static_cast<float>(x_scale);
  float r = u + pe;
  if constexpr (!std::is_same_v<T, float>) {
    if (NeedsPrecise<T>(range, r, u, pe)) {
      r = static_cast<float>(static_cast<double>(x) * x_scale + precise());
    }
  }
  *y = FromFloat<T>(KeepInputNaN(x, r));
}

}  // namespace posenc::internal

#endif  // POSENC_KERNELS_MATH_ABSOLUTE_MATH_H_
