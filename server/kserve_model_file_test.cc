#include "kserve_model_file.h"

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kserve_infer.h"

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

TEST(ModelFileTest, HfConfigIsMarkedNotSupportedYet) {
  absl::StatusOr<Model> m =
      ParseModelFile("m", R"({"operation": "rope", "hf_config": {"rope_theta": 500000}})");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(m.status().message().find("not supported yet"), std::string::npos);
}

TEST(ModelFileTest, NamesAreRestricted) {
  EXPECT_EQ(ErrorOf(R"({"operation": "rope"})", "llama-3.1_8b"), "loaded");
  for (const std::string& bad :
       std::vector<std::string>{"", ".hidden", "-x", "a b", "a/b", "ä", std::string(65, 'a')}) {
    EXPECT_NE(ErrorOf(R"({"operation": "rope"})", bad).find("model name"), std::string::npos)
        << bad;
  }
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
