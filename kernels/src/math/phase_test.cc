// The fixed-point phase (math/phase.h): steps exact to the unit, and sines
// and cosines from phases as accurate as the float64 reduction they replace,
// at every position planning admits.
#include "math/phase.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "posenc/limits.h"

namespace posenc::internal {
namespace {

// Steps computed with 300-bit arithmetic (mpmath: nint(w / (2 pi) * 2^64)
// mod 2^64), for frequencies sinusoidal encodings use and edge cases.
TEST(PhaseStepOf, MatchesHighPrecisionSteps) {
  struct Case {
    double omega;
    uint64_t step;
  };
  const Case cases[] = {
      {1.0, 0x28be60db9391054aULL},                    // w_0 of every encoding
      {0.5, 0x145f306dc9c882a5ULL},                    //
      {0x1.abb4a3c6f968dp-1, 0x220925bd9e119c9eULL},  // 10000^(-10/512)
      {0x1.b2cb9cf6bccd1p-14, 0x114cca0995935ULL},    // 10000^(-510/512)
      {0x1.2725dd1d243acp-60, 0x3ULL},                // 1e-18: base 1e18's last
      {0x1.0p-40, 0x28be61ULL},                       //
      {0x1.45f306dc9c881p-3, 0x67c0bd888b1c768ULL},   // all 64 bits in use
      {0.0, 0ULL},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(PhaseStepOf(c.omega), c.step) << std::hexfloat << "w = " << c.omega;
  }
}

// Frequencies above one turn per position (RoPE's explicit inverse
// frequencies reach 1e3): whole turns are dropped, the fraction kept.
TEST(PhaseStepOf, DropsWholeTurns) {
  EXPECT_EQ(PhaseStepOf(7.0), 0x1d34a60108f72509ULL);
  EXPECT_EQ(PhaseStepOf(1000.0), 0x27aa59b86e7cab00ULL);
}

// |float - exact| over random positions in [-2^31, 2^31] and sinusoidal
// frequencies, against sinl/cosl of the angle formed in long double (off by
// at most 2^-33 rad at |p| = 2^31). The bar, 2^-23, is what angle.h's
// cancellation bound assumes of float sines and cosines.
TEST(SinCosOfPosition, WithinFloatPrecisionAtEveryPosition) {
  const char* env = std::getenv("POSENC_TEST_SEED");
  const uint64_t seed = env != nullptr ? std::strtoull(env, nullptr, 10) : std::random_device{}();
  std::fprintf(stderr, "random seed %llu (POSENC_TEST_SEED to replay)\n",
               static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> position(-kMaxAbsPosition, kMaxAbsPosition);
  std::uniform_int_distribution<int> slot(0, 255);
  const double bar = std::ldexp(1.0, -23);
  double worst = 0;
  for (int n = 0; n < 200000; ++n) {
    int64_t pos = position(rng);
    if (n < 4) pos = (n % 2 ? -1 : 1) * (kMaxAbsPosition - (n / 2));  // the extremes
    const double omega = std::pow(10000.0, -2.0 * slot(rng) / 512);
    float s, c;
    SinCosOfPosition(pos, PhaseStepOf(omega), &s, &c);
    const long double angle = static_cast<long double>(pos) * omega;
    const double es = std::fabs(static_cast<double>(s - sinl(angle)));
    const double ec = std::fabs(static_cast<double>(c - cosl(angle)));
    worst = std::max({worst, es, ec});
    ASSERT_LE(es, bar) << "sin, position " << pos << " w " << omega;
    ASSERT_LE(ec, bar) << "cos, position " << pos << " w " << omega;
  }
  std::printf("worst |error| %.3g (2^%.2f)\n", worst, std::log2(worst));
}

// Quadrant edges: phases just either side of each quarter turn keep the
// right signs and swap.
TEST(SinCosOfPhase, QuarterTurnEdges) {
  for (uint32_t q = 0; q < 4; ++q) {
    for (int64_t d : {-2, -1, 0, 1, 2}) {
      const uint32_t phase = (q << 30) + static_cast<uint32_t>(d);
      float s, c;
      SinCosOfPhase(phase, &s, &c);
      const double angle = static_cast<double>(phase) * kRadiansPerPhaseUnit;
      EXPECT_NEAR(s, std::sin(angle), 1e-7) << "quadrant " << q << " offset " << d;
      EXPECT_NEAR(c, std::cos(angle), 1e-7) << "quadrant " << q << " offset " << d;
    }
  }
}

TEST(PhaseAnchor, RoundsDownToMultiplesOfTheStride) {
  EXPECT_EQ(PhaseAnchor(0), 0);
  EXPECT_EQ(PhaseAnchor(15), 0);
  EXPECT_EQ(PhaseAnchor(16), 16);
  EXPECT_EQ(PhaseAnchor(-1), -16);
  EXPECT_EQ(PhaseAnchor(-16), -16);
  EXPECT_EQ(PhaseAnchor(-17), -32);
  EXPECT_EQ(PhaseAnchor(-kMaxAbsPosition), -kMaxAbsPosition);
  EXPECT_EQ(PhaseAnchor(kMaxAbsPosition - 1), kMaxAbsPosition - 16);
}

// Every table entry is sin/cos(k w) rounded to float: within half an ulp
// (plus the double recurrence's ~1e-15).
TEST(BuildOffsetTable, EntriesAreRoundedSinesAndCosines) {
  const int64_t frequencies = 300;
  std::vector<double> omega(frequencies);
  for (int64_t i = 0; i < frequencies; ++i) omega[i] = std::pow(10000.0, -2.0 * i / 600);
  omega[0] = 1.0;
  std::vector<float> ts(kPhaseAnchorStride * frequencies), tc(ts.size());
  BuildOffsetTable(omega.data(), frequencies, ts.data(), tc.data());
  auto half_ulp = [](float v) {
    const float a = std::fabs(v);
    return 0.5 * (std::nextafter(a, 2.0f) - a) + 1e-14;
  };
  for (int64_t k = 0; k < kPhaseAnchorStride; ++k) {
    for (int64_t i = 0; i < frequencies; ++i) {
      const long double angle = static_cast<long double>(k) * omega[i];
      const float s = ts[k * frequencies + i], c = tc[k * frequencies + i];
      ASSERT_LE(std::fabs(static_cast<double>(s - sinl(angle))), half_ulp(s)) << k << " " << i;
      ASSERT_LE(std::fabs(static_cast<double>(c - cosl(angle))), half_ulp(c)) << k << " " << i;
    }
  }
}

// The formula the kernels evaluate (anchor's phase, table, one rotation):
// within 2^-22 of sin/cos(p w) at every position planning admits, the float
// error that angle.h's 16-bit cancellation rule allows with room to spare
// (2^-21 for absolute encodings).
TEST(SinusoidalSinCos, WithinTwoToMinus22AtEveryPosition) {
  const char* env = std::getenv("POSENC_TEST_SEED");
  const uint64_t seed = env != nullptr ? std::strtoull(env, nullptr, 10) : std::random_device{}();
  std::fprintf(stderr, "random seed %llu (POSENC_TEST_SEED to replay)\n",
               static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  const int64_t frequencies = 256;
  std::vector<double> omega(frequencies);
  std::vector<uint64_t> step(frequencies);
  for (int64_t i = 0; i < frequencies; ++i) {
    omega[i] = std::pow(10000.0, -2.0 * i / 512);
    step[i] = PhaseStepOf(omega[i]);
  }
  std::vector<float> ts(kPhaseAnchorStride * frequencies), tc(ts.size());
  BuildOffsetTable(omega.data(), frequencies, ts.data(), tc.data());
  std::uniform_int_distribution<int64_t> position(-kMaxAbsPosition, kMaxAbsPosition);
  std::uniform_int_distribution<int64_t> slot(0, frequencies - 1);
  const double bar = std::ldexp(1.0, -22);
  double worst = 0;
  for (int n = 0; n < 200000; ++n) {
    int64_t pos = position(rng);
    if (n < 4) pos = (n % 2 ? -1 : 1) * (kMaxAbsPosition - (n / 2));  // the extremes
    const int64_t i = slot(rng);
    float s, c;
    SinusoidalSinCos(pos, step[i], ts.data(), tc.data(), frequencies, i, &s, &c);
    const long double angle = static_cast<long double>(pos) * omega[i];
    const double es = std::fabs(static_cast<double>(s - sinl(angle)));
    const double ec = std::fabs(static_cast<double>(c - cosl(angle)));
    worst = std::max({worst, es, ec});
    ASSERT_LE(es, bar) << "sin, position " << pos << " w " << omega[i];
    ASSERT_LE(ec, bar) << "cos, position " << pos << " w " << omega[i];
  }
  std::printf("worst |error| %.3g (2^%.2f)\n", worst, std::log2(worst));
}

}  // namespace
}  // namespace posenc::internal
