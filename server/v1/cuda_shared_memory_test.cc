// posenc.v1 requests naming CUDA shared memory (RegisterSharedMemory with a
// cuda_handle, then *_shm slices of it), on an engine whose CUDA backend
// sits on the fake CUDA runtime: computed in place on the device, bit for
// bit what the CPU backend makes of the same tensors sent in the message.
#include <cstring>
#include <random>
#include <string>

#include "engine/engine.h"
#include "fake_gpu_engine.h"
#include "gtest/gtest.h"
#include "posenc/client.h"
#include "test_tensors.h"
#include "v1/operations.h"
#include "v1/tensor_methods.h"

namespace posenc::server {
namespace {

constexpr int64_t kTokens = 20, kHeads = 4, kKeyHeads = 2, kDim = 64;
constexpr int64_t kQueryBytes = kTokens * kHeads * kDim * 2;  // BF16
constexpr int64_t kKeyBytes = kTokens * kKeyHeads * kDim * 2;

v1::TensorDesc Desc(int64_t heads) {
  v1::TensorDesc d;
  d.set_dtype(v1::DATA_TYPE_BFLOAT16);
  for (int64_t x : {int64_t{1}, kTokens, heads, kDim}) d.add_shape(x);
  return d;
}

TEST(CudaSharedMemoryOnFakeRuntime, RopeInPlaceOnTheDeviceMatchesTheCpu) {
  testing::FakeGpuEngine gpu;
  Engine& engine = gpu.engine();
  testing::Bytes q = testing::RandomTensor(DType::kBFloat16, kQueryBytes / 2);
  testing::Bytes k = testing::RandomTensor(DType::kBFloat16, kKeyBytes / 2);
  char* device = gpu.Allocate(kQueryBytes + kKeyBytes + 256, 0x7f);
  std::memcpy(device, q.data(), kQueryBytes);
  std::memcpy(device + kQueryBytes, k.data(), kKeyBytes);
  ASSERT_TRUE(engine.shared_memory()
                  .RegisterCuda("gpu", gpu.Handle(device), 0, kQueryBytes + kKeyBytes + 256)
                  .ok());

  // The CPU's answer to the same tensors in the message.
  v1::RopeRequest cpu;
  *cpu.mutable_query() = Desc(kHeads);
  cpu.set_query_data(std::string(q.begin(), q.end()));
  *cpu.mutable_key() = Desc(kKeyHeads);
  cpu.set_key_data(std::string(k.begin(), k.end()));
  cpu.mutable_offsets()->set_dtype(v1::DATA_TYPE_INT64);
  cpu.mutable_offsets()->add_shape(1);
  const int64_t offset = 11;
  cpu.mutable_offsets()->set_data(std::string(reinterpret_cast<const char*>(&offset), 8));
  v1::RopeRequest on_device = cpu;
  cpu.set_backend(v1::BACKEND_CPU);
  v1::RopeResponse want;
  ASSERT_TRUE(ApplyRope(engine, &cpu, &want, RunContext{}).ok());
  ASSERT_EQ(want.backend(), "cpu");

  on_device.clear_query_data();
  on_device.clear_key_data();
  on_device.mutable_query_shm()->set_region("gpu");
  on_device.mutable_query_shm()->set_byte_size(kQueryBytes);
  on_device.mutable_key_shm()->set_region("gpu");
  on_device.mutable_key_shm()->set_offset(kQueryBytes);
  on_device.mutable_key_shm()->set_byte_size(kKeyBytes);
  const int64_t copied = gpu.runtime().bytes_copied();
  v1::RopeResponse got;
  ASSERT_TRUE(ApplyRope(engine, &on_device, &got, RunContext{}).ok());
  EXPECT_EQ(got.backend(), "cuda:0");
  EXPECT_TRUE(got.query_data().empty() && got.key_data().empty()) << "results stay in the region";
  EXPECT_EQ(std::string(device, kQueryBytes), want.query_data());
  EXPECT_EQ(std::string(device + kQueryBytes, kKeyBytes), want.key_data());
  EXPECT_EQ(std::string(device + kQueryBytes + kKeyBytes, 256), std::string(256, '\x7f'));
  EXPECT_LT(gpu.runtime().bytes_copied() - copied, kQueryBytes / 8) << "only the side tables";

  // A key in the message beside a query on the device: refused, untouched.
  v1::RopeRequest mixed = on_device;
  mixed.clear_key_shm();
  mixed.set_key_data(std::string(k.begin(), k.end()));
  const std::string before(device, kQueryBytes);
  v1::RopeResponse refused;
  const absl::Status s = ApplyRope(engine, &mixed, &refused, RunContext{});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(std::string(device, kQueryBytes), before);
}

// A small call runs on gRPC's own thread only where no GPU could take it:
// a GPU call waits for a worker of the backend, which must never hold
// gRPC's threads.
TEST(TensorMethodsOnAGpuServer, NoCallIsLight) {
  v1::RopeRequest small;
  small.mutable_query()->set_dtype(v1::DATA_TYPE_FLOAT32);
  for (int64_t d : {1, 4, 2, 8}) small.mutable_query()->add_shape(d);
  small.set_query_data(std::string(4 * 2 * 8 * 4, '\x01'));
  const std::string bytes = small.SerializeAsString();
  grpc::Slice slice(bytes);
  const grpc::ByteBuffer request(&slice, 1);

  auto cpu_only = Engine::Create(EngineOptions{});
  ASSERT_TRUE(cpu_only.ok()) << cpu_only.status();
  int light = 0;
  for (const Method& m : TensorMethods(cpu_only->get())) light += m.light && m.light(request);
  EXPECT_EQ(light, 2) << "ApplyRope and AddAbsoluteEncoding run small calls inline";

  testing::FakeGpuEngine gpu;
  ASSERT_NE(gpu.engine().cuda(), nullptr);
  for (const Method& m : TensorMethods(&gpu.engine())) {
    EXPECT_FALSE(m.light && m.light(request)) << m.name;
  }
}

}  // namespace
}  // namespace posenc::server
