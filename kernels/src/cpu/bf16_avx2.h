// bfloat16 in 256-bit registers, for the loops that run on CPUs with AVX2
// (POSENC_AVX2_TARGET, chosen at run time by CpuHasAvx2) where the 512-bit
// ones do not (and the bias on AVX-512 CPUs without BF16: bias_cpu.cc).
// AVX2 has no bfloat16 conversion, so narrowing is FloatToBFloat16's
// integer rounding, lane by lane: exact for every value but NaN (which
// callers leave to the scalar contract, or pass only in the form whose
// rounding is exact: NarrowBF16x16).
// Values travel as even and odd elements of 16 stored ones, as in the
// 512-bit loops: widening is a shift or a mask, and narrowing back is one
// blend. Internal.
#ifndef POSENC_KERNELS_CPU_BF16_AVX2_H_
#define POSENC_KERNELS_CPU_BF16_AVX2_H_

#include "bf16_wide.h"  // KeepInRegister
#include "cpu_kernels.h"

#ifdef POSENC_CPU_BF16_WIDE
#include "posenc/dtype.h"
#include "x86_intrinsics.h"

namespace posenc::internal {

// The even and the odd elements of 16 stored bfloat16 values (one 32-byte
// load), as floats: lane i holds element 2i, or 2i + 1.
POSENC_AVX2_TARGET POSENC_ALWAYS_INLINE __m256 EvenBF16x8(__m256i w) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
POSENC_AVX2_TARGET POSENC_ALWAYS_INLINE __m256 OddBF16x8(__m256i w) {
  return _mm256_castsi256_ps(
      _mm256_and_si256(w, _mm256_set1_epi32(static_cast<int32_t>(0xffff0000u))));
}

// 8 stored bfloat16 values, in order, as floats.
POSENC_AVX2_TARGET POSENC_ALWAYS_INLINE __m256 WidenBF16x8Avx2(const BFloat16* y) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(y));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// FloatToBFloat16 of each lane in its high half (the low half is left
// over): the float's bits + 0x7fff + the bit that will be the result's
// last, which rounds to nearest, ties to even. REQUIRES: no NaN lane.
POSENC_AVX2_TARGET POSENC_ALWAYS_INLINE __m256i RoundToBF16High(__m256 r) {
  const __m256i bits = _mm256_castps_si256(r);
  const __m256i last = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  return _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7fff)), last);
}

// even and odd narrowed and interleaved back, the inverse of EvenBF16x8
// and OddBF16x8: 16 bfloat16 values to store at once, and the truncated
// ones they round from (each float's high half; a caller may test them:
// RotateBF16Avx2). REQUIRES: no NaN in what is stored but a quiet one
// whose low half is zero (a bfloat16 NaN through IEEE arithmetic: its
// rounding is its truncation, FloatToBFloat16's). The rounding is
// RoundToBF16High's, done once the halves are in 16-bit lanes (one
// instruction fewer than rounding each vector): the truncated values h,
// the bits below them l, and h + 1 where l + 0x7fff + (h & 1) carries,
// which VPAVGW's 17-bit sum gives as its top bit.
struct NarrowedBF16x16 {
  __m256i truncated;
  __m256i rounded;
};
POSENC_AVX2_TARGET POSENC_ALWAYS_INLINE NarrowedBF16x16 NarrowBF16x16(__m256 even, __m256 odd) {
  const __m256i e = _mm256_castps_si256(even), o = _mm256_castps_si256(odd);
  const __m256i h = _mm256_blend_epi16(_mm256_srli_epi32(e, 16), o, 0xaa);
  const __m256i l = _mm256_blend_epi16(e, _mm256_slli_epi32(o, 16), 0xaa);
  const __m256i half_less_one =
      _mm256_add_epi16(_mm256_and_si256(h, _mm256_set1_epi16(1)), _mm256_set1_epi16(0x7ffe));
  const __m256i carry = _mm256_avg_epu16(l, half_less_one);       // (l + 0x7fff + (h & 1)) / 2
  return {h, _mm256_sub_epi16(h, _mm256_srai_epi16(carry, 15))};  // h + the carry
}
POSENC_AVX2_TARGET POSENC_ALWAYS_INLINE __m256i InterleaveBF16x8(__m256 even, __m256 odd) {
  return NarrowBF16x16(even, odd).rounded;
}

// |x| of 16 bfloat16 bit patterns.
POSENC_AVX2_TARGET POSENC_ALWAYS_INLINE __m256i Abs16Avx2(__m256i x) {
  return _mm256_and_si256(x, _mm256_set1_epi16(0x7fff));
}

// first and second narrowed, in order, to y0[0, 8) and y1[0, 8) (which may
// be adjacent). REQUIRES: no NaN.
POSENC_AVX2_TARGET POSENC_ALWAYS_INLINE void StoreBF16x8Twice(__m256 first, __m256 second,
                                                              BFloat16* y0, BFloat16* y1) {
  // VPACKUSDW packs within 128-bit lanes: [f0-3, s0-3 | f4-7, s4-7].
  const __m256i packed = _mm256_packus_epi32(_mm256_srli_epi32(RoundToBF16High(first), 16),
                                             _mm256_srli_epi32(RoundToBF16High(second), 16));
  const __m256i out = _mm256_permute4x64_epi64(packed, 0xd8);  // [f0-7 | s0-7]
  _mm_storeu_si128(reinterpret_cast<__m128i*>(y0), _mm256_castsi256_si128(out));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(y1), _mm256_extracti128_si256(out, 1));
}

// |v| lane by lane.
POSENC_AVX2_TARGET POSENC_ALWAYS_INLINE __m256 Abs8Avx2(__m256 v) {
  return _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
}

// Whether every lane of a comparison's result is true.
POSENC_AVX2_TARGET POSENC_ALWAYS_INLINE bool AllSet(__m256 m) {
  return _mm256_movemask_ps(m) == 0xff;
}

}  // namespace posenc::internal

#endif  // POSENC_CPU_BF16_WIDE
#endif  // POSENC_KERNELS_CPU_BF16_AVX2_H_
