// The AVX-512 intrinsics the CPU kernels' 512-bit loops use, in portable
// code: compiled into the kernel library's emulated AVX-512 build
// (POSENC_EMULATE_AVX512, tests/conformance/CMakeLists.txt), they let a CPU
// without AVX-512 run those loops, so every conformance case proves them bit
// for bit on any CI machine, as the emulated grid does the CUDA kernels.
//
// Each function follows the instruction's definition in Intel's SDM, lane by
// lane, including where it differs from plain C++ (VCVTNE2PS2BF16 reads
// subnormals as zero; VRANGEPS and VFPCLASSPS on NaN; masked loads and
// stores touch no unselected element). Lane arithmetic goes through GCC's
// vector operators, as GCC's own <immintrin.h> does, so it compiles to the
// same operation in the same operand order. Only what the kernels call is
// here: a call of anything else fails to compile (target mismatch), so a
// new intrinsic in a 512-bit loop shows up at once and gets its emulation.
//
// Included after <immintrin.h> (whose types it reuses) by x86_intrinsics.h,
// and nowhere else.
#ifndef POSENC_TESTS_SUPPORT_AVX512_EMULATION_H_
#define POSENC_TESTS_SUPPORT_AVX512_EMULATION_H_

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "posenc/dtype.h"

namespace posenc::avx512_emulation {

#define POSENC_EMULATED inline __attribute__((always_inline))

// A vector's lanes as an array of T, and back.
template <typename T, int N>
struct Lanes {
  T v[N];
};
template <typename T, int N, typename V>
POSENC_EMULATED Lanes<T, N> Split(V v) {
  static_assert(sizeof(V) == sizeof(T) * N);
  Lanes<T, N> l;
  std::memcpy(l.v, &v, sizeof v);
  return l;
}
template <typename V, typename T, int N>
POSENC_EMULATED V Join(const Lanes<T, N>& l) {
  static_assert(sizeof(V) == sizeof(T) * N);
  V v;
  std::memcpy(&v, l.v, sizeof v);
  return v;
}

typedef float F16x __attribute__((vector_size(64)));
typedef double D8x __attribute__((vector_size(64)));
typedef int32_t I16x __attribute__((vector_size(64)));

// --- Arithmetic -----------------------------------------------------------

POSENC_EMULATED __m512 mm512_add_ps(__m512 a, __m512 b) { return (__m512)((F16x)a + (F16x)b); }
POSENC_EMULATED __m512 mm512_sub_ps(__m512 a, __m512 b) { return (__m512)((F16x)a - (F16x)b); }
POSENC_EMULATED __m512 mm512_mul_ps(__m512 a, __m512 b) { return (__m512)((F16x)a * (F16x)b); }
POSENC_EMULATED __m512d mm512_add_pd(__m512d a, __m512d b) { return (__m512d)((D8x)a + (D8x)b); }
POSENC_EMULATED __m512d mm512_sub_pd(__m512d a, __m512d b) { return (__m512d)((D8x)a - (D8x)b); }
POSENC_EMULATED __m512d mm512_mul_pd(__m512d a, __m512d b) { return (__m512d)((D8x)a * (D8x)b); }

// One rounding of a * b + c: fmaf is the correctly rounded fused result.
POSENC_EMULATED __m512 mm512_fmadd_ps(__m512 a, __m512 b, __m512 c) {
  const auto x = Split<float, 16>(a), y = Split<float, 16>(b), z = Split<float, 16>(c);
  Lanes<float, 16> r;
  for (int i = 0; i < 16; ++i) r.v[i] = std::fmaf(x.v[i], y.v[i], z.v[i]);
  return Join<__m512>(r);
}

POSENC_EMULATED __m512 mm512_abs_ps(__m512 a) {
  return (__m512)((I16x)a & static_cast<int32_t>(0x7fffffff));
}
POSENC_EMULATED __m512d mm512_abs_pd(__m512d a) {
  typedef int64_t Q8x __attribute__((vector_size(64)));
  return (__m512d)((Q8x)a & int64_t{0x7fffffffffffffff});
}

// Conversions round to nearest even, as MXCSR's default does (and C++'s).
POSENC_EMULATED __m512d mm512_cvtps_pd(__m256 a) {
  const auto x = Split<float, 8>(a);
  Lanes<double, 8> r;
  for (int i = 0; i < 8; ++i) r.v[i] = static_cast<double>(x.v[i]);
  return Join<__m512d>(r);
}
POSENC_EMULATED __m256 mm512_cvtpd_ps(__m512d a) {
  const auto x = Split<double, 8>(a);
  Lanes<float, 8> r;
  for (int i = 0; i < 8; ++i) r.v[i] = static_cast<float>(x.v[i]);
  return Join<__m256>(r);
}

// VCVTNE2PS2BF16: lanes 0-15 from b, 16-31 from a. Zero and subnormal
// inputs become a zero of their sign; NaN keeps its top bits, quieted;
// infinity is truncated; every other value rounds to nearest even.
POSENC_EMULATED uint16_t ConvertFloatToBFloat16(float f) {
  const uint32_t x = FloatBits(f);
  const uint32_t exponent = x & 0x7f800000u;
  if (exponent == 0) return static_cast<uint16_t>((x >> 16) & 0x8000u);
  if (exponent == 0x7f800000u) {
    return static_cast<uint16_t>((x >> 16) | ((x & 0x007fffffu) != 0 ? 0x0040u : 0u));
  }
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
// A CPU without AVX-512 BF16 (POSENC_NO_AVX512BF16, as cpu_features.cc
// reads it) faults on VCVTNE2PS2BF16; so does this, so that a loop meant
// for such CPUs (bf16_wide.h's Narrowing::kRounding) that reaches it fails
// its tests.
POSENC_EMULATED __m512bh mm512_cvtne2ps_pbh(__m512 a, __m512 b) {
  static const bool cpu_has_bf16 = std::getenv("POSENC_NO_AVX512BF16") == nullptr;
  if (!cpu_has_bf16) __builtin_trap();
  const auto hi = Split<float, 16>(a), lo = Split<float, 16>(b);
  Lanes<uint16_t, 32> r;
  for (int i = 0; i < 16; ++i) {
    r.v[i] = ConvertFloatToBFloat16(lo.v[i]);
    r.v[16 + i] = ConvertFloatToBFloat16(hi.v[i]);
  }
  return Join<__m512bh>(r);
}

// --- Comparisons and classes ------------------------------------------------

// VCMPPS's 32 predicates: the low four bits choose the relation (bit 4 only
// whether a quiet NaN signals, which changes no result).
POSENC_EMULATED bool Compare(float a, float b, int predicate) {
  const bool unordered = std::isnan(a) || std::isnan(b);
  switch (predicate & 15) {
    case 0:
      return !unordered && a == b;  // EQ_OQ
    case 1:
      return !unordered && a < b;  // LT_OS
    case 2:
      return !unordered && a <= b;  // LE_OS
    case 3:
      return unordered;  // UNORD_Q
    case 4:
      return unordered || a != b;  // NEQ_UQ
    case 5:
      return unordered || !(a < b);  // NLT_US
    case 6:
      return unordered || !(a <= b);  // NLE_US
    case 7:
      return !unordered;  // ORD_Q
    case 8:
      return unordered || a == b;  // EQ_UQ
    case 9:
      return unordered || !(a >= b);  // NGE_US
    case 10:
      return unordered || !(a > b);  // NGT_US
    case 11:
      return false;  // FALSE_OQ
    case 12:
      return !unordered && a != b;  // NEQ_OQ
    case 13:
      return !unordered && a >= b;  // GE_OS
    case 14:
      return !unordered && a > b;  // GT_OS
    default:
      return true;  // TRUE_UQ
  }
}
POSENC_EMULATED __mmask16 mm512_cmp_ps_mask(__m512 a, __m512 b, int predicate) {
  const auto x = Split<float, 16>(a), y = Split<float, 16>(b);
  __mmask16 k = 0;
  for (int i = 0; i < 16; ++i) {
    if (Compare(x.v[i], y.v[i], predicate)) k |= static_cast<__mmask16>(1u << i);
  }
  return k;
}

// VFPCLASSPS: imm bit 0 quiet NaN, 1 +0, 2 -0, 3 +inf, 4 -inf, 5 subnormal
// (either sign), 6 negative finite (nonzero, subnormal included), 7
// signalling NaN.
POSENC_EMULATED __mmask16 mm512_fpclass_ps_mask(__m512 a, int imm) {
  const auto x = Split<float, 16>(a);
  __mmask16 k = 0;
  for (int i = 0; i < 16; ++i) {
    const uint32_t u = FloatBits(x.v[i]);
    const uint32_t exponent = u & 0x7f800000u, mantissa = u & 0x007fffffu;
    const bool negative = (u >> 31) != 0;
    const bool nan = exponent == 0x7f800000u && mantissa != 0;
    const bool inf = exponent == 0x7f800000u && mantissa == 0;
    const bool zero = exponent == 0 && mantissa == 0;
    const bool subnormal = exponent == 0 && mantissa != 0;
    const bool quiet = (mantissa & 0x00400000u) != 0;
    const bool in = ((imm & 0x01) && nan && quiet) || ((imm & 0x02) && zero && !negative) ||
                    ((imm & 0x04) && zero && negative) || ((imm & 0x08) && inf && !negative) ||
                    ((imm & 0x10) && inf && negative) || ((imm & 0x20) && subnormal) ||
                    ((imm & 0x40) && negative && !zero && !inf && !nan) ||
                    ((imm & 0x80) && nan && !quiet);
    if (in) k |= static_cast<__mmask16>(1u << i);
  }
  return k;
}

// VRANGEPS, after the SDM's RangeSP: imm bits 1:0 choose min, max, min of
// magnitudes or max of magnitudes; bits 3:2 the result's sign (00 a's, 01
// the chosen value's, 10 cleared, 11 set). A signalling NaN (a's first)
// gives itself quieted, no sign control. A quiet NaN gives way to the
// other operand (b's NaN to a, then a's to b, so two give a), and the sign
// control applies to what is chosen: the bfloat16 sinusoidal and RoPE loops
// rely on that. Of values of equal magnitude, min and min-of-magnitudes
// pick the negative one, max and max-of-magnitudes the positive one (the
// SDM's table for opposite-signed zeros as we read it; sources differ on
// such ties, so avx512_emulation_test leaves them out where the chosen
// value's sign would show them, and no kernel asks for that sign).
POSENC_EMULATED float RangeOne(float a, float b, int imm) {
  const uint32_t ua = FloatBits(a), ub = FloatBits(b);
  const auto signalling = [](uint32_t u) {
    return (u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0 && (u & 0x00400000u) == 0;
  };
  if (signalling(ua)) return BitsFloat(ua | 0x00400000u);
  if (signalling(ub)) return BitsFloat(ub | 0x00400000u);
  float r;
  if (std::isnan(b)) {
    r = a;
  } else if (std::isnan(a)) {
    r = b;
  } else {
    const bool a_negative = (ua >> 31) != 0;
    const float ma = std::fabs(a), mb = std::fabs(b);
    switch (imm & 3) {
      case 0:
        r = a < b || (a == b && a_negative) ? a : b;
        break;
      case 1:
        r = a > b || (a == b && !a_negative) ? a : b;
        break;
      case 2:
        r = ma < mb || (ma == mb && a_negative) ? a : b;
        break;
      default:
        r = ma > mb || (ma == mb && !a_negative) ? a : b;
        break;
    }
  }
  const uint32_t magnitude = FloatBits(r) & 0x7fffffffu;
  switch ((imm >> 2) & 3) {
    case 0:
      return BitsFloat(magnitude | (ua & 0x80000000u));
    case 1:
      return r;
    case 2:
      return BitsFloat(magnitude);
    default:
      return BitsFloat(magnitude | 0x80000000u);
  }
}
POSENC_EMULATED __m512 mm512_range_ps(__m512 a, __m512 b, int imm) {
  const auto x = Split<float, 16>(a), y = Split<float, 16>(b);
  Lanes<float, 16> r;
  for (int i = 0; i < 16; ++i) r.v[i] = RangeOne(x.v[i], y.v[i], imm);
  return Join<__m512>(r);
}

POSENC_EMULATED __mmask32 mm512_cmpgt_epu16_mask(__m512i a, __m512i b) {
  const auto x = Split<uint16_t, 32>(a), y = Split<uint16_t, 32>(b);
  __mmask32 k = 0;
  for (int i = 0; i < 32; ++i) k |= static_cast<__mmask32>(x.v[i] > y.v[i]) << i;
  return k;
}
POSENC_EMULATED __mmask32 mm512_cmpeq_epi16_mask(__m512i a, __m512i b) {
  const auto x = Split<uint16_t, 32>(a), y = Split<uint16_t, 32>(b);
  __mmask32 k = 0;
  for (int i = 0; i < 32; ++i) k |= static_cast<__mmask32>(x.v[i] == y.v[i]) << i;
  return k;
}

// --- Masks --------------------------------------------------------------------

POSENC_EMULATED __mmask16 kand_mask16(__mmask16 a, __mmask16 b) {
  return static_cast<__mmask16>(a & b);
}
POSENC_EMULATED __mmask16 kor_mask16(__mmask16 a, __mmask16 b) {
  return static_cast<__mmask16>(a | b);
}
// KORTESTW's carry (every bit of a | b set) and zero (none set) flags.
POSENC_EMULATED unsigned char kortestc_mask16_u8(__mmask16 a, __mmask16 b) {
  return static_cast<__mmask16>(a | b) == 0xffff;
}
POSENC_EMULATED unsigned char kortestz_mask16_u8(__mmask16 a, __mmask16 b) {
  return static_cast<__mmask16>(a | b) == 0;
}

POSENC_EMULATED __m512 mm512_mask_mov_ps(__m512 src, __mmask16 k, __m512 a) {
  auto r = Split<float, 16>(src);
  const auto x = Split<float, 16>(a);
  for (int i = 0; i < 16; ++i) {
    if ((k >> i) & 1) r.v[i] = x.v[i];
  }
  return Join<__m512>(r);
}
POSENC_EMULATED __m512i mm512_mask_blend_epi16(__mmask32 k, __m512i a, __m512i b) {
  auto r = Split<uint16_t, 32>(a);
  const auto y = Split<uint16_t, 32>(b);
  for (int i = 0; i < 32; ++i) {
    if ((k >> i) & 1) r.v[i] = y.v[i];
  }
  return Join<__m512i>(r);
}

// --- Loads and stores -----------------------------------------------------------
// Masked ones read or write the selected elements alone, as the hardware
// does (it faults on no unselected element).

POSENC_EMULATED __m512 mm512_loadu_ps(const void* p) {
  __m512 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
POSENC_EMULATED __m512i mm512_loadu_si512(const void* p) {
  __m512i v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
POSENC_EMULATED void mm512_storeu_ps(void* p, __m512 v) { std::memcpy(p, &v, sizeof v); }
POSENC_EMULATED void mm512_storeu_si512(void* p, __m512i v) { std::memcpy(p, &v, sizeof v); }
// The aligned forms fault on a misaligned address; so does this.
POSENC_EMULATED void mm512_store_ps(void* p, __m512 v) {
  if (reinterpret_cast<uintptr_t>(p) % 64 != 0) __builtin_trap();
  std::memcpy(p, &v, sizeof v);
}
POSENC_EMULATED void mm512_store_si512(void* p, __m512i v) {
  if (reinterpret_cast<uintptr_t>(p) % 64 != 0) __builtin_trap();
  std::memcpy(p, &v, sizeof v);
}

template <typename V, typename T, int N>
POSENC_EMULATED V MaskedLoad(uint64_t k, const void* p) {
  Lanes<T, N> r = {};
  for (int i = 0; i < N; ++i) {
    if ((k >> i) & 1) std::memcpy(&r.v[i], static_cast<const char*>(p) + i * sizeof(T), sizeof(T));
  }
  return Join<V>(r);
}
template <typename T, int N, typename V>
POSENC_EMULATED void MaskedStore(void* p, uint64_t k, V v) {
  const auto x = Split<T, N>(v);
  for (int i = 0; i < N; ++i) {
    if ((k >> i) & 1) std::memcpy(static_cast<char*>(p) + i * sizeof(T), &x.v[i], sizeof(T));
  }
}
// VCOMPRESSPS / VPCOMPRESSD, register form with zeroing: the lanes of `a`
// that k selects, in order, from lane 0; the lanes past them zero.
template <typename V, typename T>
POSENC_EMULATED V MaskzCompress(__mmask16 k, V a) {
  const auto x = Split<T, 16>(a);
  Lanes<T, 16> r{};
  int n = 0;
  for (int i = 0; i < 16; ++i) {
    if ((k >> i) & 1) r.v[n++] = x.v[i];
  }
  return Join<V>(r);
}
POSENC_EMULATED __m512 mm512_maskz_compress_ps(__mmask16 k, __m512 a) {
  return MaskzCompress<__m512, float>(k, a);
}
POSENC_EMULATED __m512i mm512_maskz_compress_epi32(__mmask16 k, __m512i a) {
  return MaskzCompress<__m512i, uint32_t>(k, a);
}
POSENC_EMULATED __m512 mm512_maskz_loadu_ps(__mmask16 k, const void* p) {
  return MaskedLoad<__m512, float, 16>(k, p);
}
POSENC_EMULATED void mm512_mask_storeu_ps(void* p, __mmask16 k, __m512 v) {
  MaskedStore<float, 16>(p, k, v);
}
POSENC_EMULATED __m512i mm512_maskz_loadu_epi16(__mmask32 k, const void* p) {
  return MaskedLoad<__m512i, uint16_t, 32>(k, p);
}
POSENC_EMULATED void mm512_mask_storeu_epi16(void* p, __mmask32 k, __m512i v) {
  MaskedStore<uint16_t, 32>(p, k, v);
}
POSENC_EMULATED __m256i mm256_maskz_loadu_epi16(__mmask16 k, const void* p) {
  return MaskedLoad<__m256i, uint16_t, 16>(k, p);
}
POSENC_EMULATED void mm256_mask_storeu_epi16(void* p, __mmask16 k, __m256i v) {
  MaskedStore<uint16_t, 16>(p, k, v);
}
POSENC_EMULATED __m128i mm_maskz_loadu_epi16(__mmask8 k, const void* p) {
  return MaskedLoad<__m128i, uint16_t, 8>(k, p);
}
POSENC_EMULATED void mm_mask_storeu_epi16(void* p, __mmask8 k, __m128i v) {
  MaskedStore<uint16_t, 8>(p, k, v);
}

// --- Constants --------------------------------------------------------------------

POSENC_EMULATED __m512 mm512_setzero_ps() { return __m512{}; }
POSENC_EMULATED __m512i mm512_setzero_si512() { return __m512i{}; }
// Every lane of a V holding N lanes of T set to x.
template <typename V, typename T, int N>
POSENC_EMULATED V Broadcast(T x) {
  Lanes<T, N> r;
  for (T& lane : r.v) lane = x;
  return Join<V>(r);
}
POSENC_EMULATED __m512 mm512_set1_ps(float f) { return Broadcast<__m512, float, 16>(f); }
POSENC_EMULATED __m512d mm512_set1_pd(double d) { return Broadcast<__m512d, double, 8>(d); }
POSENC_EMULATED __m512i mm512_set1_epi32(int32_t a) { return Broadcast<__m512i, int32_t, 16>(a); }
POSENC_EMULATED __m512i mm512_set1_epi16(int16_t a) { return Broadcast<__m512i, int16_t, 32>(a); }
// setr: lane 0 first; set: lane 0 last.
POSENC_EMULATED __m512 mm512_setr_ps(float e0, float e1, float e2, float e3, float e4, float e5,
                                     float e6, float e7, float e8, float e9, float e10, float e11,
                                     float e12, float e13, float e14, float e15) {
  const Lanes<float, 16> r = {
      {e0, e1, e2, e3, e4, e5, e6, e7, e8, e9, e10, e11, e12, e13, e14, e15}};
  return Join<__m512>(r);
}
POSENC_EMULATED __m512d mm512_setr_pd(double e0, double e1, double e2, double e3, double e4,
                                      double e5, double e6, double e7) {
  const Lanes<double, 8> r = {{e0, e1, e2, e3, e4, e5, e6, e7}};
  return Join<__m512d>(r);
}
POSENC_EMULATED __m512i mm512_setr_epi32(int e0, int e1, int e2, int e3, int e4, int e5, int e6,
                                         int e7, int e8, int e9, int e10, int e11, int e12, int e13,
                                         int e14, int e15) {
  const Lanes<int32_t, 16> r = {
      {e0, e1, e2, e3, e4, e5, e6, e7, e8, e9, e10, e11, e12, e13, e14, e15}};
  return Join<__m512i>(r);
}
POSENC_EMULATED __m512i mm512_set_epi16(short e31, short e30, short e29, short e28, short e27,
                                        short e26, short e25, short e24, short e23, short e22,
                                        short e21, short e20, short e19, short e18, short e17,
                                        short e16, short e15, short e14, short e13, short e12,
                                        short e11, short e10, short e9, short e8, short e7,
                                        short e6, short e5, short e4, short e3, short e2, short e1,
                                        short e0) {
  const Lanes<int16_t, 32> r = {{e0,  e1,  e2,  e3,  e4,  e5,  e6,  e7,  e8,  e9,  e10,
                                 e11, e12, e13, e14, e15, e16, e17, e18, e19, e20, e21,
                                 e22, e23, e24, e25, e26, e27, e28, e29, e30, e31}};
  return Join<__m512i>(r);
}

// --- Integer operations and permutes --------------------------------------------

POSENC_EMULATED __m512i mm512_and_si512(__m512i a, __m512i b) { return a & b; }
// Lane arithmetic wraps around; VPAVGW is (a + b + 1) >> 1 in 17 bits.
template <typename T, int N, typename Op>
POSENC_EMULATED __m512i LaneByLane(__m512i a, __m512i b, Op op) {
  auto x = Split<T, N>(a);
  const auto y = Split<T, N>(b);
  for (int i = 0; i < N; ++i) x.v[i] = static_cast<T>(op(x.v[i], y.v[i]));
  return Join<__m512i>(x);
}
POSENC_EMULATED __m512i mm512_add_epi32(__m512i a, __m512i b) {
  return LaneByLane<uint32_t, 16>(a, b, [](uint32_t x, uint32_t y) { return x + y; });
}
POSENC_EMULATED __m512i mm512_add_epi16(__m512i a, __m512i b) {
  return LaneByLane<uint16_t, 32>(a, b, [](uint32_t x, uint32_t y) { return x + y; });
}
POSENC_EMULATED __m512i mm512_sub_epi16(__m512i a, __m512i b) {
  return LaneByLane<uint16_t, 32>(a, b, [](uint32_t x, uint32_t y) { return x - y; });
}
POSENC_EMULATED __m512i mm512_avg_epu16(__m512i a, __m512i b) {
  return LaneByLane<uint16_t, 32>(a, b, [](uint32_t x, uint32_t y) { return (x + y + 1) >> 1; });
}
// Unsigned 16-bit maximum, minimum and difference saturated at zero.
POSENC_EMULATED __m512i mm512_max_epu16(__m512i a, __m512i b) {
  return LaneByLane<uint16_t, 32>(a, b, [](uint32_t x, uint32_t y) { return x > y ? x : y; });
}
POSENC_EMULATED __m512i mm512_min_epu16(__m512i a, __m512i b) {
  return LaneByLane<uint16_t, 32>(a, b, [](uint32_t x, uint32_t y) { return x < y ? x : y; });
}
POSENC_EMULATED __m512i mm512_subs_epu16(__m512i a, __m512i b) {
  return LaneByLane<uint16_t, 32>(a, b, [](uint32_t x, uint32_t y) { return x > y ? x - y : 0u; });
}
// The maximum in the lanes of k, src's lanes elsewhere.
POSENC_EMULATED __m512i mm512_mask_max_epu16(__m512i src, __mmask32 k, __m512i a, __m512i b) {
  auto r = Split<uint16_t, 32>(src);
  const auto x = Split<uint16_t, 32>(a), y = Split<uint16_t, 32>(b);
  for (int i = 0; i < 32; ++i) {
    if ((k >> i) & 1) r.v[i] = x.v[i] > y.v[i] ? x.v[i] : y.v[i];
  }
  return Join<__m512i>(r);
}
// Shifts by more than the lane's bits: zero (logical), the sign (arithmetic).
POSENC_EMULATED __m512i mm512_srli_epi32(__m512i a, unsigned int count) {
  auto x = Split<uint32_t, 16>(a);
  for (uint32_t& v : x.v) v = count > 31 ? 0u : v >> count;
  return Join<__m512i>(x);
}
POSENC_EMULATED __m512i mm512_srai_epi16(__m512i a, unsigned int count) {
  auto x = Split<int16_t, 32>(a);
  for (int16_t& v : x.v) v = static_cast<int16_t>(v >> (count > 15 ? 15 : count));
  return Join<__m512i>(x);
}
POSENC_EMULATED __m512i mm512_slli_epi32(__m512i a, unsigned int count) {
  auto x = Split<uint32_t, 16>(a);
  for (uint32_t& v : x.v) v = count > 31 ? 0u : v << count;
  return Join<__m512i>(x);
}
POSENC_EMULATED __m512i mm512_cvtepu16_epi32(__m256i a) {
  const auto x = Split<uint16_t, 16>(a);
  Lanes<uint32_t, 16> r;
  for (int i = 0; i < 16; ++i) r.v[i] = x.v[i];
  return Join<__m512i>(r);
}
// Within each 128-bit lane, element j takes element (imm >> 2j) & 3.
POSENC_EMULATED __m512 mm512_permute_ps(__m512 a, int imm) {
  const auto x = Split<float, 16>(a);
  Lanes<float, 16> r;
  for (int i = 0; i < 16; ++i) r.v[i] = x.v[(i & ~3) + ((imm >> (2 * (i & 3))) & 3)];
  return Join<__m512>(r);
}
// Element i: (idx_i & 15) of a, or of b where bit 4 of idx_i is set.
POSENC_EMULATED __m512 mm512_permutex2var_ps(__m512 a, __m512i idx, __m512 b) {
  const auto x = Split<float, 16>(a), y = Split<float, 16>(b);
  const auto ix = Split<uint32_t, 16>(idx);
  Lanes<float, 16> r;
  for (int i = 0; i < 16; ++i) r.v[i] = (ix.v[i] & 16) ? y.v[ix.v[i] & 15] : x.v[ix.v[i] & 15];
  return Join<__m512>(r);
}
// Element i: (idx_i & 31) of a, or of b where bit 5 of idx_i is set.
POSENC_EMULATED __m512i mm512_permutex2var_epi16(__m512i a, __m512i idx, __m512i b) {
  const auto x = Split<uint16_t, 32>(a), y = Split<uint16_t, 32>(b);
  const auto ix = Split<uint16_t, 32>(idx);
  Lanes<uint16_t, 32> r;
  for (int i = 0; i < 32; ++i) r.v[i] = (ix.v[i] & 32) ? y.v[ix.v[i] & 31] : x.v[ix.v[i] & 31];
  return Join<__m512i>(r);
}
POSENC_EMULATED __m512i mm512_permutexvar_epi16(__m512i idx, __m512i a) {
  const auto x = Split<uint16_t, 32>(a), ix = Split<uint16_t, 32>(idx);
  Lanes<uint16_t, 32> r;
  for (int i = 0; i < 32; ++i) r.v[i] = x.v[ix.v[i] & 31];
  return Join<__m512i>(r);
}

// --- Casts, extracts and inserts ----------------------------------------------------
// Casts keep the bits; widening ones zero the new upper part (the hardware
// leaves it undefined for the cast forms, so a loop that read it is wrong on
// either).

template <typename To, typename From>
POSENC_EMULATED To Part(From v, int index) {
  To r;
  std::memcpy(&r, reinterpret_cast<const char*>(&v) + index * sizeof(To), sizeof r);
  return r;
}
template <typename To, typename From>
POSENC_EMULATED To Widen(From v) {
  To r = {};
  std::memcpy(&r, &v, sizeof v);
  return r;
}

POSENC_EMULATED __m512 mm512_castsi512_ps(__m512i a) { return (__m512)a; }
POSENC_EMULATED __m512i mm512_castps_si512(__m512 a) { return (__m512i)a; }
POSENC_EMULATED __m512d mm512_castps_pd(__m512 a) { return (__m512d)a; }
POSENC_EMULATED __m512 mm512_castpd_ps(__m512d a) { return (__m512)a; }
POSENC_EMULATED __m256 mm512_castps512_ps256(__m512 a) { return Part<__m256>(a, 0); }
POSENC_EMULATED __m256i mm512_castsi512_si256(__m512i a) { return Part<__m256i>(a, 0); }
POSENC_EMULATED __m128i mm512_castsi512_si128(__m512i a) { return Part<__m128i>(a, 0); }
POSENC_EMULATED __m512d mm512_castpd256_pd512(__m256d a) { return Widen<__m512d>(a); }
POSENC_EMULATED __m512i mm512_zextsi256_si512(__m256i a) { return Widen<__m512i>(a); }
POSENC_EMULATED __m256d mm512_extractf64x4_pd(__m512d a, int imm) {
  return Part<__m256d>(a, imm & 1);
}
POSENC_EMULATED __m256i mm512_extracti64x4_epi64(__m512i a, int imm) {
  return Part<__m256i>(a, imm & 1);
}
POSENC_EMULATED __m128i mm512_extracti32x4_epi32(__m512i a, int imm) {
  return Part<__m128i>(a, imm & 3);
}
POSENC_EMULATED __m512d mm512_insertf64x4(__m512d a, __m256d b, int imm) {
  std::memcpy(reinterpret_cast<char*>(&a) + (imm & 1) * sizeof b, &b, sizeof b);
  return a;
}

#undef POSENC_EMULATED

}  // namespace posenc::avx512_emulation

// Every call in the kernels goes to the emulation. Some of these names are
// macros in <immintrin.h> (its immediate-operand forms when not optimising).
#define POSENC_AVX512_EMULATE(name) ::posenc::avx512_emulation::name
#undef _mm512_add_ps
#define _mm512_add_ps POSENC_AVX512_EMULATE(mm512_add_ps)
#undef _mm512_sub_ps
#define _mm512_sub_ps POSENC_AVX512_EMULATE(mm512_sub_ps)
#undef _mm512_mul_ps
#define _mm512_mul_ps POSENC_AVX512_EMULATE(mm512_mul_ps)
#undef _mm512_add_pd
#define _mm512_add_pd POSENC_AVX512_EMULATE(mm512_add_pd)
#undef _mm512_sub_pd
#define _mm512_sub_pd POSENC_AVX512_EMULATE(mm512_sub_pd)
#undef _mm512_mul_pd
#define _mm512_mul_pd POSENC_AVX512_EMULATE(mm512_mul_pd)
#undef _mm512_fmadd_ps
#define _mm512_fmadd_ps POSENC_AVX512_EMULATE(mm512_fmadd_ps)
#undef _mm512_abs_ps
#define _mm512_abs_ps POSENC_AVX512_EMULATE(mm512_abs_ps)
#undef _mm512_abs_pd
#define _mm512_abs_pd POSENC_AVX512_EMULATE(mm512_abs_pd)
#undef _mm512_cvtps_pd
#define _mm512_cvtps_pd POSENC_AVX512_EMULATE(mm512_cvtps_pd)
#undef _mm512_cvtpd_ps
#define _mm512_cvtpd_ps POSENC_AVX512_EMULATE(mm512_cvtpd_ps)
#undef _mm512_cvtne2ps_pbh
#define _mm512_cvtne2ps_pbh POSENC_AVX512_EMULATE(mm512_cvtne2ps_pbh)
#undef _mm512_cmp_ps_mask
#define _mm512_cmp_ps_mask POSENC_AVX512_EMULATE(mm512_cmp_ps_mask)
#undef _mm512_fpclass_ps_mask
#define _mm512_fpclass_ps_mask POSENC_AVX512_EMULATE(mm512_fpclass_ps_mask)
#undef _mm512_range_ps
#define _mm512_range_ps POSENC_AVX512_EMULATE(mm512_range_ps)
#undef _mm512_cmpgt_epu16_mask
#define _mm512_cmpgt_epu16_mask POSENC_AVX512_EMULATE(mm512_cmpgt_epu16_mask)
#undef _mm512_cmpeq_epi16_mask
#define _mm512_cmpeq_epi16_mask POSENC_AVX512_EMULATE(mm512_cmpeq_epi16_mask)
#undef _kand_mask16
#define _kand_mask16 POSENC_AVX512_EMULATE(kand_mask16)
#undef _kor_mask16
#define _kor_mask16 POSENC_AVX512_EMULATE(kor_mask16)
#undef _kortestc_mask16_u8
#define _kortestc_mask16_u8 POSENC_AVX512_EMULATE(kortestc_mask16_u8)
#undef _kortestz_mask16_u8
#define _kortestz_mask16_u8 POSENC_AVX512_EMULATE(kortestz_mask16_u8)
#undef _mm512_maskz_compress_ps
#define _mm512_maskz_compress_ps POSENC_AVX512_EMULATE(mm512_maskz_compress_ps)
#undef _mm512_maskz_compress_epi32
#define _mm512_maskz_compress_epi32 POSENC_AVX512_EMULATE(mm512_maskz_compress_epi32)
#undef _mm512_mask_mov_ps
#define _mm512_mask_mov_ps POSENC_AVX512_EMULATE(mm512_mask_mov_ps)
#undef _mm512_mask_blend_epi16
#define _mm512_mask_blend_epi16 POSENC_AVX512_EMULATE(mm512_mask_blend_epi16)
#undef _mm512_loadu_ps
#define _mm512_loadu_ps POSENC_AVX512_EMULATE(mm512_loadu_ps)
#undef _mm512_loadu_si512
#define _mm512_loadu_si512 POSENC_AVX512_EMULATE(mm512_loadu_si512)
#undef _mm512_storeu_ps
#define _mm512_storeu_ps POSENC_AVX512_EMULATE(mm512_storeu_ps)
#undef _mm512_storeu_si512
#define _mm512_storeu_si512 POSENC_AVX512_EMULATE(mm512_storeu_si512)
#undef _mm512_store_ps
#define _mm512_store_ps POSENC_AVX512_EMULATE(mm512_store_ps)
#undef _mm512_store_si512
#define _mm512_store_si512 POSENC_AVX512_EMULATE(mm512_store_si512)
#undef _mm512_maskz_loadu_ps
#define _mm512_maskz_loadu_ps POSENC_AVX512_EMULATE(mm512_maskz_loadu_ps)
#undef _mm512_mask_storeu_ps
#define _mm512_mask_storeu_ps POSENC_AVX512_EMULATE(mm512_mask_storeu_ps)
#undef _mm512_maskz_loadu_epi16
#define _mm512_maskz_loadu_epi16 POSENC_AVX512_EMULATE(mm512_maskz_loadu_epi16)
#undef _mm512_mask_storeu_epi16
#define _mm512_mask_storeu_epi16 POSENC_AVX512_EMULATE(mm512_mask_storeu_epi16)
#undef _mm256_maskz_loadu_epi16
#define _mm256_maskz_loadu_epi16 POSENC_AVX512_EMULATE(mm256_maskz_loadu_epi16)
#undef _mm256_mask_storeu_epi16
#define _mm256_mask_storeu_epi16 POSENC_AVX512_EMULATE(mm256_mask_storeu_epi16)
#undef _mm_maskz_loadu_epi16
#define _mm_maskz_loadu_epi16 POSENC_AVX512_EMULATE(mm_maskz_loadu_epi16)
#undef _mm_mask_storeu_epi16
#define _mm_mask_storeu_epi16 POSENC_AVX512_EMULATE(mm_mask_storeu_epi16)
#undef _mm512_setzero_ps
#define _mm512_setzero_ps POSENC_AVX512_EMULATE(mm512_setzero_ps)
#undef _mm512_setzero_si512
#define _mm512_setzero_si512 POSENC_AVX512_EMULATE(mm512_setzero_si512)
#undef _mm512_set1_ps
#define _mm512_set1_ps POSENC_AVX512_EMULATE(mm512_set1_ps)
#undef _mm512_set1_pd
#define _mm512_set1_pd POSENC_AVX512_EMULATE(mm512_set1_pd)
#undef _mm512_set1_epi32
#define _mm512_set1_epi32 POSENC_AVX512_EMULATE(mm512_set1_epi32)
#undef _mm512_set1_epi16
#define _mm512_set1_epi16 POSENC_AVX512_EMULATE(mm512_set1_epi16)
#undef _mm512_setr_ps
#define _mm512_setr_ps POSENC_AVX512_EMULATE(mm512_setr_ps)
#undef _mm512_setr_pd
#define _mm512_setr_pd POSENC_AVX512_EMULATE(mm512_setr_pd)
#undef _mm512_setr_epi32
#define _mm512_setr_epi32 POSENC_AVX512_EMULATE(mm512_setr_epi32)
#undef _mm512_set_epi16
#define _mm512_set_epi16 POSENC_AVX512_EMULATE(mm512_set_epi16)
#undef _mm512_and_si512
#define _mm512_and_si512 POSENC_AVX512_EMULATE(mm512_and_si512)
#undef _mm512_add_epi32
#define _mm512_add_epi32 POSENC_AVX512_EMULATE(mm512_add_epi32)
#undef _mm512_add_epi16
#define _mm512_add_epi16 POSENC_AVX512_EMULATE(mm512_add_epi16)
#undef _mm512_sub_epi16
#define _mm512_sub_epi16 POSENC_AVX512_EMULATE(mm512_sub_epi16)
#undef _mm512_avg_epu16
#define _mm512_avg_epu16 POSENC_AVX512_EMULATE(mm512_avg_epu16)
#undef _mm512_max_epu16
#define _mm512_max_epu16 POSENC_AVX512_EMULATE(mm512_max_epu16)
#undef _mm512_min_epu16
#define _mm512_min_epu16 POSENC_AVX512_EMULATE(mm512_min_epu16)
#undef _mm512_subs_epu16
#define _mm512_subs_epu16 POSENC_AVX512_EMULATE(mm512_subs_epu16)
#undef _mm512_mask_max_epu16
#define _mm512_mask_max_epu16 POSENC_AVX512_EMULATE(mm512_mask_max_epu16)
#undef _mm512_srli_epi32
#define _mm512_srli_epi32 POSENC_AVX512_EMULATE(mm512_srli_epi32)
#undef _mm512_srai_epi16
#define _mm512_srai_epi16 POSENC_AVX512_EMULATE(mm512_srai_epi16)
#undef _mm512_permutex2var_epi16
#define _mm512_permutex2var_epi16 POSENC_AVX512_EMULATE(mm512_permutex2var_epi16)
#undef _mm512_castps_si512
#define _mm512_castps_si512 POSENC_AVX512_EMULATE(mm512_castps_si512)
#undef _mm512_slli_epi32
#define _mm512_slli_epi32 POSENC_AVX512_EMULATE(mm512_slli_epi32)
#undef _mm512_cvtepu16_epi32
#define _mm512_cvtepu16_epi32 POSENC_AVX512_EMULATE(mm512_cvtepu16_epi32)
#undef _mm512_permute_ps
#define _mm512_permute_ps POSENC_AVX512_EMULATE(mm512_permute_ps)
#undef _mm512_permutex2var_ps
#define _mm512_permutex2var_ps POSENC_AVX512_EMULATE(mm512_permutex2var_ps)
#undef _mm512_permutexvar_epi16
#define _mm512_permutexvar_epi16 POSENC_AVX512_EMULATE(mm512_permutexvar_epi16)
#undef _mm512_castsi512_ps
#define _mm512_castsi512_ps POSENC_AVX512_EMULATE(mm512_castsi512_ps)
#undef _mm512_castps_pd
#define _mm512_castps_pd POSENC_AVX512_EMULATE(mm512_castps_pd)
#undef _mm512_castpd_ps
#define _mm512_castpd_ps POSENC_AVX512_EMULATE(mm512_castpd_ps)
#undef _mm512_castps512_ps256
#define _mm512_castps512_ps256 POSENC_AVX512_EMULATE(mm512_castps512_ps256)
#undef _mm512_castsi512_si256
#define _mm512_castsi512_si256 POSENC_AVX512_EMULATE(mm512_castsi512_si256)
#undef _mm512_castsi512_si128
#define _mm512_castsi512_si128 POSENC_AVX512_EMULATE(mm512_castsi512_si128)
#undef _mm512_castpd256_pd512
#define _mm512_castpd256_pd512 POSENC_AVX512_EMULATE(mm512_castpd256_pd512)
#undef _mm512_zextsi256_si512
#define _mm512_zextsi256_si512 POSENC_AVX512_EMULATE(mm512_zextsi256_si512)
#undef _mm512_extractf64x4_pd
#define _mm512_extractf64x4_pd POSENC_AVX512_EMULATE(mm512_extractf64x4_pd)
#undef _mm512_extracti64x4_epi64
#define _mm512_extracti64x4_epi64 POSENC_AVX512_EMULATE(mm512_extracti64x4_epi64)
#undef _mm512_extracti32x4_epi32
#define _mm512_extracti32x4_epi32 POSENC_AVX512_EMULATE(mm512_extracti32x4_epi32)
#undef _mm512_insertf64x4
#define _mm512_insertf64x4 POSENC_AVX512_EMULATE(mm512_insertf64x4)

#endif  // POSENC_TESTS_SUPPORT_AVX512_EMULATION_H_
