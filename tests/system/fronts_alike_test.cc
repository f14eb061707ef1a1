// Both fronts (posenc.v1 and KServe v2) go through one call lifecycle, so
// they log, answer and refuse alike, against the real binary over a socket:
// slow and failed calls logged with their request id on either front; a
// stream message that does not parse answered in the stream, which goes on;
// every unary method answering a request that does not parse with
// INVALID_ARGUMENT naming its message type; stream answers whose strings a
// strict client can decode (valid UTF-8) however the caller's names and ids
// are cut; and a message over --max_message_bytes refused without the
// server holding it.
#include <signal.h>

#include <chrono>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "google/protobuf/descriptor.h"
#include "google/protobuf/stubs/common.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/codegen/client_unary_call.h"
#include "grpcpp/impl/codegen/sync_stream.h"
#include "gtest/gtest.h"
#include "kserve/grpc_service.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "posenc/v1/posenc.grpc.pb.h"
#include "server_process.h"

namespace posenc {
namespace {

constexpr char kV1[] = "posenc.v1.PositionalEncoding";
constexpr char kKServe[] = "inference.GRPCInferenceService";
constexpr int64_t kMiB = int64_t{1} << 20;

grpc::ByteBuffer Bytes(const std::string& s) {
  grpc::Slice slice(s);
  return grpc::ByteBuffer(&slice, 1);
}

std::string Joined(const grpc::ByteBuffer& b) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(b.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// One unary call of `method` on `service` with raw bytes, as any client
// (or a fuzzer) could send them.
grpc::Status RawUnary(const std::shared_ptr<grpc::Channel>& channel, const std::string& service,
                      const std::string& method, const std::string& request,
                      std::string* answer = nullptr) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  const std::string path = "/" + service + "/" + method;
  const grpc::internal::RpcMethod rpc(path.c_str(), grpc::internal::RpcMethod::NORMAL_RPC, channel);
  grpc::ByteBuffer out;
  const grpc::Status s = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
      channel.get(), rpc, &ctx, Bytes(request), &out);
  if (answer != nullptr && s.ok()) *answer = Joined(out);
  return s;
}

// A stream of `method` that sends `messages` (raw bytes), half-closes and
// returns every answer and the final status.
grpc::Status RawStream(const std::shared_ptr<grpc::Channel>& channel, const std::string& service,
                       const std::string& method, const std::vector<std::string>& messages,
                       std::vector<std::string>* answers, const std::string& request_id = "") {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  if (!request_id.empty()) ctx.AddMetadata("x-request-id", request_id);
  const std::string path = "/" + service + "/" + method;
  const grpc::internal::RpcMethod rpc(path.c_str(), grpc::internal::RpcMethod::BIDI_STREAMING,
                                      channel);
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> stream(
      grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
          channel.get(), rpc, &ctx));
  for (const std::string& m : messages) EXPECT_TRUE(stream->Write(Bytes(m)));
  stream->WritesDone();
  grpc::ByteBuffer in;
  while (stream->Read(&in)) answers->push_back(Joined(in));
  return stream->Finish();
}

// Valid UTF-8, by protobuf's own check (what strict clients enforce).
bool ValidUtf8(const std::string& s) {
  return google::protobuf::internal::IsStructurallyValidUTF8(s.data(), static_cast<int>(s.size()));
}

// A RoPE request of `tokens` x 8 x 128 float32 (4 KiB a token).
v1::RopeRequest Rope(int64_t tokens) {
  v1::RopeRequest r;
  r.mutable_query()->set_dtype(v1::DATA_TYPE_FLOAT32);
  for (int64_t d : {int64_t{1}, tokens, int64_t{8}, int64_t{128}}) r.mutable_query()->add_shape(d);
  r.set_query_data(std::string(tokens * 8 * 128 * 4, '\0'));
  return r;
}

inference::ModelInferRequest Infer(int64_t tokens) {
  inference::ModelInferRequest r;
  r.set_model_name("rope");
  auto* in = r.add_inputs();
  in->set_name("query");
  in->set_datatype("FP32");
  for (int64_t d : {int64_t{1}, tokens, int64_t{8}, int64_t{128}}) in->add_shape(d);
  r.add_raw_input_contents(std::string(tokens * 8 * 128 * 4, '\0'));
  return r;
}

std::vector<nlohmann::json> JsonLines(const std::string& text) {
  std::vector<nlohmann::json> out;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object()) out.push_back(j);
  }
  return out;
}

// The line logged about `id` whose message contains `what`, or null.
const nlohmann::json* LineAbout(const std::vector<nlohmann::json>& lines, const std::string& id,
                                const std::string& what) {
  for (const auto& j : lines) {
    if (j.value("request_id", "") == id && j.value("message", "").find(what) != std::string::npos) {
      return &j;
    }
  }
  return nullptr;
}

TEST(FrontsAlike, SlowAndFailedCallsOfEitherFrontAreLoggedWithTheirRequestId) {
  testing::ServerProcess server;
  ASSERT_TRUE(server.Start(POSENC_SERVER_BINARY,
                           {"--log_format=json", "--log_level=debug", "--slow_call_ms=1"}))
      << server.log_text();
  auto v1_stub = v1::PositionalEncoding::NewStub(server.channel());
  auto kserve_stub = inference::GRPCInferenceService::NewStub(server.channel());
  // Slow-call lines are at most one a second: one slow call per second. A
  // stream message's time starts once it is read, so streams carry 32 MiB
  // (parsing and rotating it takes well over a millisecond).
  const auto next_second = [] { std::this_thread::sleep_for(std::chrono::milliseconds(1100)); };
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("x-request-id", "slow-v1");
    v1::RopeResponse resp;
    EXPECT_TRUE(v1_stub->ApplyRope(&ctx, Rope(2048), &resp).ok());
  }
  next_second();
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("x-request-id", "slow-kserve");
    inference::ModelInferResponse resp;
    const grpc::Status s = kserve_stub->ModelInfer(&ctx, Infer(2048), &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
  }
  next_second();
  std::vector<std::string> answers;
  EXPECT_TRUE(RawStream(server.channel(), kV1, "StreamRope", {Rope(8192).SerializeAsString()},
                        &answers, "slow-v1-stream")
                  .ok());
  next_second();
  EXPECT_TRUE(RawStream(server.channel(), kKServe, "ModelStreamInfer",
                        {Infer(8192).SerializeAsString()}, &answers, "slow-kserve-stream")
                  .ok());
  // Failed calls: a debug line with the id, the method and the code.
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("x-request-id", "bad-kserve");
    inference::ModelInferRequest bad = Infer(1);
    bad.set_model_name("no-such-model");
    inference::ModelInferResponse resp;
    EXPECT_EQ(kserve_stub->ModelInfer(&ctx, bad, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("x-request-id", "bad-v1");
    v1::RopeRequest bad = Rope(1);
    bad.set_rotary_dim(7);
    v1::RopeResponse resp;
    EXPECT_EQ(v1_stub->ApplyRope(&ctx, bad, &resp).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  ASSERT_EQ(kill(server.pid(), SIGTERM), 0);
  ASSERT_TRUE(server.Exited(std::chrono::seconds(15)));
  const std::string text = server.log_text();
  const std::vector<nlohmann::json> lines = JsonLines(text);
  for (const auto& [id, method] : std::vector<std::pair<std::string, std::string>>{
           {"slow-v1", "ApplyRope"},
           {"slow-kserve", "ModelInfer"},
           {"slow-v1-stream", "StreamRope"},
           {"slow-kserve-stream", "ModelStreamInfer"}}) {
    const nlohmann::json* slow = LineAbout(lines, id, "was slow");
    ASSERT_NE(slow, nullptr) << "no slow-call line for " << id << ":\n" << text;
    EXPECT_EQ((*slow)["method"], method) << id;
    EXPECT_EQ((*slow)["code"], "OK") << id;
    EXPECT_EQ((*slow)["level"], "warning") << id;
    // Where the time went: a unary call waited for its memory and read its
    // request; a stream's message starts once read.
    const bool stream = id.find("stream") != std::string::npos;
    for (const char* field : {"memory_s", "read_s"}) {
      EXPECT_EQ(slow->contains(field), !stream) << id << " " << field;
    }
    double sum = 0;
    for (const char* field : {"memory_s", "read_s", "queue_s", "work_s"}) {
      if (!slow->contains(field)) continue;
      const double seconds = std::stod((*slow)[field].get<std::string>());
      EXPECT_GE(seconds, 0.0) << id << " " << field;
      sum += seconds;
    }
    EXPECT_TRUE(slow->contains("work_s")) << id;
    EXPECT_TRUE(slow->contains("queue_s")) << id;
    const std::string message = (*slow)["message"];
    // The stages add up to the call's time (each rounded to a millisecond).
    const double took = std::stod(message.substr(message.find("was slow: ") + 10));
    EXPECT_NEAR(sum, took, 0.003) << message;
  }
  for (const auto& [id, method, code] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"bad-kserve", "ModelInfer", "NOT_FOUND"},
           {"bad-v1", "ApplyRope", "INVALID_ARGUMENT"}}) {
    const nlohmann::json* failed = LineAbout(lines, id, "rejected");
    ASSERT_NE(failed, nullptr) << "no failure line for " << id << ":\n" << text;
    EXPECT_EQ((*failed)["method"], method) << id;
    EXPECT_EQ((*failed)["code"], code) << id;
    EXPECT_EQ((*failed)["level"], "debug") << id;
  }
}

class FrontsAlikeServer : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(server_.Start(POSENC_SERVER_BINARY, {"--threads=1"})) << server_.log_text();
  }
  testing::ServerProcess server_;
};

// Bytes that are no protobuf message: a tag whose varint never ends.
const std::string kNotAMessage = "\xff\xff\xff";

TEST_F(FrontsAlikeServer, AStreamMessageThatDoesNotParseIsAnsweredAndTheStreamGoesOn) {
  {
    std::vector<std::string> answers;
    const grpc::Status s = RawStream(server_.channel(), kV1, "StreamRope",
                                     {kNotAMessage, Rope(4).SerializeAsString()}, &answers);
    EXPECT_TRUE(s.ok()) << s.error_message();
    ASSERT_EQ(answers.size(), 2u) << "the stream must answer both messages";
    v1::RopeResponse first, second;
    ASSERT_TRUE(first.ParseFromString(answers[0]));
    ASSERT_TRUE(second.ParseFromString(answers[1]));
    EXPECT_EQ(first.error_code(), int(grpc::StatusCode::INVALID_ARGUMENT));
    EXPECT_NE(first.error_message().find("not a valid posenc.v1.RopeRequest"), std::string::npos)
        << first.error_message();
    EXPECT_EQ(second.error_code(), 0) << second.error_message();
    EXPECT_EQ(second.query_data().size(), size_t{4} * 8 * 128 * 4);
  }
  {
    std::vector<std::string> answers;
    const grpc::Status s = RawStream(server_.channel(), kKServe, "ModelStreamInfer",
                                     {kNotAMessage, Infer(4).SerializeAsString()}, &answers);
    EXPECT_TRUE(s.ok()) << s.error_message();
    ASSERT_EQ(answers.size(), 2u) << "the stream must answer both messages";
    inference::ModelStreamInferResponse first, second;
    ASSERT_TRUE(first.ParseFromString(answers[0]));
    ASSERT_TRUE(second.ParseFromString(answers[1]));
    EXPECT_NE(first.error_message().find("not a valid inference.ModelInferRequest"),
              std::string::npos)
        << first.error_message();
    EXPECT_EQ(second.error_message(), "");
    ASSERT_EQ(second.infer_response().raw_output_contents_size(), 1);
    EXPECT_EQ(second.infer_response().raw_output_contents(0).size(), size_t{4} * 8 * 128 * 4);
  }
}

// Every unary method of both services, control and tensor alike.
TEST_F(FrontsAlikeServer, EveryUnaryMethodRefusesAnUnparsableRequestByItsType) {
  int checked = 0;
  for (const char* service : {kV1, kKServe}) {
    const google::protobuf::ServiceDescriptor* d =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(service);
    ASSERT_NE(d, nullptr) << service;
    for (int i = 0; i < d->method_count(); ++i) {
      const google::protobuf::MethodDescriptor* m = d->method(i);
      if (m->client_streaming() || m->server_streaming()) continue;
      const grpc::Status s = RawUnary(server_.channel(), service, m->name(), kNotAMessage);
      EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
          << m->full_name() << ": " << s.error_message();
      EXPECT_NE(s.error_message().find("not a valid " + m->input_type()->full_name()),
                std::string::npos)
          << m->full_name() << ": " << s.error_message();
      ++checked;
    }
  }
  EXPECT_GE(checked, 16);
  // A method neither service has stays UNIMPLEMENTED, as gRPC answers it.
  EXPECT_EQ(RawUnary(server_.channel(), kV1, "NoSuchMethod", "").error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
}

TEST_F(FrontsAlikeServer, StreamAnswersAreValidUtf8HoweverTheCallersStringsAreCut) {
  // 3-byte characters: any cut at a byte count not a multiple of 3 splits one.
  std::string euros;
  for (int i = 0; i < 200; ++i) euros += "\xe2\x82\xac";
  {
    v1::RopeRequest bad = Rope(1);
    bad.set_request_id(euros);
    bad.set_rotary_dim(7);
    std::vector<std::string> answers;
    ASSERT_TRUE(
        RawStream(server_.channel(), kV1, "StreamRope", {bad.SerializeAsString()}, &answers).ok());
    ASSERT_EQ(answers.size(), 1u);
    v1::RopeResponse r;
    ASSERT_TRUE(r.ParseFromString(answers[0])) << "a strict client cannot decode the answer";
    EXPECT_TRUE(ValidUtf8(r.request_id()));
    EXPECT_TRUE(ValidUtf8(r.error_message()));
    EXPECT_FALSE(r.request_id().empty());
    EXPECT_LE(r.request_id().size(), 256u);
    EXPECT_EQ(euros.rfind(r.request_id(), 0), 0u) << "the id echoed is a prefix of the one sent";
  }
  {
    inference::ModelInferRequest bad = Infer(1);
    bad.set_model_name(euros);
    bad.set_id(euros);
    std::vector<std::string> answers;
    ASSERT_TRUE(RawStream(server_.channel(), kKServe, "ModelStreamInfer", {bad.SerializeAsString()},
                          &answers)
                    .ok());
    ASSERT_EQ(answers.size(), 1u);
    inference::ModelStreamInferResponse r;
    ASSERT_TRUE(r.ParseFromString(answers[0])) << "a strict client cannot decode the answer";
    EXPECT_NE(r.error_message().find("no model"), std::string::npos) << r.error_message();
    for (const std::string* s :
         {&r.error_message(), &r.infer_response().model_name(), &r.infer_response().id()}) {
      EXPECT_TRUE(ValidUtf8(*s));
      EXPECT_LE(s->size(), 300u);
    }
    EXPECT_EQ(euros.rfind(r.infer_response().id(), 0), 0u);
    EXPECT_EQ(euros.rfind(r.infer_response().model_name(), 0), 0u);
  }
}

// gRPC (1.51) receives a message whole before it checks the size limit
// (grpc/grpc#43012), before admission sees the call. The transport's memory
// quota, derived from the budget by default, is what bounds it.
TEST_F(FrontsAlikeServer, ControlRequestsOverAMebibyteAreRefusedUnparsed) {
  // An unknown field of 2 MiB pads requests that are otherwise empty.
  std::string padded("\xfa\x07\x80\x80\x80\x01", 6);  // field 127, 2 MiB
  padded += std::string(2 * kMiB, 'x');
  for (const auto& [service, method] :
       std::vector<std::pair<std::string, std::string>>{{kV1, "GetServerInfo"},
                                                        {kV1, "ListTables"},
                                                        {kKServe, "ServerLive"},
                                                        {kKServe, "ServerReady"}}) {
    const grpc::Status s = RawUnary(server_.NewChannel(1), service, method, padded);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << method << ": " << s.error_message();
    EXPECT_NE(s.error_message().find("at most 1048576 bytes"), std::string::npos)
        << s.error_message();
    // Just under the cap, the same padding is an unknown field and ignored.
    std::string small("\xfa\x07\x80\x80\x3f", 5);  // 1 MiB - 16 KiB
    small += std::string((1 << 20) - (16 << 10), 'x');
    EXPECT_TRUE(RawUnary(server_.NewChannel(1), service, method, small).ok()) << method;
  }
}

TEST(FrontsAlike, AMessageOverTheLimitIsRefusedWithoutTheServerHoldingIt) {
#ifdef POSENC_UNDER_SANITIZER
  GTEST_SKIP() << "resident memory under a sanitizer is mostly shadow memory and quarantine";
#endif
  const int64_t budget = 128 * kMiB;
  testing::ServerProcess server;
  ASSERT_TRUE(server.Start(POSENC_SERVER_BINARY,
                           {"--threads=1", "--max_inflight_bytes=" + std::to_string(budget),
                            "--max_request_bytes=" + std::to_string(60 * kMiB)}))
      << server.log_text();
  const std::string huge(1000 * kMiB, '\x01');
  for (const auto& [service, method] : std::vector<std::pair<std::string, std::string>>{
           {kV1, "ApplyRope"}, {kKServe, "ServerLive"}}) {
    const grpc::Status s = RawUnary(server.NewChannel(1), service, method, huge);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << method << ": " << s.error_message();
  }
  // The quota (budget + 2 x 64 MiB messages) plus the fixed overhead of the
  // memory bound (docs/server.md "Memory"): the message held whole would be
  // 1000 MiB more.
  const int64_t peak = testing::PeakRss(server.pid());
  std::printf("peak RSS %.0f MiB after two 1000 MiB messages (quota %lld MiB)\n",
              peak / double(kMiB), static_cast<long long>((budget + 128 * kMiB) / kMiB));
  EXPECT_LT(peak, budget + 128 * kMiB + 96 * kMiB);
  // And it goes on serving.
  auto stub = v1::PositionalEncoding::NewStub(server.NewChannel(2));
  grpc::ClientContext ctx;
  v1::RopeResponse resp;
  EXPECT_TRUE(stub->ApplyRope(&ctx, Rope(4), &resp).ok());
  EXPECT_TRUE(server.Alive());
}

}  // namespace
}  // namespace posenc
