#include "engine.h"

#include <condition_variable>
#include <mutex>
#include <thread>

#include "gtest/gtest.h"
#include "posenc/client.h"
#include "test_tensors.h"

namespace posenc::server {
namespace {

v1::RopeRequest Request(testing::Bytes& q) {
  v1::RopeRequest r;
  SetTensor(TensorView{DType::kFloat32, {1, 64, 4, 64}, q.data(), q.size()}, r.mutable_query(),
            r.mutable_query_data());
  return r;
}

TEST(Engine, SaturatedServerSaysResourceExhaustedAndKeepsServing) {
  EngineOptions o;
  o.max_inflight_requests = 1;
  o.cpu_threads = 1;
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  testing::Bytes q = testing::RandomTensor(DType::kFloat32, 64 * 4 * 64);
  const v1::RopeRequest req = Request(q);

  // The first call parks inside the backend until released.
  std::mutex mu;
  std::condition_variable cv;
  bool inside = false, release = false;
  RunContext parked;
  parked.cancelled = [&] {
    std::unique_lock<std::mutex> lock(mu);
    inside = true;
    cv.notify_all();
    cv.wait(lock, [&] { return release; });
    return false;
  };
  absl::Status first;
  std::thread t([&] {
    v1::RopeResponse resp;
    first = (*engine)->ApplyRope(req, &resp, parked);
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return inside; });
  }
  v1::RopeResponse resp;
  absl::Status second = (*engine)->ApplyRope(req, &resp, {});
  EXPECT_EQ(second.code(), absl::StatusCode::kResourceExhausted) << second;
  EXPECT_NE(second.message().find("saturated"), absl::string_view::npos) << second;
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
  }
  cv.notify_all();
  t.join();
  EXPECT_TRUE(first.ok()) << first;
  EXPECT_EQ((*engine)->inflight(), 0);
  EXPECT_TRUE((*engine)->ApplyRope(req, &resp, {}).ok());
}

TEST(Engine, FailedValidationLeavesNoPartialResponse) {
  auto engine = Engine::Create(EngineOptions{});
  ASSERT_TRUE(engine.ok());
  testing::Bytes q = testing::RandomTensor(DType::kFloat32, 64 * 4 * 64);
  v1::RopeRequest req = Request(q);
  req.mutable_offsets()->set_dtype(v1::DATA_TYPE_FLOAT32);  // offsets must be integers
  req.mutable_offsets()->add_shape(1);
  req.mutable_offsets()->set_data(std::string(4, '\0'));
  v1::RopeResponse resp;
  absl::Status s = (*engine)->ApplyRope(req, &resp, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("offsets.dtype"), absl::string_view::npos) << s;
}

}  // namespace
}  // namespace posenc::server
