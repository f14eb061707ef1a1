#include "kserve/model_file.h"

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kserve/infer.h"
#include "kserve/parameters.h"
#include "nlohmann/json.hpp"
#include "posenc/rope.h"
#include "posenc/status_macros.h"

namespace posenc::server::kserve {
namespace {

std::string ReadDeployed(const std::string& name) {
  std::ifstream f(std::string(POSENC_SOURCE_DIR) + "/deploy/models/" + name);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// The error ParseModelFile gives, or "loaded" when it gave none.
std::string ErrorOf(const std::string& json, const std::string& name = "m") {
  absl::StatusOr<Model> m = ParseModelFile(name, json);
  if (m.ok()) return "loaded";
  return std::string(m.status().message());
}

void ExpectRefused(const std::string& json, const std::string& mentions) {
  absl::StatusOr<Model> m = ParseModelFile("m", json);
  ASSERT_FALSE(m.ok()) << json;
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << m.status();
  EXPECT_NE(m.status().message().find(mentions), std::string::npos)
      << "json: " << json << "\nmessage: " << m.status().message();
}

TEST(ModelFileTest, LlamaExampleFixesItsRopeParameters) {
  absl::StatusOr<Model> m =
      ParseModelFile("llama-3.1-8b-rope", ReadDeployed("llama-3.1-8b-rope.json"));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->name, "llama-3.1-8b-rope");
  EXPECT_EQ(m->kind, ModelKind::kRope);
  EXPECT_EQ(m->head_dim, 128);
  EXPECT_EQ(m->fixed.at("base").int64_param(), 500000);
  EXPECT_EQ(m->fixed.at("scaling").string_param(), "llama3");
  EXPECT_EQ(m->fixed.at("factor").int64_param(), 8);
  EXPECT_EQ(m->fixed.at("original_max_position").int64_param(), 8192);
  // The tensors announce the head size.
  EXPECT_EQ(FindInput(*m, "query")->dims.back(), 128);
  EXPECT_EQ(FindOutput(*m, "key_out")->dims.back(), 128);
  EXPECT_EQ(FindInput(*m, "position_ids")->dims.back(), -1);
  // ModelConfig shows what is fixed.
  inference::ModelConfig c = ConfigOf(*m);
  EXPECT_EQ(c.parameters().at("base").string_value(), "500000");
  EXPECT_EQ(c.parameters().at("scaling").string_value(), "llama3");
}

TEST(ModelFileTest, ExamplesLoad) {
  for (const char* f : {"qwen2-vl-7b-mrope", "alibi-8-heads"}) {
    absl::StatusOr<Model> m = ParseModelFile(f, ReadDeployed(std::string(f) + ".json"));
    EXPECT_TRUE(m.ok()) << f << ": " << m.status();
  }
  absl::StatusOr<Model> q = ParseModelFile("q", ReadDeployed("qwen2-vl-7b-mrope.json"));
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->fixed.at("sections").string_param(), "16,24,24");
  EXPECT_EQ(FindInput(*q, "position_ids")->dims, (std::vector<int64_t>{-1, -1, 3}));
}

TEST(ModelFileTest, NumbersKeepTheirValues) {
  absl::StatusOr<Model> m =
      ParseModelFile("m", R"({"operation": "rope", "parameters": {"base": 10000.5, "factor": 0.1,
               "short_factor": [1, 1.5, 0.1, 1e-300]}})");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->fixed.at("base").double_param(), 10000.5);
  EXPECT_EQ(m->fixed.at("factor").double_param(), 0.1);
  EXPECT_EQ(m->fixed.at("short_factor").string_param(), "1,1.5,0.1,1e-300");
}

TEST(ModelFileTest, HostileFilesAreRefusedByName) {
  ExpectRefused("", "not a JSON object");
  ExpectRefused("[1, 2]", "not a JSON object");
  ExpectRefused("{\"operation\": \"rope\"", "not a JSON object");
  ExpectRefused("{}", "\"operation\" is missing");
  ExpectRefused(R"({"operation": "rope", "colour": 1})", "unknown key \"colour\"");
  ExpectRefused(R"({"operation": "warp"})", "\"operation\" must be one of");
  ExpectRefused(R"({"operation": 3})", "got the number 3");
  ExpectRefused(R"({"operation": "rope", "parameters": {"rotary_dm": 64}})",
                "no parameter \"rotary_dm\"");
  ExpectRefused(R"({"operation": "rope", "parameters": {"rotary_dim": 64.5}})",
                "\"rotary_dim\" must be an integer");
  ExpectRefused(R"({"operation": "rope", "parameters": {"style": 1}})",
                "\"style\" must be a string");
  ExpectRefused(R"({"operation": "rope", "parameters": {"style": "sideways"}})", "style");
  ExpectRefused(R"({"operation": "rope", "parameters": {"base": "NaN"}})", "finite");
  ExpectRefused(R"({"operation": "rope", "parameters": {"base": "Infinity"}})", "finite");
  ExpectRefused(R"({"operation": "rope", "parameters": {"base": 1e999}})", "");
  ExpectRefused(R"({"operation": "rope", "parameters": {"base": null}})", "parameters.base");
  ExpectRefused(R"({"operation": "rope", "parameters": {"base": {"x": 1}}})", "an object");
  ExpectRefused(R"({"operation": "rope", "parameters": {"base": [1, 2]}})", "a single value");
  ExpectRefused(R"({"operation": "rope", "parameters": {"short_factor": [1, "a"]}})",
                "parameters.short_factor[1]");
  ExpectRefused(R"({"operation": "rope", "parameters": {"short_factor": []}})", "empty");
  ExpectRefused(R"({"operation": "rope", "parameters": {"priority": 1}})", "scheduling parameter");
  ExpectRefused(R"({"operation": "rope", "parameters": 5})", "\"parameters\" must be an object");
  ExpectRefused(R"({"operation": "rope", "head_dim": 127})", "head_dim");
  ExpectRefused(R"({"operation": "rope", "head_dim": 1e9})", "head_dim");
  ExpectRefused(R"({"operation": "sinusoidal", "head_dim": 64})", "for operation rope");
  ExpectRefused(R"({"operation": "rope", "description": "a\u0001b"})", "description");
  ExpectRefused(R"({"operation": "sinusoidal", "parameters": {"scaling": "yarn"}})",
                "no parameter \"scaling\"");
  ExpectRefused(std::string(kMaxModelFileBytes + 1, ' '), "over the limit");
  // Deep nesting is refused, not a stack overflow.
  ExpectRefused(R"({"operation": "rope", "parameters": {"base": )" + std::string(5000, '[') +
                    std::string(5000, ']') + "}}",
                "");
}

const nlohmann::json& HfFixtures() {
  static const nlohmann::json* fixtures = [] {
    std::ifstream in(POSENC_HF_FIXTURES);
    std::stringstream ss;
    ss << in.rdbuf();
    return new nlohmann::json(nlohmann::json::parse(ss.str()));
  }();
  return *fixtures;
}

std::string HfConfigOf(const std::string& family) {
  for (const nlohmann::json& c : HfFixtures().at("configs")) {
    if (c.at("name") == family) return c.at("config").get<std::string>();
  }
  ADD_FAILURE() << "no fixture " << family;
  return "{}";
}

// The options a request to `model` giving `request` is rotated with.
absl::StatusOr<RopeOptions> OptionsOf(const Model& model, const Parameters& request,
                                      int64_t query_head_dim = 0) {
  Parameters merged;
  POSENC_ASSIGN_OR_RETURN(const Parameters* p, ParametersFor(model, request, &merged));
  ParameterReader reader(*p);
  RopeOptions o;
  BackendChoice backend = BackendChoice::kDefault;
  POSENC_RETURN_IF_ERROR(ReadRopeOptions(reader, &o, &backend, query_head_dim));
  POSENC_RETURN_IF_ERROR(reader.Finish(model.name));
  return o;
}

void ExpectSameOptions(const RopeOptions& a, const RopeOptions& b) {
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
  EXPECT_EQ(x.truncate, y.truncate);
  EXPECT_EQ(x.attention_factor, y.attention_factor);
  EXPECT_EQ(x.low_freq_factor, y.low_freq_factor);
  EXPECT_EQ(x.high_freq_factor, y.high_freq_factor);
  EXPECT_EQ(x.short_factor, y.short_factor);
  EXPECT_EQ(x.long_factor, y.long_factor);
  EXPECT_EQ(x.longrope_mode, y.longrope_mode);
  EXPECT_EQ(x.inv_freq, y.inv_freq);
}

// Every family of tests/conformance/hf/hf_fixtures.json (those hf_config_agreement_test
// checks against transformers): a model file embedding the config rotates
// with exactly the options, frequencies and attention scale of a request to
// the built-in rope model sending the same config as its hf_config.
TEST(ModelFileTest, HfConfigGivesWhatTheRequestLevelHfConfigGives) {
  const nlohmann::json& configs = HfFixtures().at("configs");
  ASSERT_EQ(configs.size(), 17u);
  for (const nlohmann::json& c : configs) {
    const std::string family = c.at("name").get<std::string>();
    SCOPED_TRACE(family);
    const std::string config = c.at("config").get<std::string>();
    absl::StatusOr<Model> m =
        ParseModelFile(family, R"({"operation": "rope", "hf_config": )" + config + "}");
    ASSERT_TRUE(m.ok()) << m.status();
    const int64_t head_dim = c.at("head_dim").get<int64_t>();
    EXPECT_EQ(m->head_dim, head_dim);
    EXPECT_EQ(FindInput(*m, "query")->dims.back(), head_dim);
    const int64_t axes = c.contains("sections") ? 3 : -1;
    EXPECT_EQ(FindInput(*m, "position_ids")->dims.back(), axes);
    EXPECT_FALSE(m->fixed.contains("hf_config"));

    absl::StatusOr<RopeOptions> from_file = OptionsOf(*m, {});
    ASSERT_TRUE(from_file.ok()) << from_file.status();
    Parameters request;
    request["hf_config"].set_string_param(config);
    absl::StatusOr<RopeOptions> from_request =
        OptionsOf(BuiltInModel(ModelKind::kRope), request, head_dim);
    ASSERT_TRUE(from_request.ok()) << from_request.status();
    ExpectSameOptions(*from_file, *from_request);
    EXPECT_EQ(from_file->rotary_dim, c.at("rotary_dim").get<int64_t>());

    for (const nlohmann::json& r : c.at("results")) {
      const int64_t L = r.at("seq_len");
      SCOPED_TRACE(L);
      auto a = ResolveFrequencies(*from_file, from_file->rotary_dim, L);
      auto b = ResolveFrequencies(*from_request, from_request->rotary_dim, L);
      ASSERT_TRUE(a.ok() && b.ok());
      EXPECT_EQ(a->inv_freq, b->inv_freq);  // bit for bit
      EXPECT_EQ(a->attention_scale, b->attention_scale);
      // And both are transformers' (as hf_config_agreement_test checks).
      const auto want = r.at("inv_freq").get<std::vector<double>>();
      ASSERT_EQ(a->inv_freq.size(), want.size());
      for (size_t k = 0; k < want.size(); ++k) {
        EXPECT_NEAR(a->inv_freq[k], want[k], 4e-7 * want[k]) << "slot " << k;
      }
      EXPECT_NEAR(a->attention_scale, r.at("attention_scale").get<double>(), 1e-6);
    }
  }
}

TEST(ModelFileTest, HfConfigBesideParametersFollowsTheRequestRules) {
  const std::string llama = HfConfigOf("llama-3.1-8b");
  // What the config does not determine stays the file's; what it does may be
  // given only with the config's value.
  const std::string params =
      R"("parameters": {"layout": "bhsd", "inverse": true, "base": 500000, "rotary_dim": 128})";
  absl::StatusOr<Model> m =
      ParseModelFile("llama", R"({"operation": "rope", "head_dim": 128, )" + params +
                                  R"(, "hf_config": )" + llama + "}");
  ASSERT_TRUE(m.ok()) << m.status();
  Parameters request;
  request["hf_config"].set_string_param(llama);
  request["layout"].set_string_param("bhsd");
  request["inverse"].set_bool_param(true);
  request["base"].set_int64_param(500000);
  absl::StatusOr<RopeOptions> from_file = OptionsOf(*m, {});
  absl::StatusOr<RopeOptions> from_request = OptionsOf(BuiltInModel(ModelKind::kRope), request);
  ASSERT_TRUE(from_file.ok() && from_request.ok()) << from_file.status() << from_request.status();
  ExpectSameOptions(*from_file, *from_request);
  EXPECT_EQ(from_file->layout, RopeLayout::kBHSD);
  EXPECT_TRUE(from_file->inverse);
  EXPECT_EQ(from_file->scaling.type, ScalingType::kLlama3);

  // ModelConfig shows what the config resolved to.
  inference::ModelConfig config = ConfigOf(*m);
  EXPECT_EQ(config.parameters().at("scaling").string_value(), "llama3");
  EXPECT_EQ(config.parameters().at("factor").string_value(), "8");
  EXPECT_EQ(config.parameters().at("original_max_position").string_value(), "8192");

  // A family that implies no style leaves it to requests (HF's rotate_half
  // is NEOX; GPTJ stays possible for permuted weights), as beside a
  // request's hf_config.
  Parameters gptj;
  gptj["style"].set_string_param("gptj");
  absl::StatusOr<RopeOptions> o = OptionsOf(*m, gptj);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->style, RopeStyle::kGptj);
  // The scaling is the config's: a scaling parameter it sets is fixed, one
  // it leaves unset is closed too.
  for (const char* name : {"factor", "beta_fast", "scaling", "base", "hf_config"}) {
    Parameters r;
    r[name].set_string_param("2");
    absl::StatusOr<RopeOptions> refused = OptionsOf(*m, r);
    ASSERT_FALSE(refused.ok()) << name;
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(refused.status().message().find(absl::StrCat("parameter \"", name, "\" is")),
              std::string::npos)
        << refused.status();
  }
  Parameters unset_scaling;
  unset_scaling["beta_fast"].set_double_param(2);
  const absl::Status closed = OptionsOf(*m, unset_scaling).status();
  EXPECT_NE(closed.message().find("determined by model llama's hf_config (its scaling: llama3)"),
            std::string::npos)
      << closed;

  // M-RoPE and GPT-J styles come from the config and are fixed.
  absl::StatusOr<Model> vl = ParseModelFile(
      "vl", R"({"operation": "rope", "hf_config": )" + HfConfigOf("qwen2-vl-7b") + "}");
  ASSERT_TRUE(vl.ok()) << vl.status();
  EXPECT_EQ(vl->fixed.at("sections").string_param(), "16,24,24");
  EXPECT_EQ(vl->fixed.at("axis_mode").string_param(), "mrope");
  absl::StatusOr<Model> gptj_model =
      ParseModelFile("j", R"({"operation": "rope", "hf_config": )" + HfConfigOf("gpt-j-6b") + "}");
  ASSERT_TRUE(gptj_model.ok()) << gptj_model.status();
  EXPECT_EQ(gptj_model->fixed.at("style").string_param(), "gptj");
}

TEST(ModelFileTest, BadHfConfigsAreRefusedAtLoad) {
  const std::string llama = HfConfigOf("llama-3.1-8b");
  const auto with = [](const std::string& rest) {
    return R"({"operation": "rope", )" + rest + "}";
  };
  ExpectRefused(with(R"("hf_config": "config.json")"),
                "\"hf_config\" must be an object (the model's config.json, or its RoPE fields), "
                "got the string \"config.json\"");
  ExpectRefused(with(R"("hf_config": [1])"), "\"hf_config\" must be an object");
  ExpectRefused(R"({"operation": "sinusoidal", "hf_config": {"rope_theta": 1}})",
                "\"hf_config\" is for operation rope, not sinusoidal");
  ExpectRefused(with(R"("hf_config": {"head_dim": 8, "rope_scaling": {"type": "linear",
                         "factor": "8"}})"),
                "hf_config.rope_scaling.factor must be a number, got a string");
  ExpectRefused(with(R"("hf_config": {"head_dim": 8, "rope_scaling": {"type": "warp"}})"),
                "hf_config.rope_scaling");
  ExpectRefused(with(R"("hf_config": {"head_dim": "x"})"),
                "hf_config.head_dim must be an integer, got a string");
  ExpectRefused(with(R"("hf_config": {"head_dim": 7})"), "hf_config");
  ExpectRefused(with(R"("parameters": {"base": 10000}, "hf_config": )" + llama),
                "base is 10000 but hf_config gives 500000");
  ExpectRefused(with(R"("parameters": {"rotary_dim": 64}, "hf_config": )" + llama),
                "rotary_dim is 64 but hf_config gives 128");
  ExpectRefused(with(R"("parameters": {"factor": 8}, "hf_config": )" + llama),
                "scaling and hf_config are both set");
  ExpectRefused(with(R"("parameters": {"truncate": true}, "hf_config": )" + llama),
                "scaling and hf_config are both set");
  ExpectRefused(with(R"("head_dim": 64, "hf_config": )" + llama),
                "\"head_dim\" is 64 but hf_config gives 128");
  ExpectRefused(with(R"("parameters": {"hf_config": "{}"})"),
                "parameters.hf_config: give the HF config as the file's top-level");
  ExpectRefused(with(R"("parameters": {"rotary_dm": 64}, "hf_config": )" + llama),
                "no parameter \"rotary_dm\"");
  // Nesting within the file's own parser limit but past hf_config's.
  ExpectRefused(with(R"("hf_config": {"a": )" + std::string(20, '[') + std::string(20, ']') + "}"),
                "hf_config must nest");
}

TEST(ModelFileTest, NamesAreRestricted) {
  EXPECT_EQ(ErrorOf(R"({"operation": "rope"})", "llama-3.1_8b"), "loaded");
  for (const std::string& bad :
       std::vector<std::string>{"", ".hidden", "-x", "a b", "a/b", "ä", std::string(65, 'a')}) {
    EXPECT_NE(ErrorOf(R"({"operation": "rope"})", bad).find("model name"), std::string::npos)
        << bad;
  }
}

std::vector<std::string> NamesOf(const std::vector<TensorSpec>& specs) {
  std::vector<std::string> names;
  for (const TensorSpec& t : specs) names.push_back(std::string(t.name) + (t.optional ? "?" : ""));
  return names;
}

// "inputs" keeps the operation's inputs it lists, in the operation's
// order, each required (for perf_analyzer over shared memory, which
// refuses models with optional inputs); RoPE's key_out goes with key.
TEST(ModelFileTest, InputsListTheOnesTheModelTakesEachRequired) {
  using Names = std::vector<std::string>;
  absl::StatusOr<Model> m = ParseModelFile("m", R"({"operation": "sinusoidal"})");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(NamesOf(m->inputs), (Names{"x", "position_ids?", "offsets?", "cu_seqlens?"}));
  m = ParseModelFile("m", R"({"operation": "sinusoidal", "inputs": ["x"]})");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(NamesOf(m->inputs), (Names{"x"}));
  EXPECT_EQ(NamesOf(m->outputs), (Names{"y"}));
  m = ParseModelFile("m", R"({"operation": "attention_bias", "inputs": ["logits"],
                              "parameters": {"causal": true}})");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(NamesOf(m->inputs), (Names{"logits"}));
  EXPECT_EQ(NamesOf(m->outputs), (Names{"bias", "slopes"}));
  m = ParseModelFile("m", R"({"operation": "attention_bias", "inputs": []})");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(m->inputs.empty());
  m = ParseModelFile("m", R"({"operation": "rope", "inputs": ["offsets", "key", "query"]})");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(NamesOf(m->inputs), (Names{"query", "key", "offsets"}));
  EXPECT_EQ(NamesOf(m->outputs), (Names{"query_out", "key_out"}));
  m = ParseModelFile("m", R"({"operation": "rope", "inputs": ["query"]})");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(NamesOf(m->outputs), (Names{"query_out"})) << "no key, no key_out";

  ExpectRefused(R"({"operation": "rope", "inputs": "query"})",
                "\"inputs\" must be a list of distinct inputs of rope (query, key, position_ids, "
                "offsets, cu_seqlens), got the string \"query\"");
  ExpectRefused(R"({"operation": "rope", "inputs": ["key"]})",
                "\"inputs\" must list \"query\", which rope requires");
  ExpectRefused(R"({"operation": "rope", "inputs": ["query", "query"]})",
                "\"inputs[1]\" must be an input not listed before, got the string \"query\"");
  ExpectRefused(R"({"operation": "sinusoidal", "inputs": ["x", "logits"]})",
                "\"inputs[1]\" must be one of x, position_ids, offsets, cu_seqlens");
  ExpectRefused(R"({"operation": "sinusoidal", "inputs": ["x", 3]})", "got the number 3");
  ExpectRefused(R"({"operation": "sinusoidal", "inputs": ["x", "x", "x", "x", "x"]})",
                "got a list of 5 items");
}

TEST(ModelFileTest, LearnedMayLeaveTheTableToRequests) {
  EXPECT_EQ(ErrorOf(R"({"operation": "learned"})"), "loaded");
  EXPECT_EQ(ErrorOf(R"({"operation": "learned", "parameters": {"table": "gpt2/wpe"}})"), "loaded");
}

TEST(ModelFileTest, RequestsMayGiveOnlyWhatTheFileLeavesOpen) {
  absl::StatusOr<Model> m =
      ParseModelFile("llama", R"({"operation": "rope", "parameters": {"base": 500000}})");
  ASSERT_TRUE(m.ok());
  Parameters request, merged;
  request["rotary_dim"].set_int64_param(64);
  absl::StatusOr<const Parameters*> p = ParametersFor(*m, request, &merged);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ((*p)->at("base").int64_param(), 500000);
  EXPECT_EQ((*p)->at("rotary_dim").int64_param(), 64);
  request["base"].set_double_param(10000);
  p = ParametersFor(*m, request, &merged);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("\"base\" is fixed by model llama (500000)"),
            std::string::npos)
      << p.status();
}

}  // namespace
}  // namespace posenc::server::kserve
