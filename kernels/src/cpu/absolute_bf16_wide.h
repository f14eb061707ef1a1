// The fused sinusoidal add for bfloat16 in 512-bit registers, for CPUs
// with AVX-512 BF16 (POSENC_BF16_WIDE_TARGET, chosen at run time by
// CpuHasAvx512Bf16). Only absolute_cpu.cc includes it. Internal.
#ifndef POSENC_KERNELS_CPU_ABSOLUTE_BF16_WIDE_H_
#define POSENC_KERNELS_CPU_ABSOLUTE_BF16_WIDE_H_

#include "bf16_wide.h"

#ifdef POSENC_CPU_BF16_WIDE
#include <immintrin.h>

#include <cstdint>

#include "math/absolute_math.h"
#include "posenc/dtype.h"

namespace posenc::internal {
// Unnamed, as in absolute_cpu.cc, the one file that includes it: GCC then
// specialises the noinline loop for its one caller.
namespace {

// FusedRangeBody for bfloat16 on AVX-512 BF16 CPUs, 16 frequencies a step
// in 512-bit registers, from the anchor row's halves (a = sin_i, b = cos_i):
// lane j of a step holds frequency i + j, its sin channel's input in u and
// its cos channel's in v (INTERLEAVED: 16 adjacent pairs, split into even
// and odd elements; CONCATENATED: the two halves). PE is RotateSinCos,
// operation for operation. VCVTNE2PS2BF16 narrows a sum as FloatToBFloat16
// does wherever |r| >= kSinusoidalSafeSum (2^-10: far from float
// subnormals, which it would flush); a step with a lane below that is
// stored all the same, and then those lanes' two elements are stored
// again by the scalar operations of FusedRangeBody's `slow`
// (absolute_cpu.cc), recording the flagged ones in pending_* for the
// caller. [lo, hi): multiples of 16 apart.
// Each step asks for the elements `ahead` past its own (the next row's).
template <bool kScaled>
POSENC_BF16_WIDE_TARGET __attribute__((noinline)) void FusedRangeBF16Wide(
    const float* __restrict a, const float* __restrict b, const float* __restrict tc,
    const float* __restrict ts, bool interleaved, int64_t half, BFloat16* __restrict y, int64_t lo,
    int64_t hi, float xs, int32_t* __restrict pending_at, float* __restrict pending_x,
    int64_t* pending_count, int64_t ahead) {
  int64_t pending = *pending_count;
  const __m512 xs_v = _mm512_set1_ps(xs);
  const __m512 safe = _mm512_set1_ps(kSinusoidalSafeSum<BFloat16>);
  for (int64_t i = lo; i < hi; i += 16) {
    __m512 u, v;
    if (interleaved) {
      __builtin_prefetch(y + 2 * i + ahead, 1, 3);
      const __m512i w = _mm512_loadu_si512(y + 2 * i);
      u = EvenBF16(w);
      v = OddBF16(w);
    } else {
      __builtin_prefetch(y + i + ahead, 1, 3);
      __builtin_prefetch(y + half + i + ahead, 1, 3);
      u = WidenBF16x16(y + i);
      v = WidenBF16x16(y + half + i);
    }
    const __m512 as = _mm512_loadu_ps(a + i), ac = _mm512_loadu_ps(b + i);
    const __m512 oc = _mm512_loadu_ps(tc + i), os = _mm512_loadu_ps(ts + i);
    const __m512 pe_s = _mm512_add_ps(_mm512_mul_ps(as, oc), _mm512_mul_ps(ac, os));
    const __m512 pe_c = _mm512_sub_ps(_mm512_mul_ps(ac, oc), _mm512_mul_ps(as, os));
    const __m512 rs = _mm512_add_ps(kScaled ? _mm512_mul_ps(u, xs_v) : u, pe_s);
    const __m512 rc = _mm512_add_ps(kScaled ? _mm512_mul_ps(v, xs_v) : v, pe_c);
    // min(|rs|, |rc|) >= the bound. VRANGEPS gives the other operand of a
    // NaN, so a lane with one NaN sum (a NaN input) may pass: VCVTNE2PS2BF16
    // narrows a NaN as FloatToBFloat16 does (top bits, quieted), and `slow`
    // would store just that and record nothing.
    const __m512 m = _mm512_range_ps(rs, rc, 0x0a);
    const __mmask16 ok = _mm512_cmp_ps_mask(m, safe, _CMP_GE_OQ);
    if (interleaved) {
      _mm512_storeu_si512(y + 2 * i, InterleaveBF16(rs, rc));
    } else {
      StoreBF16x16Twice(rs, rc, y + i, y + half + i);
    }
    if (__builtin_expect(!_kortestc_mask16_u8(ok, ok), 0)) {  // a lane below the bound
      alignas(64) float xu[16], xv[16], sums[2][16];
      _mm512_store_ps(xu, u);
      _mm512_store_ps(xv, v);
      _mm512_store_ps(sums[0], rs);
      _mm512_store_ps(sums[1], rc);
      for (uint32_t bad = ~static_cast<uint32_t>(ok) & 0xffffu; bad != 0; bad &= bad - 1) {
        const int j = __builtin_ctz(bad);
        for (int channel = 0; channel < 2; ++channel) {  // sin, cos
          const int64_t e = interleaved ? 2 * (i + j) + channel : channel * half + i + j;
          const float r = sums[channel][j];
          y[e] = FromFloat<BFloat16>(r);
          if (SinusoidalSumNeedsPrecise<BFloat16>(r)) {
            pending_at[pending] = static_cast<int32_t>(e);
            pending_x[pending++] = channel == 0 ? xu[j] : xv[j];
          }
        }
      }
    }
  }
  *pending_count = pending;
}

}  // namespace
}  // namespace posenc::internal

#endif  // POSENC_CPU_BF16_WIDE
#endif  // POSENC_KERNELS_CPU_ABSOLUTE_BF16_WIDE_H_
