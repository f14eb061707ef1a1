// PairsToRedo (rope_wide_exactness.h), the 512-bit bfloat16 RoPE loops'
// test of which pairs they may narrow, against what it stands for: a pair
// it passes is one the scalar contract does not recompute (PairNeedsPrecise
// false) and whose results VCVTNE2PS2BF16 narrows as FloatToBFloat16 does
// (neither NaN nor subnormal); and it refuses none with normal results
// that the scalar contract narrows. Pairs from real rotations of bfloat16 inputs of every kind,
// at attention scales 1 and 1.5, and pairs placed on and beside the bound,
// where it is normal and where it is subnormal.
//
// Built twice, as bf16_wide_test is: against the emulated AVX-512
// intrinsics (any x86-64 CPU with AVX2) and on the instructions.
#include "rope_wide_exactness.h"

#include <cmath>
#include <cstdint>
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
    for (int i = 0; i < 16; ++i) {
      u[i] = DrawInput(rng);
      v[i] = DrawInput(rng);
      // Every fourth pair nearly cancels: the angle puts a or b near zero.
      const double angle =
          i % 4 == 0 ? std::atan2(static_cast<double>(u[i]), static_cast<double>(v[i])) +
                           std::ldexp(std::uniform_real_distribution<double>(-1, 1)(rng), -10)
                     : std::uniform_real_distribution<double>(-7, 7)(rng);
      const float c = static_cast<float>(std::cos(angle) * scale),
                  n = static_cast<float>(std::sin(angle) * scale);
      RotateF32(u[i], v[i], c, n, &a[i], &b[i]);
    }
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

}  // namespace
}  // namespace posenc::internal
