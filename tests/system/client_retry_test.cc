// An overloaded replica answers RESOURCE_EXHAUSTED before reading a request,
// so the call never ran and may go again. With
// ClientOptions::retry_resource_exhausted the client retries it with backoff
// (under round_robin, on the next replica); without it the caller sees it.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "posenc/client.h"
#include "posenc/v1/posenc.grpc.pb.h"
#include "server_process.h"

namespace posenc {
namespace {

// Four callers, one server slot, no admission wait: refusals are certain.
int RefusalsSeen(int port, bool retry, int* ok) {
  ClientOptions o;
  o.target = "127.0.0.1:" + std::to_string(port);
  o.retry_resource_exhausted = retry;
  o.max_attempts = 5;
  o.initial_backoff = absl::Milliseconds(5);
  o.max_backoff = absl::Milliseconds(80);
  auto client = Client::Create(o);
  EXPECT_TRUE(client.ok());
  std::atomic<int> refused{0}, good{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      std::vector<float> q(256 * 8 * 64, 0.5f);
      for (int i = 0; i < 40; ++i) {
        RopeTensors t;
        t.query = MutableTensor{DType::kFloat32, {1, 256, 8, 64}, q.data(), q.size() * 4};
        const absl::Status s = (*client)->ApplyRope({}, t);
        if (s.code() == absl::StatusCode::kResourceExhausted) ++refused;
        if (s.ok()) ++good;
      }
    });
  }
  for (std::thread& t : callers) t.join();
  *ok = good;
  return refused;
}

// A replica that answers every ApplyRope with one status and counts the
// attempts that reached it: what the channel's retry policy does, without
// the timing of a real overload.
class RefusingService final : public v1::PositionalEncoding::CallbackService {
 public:
  explicit RefusingService(grpc::StatusCode code) : code_(code) {}
  grpc::ServerUnaryReactor* ApplyRope(grpc::CallbackServerContext* ctx, const v1::RopeRequest*,
                                      v1::RopeResponse*) override {
    attempts_.fetch_add(1);
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status(code_, "refused by the test's replica"));
    return reactor;
  }
  int TakeAttempts() { return attempts_.exchange(0); }

 private:
  const grpc::StatusCode code_;
  std::atomic<int> attempts_{0};
};

// Attempts one call makes against a replica that always answers `code`.
int AttemptsAgainst(grpc::StatusCode code, bool retry_resource_exhausted, absl::StatusCode* seen) {
  RefusingService service(code);
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  EXPECT_NE(server, nullptr);
  EXPECT_GT(port, 0);
  ClientOptions o;
  o.target = "127.0.0.1:" + std::to_string(port);
  o.retry_resource_exhausted = retry_resource_exhausted;
  o.max_attempts = 5;
  o.health_check_service = "";  // the replica serves no health service
  o.initial_backoff = absl::Milliseconds(1);
  o.max_backoff = absl::Milliseconds(4);
  auto client = Client::Create(o);
  EXPECT_TRUE(client.ok()) << client.status();
  std::vector<float> q(1 * 4 * 2 * 8, 0.5f);
  RopeTensors t;
  t.query = MutableTensor{DType::kFloat32, {1, 4, 2, 8}, q.data(), q.size() * 4};
  *seen = (*client)->ApplyRope({}, t).code();
  client->reset();
  server->Shutdown();
  return service.TakeAttempts();
}

TEST(ClientRetry, TheRetryPolicyDecidesHowOftenARefusedCallGoesAgain) {
  absl::StatusCode seen;
  EXPECT_EQ(AttemptsAgainst(grpc::StatusCode::RESOURCE_EXHAUSTED, false, &seen), 1);
  EXPECT_EQ(seen, absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(AttemptsAgainst(grpc::StatusCode::RESOURCE_EXHAUSTED, true, &seen), 5);
  EXPECT_EQ(seen, absl::StatusCode::kResourceExhausted);
  // UNAVAILABLE goes again whatever the RESOURCE_EXHAUSTED setting.
  EXPECT_EQ(AttemptsAgainst(grpc::StatusCode::UNAVAILABLE, false, &seen), 5);
  EXPECT_EQ(seen, absl::StatusCode::kUnavailable);
  // A refusal that says the request was wrong never goes again.
  EXPECT_EQ(AttemptsAgainst(grpc::StatusCode::INVALID_ARGUMENT, true, &seen), 1);
  EXPECT_EQ(seen, absl::StatusCode::kInvalidArgument);
}

// The same policy against the real server overloaded. How many refusals
// retries absorb depends on timing (typically 9 in 10; under a loaded host
// as few as 3 in 4), so the bound is loose; the exact counts are the test
// above's.
TEST(ClientRetry, ResourceExhaustedIsRetriedOnlyWhenAsked) {
  testing::ServerProcess server;
  ASSERT_TRUE(server.Start(POSENC_SERVER_BINARY,
                           {"--max_inflight=1", "--admission_wait_ms=0", "--threads=1"}))
      << server.log_text();
  int ok_without = 0, ok_with = 0;
  const int without = RefusalsSeen(server.port(), false, &ok_without);
  const int with = RefusalsSeen(server.port(), true, &ok_with);
  std::printf("160 calls each: without retry %d refused (%d ok); with retry %d refused (%d ok)\n",
              without, ok_without, with, ok_with);
  ASSERT_GT(without, 8) << "the server was not overloaded; nothing was tested";
  EXPECT_LT(with * 2, without) << "retries should absorb most refusals";
  EXPECT_GT(ok_with, ok_without);
}

// A listener on a loopback port that accepts each connection and closes it
// at once: to a gRPC client, a server that is not there (no HTTP/2
// handshake ever comes), so it backs off and tries again. Counts the tries.
class RefusingListener {
 public:
  RefusingListener() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::listen(fd_, 64) != 0 || ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      ADD_FAILURE() << "no loopback listener";
      return;
    }
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] {
      while (!stop_) {
        pollfd p{fd_, POLLIN, 0};
        if (::poll(&p, 1, 20) <= 0) continue;
        const int c = ::accept(fd_, nullptr, nullptr);
        if (c < 0) continue;
        ++accepted_;
        ::close(c);
      }
    });
  }
  ~RefusingListener() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    if (fd_ >= 0) ::close(fd_);
  }
  int port() const { return port_; }
  int accepted() const { return accepted_.load(); }

 private:
  int fd_ = -1, port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> accepted_{0};
  std::thread thread_;
};

// ClientOptions::max_reconnect_backoff bounds the wait between attempts to
// reach an address that is down, so a replica that comes back is found
// within it. Over 5 s of calls: capped at 200 ms, an attempt
// every 0.2 s or so after the first second (about 20; a loaded machine
// makes fewer, not more); at the default cap (5 s), gRPC's own schedule
// (1, 1.6, 2.6 s apart ...) makes 3 or 4, and a missing cap the same.
TEST(ClientReconnect, MaxReconnectBackoffBoundsTheWaitBetweenAttempts) {
  int attempts[2] = {0, 0};
  for (const bool capped : {true, false}) {
    RefusingListener down;
    ClientOptions o;
    o.target = "127.0.0.1:" + std::to_string(down.port());
    o.max_attempts = 2;
    if (capped) o.max_reconnect_backoff = absl::Milliseconds(200);
    auto client = Client::Create(o);
    ASSERT_TRUE(client.ok()) << client.status();
    std::vector<float> q(1 * 4 * 2 * 8, 0.5f);
    RopeTensors t;
    t.query = MutableTensor{DType::kFloat32, {1, 4, 2, 8}, q.data(), q.size() * 4};
    CallOptions call;
    call.timeout = absl::Seconds(1);
    // Calls keep asking for a connection (an idle channel makes no
    // attempts); each fails at once while the address is backed off.
    for (const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
         std::chrono::steady_clock::now() < end;) {
      EXPECT_EQ((*client)->ApplyRope({}, t, call).code(), absl::StatusCode::kUnavailable);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    attempts[capped ? 0 : 1] = down.accepted();
  }
  std::printf("connection attempts in 5 s: capped at 200 ms %d, at the default %d\n", attempts[0],
              attempts[1]);
  EXPECT_GE(attempts[0], 10) << "the cap did not shorten the waits";
  EXPECT_LE(attempts[1], 6) << "the default's waits were not gRPC's growing ones";
}

TEST(ClientReconnect, RefusesAMaxReconnectBackoffOutOfRange) {
  for (const absl::Duration d : {absl::ZeroDuration(), absl::Milliseconds(-1), absl::Hours(25)}) {
    ClientOptions o;
    o.max_reconnect_backoff = d;
    auto client = Client::Create(o);
    ASSERT_FALSE(client.ok());
    EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(client.status().message().find("ClientOptions.max_reconnect_backoff"),
              std::string::npos)
        << client.status();
  }
}

}  // namespace
}  // namespace posenc
