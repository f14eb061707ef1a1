// PairsToRedo (rope_wide_exactness.h), the 512-bit bfloat16 RoPE loops'
// test of which pairs they may narrow, against what it stands for: a pair
// it passes is one the scalar contract does not recompute (PairNeedsPrecise
// false) and whose results VCVTNE2PS2BF16 narrows as FloatToBFloat16 does
// (neither NaN nor subnormal); and it refuses none with normal results
// that the scalar contract narrows. Pairs from real rotations of bfloat16 inputs of every kind,
// at attention scales 1 and 1.5, and pairs placed on and beside the bound,
// where it is normal and where it is subnormal. Then the NEOX loop's test
// in 16-bit lanes (PairTestBF16x32), under both narrowings: a pair it
// passes is one the scalar contract narrows, and it refuses none far from
// its own bound; rotated pairs at scales 0.125 to 1000, results on and
// beside its bound, zeros and huge inputs.
//
// Built twice, as bf16_wide_test is: against the emulated AVX-512
// intrinsics (any x86-64 CPU with AVX2) and on the instructions.
#include "rope_wide_exactness.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <utility>

#include "cpu_kernels.h"
#include "gtest/gtest.h"
#include "math/rope_math.h"
#include "posenc/dtype.h"
#include "test_tensors.h"

namespace posenc::internal {
namespace {

// The lanes PairsToRedo refuses, of 16 pairs rotated at attention scale
// `scale` (1: the loops' unit-scale copy).
POSENC_BF16_WIDE_TARGET __attribute__((noinline)) uint32_t Refused(const float* a, const float* b,
                                                                   const float* u, const float* v,
                                                                   float scale = 1.0f) {
  const __m512 va = _mm512_loadu_ps(a), vb = _mm512_loadu_ps(b), vu = _mm512_loadu_ps(u),
               vv = _mm512_loadu_ps(v);
  __mmask16 odd, low;
  if (scale == 1.0f) {
    PairsToRedo<true>(va, vb, vu, vv, _mm512_set1_ps(1.0f), &odd, &low);
  } else {
    PairsToRedo<false>(va, vb, vu, vv, _mm512_set1_ps(scale), &odd, &low);
  }
  return _kor_mask16(odd, low);
}

bool Normal(float x) { return std::fpclassify(x) == FP_NORMAL; }

// A bfloat16 value of the kinds the test leans on: zero, subnormal, tiny
// normal, ordinary, huge, infinite, NaN (a random payload).
float DrawInput(std::mt19937_64& rng) {
  const float sign = rng() % 2 ? -1.0f : 1.0f;
  const uint32_t r = static_cast<uint32_t>(rng());
  switch (rng() % 8) {
    case 0:
      return sign * 0.0f;
    case 1:  // subnormal bfloat16
      return BFloat16ToFloat(static_cast<uint16_t>((r & 0x7f) | 1 | (sign < 0 ? 0x8000 : 0)));
    case 2:  // normal, near the bottom of the range
      return sign * std::ldexp(1.0f + (r % 128) / 128.0f, -126 + static_cast<int>(r % 16));
    case 3:  // near the top
      return sign * std::ldexp(1.0f + (r % 128) / 128.0f, 112 + static_cast<int>(r % 16));
    case 4:
      if (rng() % 4 == 0) return BitsFloat(0x7f800000u | (sign < 0 ? 0x80000000u : 0));
      if (rng() % 4 == 0) return BitsFloat(0x7fc00000u | (r & 0x003f0000u));
      [[fallthrough]];
    default:
      return BFloat16ToFloat(
          FloatToBFloat16(sign * std::ldexp(std::uniform_real_distribution<float>(0.5f, 1.0f)(rng),
                                            static_cast<int>(rng() % 40) - 20)));
  }
}

bool Subnormal(float x) { return std::fpclassify(x) == FP_SUBNORMAL; }

// A pair of DrawInput's inputs rotated at attention scale `scale` as the
// loops rotate it (RotateF32); `cancelling`: at an angle that puts a or b
// near zero.
void DrawRotatedPair(std::mt19937_64& rng, float scale, bool cancelling, float* u, float* v,
                     float* a, float* b) {
  *u = DrawInput(rng);
  *v = DrawInput(rng);
  const double angle = cancelling
                           ? std::atan2(static_cast<double>(*u), static_cast<double>(*v)) +
                                 std::ldexp(std::uniform_real_distribution<double>(-1, 1)(rng), -10)
                           : std::uniform_real_distribution<double>(-7, 7)(rng);
  const float c = static_cast<float>(std::cos(angle) * scale),
              n = static_cast<float>(std::sin(angle) * scale);
  RotateF32(*u, *v, c, n, a, b);
}

// What a lane's verdict must agree with. Passed: the scalar contract does
// not recompute the pair, and neither result is NaN (the instruction keeps
// a payload the contract replaces) or subnormal (read as zero). Refused:
// the scalar contract recomputes it, or a result is not normal and finite
// (an infinite one the instruction would narrow alike, but it is refused
// with the rest, too rare to matter).
void CheckLane(bool refused, float a, float b, float u, float v, float scale, const char* what) {
  const bool precise = PairNeedsPrecise<BFloat16>(a, b, u, v, scale);
  SCOPED_TRACE(::testing::Message() << what << ": a " << a << " b " << b << " u " << u << " v " << v
                                    << " scale " << scale);
  if (!refused) {
    EXPECT_FALSE(precise) << "passed a pair the scalar contract recomputes in double";
    EXPECT_FALSE(std::isnan(a) || std::isnan(b) || Subnormal(a) || Subnormal(b))
        << "passed a result VCVTNE2PS2BF16 narrows otherwise (subnormal or NaN)";
  } else {
    EXPECT_TRUE(precise || !Normal(a) || !Normal(b))
        << "refused a pair the scalar contract narrows, whose results are normal";
  }
}

TEST(RopeWideExactness, RotatedPairsOfEveryKindOfInput) {
  if (!CpuHasAvx512()) GTEST_SKIP() << "no AVX-512 (or, emulated, no AVX2) here";
  std::mt19937_64& rng = testing::Rng();
  int refused_count = 0, precise_count = 0;
  for (int round = 0; round < 20000; ++round) {
    const float scale = round % 2 ? 1.5f : 1.0f;  // unit, and YaRN's attention_factor
    alignas(64) float a[16], b[16], u[16], v[16];
    for (int i = 0; i < 16; ++i)
      DrawRotatedPair(rng, scale, i % 4 == 0, &u[i], &v[i], &a[i], &b[i]);
    const uint32_t refused = Refused(a, b, u, v, scale);
    for (int i = 0; i < 16; ++i) {
      CheckLane((refused >> i) & 1, a[i], b[i], u[i], v[i], scale, "rotated");
      refused_count += (refused >> i) & 1;
      precise_count += PairNeedsPrecise<BFloat16>(a[i], b[i], u[i], v[i], scale);
    }
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_GT(precise_count, 1000) << "too few pairs near the bound to test it";
  EXPECT_GT(refused_count, precise_count) << "too few subnormal, infinite or NaN results";
}

// Pairs placed on and beside the bound. m is set directly (a rotation
// could reach any of them): m exactly at the scalar bound B (|u| + |v|)
// passes where it is normal, one float below it does not; where the bound
// is subnormal (inputs under 2^-114) m equal to it is refused all the
// same, as a subnormal result must be.
TEST(RopeWideExactness, PairsOnAndBesideTheBound) {
  if (!CpuHasAvx512()) GTEST_SKIP() << "no AVX-512 (or, emulated, no AVX2) here";
  std::mt19937_64& rng = testing::Rng();
  int subnormal_bounds = 0;
  for (int round = 0; round < 4000; ++round) {
    alignas(64) float a[16], b[16], u[16], v[16];
    bool expect_refused[16];
    for (int i = 0; i < 16; ++i) {
      const int exponent = i < 8 ? static_cast<int>(rng() % 200) - 100   // normal bound
                                 : -133 + static_cast<int>(rng() % 18);  // subnormal bound
      const auto draw = [&] {
        const float x = BFloat16ToFloat(FloatToBFloat16(
            std::ldexp(std::uniform_real_distribution<float>(1.0f, 2.0f)(rng), exponent)));
        return rng() % 2 ? -x : x;
      };
      u[i] = draw();
      v[i] = draw();
      const float sum = std::fabs(u[i]) + std::fabs(v[i]);
      const float bound = kCancellationBound<BFloat16> * sum;  // PairNeedsPrecise's, at scale 1
      float m;
      switch (i % 3) {
        case 0:  // on the bound: passes where normal
          m = bound;
          expect_refused[i] = !Normal(m);
          subnormal_bounds += m != 0 && !Normal(m);
          break;
        case 1:  // one float below: the scalar contract's
          m = std::nextafter(bound, 0.0f);
          expect_refused[i] = true;
          break;
        default:  // well above: passes where normal
          m = bound * 3;
          expect_refused[i] = !Normal(m);
          break;
      }
      // |a| and |b| within |u| + |v|, as a rotation's are; the larger is
      // normal, so a lane refused here was refused for m.
      a[i] = rng() % 2 ? -m : m;
      b[i] = std::fmax(sum / 2, m) * (rng() % 2 ? -1.0f : 1.0f);
      if (rng() % 2) std::swap(a[i], b[i]);
    }
    const uint32_t refused = Refused(a, b, u, v);
    for (int i = 0; i < 16; ++i) {
      const bool got = (refused >> i) & 1;
      EXPECT_EQ(got, expect_refused[i])
          << "case " << i % 3 << " (" << (i < 8 ? "normal" : "subnormal") << " bound): a " << a[i]
          << " b " << b[i] << " u " << u[i] << " v " << v[i];
      CheckLane(got, a[i], b[i], u[i], v[i], 1.0f, "on the bound");
    }
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_GT(subnormal_bounds, 1000);
}

// Zero inputs (either sign) give exact zeros, which pass: padding rows
// must not all go to the scalar contract. Any other input with a zero
// result is refused.
TEST(RopeWideExactness, ZeroInputsPassAndZeroResultsOtherwiseDoNot) {
  if (!CpuHasAvx512()) GTEST_SKIP() << "no AVX-512 (or, emulated, no AVX2) here";
  alignas(64) float a[16], b[16], u[16], v[16];
  for (int i = 0; i < 16; ++i) {
    u[i] = i % 2 ? -0.0f : 0.0f;
    v[i] = i % 3 ? 0.0f : -0.0f;
    a[i] = i % 5 ? 0.0f : -0.0f;
    b[i] = i % 7 ? -0.0f : 0.0f;
    if (i >= 8) {  // a nonzero input: the smallest bfloat16 subnormal, or 1
      (i % 2 ? u : v)[i] = i < 12 ? BFloat16ToFloat(1) : 1.0f;
    }
  }
  const uint32_t refused = Refused(a, b, u, v);
  EXPECT_EQ(refused, 0xff00u);
}

// --- PairTestBF16x32, the NEOX loop's test in 16-bit lanes (AMD CPUs) ---

// The lanes PairTestBF16x32 refuses, of 32 pairs: lane j's inputs u[j],
// v[j] (bfloat16 values), its float results a[j], b[j] narrowed as the
// loop narrows them (kN), split into even and odd lanes and interleaved
// back as the loop does.
template <Narrowing kN>
POSENC_BF16_WIDE_TARGET __attribute__((noinline)) uint32_t LaneRefused(
    const float* a, const float* b, const float* u, const float* v, float scale) {
  alignas(64) uint16_t uh[32], vh[32];
  alignas(64) float ae[16], ao[16], be[16], bo[16];
  for (int j = 0; j < 32; ++j) {
    uh[j] = static_cast<uint16_t>(FloatBits(u[j]) >> 16);  // exact: u is a bfloat16 value
    vh[j] = static_cast<uint16_t>(FloatBits(v[j]) >> 16);
    if (j % 2 == 0) {
      ae[j / 2] = a[j];
      be[j / 2] = b[j];
    } else {
      ao[j / 2] = a[j];
      bo[j / 2] = b[j];
    }
  }
  const PairTestBF16x32 test(scale);
  __mmask32 huge;
  const __m512i bound = test.Bound(_mm512_loadu_si512(uh), _mm512_loadu_si512(vh), &huge);
  const __m512i ra = InterleaveBF16<kN>(_mm512_loadu_ps(ae), _mm512_loadu_ps(ao));
  const __m512i rb = InterleaveBF16<kN>(_mm512_loadu_ps(be), _mm512_loadu_ps(bo));
  return PairTestBF16x32::Fails(bound, huge, ra, rb);
}

// Both narrowings the loop may run here: the instruction (AVX-512 BF16,
// or its emulation) and the integer rounding.
uint32_t LaneRefusedBoth(const float* a, const float* b, const float* u, const float* v,
                         float scale) {
  const uint32_t rounding = LaneRefused<Narrowing::kRounding>(a, b, u, v, scale);
  if (CpuHasAvx512Bf16()) {
    EXPECT_EQ(LaneRefused<Narrowing::kInstruction>(a, b, u, v, scale), rounding)
        << "the two narrowings refuse different pairs";
  }
  return rounding;
}

// k: the exponent of the power of two at or above scale (scale > 0), formed
// apart from the code under test.
int ScaleExponentAbove(float scale) {
  return std::ilogb(scale) + (std::ldexp(1.0f, std::ilogb(scale)) == scale ? 0 : 1);
}

// What a lane's verdict must agree with. Passed: the scalar contract does
// not recompute the pair, and both results are normal and finite (every
// narrowing gives FloatToBFloat16's result), or zeros from zero inputs.
// Refused: only pairs within a
// few units of the test's own bound, M 2^-S = max(|u|, |v|) 2^-11 2^k, or
// of 2^-126, or with an input at or over 2^(126 - k) (and the scalar
// contract's own refusals): a test refusing much more would send too many
// pairs to the slow path.
void CheckLaneTest(bool refused, float a, float b, float u, float v, float scale,
                   const char* what) {
  const bool precise = PairNeedsPrecise<BFloat16>(a, b, u, v, scale);
  SCOPED_TRACE(::testing::Message() << what << ": a " << a << " b " << b << " u " << u << " v " << v
                                    << " scale " << scale);
  if (!refused) {
    EXPECT_FALSE(precise) << "passed a pair the scalar contract recomputes in double";
    const bool zeros = u == 0 && v == 0 && a == 0 && b == 0;  // padding: exact either way
    EXPECT_TRUE((Normal(a) && Normal(b)) || zeros)
        << "passed a result that is not normal and finite";
    return;
  }
  const int k = ScaleExponentAbove(scale);
  const double m = std::fmax(std::fabs(u), std::fabs(v));
  const double least = std::fmin(std::fabs(a), std::fabs(b));
  const double bound = std::fmax(std::ldexp(m, k - 11), std::ldexp(1.0, -126));
  const bool near_bound = least < bound * (1 + 0x1p-6);
  const bool huge = std::isnan(u) || std::isnan(v) || m >= std::ldexp(1.0, std::min(126 - k, 127));
  EXPECT_TRUE(precise || !Normal(a) || !Normal(b) || near_bound || huge)
      << "refused a pair far from the bound, with normal results";
}

TEST(RopeWideExactness, LaneTestPassesOnlyWhatTheScalarContractNarrows) {
  if (!CpuHasAvx512()) GTEST_SKIP() << "no AVX-512 (or, emulated, no AVX2) here";
  std::mt19937_64& rng = testing::Rng();
  // Unit, YaRN's attention_factor, the least and the largest the wide
  // loops take (rope_cpu.cc's kWideMinScale, kMaxAttentionScale).
  const float scales[] = {1.0f, 1.5f, 0.125f, 1000.0f};
  int refused_count = 0, precise_count = 0, extra_count = 0;
  for (int round = 0; round < 12000; ++round) {
    const float scale = scales[round % 4];
    alignas(64) float a[32], b[32], u[32], v[32];
    for (int j = 0; j < 32; ++j)
      DrawRotatedPair(rng, scale, j % 4 == 0, &u[j], &v[j], &a[j], &b[j]);
    const uint32_t refused = LaneRefusedBoth(a, b, u, v, scale);
    for (int j = 0; j < 32; ++j) {
      const bool got = (refused >> j) & 1;
      const bool precise = PairNeedsPrecise<BFloat16>(a[j], b[j], u[j], v[j], scale);
      CheckLaneTest(got, a[j], b[j], u[j], v[j], scale, "rotated");
      refused_count += got;
      precise_count += precise;
      extra_count += got && !precise && Normal(a[j]) && Normal(b[j]);
    }
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_GT(precise_count, 1000) << "too few pairs near the bound to test it";
  EXPECT_GT(extra_count, 100) << "too few pairs between the two tests' bounds";
  EXPECT_GT(refused_count, precise_count);
}

// Results placed on and beside the lane test's bound T = M 2^-S (M the
// larger |input|), with inputs of every exponent: a rounded |r| of T plus
// one unit passes (where T is normal), T itself does not, nor does any
// result under 2^-126 (1 + 2^-7) but exact zeros from zero inputs.
TEST(RopeWideExactness, LaneTestOnAndBesideItsBound) {
  if (!CpuHasAvx512()) GTEST_SKIP() << "no AVX-512 (or, emulated, no AVX2) here";
  std::mt19937_64& rng = testing::Rng();
  const float scales[] = {1.0f, 1.5f, 0.125f, 1000.0f};
  int passed_at_bound = 0;
  for (int round = 0; round < 4000; ++round) {
    const float scale = scales[round % 4];
    const int k = ScaleExponentAbove(scale);
    alignas(64) float a[32], b[32], u[32], v[32];
    bool expect_refused[32];
    for (int j = 0; j < 32; ++j) {
      // M from 2^-133 up to under 2^(126 - k), the larger of two inputs.
      const int exponent = static_cast<int>(rng() % static_cast<uint64_t>(126 - k + 133)) - 133;
      const float big = BFloat16ToFloat(FloatToBFloat16(
          std::ldexp(std::uniform_real_distribution<float>(1.0f, 2.0f)(rng), exponent)));
      const float small = BFloat16ToFloat(
          FloatToBFloat16(big * std::uniform_real_distribution<float>(0.0f, 1.0f)(rng)));
      const bool big_first = rng() % 2;
      u[j] = (big_first ? big : small) * (rng() % 2 ? -1.0f : 1.0f);
      v[j] = (big_first ? small : big) * (rng() % 2 ? -1.0f : 1.0f);
      const float m = std::fmax(std::fabs(u[j]), std::fabs(v[j]));
      if (!(m < std::ldexp(1.0f, std::min(126 - k, 127)))) {  // a huge input: zeros instead
        u[j] = v[j] = 0.0f;
      }
      const float t = std::ldexp(std::fmax(std::fabs(u[j]), std::fabs(v[j])), k - 11);
      const float unit = Normal(t) ? std::ldexp(1.0f, std::ilogb(t) - 7) : 0.0f;
      float least;
      switch (j % 3) {
        case 0:  // T: refused (a rounded value of T may come from under it)
          least = t;
          expect_refused[j] = t != 0;
          break;
        case 1:  // T plus one unit: passes where T is normal (or zero inputs)
          least = t + unit;
          expect_refused[j] = !(t == 0 || (Normal(t) && least >= 0x1.02p-126f));
          break;
        default:  // a bfloat16 value just over 2^-126: passes where T is under it
          least = 0x1.02p-126f;
          expect_refused[j] = !(t + unit <= least || t == 0);
          if (t == 0) least = 0;  // zero inputs make zero results
          break;
      }
      a[j] = rng() % 2 ? -least : least;
      // The other result is larger and normal, within (|u| + |v|) scale.
      const float larger = std::fmax(least, (std::fabs(u[j]) + std::fabs(v[j])) * scale / 2);
      b[j] = BFloat16ToFloat(FloatToBFloat16(larger)) * (rng() % 2 ? -1.0f : 1.0f);
      if (least == 0) b[j] = 0.0f;
      if (rng() % 2) std::swap(a[j], b[j]);
    }
    const uint32_t refused = LaneRefusedBoth(a, b, u, v, scale);
    for (int j = 0; j < 32; ++j) {
      const bool got = (refused >> j) & 1;
      EXPECT_EQ(got, expect_refused[j]) << "case " << j % 3 << ": a " << a[j] << " b " << b[j]
                                        << " u " << u[j] << " v " << v[j] << " scale " << scale;
      CheckLaneTest(got, a[j], b[j], u[j], v[j], scale, "on the bound");
      passed_at_bound += !got && j % 3 == 1;
    }
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_GT(passed_at_bound, 10000);
}

// Zero inputs (either sign) pass; every pair with an input at or over
// 2^(126 - k), infinities and NaN among them, is refused.
TEST(RopeWideExactness, LaneTestPassesZerosAndRefusesHugeInputs) {
  if (!CpuHasAvx512()) GTEST_SKIP() << "no AVX-512 (or, emulated, no AVX2) here";
  for (const float scale : {1.0f, 1000.0f}) {
    const int k = scale == 1.0f ? 0 : 10;
    alignas(64) float a[32], b[32], u[32], v[32];
    for (int j = 0; j < 32; ++j) {
      u[j] = j % 2 ? -0.0f : 0.0f;
      v[j] = j % 3 ? 0.0f : -0.0f;
      a[j] = j % 5 ? 0.0f : -0.0f;
      b[j] = j % 7 ? -0.0f : 0.0f;
    }
    // Lanes 16 and up: one huge input, its results the largest finite
    // bfloat16 value (as if the rotation had not overflowed: no bound
    // refuses them, so only the input can).
    const float huge[] = {std::ldexp(1.0f, 126 - k),
                          std::ldexp(1.5f, 126 - k),
                          std::numeric_limits<float>::infinity(),
                          BitsFloat(0x7fc10000u),
                          BitsFloat(0xff800000u),
                          std::ldexp(1.0f, 127)};
    for (int j = 16; j < 32; ++j) {
      if (j % 2 != 0) {
        u[j] = huge[j % 6];
      } else {
        v[j] = huge[j % 6];
      }
      a[j] = b[j] = BFloat16ToFloat(0x7f7f);
    }
    EXPECT_EQ(LaneRefusedBoth(a, b, u, v, scale), 0xffff0000u) << "scale " << scale;
  }
}

}  // namespace
}  // namespace posenc::internal
