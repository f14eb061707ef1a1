// An Engine whose CUDA backend sits on the fake CUDA runtime
// (fake_device_runtime.h), with system and CUDA shared memory on (system
// regions pinned by the fake GPU, as a GPU server's are), and helpers to play
// the other process: allocate "device" memory (host memory the test may
// read and write directly) and hand out its IPC handle. For tests of the
// fronts' CUDA shared-memory paths on machines without a GPU.
#ifndef POSENC_TESTS_SUPPORT_FAKE_GPU_ENGINE_H_
#define POSENC_TESTS_SUPPORT_FAKE_GPU_ENGINE_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cuda_backend.h"
#include "engine/engine.h"
#include "fake_device_runtime.h"
#include "gtest/gtest.h"

namespace posenc::testing {

class FakeGpuEngine {
 public:
  // auto_gpu_min_bytes: AUTO's size threshold (EngineOptions; 0 sends
  // every AUTO call to the GPU); warn: EngineOptions::warn.
  explicit FakeGpuEngine(BackendChoice default_backend = BackendChoice::kAuto,
                         int64_t auto_gpu_min_bytes = int64_t{1} << 20,
                         std::function<void(absl::string_view)> warn = nullptr) {
    DeviceInfo info;
    info.name = "fake";
    info.uuid = "GPU-00000000-0000-0000-0000-000000000000";
    auto cuda = cuda::CreateCudaBackendOn(rt_, 0, info, 132);
    EXPECT_TRUE(cuda.ok()) << cuda.status();
    server::EngineOptions o;
    o.shared_memory.enabled = true;
    o.shared_memory.cuda_enabled = true;
    o.auto_by_measured_cost = false;
    o.auto_gpu_min_bytes = auto_gpu_min_bytes;
    o.cpu_threads = 1;
    o.default_backend = default_backend;
    o.warn = std::move(warn);
    auto engine = server::Engine::CreateWith(o, CreateCpuBackend(1), std::move(*cuda), "");
    EXPECT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
  }
  ~FakeGpuEngine() {
    engine_.reset();  // closes every handle
    EXPECT_EQ(rt_.ipc_open(), 0);
    for (void* p : allocations_) rt_.Free(p);
  }

  server::Engine& engine() { return *engine_; }
  // The engine, for a server to own (this object keeps the fake runtime,
  // and must outlive the engine).
  std::unique_ptr<server::Engine> TakeEngine() { return std::move(engine_); }
  FakeDeviceRuntime& runtime() { return rt_; }
  // "Device" memory of the other process, filled with `fill`.
  char* Allocate(size_t bytes, char fill) {
    void* p = nullptr;
    EXPECT_EQ(rt_.Malloc(&p, bytes), cudaSuccess);
    std::memset(p, fill, bytes);
    allocations_.push_back(p);
    return static_cast<char*>(p);
  }
  // Its cudaIpcMemHandle_t, as the other process would send it.
  std::string Handle(char* p) const {
    const cudaIpcMemHandle_t h = rt_.IpcHandleOf(p);
    return std::string(h.reserved, sizeof(h));
  }

 private:
  FakeDeviceRuntime rt_;
  std::unique_ptr<server::Engine> engine_;
  std::vector<void*> allocations_;
};

}  // namespace posenc::testing

#endif  // POSENC_TESTS_SUPPORT_FAKE_GPU_ENGINE_H_
