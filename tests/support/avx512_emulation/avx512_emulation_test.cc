// The AVX-512 emulation (avx512_emulation.h) against the instructions
// themselves, on CPUs with AVX-512 F, BW, VL, DQ and BF16 (skipped
// elsewhere), over random and special inputs; and, on every machine, the
// properties the kernels' 512-bit loops rely on, against the library's own
// scalar conversions.
//
// Each operation's body is written once (kOperations below) and compiled
// twice: first against <immintrin.h>'s intrinsics, for AVX-512 BF16, then,
// after the emulation header has renamed them, against the emulation, for
// AVX2, as the kernels' emulated build compiles them.
#include <immintrin.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>

#include "gtest/gtest.h"
#include "posenc/dtype.h"
#include "test_tensors.h"

namespace posenc::avx512_emulation_test {
namespace {

// One call's operands: three float vectors, indices, two 16-bit vectors, a
// mask.
struct Inputs {
  alignas(64) float a[16], b[16], c[16];
  alignas(64) uint32_t idx[16];
  alignas(64) uint16_t h[32], g[32];
  uint32_t k;
};
// What an operation stores (poisoned beforehand, so an unwritten byte shows).
constexpr int kOutBytes = 128;
using Operation = void (*)(const Inputs&, uint8_t*);

// Each operation stores its result(s) at out. Written with macros so that
// the intrinsics' names resolve where the list is expanded.
#define LA _mm512_loadu_ps(in.a)
#define LB _mm512_loadu_ps(in.b)
#define LC _mm512_loadu_ps(in.c)
#define LI _mm512_loadu_si512(in.idx)
#define LH _mm512_loadu_si512(in.h)
#define LG _mm512_loadu_si512(in.g)
#define DA _mm512_castps_pd(LA)
#define DB _mm512_castps_pd(LB)
#define K16 static_cast<__mmask16>(in.k)
#define K16B static_cast<__mmask16>(in.k >> 16)
#define K8 static_cast<__mmask8>(in.k)
#define H256 _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in.h))
#define STORE_PS(v) _mm512_storeu_ps(out, v)
#define STORE_PD(v) _mm512_storeu_ps(out, _mm512_castpd_ps(v))
#define STORE_SI(v) _mm512_storeu_si512(out, v)
#define STORE_MASK(m)                                 \
  do {                                                \
    const auto mask_value = (m);                      \
    std::memcpy(out, &mask_value, sizeof mask_value); \
  } while (0)

// name, whether a NaN result may carry another NaN's payload (operations
// with two or three NaN operands: the hardware returns the first, and which
// operand is first is the compiler's choice of encoding), body.
#define POSENC_OPERATIONS(X)                                                                       \
  X(add_ps, true, { STORE_PS(_mm512_add_ps(LA, LB)); })                                            \
  X(sub_ps, true, { STORE_PS(_mm512_sub_ps(LA, LB)); })                                            \
  X(mul_ps, true, { STORE_PS(_mm512_mul_ps(LA, LB)); })                                            \
  X(fmadd_ps, true, { STORE_PS(_mm512_fmadd_ps(LA, LB, LC)); })                                    \
  X(add_pd, true, { STORE_PD(_mm512_add_pd(DA, DB)); })                                            \
  X(sub_pd, true, { STORE_PD(_mm512_sub_pd(DA, DB)); })                                            \
  X(mul_pd, true, { STORE_PD(_mm512_mul_pd(DA, DB)); })                                            \
  X(abs_ps, false, { STORE_PS(_mm512_abs_ps(LA)); })                                               \
  X(abs_pd, false, { STORE_PD(_mm512_abs_pd(DA)); })                                               \
  X(cvtps_pd, false, { STORE_PD(_mm512_cvtps_pd(_mm512_castps512_ps256(LA))); })                   \
  X(cvtpd_ps, false, { _mm256_storeu_ps(reinterpret_cast<float*>(out), _mm512_cvtpd_ps(DA)); })    \
  X(cvtne2ps_pbh, false, { STORE_SI((__m512i)_mm512_cvtne2ps_pbh(LA, LB)); })                      \
  X(cmpgt_epu16_mask, false, { STORE_MASK(_mm512_cmpgt_epu16_mask(LH, LG)); })                     \
  X(cmpeq_epi16_mask, false, { STORE_MASK(_mm512_cmpeq_epi16_mask(LH, LG)); })                     \
  X(mask_ops, false, {                                                                             \
    out[0] = _kortestc_mask16_u8(K16, K16B);                                                       \
    out[1] = _kortestz_mask16_u8(K16, K16B);                                                       \
    const __mmask16 both[2] = {_kand_mask16(K16, K16B), _kor_mask16(K16, K16B)};                   \
    std::memcpy(out + 2, both, sizeof both);                                                       \
  })                                                                                               \
  X(mask_mov_ps, false, { STORE_PS(_mm512_mask_mov_ps(LA, K16, LB)); })                            \
  X(mask_blend_epi16, false, { STORE_SI(_mm512_mask_blend_epi16(in.k, LH, LG)); })                 \
  X(maskz_loadu_ps, false, { STORE_PS(_mm512_maskz_loadu_ps(K16, in.a)); })                        \
  X(maskz_compress_ps, false, { STORE_PS(_mm512_maskz_compress_ps(K16, LA)); })                    \
  X(maskz_compress_epi32, false, { STORE_SI(_mm512_maskz_compress_epi32(K16, LH)); })              \
  X(mask_storeu_ps, false, {                                                                       \
    std::memcpy(out, in.c, 64);                                                                    \
    _mm512_mask_storeu_ps(out, K16, LA);                                                           \
  })                                                                                               \
  X(maskz_loadu_epi16, false, { STORE_SI(_mm512_maskz_loadu_epi16(in.k, in.h)); })                 \
  X(mask_storeu_epi16, false, {                                                                    \
    std::memcpy(out, in.g, 64);                                                                    \
    _mm512_mask_storeu_epi16(out, in.k, LH);                                                       \
  })                                                                                               \
  X(mm256_masked_epi16, false, {                                                                   \
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_maskz_loadu_epi16(K16, in.h));     \
    std::memcpy(out + 32, in.g, 32);                                                               \
    _mm256_mask_storeu_epi16(out + 32, K16B, H256);                                                \
  })                                                                                               \
  X(mm_masked_epi16, false, {                                                                      \
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm_maskz_loadu_epi16(K8, in.h));            \
    std::memcpy(out + 16, in.g, 16);                                                               \
    _mm_mask_storeu_epi16(out + 16, static_cast<__mmask8>(in.k >> 8),                              \
                          _mm256_castsi256_si128(H256));                                           \
  })                                                                                               \
  X(set1, false, {                                                                                 \
    STORE_PS(_mm512_set1_ps(in.a[0]));                                                             \
    _mm512_storeu_si512(out + 64, _mm512_set1_epi32(static_cast<int32_t>(in.idx[0])));             \
  })                                                                                               \
  X(set1_narrow_wide, false, {                                                                     \
    STORE_SI(_mm512_set1_epi16(static_cast<int16_t>(in.h[0])));                                    \
    _mm512_storeu_ps(out + 64, _mm512_castpd_ps(_mm512_set1_pd(in.a[1])));                         \
  })                                                                                               \
  X(setzero, false, {                                                                              \
    STORE_PS(_mm512_setzero_ps());                                                                 \
    _mm512_storeu_si512(out + 64, _mm512_setzero_si512());                                         \
  })                                                                                               \
  X(setr_ps_epi32, false, {                                                                        \
    const float* a = in.a;                                                                         \
    const int* i = reinterpret_cast<const int*>(in.idx);                                           \
    STORE_PS(_mm512_setr_ps(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10],     \
                            a[11], a[12], a[13], a[14], a[15]));                                   \
    _mm512_storeu_si512(                                                                           \
        out + 64, _mm512_setr_epi32(i[0], i[1], i[2], i[3], i[4], i[5], i[6], i[7], i[8], i[9],    \
                                    i[10], i[11], i[12], i[13], i[14], i[15]));                    \
  })                                                                                               \
  X(setr_pd_set_epi16, false, {                                                                    \
    const float* a = in.a;                                                                         \
    const short* h = reinterpret_cast<const short*>(in.h);                                         \
    STORE_PD(_mm512_setr_pd(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]));                      \
    _mm512_storeu_si512(                                                                           \
        out + 64,                                                                                  \
        _mm512_set_epi16(h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7], h[8], h[9], h[10], h[11], \
                         h[12], h[13], h[14], h[15], h[16], h[17], h[18], h[19], h[20], h[21],     \
                         h[22], h[23], h[24], h[25], h[26], h[27], h[28], h[29], h[30], h[31]));   \
  })                                                                                               \
  X(and_si512, false, { STORE_SI(_mm512_and_si512(LH, LG)); })                                     \
  X(add_sub_epi16, false, {                                                                        \
    STORE_SI(_mm512_add_epi16(LH, LG));                                                            \
    _mm512_storeu_si512(out + 64, _mm512_sub_epi16(LH, LG));                                       \
  })                                                                                               \
  X(avg_epu16_add_epi32, false, {                                                                  \
    STORE_SI(_mm512_avg_epu16(LH, LG));                                                            \
    _mm512_storeu_si512(out + 64, _mm512_add_epi32(LH, LG));                                       \
  })                                                                                               \
  X(max_min_epu16, false, {                                                                        \
    STORE_SI(_mm512_max_epu16(LH, LG));                                                            \
    _mm512_storeu_si512(out + 64, _mm512_min_epu16(LH, LG));                                       \
  })                                                                                               \
  X(subs_mask_max_epu16, false, {                                                                  \
    STORE_SI(_mm512_subs_epu16(LH, LG));                                                           \
    _mm512_storeu_si512(out + 64, _mm512_mask_max_epu16(LI, in.k, LH, LG));                        \
  })                                                                                               \
  X(permutex2var_epi16, false, { STORE_SI(_mm512_permutex2var_epi16(LH, LI, LG)); })               \
  X(castps_si512, false, { STORE_SI(_mm512_castps_si512(LA)); })                                   \
  X(cvtepu16_epi32, false, { STORE_SI(_mm512_cvtepu16_epi32(H256)); })                             \
  X(permutex2var_ps, false, { STORE_PS(_mm512_permutex2var_ps(LA, LI, LB)); })                     \
  X(permutexvar_epi16, false, { STORE_SI(_mm512_permutexvar_epi16(LG, LH)); })                     \
  X(casts, false, {                                                                                \
    STORE_PS(_mm512_castsi512_ps(LH));                                                             \
    _mm256_storeu_ps(reinterpret_cast<float*>(out + 64), _mm512_castps512_ps256(LA));              \
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 96), _mm512_castsi512_si256(LG));         \
  })                                                                                               \
  X(narrow_casts, false, {                                                                         \
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_castsi512_si128(LH));                 \
    STORE_PS(_mm512_castpd_ps(_mm512_castps_pd(LB)));                                              \
  })                                                                                               \
  X(widening, false, {                                                                             \
    STORE_SI(_mm512_zextsi256_si512(H256));                                                        \
    /* the cast's upper half is undefined: only the lower one is compared */                       \
    _mm256_storeu_pd(                                                                              \
        reinterpret_cast<double*>(out + 64),                                                       \
        _mm512_extractf64x4_pd(                                                                    \
            _mm512_castpd256_pd512(_mm256_loadu_pd(reinterpret_cast<const double*>(in.b))), 0));   \
  })

// The operations with an immediate operand, for each immediate value.
#define POSENC_IMMEDIATE_OPERATIONS(TARGET)                                                        \
  template <int kImm>                                                                              \
  TARGET void cmp_ps_mask(const Inputs& in, uint8_t* out) {                                        \
    STORE_MASK(_mm512_cmp_ps_mask(LA, LB, kImm));                                                  \
  }                                                                                                \
  template <int kImm>                                                                              \
  TARGET void fpclass_ps_mask(const Inputs& in, uint8_t* out) {                                    \
    STORE_MASK(_mm512_fpclass_ps_mask(LA, kImm));                                                  \
  }                                                                                                \
  template <int kImm>                                                                              \
  TARGET void range_ps(const Inputs& in, uint8_t* out) {                                           \
    STORE_PS(_mm512_range_ps(LA, LB, kImm));                                                       \
  }                                                                                                \
  template <int kImm>                                                                              \
  TARGET void permute_ps(const Inputs& in, uint8_t* out) {                                         \
    STORE_PS(_mm512_permute_ps(LA, kImm));                                                         \
  }                                                                                                \
  template <int kImm>                                                                              \
  TARGET void slli_epi32(const Inputs& in, uint8_t* out) {                                         \
    STORE_SI(_mm512_slli_epi32(LH, kImm));                                                         \
  }                                                                                                \
  template <int kImm>                                                                              \
  TARGET void srli_epi32(const Inputs& in, uint8_t* out) {                                         \
    STORE_SI(_mm512_srli_epi32(LH, kImm));                                                         \
  }                                                                                                \
  template <int kImm>                                                                              \
  TARGET void srai_epi16(const Inputs& in, uint8_t* out) {                                         \
    STORE_SI(_mm512_srai_epi16(LH, kImm));                                                         \
  }                                                                                                \
  template <int kImm>                                                                              \
  TARGET void extract_insert(const Inputs& in, uint8_t* out) {                                     \
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_extracti64x4_epi64(LH, kImm & 1)); \
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 32),                                         \
                     _mm512_extracti32x4_epi32(LG, kImm & 3));                                     \
    _mm256_storeu_pd(reinterpret_cast<double*>(out + 48), _mm512_extractf64x4_pd(DA, kImm & 1));   \
    _mm512_storeu_ps(out + 64, _mm512_castpd_ps(_mm512_insertf64x4(                                \
                                   DA, _mm512_extractf64x4_pd(DB, 0), kImm & 1)));                 \
  }

#define POSENC_DEFINE(name, nan_payload_free, ...) \
  POSENC_TARGET void name(const Inputs& in, uint8_t* out) __VA_ARGS__

// The instructions.
namespace real {
#define POSENC_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,bmi2")))
POSENC_OPERATIONS(POSENC_DEFINE)
POSENC_IMMEDIATE_OPERATIONS(POSENC_TARGET)
#undef POSENC_TARGET
}  // namespace real

}  // namespace
}  // namespace posenc::avx512_emulation_test

#include "avx512_emulation.h"

namespace posenc::avx512_emulation_test {
namespace {

// The emulation, for AVX2 as the kernels' emulated build.
namespace emulated {
#define POSENC_TARGET __attribute__((target("avx2,fma,bmi2")))
POSENC_OPERATIONS(POSENC_DEFINE)
POSENC_IMMEDIATE_OPERATIONS(POSENC_TARGET)
#undef POSENC_TARGET
}  // namespace emulated

struct Pair {
  std::string name;
  Operation real, emulated;
  bool nan_payload_free;
  // VRANGEPS giving the chosen value's sign (imm bits 3:2 = 01): which of
  // two values of equal magnitude and opposite sign it chooses is read
  // differently from the SDM's tables and from Bochs, so such lanes are
  // drawn equal instead (zeros too). No kernel asks for that sign.
  bool no_opposite_ties = false;
};

// Pairs for each immediate value in [0, count): of(integral_constant) gives
// the two functions for that value.
template <typename Of, int... kImm>
void AddImmediates(const char* name, Of of, std::integer_sequence<int, kImm...>,
                   std::vector<Pair>* pairs) {
  (pairs->push_back({std::string(name) + "<" + std::to_string(kImm) + ">",
                     of(std::integral_constant<int, kImm>()).first,
                     of(std::integral_constant<int, kImm>()).second, false,
                     std::string(name) == "range_ps" && ((kImm >> 2) & 3) == 1}),
   ...);
}

std::vector<Pair> AllPairs() {
  std::vector<Pair> pairs;
#define POSENC_PAIR(name, nan_payload_free, ...) \
  pairs.push_back({#name, &real::name, &emulated::name, nan_payload_free});
  POSENC_OPERATIONS(POSENC_PAIR)
#undef POSENC_PAIR
#define POSENC_IMMEDIATES(name, count)                                                 \
  AddImmediates(                                                                       \
      #name,                                                                           \
      [](auto imm) {                                                                   \
        return std::pair<Operation, Operation>(&real::name<decltype(imm)::value>,      \
                                               &emulated::name<decltype(imm)::value>); \
      },                                                                               \
      std::make_integer_sequence<int, count>(), &pairs)
  POSENC_IMMEDIATES(cmp_ps_mask, 32);
  POSENC_IMMEDIATES(fpclass_ps_mask, 256);
  POSENC_IMMEDIATES(range_ps, 16);
  POSENC_IMMEDIATES(permute_ps, 256);
  POSENC_IMMEDIATES(slli_epi32, 34);
  POSENC_IMMEDIATES(srli_epi32, 34);
  POSENC_IMMEDIATES(srai_epi16, 18);
  POSENC_IMMEDIATES(extract_insert, 4);
#undef POSENC_IMMEDIATES
  return pairs;
}

bool Signalling(float f) {
  const uint32_t u = FloatBits(f);
  return (u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0 && (u & 0x00400000u) == 0;
}

// A float of every class: random bit patterns (NaNs of every payload among
// them), the special values, subnormals, values on bfloat16 rounding ties,
// and ordinary magnitudes; a quarter of the time a copy of `other`'s value
// or its negation, so that equal and equal-magnitude pairs occur.
float Draw(std::mt19937_64& rng, float other) {
  static constexpr uint32_t kSpecial[] = {
      0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u,
      0x7f800001u, 0xff800001u, 0x7fa00000u, 0x00000001u, 0x807fffffu, 0x00800000u,
      0x80800000u, 0x7f7fffffu, 0xff7fffffu, 0x7f7f8000u, 0x3f808000u, 0x3f818000u,
      0x3f80ffffu, 0x3f817fffu, 0x007f8000u, 0x00008000u};
  switch (rng() % 8) {
    case 0:
    case 1:
      return BitsFloat(static_cast<uint32_t>(rng()));
    case 2:
      return BitsFloat(kSpecial[rng() % std::size(kSpecial)]);
    case 3:
      return BitsFloat(static_cast<uint32_t>(rng()) & 0x807fffffu);  // subnormal or zero
    case 4:
      return (rng() & 1) ? other : -other;
    default: {
      std::uniform_real_distribution<float> u(-1.0f, 1.0f);
      return std::ldexp(u(rng), static_cast<int>(rng() % 64) - 32);
    }
  }
}

Inputs DrawInputs(std::mt19937_64& rng) {
  Inputs in;
  for (int i = 0; i < 16; ++i) {
    in.a[i] = Draw(rng, 1.0f);
    in.b[i] = Draw(rng, in.a[i]);
    in.c[i] = Draw(rng, in.b[i]);
    in.idx[i] = static_cast<uint32_t>(rng());
  }
  for (int i = 0; i < 32; ++i) {
    in.h[i] = static_cast<uint16_t>(rng());
    in.g[i] = (rng() % 4 == 0) ? in.h[i] : static_cast<uint16_t>(rng());
  }
  in.k = static_cast<uint32_t>(rng());
  if (rng() % 4 == 0) in.k = (in.k & 0xffffu) | ((~in.k & 0xffffu) << 16);  // a | b all set
  if (rng() % 8 == 0) in.k = 0;
  return in;
}

bool CpuHasAvx512Bf16() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512bf16");
}
bool CpuHasAvx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("bmi2");
}

// Whether the F (float or double) stored at x and the one at y are both NaN.
template <typename F>
bool BothNaN(const uint8_t* x, const uint8_t* y) {
  F a, b;
  std::memcpy(&a, x, sizeof a);
  std::memcpy(&b, y, sizeof b);
  return std::isnan(a) && std::isnan(b);
}

std::string Hex(const uint8_t* p, int n) {
  std::string s;
  char buf[4];
  for (int i = 0; i < n; ++i) {
    std::snprintf(buf, sizeof buf, "%02x", p[i]);
    s += buf;
  }
  return s;
}

TEST(Avx512Emulation, MatchesTheInstructions) {
  if (!CpuHasAvx512Bf16()) GTEST_SKIP() << "this CPU lacks AVX-512 F/BW/VL/DQ/BF16";
  std::mt19937_64 rng(testing::Rng()());
  const std::vector<Pair> pairs = AllPairs();
  constexpr int kRounds = 400;
  for (const Pair& pair : pairs) {
    const bool pd = pair.name.find("_pd") != std::string::npos;
    for (int round = 0; round < kRounds; ++round) {
      Inputs in = DrawInputs(rng);
      for (int i = 0; pair.no_opposite_ties && i < 16; ++i) {
        if (std::fabs(in.a[i]) == std::fabs(in.b[i])) in.b[i] = in.a[i];
      }
      alignas(64) uint8_t want[kOutBytes], got[kOutBytes];
      std::memset(want, 0xa5, kOutBytes);
      std::memset(got, 0xa5, kOutBytes);
      pair.real(in, want);
      pair.emulated(in, got);
      int first = -1;
      for (int i = 0; i < kOutBytes && first < 0; ++i) {
        if (want[i] == got[i]) continue;
        const int width = pd ? 8 : 4;
        const int at = i / width * width;
        if (pair.nan_payload_free &&
            (pd ? BothNaN<double>(want + at, got + at) : BothNaN<float>(want + at, got + at))) {
          i = at + width - 1;
          continue;
        }
        first = i;
      }
      if (first >= 0) {
        const int at = first / 4 * 4;
        ADD_FAILURE() << pair.name << ": the emulation differs from the instruction at byte "
                      << first << " (round " << round << "): bytes [" << at << ", " << at + 4
                      << ") " << Hex(got + at, 4) << ", the instruction " << Hex(want + at, 4)
                      << "; a = " << Hex(reinterpret_cast<const uint8_t*>(in.a), 64)
                      << ", b = " << Hex(reinterpret_cast<const uint8_t*>(in.b), 64);
        break;
      }
    }
  }
}

// VCVTNE2PS2BF16 as the kernels use it (bf16_wide.h): FloatToBFloat16's
// rounding, NaN quieted with its top bits kept, except that subnormals
// read as zero of their sign.
TEST(Avx512Emulation, BFloat16NarrowingIsTheScalarContractButForSubnormals) {
  if (!CpuHasAvx2()) GTEST_SKIP() << "the emulation runs in AVX2 code";
  std::mt19937_64 rng(testing::Rng()());
  for (int round = 0; round < 20000; ++round) {
    Inputs in = DrawInputs(rng);
    alignas(64) uint8_t out[kOutBytes];
    emulated::cvtne2ps_pbh(in, out);
    uint16_t got[32];
    std::memcpy(got, out, sizeof got);
    for (int i = 0; i < 32; ++i) {
      const float x = i < 16 ? in.b[i] : in.a[i - 16];
      const uint32_t u = FloatBits(x);
      const bool subnormal = (u & 0x7f800000u) == 0 && (u & 0x007fffffu) != 0;
      const uint16_t want =
          subnormal ? static_cast<uint16_t>((u >> 16) & 0x8000u) : FloatToBFloat16(x);
      ASSERT_EQ(got[i], want) << "lane " << i << " of 0x" << std::hex << u;
    }
  }
}

// VRANGEPS with 0x0a (min of magnitudes, sign cleared) and VFPCLASSPS, as the
// bfloat16 RoPE and sinusoidal loops use them.
TEST(Avx512Emulation, RangeAndClassAgreeWithTheirScalarMeaning) {
  if (!CpuHasAvx2()) GTEST_SKIP() << "the emulation runs in AVX2 code";
  std::mt19937_64 rng(testing::Rng()());
  for (int round = 0; round < 5000; ++round) {
    const Inputs in = DrawInputs(rng);
    alignas(64) uint8_t out[kOutBytes];
    emulated::range_ps<0x0a>(in, out);
    float m[16];
    std::memcpy(m, out, sizeof m);
    __mmask16 odd, nan_or_subnormal;
    emulated::fpclass_ps_mask<0xb9>(in, out);
    std::memcpy(&odd, out, 2);
    emulated::fpclass_ps_mask<0xa1>(in, out);
    std::memcpy(&nan_or_subnormal, out, 2);
    for (int i = 0; i < 16; ++i) {
      const float a = in.a[i], b = in.b[i];
      // A quiet NaN gives way to the other operand, as fmin's does (the
      // sinusoidal loop's bound test counts on it); a signalling one, or
      // two NaNs, give a NaN.
      if (Signalling(a) || Signalling(b) || (std::isnan(a) && std::isnan(b))) {
        EXPECT_TRUE(std::isnan(m[i])) << std::hex << FloatBits(a) << " " << FloatBits(b);
      } else {
        const float want = std::fmin(std::fabs(a), std::fabs(b));
        EXPECT_EQ(FloatBits(m[i]), FloatBits(want))
            << std::hex << FloatBits(a) << " " << FloatBits(b);
      }
      const int c = std::fpclassify(a);
      EXPECT_EQ((odd >> i) & 1, c == FP_NAN || c == FP_INFINITE || c == FP_SUBNORMAL) << a;
      EXPECT_EQ((nan_or_subnormal >> i) & 1, c == FP_NAN || c == FP_SUBNORMAL) << a;
    }
  }
}

// Masked loads and stores touch no element outside their mask: elements
// past a readable page are never read, and unselected ones never written.
TEST(Avx512Emulation, MaskedAccessesTouchSelectedElementsAlone) {
  if (!CpuHasAvx2()) GTEST_SKIP() << "the emulation runs in AVX2 code";
  const long page = sysconf(_SC_PAGESIZE);
  void* map = mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(map, MAP_FAILED);
  ASSERT_EQ(mprotect(static_cast<char*>(map) + page, page, PROT_NONE), 0);
  std::mt19937_64 rng(testing::Rng()());
  for (int live = 0; live <= 16; ++live) {
    // A 16-float vector whose first `live` elements end the readable page.
    float* tail = reinterpret_cast<float*>(static_cast<char*>(map) + page) - live;
    Inputs in = DrawInputs(rng);
    std::memcpy(tail, in.a, live * sizeof(float));
    const __mmask16 k = static_cast<__mmask16>((1u << live) - 1);
    const __m512 loaded = _mm512_maskz_loadu_ps(k, tail);
    float lanes[16];
    std::memcpy(lanes, &loaded, sizeof lanes);
    for (int i = 0; i < 16; ++i) {
      EXPECT_EQ(FloatBits(lanes[i]), i < live ? FloatBits(in.a[i]) : 0u) << "lane " << i;
    }
    std::memset(tail, 0x5a, live * sizeof(float));
    const __mmask16 every_other = static_cast<__mmask16>(k & 0x5555u);
    _mm512_mask_storeu_ps(tail, every_other, _mm512_loadu_ps(in.b));
    for (int i = 0; i < live; ++i) {
      EXPECT_EQ(FloatBits(tail[i]), i % 2 == 0 ? FloatBits(in.b[i]) : 0x5a5a5a5au)
          << "element " << i;
    }
    uint16_t* tail16 = reinterpret_cast<uint16_t*>(static_cast<char*>(map) + page) - 2 * live;
    std::memcpy(tail16, in.h, 2 * live * sizeof(uint16_t));
    const __mmask32 k32 = live == 16 ? ~__mmask32{0} : (__mmask32{1} << (2 * live)) - 1;
    const __m512i loaded16 = _mm512_maskz_loadu_epi16(k32, tail16);
    uint16_t lanes16[32];
    std::memcpy(lanes16, &loaded16, sizeof lanes16);
    for (int i = 0; i < 32; ++i) {
      EXPECT_EQ(lanes16[i], i < 2 * live ? in.h[i] : 0) << "16-bit lane " << i;
    }
  }
  munmap(map, 2 * page);
}

}  // namespace
}  // namespace posenc::avx512_emulation_test
