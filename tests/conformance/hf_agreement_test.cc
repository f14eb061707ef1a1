// posenc against HF transformers itself: tests/conformance/hf/hf_fixtures.json records
// what HF's own code computes (tests/conformance/hf/generate_fixtures.py); this test
// replays every case through posenc's frequency resolution and through every
// backend present.
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "backends.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "posenc/backend.h"
#include "test_tensors.h"

namespace posenc {
namespace {

using nlohmann::json;

const json& Fixtures() {
  static const json* fixtures = [] {
    // POSENC_HF_FIXTURES in the environment wins (binaries run elsewhere,
    // e.g. bundled for a GPU machine); else the source tree's copy.
    const char* path = std::getenv("POSENC_HF_FIXTURES");
    std::ifstream in(path != nullptr ? path : POSENC_HF_FIXTURES);
    std::stringstream ss;
    ss << in.rdbuf();
    return new json(json::parse(ss.str()));
  }();
  return *fixtures;
}

RopeScaling ScalingOf(const json& s) {
  RopeScaling r;
  const std::string type = s.at("type");
  if (type == "none") r.type = ScalingType::kNone;
  if (type == "linear") r.type = ScalingType::kLinear;
  if (type == "dynamic") r.type = ScalingType::kDynamicNtk;
  if (type == "yarn") r.type = ScalingType::kYarn;
  if (type == "llama3") r.type = ScalingType::kLlama3;
  if (type == "longrope") r.type = ScalingType::kLongRope;
  auto opt = [&](const char* key, std::optional<double>& out) {
    if (s.contains(key)) out = s.at(key).get<double>();
  };
  opt("factor", r.factor);
  opt("beta_fast", r.beta_fast);
  opt("beta_slow", r.beta_slow);
  opt("mscale", r.mscale);
  opt("mscale_all_dim", r.mscale_all_dim);
  opt("attention_factor", r.attention_factor);
  opt("low_freq_factor", r.low_freq_factor);
  opt("high_freq_factor", r.high_freq_factor);
  if (s.contains("original_max_position"))
    r.original_max_position = s.at("original_max_position").get<int64_t>();
  if (s.contains("short_factor")) r.short_factor = s.at("short_factor").get<std::vector<double>>();
  if (s.contains("long_factor")) r.long_factor = s.at("long_factor").get<std::vector<double>>();
  return r;
}

TEST(HfAgreement, FixturesComeFromHfTransformers) {
  EXPECT_FALSE(Fixtures().at("transformers").get<std::string>().empty());
  EXPECT_GE(Fixtures().at("frequencies").size(), 10u);
  EXPECT_GE(Fixtures().at("conventions").size(), 5u);
}

// HF forms inv_freq in float32, so agreement is to float32 precision.
TEST(HfAgreement, FrequenciesAndAttentionScaleMatchEveryScaling) {
  for (const json& c : Fixtures().at("frequencies")) {
    SCOPED_TRACE(c.at("name").get<std::string>());
    RopeOptions o;
    o.base = c.at("base");
    o.scaling = ScalingOf(c.at("scaling"));
    const int64_t R = c.at("rotary_dim");
    auto fs = ResolveFrequencies(o, R, c.at("seq_len").get<int64_t>());
    ASSERT_TRUE(fs.ok()) << fs.status();
    const auto hf = c.at("inv_freq").get<std::vector<double>>();
    ASSERT_EQ(fs->inv_freq.size(), hf.size());
    for (size_t k = 0; k < hf.size(); ++k) {
      EXPECT_NEAR(fs->inv_freq[k], hf[k], 4e-7 * hf[k]) << "slot " << k;
    }
    EXPECT_NEAR(fs->attention_scale, c.at("attention_scale").get<double>(), 1e-6);
  }
}

using testing::MakeBackend;

class HfConventions : public ::testing::TestWithParam<std::string> {};

// HF's own apply_* functions on float64 inputs; posenc in float32.
TEST_P(HfConventions, RotationsMatchHfApplyFunctions) {
  auto backend = MakeBackend(GetParam());
  if (backend == nullptr) GTEST_SKIP() << "no " << GetParam() << " device visible";
  for (const json& c : Fixtures().at("conventions")) {
    SCOPED_TRACE(c.at("name").get<std::string>());
    RopeOptions o;
    const std::string layout = c.at("layout");
    o.layout = layout == "BHSD"  ? RopeLayout::kBHSD
               : layout == "THD" ? RopeLayout::kTHD
                                 : RopeLayout::kBSHD;
    o.style = c.at("style") == "GPTJ" ? RopeStyle::kGptj : RopeStyle::kNeox;
    o.rotary_dim = c.at("rotary_dim");
    if (c.contains("base")) o.base = c.at("base");
    if (c.contains("axis_mode")) {
      const std::string m = c.at("axis_mode");
      o.axis_mode = m == "AXIAL"   ? AxisMode::kAxial
                    : m == "MROPE" ? AxisMode::kMrope
                                   : AxisMode::kMropeInterleaved;
    }
    if (c.contains("sections")) o.sections = c.at("sections").get<std::vector<int64_t>>();
    if (c.contains("axis_dims")) o.axis_dims = c.at("axis_dims").get<std::vector<int64_t>>();

    const auto shape = c.at("shape").get<std::vector<int64_t>>();
    const auto query = c.at("query").get<std::vector<double>>();
    std::vector<float> q(query.begin(), query.end());
    std::vector<double> expected = c.at("expected").get<std::vector<double>>();
    // The float32 input is what posenc rotates; HF rotated the float64 one.
    // Their difference is ~1e-8, well inside the bar below.
    const auto ids = c.at("position_ids").get<std::vector<int64_t>>();
    RopeTensors t;
    t.query = MutableTensor{DType::kFloat32, shape, q.data(), q.size() * 4};
    t.positions.position_ids =
        testing::IntView(ids, c.at("position_shape").get<std::vector<int64_t>>());
    auto plan = PlanRope(o, t);
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_TRUE(backend->ApplyRope(*plan, q.data(), nullptr, {}).ok());
    EXPECT_TRUE(testing::MatchesReference(DType::kFloat32, expected, q.data(), 1e-6));
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, HfConventions,
                         ::testing::Values("cpu", "emulated", "host_runtime", "cuda"));

}  // namespace
}  // namespace posenc
