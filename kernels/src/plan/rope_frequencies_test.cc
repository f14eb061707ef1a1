// Properties of the frequency resolution that follow from the published
// definitions; exact agreement with the float64 reference is tested in
// tests/conformance/backend_conformance_test.cc.
#include <cmath>

#include "gtest/gtest.h"
#include "posenc/rope.h"

namespace posenc {
namespace {

FrequencySet Resolve(const RopeOptions& o, int64_t R, int64_t L = 0) {
  auto fs = ResolveFrequencies(o, R, L);
  EXPECT_TRUE(fs.ok()) << fs.status();
  return fs.ok() ? *fs : FrequencySet{};
}

TEST(RopeFrequencies, DefaultIsThetaPowers) {
  RopeOptions o;
  FrequencySet fs = Resolve(o, 128);
  ASSERT_EQ(fs.inv_freq.size(), 64u);
  EXPECT_DOUBLE_EQ(fs.inv_freq[0], 1.0);
  EXPECT_NEAR(fs.inv_freq[32], std::pow(10000.0, -0.5), 1e-15);
  EXPECT_EQ(fs.attention_scale, 1.0);
}

TEST(RopeFrequencies, DynamicNtkUnchangedWithinOriginalLength) {
  RopeOptions o;
  o.scaling.type = ScalingType::kDynamicNtk;
  o.scaling.factor = 4;
  o.scaling.original_max_position = 2048;
  FrequencySet inside = Resolve(o, 64, 2048);
  FrequencySet outside = Resolve(o, 64, 8192);
  FrequencySet plain = Resolve(RopeOptions{}, 64);
  for (size_t k = 0; k < plain.inv_freq.size(); ++k) {
    EXPECT_NEAR(inside.inv_freq[k], plain.inv_freq[k], 1e-15 * plain.inv_freq[k]);
    if (k > 0) EXPECT_LT(outside.inv_freq[k], plain.inv_freq[k]);
  }
}

TEST(RopeFrequencies, Llama3KeepsHighAndScalesLowFrequencies) {
  RopeOptions o;
  o.base = 500000;
  o.scaling.type = ScalingType::kLlama3;  // defaults: 8, 1, 4, 8192
  FrequencySet fs = Resolve(o, 128);
  FrequencySet plain = Resolve(RopeOptions{.base = 500000}, 128);
  for (size_t k = 0; k < fs.inv_freq.size(); ++k) {
    const double wavelen = 2 * M_PI / plain.inv_freq[k];
    if (wavelen < 8192 / 4) EXPECT_EQ(fs.inv_freq[k], plain.inv_freq[k]);
    if (wavelen > 8192) EXPECT_DOUBLE_EQ(fs.inv_freq[k], plain.inv_freq[k] / 8);
  }
}

TEST(RopeFrequencies, YarnAndLongRopeAttentionScales) {
  RopeOptions o;
  o.scaling.type = ScalingType::kYarn;
  o.scaling.factor = 16;
  o.scaling.original_max_position = 4096;
  EXPECT_DOUBLE_EQ(Resolve(o, 128).attention_scale, 0.1 * std::log(16.0) + 1);
  o.scaling.mscale = 0.707;
  o.scaling.mscale_all_dim = 0.707;
  EXPECT_DOUBLE_EQ(Resolve(o, 128).attention_scale, 1.0);

  RopeOptions l;
  l.scaling.type = ScalingType::kLongRope;
  l.scaling.factor = 32;
  l.scaling.original_max_position = 4096;
  l.scaling.short_factor.assign(32, 1.0);
  l.scaling.long_factor.assign(32, 2.0);
  FrequencySet s = Resolve(l, 64, 100), g = Resolve(l, 64, 5000);
  EXPECT_DOUBLE_EQ(s.attention_scale, std::sqrt(1 + std::log(32.0) / std::log(4096.0)));
  EXPECT_DOUBLE_EQ(g.inv_freq[3], s.inv_freq[3] / 2);
}

TEST(RopeFrequencies, AxisAssignments) {
  RopeOptions o;
  o.axis_mode = AxisMode::kMrope;
  o.sections = {16, 24, 24};
  FrequencySet fs = Resolve(o, 128);
  EXPECT_EQ(fs.slot_axis[15], 0);
  EXPECT_EQ(fs.slot_axis[16], 1);
  EXPECT_EQ(fs.slot_axis[40], 2);

  o.axis_mode = AxisMode::kMropeInterleaved;
  o.sections = {24, 20, 20};
  fs = Resolve(o, 128);
  int count[3] = {0, 0, 0};
  for (int a : fs.slot_axis) ++count[a];
  EXPECT_EQ(count[0], 24);
  EXPECT_EQ(count[1], 20);
  EXPECT_EQ(fs.slot_axis[1], 1);
  EXPECT_EQ(fs.slot_axis[2], 2);
  EXPECT_EQ(fs.slot_axis[61], 0);

  RopeOptions a;
  a.axis_mode = AxisMode::kAxial;
  a.axis_dims = {32, 32};
  fs = Resolve(a, 64);
  EXPECT_EQ(fs.inv_freq[0], 1.0);
  EXPECT_EQ(fs.inv_freq[16], 1.0);  // second axis restarts at theta^0
  EXPECT_EQ(fs.slot_axis[16], 1);
}

TEST(RopeFrequencies, BadOptionsAreInvalidArgument) {
  RopeOptions o;
  o.scaling.type = ScalingType::kLinear;
  EXPECT_EQ(ResolveFrequencies(o, 64, 0).status().code(), absl::StatusCode::kInvalidArgument);
  o.scaling.factor = -1;
  EXPECT_NE(ResolveFrequencies(o, 64, 0).status().message().find("scaling.factor"),
            absl::string_view::npos);
  RopeOptions m;
  m.axis_mode = AxisMode::kMrope;
  m.sections = {16, 24, 23};
  EXPECT_NE(ResolveFrequencies(m, 128, 0).status().message().find("sections must sum"),
            absl::string_view::npos);
}

}  // namespace
}  // namespace posenc
