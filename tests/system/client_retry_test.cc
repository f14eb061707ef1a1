// An overloaded replica answers RESOURCE_EXHAUSTED before reading a request,
// so the call never ran and may go again. With
// ClientOptions::retry_resource_exhausted the client retries it with backoff
// (under round_robin, on the next replica); without it the caller sees it.
#include <atomic>
#include <cstdio>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "posenc/client.h"
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
  EXPECT_LT(with * 4, without) << "retries should absorb most refusals";
  EXPECT_GT(ok_with, ok_without);
}

}  // namespace
}  // namespace posenc
