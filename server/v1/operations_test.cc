#include "v1/operations.h"

#include <fcntl.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/engine.h"
#include "gtest/gtest.h"
#include "posenc/client.h"
#include "stand_in_device.h"
#include "test_tensors.h"

namespace posenc::server {
namespace {

v1::RopeRequest Request(testing::Bytes& q) {
  v1::RopeRequest r;
  SetTensor(TensorView{DType::kFloat32, {1, 64, 4, 64}, q.data(), q.size()}, r.mutable_query(),
            r.mutable_query_data());
  return r;
}

// before_compute (the in-place call's claim of its id) runs once a call
// can no longer be refused with its tensors as they were: not for a call
// refused earlier, and its own refusal stops the call before any write.
TEST(Engine, BeforeComputeRunsOnceJustBeforeTheFirstWrite) {
  EngineOptions o;
  o.cpu_threads = 1;
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  testing::Bytes q = testing::RandomTensor(DType::kFloat32, 64 * 4 * 64);
  const std::string original(q.begin(), q.end());
  int calls = 0;
  const auto run = [&](v1::RopeRequest r, absl::Status claim, v1::RopeResponse* resp) {
    auto admission = (*engine)->Admit(RequestBytes(r));
    EXPECT_TRUE(admission.ok());
    return ApplyRope(**engine, &r, resp, RunContext{}, *admission, [&, claim] {
      ++calls;
      return claim;
    });
  };
  v1::RopeResponse resp;
  ASSERT_TRUE(run(Request(q), absl::OkStatus(), &resp).ok());
  EXPECT_EQ(calls, 1);
  EXPECT_NE(resp.query_data(), original) << "rotated";
  // Refused by its plan (an odd rotary_dim): no claim.
  v1::RopeRequest odd = Request(q);
  odd.set_rotary_dim(7);
  EXPECT_EQ(run(odd, absl::OkStatus(), &resp).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(calls, 1);
  // A refused claim: the call ends with it, its tensor unwritten.
  v1::RopeResponse refused;
  EXPECT_EQ(run(Request(q), absl::AbortedError("seen"), &refused).code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(refused.query_data(), original);
}

TEST(Engine, SaturatedServerSaysResourceExhaustedAndKeepsServing) {
  EngineOptions o;
  o.max_inflight_requests = 1;
  o.cpu_threads = 1;
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  testing::Bytes q = testing::RandomTensor(DType::kFloat32, 64 * 4 * 64);
  const v1::RopeRequest req = Request(q);
  // The engine consumes a request's tensors; each call gets its own copy.
  auto call = [&](const RunContext& rc, v1::RopeResponse* resp) {
    v1::RopeRequest r = req;
    return ApplyRope(**engine, &r, resp, rc);
  };

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
    first = call(parked, &resp);
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return inside; });
  }
  v1::RopeResponse resp;
  absl::Status second = call({}, &resp);
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
  EXPECT_TRUE(call({}, &resp).ok());
}

TEST(Engine, BytesInFlightAreBounded) {
  EngineOptions o;
  o.max_request_tensor_bytes = 512 << 10;
  o.max_message_bytes = 512 << 10;
  o.max_inflight_bytes = 1 << 20;
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  testing::Bytes q = testing::RandomTensor(DType::kFloat32, 64 * 4 * 64);  // 64 KiB
  std::mutex mu;
  std::condition_variable cv;
  int parked = 0;
  bool release = false;
  RunContext hold;
  hold.cancelled = [&] {
    std::unique_lock<std::mutex> lock(mu);
    ++parked;
    cv.notify_all();
    cv.wait(lock, [&] { return release; });
    return false;
  };
  // A request of 64 KiB holds its tensors (the answer reuses them) and its
  // plan (~1 KiB): 15 fit under 1 MiB, the 16th does not.
  std::vector<std::thread> holders;
  for (int i = 0; i < 15; ++i) {
    holders.emplace_back([&] {
      v1::RopeRequest r = Request(q);
      v1::RopeResponse resp;
      EXPECT_TRUE(ApplyRope(**engine, &r, &resp, hold).ok());
    });
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return parked >= 15; });
  }
  EXPECT_GE((*engine)->inflight_bytes(), 15 * 65536);
  EXPECT_LE((*engine)->inflight_bytes(), 15 * (65536 + 4096));
  v1::RopeRequest r = Request(q);
  std::vector<int64_t> ids(64, 1);
  SetTensor(TensorView{DType::kInt64, {1, 64}, ids.data(), 512}, r.mutable_position_ids());
  v1::RopeResponse resp;
  absl::Status s = ApplyRope(**engine, &r, &resp, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("max_inflight_bytes"), absl::string_view::npos) << s;
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
  }
  cv.notify_all();
  for (auto& t : holders) t.join();
  EXPECT_EQ((*engine)->inflight_bytes(), 0);
}

// Allocation failure anywhere in a call's work (here: thrown from inside a
// kernel chunk, on a pool thread) is RESOURCE_EXHAUSTED, and the engine
// keeps serving. It used to escape the executor and abort the server.
TEST(Engine, AllocationFailureIsResourceExhaustedAndTheEngineKeepsServing) {
  EngineOptions o;
  o.cpu_threads = 2;
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  // 1024 tokens: several chunks, so pool threads run (and throw) too.
  testing::Bytes big = testing::RandomTensor(DType::kFloat32, 1024 * 4 * 64);
  for (int attempt = 0; attempt < 3; ++attempt) {
    v1::RopeRequest r;
    SetTensor(TensorView{DType::kFloat32, {1, 1024, 4, 64}, big.data(), big.size()},
              r.mutable_query(), r.mutable_query_data());
    v1::RopeResponse resp;
    RunContext throwing;
    throwing.cancelled = []() -> bool { throw std::bad_alloc(); };
    const absl::Status s = ApplyRope(**engine, &r, &resp, throwing);
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    EXPECT_EQ((*engine)->inflight(), 0);
    EXPECT_EQ((*engine)->inflight_bytes(), 0);
  }
  testing::Bytes q = testing::RandomTensor(DType::kFloat32, 64 * 4 * 64);
  v1::RopeRequest r = Request(q);
  v1::RopeResponse resp;
  EXPECT_TRUE(ApplyRope(**engine, &r, &resp, {}).ok());
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
  absl::Status s = ApplyRope(**engine, &req, &resp, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("offsets.dtype"), absl::string_view::npos) << s;
}

// A CUDA region named in a posenc.v1 request is computed on by the CUDA
// backend only: without one (this engine has no GPU) the call is refused
// saying so, and nothing reads or writes the region (the host touching
// device memory would fault on a GPU). Built outputs (tables, biases) never
// go there. (On the fake CUDA runtime: kserve/cuda_shared_memory_test.cc.)
TEST(Engine, ACudaRegionWithoutAGpuIsRefusedUntouched) {
  // A stand-in for the device: memory the test watches. Before the
  // engine, which closes its regions when it goes.
  testing::StandInDevice stand_in(1 << 16, "handle");
  std::string& device = stand_in.memory;
  device.assign(1 << 16, '\x5a');
  EngineOptions o;
  o.cpu_threads = 1;
  o.shared_memory.cuda_enabled = true;
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  (*engine)->shared_memory().SetDeviceOpener(stand_in.Opener(), "");
  ASSERT_TRUE((*engine)->shared_memory().RegisterCuda("gpu", "handle", 0, device.size()).ok());
  v1::RopeRequest req;
  req.mutable_query()->set_dtype(v1::DATA_TYPE_FLOAT32);
  for (int64_t d : {1, 64, 4, 64}) req.mutable_query()->add_shape(d);
  req.mutable_query_shm()->set_region("gpu");
  req.mutable_query_shm()->set_byte_size(64 * 4 * 64 * 4);
  v1::RopeResponse resp;
  const absl::Status s = ApplyRope(**engine, &req, &resp, RunContext{});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("CUDA shared memory but this server has no GPU backend"),
            absl::string_view::npos)
      << s;
  v1::EncodingTableRequest table;
  table.mutable_sinusoidal();
  table.set_dim(64);
  table.set_count(4);
  table.mutable_table_shm()->set_region("gpu");
  table.mutable_table_shm()->set_byte_size(64 * 4 * 4);
  v1::EncodingTableResponse table_resp;
  auto admission = (*engine)->Admit(0);
  ASSERT_TRUE(admission.ok());
  const absl::Status t =
      GetEncodingTable(**engine, &table, &table_resp, RunContext{}, *admission, {});
  EXPECT_EQ(t.code(), absl::StatusCode::kInvalidArgument) << t;
  EXPECT_NE(t.message().find("table_shm: region \"gpu\" is CUDA shared memory"),
            absl::string_view::npos)
      << t;
  EXPECT_EQ(device, std::string(1 << 16, '\x5a'));
  EXPECT_EQ(stand_in.copied, 0) << "nothing read or written through the device either";
}

// query_shm and key_shm on the same bytes (one slice, overlapping slices of
// a region, or one object registered twice): both would be rotated in
// place there, where two results cannot both be. The call is refused naming
// both fields, the bytes left as they were; slices apart are rotated.
TEST(Engine, QueryAndKeyInPlaceOnTheSameBytesAreRefused) {
  EngineOptions o;
  o.cpu_threads = 2;
  o.shared_memory.enabled = true;
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  constexpr int64_t kBytes = 64 * 4 * 64 * 4;
  const std::string key = absl::StrCat("/posenc-v1-apart-", ::getpid());
  const int fd = ::open(("/dev/shm" + key).c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, 2 * kBytes), 0);
  // "b" begins half a tensor into the object: b:(kBytes / 2) is a:kBytes.
  ASSERT_TRUE((*engine)->shared_memory().Register("a", key, 0, 2 * kBytes).ok());
  ASSERT_TRUE((*engine)->shared_memory().Register("b", key, kBytes / 2, kBytes * 3 / 2).ok());
  ::unlink(("/dev/shm" + key).c_str());
  testing::Bytes q = testing::RandomTensor(DType::kFloat32, kBytes / 4);
  testing::Bytes k = testing::RandomTensor(DType::kFloat32, kBytes / 4);
  std::string object(2 * kBytes, '\0');
  std::memcpy(object.data(), q.data(), kBytes);
  std::memcpy(object.data() + kBytes, k.data(), kBytes);
  const auto request = [&](const char* q_region, int64_t q_at, const char* k_region, int64_t k_at) {
    v1::RopeRequest r;
    for (auto [desc, slice, region, at] :
         {std::tuple{r.mutable_query(), r.mutable_query_shm(), q_region, q_at},
          std::tuple{r.mutable_key(), r.mutable_key_shm(), k_region, k_at}}) {
      desc->set_dtype(v1::DATA_TYPE_FLOAT32);
      for (int64_t d : {1, 64, 4, 64}) desc->add_shape(d);
      slice->set_region(region);
      slice->set_offset(static_cast<uint64_t>(at));
      slice->set_byte_size(kBytes);
    }
    return r;
  };
  const auto contents = [&] {
    std::string s(2 * kBytes, '\0');
    EXPECT_EQ(::pread(fd, s.data(), s.size(), 0), 2 * kBytes);
    return s;
  };
  for (const auto& [q_region, q_at, k_region, k_at] :
       {std::tuple{"a", int64_t{0}, "a", int64_t{0}}, std::tuple{"a", int64_t{0}, "a", kBytes / 2},
        std::tuple{"a", kBytes, "b", kBytes / 2}, std::tuple{"b", int64_t{0}, "a", int64_t{0}}}) {
    SCOPED_TRACE(::testing::Message()
                 << "query " << q_region << ":" << q_at << ", key " << k_region << ":" << k_at);
    ASSERT_EQ(::pwrite(fd, object.data(), object.size(), 0), 2 * kBytes);
    v1::RopeRequest req = request(q_region, q_at, k_region, k_at);
    v1::RopeResponse resp;
    const absl::Status s = ApplyRope(**engine, &req, &resp, {});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("query_shm and key_shm share bytes"), absl::string_view::npos) << s;
    EXPECT_TRUE(contents() == object) << "nothing was written";
  }
  // Apart, through either registration: each rotated as in the message.
  v1::RopeRequest by_message;
  SetTensor(TensorView{DType::kFloat32, {1, 64, 4, 64}, q.data(), q.size()},
            by_message.mutable_query(), by_message.mutable_query_data());
  SetTensor(TensorView{DType::kFloat32, {1, 64, 4, 64}, k.data(), k.size()},
            by_message.mutable_key(), by_message.mutable_key_data());
  v1::RopeResponse want;
  ASSERT_TRUE(ApplyRope(**engine, &by_message, &want, {}).ok());
  ASSERT_EQ(::pwrite(fd, object.data(), object.size(), 0), 2 * kBytes);
  v1::RopeRequest req = request("a", 0, "b", kBytes / 2);
  v1::RopeResponse resp;
  const absl::Status s = ApplyRope(**engine, &req, &resp, {});
  ASSERT_TRUE(s.ok()) << s;
  const std::string after = contents();
  EXPECT_TRUE(after.substr(0, kBytes) == want.query_data());
  EXPECT_TRUE(after.substr(kBytes) == want.key_data());
  ASSERT_TRUE((*engine)->shared_memory().Unregister("a").ok());
  ASSERT_TRUE((*engine)->shared_memory().Unregister("b").ok());
  ::close(fd);
}

}  // namespace
}  // namespace posenc::server
