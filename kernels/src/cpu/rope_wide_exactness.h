// Which lanes of a 512-bit bfloat16 RoPE step may be narrowed by
// VCVTNE2PS2BF16 (or bf16_wide.h's integer rounding) and which go to the
// scalar contract. Internal: rope_bf16_wide.inc's loops, and
// rope_wide_exactness_test.cc, which holds it against the scalar test.
#ifndef POSENC_KERNELS_CPU_ROPE_WIDE_EXACTNESS_H_
#define POSENC_KERNELS_CPU_ROPE_WIDE_EXACTNESS_H_

#include "bf16_wide.h"

#ifdef POSENC_CPU_BF16_WIDE
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "math/angle.h"
#include "posenc/dtype.h"
#include "x86_intrinsics.h"

namespace posenc::internal {

// The lanes whose rotated pair (a, b) of inputs (u, v) (bfloat16 values
// widened) are not to be narrowed here: m = min(|a|, |b|) below the scalar
// PairNeedsPrecise's bound B (|u| + |v|) scale, formed by the same float
// operations (so the pairs are exactly those the scalar contract
// recomputes in double), or m NaN, infinite or subnormal (VCVTNE2PS2BF16
// reads a subnormal as zero and keeps a NaN's payload, where the scalar
// contract keeps the one and makes its one canonical NaN). In a lane that
// passes neither result is subnormal: both are at least m, or both are
// exact zeros from zero inputs (bound 0; rope_cpu.cc's kWideMinScale keeps
// the bound nonzero for any other inputs). Nor NaN: that takes a NaN or
// infinite input, which makes both results NaN or infinite (m too), or
// two overflowing products in one result (scales above 1), which
// overflow one product of the other as well (m infinite). One result
// infinite and the other normal can pass: the instruction narrows an
// infinity as FloatToBFloat16 does.
//
// Tried and refused (2026-11-30), for the record: one FMA and one
// VFPCLASSPS on t = m - B' (|u| + |v|), B' = B (1 + 2^-23), which saves two
// vector operations and a mask operation per 16 lanes. Its difference can
// round to +0 from a nonzero real one below 2^-150, and so pass a
// subnormal m just above a subnormal bound (inputs under 2^-114):
// rope_wide_exactness_test's pairs on the bound caught it. Any cheaper test
// must tell zero inputs (to pass: padding) from subnormal results (to
// refuse) some other way.
//
// The lanes come as two masks, to be joined (*odd | *low): the loops test
// both at once (KORTESTW) and join them only for a step that has one.
template <bool kUnitScale>
POSENC_BF16_WIDE_TARGET POSENC_ALWAYS_INLINE void PairsToRedo(__m512 a, __m512 b, __m512 u,
                                                              __m512 v, __m512 scale,
                                                              __mmask16* odd, __mmask16* low) {
  const __m512 sum = _mm512_add_ps(_mm512_abs_ps(u), _mm512_abs_ps(v));
  const __m512 scaled = _mm512_mul_ps(_mm512_set1_ps(kCancellationBound<BFloat16>), sum);
  const __m512 bound = kUnitScale ? scaled : _mm512_mul_ps(scaled, scale);
  const __m512 m = _mm512_range_ps(a, b, 0x0a);      // min(|a|, |b|), sign cleared
  *odd = _mm512_fpclass_ps_mask(m, 0xb9);            // NaN, infinite or subnormal
  *low = _mm512_cmp_ps_mask(m, bound, _CMP_NGE_UQ);  // below the bound (or NaN)
}

// What a cancellation test in 16-bit lanes (rope_avx2.inc's
// PairTestBF16x16, PairTestBF16x32 below) takes from the attention scale:
// s, where 2^-S = 2B 2^k and 2^k is the power of two at or above the scale
// (a zero or subnormal scale gives k <= -126: a stricter bound, still
// right); and the bfloat16 bits of 2^(126 - k), or of 2^127 where that is
// less, from which inputs fail outright.
struct LaneTestScale {
  int s;
  int huge;
};
// REQUIRES: scale_f >= 0 and finite.
inline LaneTestScale LaneTestScaleOf(float scale_f) {
  static_assert(2 * kCancellationBound<BFloat16> == 0x1p-11f, "2B = 2^-11");
  uint32_t bits;
  std::memcpy(&bits, &scale_f, sizeof bits);
  const int k = static_cast<int>(bits >> 23) - 127 + ((bits & 0x7fffffu) != 0 ? 1 : 0);
  return {11 - k, std::min((253 - k) << 7, 0x7f00)};
}

// The NEOX steps' test where Scratch::lane_test is set (rope_cpu.cc:
// CpuTakesLaneTest, CPUs other than Intel's): the 32 pairs of a step at
// once, in the 16-bit lanes of their stored bfloat16 inputs (uw, vw: pair
// j's in lane j) and of their narrowed results (ra, rb, in the same
// lanes), with integer operations only. It refuses a superset of
// PairsToRedo's pairs: the loop appends them to the slow lists, where
// RedoSlowPairs decides each by the scalar contract, so the output is the
// same either way. A pair passes when both |ra| and |rb| (bit patterns)
// are at least Bound, which is
// - 0 where both inputs are zero (zero-filled rows, padding, stay on the
//   fast path: their results are exact zeros, which every narrowing keeps);
// - else the larger of 0x81 (2^-126 (1 + 2^-7)) and T + 1, T being the
//   bits of M 2^-S: M = max(|u|, |v|), 2^k the power of two at or above
//   the scale, 2^-S = 2B 2^k (rope_avx2.inc's PairTestBF16x16 derives
//   T >= B (|u| + |v|) scale as the scalar test forms it in float, where
//   |u| + |v| does not overflow); T + 1 is the next bfloat16 value above
//   T, so a narrowed |r| at least that leaves |a| > T: T is a bfloat16
//   value, and rounding (or reading a subnormal as zero) takes no |a| <= T
//   above T;
// - and every pair with M >= 2^(126 - k), or 2^127, fails (Huge): below
//   that the products are under 2^126, so no result is NaN or infinite.
// A pair that passes therefore has finite results over 2^-126, normal
// (which VCVTNE2PS2BF16 and the integer rounding narrow as FloatToBFloat16
// does: a subnormal result, read as zero or rounded, stays under 0x81 and
// fails), at least the scalar bound: the scalar contract narrows it too.
//
// Against PairsToRedo on both halves of a NEOX step (14 vector operations,
// two of them VRANGEPS and two VFPCLASSPS, which the Zen 5 runs on few
// pipes: bench/cpu/zen5-2026-12-02-experiments/), 11 integer ones and a
// mask OR. It refuses more: for uniform inputs in [-1, 1) and uniform
// angles, 0.055% of pairs against 0.040% (one 32-pair step in 57 against
// one in 79; bench/cpu/zen3-2026-12-02-experiments/pair_rate.py).
class PairTestBF16x32 {
 public:
  // REQUIRES: scale_f >= 0 and finite.
  POSENC_BF16_WIDE_TARGET explicit PairTestBF16x32(float scale_f) {
    const LaneTestScale l = LaneTestScaleOf(scale_f);
    if (l.s >= 1) {
      // m - (S << 7) + 1, saturated at 0: T + 1 where T is normal.
      less_ = _mm512_set1_epi16(static_cast<int16_t>((l.s << 7) - 1));
      below_huge_ = _mm512_set1_epi16(static_cast<int16_t>(l.huge - 1));
    } else {
      // S < 1 would raise M: every pair but zeros fails instead (not for
      // the scales the wide loops take, kWideMinScale to kMaxAttentionScale).
      less_ = _mm512_set1_epi16(0x7fff);
      below_huge_ = _mm512_setzero_si512();
    }
  }

  // Each lane's least |r| (bit patterns, unsigned), and in *huge the lanes
  // that fail whatever their results.
  POSENC_BF16_WIDE_TARGET POSENC_ALWAYS_INLINE __m512i Bound(__m512i uw, __m512i vw,
                                                             __mmask32* huge) const {
    const __m512i magnitude = _mm512_set1_epi16(0x7fff);
    const __m512i m =
        _mm512_max_epu16(_mm512_and_si512(uw, magnitude), _mm512_and_si512(vw, magnitude));
    *huge = _mm512_cmpgt_epu16_mask(m, below_huge_);
    const __m512i scaled = _mm512_subs_epu16(m, less_);
    return _mm512_mask_max_epu16(scaled, _mm512_cmpgt_epu16_mask(m, _mm512_setzero_si512()), scaled,
                                 _mm512_set1_epi16(0x81));
  }

  // The lanes whose pair fails: the smaller |r| below the bound, or huge.
  POSENC_BF16_WIDE_TARGET POSENC_ALWAYS_INLINE static __mmask32 Fails(__m512i bound, __mmask32 huge,
                                                                      __m512i ra, __m512i rb) {
    const __m512i magnitude = _mm512_set1_epi16(0x7fff);
    const __m512i least =
        _mm512_min_epu16(_mm512_and_si512(ra, magnitude), _mm512_and_si512(rb, magnitude));
    return static_cast<__mmask32>(_mm512_cmpgt_epu16_mask(bound, least) | huge);
  }

 private:
  __m512i less_, below_huge_;
};

}  // namespace posenc::internal

#endif  // POSENC_CPU_BF16_WIDE
#endif  // POSENC_KERNELS_CPU_ROPE_WIDE_EXACTNESS_H_
