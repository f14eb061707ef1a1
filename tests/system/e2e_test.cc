// End to end over a real socket: an in-process posenc server on port 0 and
// the C++ client library, for every RPC and every error class of SPEC §3.
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>

#include "engine/safetensors.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "posenc/backend.h"
#include "posenc/client.h"
#include "posenc/wire/tensors.h"
#include "reference.h"
#include "server.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"
#include "test_tensors.h"

namespace posenc {
namespace {

using testing::Bytes;

class EndToEnd : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char pattern[] = "/tmp/posenc_e2e_XXXXXX";
    table_dir_ = new std::string(mkdtemp(pattern));
    table_ = new LearnedTable;
    table_->rows = 32;
    table_->dim = 16;
    Bytes b = testing::RandomTensor(DType::kFloat32, 32 * 16);
    for (double v : testing::ToDoubles(DType::kFloat32, b)) table_->values.push_back(float(v));
    std::ofstream(*table_dir_ + "/gpt2.safetensors", std::ios::binary)
        << server::SerializeSafetensors({{"wpe", table_}});
    std::ofstream(*table_dir_ + "/corrupt.safetensors") << "\x10garbage";

    server::ServerOptions o;
    o.listen_address = "127.0.0.1:0";
    o.engine.max_message_bytes = 8 << 20;
    o.engine.max_request_tensor_bytes = 6 << 20;
    o.engine.table_dir = *table_dir_;
    o.engine.cpu_threads = 2;
    auto s = server::Server::Start(o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = s->release();
    ClientOptions co;
    co.target = "127.0.0.1:" + std::to_string(server_->port());
    co.max_message_bytes = 64 << 20;
    co.initial_backoff = absl::Milliseconds(10);
    auto c = Client::Create(co);
    ASSERT_TRUE(c.ok());
    client_ = c->release();
  }
  static void TearDownTestSuite() {
    delete client_;
    delete server_;
    std::filesystem::remove_all(*table_dir_);
    delete table_dir_;
    delete table_;
  }

  static server::Server* server_;
  static Client* client_;
  static std::string* table_dir_;
  static LearnedTable* table_;
};
server::Server* EndToEnd::server_ = nullptr;
Client* EndToEnd::client_ = nullptr;
std::string* EndToEnd::table_dir_ = nullptr;
LearnedTable* EndToEnd::table_ = nullptr;

RopeOptions LlamaRope() {
  RopeOptions o;
  o.style = RopeStyle::kNeox;
  o.base = 500000;
  o.scaling.type = ScalingType::kLlama3;
  return o;
}

// The query (and key) of a RoPE call, positions from the sequence index.
RopeTensors Qk(MutableTensor q, MutableTensor k = {}) {
  RopeTensors t;
  t.query = std::move(q);
  t.key = std::move(k);
  return t;
}

TEST_F(EndToEnd, ApplyRopeMatchesLocalKernelsBitForBit) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    Bytes q = testing::RandomTensor(dtype, 2 * 9 * 8 * 128);
    Bytes k = testing::RandomTensor(dtype, 2 * 9 * 2 * 128);
    Bytes q_local = q, k_local = k;
    std::vector<int32_t> offsets = {100, 70000};
    RopeTensors remote =
        Qk(testing::Mutable(dtype, {2, 9, 8, 128}, q), testing::Mutable(dtype, {2, 9, 2, 128}, k));
    remote.positions.offsets = testing::IntView(offsets, {2});
    ASSERT_TRUE(client_->ApplyRope(LlamaRope(), remote).ok());

    const RopeOptions o = LlamaRope();
    RopeTensors t;
    t.query = testing::Mutable(dtype, {2, 9, 8, 128}, q_local);
    t.key = testing::Mutable(dtype, {2, 9, 2, 128}, k_local);
    t.positions.offsets = testing::IntView(offsets, {2});
    auto plan = PlanRope(o, t);
    ASSERT_TRUE(plan.ok());
    ASSERT_TRUE(CreateCpuBackend(1)->ApplyRope(*plan, q_local.data(), k_local.data(), {}).ok());
    EXPECT_EQ(q, q_local) << DTypeName(dtype);
    EXPECT_EQ(k, k_local) << DTypeName(dtype);
  }
}

// CallOptions' request id and traceparent reach the server's line about
// the call (a refused one, logged at debug), as request_id and trace_id.
TEST_F(EndToEnd, CallOptionsIdsReachTheServersLines) {
  std::ostringstream out;
  const auto saved = spdlog::default_logger();
  const auto saved_level = saved->level();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>(
      "test", std::make_shared<spdlog::sinks::ostream_sink_mt>(out)));
  spdlog::set_level(spdlog::level::debug);
  Bytes q = testing::RandomTensor(DType::kFloat32, 1 * 2 * 2 * 64);
  RopeOptions odd = LlamaRope();
  odd.rotary_dim = 7;  // refused: INVALID_ARGUMENT
  CallOptions call;
  call.request_id = "e2e-trace-1";
  call.traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
  const absl::Status s =
      client_->ApplyRope(odd, Qk(testing::Mutable(DType::kFloat32, {1, 2, 2, 64}, q)), call);
  spdlog::set_default_logger(saved);
  spdlog::set_level(saved_level);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  const std::string text = out.str();
  EXPECT_NE(text.find("request_id=e2e-trace-1 trace_id=0af7651916cd43dd8448eb211c80319c"),
            std::string::npos)
      << text;
}

TEST_F(EndToEnd, AsyncCallsAndStreamKeepOrderAndReportErrorsPerMessage) {
  std::vector<Bytes> qs;
  std::vector<std::future<absl::Status>> futures;
  for (int i = 0; i < 6; ++i) qs.push_back(testing::RandomTensor(DType::kFloat32, 4 * 2 * 64));
  for (int i = 0; i < 6; ++i) {
    futures.push_back(
        client_->ApplyRopeAsync({}, Qk(testing::Mutable(DType::kFloat32, {1, 4, 2, 64}, qs[i]))));
  }
  for (auto& f : futures) EXPECT_TRUE(f.get().ok());

  auto stream = client_->StreamRope();
  for (int i = 0; i < 5; ++i) {
    v1::RopeRequest r;
    r.set_request_id("req-" + std::to_string(i));
    Bytes q = testing::RandomTensor(DType::kBFloat16, 3 * 4 * 64);
    wire::SetTensor(TensorView{DType::kBFloat16, {1, 3, 4, 64}, q.data(), q.size()},
                    r.mutable_query(), r.mutable_query_data());
    if (i == 2) r.set_rotary_dim(7);  // a bad request in the middle
    ASSERT_TRUE(stream->Write(r));
  }
  for (int i = 0; i < 5; ++i) {
    v1::RopeResponse resp;
    ASSERT_TRUE(stream->Read(&resp));
    EXPECT_EQ(resp.request_id(), "req-" + std::to_string(i));
    if (i == 2) {
      EXPECT_EQ(resp.error_code(), int(absl::StatusCode::kInvalidArgument));
      EXPECT_NE(resp.error_message().find("rotary_dim"), std::string::npos);
      EXPECT_TRUE(resp.query_data().empty());
    } else {
      EXPECT_EQ(resp.error_code(), 0) << resp.error_message();
      EXPECT_EQ(resp.query_data().size(), 3u * 4 * 64 * 2);
    }
  }
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(EndToEnd, AbsoluteEncodingsTablesAndBias) {
  // Sinusoidal table: seed 003's example.
  AbsoluteOptions sinusoidal;
  sinusoidal.base = 100;
  auto table = client_->EncodingTable(sinusoidal, 4, 4);
  ASSERT_TRUE(table.ok()) << table.status();
  ASSERT_EQ(table->data.size(), 64u);
  EXPECT_EQ(table->shape, (std::vector<int64_t>{4, 4}));
  EXPECT_NEAR(testing::ReadDouble(DType::kFloat32, table->data.data(), 4), 0.84147098, 1e-7);
  for (int64_t pos = 0; pos < 4; ++pos) {  // every element, against the float64 reference
    const std::vector<double> row =
        reference::SinusoidalRow(SinusoidalLayout::kInterleaved, 100, 4, pos);
    for (int64_t i = 0; i < 4; ++i) {
      EXPECT_NEAR(testing::ReadDouble(DType::kFloat32, table->data.data(), pos * 4 + i), row[i],
                  1e-7)
          << pos << ", " << i;
    }
  }

  // Learned table rows come back exactly.
  AbsoluteOptions learned;
  learned.kind = AbsoluteOptions::Kind::kLearned;
  learned.table_name = "gpt2/wpe";
  auto rows = client_->EncodingTable(learned, 0, 0);
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->shape[0], 32);
  EXPECT_EQ(0, std::memcmp(rows->data.data(), table_->values.data(), 32 * 16 * 4));

  // Learned add, in place on caller's buffer.
  Bytes x = testing::RandomTensor(DType::kFloat32, 2 * 5 * 16);
  const std::vector<double> x0 = testing::ToDoubles(DType::kFloat32, x);
  AbsoluteOptions add = learned;
  add.x_scale = 2;
  AbsoluteTensors xt;
  xt.x = testing::Mutable(DType::kFloat32, {2, 5, 16}, x);
  ASSERT_TRUE(client_->AddAbsoluteEncoding(add, xt).ok());
  for (int t = 0; t < 10; ++t) {
    for (int i = 0; i < 16; ++i) {
      const double want = float(float(x0[t * 16 + i]) * 2.0f + table_->values[(t % 5) * 16 + i]);
      EXPECT_EQ(testing::ReadDouble(DType::kFloat32, x.data(), t * 16 + i), want);
    }
  }

  // The bias the server builds is the ALiBi paper's (six heads: its
  // interleaved slopes for a count that is not a power of two), causal;
  // added to the caller's logits, it agrees.
  BiasOptions breq;
  breq.num_heads = 6;
  breq.q_len = 5;
  breq.k_len = 11;
  breq.causal = true;
  auto bias = client_->AttentionBias(breq);
  ASSERT_TRUE(bias.ok()) << bias.status();
  ASSERT_EQ(bias->slopes.size(), 6u);
  const std::vector<double> paper = reference::PaperAlibiSlopes(6);
  for (int h = 0; h < 6; ++h) EXPECT_NEAR(bias->slopes[h], paper[h], 1e-15 * paper[h]) << h;
  for (int h = 0; h < 6; ++h) {
    for (int q = 0; q < 5; ++q) {
      const int i = 11 - 5 + q;  // the query's position: the last q_len keys'
      for (int j = 0; j < 11; ++j) {
        const double got =
            testing::ReadDouble(DType::kFloat32, bias->data.data(), (h * 5 + q) * 11 + j);
        if (j > i) {
          EXPECT_EQ(got, -std::numeric_limits<double>::infinity()) << h << ", " << q << ", " << j;
        } else {
          const double want = -paper[h] * (i - j);  // then rounded to float32
          EXPECT_NEAR(got, want, 1e-7 * std::abs(want)) << h << ", " << q << ", " << j;
        }
      }
    }
  }
  std::vector<float> logits(6 * 5 * 11, 1.0f);
  std::vector<double> slopes;
  ASSERT_TRUE(
      client_
          ->ApplyAttentionBias(
              breq, MutableTensor{DType::kFloat32, {1, 6, 5, 11}, logits.data(), logits.size() * 4},
              &slopes)
          .ok());
  for (size_t i = 0; i < logits.size(); ++i) {
    const double b = testing::ReadDouble(DType::kFloat32, bias->data.data(), i);
    EXPECT_EQ(logits[i], float(1.0 + b)) << i;
  }
  EXPECT_EQ(slopes, bias->slopes);
}

TEST_F(EndToEnd, TablesListReloadAndInfo) {
  auto list = client_->ListTables();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->tables_size(), 1);
  EXPECT_EQ(list->tables(0).name(), "gpt2/wpe");
  ASSERT_EQ(list->skipped_size(), 1);  // corrupt.safetensors, reported not fatal
  std::ofstream(*table_dir_ + "/bert.safetensors", std::ios::binary)
      << server::SerializeSafetensors({{"pos", table_}});
  auto reloaded = client_->ReloadTables();
  ASSERT_TRUE(reloaded.ok());
  EXPECT_EQ(reloaded->tables_size(), 2);
  std::filesystem::remove(*table_dir_ + "/bert.safetensors");
  ASSERT_TRUE(client_->ReloadTables().ok());

  auto info = client_->GetServerInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->backends(0).kind(), v1::BACKEND_CPU);
  EXPECT_EQ(info->backends(0).threads(), 2);
  EXPECT_EQ(info->limits().max_message_bytes(), 8 << 20);
  // The transport's cap: the budget and two messages (no --max_memory_bytes).
  EXPECT_EQ(info->limits().max_transport_bytes(),
            info->limits().max_inflight_bytes() + 2 * (8 << 20));
  EXPECT_EQ(info->built_with_cuda(), BuiltWithCuda());
}

TEST_F(EndToEnd, HealthServiceAnswers) {
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(server_->port()),
                                     grpc::InsecureChannelCredentials());
  auto health = grpc::health::v1::Health::NewStub(channel);
  for (const char* service : {"", "liveness", "posenc.v1.PositionalEncoding"}) {
    grpc::ClientContext ctx;
    grpc::health::v1::HealthCheckRequest req;
    req.set_service(service);
    grpc::health::v1::HealthCheckResponse resp;
    ASSERT_TRUE(health->Check(&ctx, req, &resp).ok()) << service;
    EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING) << service;
  }
}

// ------------------------------------------------------- error classes ----

void ExpectError(const absl::Status& s, absl::StatusCode code, std::vector<std::string> parts) {
  EXPECT_EQ(s.code(), code) << s;
  for (const auto& p : parts)
    EXPECT_NE(s.message().find(p), absl::string_view::npos) << s << " lacks '" << p << "'";
}

TEST_F(EndToEnd, WrongByteCountNamesBothNumbers) {
  v1::RopeRequest req;
  req.mutable_query()->set_dtype(v1::DATA_TYPE_FLOAT32);
  for (int64_t d : {1, 2, 4, 64}) req.mutable_query()->add_shape(d);
  req.set_query_data(std::string(2000, '\0'));  // [1, 2, 4, 64] float32 needs 2048
  grpc::ClientContext ctx;
  v1::RopeResponse resp;
  grpc::Status s = client_->stub().ApplyRope(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("query"), std::string::npos) << s.error_message();
  EXPECT_NE(s.error_message().find("needs 2048 bytes"), std::string::npos) << s.error_message();

  EXPECT_NE(s.error_message().find("got 2000 bytes"), std::string::npos) << s.error_message();
}

TEST_F(EndToEnd, BadShapeOddRotaryDimAndMissingDtype) {
  Bytes q = testing::RandomTensor(DType::kFloat32, 4 * 64);
  ExpectError(client_->ApplyRope({}, Qk(testing::Mutable(DType::kFloat32, {4, 64}, q))),
              absl::StatusCode::kInvalidArgument, {"query.shape", "rank 4", "[4, 64]"});
  RopeOptions odd;
  odd.rotary_dim = 33;
  ExpectError(client_->ApplyRope(odd, Qk(testing::Mutable(DType::kFloat32, {1, 1, 4, 64}, q))),
              absl::StatusCode::kInvalidArgument, {"rotary_dim", "even", "33"});
  v1::RopeRequest req;
  req.mutable_query()->add_shape(0);
  grpc::ClientContext ctx;
  v1::RopeResponse resp;
  grpc::Status s = client_->stub().ApplyRope(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("query.dtype"), std::string::npos) << s.error_message();
}

TEST_F(EndToEnd, UnknownTableAndOutOfRangePosition) {
  Bytes x = testing::RandomTensor(DType::kFloat32, 40 * 16);
  AbsoluteOptions o;
  o.kind = AbsoluteOptions::Kind::kLearned;
  o.table_name = "llama/nope";
  AbsoluteTensors t;
  t.x = testing::Mutable(DType::kFloat32, {1, 40, 16}, x);
  ExpectError(client_->AddAbsoluteEncoding(o, t), absl::StatusCode::kNotFound,
              {"llama/nope", "gpt2/wpe"});
  o.table_name = "gpt2/wpe";
  ExpectError(client_->AddAbsoluteEncoding(o, t), absl::StatusCode::kInvalidArgument,
              {"position 32", "length 32"});
}

TEST_F(EndToEnd, CudaWithoutGpuIsFailedPrecondition) {
  if (CreateCudaBackend(0).ok()) GTEST_SKIP() << "a GPU is visible";
  Bytes q = testing::RandomTensor(DType::kFloat32, 64);
  CallOptions cuda;
  cuda.backend = BackendChoice::kCuda;
  ExpectError(client_->ApplyRope({}, Qk(testing::Mutable(DType::kFloat32, {1, 1, 1, 64}, q)), cuda),
              absl::StatusCode::kFailedPrecondition, {"CUDA", "AUTO or CPU"});
}

// On a machine with a GPU: the same calls asked of CUDA and of the CPU,
// through the server, give the same bytes (the backends' bit-identity
// contract, over the wire, with odd shapes that pick narrow vector widths).
TEST_F(EndToEnd, CudaServesWhatTheCpuServesWhenAGpuIsVisible) {
  if (!CreateCudaBackend(0).ok()) GTEST_SKIP() << "no GPU visible";
  CallOptions cuda, cpu;
  cuda.backend = BackendChoice::kCuda;
  cpu.backend = BackendChoice::kCpu;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (RopeStyle style : {RopeStyle::kNeox, RopeStyle::kGptj}) {
      for (int64_t d : {128, 120, 9}) {
        SCOPED_TRACE(::testing::Message()
                     << DTypeName(dtype) << " style " << int(style) << " head_dim " << d);
        RopeOptions o = LlamaRope();
        o.style = style;
        o.rotary_dim = d % 2 == 0 ? d : d - 1;
        Bytes q = testing::RandomTensor(dtype, 3 * 7 * 5 * d);
        Bytes k = testing::RandomTensor(dtype, 3 * 7 * 2 * d);
        Bytes q_cpu = q, k_cpu = k;
        std::vector<int32_t> offsets = {0, 4097, 1 << 20};
        RopeTensors on_gpu =
            Qk(testing::Mutable(dtype, {3, 7, 5, d}, q), testing::Mutable(dtype, {3, 7, 2, d}, k));
        on_gpu.positions.offsets = testing::IntView(offsets, {3});
        RopeTensors on_cpu = Qk(testing::Mutable(dtype, {3, 7, 5, d}, q_cpu),
                                testing::Mutable(dtype, {3, 7, 2, d}, k_cpu));
        on_cpu.positions.offsets = testing::IntView(offsets, {3});
        ASSERT_TRUE(client_->ApplyRope(o, on_gpu, cuda).ok());
        ASSERT_TRUE(client_->ApplyRope(o, on_cpu, cpu).ok());
        EXPECT_EQ(q, q_cpu);
        EXPECT_EQ(k, k_cpu);
      }
    }
    SCOPED_TRACE(DTypeName(dtype));
    AbsoluteOptions sinusoidal;
    Bytes x = testing::RandomTensor(dtype, 2 * 33 * 200);
    Bytes x_cpu = x;
    AbsoluteTensors on_gpu, on_cpu;
    on_gpu.x = testing::Mutable(dtype, {2, 33, 200}, x);
    on_cpu.x = testing::Mutable(dtype, {2, 33, 200}, x_cpu);
    ASSERT_TRUE(client_->AddAbsoluteEncoding(sinusoidal, on_gpu, cuda).ok());
    ASSERT_TRUE(client_->AddAbsoluteEncoding(sinusoidal, on_cpu, cpu).ok());
    EXPECT_EQ(x, x_cpu);
  }
  BiasOptions b;
  b.num_heads = 12;
  b.q_len = 7;
  b.k_len = 301;
  b.causal = true;
  auto gpu_bias = client_->AttentionBias(b, cuda);
  auto cpu_bias = client_->AttentionBias(b, cpu);
  ASSERT_TRUE(gpu_bias.ok()) << gpu_bias.status();
  ASSERT_TRUE(cpu_bias.ok()) << cpu_bias.status();
  EXPECT_EQ(gpu_bias->data, cpu_bias->data);
}

TEST_F(EndToEnd, OversizedMessagesAndRequestsAreResourceExhausted) {
  // Over the transport limit (8 MiB): gRPC itself refuses it.
  Bytes big = testing::RandomTensor(DType::kFloat32, 9 << 18);
  auto s = client_->ApplyRope({}, Qk(testing::Mutable(DType::kFloat32, {1, 9 << 10, 4, 64}, big)));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  // Under it but over --max_request_bytes (6 MiB): the engine refuses it.
  Bytes mid = testing::RandomTensor(DType::kFloat32, 7 << 18);
  ExpectError(
      client_->ApplyRope({}, Qk(testing::Mutable(DType::kFloat32, {1, 7 << 10, 4, 64}, mid))),
      absl::StatusCode::kResourceExhausted, {"limit", "max_request_bytes"});
  // A small request whose output would be over the limit.
  BiasOptions b;
  b.num_heads = 64;
  b.q_len = 256;
  b.k_len = 256;
  auto bias = client_->AttentionBias(b);
  EXPECT_EQ(bias.status().code(), absl::StatusCode::kResourceExhausted) << bias.status();
}

// Left padding over the wire: random k_starts (with k_lens) through the
// client, built by the server and added to caller logits, against the
// float64 reference; bad k_starts refused naming the field.
TEST_F(EndToEnd, LeftPaddedBiasThroughTheClient) {
  std::mt19937_64& rng = testing::Rng();
  for (int trial = 0; trial < 8; ++trial) {
    BiasOptions o;
    o.batch = 1 + rng() % 4;
    o.num_heads = 1 + rng() % 9;
    o.k_len = 1 + rng() % 40;
    o.q_len = rng() % 2 ? o.k_len : 1;
    o.causal = true;
    o.dtype = rng() % 2 ? DType::kFloat32 : DType::kBFloat16;
    std::vector<int64_t> ends(o.batch);
    std::vector<int32_t> starts(o.batch);
    for (int64_t b = 0; b < o.batch; ++b) {
      ends[b] = rng() % (o.k_len + 1);
      starts[b] = rng() % (ends[b] + 1);
    }
    o.k_lens = testing::IntView(ends, {o.batch});
    o.k_starts = testing::IntView(starts, {o.batch});
    SCOPED_TRACE(::testing::Message() << "trial " << trial);
    auto plan = PlanAttentionBias(o, {});
    ASSERT_TRUE(plan.ok()) << plan.status();
    std::vector<double> ref;
    for (int64_t b = 0; b < o.batch; ++b)
      for (int64_t h = 0; h < o.num_heads; ++h)
        for (int64_t i = 0; i < o.q_len; ++i)
          for (int64_t j = 0; j < o.k_len; ++j) ref.push_back(reference::Bias(*plan, b, h, i, j));
    // The reference takes the plan's starts: check the plan kept ours.
    ASSERT_EQ(plan->k_starts, std::vector<int64_t>(starts.begin(), starts.end()));
    auto bias = client_->AttentionBias(o);
    ASSERT_TRUE(bias.ok()) << bias.status();
    EXPECT_TRUE(testing::MatchesReference(o.dtype, ref, bias->data.data(), 1e-6));

    Bytes logits = testing::RandomTensor(o.dtype, plan->NumElements());
    const std::vector<double> before = testing::ToDoubles(o.dtype, logits);
    ASSERT_TRUE(
        client_
            ->ApplyAttentionBias(
                o, testing::Mutable(o.dtype, {o.batch, o.num_heads, o.q_len, o.k_len}, logits))
            .ok());
    for (size_t e = 0; e < ref.size(); ++e) ref[e] += before[e];
    EXPECT_TRUE(testing::MatchesReference(o.dtype, ref, logits.data(), 1e-6));
  }

  BiasOptions o;
  o.num_heads = 2;
  o.q_len = 3;
  o.k_len = 6;
  std::vector<int64_t> ends = {6, 2};
  std::vector<int64_t> starts = {1, 3};
  o.k_lens = testing::IntView(ends, {2});
  o.k_starts = testing::IntView(starts, {2});
  ExpectError(client_->AttentionBias(o).status(), absl::StatusCode::kInvalidArgument,
              {"k_starts[1]", "k_lens[1] = 2", "got 3"});
  o.k_lens = {};
  starts = {1, -1};
  ExpectError(client_->AttentionBias(o).status(), absl::StatusCode::kInvalidArgument,
              {"k_starts[1]", "k_len = 6", "got -1"});
  std::vector<int64_t> three = {0, 0, 0};
  o.k_lens = testing::IntView(ends, {2});
  o.k_starts = testing::IntView(three, {3});
  ExpectError(client_->AttentionBias(o).status(), absl::StatusCode::kInvalidArgument,
              {"k_starts.shape", "[batch] = [2]", "[3]"});
  std::vector<float> floats = {0, 1};
  o.k_starts = TensorView{DType::kFloat32, {2}, floats.data(), 8};
  ExpectError(client_->AttentionBias(o).status(), absl::StatusCode::kInvalidArgument,
              {"k_starts.dtype", "INT32 or INT64", "FLOAT32"});
  // k_starts count toward --max_request_bytes (6 MiB here) like every tensor.
  std::vector<int64_t> huge(7 << 17);
  o.k_lens = {};
  o.k_starts = testing::IntView(huge, {7 << 17});
  ExpectError(client_->AttentionBias(o).status(), absl::StatusCode::kResourceExhausted,
              {"max_request_bytes"});
}

TEST_F(EndToEnd, DeadlinesAreHonoured) {
  Bytes q = testing::RandomTensor(DType::kFloat32, 4096 * 8 * 64);
  CallOptions call;
  call.timeout = absl::Microseconds(1);
  auto s = client_->ApplyRope({}, Qk(testing::Mutable(DType::kFloat32, {1, 4096, 8, 64}, q)), call);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
}

// Runs last in this suite (gtest keeps declaration order): draining is final.
TEST_F(EndToEnd, ZDrainingRefusesNewCallsWithUnavailable) {
  server_->engine().StartDraining();
  Bytes q = testing::RandomTensor(DType::kFloat32, 64);
  ExpectError(client_->ApplyRope({}, Qk(testing::Mutable(DType::kFloat32, {1, 1, 1, 64}, q))),
              absl::StatusCode::kUnavailable, {"draining"});
}

}  // namespace
}  // namespace posenc
