// Which lanes of a 512-bit bfloat16 RoPE step may be narrowed by
// VCVTNE2PS2BF16 (or bf16_wide.h's integer rounding) and which go to the
// scalar contract. Internal: rope_bf16_wide.inc's loops, and
// rope_wide_exactness_test.cc, which holds it against the scalar test.
#ifndef POSENC_KERNELS_CPU_ROPE_WIDE_EXACTNESS_H_
#define POSENC_KERNELS_CPU_ROPE_WIDE_EXACTNESS_H_

#include "bf16_wide.h"

#ifdef POSENC_CPU_BF16_WIDE
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

}  // namespace posenc::internal

#endif  // POSENC_CPU_BF16_WIDE
#endif  // POSENC_KERNELS_CPU_ROPE_WIDE_EXACTNESS_H_
