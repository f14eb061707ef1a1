// bfloat16 in 512-bit registers, for the loops that run on CPUs with
// AVX-512 (POSENC_BF16_WIDE_TARGET, chosen at run time by CpuHasAvx512):
// widening is a shift, and narrowing one of two ways (Narrowing), chosen
// by CpuHasAvx512Bf16. Internal.
#ifndef POSENC_KERNELS_CPU_BF16_WIDE_H_
#define POSENC_KERNELS_CPU_BF16_WIDE_H_

#include "cpu_kernels.h"

namespace posenc::internal {

// How a 512-bit bfloat16 loop narrows floats to bfloat16, a template
// parameter of each:
//  - kInstruction: VCVTNE2PS2BF16 (AVX-512 BF16), 32 values in one
//    instruction. It rounds as FloatToBFloat16 does (to nearest even; a NaN
//    keeps its top bits, quieted) except that it reads float subnormals as
//    zero. Callers send the lanes where that differs to the scalar
//    contract.
//  - kRounding: FloatToBFloat16's integer rounding in 16-bit lanes
//    (NarrowBF16x16's in bf16_avx2.h, twice as wide), for AVX-512 CPUs
//    without BF16 (Skylake-SP to Ice Lake): 9 instructions for 32 values,
//    exact for every value but NaN. The callers' tests for kInstruction
//    serve: the RoPE loop redoes every NaN lane by the scalar contract,
//    and the sinusoidal loop's NaN sums are quiet with their low half
//    zero, whose rounding is exact as well. (The bias keeps its AVX2 loop
//    on such CPUs: bias_cpu.cc says why.)
//    Its loops share kInstruction's target attribute, BF16 included; they
//    call no BF16 intrinsic (the emulated build traps on one under
//    POSENC_NO_AVX512BF16), and the ctest narrowing_code reads the
//    library's object code for any BF16 instruction in them.
enum class Narrowing { kInstruction, kRounding };

}  // namespace posenc::internal

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

// Holds mask k in a mask register up to here (as KeepInRegister a vector):
// GCC otherwise may copy it to a general register earlier, on a path that
// does not need it.
POSENC_ALWAYS_INLINE void KeepInMaskRegister(__mmask16& k) {
#ifndef POSENC_EMULATE_AVX512
  asm volatile("" : "+k"(k));
#else
  (void)k;
#endif
}

// VPERMT2PS indices for 16 adjacent float pairs held in two vectors
// (w0, w1): lane j of `even` is element 2j of the 32, of `odd` 2j + 1 (the
// pairs' first and second elements); `first` and `second` put two such
// vectors (u, v) back in pairs, the first 8 and the last 8. The float32
// loops of RoPE (GPT-J) and the sinusoidal add (INTERLEAVED) use them.
struct PairLanes {
  __m512i even, odd, first, second;
};
POSENC_AVX512_TARGET POSENC_ALWAYS_INLINE PairLanes MakePairLanes() {
  return {_mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30),
          _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31),
          _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23),
          _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31)};
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

// FloatToBFloat16 of 32 floats whose top halves are h and bottom halves l
// (16-bit lanes, paired lane by lane): h, plus one where l + 0x7fff +
// (h & 1) carries, which VPAVGW's 17-bit sum gives as its top bit.
// REQUIRES: no NaN.
POSENC_BF16_WIDE_TARGET POSENC_ALWAYS_INLINE __m512i RoundHalves(__m512i h, __m512i l) {
  const __m512i half_less_one =
      _mm512_add_epi16(_mm512_and_si512(h, _mm512_set1_epi16(1)), _mm512_set1_epi16(0x7ffe));
  const __m512i carry = _mm512_avg_epu16(l, half_less_one);  // (l + 0x7fff + (h & 1)) / 2
  return _mm512_sub_epi16(h, _mm512_srai_epi16(carry, 15));  // h + the carry
}

// FloatToBFloat16 of each float in the top half of its lane (the bottom
// half is left over): its bits + 0x7fff + the bit that will be the
// result's last. REQUIRES: no NaN.
POSENC_BF16_WIDE_TARGET POSENC_ALWAYS_INLINE __m512i RoundToBF16High(__m512 r) {
  const __m512i bits = _mm512_castps_si512(r);
  const __m512i last = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  return _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7fff)), last);
}

// even and odd narrowed and interleaved back, the inverse of EvenBF16 and
// OddBF16: 32 bfloat16 values to store at once.
template <Narrowing kN>
POSENC_BF16_WIDE_TARGET POSENC_ALWAYS_INLINE __m512i InterleaveBF16(__m512 even, __m512 odd) {
  if constexpr (kN == Narrowing::kInstruction) {
    // 16-bit lane j: even_(j/2) for even j, odd_(j/2) for odd j, from
    // VCVTNE2PS2BF16's [even_0 .. even_15, odd_0 .. odd_15].
    const __m512i order =
        _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                         21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return _mm512_permutexvar_epi16(order, (__m512i)_mm512_cvtne2ps_pbh(odd, even));
  } else {
    // Odd 16-bit lanes from odd, even ones from even: the top halves, and
    // the bottom ones.
    const __m512i e = _mm512_castps_si512(even), o = _mm512_castps_si512(odd);
    const __mmask32 odd_lanes = 0xaaaaaaaau;
    const __m512i h = _mm512_mask_blend_epi16(odd_lanes, _mm512_srli_epi32(e, 16), o);
    const __m512i l = _mm512_mask_blend_epi16(odd_lanes, e, _mm512_slli_epi32(o, 16));
    return RoundHalves(h, l);
  }
}

// first and second narrowed, in order: first's 16 values in 16-bit lanes
// 0-15, second's in 16-31.
template <Narrowing kN>
POSENC_BF16_WIDE_TARGET POSENC_ALWAYS_INLINE __m512i NarrowBF16x32(__m512 first, __m512 second) {
  if constexpr (kN == Narrowing::kInstruction) {
    return (__m512i)_mm512_cvtne2ps_pbh(second, first);
  } else {
    // Each float rounded in its 32-bit lane (the result in its top half),
    // then the top halves gathered in order by one VPERMT2W: 16-bit element
    // 2i + 1 of first is float i's top half; index bit 5 picks second.
    const __m512i top =
        _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29, 27,
                         25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    return _mm512_permutex2var_epi16(RoundToBF16High(first), top, RoundToBF16High(second));
  }
}

// first and second narrowed, in order, to y0[0, 16) and y1[0, 16).
template <Narrowing kN>
POSENC_BF16_WIDE_TARGET POSENC_ALWAYS_INLINE void StoreBF16x16Twice(__m512 first, __m512 second,
                                                                    BFloat16* y0, BFloat16* y1) {
  const __m512i out = NarrowBF16x32<kN>(first, second);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(y0), _mm512_castsi512_si256(out));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(y1), _mm512_extracti64x4_epi64(out, 1));
}

}  // namespace posenc::internal

#endif  // POSENC_CPU_BF16_WIDE
#endif  // POSENC_KERNELS_CPU_BF16_WIDE_H_
