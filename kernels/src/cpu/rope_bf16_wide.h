// bfloat16 RoPE in 512-bit registers, for CPUs with AVX-512 BF16
// (POSENC_BF16_WIDE_TARGET, chosen at run time by CpuHasAvx512Bf16): a run
// of rows at a time, narrowed by VCVTNE2PS2BF16 where that is exactly the
// scalar contract's result, the other pairs left to the caller
// (rope_cpu.cc's RedoSlowPairs). Included by rope_cpu.cc only. Internal.
#ifndef POSENC_KERNELS_CPU_ROPE_BF16_WIDE_H_
#define POSENC_KERNELS_CPU_ROPE_BF16_WIDE_H_

#include "bf16_wide.h"

#ifdef POSENC_CPU_BF16_WIDE
#include <immintrin.h>

#include <cstdint>

#include "math/rope_math.h"
#include "posenc/dtype.h"
#include "posenc/rope.h"
#include "rope_rows.h"

namespace posenc::internal {
// Unnamed, as these were in rope_cpu.cc, the one file that includes them:
// GCC then specialises their noinline functions for their one caller.
namespace {

// One 16-lane step's arithmetic: the rotated pairs (a, b) of (u, v), and
// the lanes VCVTNE2PS2BF16 may not narrow (RotateBF16Wide says why): m
// NaN, infinite or subnormal (*odd), or below the bound (*low).
template <bool kUnitScale>
POSENC_BF16_WIDE_TARGET POSENC_ALWAYS_INLINE void Rotate16(__m512 u, __m512 v, __m512 ck, __m512 nk,
                                                           __m512 bound_scale, __m512 scale_v,
                                                           __m512* a, __m512* b, __mmask16* odd,
                                                           __mmask16* low) {
  *a = _mm512_sub_ps(_mm512_mul_ps(u, ck), _mm512_mul_ps(v, nk));
  *b = _mm512_add_ps(_mm512_mul_ps(v, ck), _mm512_mul_ps(u, nk));
  const __m512 sum = _mm512_add_ps(_mm512_abs_ps(u), _mm512_abs_ps(v));
  const __m512 bound = kUnitScale ? _mm512_mul_ps(bound_scale, sum)
                                  : _mm512_mul_ps(_mm512_mul_ps(bound_scale, sum), scale_v);
  const __m512 m = _mm512_range_ps(*a, *b, 0x0a);  // min(|a|, |b|), sign cleared
  *odd = _mm512_fpclass_ps_mask(m, 0xb9);          // NaN, infinite or subnormal
  *low = _mm512_cmp_ps_mask(m, bound, _CMP_NGE_UQ);
}

// Appends the pairs of the lanes in `bad` to slow_k/u/v: lane i is pair
// first + i * stride of the row.
POSENC_BF16_WIDE_TARGET POSENC_ALWAYS_INLINE void KeepSlow(
    __mmask16 bad, __m512 u, __m512 v, int64_t first, int64_t stride, int32_t* __restrict slow_k,
    float* __restrict slow_u, float* __restrict slow_v, int64_t* slow) {
  alignas(64) float us[16], vs[16];
  _mm512_store_ps(us, u);
  _mm512_store_ps(vs, v);
  for (uint32_t rest = bad; rest != 0; rest &= rest - 1) {
    const int i = __builtin_ctz(rest);
    slow_k[*slow] = static_cast<int32_t>(first + i * stride);
    slow_u[*slow] = us[i];
    slow_v[(*slow)++] = vs[i];
  }
}

// Rotate16 on the `lanes` of u and v that hold pairs (the others zero):
// pair first + i in lane i, rotated by c[i] and n[i]; the lanes that fail
// go to KeepSlow.
template <bool kUnitScale>
POSENC_BF16_WIDE_TARGET POSENC_ALWAYS_INLINE void RotateLanes(
    __mmask16 lanes, __m512 u, __m512 v, const float* c, const float* n, __m512 bound_scale,
    __m512 scale_v, int64_t first, __m512* a, __m512* b, int32_t* __restrict slow_k,
    float* __restrict slow_u, float* __restrict slow_v, int64_t* slow) {
  __mmask16 odd, low;
  Rotate16<kUnitScale>(u, v, _mm512_maskz_loadu_ps(lanes, c), _mm512_maskz_loadu_ps(lanes, n),
                       bound_scale, scale_v, a, b, &odd, &low);
  const __mmask16 bad = _kand_mask16(_kor_mask16(odd, low), lanes);
  if (__builtin_expect(bad != 0, 0)) KeepSlow(bad, u, v, first, 1, slow_k, slow_u, slow_v, slow);
}

// bfloat16 RoPE of a run of rows, pairs [0, returned) of each, in 512-bit
// registers and narrowed by VCVTNE2PS2BF16: one call per run rather than
// per head, since a head is only a few steps. NEOX takes 32 pairs a step,
// GPT-J 16. A step splits 64-byte loads into even and odd elements (shift,
// mask): GPT-J's 16 adjacent pairs into u and v; NEOX's 32 first and 32
// second elements into pairs k0 + 2i and k0 + 2i + 1, rotated by
// Scratch::cp/np, whose slots are in that order. The results go back
// interleaved by one VPERMW. The pairs past the last whole step (rotary dim
// 32 as in Pythia's and Phi-2's partial rotary, 80- and 96-dim heads) are
// RotateTailsBF16Wide's.
//
// VCVTNE2PS2BF16 rounds as FloatToBFloat16 does (to nearest even), except
// that it reads float subnormals as zero and keeps a NaN's payload where
// RotateF32 makes its one canonical NaN. So a pair is narrowed here only
// when m = min(|a|, |b|) (VRANGEPS, which gives NaN only when both are) is
// at least the cancellation bound (scalar PairNeedsPrecise, the same float
// operations) and is neither subnormal nor infinite nor NaN. Then neither
// result is subnormal, or both are exact zeros from zero inputs (bound 0;
// rope_cpu.cc's kWideMinScale keeps the bound nonzero for any other inputs); and neither
// is NaN: that takes a NaN input (bound NaN), an infinite one (bound
// infinite, above any finite m) or two products that overflow, which make
// the other result infinite or NaN as well. Every step is stored; a pair
// that fails (one 32-pair step in 76, one 16-pair step in 150, for uniform
// inputs and angles) is also appended, as
// row * half + k with its inputs, to slow_k/u/v[*num_slow], for the caller
// to redo by the scalar contract (RedoSlowPairs). Not inlined: a
// default-target caller cannot inline AVX-512 code.
// REQUIRES: scale_f >= kWideMinScale; kUnitScale: scale_f == 1; NEOX:
// rows.cp/np set.
template <RopeStyle kStyle, bool kUnitScale>
POSENC_BF16_WIDE_TARGET __attribute__((noinline)) int64_t RotateBF16Wide(
    const Rows<BFloat16>& rows, int64_t D, int64_t half, float scale_f, int32_t* __restrict slow_k,
    float* __restrict slow_u, float* __restrict slow_v, int64_t* num_slow) {
  const __m512 bound_scale = _mm512_set1_ps(kCancellationBound<BFloat16>);
  const __m512 scale_v = _mm512_set1_ps(scale_f);
  constexpr int64_t kStep = kStyle == RopeStyle::kNeox ? 32 : 16;
  const int64_t k_end = half / kStep * kStep;
  int64_t slow = *num_slow;
  for (int64_t row = 0; row < rows.count; ++row) {
    BFloat16* __restrict x = rows.x + row * D;
    if (rows.prefetch_bytes != 0) {
      PrefetchForWrite(reinterpret_cast<const char*>(x) + rows.prefetch_bytes,
                       D * static_cast<int64_t>(sizeof(BFloat16)));
    }
    const int64_t cn = row * rows.dt * half;
    for (int64_t k0 = 0; k0 < k_end; k0 += kStep) {
      if constexpr (kStyle == RopeStyle::kNeox) {
        const float* __restrict cp = rows.cp + cn;
        const float* __restrict np = rows.np + cn;
        const __m512i uw = _mm512_loadu_si512(x + k0), vw = _mm512_loadu_si512(x + half + k0);
        const __m512 ue = EvenBF16(uw), uo = OddBF16(uw), ve = EvenBF16(vw), vo = OddBF16(vw);
        __m512 ae, be, ao, bo;
        __mmask16 odd_e, low_e, odd_o, low_o;
        Rotate16<kUnitScale>(ue, ve, _mm512_loadu_ps(cp + k0), _mm512_loadu_ps(np + k0),
                             bound_scale, scale_v, &ae, &be, &odd_e, &low_e);
        Rotate16<kUnitScale>(uo, vo, _mm512_loadu_ps(cp + k0 + 16), _mm512_loadu_ps(np + k0 + 16),
                             bound_scale, scale_v, &ao, &bo, &odd_o, &low_o);
        if (__builtin_expect(
                !_kortestz_mask16_u8(_kor_mask16(odd_e, odd_o), _kor_mask16(low_e, low_o)), 0)) {
          KeepSlow(_kor_mask16(odd_e, low_e), ue, ve, row * half + k0, 2, slow_k, slow_u, slow_v,
                   &slow);
          KeepSlow(_kor_mask16(odd_o, low_o), uo, vo, row * half + k0 + 1, 2, slow_k, slow_u,
                   slow_v, &slow);
        }
        _mm512_storeu_si512(x + k0, InterleaveBF16(ae, ao));
        _mm512_storeu_si512(x + half + k0, InterleaveBF16(be, bo));
      } else {
        const float* __restrict c = rows.c + cn;
        const float* __restrict n = rows.n + cn;
        const __m512i w = _mm512_loadu_si512(x + 2 * k0);
        const __m512 u = EvenBF16(w), v = OddBF16(w);
        __m512 a, b;
        __mmask16 odd, low;
        Rotate16<kUnitScale>(u, v, _mm512_loadu_ps(c + k0), _mm512_loadu_ps(n + k0), bound_scale,
                             scale_v, &a, &b, &odd, &low);
        if (__builtin_expect(!_kortestz_mask16_u8(odd, low), 0)) {  // a pair to redo
          KeepSlow(_kor_mask16(odd, low), u, v, row * half + k0, 1, slow_k, slow_u, slow_v, &slow);
        }
        _mm512_storeu_si512(x + 2 * k0, InterleaveBF16(a, b));
      }
    }
  }
  *num_slow = slow;
  return k_end;
}

// The pairs of every row of the run past RotateBF16Wide's whole steps,
// pairs [k_end, half): a step of 16 (NEOX) and of 8 where that many are
// left, then the last few in masked lanes. Loads and stores of the steps
// take exactly their elements: masked ones
// that reach past them, into the elements this row has just stored or into
// the next row's, stall the loads that follow (80-dim heads ran 1.7x slower
// so). A pass of its own after the whole steps: inside their row loop, its
// code slowed 128-dim heads, which have no tail, by about 10% (bf16 NEOX
// BHSD 0.74-0.80 against 0.88-0.91 in the bench).
template <RopeStyle kStyle, bool kUnitScale>
POSENC_BF16_WIDE_TARGET __attribute__((noinline)) void RotateTailsBF16Wide(
    const Rows<BFloat16>& rows, int64_t D, int64_t half, int64_t k_end, float scale_f,
    int32_t* __restrict slow_k, float* __restrict slow_u, float* __restrict slow_v,
    int64_t* num_slow) {
  const __m512 bound_scale = _mm512_set1_ps(kCancellationBound<BFloat16>);
  const __m512 scale_v = _mm512_set1_ps(scale_f);
  int64_t slow = *num_slow;
  for (int64_t row = 0; row < rows.count; ++row) {
    BFloat16* __restrict x = rows.x + row * D;
    const int64_t cn = row * rows.dt * half;
    int64_t k0 = k_end;
    __m512 a, b;
    if constexpr (kStyle == RopeStyle::kNeox) {
      if (half - k0 >= 16) {
        RotateLanes<kUnitScale>(0xffff, WidenBF16x16(x + k0), WidenBF16x16(x + half + k0),
                                rows.c + cn + k0, rows.n + cn + k0, bound_scale, scale_v,
                                row * half + k0, &a, &b, slow_k, slow_u, slow_v, &slow);
        StoreBF16x16Twice(a, b, x + k0, x + half + k0);
        k0 += 16;
      }
      if (half - k0 >= 8) {
        RotateLanes<kUnitScale>(0xff, WidenBF16x8(x + k0), WidenBF16x8(x + half + k0),
                                rows.c + cn + k0, rows.n + cn + k0, bound_scale, scale_v,
                                row * half + k0, &a, &b, slow_k, slow_u, slow_v, &slow);
        const __m512i out = (__m512i)_mm512_cvtne2ps_pbh(b, a);  // a in 0-15, b in 16-31
        _mm_storeu_si128(reinterpret_cast<__m128i*>(x + k0), _mm512_castsi512_si128(out));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(x + half + k0),
                         _mm512_extracti32x4_epi32(out, 2));
        k0 += 8;
      }
    } else if (half - k0 >= 8) {
      const __m512i w =
          _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 2 * k0)));
      RotateLanes<kUnitScale>(0xff, EvenBF16(w), OddBF16(w), rows.c + cn + k0, rows.n + cn + k0,
                              bound_scale, scale_v, row * half + k0, &a, &b, slow_k, slow_u, slow_v,
                              &slow);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(x + 2 * k0),
                          _mm512_castsi512_si256(InterleaveBF16(a, b)));
      k0 += 8;
    }
  }
  // The last few pairs of every row (fewer than 8), in masked lanes, after
  // every row's steps above: a masked load or store spans whole vectors, and
  // where that span reaches elements stored just before (this row's own
  // steps) the load waits for those stores.
  const int64_t k_rest =
      k_end + (kStyle == RopeStyle::kNeox ? (half - k_end) / 8 * 8 : (half - k_end >= 8 ? 8 : 0));
  const int64_t r = half - k_rest;
  if (r == 0) {
    *num_slow = slow;
    return;
  }
  const __mmask16 lanes = static_cast<__mmask16>((1u << r) - 1);
  for (int64_t row = 0; row < rows.count; ++row) {
    BFloat16* __restrict x = rows.x + row * D;
    const int64_t cn = row * rows.dt * half;
    __m512 a, b;
    if constexpr (kStyle == RopeStyle::kNeox) {
      const __mmask8 lanes8 = static_cast<__mmask8>(lanes);
      const __m512 u =
          WidenBF16x16(_mm256_zextsi128_si256(_mm_maskz_loadu_epi16(lanes8, x + k_rest)));
      const __m512 v =
          WidenBF16x16(_mm256_zextsi128_si256(_mm_maskz_loadu_epi16(lanes8, x + half + k_rest)));
      RotateLanes<kUnitScale>(lanes, u, v, rows.c + cn + k_rest, rows.n + cn + k_rest, bound_scale,
                              scale_v, row * half + k_rest, &a, &b, slow_k, slow_u, slow_v, &slow);
      const __m512i out = (__m512i)_mm512_cvtne2ps_pbh(b, a);  // a in 0-15, b in 16-31
      _mm_mask_storeu_epi16(x + k_rest, lanes8, _mm512_castsi512_si128(out));
      _mm_mask_storeu_epi16(x + half + k_rest, lanes8, _mm512_extracti32x4_epi32(out, 2));
    } else {
      const __mmask16 elements = static_cast<__mmask16>((1u << (2 * r)) - 1);
      const __m512i w = _mm512_zextsi256_si512(_mm256_maskz_loadu_epi16(elements, x + 2 * k_rest));
      RotateLanes<kUnitScale>(lanes, EvenBF16(w), OddBF16(w), rows.c + cn + k_rest,
                              rows.n + cn + k_rest, bound_scale, scale_v, row * half + k_rest, &a,
                              &b, slow_k, slow_u, slow_v, &slow);
      _mm256_mask_storeu_epi16(x + 2 * k_rest, elements,
                               _mm512_castsi512_si256(InterleaveBF16(a, b)));
    }
  }
  *num_slow = slow;
}

}  // namespace
}  // namespace posenc::internal

#endif  // POSENC_CPU_BF16_WIDE
#endif  // POSENC_KERNELS_CPU_ROPE_BF16_WIDE_H_
