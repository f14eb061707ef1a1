// Hostile input over a real socket, against the real posenc-server binary:
// one case per class of attack the hardening review found (requests that
// wrapped sums, empty tensors with huge dimensions, unbounded heads,
// non-finite or degenerate parameters, answers over the transport's limit).
// Each must be answered with the right code and a message naming the field;
// afterwards the server must still answer health checks and compute a RoPE
// call correctly, and its memory must have stayed bounded.
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <future>
#include <limits>
#include <string>
#include <vector>

#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "kserve/grpc_service.grpc.pb.h"
#include "posenc/backend.h"
#include "posenc/client.h"
#include "posenc/v1/posenc.grpc.pb.h"
#include "server_process.h"
#include "test_tensors.h"

namespace posenc {
namespace {

using grpc::StatusCode;
constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();

// Server limits for the suite: small enough that byte-limit cases are cheap.
constexpr int64_t kMaxMessage = 4 * kMiB;
constexpr int64_t kMaxRequest = 8 * kMiB;
constexpr int64_t kMaxInflight = 64 * kMiB;

struct Case {
  std::string name;
  StatusCode code;
  std::string names;  // the message must contain this
  std::function<grpc::Status(v1::PositionalEncoding::Stub&, grpc::ClientContext&)> call;
};

// A valid fp32 query [1, 1, 1, 8] with the given shape written over it.
v1::RopeRequest Rope(std::vector<int64_t> shape = {1, 1, 1, 8}) {
  v1::RopeRequest r;
  r.mutable_query()->set_dtype(v1::DATA_TYPE_FLOAT32);
  int64_t n = 1;
  for (int64_t d : shape) {
    r.mutable_query()->add_shape(d);
    n *= d;
  }
  r.set_query_data(std::string(n > 0 && n < (1 << 20) ? n * 4 : 0, '\0'));
  return r;
}

void SetInts(v1::Tensor* t, std::vector<int64_t> shape, const std::vector<int64_t>& v) {
  t->set_dtype(v1::DATA_TYPE_INT64);
  for (int64_t d : shape) t->add_shape(d);
  t->set_data(std::string(reinterpret_cast<const char*>(v.data()), v.size() * 8));
}

grpc::Status CallRope(v1::PositionalEncoding::Stub& s, grpc::ClientContext& c,
                      const v1::RopeRequest& r) {
  v1::RopeResponse resp;
  return s.ApplyRope(&c, r, &resp);
}
grpc::Status CallBias(v1::PositionalEncoding::Stub& s, grpc::ClientContext& c,
                      const v1::AttentionBiasRequest& r) {
  v1::AttentionBiasResponse resp;
  return s.AttentionBias(&c, r, &resp);
}
grpc::Status CallTable(v1::PositionalEncoding::Stub& s, grpc::ClientContext& c,
                       const v1::EncodingTableRequest& r) {
  v1::EncodingTableResponse resp;
  return s.GetEncodingTable(&c, r, &resp);
}
grpc::Status CallAbsolute(v1::PositionalEncoding::Stub& s, grpc::ClientContext& c,
                          const v1::AbsoluteEncodingRequest& r) {
  v1::AbsoluteEncodingResponse resp;
  return s.AddAbsoluteEncoding(&c, r, &resp);
}

using Stub = v1::PositionalEncoding::Stub;

std::vector<Case> Cases() {
  const int64_t big = int64_t{1} << 62;
  return {
      // HF configs: JSON parsed on the server (wire::ResolveHfRope).
      {"hf_config_deep_nesting", StatusCode::INVALID_ARGUMENT, "hf_config must nest",
       [](Stub& s, grpc::ClientContext& c) {
         v1::RopeRequest r = Rope();
         r.set_hf_config(std::string(1 << 20, '['));  // would recurse a million deep
         return CallRope(s, c, r);
       }},
      {"hf_config_over_1mib", StatusCode::INVALID_ARGUMENT, "hf_config must be at most",
       [](Stub& s, grpc::ClientContext& c) {
         v1::RopeRequest r = Rope();
         r.set_hf_config("{\"head_dim\": 8, \"pad\": \"" + std::string(2 << 20, 'x') + "\"}");
         return CallRope(s, c, r);
       }},
      {"hf_config_wrong_type", StatusCode::INVALID_ARGUMENT,
       "hf_config.rope_scaling.factor must be a number, got a string",
       [](Stub& s, grpc::ClientContext& c) {
         v1::RopeRequest r = Rope();
         r.set_hf_config(R"({"head_dim": 8, "rope_scaling": {"type": "linear", "factor": "8"}})");
         return CallRope(s, c, r);
       }},
      {"hf_config_absurd_factor", StatusCode::INVALID_ARGUMENT, "hf_config.rope_scaling.factor",
       [](Stub& s, grpc::ClientContext& c) {
         v1::RopeRequest r = Rope();
         r.set_hf_config(R"({"head_dim": 8, "rope_scaling": {"type": "linear", "factor": 1e308}})");
         return CallRope(s, c, r);
       }},
      {"hf_config_conflicts_with_base", StatusCode::INVALID_ARGUMENT,
       "base is 10000 but hf_config gives 500000",
       [](Stub& s, grpc::ClientContext& c) {
         v1::RopeRequest r = Rope();
         r.set_base(10000);
         r.set_hf_config(R"({"head_dim": 8, "rope_theta": 500000})");
         return CallRope(s, c, r);
       }},
      // Sums that wrap to R passed validation and wrote past slot_axis.
      {"axial_dims_sum_wraps", StatusCode::INVALID_ARGUMENT, "axis_dims[0]",
       [](Stub& s, grpc::ClientContext& c) {
         v1::RopeRequest r = Rope();
         r.set_axis_mode(v1::AXIS_MODE_AXIAL);
         for (int64_t d : {big, big, big, big + 8}) r.add_axis_dims(d);
         SetInts(r.mutable_position_ids(), {1, 1, 4}, {0, 0, 0, 0});
         return CallRope(s, c, r);
       }},
      {"mrope_sections_sum_wraps", StatusCode::INVALID_ARGUMENT, "sections[0]",
       [](Stub& s, grpc::ClientContext& c) {
         v1::RopeRequest r = Rope();
         r.set_axis_mode(v1::AXIS_MODE_MROPE);
         for (int64_t d : {big, big, big, big + 4}) r.add_sections(d);
         SetInts(r.mutable_position_ids(), {1, 1, 4}, {0, 0, 0, 0});
         return CallRope(s, c, r);
       }},
      {"too_many_axes", StatusCode::INVALID_ARGUMENT, "at most 8 axes",
       [](Stub& s, grpc::ClientContext& c) {
         v1::RopeRequest r = Rope({1, 1, 1, 18});
         r.set_axis_mode(v1::AXIS_MODE_MROPE);
         for (int i = 0; i < 9; ++i) r.add_sections(1);
         return CallRope(s, c, r);
       }},
      // Zero-element tensors whose other dimensions asked for huge plans.
      {"empty_query_huge_batch", StatusCode::INVALID_ARGUMENT, "query.shape[0] (batch)",
       [](Stub& s, grpc::ClientContext& c) {
         v1::RopeRequest r = Rope({int64_t{1} << 40, 0, 1, 2});
         return CallRope(s, c, r);
       }},
      {"empty_query_huge_seq", StatusCode::INVALID_ARGUMENT, "query.shape[1] (seq)",
       [](Stub& s, grpc::ClientContext& c) {
         v1::RopeRequest r = Rope({1, int64_t{1} << 40, 0, 128});
         return CallRope(s, c, r);
       }},
      {"empty_query_tokens_overflow", StatusCode::INVALID_ARGUMENT, "tokens",
       [](Stub& s, grpc::ClientContext& c) {
         v1::RopeRequest r = Rope({int64_t{1} << 20, int64_t{1} << 20, 0, 2});
         return CallRope(s, c, r);
       }},
      {"empty_query_huge_heads", StatusCode::INVALID_ARGUMENT, "query.shape[2] (heads)",
       [](Stub& s, grpc::ClientContext& c) {
         v1::RopeRequest r = Rope({1, 0, int64_t{1} << 40, 2});
         return CallRope(s, c, r);
       }},
      {"shape_product_overflows", StatusCode::INVALID_ARGUMENT, "query.shape",
       [](Stub& s, grpc::ClientContext& c) {
         v1::RopeRequest r = Rope({int64_t{1} << 40, 0, int64_t{1} << 40, int64_t{1} << 40});
         return CallRope(s, c, r);
       }},
      // Parameters that made outputs NaN/Inf or formed NaN angles.
      {"yarn_base_one", StatusCode::INVALID_ARGUMENT, "base",
       [](Stub& s, grpc::ClientContext& c) {
         v1::RopeRequest r = Rope();
         r.set_base(1.0);
         r.mutable_scaling()->set_type(v1::SCALING_TYPE_YARN);
         r.mutable_scaling()->set_factor(4);
         r.mutable_scaling()->set_original_max_position(4096);
         return CallRope(s, c, r);
       }},
      {"yarn_denormal_beta_fast", StatusCode::INVALID_ARGUMENT, "scaling.beta_fast",
       [](Stub& s, grpc::ClientContext& c) {
         v1::RopeRequest r = Rope();
         r.mutable_scaling()->set_type(v1::SCALING_TYPE_YARN);
         r.mutable_scaling()->set_factor(4);
         r.mutable_scaling()->set_original_max_position(4096);
         r.mutable_scaling()->set_beta_fast(std::numeric_limits<double>::denorm_min());
         return CallRope(s, c, r);
       }},
      {"yarn_mscale_nan", StatusCode::INVALID_ARGUMENT, "scaling.mscale",
       [](Stub& s, grpc::ClientContext& c) {
         v1::RopeRequest r = Rope();
         r.mutable_scaling()->set_type(v1::SCALING_TYPE_YARN);
         r.mutable_scaling()->set_factor(4);
         r.mutable_scaling()->set_original_max_position(4096);
         r.mutable_scaling()->set_mscale(std::nan(""));
         r.mutable_scaling()->set_mscale_all_dim(1);
         return CallRope(s, c, r);
       }},
      {"longrope_original_one", StatusCode::INVALID_ARGUMENT, "scaling.original_max_position",
       [](Stub& s, grpc::ClientContext& c) {
         v1::RopeRequest r = Rope();
         r.mutable_scaling()->set_type(v1::SCALING_TYPE_LONGROPE);
         r.mutable_scaling()->set_factor(4);
         r.mutable_scaling()->set_original_max_position(1);
         for (int i = 0; i < 4; ++i) {
           r.mutable_scaling()->add_short_factor(1);
           r.mutable_scaling()->add_long_factor(1);
         }
         return CallRope(s, c, r);
       }},
      {"attention_factor_huge", StatusCode::INVALID_ARGUMENT, "scaling.attention_factor",
       [](Stub& s, grpc::ClientContext& c) {
         v1::RopeRequest r = Rope();
         r.mutable_scaling()->set_type(v1::SCALING_TYPE_YARN);
         r.mutable_scaling()->set_factor(4);
         r.mutable_scaling()->set_original_max_position(4096);
         r.mutable_scaling()->set_attention_factor(1e300);
         return CallRope(s, c, r);
       }},
      {"linear_factor_tiny", StatusCode::INVALID_ARGUMENT, "scaling",
       [](Stub& s, grpc::ClientContext& c) {
         v1::RopeRequest r = Rope();
         r.mutable_scaling()->set_type(v1::SCALING_TYPE_LINEAR);
         r.mutable_scaling()->set_factor(1e-300);
         return CallRope(s, c, r);
       }},
      // Positions near the int64 limits (signed overflow).
      {"offset_int64_max", StatusCode::INVALID_ARGUMENT, "offsets[0]",
       [](Stub& s, grpc::ClientContext& c) {
         v1::RopeRequest r = Rope();
         SetInts(r.mutable_offsets(), {1}, {kInt64Max});
         return CallRope(s, c, r);
       }},
      {"position_int64_min", StatusCode::INVALID_ARGUMENT, "position",
       [](Stub& s, grpc::ClientContext& c) {
         v1::RopeRequest r = Rope();
         SetInts(r.mutable_position_ids(), {1, 1}, {kInt64Min});
         return CallRope(s, c, r);
       }},
      {"cu_seqlens_past_tokens", StatusCode::INVALID_ARGUMENT, "cu_seqlens",
       [](Stub& s, grpc::ClientContext& c) {
         v1::RopeRequest r = Rope({1, 1, 8});
         r.set_layout(v1::ROPE_LAYOUT_THD);
         SetInts(r.mutable_cu_seqlens(), {3}, {0, kInt64Max, 1});
         return CallRope(s, c, r);
       }},
      // Absolute encodings and tables.
      {"absolute_empty_huge_batch", StatusCode::INVALID_ARGUMENT, "x.shape[0] (batch)",
       [](Stub& s, grpc::ClientContext& c) {
         v1::AbsoluteEncodingRequest r;
         r.mutable_sinusoidal();
         r.mutable_x()->set_dtype(v1::DATA_TYPE_FLOAT32);
         for (int64_t d : {int64_t{1} << 40, int64_t{0}, int64_t{4}}) r.mutable_x()->add_shape(d);
         return CallAbsolute(s, c, r);
       }},
      {"absolute_x_scale_huge", StatusCode::INVALID_ARGUMENT, "x_scale",
       [](Stub& s, grpc::ClientContext& c) {
         v1::AbsoluteEncodingRequest r;
         r.mutable_sinusoidal();
         r.mutable_x()->set_dtype(v1::DATA_TYPE_FLOAT32);
         r.mutable_x()->add_shape(1);
         r.mutable_x()->add_shape(4);
         r.set_x_data(std::string(16, '\0'));
         r.set_x_scale(1e300);
         return CallAbsolute(s, c, r);
       }},
      {"sinusoidal_base_nan", StatusCode::INVALID_ARGUMENT, "base",
       [](Stub& s, grpc::ClientContext& c) {
         v1::EncodingTableRequest r;
         r.mutable_sinusoidal()->set_base(std::nan(""));
         r.set_dim(8);
         r.set_count(2);
         return CallTable(s, c, r);
       }},
      {"table_dim_2_40", StatusCode::INVALID_ARGUMENT, "dim",
       [](Stub& s, grpc::ClientContext& c) {
         v1::EncodingTableRequest r;
         r.mutable_sinusoidal();
         r.set_dim(int64_t{1} << 40);
         return CallTable(s, c, r);
       }},
      {"table_count_2_40", StatusCode::INVALID_ARGUMENT, "count",
       [](Stub& s, grpc::ClientContext& c) {
         v1::EncodingTableRequest r;
         r.mutable_sinusoidal();
         r.set_dim(8);
         r.set_count(int64_t{1} << 40);
         return CallTable(s, c, r);
       }},
      // Answers beyond the byte limits: refused before they are computed.
      {"table_over_tensor_limit", StatusCode::RESOURCE_EXHAUSTED, "--max_request_bytes",
       [](Stub& s, grpc::ClientContext& c) {
         v1::EncodingTableRequest r;
         r.mutable_sinusoidal();
         r.set_dim(1024);
         r.set_count(4096);  // 16 MiB of float32
         return CallTable(s, c, r);
       }},
      {"table_over_message_limit", StatusCode::RESOURCE_EXHAUSTED, "--max_message_bytes",
       [](Stub& s, grpc::ClientContext& c) {
         v1::EncodingTableRequest r;
         r.mutable_sinusoidal();
         r.set_dim(16);
         r.set_count(98304);  // 6 MiB: under the tensor limit, over the message limit
         return CallTable(s, c, r);
       }},
      // Attention bias: unbounded heads, batch and element counts.
      {"bias_heads_2_40_no_queries", StatusCode::INVALID_ARGUMENT, "num_heads",
       [](Stub& s, grpc::ClientContext& c) {
         v1::AttentionBiasRequest r;
         r.set_num_heads(int64_t{1} << 40);
         r.set_q_len(0);
         r.set_k_len(4);
         return CallBias(s, c, r);
       }},
      {"bias_batch_2_40_no_queries", StatusCode::INVALID_ARGUMENT, "batch",
       [](Stub& s, grpc::ClientContext& c) {
         v1::AttentionBiasRequest r;
         r.set_num_heads(4);
         r.set_batch(int64_t{1} << 40);
         r.set_q_len(0);
         r.set_k_len(4);
         return CallBias(s, c, r);
       }},
      {"bias_nine_byte_request_2_22_heads", StatusCode::INVALID_ARGUMENT, "num_heads",
       [](Stub& s, grpc::ClientContext& c) {
         v1::AttentionBiasRequest r;
         r.set_num_heads(int64_t{1} << 22);
         r.set_q_len(1);
         r.set_k_len(1);
         return CallBias(s, c, r);
       }},
      {"bias_heads_2_62_slope_loop", StatusCode::INVALID_ARGUMENT, "num_heads",
       [](Stub& s, grpc::ClientContext& c) {
         v1::AttentionBiasRequest r;
         r.set_num_heads(int64_t{1} << 62);
         r.set_q_len(1);
         r.set_k_len(1);
         return CallBias(s, c, r);
       }},
      {"bias_elements_overflow", StatusCode::INVALID_ARGUMENT, "elements",
       [](Stub& s, grpc::ClientContext& c) {
         v1::AttentionBiasRequest r;
         r.set_num_heads(int64_t{1} << 16);
         r.set_batch(int64_t{1} << 20);
         r.set_q_len(int64_t{1} << 31);
         r.set_k_len(int64_t{1} << 31);
         return CallBias(s, c, r);
       }},
      {"bias_q_offset_int64_max", StatusCode::INVALID_ARGUMENT, "q_offset",
       [](Stub& s, grpc::ClientContext& c) {
         v1::AttentionBiasRequest r;
         r.set_num_heads(2);
         r.set_q_len(2);
         r.set_k_len(2);
         r.set_q_offset(kInt64Max);
         return CallBias(s, c, r);
       }},
      {"bias_slope_nan", StatusCode::INVALID_ARGUMENT, "slopes[0]",
       [](Stub& s, grpc::ClientContext& c) {
         v1::AttentionBiasRequest r;
         r.set_num_heads(1);
         r.set_q_len(2);
         r.set_k_len(2);
         r.add_slopes(std::nan(""));
         return CallBias(s, c, r);
       }},
      {"bias_slope_huge", StatusCode::INVALID_ARGUMENT, "slopes[0]",
       [](Stub& s, grpc::ClientContext& c) {
         v1::AttentionBiasRequest r;
         r.set_num_heads(1);
         r.set_q_len(2);
         r.set_k_len(2);
         r.add_slopes(1e300);
         return CallBias(s, c, r);
       }},
      {"bias_window_negative", StatusCode::INVALID_ARGUMENT, "window",
       [](Stub& s, grpc::ClientContext& c) {
         v1::AttentionBiasRequest r;
         r.set_num_heads(1);
         r.set_q_len(2);
         r.set_k_len(2);
         r.set_window(-5);
         return CallBias(s, c, r);
       }},
      {"bias_k_starts_int64_min", StatusCode::INVALID_ARGUMENT, "k_starts[0]",
       [](Stub& s, grpc::ClientContext& c) {
         v1::AttentionBiasRequest r;
         r.set_num_heads(1);
         r.set_q_len(2);
         r.set_k_len(2);
         SetInts(r.mutable_k_starts(), {2}, {kInt64Min, 0});
         return CallBias(s, c, r);
       }},
      {"bias_k_starts_past_k_lens", StatusCode::INVALID_ARGUMENT, "k_starts[1]",
       [](Stub& s, grpc::ClientContext& c) {
         v1::AttentionBiasRequest r;
         r.set_num_heads(1);
         r.set_q_len(2);
         r.set_k_len(4);
         SetInts(r.mutable_k_lens(), {2}, {4, 1});
         SetInts(r.mutable_k_starts(), {2}, {0, kInt64Max});
         return CallBias(s, c, r);
       }},
      {"bias_k_starts_2_40_elements_no_data", StatusCode::INVALID_ARGUMENT, "k_starts",
       [](Stub& s, grpc::ClientContext& c) {
         v1::AttentionBiasRequest r;
         r.set_num_heads(1);
         r.set_q_len(2);
         r.set_k_len(2);
         SetInts(r.mutable_k_starts(), {int64_t{1} << 40}, {});
         return CallBias(s, c, r);
       }},
      {"bias_over_tensor_limit", StatusCode::RESOURCE_EXHAUSTED, "--max_request_bytes",
       [](Stub& s, grpc::ClientContext& c) {
         v1::AttentionBiasRequest r;
         r.set_num_heads(64);
         r.set_q_len(256);
         r.set_k_len(256);  // 16 MiB of float32
         return CallBias(s, c, r);
       }},
  };
}

class HostileInput : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { StartServer(); }
  static void StartServer() {
    delete server_;
    server_ = new testing::ServerProcess;
    ASSERT_TRUE(server_->Start(POSENC_SERVER_BINARY,
                               {"--threads=2", "--max_message_bytes=" + std::to_string(kMaxMessage),
                                "--max_request_bytes=" + std::to_string(kMaxRequest),
                                "--max_inflight_bytes=" + std::to_string(kMaxInflight)}))
        << server_->log_text();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }

  // The server answers health, computes a RoPE call exactly as the local CPU
  // backend does, and has not grown past a bound.
  static void ExpectStillServing(const std::string& after) {
    ASSERT_TRUE(server_->Alive()) << "the server died after " << after << ": "
                                  << server_->log_text();
    auto health = grpc::health::v1::Health::NewStub(server_->channel());
    grpc::ClientContext hctx;
    hctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::health::v1::HealthCheckResponse hresp;
    ASSERT_TRUE(health->Check(&hctx, grpc::health::v1::HealthCheckRequest(), &hresp).ok())
        << "health after " << after;
    EXPECT_EQ(hresp.status(), grpc::health::v1::HealthCheckResponse::SERVING);

    testing::Bytes q = testing::RandomTensor(DType::kFloat32, 3 * 4 * 64);
    v1::RopeRequest req;
    SetTensor(TensorView{DType::kFloat32, {1, 3, 4, 64}, q.data(), q.size()}, req.mutable_query(),
              req.mutable_query_data());
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::RopeResponse resp;
    auto stub = v1::PositionalEncoding::NewStub(server_->channel());
    const grpc::Status s = stub->ApplyRope(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << "a good call after " << after << ": " << s.error_message();
    RopeTensors t;
    t.query = testing::Mutable(DType::kFloat32, {1, 3, 4, 64}, q);
    auto plan = PlanRope(RopeOptions{}, t);
    ASSERT_TRUE(plan.ok());
    ASSERT_TRUE(CreateCpuBackend(1)->ApplyRope(*plan, q.data(), nullptr, {}).ok());
    EXPECT_EQ(resp.query_data(), std::string(q.begin(), q.end())) << "after " << after;
  }

  static testing::ServerProcess* server_;
};
testing::ServerProcess* HostileInput::server_ = nullptr;

TEST_F(HostileInput, EveryClassIsRefusedByNameAndTheServerKeepsServing) {
  auto failures = [] {
    return ::testing::UnitTest::GetInstance()->current_test_info()->result()->total_part_count();
  };
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.name);
    const int failures_before = failures();
    auto stub = v1::PositionalEncoding::NewStub(server_->channel());
    grpc::ClientContext ctx;
    // Every refusal is immediate: a call still running after 10 s is a hang.
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    const grpc::Status s = c.call(*stub, ctx);
    EXPECT_EQ(s.error_code(), c.code) << c.name << ": " << s.error_message();
    EXPECT_NE(s.error_message().find(c.names), std::string::npos)
        << c.name << ": the message should name '" << c.names << "': " << s.error_message();
    ExpectStillServing(c.name);
    const bool passed = failures() == failures_before;
    std::printf("case %-36s %s\n", c.name.c_str(),
                passed ? "refused by name, still serving" : "FAILED");
    if (!server_->Alive()) StartServer();  // judge the next case on its own
  }
  const int64_t peak = testing::PeakRss(server_->pid());
  std::printf("hostile input: %zu cases, server peak RSS %.1f MiB\n", Cases().size(),
              peak / double(kMiB));
#ifndef POSENC_UNDER_SANITIZER  // shadow memory and quarantine are not ours
  EXPECT_LT(peak, kMaxInflight + 128 * kMiB);
#endif
}

// KServe ModelInfer requests of many tiny entries, sent as bytes: what
// each entry costs the server once parsed (a name compared with every
// other, an object of a hundred bytes or more for two bytes on the wire, a
// varint of one byte read into eight) must be refused or admitted before
// it is spent, not found out after.
class HostileKServe : public HostileInput {
 protected:
  // A server of its own for each: the peak RSS judged is this case's.
  void SetUp() override { StartServer(); }
  // ModelInfer with these bytes as the request; the status it ends with.
  static grpc::Status Infer(const std::string& bytes) {
    grpc::GenericStub stub(server_->channel());
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    grpc::Slice slice(bytes);
    grpc::ByteBuffer request(&slice, 1), response;
    std::promise<grpc::Status> done;
    stub.UnaryCall(&ctx, "/inference.GRPCInferenceService/ModelInfer", grpc::StubOptions(),
                   &request, &response, [&](grpc::Status s) { done.set_value(s); });
    return done.get_future().get();
  }
  // A length-delimited field: its tag byte, the length, `body`.
  static std::string Delimited(char tag, const std::string& body) {
    std::string out(1, tag);
    for (uint64_t n = body.size();; n >>= 7) {
      if (n < 0x80) {
        out.push_back(static_cast<char>(n));
        break;
      }
      out.push_back(static_cast<char>((n & 0x7f) | 0x80));
    }
    return out + body;
  }
  // Field 5 (inputs) holding `body`.
  static std::string Input(const std::string& body) { return Delimited('\x2a', body); }
  static std::string RopeModel() { return std::string("\x0a\x04rope", 6); }
};

TEST_F(HostileKServe, ManyNamedInputsAreRefusedBeforeTheirNamesAreCompared) {
  // 2 MiB of valid empty FP32 inputs, about 110 000: their parsed objects
  // fit the budget, and their names compared pairwise held a thread for
  // many seconds.
  std::string req = RopeModel();
  for (int i = 0; static_cast<int64_t>(req.size()) < 2 * kMiB; ++i) {
    const std::string name = std::to_string(i);  // field 1: a name of its own
    req += Input("\x0a" + std::string(1, static_cast<char>(name.size())) + name +
                 std::string("\x12\x04"
                             "FP32"
                             "\x1a\x01\x00",
                             9));  // datatype, shape [0]
  }
  const auto start = std::chrono::steady_clock::now();
  const grpc::Status s = Infer(req);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%zu bytes of named inputs: %s in %.2f s\n", req.size(), s.error_message().c_str(),
              seconds);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("inputs"), std::string::npos) << s.error_message();
  EXPECT_LT(seconds, 5.0);
  ExpectStillServing("many named inputs");
}

TEST_F(HostileKServe, EmptyInputsCannotParseIntoMoreThanTheBudget) {
  // Two bytes each on the wire; an InferInputTensor object each once parsed.
  std::string req = RopeModel();
  const std::string empty = Input("");
  while (static_cast<int64_t>(req.size()) < kMaxMessage - 64) req += empty;
  const grpc::Status s = Infer(req);
  std::printf("%zu bytes of empty inputs: %s\n", req.size(), s.error_message().c_str());
  EXPECT_NE(s.error_code(), grpc::StatusCode::OK);
  ExpectStillServing("empty inputs");
#ifndef POSENC_UNDER_SANITIZER
  const int64_t peak = testing::PeakRss(server_->pid());
  std::printf("server peak RSS %.1f MiB\n", peak / double(kMiB));
  EXPECT_LT(peak, kMaxInflight + 128 * kMiB);
#endif
}

TEST_F(HostileKServe, OneByteVarintsCannotParseIntoMoreThanTheBudget) {
  // One input whose int64 contents are zeros: a byte each on the wire, eight
  // in memory, and eight again when they become the tensor.
  const std::string zeros(kMaxMessage - 4096, '\0');
  // InferTensorContents field 3 (int64_contents), packed, in
  // InferInputTensor field 5 (contents).
  const std::string contents = Delimited('\x2a', Delimited('\x1a', zeros));
  const std::string req =
      RopeModel() + Input(std::string("\x0a\x0cposition_ids\x12\x05INT64", 21) + contents);
  const grpc::Status s = Infer(req);
  std::printf("%zu bytes, int64 zeros: %s\n", req.size(), s.error_message().c_str());
  EXPECT_NE(s.error_code(), grpc::StatusCode::OK);
  ExpectStillServing("one-byte varints");
#ifndef POSENC_UNDER_SANITIZER
  const int64_t peak = testing::PeakRss(server_->pid());
  std::printf("server peak RSS %.1f MiB\n", peak / double(kMiB));
  EXPECT_LT(peak, kMaxInflight + 128 * kMiB);
#endif
}

// The positive path: a Llama 3.1 config.json rotates exactly as the same
// options sent field by field.
TEST_F(HostileInput, HfConfigRotatesAsItsExplicitOptions) {
  testing::Bytes q = testing::RandomTensor(DType::kFloat32, 2 * 3 * 4 * 128);
  auto call = [&](v1::RopeRequest req) {
    SetTensor(TensorView{DType::kFloat32, {2, 3, 4, 128}, q.data(), q.size()}, req.mutable_query(),
              req.mutable_query_data());
    SetInts(req.mutable_offsets(), {2}, {9000, 5});
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::RopeResponse resp;
    const grpc::Status s =
        v1::PositionalEncoding::NewStub(server_->channel())->ApplyRope(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.query_data();
  };
  v1::RopeRequest from_config;
  from_config.set_hf_config(R"({"model_type": "llama", "hidden_size": 4096,
    "num_attention_heads": 32, "max_position_embeddings": 131072, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"}})");
  v1::RopeRequest explicit_fields;
  explicit_fields.set_base(500000.0);
  explicit_fields.set_rotary_dim(128);
  v1::RopeScaling* sc = explicit_fields.mutable_scaling();
  sc->set_type(v1::SCALING_TYPE_LLAMA3);
  sc->set_factor(8);
  sc->set_low_freq_factor(1);
  sc->set_high_freq_factor(4);
  sc->set_original_max_position(8192);
  const std::string a = call(from_config), b = call(explicit_fields);
  EXPECT_EQ(a.size(), q.size());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, std::string(q.begin(), q.end())) << "the query must have been rotated";
}

// An answer one message long plus the backend name the server adds: refused
// by name before the work, not computed and then dropped by the transport.
TEST_F(HostileInput, AnswerOverTheMessageLimitIsRefusedBeforeWork) {
  v1::RopeRequest r = Rope({1, 0, 1, 2});
  const int64_t tokens = (kMaxMessage - 64) / 8;
  r.mutable_query()->set_shape(1, tokens);
  r.set_query_data(std::string(tokens * 8, '\0'));
  // Pad with the request id (echoed in the answer) to exactly the limit.
  r.set_request_id(std::string(kMaxMessage - r.ByteSizeLong() - 4, 'x'));
  while (static_cast<int64_t>(r.ByteSizeLong()) < kMaxMessage)
    r.mutable_request_id()->push_back('x');
  ASSERT_EQ(static_cast<int64_t>(r.ByteSizeLong()), kMaxMessage);
  auto stub = v1::PositionalEncoding::NewStub(server_->channel());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  const grpc::Status s = CallRope(*stub, ctx, r);
  EXPECT_EQ(s.error_code(), StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_NE(s.error_message().find("--max_message_bytes"), std::string::npos) << s.error_message();
  ExpectStillServing("an answer over the message limit");
}

// A stream survives a hostile message: the message is answered with its
// error, the next one is served, and SIGTERM still ends the process.
TEST_F(HostileInput, StreamAnswersAHostileMessageAndGoesOn) {
  auto stub = v1::PositionalEncoding::NewStub(server_->channel());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  auto stream = stub->StreamRope(&ctx);
  v1::RopeRequest bad = Rope({int64_t{1} << 40, 0, 1, 2});
  bad.set_request_id("bad");
  v1::RopeRequest good = Rope({1, 2, 1, 8});
  good.set_request_id("good");
  ASSERT_TRUE(stream->Write(bad));
  ASSERT_TRUE(stream->Write(good));
  stream->WritesDone();
  v1::RopeResponse resp;
  ASSERT_TRUE(stream->Read(&resp));
  EXPECT_EQ(resp.request_id(), "bad");
  EXPECT_EQ(resp.error_code(), static_cast<int>(StatusCode::INVALID_ARGUMENT));
  EXPECT_NE(resp.error_message().find("query.shape[0] (batch)"), std::string::npos)
      << resp.error_message();
  ASSERT_TRUE(stream->Read(&resp));
  EXPECT_EQ(resp.request_id(), "good");
  EXPECT_EQ(resp.error_code(), 0) << resp.error_message();
  EXPECT_FALSE(stream->Read(&resp));
  EXPECT_TRUE(stream->Finish().ok());
  ExpectStillServing("a hostile stream message");
}

// A raw .safetensors file: 8-byte little-endian header length, header, data.
std::string Safetensors(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + std::string(data_bytes, '\0');
}

// A poisoned table directory, as a shared volume could hold: the server
// starts, serves the good table, lists every bad file with its reason, and
// answers ReloadTables promptly (a FIFO used to hang it and shutdown; a
// shape above INT64_MAX crashed start-up and made ReloadTables UNIMPLEMENTED).
TEST(HostileTables, APoisonedTableDirectoryCannotCrashHangOrFoolTheServer) {
  char pattern[] = "/tmp/posenc_hostile_tables_XXXXXX";
  const std::string dir = mkdtemp(pattern);
  auto write = [&](const std::string& name, const std::string& bytes) {
    std::ofstream(dir + "/" + name, std::ios::binary) << bytes;
  };
  write("good.safetensors",
        Safetensors(R"({"wpe":{"dtype":"F32","shape":[4,2],"data_offsets":[0,32]}})", 32));
  write("huge_shape.safetensors",
        Safetensors(
            R"({"t":{"dtype":"F32","shape":[18446744073709551615,2],"data_offsets":[0,8]}})", 8));
  write("minus_one_rows.safetensors",
        Safetensors(
            R"({"t":{"dtype":"F32","shape":[18446744073709551615,0],"data_offsets":[0,0]}})", 0));
  write("overlap.safetensors",
        Safetensors(R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
                    R"("b":{"dtype":"F32","shape":[2,2],"data_offsets":[8,24]}})",
                    24));
  ASSERT_EQ(mkfifo((dir + "/fifo.safetensors").c_str(), 0600), 0);
  ASSERT_EQ(symlink("/etc/hostname", (dir + "/outside.safetensors").c_str()), 0);

  testing::ServerProcess server;
  ASSERT_TRUE(server.Start(POSENC_SERVER_BINARY, {"--table_dir=" + dir})) << server.log_text();
  auto stub = v1::PositionalEncoding::NewStub(server.channel());
  for (int round = 0; round < 2; ++round) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::ListTablesResponse tables;
    const grpc::Status s = round == 0
                               ? stub->ListTables(&ctx, v1::ListTablesRequest(), &tables)
                               : stub->ReloadTables(&ctx, v1::ReloadTablesRequest(), &tables);
    ASSERT_TRUE(s.ok()) << (round == 0 ? "ListTables: " : "ReloadTables: ") << s.error_message();
    ASSERT_EQ(tables.tables_size(), 1);
    EXPECT_EQ(tables.tables(0).name(), "good/wpe");
    EXPECT_EQ(tables.tables(0).rows(), 4);
    std::string skipped;
    for (const std::string& line : tables.skipped()) skipped += line + "\n";
    for (const char* file : {"huge_shape", "minus_one_rows", "overlap", "fifo", "outside"}) {
      EXPECT_NE(skipped.find(file), std::string::npos) << file << " not reported in:\n" << skipped;
    }
  }
  grpc::ClientContext ctx;
  v1::EncodingTableRequest req;
  req.mutable_learned()->set_table_name("good/wpe");
  v1::EncodingTableResponse resp;
  EXPECT_TRUE(stub->GetEncodingTable(&ctx, req, &resp).ok());
  EXPECT_EQ(resp.table_data().size(), 32u);
  ASSERT_EQ(kill(server.pid(), SIGTERM), 0);
  EXPECT_TRUE(server.Exited(std::chrono::seconds(10))) << "shutdown hung";
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace posenc
