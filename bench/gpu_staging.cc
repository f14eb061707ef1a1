#include "gpu_staging.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>

#include "posenc/backend.h"
#include "posenc/host_copy.h"
#include "posenc/rope.h"

namespace posenc::bench {
namespace {

// Median wall milliseconds of fn over `reps` calls, after 2 warm-ups (the
// first call sizes the backend's buffers).
double MedianWallMs(const std::function<bool()>& fn, int reps) {
  std::vector<double> t;
  for (int i = 0; i < reps + 2; ++i) {
    const auto a = std::chrono::steady_clock::now();
    if (!fn()) return -1;
    const auto b = std::chrono::steady_clock::now();
    if (i >= 2) t.push_back(std::chrono::duration<double, std::milli>(b - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// A pinned buffer up to the device and back, `bytes` each way.
double PcieRoundTripMs(size_t bytes) {
  void *host = nullptr, *device = nullptr;
  if (cudaMallocHost(&host, bytes) != cudaSuccess) return -1;
  if (cudaMalloc(&device, bytes) != cudaSuccess) {
    cudaFreeHost(host);
    return -1;
  }
  std::memset(host, 1, bytes);
  const double ms = MedianWallMs(
      [&] {
        return cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice) == cudaSuccess &&
               cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost) == cudaSuccess;
      },
      10);
  cudaFree(device);
  cudaFreeHost(host);
  return ms;
}

}  // namespace

std::vector<StagingRow> MeasureStaging() {
  std::vector<StagingRow> rows;
  auto gpu = CreateCudaBackend(0);
  if (!gpu.ok()) {
    std::fprintf(stderr, "staging rows skipped: %s\n", gpu.status().ToString().c_str());
    return rows;
  }
  auto cpu = CreateCpuBackend(0);
  // fp32 RoPE, 4096 tokens x (32 + 8) heads x 128: the served prefill, 80 MiB
  // (BSHD, and BHSD once, whose chunks are gathered head by head).
  const int64_t T = 4096, Hq = 32, Hk = 8, D = 128;
  const size_t q_bytes = T * Hq * D * 4, k_bytes = T * Hk * D * 4, bytes = q_bytes + k_bytes;
  // Pageable memory, as a request's bytes are, and a pinned region (what
  // PinHostMemory makes of a registered system shared-memory region).
  std::vector<float> pageable(bytes / 4);
  void* region = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (float& v : pageable) v = u(rng);
  std::memcpy(region, pageable.data(), bytes);
  std::vector<int64_t> offsets = {0};
  const auto plan_on = [&](char* at, RopeLayout layout) {
    const bool bhsd = layout == RopeLayout::kBHSD;
    RopeTensors t;
    RopeOptions o;
    o.layout = layout;
    t.query = MutableTensor{
        DType::kFloat32,
        bhsd ? std::vector<int64_t>{1, Hq, T, D} : std::vector<int64_t>{1, T, Hq, D}, at, q_bytes};
    t.key =
        MutableTensor{DType::kFloat32,
                      bhsd ? std::vector<int64_t>{1, Hk, T, D} : std::vector<int64_t>{1, T, Hk, D},
                      at + q_bytes, k_bytes};
    t.positions.offsets = TensorView{DType::kInt64, {1}, offsets.data(), 8};
    return PlanRope(o, t);
  };
  const double pcie = PcieRoundTripMs(bytes);
  // A row timing `call(plan)`, the plan over the tensors at `at`.
  const auto time = [&](const char* name, char* at, RopeLayout layout,
                        const std::function<absl::Status(const RopePlan&)>& call) {
    auto plan = plan_on(at, layout);
    if (!plan.ok()) {
      std::fprintf(stderr, "%s: %s\n", name, plan.status().ToString().c_str());
      return;
    }
    const double ms = MedianWallMs(
        [&] {
          const absl::Status s = call(*plan);
          if (!s.ok()) std::fprintf(stderr, "%s: %s\n", name, s.ToString().c_str());
          return s.ok();
        },
        10);
    if (ms >= 0) rows.push_back({name, static_cast<double>(bytes), ms, pcie});
  };
  // In place.
  const auto add = [&](const char* name, Backend& b, char* at,
                       RopeLayout layout = RopeLayout::kBSHD) {
    time(name, at, layout,
         [&](const RopePlan& plan) { return b.ApplyRope(plan, at, at + q_bytes, {}); });
  };
  // From `in` into `out` (a KServe output in a slice of its own), as the
  // server makes such calls: through the backend (ApplyRopeThrough), or,
  // as before 504ee47, aside (copied into a scratch buffer, rotated there,
  // copied out).
  const auto through = [&](const char* name, Backend& b, char* in, char* out) {
    time(name, in, RopeLayout::kBSHD, [&](const RopePlan& plan) {
      RopeThrough t;
      t.query = in;
      t.key = in + q_bytes;
      t.query_out = out;
      t.key_out = out + q_bytes;
      return b.ApplyRopeThrough(plan, t, {});
    });
  };
  std::vector<char> scratch(bytes);
  const auto aside = [&](const char* name, Backend& b, char* in, char* out) {
    time(name, in, RopeLayout::kBSHD, [&](const RopePlan& plan) {
      CopyHostBytes(scratch.data(), in, bytes);
      const absl::Status s = b.ApplyRope(plan, scratch.data(), scratch.data() + q_bytes, {});
      if (s.ok()) CopyHostBytes(out, scratch.data(), bytes);
      return s;
    });
  };
  char* host = reinterpret_cast<char*>(pageable.data());
  add("rope f32 4096x(32+8)x128, cuda, pageable (chunked staging)", **gpu, host);
  add("rope f32 BHSD (32+8)x4096x128, cuda, pageable (chunked staging)", **gpu, host,
      RopeLayout::kBHSD);
  if ((*gpu)->PinHostMemory(region, bytes).ok()) {
    add("rope f32 4096x(32+8)x128, cuda, pinned region (direct)", **gpu,
        static_cast<char*>(region));
    (*gpu)->UnpinHostMemory(region);
  }
  add("rope f32 4096x(32+8)x128, cpu backend, all threads", *cpu, host);
  std::vector<char> elsewhere(bytes);
  through("rope f32 4096x(32+8)x128 into other memory, cuda, pageable (through: staged)", **gpu,
          host, elsewhere.data());
  aside("rope f32 4096x(32+8)x128 into other memory, cuda, pageable (aside: scratch copies)", **gpu,
        host, elsewhere.data());
  void* both = std::aligned_alloc(4096, (2 * bytes + 4095) / 4096 * 4096);
  std::memcpy(both, pageable.data(), bytes);
  if ((*gpu)->PinHostMemory(both, 2 * bytes).ok()) {
    char* in = static_cast<char*>(both);
    through("rope f32 4096x(32+8)x128 into other memory, cuda, pinned region (through: direct)",
            **gpu, in, in + bytes);
    aside("rope f32 4096x(32+8)x128 into other memory, cuda, pinned region (aside: scratch copies)",
          **gpu, in, in + bytes);
    (*gpu)->UnpinHostMemory(both);
  }
  through("rope f32 4096x(32+8)x128 into other memory, cpu backend (through: blocks)", *cpu, host,
          elsewhere.data());
  std::free(both);
  std::free(region);
  return rows;
}

}  // namespace posenc::bench
