// ResolveHfRope's rules one by one (the agreement with transformers itself
// over real families' configs is tests/conformance/hf_agreement_test.cc), hostile
// configs, and how a config merges with a request's explicit fields.
#include "posenc/wire/hf_config.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "posenc/v1/posenc.pb.h"
#include "posenc/wire/requests.h"

namespace posenc::wire {
namespace {

using ::testing::HasSubstr;

HfRope Resolve(const std::string& json) {
  absl::StatusOr<HfRope> r = ResolveHfRope(json);
  EXPECT_TRUE(r.ok()) << r.status() << "\n" << json;
  return r.ok() ? *r : HfRope{};
}

std::string ErrorOf(const std::string& json) {
  absl::StatusOr<HfRope> r = ResolveHfRope(json);
  EXPECT_FALSE(r.ok()) << json;
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  return std::string(r.status().message());
}

TEST(HfConfig, PlainLlamaIsDefaultRopeOverHiddenOverHeads) {
  HfRope r = Resolve(R"({"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
                         "rope_theta": 500000.0, "rope_scaling": null})");
  EXPECT_EQ(r.head_dim, 128);
  EXPECT_EQ(r.options.rotary_dim, 128);
  EXPECT_EQ(r.options.base, 500000.0);
  EXPECT_EQ(r.options.scaling.type, ScalingType::kNone);
  EXPECT_EQ(r.rope_type, "default");
  EXPECT_FALSE(r.style_implied);
  EXPECT_EQ(r.attention_scale, 1.0);
}

TEST(HfConfig, HeadDimWinsOverHiddenOverHeadsAndThetaDefaults) {
  HfRope r = Resolve(R"({"head_dim": 64, "hidden_size": 4096, "num_attention_heads": 32})");
  EXPECT_EQ(r.head_dim, 64);
  EXPECT_EQ(r.options.base, 10000.0);  // default_theta
}

TEST(HfConfig, RopeParametersCarryThetaAndPartialFactor) {
  // transformers 5 writes rope_theta and partial_rotary_factor inside it.
  HfRope r = Resolve(R"({"head_dim": 80, "rope_parameters": {"rope_type": "default",
                         "rope_theta": 250000, "partial_rotary_factor": 0.4}})");
  EXPECT_EQ(r.options.base, 250000.0);
  EXPECT_EQ(r.options.rotary_dim, 32);
}

TEST(HfConfig, NonEmptyRopeScalingWinsOverRopeParameters) {
  HfRope r = Resolve(R"({"head_dim": 64, "max_position_embeddings": 8192,
                         "rope_scaling": {"type": "linear", "factor": 2},
                         "rope_parameters": {"rope_type": "default"}})");
  EXPECT_EQ(r.options.scaling.type, ScalingType::kLinear);
  EXPECT_EQ(r.options.scaling.factor, 2.0);
}

TEST(HfConfig, YarnWithoutFactorInfersItFromTheLengths) {
  HfRope r = Resolve(R"({"head_dim": 128, "max_position_embeddings": 131072,
                         "rope_scaling": {"rope_type": "yarn", "factor": null,
                                          "original_max_position_embeddings": 32768}})");
  EXPECT_EQ(r.options.scaling.type, ScalingType::kYarn);
  EXPECT_EQ(r.options.scaling.factor, 4.0);
  EXPECT_EQ(r.options.scaling.original_max_position, 32768);
  EXPECT_NEAR(r.attention_scale, 0.1 * std::log(4.0) + 1.0, 1e-15);
  EXPECT_TRUE(r.options.scaling.truncate);
}

TEST(HfConfig, YarnBetaZeroIsTheDefaultAndNullTruncateIsFalse) {
  HfRope r = Resolve(R"({"head_dim": 128, "max_position_embeddings": 4096,
                         "rope_scaling": {"rope_type": "yarn", "factor": 4, "beta_fast": 0,
                                          "beta_slow": 2, "truncate": null}})");
  EXPECT_FALSE(r.options.scaling.beta_fast.has_value());  // `or 32`
  EXPECT_EQ(r.options.scaling.beta_slow, 2.0);
  EXPECT_FALSE(r.options.scaling.truncate);                  // get("truncate", True) is None
  EXPECT_EQ(r.options.scaling.original_max_position, 4096);  // from max_position
}

TEST(HfConfig, DeepSeekV3RotatesTheRopeHeadInPairsWithMscaleRatio) {
  HfRope r = Resolve(R"({"model_type": "deepseek_v3", "hidden_size": 7168,
    "num_attention_heads": 128, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
    "max_position_embeddings": 163840, "rope_theta": 10000,
    "rope_scaling": {"type": "yarn", "factor": 40, "mscale": 1.0, "mscale_all_dim": 0.8,
                     "original_max_position_embeddings": 4096, "beta_fast": 32,
                     "beta_slow": 1}})");
  EXPECT_EQ(r.head_dim, 64);
  EXPECT_EQ(r.options.rotary_dim, 64);
  EXPECT_TRUE(r.style_implied);
  EXPECT_EQ(r.options.style, RopeStyle::kGptj);
  const double m = 0.1 * std::log(40.0);
  EXPECT_NEAR(r.attention_scale, (m + 1) / (0.8 * m + 1), 1e-15);
}

TEST(HfConfig, Phi3TopLevelOriginalWinsAndFactorIsTheRatio) {
  std::string shorts, longs;
  for (int i = 0; i < 48; ++i) {
    absl::StrAppend(&shorts, i ? "," : "", 1.0 + i / 100.0);
    absl::StrAppend(&longs, i ? "," : "", 2.0 + i);
  }
  HfRope r = Resolve(absl::StrCat(
      R"({"model_type": "phi3", "hidden_size": 3072, "num_attention_heads": 32,
          "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
          "rope_scaling": {"type": "su", "original_max_position_embeddings": 999,
                           "short_factor": [)",
      shorts, R"(], "long_factor": [)", longs, "]}}"));
  EXPECT_EQ(r.rope_type, "longrope");
  EXPECT_EQ(r.options.scaling.type, ScalingType::kLongRope);
  EXPECT_EQ(r.options.scaling.original_max_position, 4096);
  EXPECT_EQ(r.options.scaling.factor, 32.0);
  EXPECT_NEAR(r.attention_scale, std::sqrt(1 + std::log(32.0) / std::log(4096.0)), 1e-15);
  EXPECT_EQ(r.options.scaling.long_factor.size(), 48u);
}

TEST(HfConfig, NeoxPhiAndGptjPartialRotary) {
  HfRope neox = Resolve(R"({"model_type": "gpt_neox", "hidden_size": 6144,
                            "num_attention_heads": 64, "rotary_pct": 0.25,
                            "rotary_emb_base": 10000})");
  EXPECT_EQ(neox.head_dim, 96);
  EXPECT_EQ(neox.options.rotary_dim, 24);
  HfRope neox_default = Resolve(R"({"model_type": "gpt_neox", "hidden_size": 512,
                                    "num_attention_heads": 8})");
  EXPECT_EQ(neox_default.options.rotary_dim, 16);  // rotary_pct defaults to 0.25
  HfRope phi = Resolve(R"({"model_type": "phi", "hidden_size": 2560,
                           "num_attention_heads": 32})");
  EXPECT_EQ(phi.options.rotary_dim, 40);  // PhiConfig defaults partial to 0.5
  HfRope gptj = Resolve(R"({"model_type": "gptj", "n_embd": 4096, "n_head": 16,
                            "rotary_dim": 64, "n_positions": 2048})");
  EXPECT_EQ(gptj.head_dim, 256);
  EXPECT_EQ(gptj.options.rotary_dim, 64);
  EXPECT_EQ(gptj.options.style, RopeStyle::kGptj);
}

TEST(HfConfig, QwenVlSectionsFromTextConfig) {
  HfRope q2 = Resolve(R"({"model_type": "qwen2_vl", "hidden_size": 3584,
    "num_attention_heads": 28, "rope_theta": 1000000.0,
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}})");
  EXPECT_EQ(q2.rope_type, "default");
  EXPECT_EQ(q2.options.axis_mode, AxisMode::kMrope);
  EXPECT_EQ(q2.options.sections, (std::vector<int64_t>{16, 24, 24}));
  HfRope q3 = Resolve(R"({"model_type": "qwen3_vl", "text_config": {"head_dim": 128,
    "rope_scaling": {"rope_type": "default", "mrope_section": [24, 20, 20],
                     "mrope_interleaved": true}}})");
  EXPECT_EQ(q3.options.axis_mode, AxisMode::kMropeInterleaved);
  EXPECT_EQ(q3.options.base, 500000.0);  // Qwen3VLTextConfig.default_theta
}

TEST(HfConfig, HostileConfigsAreRefusedNamingTheField) {
  EXPECT_THAT(ErrorOf("not json"), HasSubstr("hf_config must be a JSON object"));
  EXPECT_THAT(ErrorOf("[1, 2]"), HasSubstr("hf_config must be a JSON object"));
  EXPECT_THAT(ErrorOf(std::string(kMaxHfConfigBytes + 1, ' ')), HasSubstr("at most 1048576"));
  EXPECT_THAT(ErrorOf(std::string(100000, '[') + std::string(100000, ']')),
              HasSubstr("nest objects and lists at most 16"));
  EXPECT_THAT(ErrorOf(R"({"head_dim": "128"})"),
              HasSubstr("hf_config.head_dim must be an integer, got a string"));
  EXPECT_THAT(ErrorOf(R"({"head_dim": 127.5})"), HasSubstr("hf_config.head_dim must be a whole"));
  EXPECT_THAT(ErrorOf(R"({"head_dim": 1e300})"), HasSubstr("hf_config.head_dim must be a whole"));
  EXPECT_THAT(ErrorOf(R"({"hidden_size": 10})"), HasSubstr("hidden_size"));
  EXPECT_THAT(ErrorOf(R"({"hidden_size": 10, "num_attention_heads": 0})"),
              HasSubstr("must be positive"));
  EXPECT_THAT(ErrorOf(R"({"head_dim": 128, "rope_theta": 1e300})"), HasSubstr("rope_theta"));
  EXPECT_THAT(ErrorOf(R"({"head_dim": 128, "rope_theta": -5})"), HasSubstr("rope_theta"));
  EXPECT_THAT(ErrorOf(R"({"head_dim": 128, "partial_rotary_factor": 1.5})"),
              HasSubstr("partial_rotary_factor"));
  EXPECT_THAT(ErrorOf(R"({"head_dim": 128, "rope_scaling": {"rope_type": "ntk-by-parts"}})"),
              HasSubstr("hf_config.rope_scaling.rope_type must be one of"));
  EXPECT_THAT(ErrorOf(R"({"head_dim": 128, "rope_scaling": {"rope_type": "linear"}})"),
              HasSubstr("hf_config.rope_scaling.factor is required"));
  EXPECT_THAT(ErrorOf(R"({"head_dim": 128, "rope_scaling": {"rope_type": "linear",
                          "factor": 1e9}})"),
              HasSubstr("hf_config.rope_scaling.factor must be in"));
  EXPECT_THAT(ErrorOf(R"({"head_dim": 128, "max_position_embeddings": 4096,
                          "rope_scaling": {"rope_type": "yarn", "factor": 4, "mscale": [1]}})"),
              HasSubstr("hf_config.rope_scaling.mscale must be a number, got a list"));
  EXPECT_THAT(ErrorOf(R"({"head_dim": 128, "rope_scaling": {"rope_type": "yarn"}})"),
              HasSubstr("max_position_embeddings"));
  EXPECT_THAT(ErrorOf(R"({"head_dim": 128, "rope_scaling": {"rope_type": "longrope",
                          "factor": 2, "original_max_position_embeddings": 10,
                          "short_factor": [1, "x"]}})"),
              HasSubstr("hf_config.rope_scaling.short_factor[1] must be a number"));
  EXPECT_THAT(ErrorOf(R"({"head_dim": 128, "rope_parameters": {"full_attention":
                          {"rope_type": "default"}}})"),
              HasSubstr("per layer type"));
  EXPECT_THAT(ErrorOf(R"({"model_type": "qwen2_vl", "head_dim": 128,
                          "rope_scaling": {"type": "mrope", "mrope_section": [1,2,3,4,5,6,7,8,9]}})"),
              HasSubstr("mrope_section must have 1 to 8"));
  EXPECT_THAT(ErrorOf(R"({"model_type": 7})"), HasSubstr("hf_config.model_type must be a string"));
  EXPECT_THAT(ErrorOf(R"({"text_config": 7})"),
              HasSubstr("hf_config.text_config must be an object"));
}

TEST(HfConfig, OddRotaryDimensionIsRefused) {
  // HF would take ceil(R/2) frequencies over R; posenc rotates pairs only.
  EXPECT_THAT(ErrorOf(R"({"head_dim": 100, "partial_rotary_factor": 0.25})"),
              HasSubstr("rotary dimension 25"));
}

TEST(HfConfigCache, HitsAnswerAsTheParserAndErrorsStayErrors) {
  const std::string llama = R"({"head_dim": 64, "rope_theta": 500000, "rope_scaling":
    {"rope_type": "llama3", "factor": 32, "low_freq_factor": 1, "high_freq_factor": 4,
     "original_max_position_embeddings": 8192}})";
  for (int i = 0; i < 3; ++i) {  // a miss, then hits
    absl::StatusOr<HfRope> r = ResolveHfRopeCached(llama);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->options.base, 500000.0);
    EXPECT_EQ(r->options.scaling.factor, 32.0);
    EXPECT_EQ(r->options.scaling.original_max_position, 8192);
  }
  // More distinct configs than entries: each still resolves to its own.
  for (int d = 2; d <= 2 * static_cast<int>(kHfCacheEntries) + 2; d += 2) {
    absl::StatusOr<HfRope> r = ResolveHfRopeCached(absl::StrCat(R"({"head_dim": )", d, "}"));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->options.rotary_dim, d);
  }
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(ResolveHfRopeCached(R"({"head_dim": "x"})").status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  // Over the per-entry size: resolved, not cached.
  const std::string big =
      absl::StrCat(R"({"head_dim": 32, "pad": ")", std::string(kHfCacheMaxBytes, 'x'), R"("})");
  absl::StatusOr<HfRope> r = ResolveHfRopeCached(big);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->head_dim, 32);
}

v1::RopeRequest RequestWith(const std::string& config) {
  v1::RopeRequest req;
  req.set_hf_config(config);
  req.mutable_query()->set_dtype(v1::DATA_TYPE_FLOAT32);
  for (int64_t d : {1, 4, 2, 64}) req.mutable_query()->add_shape(d);
  return req;
}

const char kDeepSeek[] = R"({"model_type": "deepseek_v3", "qk_rope_head_dim": 64,
  "max_position_embeddings": 163840, "rope_scaling": {"type": "yarn", "factor": 40,
  "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096}})";

TEST(HfConfigRequest, ConfigFillsTheOptionsAndAgreeingFieldsPass) {
  v1::RopeRequest req = RequestWith(kDeepSeek);
  req.set_layout(v1::ROPE_LAYOUT_BHSD);
  req.set_base(10000);
  req.set_rotary_dim(64);
  req.set_style(v1::ROPE_STYLE_GPTJ);
  absl::StatusOr<RopeOptions> o = RopeOptionsOf(req);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->layout, RopeLayout::kBHSD);  // the request's own
  EXPECT_EQ(o->style, RopeStyle::kGptj);
  EXPECT_EQ(o->scaling.type, ScalingType::kYarn);
  EXPECT_EQ(o->scaling.factor, 40.0);
  EXPECT_EQ(o->scaling.original_max_position, 4096);
}

TEST(HfConfigRequest, ConflictingFieldsAreRefusedNamingBoth) {
  auto error = [](const v1::RopeRequest& req) {
    absl::StatusOr<RopeOptions> o = RopeOptionsOf(req);
    EXPECT_FALSE(o.ok());
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(o.status().message());
  };
  v1::RopeRequest req = RequestWith(kDeepSeek);
  req.set_base(500000);
  EXPECT_THAT(error(req), HasSubstr("base is 500000 but hf_config gives 10000"));
  req = RequestWith(kDeepSeek);
  req.set_rotary_dim(32);
  EXPECT_THAT(error(req), HasSubstr("rotary_dim is 32 but hf_config gives 64"));
  req = RequestWith(kDeepSeek);
  req.set_style(v1::ROPE_STYLE_NEOX);
  EXPECT_THAT(error(req), HasSubstr("style is neox but hf_config gives gptj"));
  req = RequestWith(kDeepSeek);
  req.mutable_scaling()->set_type(v1::SCALING_TYPE_LINEAR);
  EXPECT_THAT(error(req), HasSubstr("scaling and hf_config are both set"));
  req = RequestWith(kDeepSeek);
  req.mutable_query()->set_shape(3, 128);
  EXPECT_THAT(error(req), HasSubstr("the query's head_dim is 128 but hf_config gives 64"));
  req = RequestWith(R"({"model_type": "qwen2_vl", "head_dim": 64,
    "rope_scaling": {"type": "mrope", "mrope_section": [8, 12, 12]}})");
  req.add_sections(16);
  req.add_sections(16);
  req.set_axis_mode(v1::AXIS_MODE_MROPE);
  EXPECT_THAT(error(req), HasSubstr("sections is 16,16 but hf_config gives 8,12,12"));
  req = RequestWith("{");
  EXPECT_THAT(error(req), HasSubstr("hf_config must be a JSON object"));
}

TEST(HfConfigRequest, StyleTheFamilyDoesNotImplyIsTheRequests) {
  // Llama's HF code is rotate_half (NEOX); a caller with permuted (Meta
  // original) weights may still ask for GPTJ.
  v1::RopeRequest req = RequestWith(R"({"head_dim": 64, "rope_theta": 500000})");
  req.set_style(v1::ROPE_STYLE_GPTJ);
  absl::StatusOr<RopeOptions> o = RopeOptionsOf(req);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->style, RopeStyle::kGptj);
  EXPECT_EQ(o->base, 500000.0);
}

}  // namespace
}  // namespace posenc::wire
