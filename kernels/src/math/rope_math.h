// The per-element arithmetic of RoPE, shared by the CPU and CUDA kernels
// (host and device compile this one definition, so the two backends agree
// bit for bit; both build without floating-point contraction).
//
// A pair (u, v) of slot k becomes (u c - v n, v c + u n) with c = s cos(a),
// n = +-s sin(a), a = pos * f_k. Outputs are computed in float32; 16-bit
// outputs whose float result could be off by more than half an ulp
// (cancellation, see kCancellationBound<T>) are recomputed in double.
#ifndef POSENC_KERNELS_MATH_ROPE_MATH_H_
#define POSENC_KERNELS_MATH_ROPE_MATH_H_

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "math/angle.h"
#include "math/nan.h"
#include "posenc/dtype.h"
#include "posenc/host_device.h"

namespace posenc::internal {

// The float32 rotation of one slot: c = s cos(a), n = s sin(a) (negated for
// inverse rotation).
struct SlotRotation {
  float c, n;
};

POSENC_HOST_DEVICE SlotRotation RotationOf(double angle, double scale, bool inverse) {
  float s, co;
  SinCos(angle, &s, &co);
  const float scale_f = static_cast<float>(scale);
  const float sign_f = static_cast<float>(inverse ? -scale : scale);
  return SlotRotation{co * scale_f, s * sign_f};
}

// Every slot's rotation at one position: c[k], n[k] for k < half, slot k
// at angle pos f[k]. The CPU kernel and the rows the CPU backend keeps
// (cpu/rotation_cache.h) both fill theirs here, so they agree bit for bit.
POSENC_HOST_DEVICE void RotationsAt(double pos, const double* __restrict f, int64_t half,
                                    double scale, bool inverse, float* __restrict c,
                                    float* __restrict n) {
  for (int64_t k = 0; k < half; ++k) {
    const SlotRotation r = RotationOf(pos * f[k], scale, inverse);
    c[k] = r.c;
    n[k] = r.n;
  }
}

// The rotated pair in float32. (Scalars rather than a SlotRotation: GCC
// does not vectorise loops that build the struct from two arrays.) A NaN
// result (from a NaN or infinite input) leaves as CanonicalNaN's one
// pattern, whichever NaN the hardware made.
POSENC_HOST_DEVICE void RotateF32(float u, float v, float c, float n, float* a, float* b) {
  const float uc = u * c, vn = v * n, vc = v * c, un = u * n;
  *a = CanonicalNaN(uc - vn);
  *b = CanonicalNaN(vc + un);
}

// True when either float result (a, b) of the pair (u, v) may miss a 16-bit
// output T's one-ulp bar (angle.h explains the bound); one comparison, so the
// CPU loop computing it vectorises. REQUIRES: scale > 0 (planning
// guarantees it).
template <typename T>
POSENC_HOST_DEVICE bool PairNeedsPrecise(float a, float b, float u, float v, float scale) {
  const float abs_a = fabsf(a), abs_b = fabsf(b);
  const float smaller = abs_a < abs_b ? abs_a : abs_b;  // not fminf: that does not vectorise
  return smaller < kCancellationBound<T> * (fabsf(u) + fabsf(v)) * scale;
}

// The rotated pair in float64, for the rare flagged 16-bit elements.
POSENC_HOST_DEVICE void RotatePrecise(float u, float v, double angle, double scale, bool inverse,
                                      float* a, float* b) {
  double s, c;
  SinCosPrecise(angle, &s, &c);
  const double cd = c * scale, nd = s * (inverse ? -scale : scale);
  const double ud = u, vd = v;
  *a = CanonicalNaN(static_cast<float>(ud * cd - vd * nd));
  *b = CanonicalNaN(static_cast<float>(vd * cd + ud * nd));
}

// The angle of a flagged pair: a value, or a callable that forms it (the
// GPU kernel recomputes it rather than hold a double per pair in registers).
POSENC_HOST_DEVICE double AngleValue(double angle) { return angle; }
template <typename Angle>
POSENC_HOST_DEVICE double AngleValue(Angle angle) {
  return angle();
}

// Rotates one pair of stored elements in place: the whole per-element
// contract for every dtype. `angle` (or what it returns) and `scale` are
// those RotationOf made `r` from; they are used only for flagged 16-bit
// results.
template <typename T, typename Angle>
POSENC_HOST_DEVICE void RotatePair(T* x, T* y, SlotRotation r, Angle angle, double scale,
                                   bool inverse) {
  const float u = ToFloat(*x), v = ToFloat(*y);
  float a, b;
  RotateF32(u, v, r.c, r.n, &a, &b);
  if constexpr (!std::is_same_v<T, float>) {
    if (PairNeedsPrecise<T>(a, b, u, v, static_cast<float>(scale))) {
      RotatePrecise(u, v, AngleValue(angle), scale, inverse, &a, &b);
    }
  }
  *x = FromFloat<T>(a);
  *y = FromFloat<T>(b);
}

// Element offsets of pair k of a head: NEOX pairs k and k + R/2, GPT-J 2k
// and 2k + 1.
POSENC_HOST_DEVICE int64_t PairFirst(RopeStyle style, int64_t k, int64_t /*half*/) {
  return style == RopeStyle::kNeox ? k : 2 * k;
}
POSENC_HOST_DEVICE int64_t PairSecond(RopeStyle style, int64_t k, int64_t half) {
  return style == RopeStyle::kNeox ? k + half : 2 * k + 1;
}

// Where token t's heads start and how far apart they are, in elements, for a
// tensor of `heads` heads: [.., seq, heads, D] (BSHD, THD) or [batch, heads,
// seq, D] (BHSD, with seq_len tokens per sequence).
struct HeadSpan {
  int64_t first;   // element offset of head 0 of the token
  int64_t stride;  // elements from head h to head h + 1
};
POSENC_HOST_DEVICE HeadSpan HeadsOfToken(RopeLayout layout, int64_t t, int64_t seq_len,
                                         int64_t heads, int64_t head_dim) {
  if (layout == RopeLayout::kBHSD) {
    const int64_t b = t / seq_len, s = t - b * seq_len;
    return HeadSpan{(b * heads * seq_len + s) * head_dim, seq_len * head_dim};
  }
  return HeadSpan{t * heads * head_dim, head_dim};
}

}  // namespace posenc::internal

#endif  // POSENC_KERNELS_MATH_ROPE_MATH_H_
