// HF configs as they are, against HF transformers itself: the "configs"
// cases of tests/conformance/hf/hf_fixtures.json hold real model families' config.json
// RoPE fields and what each family's own rotary module computed from them
// (tests/conformance/hf/generate_fixtures.py). posenc must derive the same head and
// rotary dimensions, style and M-RoPE sections (wire::ResolveHfRope) and,
// from those options, the same frequencies and attention scale at every
// recorded length (ResolveFrequencies, what every backend's plan uses).
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "posenc/rope.h"
#include "posenc/wire/hf_config.h"

namespace posenc {
namespace {

using nlohmann::json;

const json& Fixtures() {
  static const json* fixtures = [] {
    const char* path = std::getenv("POSENC_HF_FIXTURES");
    std::ifstream in(path != nullptr ? path : POSENC_HF_FIXTURES);
    std::stringstream ss;
    ss << in.rdbuf();
    return new json(json::parse(ss.str()));
  }();
  return *fixtures;
}

TEST(HfConfigAgreement, EveryFamilyIsCovered) {
  std::set<std::string> names;
  for (const json& c : Fixtures().at("configs")) names.insert(c.at("name").get<std::string>());
  for (const char* family :
       {"llama-3.1-8b", "llama-3.2-1b", "qwen2.5-7b-yarn", "qwen2.5-yarn-factor-unset",
        "phi-3-mini-128k", "deepseek-v3", "qwen2-vl-7b", "gpt-neox-20b", "gpt-j-6b"}) {
    EXPECT_TRUE(names.count(family)) << family;
  }
}

TEST(HfConfigAgreement, ResolutionMatchesTheFamilysRotaryModule) {
  for (const json& c : Fixtures().at("configs")) {
    SCOPED_TRACE(c.at("name").get<std::string>());
    absl::StatusOr<wire::HfRope> hf = wire::ResolveHfRope(c.at("config").get<std::string>());
    ASSERT_TRUE(hf.ok()) << hf.status();
    EXPECT_EQ(hf->head_dim, c.at("head_dim").get<int64_t>());
    const int64_t R = c.at("rotary_dim");
    EXPECT_EQ(hf->options.rotary_dim, R);
    EXPECT_EQ(hf->options.style, c.at("style") == "gptj" ? RopeStyle::kGptj : RopeStyle::kNeox);
    if (c.contains("sections")) {
      EXPECT_EQ(hf->options.sections, c.at("sections").get<std::vector<int64_t>>());
      EXPECT_EQ(hf->options.axis_mode, c.at("axis_mode") == "mrope_interleaved"
                                           ? AxisMode::kMropeInterleaved
                                           : AxisMode::kMrope);
    } else {
      EXPECT_EQ(hf->options.axis_mode, AxisMode::kSingle);
    }
    for (const json& r : c.at("results")) {
      const int64_t L = r.at("seq_len");
      SCOPED_TRACE(L);
      auto fs = ResolveFrequencies(hf->options, R, L);
      ASSERT_TRUE(fs.ok()) << fs.status();
      const auto want = r.at("inv_freq").get<std::vector<double>>();
      ASSERT_EQ(fs->inv_freq.size(), want.size());
      // HF forms inv_freq in float32.
      for (size_t k = 0; k < want.size(); ++k) {
        EXPECT_NEAR(fs->inv_freq[k], want[k], 4e-7 * want[k]) << "slot " << k;
      }
      const double scale = r.at("attention_scale");
      EXPECT_NEAR(fs->attention_scale, scale, 1e-6);
      EXPECT_NEAR(hf->attention_scale, scale, 1e-6);
    }
  }
}

}  // namespace
}  // namespace posenc
