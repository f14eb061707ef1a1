// The C++ client moves tensors through shared memory on its own when the
// server shares its node (ClientOptions::shared_memory, kAuto by default):
// an in-process server on a TCP port and a Unix socket, clients with
// shared memory on and off. Results must be bit for bit the socket's for
// every operation and dtype; a region the server lost falls back to the
// socket; kRequire refuses what kAuto falls back from.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "posenc/client.h"
#include "server.h"
#include "test_tensors.h"

namespace posenc {
namespace {

using testing::Bytes;

constexpr DType kFloatTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};

std::unique_ptr<server::Server> StartServer(bool shared_memory, const std::string& listen,
                                            int max_regions = 64, bool cuda_shared_memory = false) {
  server::ServerOptions o;
  o.listen_address = listen;
  o.engine.cpu_threads = 2;
  o.engine.enable_cuda = false;
  o.engine.shared_memory.enabled = shared_memory;
  o.engine.shared_memory.cuda_enabled = cuda_shared_memory;
  o.engine.shared_memory.max_regions = max_regions;
  auto s = server::Server::Start(o);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

std::unique_ptr<Client> Connect(const std::string& target, SharedMemoryUse use) {
  ClientOptions co;
  co.target = target;
  co.shared_memory = use;
  co.initial_backoff = absl::Milliseconds(10);
  auto c = Client::Create(co);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

class SharedMemoryClient : public ::testing::Test {
 protected:
  void SetUp() override {
    socket_ = "/tmp/posenc-shm-client-" + std::to_string(::getpid()) + ".sock";
    server_ = StartServer(true, "127.0.0.1:0,unix:" + socket_);
    ASSERT_NE(server_, nullptr);
    tcp_ = "127.0.0.1:" + std::to_string(server_->port());
    shm_ = Connect(tcp_, SharedMemoryUse::kAuto);
    socket_client_ = Connect(tcp_, SharedMemoryUse::kOff);
  }
  void TearDown() override {
    shm_.reset();
    socket_client_.reset();
    server_.reset();
    std::filesystem::remove(socket_);
  }
  int Regions() { return server_->engine().shared_memory().count(); }
  // A /dev/shm object of `bytes` mapped here and registered with the server
  // by hand as region `name` (then unlinked: the server holds it).
  void MapAndRegister(const std::string& name, int64_t bytes, char** region) {
    const std::string key = "/posenc-" + name + "-" + std::to_string(::getpid());
    const int fd = ::shm_open(key.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, bytes), 0);
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    ASSERT_NE(p, MAP_FAILED);
    *region = static_cast<char*>(p);
    grpc::ClientContext ctx;
    v1::RegisterSharedMemoryRequest req;
    req.set_name(name);
    req.set_key(key);
    req.set_byte_size(bytes);
    v1::SharedMemoryStatus resp;
    const grpc::Status s = socket_client_->stub().RegisterSharedMemory(&ctx, req, &resp);
    ::shm_unlink(key.c_str());
    ASSERT_TRUE(s.ok()) << s.error_message();
  }

  std::string socket_, tcp_;
  std::unique_ptr<server::Server> server_;
  std::unique_ptr<Client> shm_, socket_client_;
};

// Every operation, every float dtype: the client through shared memory and
// the client on the socket get the same bytes.
TEST_F(SharedMemoryClient, EveryOperationAndDtypeMatchesTheSocketBitForBit) {
  for (DType dtype : kFloatTypes) {
    SCOPED_TRACE(DTypeName(dtype));
    // RoPE, query and key, with offsets, sync and async.
    RopeOptions rope;
    rope.base = 500000;
    rope.scaling.type = ScalingType::kLlama3;
    const Bytes q0 = testing::RandomTensor(dtype, 2 * 9 * 6 * 64);
    const Bytes k0 = testing::RandomTensor(dtype, 2 * 9 * 2 * 64);
    std::vector<int64_t> offsets = {0, 4093};
    for (bool async : {false, true}) {
      Bytes q1 = q0, k1 = k0, q2 = q0, k2 = k0;
      RopeTensors a, b;
      a.query = testing::Mutable(dtype, {2, 9, 6, 64}, q1);
      a.key = testing::Mutable(dtype, {2, 9, 2, 64}, k1);
      a.positions.offsets = testing::IntView(offsets, {2});
      b = a;
      b.query = testing::Mutable(dtype, {2, 9, 6, 64}, q2);
      b.key = testing::Mutable(dtype, {2, 9, 2, 64}, k2);
      if (async) {
        ASSERT_TRUE(shm_->ApplyRopeAsync(rope, a).get().ok());
        ASSERT_TRUE(socket_client_->ApplyRopeAsync(rope, b).get().ok());
      } else {
        ASSERT_TRUE(shm_->ApplyRope(rope, a).ok());
        ASSERT_TRUE(socket_client_->ApplyRope(rope, b).ok());
      }
      EXPECT_NE(q1, q0) << "rotated";
      EXPECT_EQ(q1, q2);
      EXPECT_EQ(k1, k2);
    }
    // Sinusoidal add, sync and async.
    const Bytes x0 = testing::RandomTensor(dtype, 3 * 17 * 96);
    for (bool async : {false, true}) {
      Bytes x1 = x0, x2 = x0;
      AbsoluteTensors a, b;
      a.x = testing::Mutable(dtype, {3, 17, 96}, x1);
      b.x = testing::Mutable(dtype, {3, 17, 96}, x2);
      AbsoluteOptions abs;
      abs.x_scale = 2.0;
      if (async) {
        ASSERT_TRUE(shm_->AddAbsoluteEncodingAsync(abs, a).get().ok());
        ASSERT_TRUE(socket_client_->AddAbsoluteEncodingAsync(abs, b).get().ok());
      } else {
        ASSERT_TRUE(shm_->AddAbsoluteEncoding(abs, a).ok());
        ASSERT_TRUE(socket_client_->AddAbsoluteEncoding(abs, b).ok());
      }
      EXPECT_EQ(x1, x2);
    }
    // The bias added to logits, with slopes.
    BiasOptions bias;
    bias.causal = true;
    bias.window = 5;
    const Bytes l0 = testing::RandomTensor(dtype, 2 * 4 * 7 * 11);
    Bytes l1 = l0, l2 = l0;
    std::vector<double> s1, s2;
    ASSERT_TRUE(
        shm_->ApplyAttentionBias(bias, testing::Mutable(dtype, {2, 4, 7, 11}, l1), &s1).ok());
    ASSERT_TRUE(
        socket_client_->ApplyAttentionBias(bias, testing::Mutable(dtype, {2, 4, 7, 11}, l2), &s2)
            .ok());
    EXPECT_EQ(l1, l2);
    EXPECT_EQ(s1, s2);
    // Built tensors: a bias and a table.
    BiasOptions built = bias;
    built.batch = 2;
    built.num_heads = 4;
    built.q_len = 7;
    built.k_len = 11;
    built.dtype = dtype;
    auto b1 = shm_->AttentionBias(built);
    auto b2 = socket_client_->AttentionBias(built);
    ASSERT_TRUE(b1.ok() && b2.ok()) << b1.status() << b2.status();
    EXPECT_EQ(b1->data, b2->data);
    EXPECT_EQ(b1->shape, b2->shape);
    EXPECT_EQ(b1->slopes, b2->slopes);
    auto t1 = shm_->EncodingTable(AbsoluteOptions(), 48, 33, {}, dtype);
    auto t2 = socket_client_->EncodingTable(AbsoluteOptions(), 48, 33, {}, dtype);
    ASSERT_TRUE(t1.ok() && t2.ok()) << t1.status() << t2.status();
    EXPECT_EQ(t1->data, t2->data);
    EXPECT_EQ(t1->shape, t2->shape);
  }
  EXPECT_TRUE(shm_->UsesSharedMemory());
  EXPECT_FALSE(socket_client_->UsesSharedMemory());
  EXPECT_GT(Regions(), 0) << "the kAuto client never registered a region";
  EXPECT_LE(Regions(), 5) << "regions are reused, not one per call";
}

TEST_F(SharedMemoryClient, RegionsGrowGeometricallyAndAreReused) {
  for (int64_t tokens = 1; tokens <= 4096; tokens *= 2) {
    Bytes q = testing::RandomTensor(DType::kBFloat16, tokens * 8 * 128);
    RopeTensors t;
    t.query = testing::Mutable(DType::kBFloat16, {1, tokens, 8, 128}, q);
    ASSERT_TRUE(shm_->ApplyRope(RopeOptions(), t).ok()) << tokens;
  }
  // 13 sizes from 2 KiB to 8 MiB: regions of 1, 2, 4 and 8 MiB in turn,
  // each given back as the next replaces it.
  EXPECT_EQ(Regions(), 1);
  EXPECT_TRUE(shm_->UsesSharedMemory());
}

TEST_F(SharedMemoryClient, ARegionTheServerLostFallsBackToTheSocket) {
  const Bytes q0 = testing::RandomTensor(DType::kFloat32, 4 * 8 * 64);
  Bytes q1 = q0, q2 = q0;
  RopeTensors t;
  t.query = testing::Mutable(DType::kFloat32, {1, 4, 8, 64}, q1);
  ASSERT_TRUE(shm_->ApplyRope(RopeOptions(), t).ok());
  ASSERT_GT(Regions(), 0);
  // As after a server restart: the client's pooled region is unknown now.
  ASSERT_TRUE(server_->engine().shared_memory().Unregister("").ok());
  t.query = testing::Mutable(DType::kFloat32, {1, 4, 8, 64}, q2);
  ASSERT_TRUE(shm_->ApplyRope(RopeOptions(), t).ok());
  Bytes q3 = q0;
  RopeTensors s;
  s.query = testing::Mutable(DType::kFloat32, {1, 4, 8, 64}, q3);
  ASSERT_TRUE(socket_client_->ApplyRope(RopeOptions(), s).ok());
  EXPECT_EQ(q2, q3) << "the fallback computes on the caller's own bytes";
  EXPECT_FALSE(shm_->UsesSharedMemory());
}

TEST_F(SharedMemoryClient, AUnixSocketTargetUsesSharedMemoryToo) {
  auto over_unix = Connect("unix:" + socket_, SharedMemoryUse::kRequire);
  ASSERT_NE(over_unix, nullptr);
  auto info = over_unix->GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_TRUE(info->shared_memory_enabled());
  const Bytes q0 = testing::RandomTensor(DType::kBFloat16, 16 * 8 * 128);
  Bytes q1 = q0, q2 = q0;
  RopeTensors a, b;
  a.query = testing::Mutable(DType::kBFloat16, {1, 16, 8, 128}, q1);
  b.query = testing::Mutable(DType::kBFloat16, {1, 16, 8, 128}, q2);
  ASSERT_TRUE(over_unix->ApplyRope(RopeOptions(), a).ok());
  ASSERT_TRUE(socket_client_->ApplyRope(RopeOptions(), b).ok());
  EXPECT_EQ(q1, q2);
  EXPECT_TRUE(over_unix->UsesSharedMemory());
}

// Every Client of a process has its own regions (their keys once collided:
// the second client's registration failed and it gave shared memory up).
TEST_F(SharedMemoryClient, ClientsOfOneProcessHaveTheirOwnRegions) {
  auto other = Connect(tcp_, SharedMemoryUse::kRequire);
  ASSERT_NE(other, nullptr);
  const Bytes q0 = testing::RandomTensor(DType::kFloat32, 4 * 8 * 64);
  Bytes q1 = q0, q2 = q0;
  RopeTensors a, b;
  a.query = testing::Mutable(DType::kFloat32, {1, 4, 8, 64}, q1);
  b.query = testing::Mutable(DType::kFloat32, {1, 4, 8, 64}, q2);
  ASSERT_TRUE(shm_->ApplyRope(RopeOptions(), a).ok());
  const absl::Status s = other->ApplyRope(RopeOptions(), b);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(q1, q2);
  EXPECT_EQ(Regions(), 2);
  EXPECT_TRUE(shm_->UsesSharedMemory());
}

// Tensors at any byte of a region: a caller (a Triton client, say) may put
// them at offsets that are no multiple of their element size. The server
// computes those in an aligned copy; results are the socket's, bit for bit,
// in the same misaligned place, and the bytes around them stay as they were.
TEST_F(SharedMemoryClient, MisalignedSlicesGiveTheSocketsResults) {
  constexpr int64_t kRegion = 1 << 16;
  char* region = nullptr;
  ASSERT_NO_FATAL_FAILURE(MapAndRegister("odd", kRegion, &region));
  v1::PositionalEncoding::Stub& stub = socket_client_->stub();
  auto slice = [](v1::SharedMemorySlice* s, int64_t offset, int64_t bytes) {
    s->set_region("odd");
    s->set_offset(offset);
    s->set_byte_size(bytes);
  };
  const Bytes noise = testing::RandomTensor(DType::kFloat32, kRegion / 4);
  const struct {
    DType dtype;
    v1::DataType wire;
  } kinds[] = {{DType::kFloat32, v1::DATA_TYPE_FLOAT32},
               {DType::kFloat16, v1::DATA_TYPE_FLOAT16},
               {DType::kBFloat16, v1::DATA_TYPE_BFLOAT16}};
  for (const auto& kind : kinds) {
    SCOPED_TRACE(DTypeName(kind.dtype));
    std::memcpy(region, noise.data(), kRegion);
    const int64_t elem = static_cast<int64_t>(SizeOf(kind.dtype));
    // RoPE: query at byte 3, key at byte 8193, offsets [0, 77].
    const Bytes q = testing::RandomTensor(kind.dtype, 2 * 5 * 3 * 16);
    const Bytes k = testing::RandomTensor(kind.dtype, 2 * 5 * 1 * 16);
    v1::RopeRequest rope;
    rope.mutable_query()->set_dtype(kind.wire);
    for (int64_t d : {2, 5, 3, 16}) rope.mutable_query()->add_shape(d);
    rope.mutable_key()->set_dtype(kind.wire);
    for (int64_t d : {2, 5, 1, 16}) rope.mutable_key()->add_shape(d);
    rope.mutable_offsets()->set_dtype(v1::DATA_TYPE_INT64);
    rope.mutable_offsets()->add_shape(2);
    const int64_t offsets[] = {0, 77};
    rope.mutable_offsets()->set_data(std::string(reinterpret_cast<const char*>(offsets), 16));
    v1::RopeRequest by_socket = rope;
    by_socket.set_query_data(std::string(q.begin(), q.end()));
    by_socket.set_key_data(std::string(k.begin(), k.end()));
    std::memcpy(region + 3, q.data(), q.size());
    std::memcpy(region + 8193, k.data(), k.size());
    slice(rope.mutable_query_shm(), 3, static_cast<int64_t>(q.size()));
    slice(rope.mutable_key_shm(), 8193, static_cast<int64_t>(k.size()));
    v1::RopeResponse want, got;
    {
      grpc::ClientContext a, b;
      ASSERT_TRUE(stub.ApplyRope(&a, by_socket, &want).ok());
      const grpc::Status s = stub.ApplyRope(&b, rope, &got);
      ASSERT_TRUE(s.ok()) << s.error_message();
    }
    EXPECT_EQ(std::string(region + 3, q.size()), want.query_data());
    EXPECT_EQ(std::string(region + 8193, k.size()), want.key_data());
    EXPECT_NE(want.query_data(), std::string(q.begin(), q.end())) << "rotated";
    // The sinusoidal table written at byte 16385 + 1.
    v1::EncodingTableRequest table;
    table.mutable_sinusoidal()->set_base(10000);
    table.set_dim(24);
    table.set_count(9);
    table.set_dtype(kind.wire);
    v1::EncodingTableResponse table_want, table_got;
    const int64_t table_bytes = 9 * 24 * elem;
    {
      grpc::ClientContext a, b;
      ASSERT_TRUE(stub.GetEncodingTable(&a, table, &table_want).ok());
      slice(table.mutable_table_shm(), 16385, table_bytes);
      ASSERT_TRUE(stub.GetEncodingTable(&b, table, &table_got).ok());
    }
    EXPECT_EQ(std::string(region + 16385, table_bytes), table_want.table_data());
    // The bias built at byte 24577 (+1).
    v1::AttentionBiasRequest bias;
    bias.set_num_heads(3);
    bias.set_q_len(4);
    bias.set_k_len(6);
    bias.set_causal(true);
    bias.set_dtype(kind.wire);
    v1::AttentionBiasResponse bias_want, bias_got;
    const int64_t bias_bytes = 3 * 4 * 6 * elem;
    {
      grpc::ClientContext a, b;
      ASSERT_TRUE(stub.AttentionBias(&a, bias, &bias_want).ok());
      slice(bias.mutable_bias_shm(), 24577, bias_bytes);
      ASSERT_TRUE(stub.AttentionBias(&b, bias, &bias_got).ok());
    }
    EXPECT_EQ(std::string(region + 24577, bias_bytes), bias_want.bias_data());
    // The bytes around every slice are as they were.
    const auto unchanged = [&](int64_t from, int64_t to) {
      return std::memcmp(region + from, noise.data() + from, to - from) == 0;
    };
    EXPECT_TRUE(unchanged(0, 3));
    EXPECT_TRUE(unchanged(3 + static_cast<int64_t>(q.size()), 8193));
    EXPECT_TRUE(unchanged(8193 + static_cast<int64_t>(k.size()), 16385));
    EXPECT_TRUE(unchanged(16385 + table_bytes, 24577));
    EXPECT_TRUE(unchanged(24577 + bias_bytes, kRegion));
  }
  ::munmap(region, kRegion);
}

// gRPC retries a call whose connection dropped before its answer came, on
// the same server when it is still up. For a call rotating a region in
// place the first attempt may have finished there, so an attempt carrying
// a posenc-call-id the server already started is refused (ABORTED) and the
// region holds one rotation, not two. Calls on the socket, and each new
// call (a new id), run as always.
TEST_F(SharedMemoryClient, AnInPlaceCallsRetriedAttemptIsRefusedNotRunTwice) {
  constexpr int64_t kRegion = 1 << 14;
  char* region = nullptr;
  ASSERT_NO_FATAL_FAILURE(MapAndRegister("retried", kRegion, &region));
  v1::PositionalEncoding::Stub& stub = socket_client_->stub();
  const Bytes q = testing::RandomTensor(DType::kFloat32, 1 * 8 * 2 * 32);
  v1::RopeRequest rope;
  rope.mutable_query()->set_dtype(v1::DATA_TYPE_FLOAT32);
  for (int64_t d : {1, 8, 2, 32}) rope.mutable_query()->add_shape(d);
  v1::RopeRequest by_socket = rope;
  by_socket.set_query_data(std::string(q.begin(), q.end()));
  rope.mutable_query_shm()->set_region("retried");
  rope.mutable_query_shm()->set_byte_size(static_cast<int64_t>(q.size()));
  std::memcpy(region, q.data(), q.size());
  const auto call = [&](const v1::RopeRequest& req, const std::string& id, v1::RopeResponse* r) {
    grpc::ClientContext ctx;
    if (!id.empty()) ctx.AddMetadata("posenc-call-id", id);
    return stub.ApplyRope(&ctx, req, r);
  };
  v1::RopeResponse once, resp;
  ASSERT_TRUE(call(by_socket, "", &once).ok());
  const std::string id = "retried-" + std::to_string(::getpid());
  ASSERT_TRUE(call(rope, id, &resp).ok());
  EXPECT_EQ(std::string(region, q.size()), once.query_data());
  // The same call again, as gRPC's retry sends it: refused, nothing rotated.
  const grpc::Status again = call(rope, id, &resp);
  EXPECT_EQ(again.error_code(), grpc::StatusCode::ABORTED) << again.error_message();
  EXPECT_NE(again.error_message().find(id), std::string::npos) << again.error_message();
  EXPECT_EQ(std::string(region, q.size()), once.query_data()) << "rotated twice";
  // On the socket the same id changes nothing (nothing in place to guard),
  // and a new call rotates the region again, as asked.
  EXPECT_TRUE(call(by_socket, id, &resp).ok());
  EXPECT_TRUE(call(rope, id + "-next", &resp).ok());
  EXPECT_NE(std::string(region, q.size()), once.query_data());
  // The client gives each call an id of its own: its in-place calls on
  // this server all run.
  for (int i = 0; i < 3; ++i) {
    std::vector<char> mine(q.begin(), q.end());
    RopeTensors t;
    t.query = MutableTensor{DType::kFloat32, {1, 8, 2, 32}, mine.data(), mine.size()};
    ASSERT_TRUE(shm_->ApplyRope({}, t).ok());
    EXPECT_EQ(std::string(mine.data(), mine.size()), once.query_data());
  }
  ::munmap(region, kRegion);
}

// A region refused for want of room (here the cap of one region) sends the
// client to the socket for a while, not for good: once there is room again
// it registers one.
TEST(SharedMemoryClientUnderCaps, ARegionRefusedForRoomIsAskedForAgainLater) {
  auto server = StartServer(true, "127.0.0.1:0", /*max_regions=*/1);
  ASSERT_NE(server, nullptr);
  const std::string target = "127.0.0.1:" + std::to_string(server->port());
  const Bytes q0 = testing::RandomTensor(DType::kFloat32, 4 * 8 * 64);
  auto call = [&](Client& c, Bytes* q) {
    *q = q0;
    RopeTensors t;
    t.query = testing::Mutable(DType::kFloat32, {1, 4, 8, 64}, *q);
    return c.ApplyRope(RopeOptions(), t);
  };
  auto first = Connect(target, SharedMemoryUse::kAuto);
  auto second = Connect(target, SharedMemoryUse::kAuto);
  auto required = Connect(target, SharedMemoryUse::kRequire);
  Bytes q1, q2, q3;
  ASSERT_TRUE(call(*first, &q1).ok());
  ASSERT_EQ(server->engine().shared_memory().count(), 1);
  ASSERT_TRUE(call(*second, &q2).ok()) << "refused a region, it used the socket";
  EXPECT_EQ(q1, q2);
  EXPECT_TRUE(second->UsesSharedMemory()) << "deferred, not given up";
  const absl::Status s = call(*required, &q3);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("--max_shared_memory_regions"), std::string::npos) << s;
  first.reset();  // gives its region back
  ASSERT_EQ(server->engine().shared_memory().count(), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(250));  // the first back-off: 100 ms
  ASSERT_TRUE(call(*second, &q2).ok());
  EXPECT_EQ(q1, q2);
  EXPECT_EQ(server->engine().shared_memory().count(), 1) << "the second client has a region now";
}

TEST(SharedMemoryClientWithoutServerSupport, AutoFallsBackAndRequireRefuses) {
  auto server = StartServer(false, "127.0.0.1:0");
  ASSERT_NE(server, nullptr);
  const std::string target = "127.0.0.1:" + std::to_string(server->port());
  const Bytes q0 = testing::RandomTensor(DType::kFloat32, 4 * 8 * 64);
  Bytes q1 = q0;
  RopeTensors t;
  t.query = testing::Mutable(DType::kFloat32, {1, 4, 8, 64}, q1);
  auto automatic = Connect(target, SharedMemoryUse::kAuto);
  ASSERT_TRUE(automatic->ApplyRope(RopeOptions(), t).ok());
  EXPECT_FALSE(automatic->UsesSharedMemory());
  auto required = Connect(target, SharedMemoryUse::kRequire);
  Bytes q2 = q0;
  t.query = testing::Mutable(DType::kFloat32, {1, 4, 8, 64}, q2);
  const absl::Status s = required->ApplyRope(RopeOptions(), t);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(q2, q0) << "a refused call leaves the caller's tensor as it was";
}

// CUDA regions through posenc.v1's RegisterSharedMemory (cuda_handle), over
// a real socket, on a server without a GPU: refused saying why, by flag or
// by GPU; a request mixing a key and a handle is refused as such; system
// regions keep working beside them and list as not CUDA. (With a GPU, on
// the fake runtime: server/v1/cuda_shared_memory_test.cc.)
TEST(CudaSharedMemoryOverV1, WithoutAGpuRegistrationSaysWhyAndSystemRegionsWork) {
  for (const bool cuda_enabled : {false, true}) {
    auto server = StartServer(true, "127.0.0.1:0", 64, cuda_enabled);
    ASSERT_NE(server, nullptr);
    auto client = Connect("127.0.0.1:" + std::to_string(server->port()), SharedMemoryUse::kOff);
    v1::PositionalEncoding::Stub& stub = client->stub();
    const auto rpc_register = [&](const std::string& key, const std::string& handle) {
      grpc::ClientContext ctx;
      v1::RegisterSharedMemoryRequest req;
      req.set_name("g");
      req.set_key(key);
      req.set_cuda_handle(handle);
      req.set_byte_size(4096);
      v1::SharedMemoryStatus resp;
      return stub.RegisterSharedMemory(&ctx, req, &resp);
    };
    grpc::Status s = rpc_register("", std::string(64, '\0'));
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
    EXPECT_NE(
        s.error_message().find(cuda_enabled ? "no GPU backend" : "--enable_cuda_shared_memory"),
        std::string::npos)
        << s.error_message();
    s = rpc_register("/posenc-both", std::string(64, '\0'));
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_NE(s.error_message().find("not both"), std::string::npos) << s.error_message();

    const std::string key = "/posenc-v1-cuda-" + std::to_string(::getpid());
    const int fd = ::shm_open(key.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, 4096), 0);
    ::close(fd);
    ASSERT_TRUE(rpc_register(key, "").ok());
    ::shm_unlink(key.c_str());
    {
      grpc::ClientContext ctx;
      v1::SharedMemoryStatus status;
      ASSERT_TRUE(stub.GetSharedMemoryStatus(&ctx, v1::SharedMemoryStatusRequest(), &status).ok());
      ASSERT_EQ(status.regions_size(), 1);
      EXPECT_EQ(status.regions(0).name(), "g");
      EXPECT_FALSE(status.regions(0).cuda());
    }
    {
      grpc::ClientContext ctx;
      v1::ServerInfo info;
      ASSERT_TRUE(stub.GetServerInfo(&ctx, v1::GetServerInfoRequest(), &info).ok());
      EXPECT_FALSE(info.cuda_shared_memory_enabled()) << "no GPU";
    }
    {
      grpc::ClientContext ctx;
      v1::UnregisterSharedMemoryRequest req;
      v1::SharedMemoryStatus resp;
      ASSERT_TRUE(stub.UnregisterSharedMemory(&ctx, req, &resp).ok());
    }
    EXPECT_EQ(server->engine().shared_memory().count(), 0);
  }
}

}  // namespace
}  // namespace posenc
