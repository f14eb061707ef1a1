// bfloat16 in 512-bit registers, for the loops that run on CPUs with
// AVX-512 BF16 (POSENC_BF16_WIDE_TARGET, chosen at run time by
// CpuHasAvx512Bf16): widening is a shift, and narrowing is VCVTNE2PS2BF16,
// which rounds as FloatToBFloat16 does (to nearest even; a NaN keeps its top
// bits, quieted) except that it reads float subnormals as zero. Callers
// send the lanes where that differs to the scalar contract. Internal.
#ifndef POSENC_KERNELS_CPU_BF16_WIDE_H_
#define POSENC_KERNELS_CPU_BF16_WIDE_H_

#include "cpu_kernels.h"

#ifdef POSENC_CPU_BF16_WIDE
#include "posenc/dtype.h"
#include "x86_intrinsics.h"

namespace posenc::internal {

// Holds v in a register from here on: GCC otherwise folds a loaded vector
// into each instruction that uses it as a memory operand, loading it again
// for each (the wide loops are bound by their loads; bench/RESULTS.md).
// (Not in the emulated AVX-512 build, where no register holds a 512-bit
// vector.)
template <typename V>
POSENC_ALWAYS_INLINE void KeepInRegister(V& v) {
#ifndef POSENC_EMULATE_AVX512
  asm("" : "+v"(v));
#else
  (void)v;
#endif
}

// The even and the odd elements of 32 stored bfloat16 values (one 64-byte
// load), as floats: lane i holds element 2i, or 2i + 1.
POSENC_BF16_WIDE_TARGET POSENC_ALWAYS_INLINE __m512 EvenBF16(__m512i w) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
POSENC_BF16_WIDE_TARGET POSENC_ALWAYS_INLINE __m512 OddBF16(__m512i w) {
  return _mm512_castsi512_ps(
      _mm512_and_si512(w, _mm512_set1_epi32(static_cast<int32_t>(0xffff0000u))));
}

// 16 bfloat16 values (loaded, or stored at y), in order, as floats.
POSENC_BF16_WIDE_TARGET POSENC_ALWAYS_INLINE __m512 WidenBF16x16(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
POSENC_BF16_WIDE_TARGET POSENC_ALWAYS_INLINE __m512 WidenBF16x16(const BFloat16* y) {
  return WidenBF16x16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(y)));
}
// 8 stored bfloat16 values, in order, as floats in lanes 0-7 (8-15 zero).
POSENC_BF16_WIDE_TARGET POSENC_ALWAYS_INLINE __m512 WidenBF16x8(const BFloat16* y) {
  return WidenBF16x16(_mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(y))));
}

// even and odd narrowed and interleaved back, the inverse of EvenBF16 and
// OddBF16: 32 bfloat16 values to store at once.
POSENC_BF16_WIDE_TARGET POSENC_ALWAYS_INLINE __m512i InterleaveBF16(__m512 even, __m512 odd) {
  // 16-bit lane j: even_(j/2) for even j, odd_(j/2) for odd j, from
  // VCVTNE2PS2BF16's [even_0 .. even_15, odd_0 .. odd_15].
  const __m512i order = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24,
                                         8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(order, (__m512i)_mm512_cvtne2ps_pbh(odd, even));
}

// first and second narrowed, in order, to y0[0, 16) and y1[0, 16).
POSENC_BF16_WIDE_TARGET POSENC_ALWAYS_INLINE void StoreBF16x16Twice(__m512 first, __m512 second,
                                                                    BFloat16* y0, BFloat16* y1) {
  const __m512i out = (__m512i)_mm512_cvtne2ps_pbh(second, first);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(y0), _mm512_castsi512_si256(out));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(y1), _mm512_extracti64x4_epi64(out, 1));
}

}  // namespace posenc::internal

#endif  // POSENC_CPU_BF16_WIDE
#endif  // POSENC_KERNELS_CPU_BF16_WIDE_H_
