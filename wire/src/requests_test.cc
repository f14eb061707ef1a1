// Options survive kernel -> wire -> kernel unchanged, for random options
// (seeded; the seed is printed), and bad wire values name their field.
#include "posenc/wire/requests.h"

#include <cstdio>
#include <random>

#include "gtest/gtest.h"
#include "posenc/wire/enums.h"

namespace posenc::wire {
namespace {

template <typename T>
T Pick(std::mt19937_64& rng, std::initializer_list<T> values) {
  return *(values.begin() + rng() % values.size());
}

std::optional<double> MaybeDouble(std::mt19937_64& rng) {
  if (rng() % 2) return std::nullopt;
  return std::uniform_real_distribution<double>(-10, 10)(rng);
}

RopeOptions RandomRope(std::mt19937_64& rng) {
  RopeOptions o;
  o.layout = Pick(rng, {RopeLayout::kBSHD, RopeLayout::kBHSD, RopeLayout::kTHD});
  o.style = Pick(rng, {RopeStyle::kNeox, RopeStyle::kGptj});
  o.rotary_dim = rng() % 256;
  o.base = std::uniform_real_distribution<double>(2, 1e6)(rng);
  o.inverse = rng() % 2;
  o.axis_mode = Pick(
      rng, {AxisMode::kSingle, AxisMode::kAxial, AxisMode::kMrope, AxisMode::kMropeInterleaved});
  if (o.axis_mode != AxisMode::kSingle) {
    for (int i = 0, n = 1 + rng() % 3; i < n; ++i) o.axis_dims.push_back(rng() % 64);
    for (int i = 0, n = rng() % 3; i < n; ++i) o.sections.push_back(rng() % 64);
  }
  RopeScaling& s = o.scaling;
  s.type = Pick(
      rng, {ScalingType::kNone, ScalingType::kLinear, ScalingType::kDynamicNtk, ScalingType::kYarn,
            ScalingType::kLlama3, ScalingType::kLongRope, ScalingType::kExplicit});
  s.factor = MaybeDouble(rng);
  if (rng() % 2) s.original_max_position = rng() % 100000;
  s.beta_fast = MaybeDouble(rng);
  s.beta_slow = MaybeDouble(rng);
  s.mscale = MaybeDouble(rng);
  s.mscale_all_dim = MaybeDouble(rng);
  s.attention_factor = MaybeDouble(rng);
  s.truncate = rng() % 2;
  s.low_freq_factor = MaybeDouble(rng);
  s.high_freq_factor = MaybeDouble(rng);
  for (int i = 0, n = rng() % 4; i < n; ++i) s.short_factor.push_back(rng() % 1000 / 7.0);
  for (int i = 0, n = rng() % 4; i < n; ++i) s.long_factor.push_back(rng() % 1000 / 3.0);
  for (int i = 0, n = rng() % 4; i < n; ++i) s.inv_freq.push_back(rng() % 1000 / 11.0);
  s.longrope_mode =
      Pick(rng, {LongRopeMode::kBySequenceLength, LongRopeMode::kShort, LongRopeMode::kLong});
  return o;
}

void ExpectSame(const RopeOptions& a, const RopeOptions& b) {
  EXPECT_EQ(a.layout, b.layout);
  EXPECT_EQ(a.style, b.style);
  EXPECT_EQ(a.rotary_dim, b.rotary_dim);
  EXPECT_EQ(a.base, b.base);
  EXPECT_EQ(a.inverse, b.inverse);
  EXPECT_EQ(a.axis_mode, b.axis_mode);
  EXPECT_EQ(a.axis_dims, b.axis_dims);
  EXPECT_EQ(a.sections, b.sections);
  const RopeScaling &x = a.scaling, &y = b.scaling;
  EXPECT_EQ(x.type, y.type);
  EXPECT_EQ(x.factor, y.factor);
  EXPECT_EQ(x.original_max_position, y.original_max_position);
  EXPECT_EQ(x.beta_fast, y.beta_fast);
  EXPECT_EQ(x.beta_slow, y.beta_slow);
  EXPECT_EQ(x.mscale, y.mscale);
  EXPECT_EQ(x.mscale_all_dim, y.mscale_all_dim);
  EXPECT_EQ(x.attention_factor, y.attention_factor);
  EXPECT_EQ(x.truncate, y.truncate);
  EXPECT_EQ(x.low_freq_factor, y.low_freq_factor);
  EXPECT_EQ(x.high_freq_factor, y.high_freq_factor);
  EXPECT_EQ(x.short_factor, y.short_factor);
  EXPECT_EQ(x.long_factor, y.long_factor);
  EXPECT_EQ(x.inv_freq, y.inv_freq);
  EXPECT_EQ(x.longrope_mode, y.longrope_mode);
}

uint64_t Seed() {
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  return seed;
}

TEST(WireRequests, RopeOptionsRoundTrip) {
  std::mt19937_64 rng(Seed());
  for (int i = 0; i < 200; ++i) {
    const RopeOptions o = RandomRope(rng);
    v1::RopeRequest req;
    SetRopeOptions(o, &req);
    absl::StatusOr<RopeOptions> back = RopeOptionsOf(req);
    ASSERT_TRUE(back.ok()) << back.status();
    ExpectSame(o, *back);
  }
}

TEST(WireRequests, AbsoluteOptionsRoundTrip) {
  std::mt19937_64 rng(Seed());
  for (int i = 0; i < 50; ++i) {
    AbsoluteOptions o;
    o.kind = rng() % 2 ? AbsoluteOptions::Kind::kLearned : AbsoluteOptions::Kind::kSinusoidal;
    o.sinusoidal_layout =
        rng() % 2 ? SinusoidalLayout::kConcatenated : SinusoidalLayout::kInterleaved;
    o.base = std::uniform_real_distribution<double>(2, 1e5)(rng);
    o.x_scale = std::uniform_real_distribution<double>(-4, 4)(rng);
    o.table_name = "table_" + std::to_string(rng() % 100);
    v1::AbsoluteEncodingRequest req;
    SetAbsoluteOptions(o, &req);
    absl::StatusOr<AbsoluteOptions> back = AbsoluteOptionsOf(req);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->kind, o.kind);
    EXPECT_EQ(back->x_scale, o.x_scale);
    if (o.kind == AbsoluteOptions::Kind::kLearned) {
      EXPECT_EQ(back->table_name, o.table_name);
    } else {
      EXPECT_EQ(back->sinusoidal_layout, o.sinusoidal_layout);
      EXPECT_EQ(back->base, o.base);
    }
    v1::EncodingTableRequest table;
    SetAbsoluteOptions(o, &table);
    absl::StatusOr<AbsoluteOptions> t = AbsoluteOptionsOf(table);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->kind, o.kind);
  }
  EXPECT_FALSE(AbsoluteOptionsOf(v1::AbsoluteEncodingRequest{}).ok());
}

TEST(WireRequests, BiasOptionsRoundTrip) {
  std::mt19937_64 rng(Seed());
  for (int i = 0; i < 50; ++i) {
    BiasOptions o;
    o.form = Pick(rng, {BiasForm::kNone, BiasForm::kCausal, BiasForm::kSymmetric});
    for (int h = 0, n = rng() % 4; h < n; ++h) o.slopes.push_back(rng() % 100 / 64.0);
    o.batch = 1 + rng() % 4;
    o.num_heads = rng() % 16;
    o.q_len = rng() % 100;
    o.k_len = rng() % 100;
    if (rng() % 2) o.q_offset = static_cast<int64_t>(rng() % 50) - 25;
    o.causal = rng() % 2;
    o.window = rng() % 10;
    o.dtype = Pick(rng, {DType::kFloat32, DType::kFloat16, DType::kBFloat16});
    std::vector<int64_t> lens(o.batch);
    for (int64_t& l : lens) l = rng() % 100;
    if (rng() % 2) o.k_lens = TensorView{DType::kInt64, {o.batch}, lens.data(), lens.size() * 8};
    std::vector<int32_t> starts(o.batch);
    for (int32_t& s : starts) s = rng() % 100;
    if (rng() % 2) {
      o.k_starts = TensorView{DType::kInt32, {o.batch}, starts.data(), starts.size() * 4};
    }
    v1::AttentionBiasRequest req;
    SetBiasOptions(o, &req);
    absl::StatusOr<BiasOptions> b = BiasOptionsOf(req);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(b->form, o.form);
    EXPECT_EQ(b->slopes, o.slopes);
    EXPECT_EQ(b->batch, o.batch);
    EXPECT_EQ(b->num_heads, o.num_heads);
    EXPECT_EQ(b->q_len, o.q_len);
    EXPECT_EQ(b->k_len, o.k_len);
    EXPECT_EQ(b->q_offset, o.q_offset);
    EXPECT_EQ(b->causal, o.causal);
    EXPECT_EQ(b->window, o.window);
    EXPECT_EQ(b->dtype, o.dtype);
    ASSERT_EQ(b->k_lens.present(), o.k_lens.present());
    if (o.k_lens.present()) {
      EXPECT_EQ(b->k_lens.shape, o.k_lens.shape);
      EXPECT_EQ(0, std::memcmp(b->k_lens.data, lens.data(), lens.size() * 8));
    }
    ASSERT_EQ(b->k_starts.present(), o.k_starts.present());
    if (o.k_starts.present()) {
      EXPECT_EQ(b->k_starts.dtype, DType::kInt32);
      EXPECT_EQ(b->k_starts.shape, o.k_starts.shape);
      EXPECT_EQ(0, std::memcmp(b->k_starts.data, starts.data(), starts.size() * 4));
    }
    // And back: the same message.
    v1::AttentionBiasRequest again;
    SetBiasOptions(*b, &again);
    EXPECT_EQ(again.SerializeAsString(), req.SerializeAsString());
  }
}

TEST(WireRequests, BadValuesNameTheirField) {
  v1::RopeRequest r;
  r.set_style(static_cast<v1::RopeStyle>(9));
  EXPECT_NE(RopeOptionsOf(r).status().message().find("style"), std::string::npos);
  r = {};
  r.mutable_scaling()->set_type(static_cast<v1::ScalingType>(42));
  EXPECT_NE(RopeOptionsOf(r).status().message().find("scaling.type"), std::string::npos);
  r = {};
  r.add_axis_dims(4);
  EXPECT_NE(RopeOptionsOf(r).status().message().find("axis_mode"), std::string::npos);
  v1::AttentionBiasRequest b;
  b.set_form(static_cast<v1::BiasForm>(5));
  EXPECT_NE(BiasOptionsOf(b).status().message().find("form"), std::string::npos);
  b = {};
  b.mutable_k_lens()->set_dtype(v1::DATA_TYPE_INT64);
  b.mutable_k_lens()->add_shape(2);
  b.mutable_k_lens()->set_data(std::string(8, '\0'));  // one element, shape says two
  EXPECT_NE(BiasOptionsOf(b).status().message().find("k_lens"), std::string::npos);
  b = {};
  b.mutable_k_starts()->set_dtype(v1::DATA_TYPE_INT32);
  b.mutable_k_starts()->add_shape(3);
  b.mutable_k_starts()->set_data(std::string(8, '\0'));  // two elements, shape says three
  EXPECT_NE(BiasOptionsOf(b).status().message().find("k_starts"), std::string::npos);
}

}  // namespace
}  // namespace posenc::wire
