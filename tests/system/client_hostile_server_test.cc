// The C++ client against a server that misbehaves: a scripted
// posenc.v1 service on a Unix socket (so the client uses shared memory)
// answers as told. The client must never report success for an answer it
// cannot trust, never hand a region the server may still write into to
// another call, never leave a registration behind when an answer is lost,
// and never let calls in flight blow up the regions it asks for.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "posenc/client.h"
#include "posenc/v1/posenc.grpc.pb.h"

namespace posenc {
namespace {

using Clock = std::chrono::steady_clock;

// What the scripted server does with a tensor call, by the request id's
// first word.
//   "echo"          the right answer for an identity operation: in place
//                   (descriptor as sent, no bytes) or the bytes sent back
//   "slow-echo"     the same, 400 ms later ("pause": 20 ms later)
//   "bytes"         OK, but the result in the answer's bytes although the
//                   tensor was sent in shared memory
//   "dtype"         OK, with the bytes, but described as the other 16-bit
//                   float type
//   "late-write"    answers after 1.5 s (past the caller's 1 s deadline)
//                   and then writes 0xAB over the tensor's slice
//   "after-late"    the right answer, once a late write has landed
//   "gather"        the right answer, once 8 gather calls are in (so all 8
//                   are in flight together, however slow the machine)
class ScriptedService final : public v1::PositionalEncoding::CallbackService {
 public:
  ~ScriptedService() override {
    for (std::thread& t : answers_) t.join();
    for (const auto& [p, n] : mapped_) ::munmap(p, n);
  }

  std::atomic<bool> shares_memory{true};
  std::atomic<bool> info_unavailable{false};
  std::atomic<grpc::StatusCode> register_code{grpc::StatusCode::OK};
  std::atomic<int> register_delay_ms{0};

  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* ctx,
                                          const v1::GetServerInfoRequest*,
                                          v1::ServerInfo* info) override {
    ++info_calls;
    auto* r = ctx->DefaultReactor();
    if (info_unavailable) {
      r->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "still starting"));
      return r;
    }
    info->set_shared_memory_enabled(shares_memory);
    r->Finish(grpc::Status::OK);
    return r;
  }

  grpc::ServerUnaryReactor* RegisterSharedMemory(grpc::CallbackServerContext* ctx,
                                                 const v1::RegisterSharedMemoryRequest* req,
                                                 v1::SharedMemoryStatus*) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(register_delay_ms.load()));
    {
      std::lock_guard<std::mutex> lock(mu_);
      registered_.push_back({req->name(), req->byte_size()});
      if (!req->key().empty()) {  // map it, as a server does, to write there later
        const int fd = ::shm_open(req->key().c_str(), O_RDWR, 0);
        if (fd >= 0) {
          void* p = ::mmap(nullptr, req->byte_size(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
          ::close(fd);
          if (p != MAP_FAILED) {
            mapped_.emplace_back(p, req->byte_size());
            regions_[req->name()] = static_cast<char*>(p);
          }
        }
      }
    }
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status(register_code.load(), "scripted"));
    return r;
  }

  grpc::ServerUnaryReactor* UnregisterSharedMemory(grpc::CallbackServerContext* ctx,
                                                   const v1::UnregisterSharedMemoryRequest* req,
                                                   v1::SharedMemoryStatus*) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      unregistered_.push_back(req->name());
    }
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }

  grpc::ServerUnaryReactor* ApplyRope(grpc::CallbackServerContext* ctx, const v1::RopeRequest* req,
                                      v1::RopeResponse* resp) override {
    ++tensor_calls;
    auto* r = ctx->DefaultReactor();
    const std::string script = req->request_id().substr(0, req->request_id().find(' '));
    *resp->mutable_query() = req->query();
    if (!req->has_query_shm()) *resp->mutable_query_data() = req->query_data();
    if (script == "echo") {
      r->Finish(grpc::Status::OK);
    } else if (script == "bytes") {
      resp->set_query_data(std::string(req->query_shm().byte_size(), '\x5a'));
      r->Finish(grpc::Status::OK);
    } else if (script == "dtype") {
      resp->mutable_query()->set_dtype(req->query().dtype() == v1::DATA_TYPE_FLOAT16
                                           ? v1::DATA_TYPE_BFLOAT16
                                           : v1::DATA_TYPE_FLOAT16);
      r->Finish(grpc::Status::OK);
    } else if (script == "slow-echo") {
      Later(400, [r] { r->Finish(grpc::Status::OK); });
    } else if (script == "pause") {
      Later(20, [r] { r->Finish(grpc::Status::OK); });
    } else if (script == "late-write") {
      char* at = Region(req->query_shm().region());
      const uint64_t offset = req->query_shm().offset(), bytes = req->query_shm().byte_size();
      Later(1500, [r, at, offset, bytes, this] {
        if (at != nullptr) std::memset(at + offset, 0xAB, bytes);
        ++late_writes;
        r->Finish(grpc::Status::OK);
      });
    } else if (script == "after-late") {
      Later(0, [r, this] {
        WaitFor([&] { return late_writes.load() > 0; });
        r->Finish(grpc::Status::OK);
      });
    } else if (script == "gather") {
      ++gathered;
      Later(0, [r, this] {
        WaitFor([&] { return gathered.load() >= 8; });
        r->Finish(grpc::Status::OK);
      });
    } else {
      r->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no script " + script));
    }
    return r;
  }

  grpc::ServerUnaryReactor* AttentionBias(grpc::CallbackServerContext* ctx,
                                          const v1::AttentionBiasRequest*,
                                          v1::AttentionBiasResponse*) override {
    ++tensor_calls;
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status(grpc::StatusCode::INTERNAL, "not scripted"));
    return r;
  }

  // Answers a table of the bytes asked for on the socket, described by
  // `table_answer` (its shape's product times its dtype's size must be the
  // bytes: a malformed answer is a different check).
  grpc::ServerUnaryReactor* GetEncodingTable(grpc::CallbackServerContext* ctx,
                                             const v1::EncodingTableRequest* req,
                                             v1::EncodingTableResponse* resp) override {
    ++tensor_calls;
    auto* r = ctx->DefaultReactor();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (table_answer.shape_size() == 0) {
        r->Finish(grpc::Status(grpc::StatusCode::INTERNAL, "not scripted"));
        return r;
      }
      *resp->mutable_table() = table_answer;
    }
    const size_t bytes = static_cast<size_t>(req->count() * req->dim()) *
                         (req->dtype() == v1::DATA_TYPE_FLOAT32 ? 4 : 2);
    resp->set_table_data(std::string(bytes, '\0'));
    r->Finish(grpc::Status::OK);
    return r;
  }
  void SetTable(v1::DataType dtype, const std::vector<int64_t>& shape) {
    std::lock_guard<std::mutex> lock(mu_);
    table_answer.set_dtype(dtype);
    table_answer.clear_shape();
    for (int64_t d : shape) table_answer.add_shape(d);
  }
  v1::TensorDesc table_answer;  // under mu_

  struct Registration {
    std::string name;
    uint64_t bytes;
  };
  std::vector<Registration> Registered() {
    std::lock_guard<std::mutex> lock(mu_);
    return registered_;
  }
  std::vector<std::string> Unregistered() {
    std::lock_guard<std::mutex> lock(mu_);
    return unregistered_;
  }
  bool WasUnregistered(const std::string& name) {
    for (const std::string& n : Unregistered()) {
      if (n == name) return true;
    }
    return false;
  }

  std::atomic<int> info_calls{0}, tensor_calls{0}, late_writes{0}, gathered{0};

 private:
  // At most 20 s: a scripted answer never hangs the test.
  static void WaitFor(const std::function<bool()>& done) {
    for (const auto end = Clock::now() + std::chrono::seconds(20); !done() && Clock::now() < end;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  char* Region(const std::string& name) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = regions_.find(name);
    return it == regions_.end() ? nullptr : it->second;
  }
  template <typename F>
  void Later(int ms, F f) {
    std::lock_guard<std::mutex> lock(mu_);
    answers_.emplace_back([ms, f] {
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      f();
    });
  }

  std::mutex mu_;
  std::vector<Registration> registered_;
  std::vector<std::string> unregistered_;
  std::map<std::string, char*> regions_;
  std::vector<std::pair<void*, size_t>> mapped_;
  std::vector<std::thread> answers_;
};

bool Eventually(const std::function<bool()>& f) {
  for (const auto end = Clock::now() + std::chrono::seconds(10); Clock::now() < end;) {
    if (f()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return f();
}

class HostileServer : public ::testing::Test {
 protected:
  void SetUp() override {
    socket_ = "/tmp/posenc-hostile-" + std::to_string(::getpid()) + ".sock";
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + socket_, grpc::InsecureServerCredentials());
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override {
    server_->Shutdown();
    std::filesystem::remove(socket_);
  }
  std::unique_ptr<Client> Connect(SharedMemoryUse use) {
    ClientOptions o;
    o.target = "unix:" + socket_;
    o.shared_memory = use;
    o.health_check_service = "";
    o.initial_backoff = absl::Milliseconds(1);
    o.max_backoff = absl::Milliseconds(4);
    auto c = Client::Create(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }

  std::string socket_;
  ScriptedService service_;
  std::unique_ptr<grpc::Server> server_;
};

// A [1, tokens, 2, 64] tensor of random values (seeded, printed).
struct Tensor {
  Tensor(DType dtype, int tokens, uint32_t seed) : shape{1, tokens, 2, 64} {
    bytes.resize(static_cast<size_t>(tokens) * 2 * 64 * SizeOf(dtype));
    std::mt19937 rng(seed);
    for (char& b : bytes) b = static_cast<char>(rng() & 0x3f);  // finite in every dtype
    type = dtype;
  }
  RopeTensors Rope() {
    RopeTensors t;
    t.query = MutableTensor{type, shape, bytes.data(), bytes.size()};
    return t;
  }
  DType type;
  std::vector<int64_t> shape;
  std::vector<char> bytes;
};

uint32_t Seed() {
  const uint32_t seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  return seed;
}

CallOptions Script(const std::string& script, absl::Duration timeout = absl::Seconds(10)) {
  CallOptions c;
  c.request_id = script + " call";
  c.timeout = timeout;
  return c;
}

// The server answers OK but sends the result as bytes instead of writing it
// where it was sent: the region still holds the caller's input, which the
// old client handed back as the result.
TEST_F(HostileServer, AnInPlaceAnswerCarryingBytesIsRefused) {
  auto client = Connect(SharedMemoryUse::kAuto);
  Tensor t(DType::kFloat32, 64, Seed());
  const std::vector<char> sent = t.bytes;
  const absl::Status s = client->ApplyRope({}, t.Rope(), Script("bytes"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "computed in place")) << s;
  EXPECT_EQ(t.bytes, sent) << "the caller's tensor was overwritten from an untrusted answer";
  const absl::Status a = client->ApplyRopeAsync({}, t.Rope(), Script("bytes")).get();
  EXPECT_EQ(a.code(), absl::StatusCode::kInternal) << a;
  ASSERT_FALSE(service_.Registered().empty()) << "shared memory was not used";
  // The right answer through the same region is taken.
  EXPECT_TRUE(client->ApplyRope({}, t.Rope(), Script("echo")).ok());
  EXPECT_EQ(t.bytes, sent);
}

// The same bytes described as another dtype of the same size (float16 as
// bfloat16) are another tensor: refused on the socket as in place.
TEST_F(HostileServer, AnAnswerOfAnotherDtypeOfTheSameSizeIsRefused) {
  const uint32_t seed = Seed();
  for (SharedMemoryUse use : {SharedMemoryUse::kOff, SharedMemoryUse::kAuto}) {
    auto client = Connect(use);
    Tensor t(DType::kFloat16, 32, seed);
    const absl::Status s = client->ApplyRope({}, t.Rope(), Script("dtype"));
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "DATA_TYPE_BFLOAT16")) << s;
  }
}

// A call that ran out of time may still be computing on the server into
// its region. That region must not carry the next call: the late write
// would land on the next call's tensor, and the next call would return it
// as its result (the old client did, with OK).
TEST_F(HostileServer, ARegionACallRanOutOfTimeOnIsNeverReused) {
  auto client = Connect(SharedMemoryUse::kAuto);
  const uint32_t seed = Seed();
  Tensor first(DType::kFloat32, 256, seed);
  const absl::Status late =
      client->ApplyRope({}, first.Rope(), Script("late-write", absl::Seconds(1)));
  ASSERT_EQ(late.code(), absl::StatusCode::kDeadlineExceeded) << late;
  ASSERT_EQ(service_.Registered().size(), 1u);
  const std::string first_region = service_.Registered()[0].name;

  // The next call is answered only after the first call's late write.
  Tensor second(DType::kFloat32, 256, seed + 1);
  const std::vector<char> sent = second.bytes;
  ASSERT_TRUE(client->ApplyRope({}, second.Rope(), Script("after-late")).ok());
  EXPECT_EQ(service_.late_writes.load(), 1);
  EXPECT_EQ(second.bytes, sent) << "the first call's late write came back as the second's result";
  ASSERT_EQ(service_.Registered().size(), 2u);
  EXPECT_NE(service_.Registered()[1].name, first_region);
  EXPECT_TRUE(Eventually([&] { return service_.WasUnregistered(first_region); }))
      << "the region of the call that ran out of time stayed registered";
  // A region whose call ended with an answer goes back to the pool.
  ASSERT_TRUE(client->ApplyRope({}, second.Rope(), Script("echo")).ok());
  EXPECT_EQ(service_.Registered().size(), 2u);
}

// Calls in flight together each need a region. Each must be sized by its own
// bytes: growth keyed to the largest region alone doubled with every call
// in flight (the eighth of eight 1 MiB calls asked for 128 MiB).
TEST_F(HostileServer, CallsInFlightTogetherGetRegionsOfTheirOwnSize) {
  auto client = Connect(SharedMemoryUse::kAuto);
  const uint32_t seed = Seed();
  std::vector<std::unique_ptr<Tensor>> tensors;
  std::vector<std::future<absl::Status>> calls;
  for (int i = 0; i < 8; ++i) {
    tensors.push_back(std::make_unique<Tensor>(DType::kFloat32, 2048, seed + i));  // 1 MiB
    calls.push_back(client->ApplyRopeAsync({}, tensors.back()->Rope(), Script("gather")));
  }
  for (auto& c : calls) EXPECT_TRUE(c.get().ok());
  const auto regs = service_.Registered();
  EXPECT_EQ(regs.size(), 8u);
  for (const auto& r : regs) {
    EXPECT_LE(r.bytes, uint64_t{2} << 20) << r.name;
  }
}

// Callers of two sizes in flight together each keep a region: a small
// region is pooled beside a large one (it used to be dropped as outgrown,
// and registered afresh by nearly every small call).
TEST_F(HostileServer, CallersOfMixedSizesKeepTheirRegions) {
  auto client = Connect(SharedMemoryUse::kAuto);
  const uint32_t seed = Seed();
  auto caller = [&](int tokens, int calls, uint32_t s) {
    Tensor t(DType::kFloat32, tokens, s);
    const std::vector<char> sent = t.bytes;
    for (int i = 0; i < calls; ++i) {
      EXPECT_TRUE(client->ApplyRope({}, t.Rope(), Script("pause")).ok());
    }
    EXPECT_EQ(t.bytes, sent);
  };
  std::thread large(caller, 16384, 20, seed);     // 8 MiB
  std::thread small(caller, 2048, 40, seed + 1);  // 1 MiB
  large.join();
  small.join();
  const auto regs = service_.Registered();
  std::printf("%zu regions registered for 60 calls\n", regs.size());
  EXPECT_LE(regs.size(), 4u);
}

// A registration gRPC retried after the server took the first attempt (its
// answer lost) meets ALREADY_EXISTS: the name is the client's alone, so the
// region is registered, and shared memory stays on.
TEST_F(HostileServer, ARetriedRegistrationThatFindsItselfIsTaken) {
  auto client = Connect(SharedMemoryUse::kAuto);
  service_.register_code = grpc::StatusCode::ALREADY_EXISTS;
  Tensor t(DType::kFloat32, 64, Seed());
  ASSERT_TRUE(client->ApplyRope({}, t.Rope(), Script("echo")).ok());
  EXPECT_TRUE(client->UsesSharedMemory());
  EXPECT_EQ(service_.Registered().size(), 1u);
  EXPECT_TRUE(service_.Unregistered().empty());
  EXPECT_EQ(service_.tensor_calls.load(), 1);
}

// A registration whose answer is lost (here: UNAVAILABLE after the server
// registered it) is unregistered, or the server would keep the mapping;
// the call goes over the socket, and shared memory is asked for again
// later rather than given up.
TEST_F(HostileServer, ARegistrationWhoseAnswerIsLostIsUnregistered) {
  auto client = Connect(SharedMemoryUse::kAuto);
  service_.register_code = grpc::StatusCode::UNAVAILABLE;
  Tensor t(DType::kFloat32, 64, Seed());
  const std::vector<char> sent = t.bytes;
  ASSERT_TRUE(client->ApplyRope({}, t.Rope(), Script("echo")).ok());
  EXPECT_EQ(t.bytes, sent);
  const auto regs = service_.Registered();
  ASSERT_FALSE(regs.empty());
  EXPECT_TRUE(Eventually([&] { return service_.WasUnregistered(regs[0].name); }));
  EXPECT_TRUE(client->UsesSharedMemory()) << "a moment's trouble turned shared memory off";
  service_.register_code = grpc::StatusCode::OK;
  EXPECT_TRUE(Eventually([&] {
    return client->ApplyRope({}, t.Rope(), Script("echo")).ok() &&
           service_.Registered().size() > regs.size();
  })) << "shared memory was not asked for again";
}

// A server not yet answering GetServerInfo (starting) is asked again by a
// later call, instead of shared memory being off for the client's life.
TEST_F(HostileServer, AServerThatCouldNotBeAskedIsAskedAgain) {
  auto client = Connect(SharedMemoryUse::kAuto);
  service_.info_unavailable = true;
  Tensor t(DType::kFloat32, 64, Seed());
  ASSERT_TRUE(client->ApplyRope({}, t.Rope(), Script("echo")).ok());
  EXPECT_TRUE(service_.Registered().empty());
  // Not asked again at once (a backoff, 100 ms doubling to 5 s), so a
  // server that is down does not cost every call an extra round trip.
  const int asked = service_.info_calls.load();
  ASSERT_TRUE(client->ApplyRope({}, t.Rope(), Script("echo")).ok());
  EXPECT_EQ(service_.info_calls.load(), asked);
  service_.info_unavailable = false;
  EXPECT_TRUE(Eventually([&] {
    return client->ApplyRope({}, t.Rope(), Script("echo")).ok() &&
           service_.Registered().size() == 1;
  })) << "shared memory stayed off";
}

// kRequire holds for the built tensors too: a bias or table that cannot be
// placed in shared memory is refused, not sent over the socket.
TEST_F(HostileServer, RequireRefusesBuiltTensorsItCannotPlace) {
  service_.shares_memory = false;
  auto client = Connect(SharedMemoryUse::kRequire);
  BiasOptions bias;
  bias.batch = 1;
  bias.num_heads = 2;
  bias.q_len = 4;
  bias.k_len = 4;
  auto b = client->AttentionBias(bias);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition) << b.status();
  AbsoluteOptions table;
  auto e = client->EncodingTable(table, 16, 4, TensorView{}, DType::kFloat32);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kFailedPrecondition) << e.status();
  // A bias whose size the server decides cannot be placed at all.
  bias.q_len = 0;
  service_.shares_memory = true;
  auto unknown = Connect(SharedMemoryUse::kRequire);
  b = unknown->AttentionBias(bias);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition) << b.status();
  EXPECT_TRUE(absl::StrContains(b.status().message(), "not known")) << b.status();
  EXPECT_EQ(service_.tensor_calls.load(), 0) << "a call went over the socket under kRequire";
}

// A built tensor of the right byte count but another dtype or rank than the
// request's: a float16 table read as bfloat16 is garbage, and a 1-D one
// indexed as [rows, dim] reads past its end.
TEST_F(HostileServer, ABuiltTensorOfAnotherDtypeOrRankIsRefused) {
  service_.shares_memory = false;
  auto client = Connect(SharedMemoryUse::kOff);
  AbsoluteOptions table;
  struct Case {
    v1::DataType dtype;
    std::vector<int64_t> shape;
    bool ok;
  };
  for (const Case& c :
       {Case{v1::DATA_TYPE_FLOAT16, {4, 16}, false}, Case{v1::DATA_TYPE_BFLOAT16, {64}, false},
        Case{v1::DATA_TYPE_BFLOAT16, {4, 16}, true}}) {
    service_.SetTable(c.dtype, c.shape);
    auto e = client->EncodingTable(table, 16, 4, TensorView{}, DType::kBFloat16);
    if (c.ok) {
      EXPECT_TRUE(e.ok()) << e.status();
    } else {
      EXPECT_EQ(e.status().code(), absl::StatusCode::kInternal) << e.status();
      EXPECT_TRUE(absl::StrContains(e.status().message(), "BFLOAT16 tensor asked for"))
          << e.status();
    }
  }
}

// Device memory: two threads registering the same allocation at once get
// one registration; a registration whose answer is lost is unregistered.
TEST_F(HostileServer, DeviceMemoryRegistrationsNeitherRaceNorLeak) {
  auto client = Connect(SharedMemoryUse::kAuto);
  alignas(64) static char memory[4096];
  DeviceAllocation a;
  a.base = memory;
  a.bytes = sizeof(memory);
  a.ipc_handle = std::string(64, '\x01');
  service_.register_delay_ms = 200;
  std::future<absl::Status> one =
      std::async(std::launch::async, [&] { return client->RegisterDeviceMemory(a); });
  std::future<absl::Status> two =
      std::async(std::launch::async, [&] { return client->RegisterDeviceMemory(a); });
  const absl::Status s1 = one.get(), s2 = two.get();
  EXPECT_NE(s1.ok(), s2.ok()) << s1 << " / " << s2;
  EXPECT_EQ((s1.ok() ? s2 : s1).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(service_.Registered().size(), 1u);
  EXPECT_TRUE(client->UnregisterDeviceMemory(memory).ok());

  service_.register_delay_ms = 0;
  service_.register_code = grpc::StatusCode::UNAVAILABLE;
  EXPECT_EQ(client->RegisterDeviceMemory(a).code(), absl::StatusCode::kUnavailable);
  const std::string lost = service_.Registered().back().name;
  EXPECT_TRUE(Eventually([&] { return service_.WasUnregistered(lost); }));
  EXPECT_EQ(client->UnregisterDeviceMemory(memory).code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace posenc
