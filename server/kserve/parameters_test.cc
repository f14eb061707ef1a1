// The KServe v2 front's request reading, without a server: parameters into
// kernel options and inputs out of the message (the real-client tests are
// tests/kserve).
#include "kserve/parameters.h"

#include <cstdio>
#include <cstring>
#include <random>
#include <tuple>

#include "gtest/gtest.h"
#include "kserve/tensors.h"

namespace posenc::server::kserve {
namespace {

using inference::ModelInferRequest;

TEST(KServeParameters, NumbersComeAsAnyNumericKindOrString) {
  ModelInferRequest req;
  (*req.mutable_parameters())["base"].set_int64_param(500000);
  (*req.mutable_parameters())["factor"].set_string_param("8");
  (*req.mutable_parameters())["beta_fast"].set_double_param(32.5);
  (*req.mutable_parameters())["rotary_dim"].set_double_param(64.0);  // whole: an integer
  (*req.mutable_parameters())["style"].set_string_param("GPTJ");
  (*req.mutable_parameters())["scaling"].set_string_param("yarn");
  (*req.mutable_parameters())["priority"].set_int64_param(1);  // Triton's, ignored
  ParameterReader p(req.parameters());
  RopeOptions o;
  BackendChoice backend = BackendChoice::kDefault;
  ASSERT_TRUE(ReadRopeOptions(p, &o, &backend).ok());
  ASSERT_TRUE(p.Finish("rope").ok());
  EXPECT_EQ(o.base, 500000.0);
  EXPECT_EQ(o.scaling.factor, 8.0);
  EXPECT_EQ(o.scaling.beta_fast, 32.5);
  EXPECT_EQ(o.rotary_dim, 64);
  EXPECT_EQ(o.style, RopeStyle::kGptj);
  EXPECT_EQ(o.scaling.type, ScalingType::kYarn);
  EXPECT_FALSE(o.scaling.mscale.has_value());  // absent stays absent
  EXPECT_EQ(backend, BackendChoice::kDefault);
}

constexpr char kQwenYarn[] = R"({"model_type": "qwen2", "hidden_size": 3584,
  "num_attention_heads": 28, "max_position_embeddings": 131072, "rope_theta": 1000000.0,
  "rope_scaling": {"factor": null, "original_max_position_embeddings": 32768, "type": "yarn"}})";

TEST(KServeParameters, HfConfigResolvesAndMergesWithExplicitParameters) {
  ModelInferRequest req;
  (*req.mutable_parameters())["hf_config"].set_string_param(kQwenYarn);
  (*req.mutable_parameters())["layout"].set_string_param("bhsd");
  (*req.mutable_parameters())["rotary_dim"].set_int64_param(128);  // agrees
  ParameterReader p(req.parameters());
  RopeOptions o;
  BackendChoice backend = BackendChoice::kDefault;
  absl::Status read = ReadRopeOptions(p, &o, &backend, /*query_head_dim=*/128);
  ASSERT_TRUE(read.ok()) << read;
  ASSERT_TRUE(p.Finish("rope").ok());
  EXPECT_EQ(o.layout, RopeLayout::kBHSD);
  EXPECT_EQ(o.base, 1000000.0);
  EXPECT_EQ(o.scaling.type, ScalingType::kYarn);
  EXPECT_EQ(o.scaling.factor, 4.0);  // inferred: 131072 / 32768
  EXPECT_EQ(o.scaling.original_max_position, 32768);

  // Conflicts name both sides; any scaling parameter beside the config is one.
  for (auto [name, value, expect] :
       {std::tuple{"base", "10000", "base is 10000 but hf_config gives 1e+06"},
        {"rotary_dim", "64", "rotary_dim is 64 but hf_config gives 128"},
        {"factor", "8", "scaling and hf_config are both set"}}) {
    ModelInferRequest bad = req;
    (*bad.mutable_parameters())[name].set_string_param(value);
    ParameterReader q(bad.parameters());
    absl::Status s = ReadRopeOptions(q, &o, &backend, 128);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_NE(s.message().find(expect), std::string::npos) << s;
  }
  ParameterReader q(req.parameters());
  absl::Status s = ReadRopeOptions(q, &o, &backend, /*query_head_dim=*/64);
  EXPECT_NE(s.message().find("the query's head_dim is 64 but hf_config gives 128"),
            std::string::npos)
      << s;
}

TEST(KServeParameters, WrongKindsAndUnknownNamesAreRefusedByName) {
  struct Case {
    const char* name;
    inference::InferParameter value;
    const char* expect;  // in the message
  };
  auto param = [](auto set) {
    inference::InferParameter p;
    set(p);
    return p;
  };
  const Case cases[] = {
      {"base", param([](auto& p) { p.set_double_param(std::nan("")); }), "base"},
      {"base", param([](auto& p) { p.set_string_param("1e999"); }), "base"},
      {"base", param([](auto& p) { p.set_bool_param(true); }), "bool true"},
      {"rotary_dim", param([](auto& p) { p.set_double_param(2.5); }), "integer"},
      {"rotary_dim", param([](auto& p) { p.set_uint64_param(~uint64_t{0}); }), "rotary_dim"},
      {"inverse", param([](auto& p) { p.set_int64_param(1); }), "a bool"},
      {"style", param([](auto& p) { p.set_string_param("sideways"); }), "sideways"},
      {"hf_config", param([](auto& p) { p.set_string_param("{\"head_dim\": \"x\"}"); }),
       "hf_config.head_dim must be an integer, got a string"},
      {"hf_config", param([](auto& p) { p.set_int64_param(1); }), "hf_config"},
      {"short_factor", param([](auto& p) { p.set_string_param("1,x,3"); }), "\"x\""},
      {"rotary_dm", param([](auto& p) { p.set_int64_param(4); }), "rotary_dim"},
      // Counted and measured before anything is parsed or copied.
      {"sections", param([](auto& p) { p.set_string_param("1,1,1,1,1,1,1,1,1"); }),
       "at most 8 values, got 9"},
      {"long_factor", param([](auto& p) { p.set_string_param(std::string(40000, ',')); }),
       "at most 32768 values, got 40001"},
      {"hf_config", param([](auto& p) { p.set_string_param(std::string(3 << 20, ' ')); }),
       "at most 2097152 bytes, got 3145728"},
  };
  for (const Case& c : cases) {
    ModelInferRequest req;
    (*req.mutable_parameters())[c.name] = c.value;
    ParameterReader p(req.parameters());
    RopeOptions o;
    BackendChoice backend;
    absl::Status s = ReadRopeOptions(p, &o, &backend);
    if (s.ok()) s = p.Finish("rope");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_NE(s.message().find(c.name), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(c.expect), std::string::npos) << s.message();
  }
}

TEST(KServeTensors, RawContentsMoveIntactAndTypedContentsConvert) {
  const unsigned seed = std::random_device()();
  std::printf("seed %u\n", seed);
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 20; ++trial) {
    const int64_t n = std::uniform_int_distribution<int64_t>(0, 300)(rng);
    std::vector<float> values(n);
    for (float& v : values) v = std::normal_distribution<float>()(rng);
    std::string raw(n * 4, '\0');
    if (n > 0) std::memcpy(raw.data(), values.data(), raw.size());

    ModelInferRequest req;
    auto* q = req.add_inputs();
    q->set_name("query");
    q->set_datatype("BF16");
    q->add_shape(n);
    q->add_shape(2);  // n x 2 bf16 = the same bytes as n floats
    req.add_raw_input_contents(raw);
    auto* pos = req.add_inputs();
    pos->set_name("position_ids");
    pos->set_datatype("INT64");
    pos->add_shape(1);
    req.add_raw_input_contents(std::string(8, '\x07'));
    absl::StatusOr<std::vector<Input>> in = TakeInputs(&req);
    ASSERT_TRUE(in.ok()) << in.status();
    EXPECT_EQ((*in)[0].dtype, DType::kBFloat16);
    EXPECT_EQ((*in)[0].data, raw);
    EXPECT_TRUE(req.raw_input_contents(0).empty());  // moved, not copied

    ModelInferRequest typed;
    auto* x = typed.add_inputs();
    x->set_name("x");
    x->set_datatype("FP32");
    x->add_shape(n);
    for (float v : values) x->mutable_contents()->add_fp32_contents(v);
    absl::StatusOr<std::vector<Input>> t = TakeInputs(&typed);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ((*t)[0].data, raw);
  }
}

TEST(KServeTensors, MalformedInputsAreRefused) {
  auto one = [](const char* datatype, std::vector<int64_t> shape, std::string raw) {
    ModelInferRequest req;
    auto* q = req.add_inputs();
    q->set_name("query");
    q->set_datatype(datatype);
    for (int64_t d : shape) q->add_shape(d);
    req.add_raw_input_contents(std::move(raw));
    return req;
  };
  const std::pair<ModelInferRequest, const char*> cases[] = {
      {one("FP64", {1}, std::string(8, '\0')), "FP64"},
      {one("FP32", {3}, std::string(8, '\0')), "query"},
      {one("FP32", {-1}, ""), "query"},
      {one("FP32", {int64_t{1} << 40, int64_t{1} << 40}, std::string(4, '\0')), "query"},
  };
  for (const auto& [request, expect] : cases) {
    ModelInferRequest req = request;
    absl::StatusOr<std::vector<Input>> in = TakeInputs(&req);
    ASSERT_FALSE(in.ok()) << expect;
    EXPECT_EQ(in.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(in.status().message().find(expect), std::string::npos) << in.status();
  }
  ModelInferRequest unnamed = one("FP32", {1}, std::string(4, '\0'));
  unnamed.mutable_inputs(0)->clear_name();
  EXPECT_EQ(TakeInputs(&unnamed).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace posenc::server::kserve
