// StreamRope over a real socket against an in-process server: answers in
// request order under random sizes, reading ahead while earlier messages
// compute, admission refusing mid-stream, and a cancelled stream leaving
// nothing accounted.
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>

#include "eventually.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "posenc/backend.h"
#include "posenc/v1/posenc.grpc.pb.h"
#include "posenc/wire/requests.h"
#include "posenc/wire/tensors.h"
#include "server.h"
#include "server_process.h"
#include "test_tensors.h"

namespace posenc {
namespace {

using Clock = std::chrono::steady_clock;
using testing::Bytes;
using testing::Eventually;

constexpr int kRequestThreads = 2;

std::unique_ptr<server::Server> StartServer(int64_t max_message_bytes, int64_t budget_bytes,
                                            absl::Duration admission_wait) {
  server::ServerOptions o;
  o.listen_address = "127.0.0.1:0";
  o.request_threads = kRequestThreads;
  o.engine.max_request_tensor_bytes = max_message_bytes - (64 << 10);
  o.engine.max_message_bytes = max_message_bytes;
  o.engine.max_inflight_bytes = budget_bytes;
  o.engine.admission_wait = admission_wait;
  o.engine.cpu_threads = 1;
  o.engine.enable_cuda = false;
  auto s = server::Server::Start(o);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

std::unique_ptr<v1::PositionalEncoding::Stub> StubFor(const server::Server& s) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  return v1::PositionalEncoding::NewStub(grpc::CreateCustomChannel(
      "127.0.0.1:" + std::to_string(s.port()), grpc::InsecureChannelCredentials(), args));
}

RopeOptions Neox() {
  RopeOptions o;
  o.style = RopeStyle::kNeox;
  o.base = 10000;
  return o;
}

// A RoPE request of `tokens` x 8 heads x 64 float32, and what the CPU
// kernels make of it locally.
struct Case {
  v1::RopeRequest request;
  Bytes want;
  bool bad = false;
};
Case MakeCase(const std::string& id, int tokens, bool bad) {
  Case c;
  Bytes q = testing::RandomTensor(DType::kFloat32, int64_t{tokens} * 8 * 64);
  wire::SetRopeOptions(Neox(), &c.request);
  c.request.set_request_id(id);
  wire::SetTensor(TensorView{DType::kFloat32, {1, tokens, 8, 64}, q.data(), q.size()},
                  c.request.mutable_query(), c.request.mutable_query_data());
  c.bad = bad;
  if (bad) {
    c.request.set_rotary_dim(7);  // odd: refused
    return c;
  }
  RopeTensors t;
  t.query = testing::Mutable(DType::kFloat32, {1, tokens, 8, 64}, q);
  auto plan = PlanRope(Neox(), t);
  EXPECT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(CreateCpuBackend(1)->ApplyRope(*plan, q.data(), nullptr, {}).ok());
  c.want = q;
  return c;
}

// Occupies every thread of a server's request executor until destroyed, so
// that nothing admitted computes meanwhile. The tasks share their state, so
// one still waking up after the release touches nothing freed.
class ExecutorHold {
 public:
  ExecutorHold(server::RequestExecutor& executor, int threads) {
    for (int i = 0; i < threads; ++i) {
      executor.Submit([state = state_] {
        std::unique_lock<std::mutex> lock(state->mu);
        ++state->holding;
        state->cv.notify_all();
        state->cv.wait(lock, [&] { return state->released; });
      });
    }
    std::unique_lock<std::mutex> lock(state_->mu);
    state_->cv.wait(lock, [&] { return state_->holding == threads; });
  }
  ~ExecutorHold() {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->released = true;
    state_->cv.notify_all();
  }

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    int holding = 0;
    bool released = false;
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

// Random per-message sizes (1 to 2048 tokens, up to 4 MiB) and some bad
// messages among them: every answer comes back in request order, the good
// ones bit-for-bit those of the local kernels, the bad ones with their own
// error; meanwhile the stream had more than one message in flight. The
// read-ahead does not rest on timing: the executor is held until the stream
// has filled its window (4) with messages waiting to compute.
TEST(StreamRope, AnswersInRequestOrderWhileReadingAhead) {
  auto server = StartServer(8 << 20, int64_t{256} << 20, absl::Seconds(5));
  ASSERT_NE(server, nullptr);
  auto stub = StubFor(*server);
  std::uniform_int_distribution<int> tokens(1, 2048);
  std::bernoulli_distribution bad(0.15);
  constexpr int kMessages = 32;
  std::vector<Case> cases;
  for (int i = 0; i < kMessages; ++i) {
    cases.push_back(
        MakeCase("m" + std::to_string(i), tokens(testing::Rng()), i != 0 && bad(testing::Rng())));
  }

  // The same requests one unary call at a time, for comparison.
  double unary_seconds = 0;
  for (const Case& c : cases) {
    grpc::ClientContext ctx;
    v1::RopeResponse resp;
    const auto t0 = Clock::now();
    (void)stub->ApplyRope(&ctx, c.request, &resp);
    unary_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  }

  // Nothing computes until the stream has read ahead to its window: the
  // first message waits for a request thread while the next three are read.
  auto hold = std::make_unique<ExecutorHold>(server->executor(), kRequestThreads);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto stream = stub->StreamRope(&ctx);
  // Writes from another thread: the server's answers wait for this reader.
  std::thread writer([&] {
    for (const Case& c : cases) {
      if (!stream->Write(c.request)) return;
    }
    stream->WritesDone();
  });
  const bool window_filled = Eventually([&] { return server->stream_depth_peak() >= 4; },
                                        std::chrono::milliseconds(30000));
  hold.reset();
  EXPECT_TRUE(window_filled) << "the stream read ahead to " << server->stream_depth_peak()
                             << " messages while none could compute, not to its window of 4";
  const auto t0 = Clock::now();
  int answered = 0;
  v1::RopeResponse resp;
  for (; answered < kMessages && stream->Read(&resp); ++answered) {
    const Case& c = cases[answered];
    ASSERT_EQ(resp.request_id(), c.request.request_id()) << "answer " << answered;
    if (c.bad) {
      EXPECT_EQ(resp.error_code(), int(absl::StatusCode::kInvalidArgument)) << answered;
      EXPECT_NE(resp.error_message().find("rotary_dim"), std::string::npos) << resp.error_message();
      EXPECT_TRUE(resp.query_data().empty());
    } else {
      EXPECT_EQ(resp.error_code(), 0) << resp.error_message();
      ASSERT_EQ(resp.query_data().size(), c.want.size()) << answered;
      EXPECT_EQ(0, std::memcmp(resp.query_data().data(), c.want.data(), c.want.size()))
          << "answer " << answered << " differs from the local kernels";
    }
  }
  writer.join();
  EXPECT_EQ(answered, kMessages);
  EXPECT_FALSE(stream->Read(&resp));
  const grpc::Status end = stream->Finish();
  EXPECT_TRUE(end.ok()) << end.error_message();
  const double stream_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf(
      "%d messages: stream %.3f s, the same as unary calls one at a time %.3f s; "
      "most in flight on one stream: %d\n",
      kMessages, stream_seconds, unary_seconds, server->stream_depth_peak());
  EXPECT_GE(server->stream_depth_peak(), 2) << "the stream never read ahead";
  EXPECT_LE(server->stream_depth_peak(), 4) << "the stream read past its window";
  EXPECT_TRUE(Eventually([&] { return server->engine().admission().bytes() == 0; }))
      << server->engine().admission().bytes() << " bytes still accounted";
}

// A budget of one read: stream A answers its first message, then another
// caller holds the budget and A's next read is refused RESOURCE_EXHAUSTED
// after --admission_wait (2 s), as a unary call would be.
TEST(StreamRope, AdmissionRefusesMidStreamWhenTheBudgetIsTaken) {
  constexpr int64_t kMessage = 1 << 20;
  auto server = StartServer(kMessage, 2 * kMessage, absl::Seconds(2));
  ASSERT_NE(server, nullptr);
  auto& admission = server->engine().admission();
  auto stub = StubFor(*server);

  grpc::ClientContext a_ctx;
  a_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto a = stub->StreamRope(&a_ctx);
  // A holds the whole budget for its first read; B queues behind it.
  ASSERT_TRUE(Eventually([&] { return admission.bytes() == 2 * kMessage; }));
  grpc::ClientContext b_ctx;
  b_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto b = stub->StreamRope(&b_ctx);
  ASSERT_TRUE(Eventually([&] { return admission.waiting() == 1; }));

  Case first = MakeCase("a0", 64, false);
  ASSERT_TRUE(a->Write(first.request));
  v1::RopeResponse resp;
  ASSERT_TRUE(a->Read(&resp));
  EXPECT_EQ(resp.request_id(), "a0");
  EXPECT_EQ(resp.error_code(), 0) << resp.error_message();
  // B took the budget when A's first answer was sent; A's next read waits
  // and is refused.
  (void)a->Write(MakeCase("a1", 64, false).request);
  EXPECT_FALSE(a->Read(&resp));
  const grpc::Status s = a->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_NE(s.error_message().find("--max_inflight_bytes"), std::string::npos) << s.error_message();

  b_ctx.TryCancel();
  (void)b->Finish();
  EXPECT_TRUE(Eventually([&] { return admission.bytes() == 0 && admission.calls() == 0; }))
      << admission.bytes() << " bytes and " << admission.calls() << " calls still accounted";
}

// A call whose deadline passes while it waits for memory ran out of time;
// the server did not refuse it. The caller sees DEADLINE_EXCEEDED, and so do
// the server's metrics and logs: they used to count it RESOURCE_EXHAUSTED
// (or CANCELLED), telling operators the server was saturated when the
// caller's own deadline was short.
TEST(StreamRope, ACallOutOfTimeWaitingForMemoryIsCountedDeadlineExceeded) {
  constexpr int64_t kMessage = 1 << 20;
  server::ServerOptions o;
  o.listen_address = "127.0.0.1:0";
  o.metrics_listen = "127.0.0.1:0";
  o.request_threads = kRequestThreads;
  o.engine.max_request_tensor_bytes = kMessage - (64 << 10);
  o.engine.max_message_bytes = kMessage;
  o.engine.max_inflight_bytes = 2 * kMessage;
  o.engine.admission_wait = absl::Seconds(20);
  o.engine.cpu_threads = 1;
  o.engine.enable_cuda = false;
  auto started = server::Server::Start(o);
  ASSERT_TRUE(started.ok()) << started.status();
  auto& server = *started;
  auto& admission = server->engine().admission();
  auto stub = StubFor(*server);

  // A stream holds the whole budget for its first read.
  grpc::ClientContext a_ctx;
  a_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto a = stub->StreamRope(&a_ctx);
  ASSERT_TRUE(Eventually([&] { return admission.bytes() == 2 * kMessage; }));

  constexpr int kCalls = 3;
  const auto start = Clock::now();
  for (int i = 0; i < kCalls; ++i) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
    v1::RopeResponse resp;
    const grpc::Status s =
        stub->ApplyRope(&ctx, MakeCase("late" + std::to_string(i), 16, false).request, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
  }
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(15)) << "they waited out --admission_wait";

  // The caller's deadline timer cancels its call about when the server's
  // copy of the deadline passes; which the server hears first is a race
  // (WhyCancelled allows 50 ms), so a very late-scheduled server may still
  // count one CANCELLED. Never RESOURCE_EXHAUSTED: it did not refuse.
  auto count = [&](const std::string& text, const std::string& code) {
    const std::string key = R"(posenc_requests_total{code=")" + code + R"(",method="ApplyRope"} )";
    const size_t at = text.find(key);
    return at == std::string::npos ? 0 : std::atoi(text.c_str() + at + key.size());
  };
  std::string text;
  ASSERT_TRUE(Eventually([&] {
    text = testing::HttpGet(server->metrics_port(), "/metrics");
    return count(text, "DEADLINE_EXCEEDED") + count(text, "CANCELLED") == kCalls;
  })) << text;
  std::printf("the server counted %d DEADLINE_EXCEEDED, %d CANCELLED\n",
              count(text, "DEADLINE_EXCEEDED"), count(text, "CANCELLED"));
  EXPECT_GE(count(text, "DEADLINE_EXCEEDED"), 1) << text;
  EXPECT_EQ(text.find(R"(code="RESOURCE_EXHAUSTED")"), std::string::npos) << text;
  EXPECT_EQ(admission.waiting(), 0);

  a_ctx.TryCancel();
  (void)a->Finish();
  EXPECT_TRUE(Eventually([&] { return admission.bytes() == 0 && admission.calls() == 0; }))
      << admission.bytes() << " bytes and " << admission.calls() << " calls still accounted";
}

// An idle stream (its messages answered, the next not sent) holds one
// slot of --max_inflight: the read it had started ahead gives its own slot
// back. At --max_inflight=2 a second stream is then served, where it used
// to be refused (RESOURCE_EXHAUSTED) while the first waited.
TEST(StreamRope, AnIdleStreamHoldsOneSlot) {
  server::ServerOptions o;
  o.listen_address = "127.0.0.1:0";
  o.request_threads = kRequestThreads;
  o.engine.max_inflight_requests = 2;
  o.engine.cpu_threads = 1;
  o.engine.enable_cuda = false;
  auto started = server::Server::Start(o);
  ASSERT_TRUE(started.ok()) << started.status();
  auto& server = *started;
  auto stub = StubFor(*server);
  v1::RopeResponse resp;

  grpc::ClientContext a_ctx;
  a_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto a = stub->StreamRope(&a_ctx);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(a->Write(MakeCase("a" + std::to_string(i), 16, false).request));
    ASSERT_TRUE(a->Read(&resp));
    EXPECT_EQ(resp.error_code(), 0) << resp.error_message();
  }
  EXPECT_TRUE(Eventually([&] { return server->engine().admission().calls() == 1; }))
      << server->engine().admission().calls() << " slots held by an idle stream";

  grpc::ClientContext b_ctx;
  b_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto b = stub->StreamRope(&b_ctx);
  const Case second = MakeCase("b0", 16, false);
  ASSERT_TRUE(b->Write(second.request));
  ASSERT_TRUE(b->Read(&resp)) << b->Finish().error_message();
  EXPECT_EQ(resp.request_id(), "b0");
  EXPECT_EQ(resp.error_code(), 0) << resp.error_message();
  ASSERT_EQ(resp.query_data().size(), second.want.size());
  EXPECT_EQ(0, std::memcmp(resp.query_data().data(), second.want.data(), second.want.size()));
  b->WritesDone();
  EXPECT_TRUE(b->Finish().ok());

  // The first stream goes on as before.
  ASSERT_TRUE(a->Write(MakeCase("a3", 16, false).request));
  ASSERT_TRUE(a->Read(&resp));
  EXPECT_EQ(resp.request_id(), "a3");
  a->WritesDone();
  EXPECT_TRUE(a->Finish().ok());
}

// A caller that cancels with messages in flight, computing and unread, at
// random moments: the server finishes the stream and accounts nothing
// afterwards (no bytes, slots or busy calls left behind).
TEST(StreamRope, CancelMidStreamLeavesNothingAccounted) {
  auto server = StartServer(8 << 20, int64_t{256} << 20, absl::Seconds(5));
  ASSERT_NE(server, nullptr);
  auto& admission = server->engine().admission();
  auto stub = StubFor(*server);
  std::uniform_int_distribution<int> tokens(256, 2048);
  std::uniform_int_distribution<int> pause_us(0, 3000);
  for (int round = 0; round < 8; ++round) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    auto stream = stub->StreamRope(ctx.get());
    std::atomic<bool> stop{false};
    std::thread writer([&] {
      for (int i = 0; i < 16 && !stop; ++i) {
        if (!stream->Write(
                MakeCase("c" + std::to_string(i), tokens(testing::Rng()), false).request)) {
          return;
        }
      }
    });
    v1::RopeResponse resp;
    for (int i = 0; i < round % 4; ++i) ASSERT_TRUE(stream->Read(&resp)) << round;
    // Cancel while the server has messages in flight, at a random moment of
    // their reading, computing or writing.
    ASSERT_TRUE(Eventually([&] { return server->busy_calls() > 0; })) << round;
    std::this_thread::sleep_for(std::chrono::microseconds(pause_us(testing::Rng())));
    ctx->TryCancel();
    stop = true;
    writer.join();
    const grpc::Status s = stream->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::CANCELLED) << s.error_message();
    EXPECT_TRUE(Eventually([&] {
      return admission.bytes() == 0 && admission.calls() == 0 && server->busy_calls() == 0;
    })) << "round "
        << round << ": " << admission.bytes() << " bytes, " << admission.calls() << " calls, "
        << server->busy_calls() << " busy still accounted";
  }
}

// A stream whose deadline passes with messages in flight ends with
// DEADLINE_EXCEEDED after answering in order what it answered, and leaves
// nothing accounted.
TEST(StreamRope, DeadlineMidStreamEndsItAndLeavesNothingAccounted) {
  auto server = StartServer(8 << 20, int64_t{256} << 20, absl::Seconds(5));
  ASSERT_NE(server, nullptr);
  auto& admission = server->engine().admission();
  auto stub = StubFor(*server);
  std::vector<Case> cases;
  for (int i = 0; i < 8; ++i) cases.push_back(MakeCase("d" + std::to_string(i), 2048, false));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(300));
  auto stream = stub->StreamRope(&ctx);
  std::thread writer([&] {
    for (int i = 0; i < 1000; ++i) {
      if (!stream->Write(cases[i % cases.size()].request)) return;
    }
  });
  v1::RopeResponse resp;
  int answered = 0;
  for (; stream->Read(&resp); ++answered) {
    ASSERT_EQ(resp.request_id(), cases[answered % cases.size()].request.request_id());
  }
  writer.join();
  const grpc::Status s = stream->Finish();
  std::printf("%d answers in order before the deadline\n", answered);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
  EXPECT_LT(answered, 1000);
  EXPECT_TRUE(Eventually([&] {
    return admission.bytes() == 0 && admission.calls() == 0 && server->busy_calls() == 0;
  })) << admission.bytes()
      << " bytes, " << admission.calls() << " calls, " << server->busy_calls()
      << " busy still accounted";
}

}  // namespace
}  // namespace posenc
