// The real posenc-server with --log_format=json: every line it writes is a
// JSON object, and lines about a call carry the caller's request id
// (x-request-id, else the message's own), cleaned of control characters,
// and the trace id of its W3C traceparent.
#include <signal.h>

#include <chrono>
#include <set>
#include <thread>

#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "kserve/grpc_service.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "posenc/v1/posenc.grpc.pb.h"
#include "server_process.h"

namespace posenc {
namespace {

// A RoPE request the server refuses (INVALID_ARGUMENT: odd rotary_dim).
v1::RopeRequest BadRope(const std::string& id) {
  v1::RopeRequest r;
  r.set_request_id(id);
  r.mutable_query()->set_dtype(v1::DATA_TYPE_FLOAT32);
  for (int64_t d : {1, 2, 1, 8}) r.mutable_query()->add_shape(d);
  r.set_query_data(std::string(2 * 8 * 4, '\0'));
  r.set_rotary_dim(7);
  return r;
}

std::vector<nlohmann::json> ParseLines(const std::string& text) {
  std::vector<nlohmann::json> out;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    nlohmann::json j;
    EXPECT_NO_THROW(j = nlohmann::json::parse(line)) << "not JSON: " << line;
    if (!j.is_object()) {
      ADD_FAILURE() << "not a JSON object: " << line;
      continue;
    }
    for (const char* key : {"time", "level", "message"}) {
      EXPECT_TRUE(j.contains(key) && j[key].is_string()) << key << " missing: " << line;
    }
    out.push_back(j);
  }
  return out;
}

// The lines whose request_id field is `id`.
std::vector<nlohmann::json> LinesFor(const std::vector<nlohmann::json>& lines,
                                     const std::string& id) {
  std::vector<nlohmann::json> out;
  for (const auto& j : lines) {
    if (j.contains("request_id") && j["request_id"] == id) out.push_back(j);
  }
  return out;
}

TEST(JsonLogs, EveryLineParsesAndCallLinesCarryTheirRequestId) {
  testing::ServerProcess server;
  ASSERT_TRUE(
      server.Start(POSENC_SERVER_BINARY, {"--log_format=json", "--log_level=debug",
                                          "--max_inflight=2", "--metrics_listen=127.0.0.1:0"}))
      << server.log_text();
  const int metrics_port = testing::MetricsPortFromLog(server);
  ASSERT_NE(metrics_port, 0) << server.log_text();
  auto stub = v1::PositionalEncoding::NewStub(server.channel());
  // /metrics' calls holding an admission slot, once it reads `want` (or
  // after 20 s).
  const auto inflight_reaches = [&](double want) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    double inflight = -1;
    while ((inflight = testing::MetricValue(metrics_port, "posenc_inflight_requests")) != want &&
           std::chrono::steady_clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return inflight;
  };
  // Each call starts once the calls before it have given their slots back:
  // a call's slot goes back only after its caller has the answer, so with
  // --max_inflight=2 a loaded server could otherwise refuse a call meant to
  // be admitted, and that refusal's line would hold back (refusal lines are
  // at most one a second) the one the test expects.
  const auto settle = [&] {
    EXPECT_EQ(inflight_reaches(0), 0.0) << "calls before still hold admission slots";
  };

  // Unary, id in metadata (quotes and a backslash: printable, so gRPC
  // carries them; the log cleans the backslash).
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("x-request-id", "meta-\"1\"\\");
    v1::RopeResponse resp;
    EXPECT_EQ(stub->ApplyRope(&ctx, BadRope("ignored: metadata wins"), &resp).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  settle();
  // Unary, id only in the message: a newline, a quote and a control byte.
  {
    grpc::ClientContext ctx;
    v1::RopeResponse resp;
    EXPECT_EQ(stub->ApplyRope(&ctx, BadRope("msg\n\"2\"\x01"), &resp).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  settle();
  // Unary with an id far over the bound.
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("x-request-id", std::string(5000, 'L'));
    v1::RopeResponse resp;
    EXPECT_FALSE(stub->ApplyRope(&ctx, BadRope(""), &resp).ok());
  }
  settle();
  // And one in the message, a megabyte long.
  {
    grpc::ClientContext ctx;
    v1::RopeResponse resp;
    EXPECT_FALSE(stub->ApplyRope(&ctx, BadRope(std::string(1 << 20, 'M')), &resp).ok());
  }
  settle();
  // A stream: its bad message is logged with the message's id.
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("x-request-id", "stream-3");
    auto stream = stub->StreamRope(&ctx);
    ASSERT_TRUE(stream->Write(BadRope("stream-msg-4")));
    stream->WritesDone();
    v1::RopeResponse resp;
    ASSERT_TRUE(stream->Read(&resp));
    EXPECT_EQ(resp.error_code(), int(grpc::StatusCode::INVALID_ARGUMENT));
    EXPECT_TRUE(stream->Finish().ok());
  }
  // A refusal: two idle streams hold both slots (--max_inflight=2). The
  // third call waits on /metrics for both to hold theirs, not on time. (A
  // probing call instead could take a slot before a stream does and have
  // that stream refused.)
  {
    settle();
    grpc::ClientContext c1, c2, c3;
    auto s1 = stub->StreamRope(&c1);
    auto s2 = stub->StreamRope(&c2);
    EXPECT_EQ(inflight_reaches(2), 2.0) << "the two streams never both held a slot";
    c3.AddMetadata("x-request-id", "refused-5");
    v1::RopeResponse resp;
    EXPECT_EQ(stub->ApplyRope(&c3, BadRope(""), &resp).error_code(),
              grpc::StatusCode::RESOURCE_EXHAUSTED);
    c1.TryCancel();
    c2.TryCancel();
    (void)s1->Finish();
    (void)s2->Finish();
  }
  ASSERT_EQ(kill(server.pid(), SIGTERM), 0);
  ASSERT_TRUE(server.Exited(std::chrono::seconds(15)));
  const std::string text = server.log_text();
  std::printf("%s", text.c_str());
  const std::vector<nlohmann::json> lines = ParseLines(text);
  ASSERT_GE(lines.size(), 5u);

  const auto meta = LinesFor(lines, "meta-\"1\"\\x5c");
  ASSERT_EQ(meta.size(), 1u) << "the failing call's line carries its x-request-id";
  EXPECT_EQ(meta[0]["method"], "ApplyRope");
  EXPECT_EQ(meta[0]["code"], "INVALID_ARGUMENT");
  EXPECT_EQ(meta[0]["level"], "debug");
  EXPECT_NE(meta[0]["message"].get<std::string>().find("rotary_dim"), std::string::npos);
  EXPECT_TRUE(LinesFor(lines, "ignored: metadata wins").empty());

  EXPECT_EQ(LinesFor(lines, "msg\\x0a\"2\"\\x01").size(), 1u);
  EXPECT_EQ(LinesFor(lines, std::string(128, 'L')).size(), 1u) << "ids are cut to 128 bytes";
  EXPECT_EQ(LinesFor(lines, std::string(128, 'M')).size(), 1u) << "ids are cut to 128 bytes";
  const auto streamed = LinesFor(lines, "stream-msg-4");
  ASSERT_EQ(streamed.size(), 1u);
  EXPECT_EQ(streamed[0]["method"], "StreamRope");
  const auto refused = LinesFor(lines, "refused-5");
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_EQ(refused[0]["level"], "warning");
  EXPECT_EQ(refused[0]["code"], "RESOURCE_EXHAUSTED");
  // Lines about no call have no id.
  bool startup = false;
  for (const auto& j : lines) {
    if (j["message"].get<std::string>().find("listening on port") != std::string::npos) {
      startup = true;
      EXPECT_FALSE(j.contains("request_id"));
    }
  }
  EXPECT_TRUE(startup);
}

// The default text format names the id too, after the message.
TEST(JsonLogs, TextLinesNameTheRequestIdToo) {
  testing::ServerProcess server;
  ASSERT_TRUE(server.Start(POSENC_SERVER_BINARY, {"--log_level=debug"})) << server.log_text();
  auto stub = v1::PositionalEncoding::NewStub(server.channel());
  grpc::ClientContext ctx;
  ctx.AddMetadata("x-request-id", "text-7");
  v1::RopeResponse resp;
  EXPECT_FALSE(stub->ApplyRope(&ctx, BadRope(""), &resp).ok());
  ASSERT_EQ(kill(server.pid(), SIGTERM), 0);
  ASSERT_TRUE(server.Exited(std::chrono::seconds(15)));
  const std::string text = server.log_text();
  EXPECT_NE(text.find("ApplyRope rejected: INVALID_ARGUMENT"), std::string::npos) << text;
  EXPECT_NE(text.find("request_id=text-7"), std::string::npos) << text;
  EXPECT_EQ(text.find("{\"time\""), std::string::npos) << text;
}

// --slow_call_ms: a call over it is logged as slow, with its id.
TEST(JsonLogs, SlowCallsAreLoggedWithTheirId) {
  testing::ServerProcess server;
  ASSERT_TRUE(server.Start(POSENC_SERVER_BINARY, {"--log_format=json", "--slow_call_ms=1"}))
      << server.log_text();
  auto stub = v1::PositionalEncoding::NewStub(server.channel());
  // 8 MiB of float32 to rotate: well over a millisecond from arrival to answer.
  v1::RopeRequest r = BadRope("");
  r.clear_rotary_dim();
  r.mutable_query()->clear_shape();
  for (int64_t d : {1, 2048, 8, 128}) r.mutable_query()->add_shape(d);
  r.set_query_data(std::string(size_t{2048} * 8 * 128 * 4, '\0'));
  grpc::ClientContext ctx;
  ctx.AddMetadata("x-request-id", "slow-8");
  v1::RopeResponse resp;
  const grpc::Status s = stub->ApplyRope(&ctx, r, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(kill(server.pid(), SIGTERM), 0);
  ASSERT_TRUE(server.Exited(std::chrono::seconds(15)));
  const std::string text = server.log_text();
  const auto slow = LinesFor(ParseLines(text), "slow-8");
  ASSERT_EQ(slow.size(), 1u) << text;
  EXPECT_EQ(slow[0]["level"], "warning");
  EXPECT_EQ(slow[0]["code"], "OK");
  EXPECT_NE(slow[0]["message"].get<std::string>().find("ApplyRope was slow"), std::string::npos)
      << text;
}

// A caller's traceparent (W3C Trace Context) puts its trace id on the
// lines about its call, on either front, and on the line a LogSettings
// change writes; one the specification does not let a receiver use
// (upper-case digits, a zero trace id) or a second header puts none.
TEST(JsonLogs, CallLinesCarryTheCallersTraceId) {
  testing::ServerProcess server;
  ASSERT_TRUE(server.Start(POSENC_SERVER_BINARY, {"--log_format=json", "--log_level=debug"}))
      << server.log_text();
  const std::string trace = "4bf92f3577b34da6a3ce929d0e0e4736";
  const std::string parent = "-00f067aa0ba902b7-01";
  auto stub = v1::PositionalEncoding::NewStub(server.channel());
  const std::vector<std::vector<std::string>> headers = {
      {"00-" + trace + parent},
      {"00-4BF92F3577B34DA6A3CE929D0E0E4736" + parent},
      {"00-" + std::string(32, '0') + parent},
      {"00-" + trace + parent, "00-" + trace + parent}};
  for (size_t i = 0; i < headers.size(); ++i) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("x-request-id", "traced-" + std::to_string(i));
    for (const std::string& h : headers[i]) ctx.AddMetadata("traceparent", h);
    v1::RopeResponse resp;
    EXPECT_FALSE(stub->ApplyRope(&ctx, BadRope(""), &resp).ok());
  }
  auto kserve = inference::GRPCInferenceService::NewStub(server.channel());
  grpc::ClientContext kctx;
  kctx.AddMetadata("x-request-id", "traced-kserve");
  kctx.AddMetadata("traceparent", "00-" + trace + parent);
  inference::ModelInferRequest bad;
  bad.set_model_name("no-such-model");
  inference::ModelInferResponse kresp;
  EXPECT_FALSE(kserve->ModelInfer(&kctx, bad, &kresp).ok());
  // A line a method writes itself: the setting changed, by whom.
  grpc::ClientContext sctx;
  sctx.AddMetadata("x-request-id", "traced-settings");
  sctx.AddMetadata("traceparent", "00-" + trace + parent);
  inference::LogSettingsRequest quieter;
  (*quieter.mutable_settings())["log_level"].set_string_param("info");
  inference::LogSettingsResponse sresp;
  const grpc::Status changed = kserve->LogSettings(&sctx, quieter, &sresp);
  EXPECT_TRUE(changed.ok()) << changed.error_message();

  ASSERT_EQ(kill(server.pid(), SIGTERM), 0);
  ASSERT_TRUE(server.Exited(std::chrono::seconds(15)));
  const auto lines = ParseLines(server.log_text());
  for (const std::string id :
       {"traced-0", "traced-1", "traced-2", "traced-3", "traced-kserve", "traced-settings"}) {
    const auto mine = LinesFor(lines, id);
    ASSERT_EQ(mine.size(), 1u) << id << "\n" << server.log_text();
    const bool valid = id == "traced-0" || id == "traced-kserve" || id == "traced-settings";
    if (valid) {
      EXPECT_EQ(mine[0].value("trace_id", ""), trace) << mine[0].dump();
    } else {
      EXPECT_FALSE(mine[0].contains("trace_id")) << mine[0].dump();
    }
  }
}

}  // namespace
}  // namespace posenc
