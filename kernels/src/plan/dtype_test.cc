#include "posenc/dtype.h"

#include <cmath>
#include <limits>
#include <random>

#include "gtest/gtest.h"
#include "test_tensors.h"

namespace posenc {
namespace {

// Round-to-nearest-even into a format with `mant` fraction bits and minimum
// normal exponent `emin`, computed in double: the independent check of the
// bit-twiddling conversions.
double RoundToFormat(double v, int mant, int emin, double max_finite) {
  if (v == 0 || std::isnan(v)) return v;
  const int e = std::max(static_cast<int>(std::floor(std::log2(std::abs(v)))), emin);
  const double ulp = std::ldexp(1.0, e - mant);
  const double r = std::nearbyint(v / ulp) * ulp;  // default rounding mode: ties to even
  if (std::abs(r) > max_finite) return std::copysign(std::numeric_limits<double>::infinity(), v);
  return r;
}

TEST(DType, SizesAndNames) {
  EXPECT_EQ(SizeOf(DType::kFloat32), 4u);
  EXPECT_EQ(SizeOf(DType::kBFloat16), 2u);
  EXPECT_EQ(SizeOf(DType::kInt64), 8u);
  EXPECT_STREQ(DTypeName(DType::kFloat16), "FLOAT16");  // contents, not pointers
}

TEST(DType, HalfRoundTripsEveryFiniteValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue;  // NaN payloads
    EXPECT_EQ(FloatToHalf(HalfToFloat(static_cast<uint16_t>(h))), h) << std::hex << h;
  }
}

TEST(DType, BFloat16RoundTripsEveryValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7f80) == 0x7f80 && (h & 0x7f)) continue;
    EXPECT_EQ(FloatToBFloat16(BFloat16ToFloat(static_cast<uint16_t>(h))), h) << std::hex << h;
  }
}

TEST(DType, ElementsByRuntimeDtype) {
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    unsigned char buf[3 * 4] = {};
    StoreElement(dtype, buf, 2, 1.0f + 1.0f / 1024);
    StoreElement(dtype, buf, 1, -3.5f);
    EXPECT_EQ(LoadElement(dtype, buf, 1), -3.5f) << DTypeName(dtype);
    const float want =
        dtype == DType::kBFloat16 ? 1.0f : 1.0f + 1.0f / 1024;  // bf16 rounds it away
    EXPECT_EQ(LoadElement(dtype, buf, 2), want) << DTypeName(dtype);
    EXPECT_EQ(LoadElement(dtype, buf, 0), 0.0f) << DTypeName(dtype);
  }
}

TEST(DType, ConversionsRoundToNearestEven) {
  std::mt19937_64& rng = testing::Rng();  // seeded, the seed printed
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    // Random float bit patterns over the ranges where half is interesting.
    float f = BitsFloat(bits(rng));
    if (std::isnan(f)) continue;
    const double h = RoundToFormat(f, 10, -14, 65504.0);
    const double b = RoundToFormat(f, 7, -126, 3.3895313892515355e38);
    EXPECT_EQ(static_cast<double>(HalfToFloat(FloatToHalf(f))), h) << f;
    EXPECT_EQ(static_cast<double>(BFloat16ToFloat(FloatToBFloat16(f))), b) << f;
  }
  // A sweep over the whole float range, every 4093rd bit pattern (the
  // conversions are branch-free, so each candidate path must be right for
  // every input it is selected for).
  for (uint64_t u = 0; u <= 0xffffffffull; u += 4093) {
    const float f = BitsFloat(static_cast<uint32_t>(u));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f))));
      EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(f))));
      continue;
    }
    ASSERT_EQ(static_cast<double>(HalfToFloat(FloatToHalf(f))), RoundToFormat(f, 10, -14, 65504.0))
        << std::hexfloat << f;
    ASSERT_EQ(static_cast<double>(BFloat16ToFloat(FloatToBFloat16(f))),
              RoundToFormat(f, 7, -126, 3.3895313892515355e38))
        << std::hexfloat << f;
  }
  // Ties: 1 + 2^-11 lies halfway between 1 and 1 + 2^-10 and goes to even (1).
  EXPECT_EQ(HalfToFloat(FloatToHalf(1.0f + std::ldexp(1.0f, -11))), 1.0f);
  EXPECT_EQ(HalfToFloat(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11))),
            1.0f + std::ldexp(1.0f, -9));
  EXPECT_EQ(HalfToFloat(FloatToHalf(65520.0f)), std::numeric_limits<float>::infinity());
  EXPECT_EQ(HalfToFloat(FloatToHalf(65519.0f)), 65504.0f);
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(std::nanf("")))));
}

}  // namespace
}  // namespace posenc
