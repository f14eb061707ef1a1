// The C++ client passing device pointers (Client::RegisterDeviceMemory)
// to an in-process server whose CUDA backend sits on the fake CUDA runtime
// (tests/support/fake_gpu_engine.h), over a real socket: calls whose tensors
// lie in registered device memory are computed in place there, bit for bit
// what the CPU backend makes of the same tensors sent as bytes; the client
// never touches that memory itself.
#include <cstring>
#include <memory>
#include <string>

#include "fake_gpu_engine.h"
#include "gtest/gtest.h"
#include "posenc/client.h"
#include "server.h"
#include "test_tensors.h"

namespace posenc {
namespace {

using testing::Bytes;

class DeviceMemoryClient : public ::testing::Test {
 protected:
  void SetUp() override {
    server::ServerOptions o;
    o.listen_address = "127.0.0.1:0";
    o.engine.enable_cuda = false;  // the engine comes from the fake GPU instead
    auto s = server::Server::StartWith(o, gpu_.TakeEngine());
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    ClientOptions co;
    co.target = "127.0.0.1:" + std::to_string(server_->port());
    co.shared_memory = SharedMemoryUse::kOff;  // host tensors by the socket only
    auto c = Client::Create(co);
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
  }
  void TearDown() override {
    client_.reset();  // unregisters its device memory
    EXPECT_EQ(server_->engine().shared_memory().count(), 0);
    server_.reset();
  }
  // Device memory of this "process", registered with the server.
  char* Registered(size_t bytes) {
    char* p = gpu_.Allocate(bytes, 0x7f);
    DeviceAllocation a;
    a.base = p;
    a.bytes = bytes;
    a.ipc_handle = gpu_.Handle(p);
    EXPECT_TRUE(client_->RegisterDeviceMemory(a).ok());
    return p;
  }

  testing::FakeGpuEngine gpu_;  // outlives the server, which owns its engine
  std::unique_ptr<server::Server> server_;
  std::unique_ptr<Client> client_;
};

TEST_F(DeviceMemoryClient, RopeAbsoluteAndBiasInPlaceInDeviceMemory) {
  const int64_t qn = 24 * 8 * 64, kn = 24 * 2 * 64;
  const Bytes q = testing::RandomTensor(DType::kBFloat16, qn);
  const Bytes k = testing::RandomTensor(DType::kBFloat16, kn);
  char* device = Registered(1 << 20);
  std::memcpy(device, q.data(), q.size());
  std::memcpy(device + 32768, k.data(), k.size());
  // The CPU's results for the same tensors, sent as bytes.
  Bytes cq = q, ck = k;
  RopeTensors host;
  host.query = testing::Mutable(DType::kBFloat16, {1, 24, 8, 64}, cq);
  host.key = testing::Mutable(DType::kBFloat16, {1, 24, 2, 64}, ck);
  CallOptions cpu;
  cpu.backend = BackendChoice::kCpu;
  ASSERT_TRUE(client_->ApplyRope(RopeOptions(), host, cpu).ok());

  RopeTensors on_device;
  on_device.query = {DType::kBFloat16, {1, 24, 8, 64}, device, q.size()};
  on_device.key = {DType::kBFloat16, {1, 24, 2, 64}, device + 32768, k.size()};
  const int64_t copied = gpu_.runtime().bytes_copied();
  ASSERT_TRUE(client_->ApplyRope(RopeOptions(), on_device).ok());
  EXPECT_EQ(Bytes(device, device + q.size()), cq);
  EXPECT_EQ(Bytes(device + 32768, device + 32768 + k.size()), ck);
  EXPECT_LT(gpu_.runtime().bytes_copied() - copied, static_cast<int64_t>(q.size() / 4));

  // Asynchronously, once more: rotated twice, as the CPU rotates twice.
  ASSERT_TRUE(client_->ApplyRope(RopeOptions(), host, cpu).ok());
  ASSERT_TRUE(client_->ApplyRopeAsync(RopeOptions(), on_device).get().ok());
  EXPECT_EQ(Bytes(device, device + q.size()), cq);

  // The absolute encoding added in place, sync and async.
  std::vector<int64_t> positions(24);
  for (int64_t i = 0; i < 24; ++i) positions[i] = 5 * i;
  Bytes cx = q;
  AbsoluteTensors ax;
  ax.x = testing::Mutable(DType::kBFloat16, {24, 8 * 64}, cx);
  ax.positions.position_ids = testing::IntView(positions, {24});
  ASSERT_TRUE(client_->AddAbsoluteEncoding(AbsoluteOptions(), ax, cpu).ok());
  ASSERT_TRUE(client_->AddAbsoluteEncoding(AbsoluteOptions(), ax, cpu).ok());
  char* x = device + 65536;
  std::memcpy(x, q.data(), q.size());
  AbsoluteTensors dx = ax;
  dx.x.data = x;
  ASSERT_TRUE(client_->AddAbsoluteEncoding(AbsoluteOptions(), dx).ok());
  ASSERT_TRUE(client_->AddAbsoluteEncodingAsync(AbsoluteOptions(), dx).get().ok());
  EXPECT_EQ(Bytes(x, x + q.size()), cx);

  // ALiBi added to logits in device memory.
  const Bytes logits = testing::RandomTensor(DType::kFloat32, 2 * 4 * 6 * 6);
  Bytes cl = logits;
  BiasOptions bo;
  bo.num_heads = 4;
  bo.causal = true;
  std::vector<double> cpu_slopes, slopes;
  ASSERT_TRUE(client_
                  ->ApplyAttentionBias(bo, testing::Mutable(DType::kFloat32, {2, 4, 6, 6}, cl),
                                       &cpu_slopes, cpu)
                  .ok());
  char* l = device + 131072;
  std::memcpy(l, logits.data(), logits.size());
  const size_t claimed = server_->engine().attempts().size();
  ASSERT_TRUE(client_
                  ->ApplyAttentionBias(
                      bo, MutableTensor{DType::kFloat32, {2, 4, 6, 6}, l, logits.size()}, &slopes)
                  .ok());
  EXPECT_EQ(Bytes(l, l + logits.size()), cl);
  // The device path claimed the call's id before it wrote (a retry of it
  // would be refused); the CPU's call on the socket above claimed none.
  EXPECT_EQ(server_->engine().attempts().size(), claimed + 1);
  EXPECT_EQ(slopes, cpu_slopes);
}

TEST_F(DeviceMemoryClient, MixedOrUnregisteredMemoryIsRefusedOrGoesByTheSocket) {
  char* device = Registered(1 << 16);
  const Bytes q = testing::RandomTensor(DType::kFloat32, 4 * 2 * 64);
  Bytes k = testing::RandomTensor(DType::kFloat32, 4 * 1 * 64);
  std::memcpy(device, q.data(), q.size());
  RopeTensors mixed;
  mixed.query = {DType::kFloat32, {1, 4, 2, 64}, device, q.size()};
  mixed.key = testing::Mutable(DType::kFloat32, {1, 4, 1, 64}, k);
  absl::Status s = client_->ApplyRope(RopeOptions(), mixed);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("key is in host memory"), std::string::npos) << s;
  EXPECT_EQ(client_->ApplyRopeAsync(RopeOptions(), mixed).get().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Bytes(device, device + q.size()), q) << "nothing ran";

  // Past the registered allocation: host memory as far as the client knows.
  RopeTensors past;
  past.query = {DType::kFloat32, {1, 4, 2, 64}, device + (1 << 16) - 64, q.size()};
  EXPECT_EQ(client_->ApplyRope(RopeOptions(), past).code(), absl::StatusCode::kInvalidArgument)
      << "past the end of the allocation";

  // Registration checks, and unregistering.
  DeviceAllocation bad;
  bad.base = device;
  bad.bytes = 64;
  bad.ipc_handle = std::string(63, 'x');
  EXPECT_EQ(client_->RegisterDeviceMemory(bad).code(), absl::StatusCode::kInvalidArgument);
  bad.ipc_handle = gpu_.Handle(device);
  EXPECT_EQ(client_->RegisterDeviceMemory(bad).code(), absl::StatusCode::kAlreadyExists);
  DeviceAllocation forged;
  char* other = gpu_.Allocate(4096, 0);
  forged.base = other;
  forged.bytes = 4096;
  forged.ipc_handle = std::string(64, 'z');
  s = client_->RegisterDeviceMemory(forged);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  ASSERT_TRUE(client_->UnregisterDeviceMemory(device).ok());
  EXPECT_EQ(client_->UnregisterDeviceMemory(device).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(server_->engine().shared_memory().count(), 0);
}

}  // namespace
}  // namespace posenc
