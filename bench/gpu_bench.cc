// posenc-bench-gpu: device kernels against a device-to-device copy of the same
// bytes, measured in the same run with CUDA events (issue 3's targets). Two
// copies: cudaMemcpyAsync (a copy engine) and a copy kernel on the SMs
// (sm_copy.h; the best of 2, 4 and 8 blocks per SM), checked to copy
// exactly before it is timed; each row gives the ratio to both.
//
//   RoPE bf16 16384 tokens x (32 q + 8 k heads) x 128, NEOX and GPT-J:
//     effective bandwidth (q and k read + written) vs cudaMemcpy D2D.
//   Decode RoPE, batch 1..256 x 1 token: kernel time from a CUDA graph of
//     200 launches replayed (no host launch overhead between kernels).
//   Sinusoidal add [16384, 4096] and bias added to logits [1, 32, 2048, 2048]
//     (also with left padding, and built).
//   The backend's whole call on an 80 MiB host tensor (gpu_staging.h),
//     against a PCIe round trip of its bytes and the CPU backend.
// Prints tables; --json=PATH writes the figures. Exits 0 with a note when no
// GPU is visible.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "cuda/cuda_kernels.h"
#include "gpu_staging.h"
#include "math/phase.h"
#include "sm_copy.h"

namespace {

#define CHECK(call)                                                                              \
  do {                                                                                           \
    cudaError_t e_ = (call);                                                                     \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

// Median milliseconds per call of fn, over `reps` timed calls of `batch`
// back-to-back launches each.
double MedianMs(const std::function<void()>& fn, int reps = 30, int batch = 1) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 5; ++i) fn();
  std::vector<float> t;
  for (int r = 0; r < reps; ++r) {
    CHECK(cudaEventRecord(a));
    for (int i = 0; i < batch; ++i) fn();
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms / batch);
  }
  CHECK(cudaGetLastError());
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Median milliseconds per launch of fn, captured `batch` times into a CUDA
// graph on `stream` and replayed: what the kernels cost without the host's
// launch overhead between them.
double GraphMedianMs(const std::function<void(cudaStream_t)>& fn, int reps, int batch) {
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < batch; ++i) fn(stream);
  CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) CHECK(cudaGraphLaunch(exec, stream));
  std::vector<float> t;
  for (int r = 0; r < reps; ++r) {
    CHECK(cudaEventRecord(a, stream));
    CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaEventRecord(b, stream));
    CHECK(cudaEventSynchronize(b));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms / batch);
  }
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  CHECK(cudaStreamDestroy(stream));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

template <typename T>
T* DeviceArray(const std::vector<T>& host) {
  T* d;
  CHECK(cudaMalloc(&d, std::max<size_t>(1, host.size() * sizeof(T))));
  CHECK(cudaMemcpy(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

// Random bf16/f32 bytes (never zeros: they hide unwritten outputs).
void* RandomDevice(size_t bytes) {
  std::vector<uint16_t> h(bytes / 2);
  uint32_t x = 12345;
  for (auto& v : h) {
    x = x * 1664525u + 1013904223u;
    v = static_cast<uint16_t>(0x3c00 | (x >> 22));  // values in [1, 2) as bf16/f16-ish bits
  }
  return DeviceArray(h);
}

// The same run's copies of the bytes a kernel reads and writes.
struct Baselines {
  double copy_ms = 0;     // cudaMemcpyAsync D2D
  double sm_copy_ms = 0;  // the SM copy kernel, its best launch shape
};

struct Row {
  std::string name;
  double bytes;  // moved by the kernel (read + write)
  double ms;
  Baselines base;  // of bytes / 2 (the same read + write traffic); zeros if n/a
};

// The SM copy must copy: every byte of a random buffer, compared on the host.
void CheckSmCopy(int sms) {
  const size_t bytes = size_t{16} << 20;
  std::vector<uint8_t> host(bytes), back(bytes, 0);
  uint32_t x = 777;
  for (auto& b : host) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<uint8_t>(x >> 24);
  }
  void *src, *dst;
  CHECK(cudaMalloc(&src, bytes));
  CHECK(cudaMalloc(&dst, bytes));
  CHECK(cudaMemcpy(src, host.data(), bytes, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(dst, 0, bytes));
  CHECK(posenc::bench::LaunchSmCopy(dst, src, bytes, sms, nullptr));
  CHECK(cudaMemcpy(back.data(), dst, bytes, cudaMemcpyDeviceToHost));
  CHECK(cudaFree(src));
  CHECK(cudaFree(dst));
  if (back != host) {
    std::fprintf(stderr, "posenc-bench-gpu: the SM copy kernel did not copy\n");
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string json;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--json=", 0) == 0) json = a.substr(7);
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("posenc-bench-gpu: no CUDA device visible; nothing to measure\n");
    return 0;
  }
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  int driver = 0;
  CHECK(cudaDriverGetVersion(&driver));
  std::vector<Row> rows;
  CheckSmCopy(prop.multiProcessorCount);

  auto copy_ms = [&](size_t bytes) {
    void *src, *dst;
    CHECK(cudaMalloc(&src, bytes));
    CHECK(cudaMalloc(&dst, bytes));
    CHECK(cudaMemset(src, 1, bytes));
    Baselines b;
    b.copy_ms =
        MedianMs([&] { CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice)); });
    for (int per_sm : {2, 4, 8}) {
      const double ms = MedianMs([&] {
        CHECK(posenc::bench::LaunchSmCopy(dst, src, bytes, prop.multiProcessorCount, nullptr,
                                          per_sm));
      });
      if (b.sm_copy_ms == 0 || ms < b.sm_copy_ms) b.sm_copy_ms = ms;
    }
    CHECK(cudaFree(src));
    CHECK(cudaFree(dst));
    return b;
  };

  // RoPE on T tokens, one position set, THD layout.
  using posenc::DType;
  using posenc::RopeStyle;
  const int sms = prop.multiProcessorCount;
  auto rope_params = [&](int64_t T, DType dtype, RopeStyle style, size_t* bytes) {
    const int Hq = 32, Hk = 8, D = 128;
    const size_t es = dtype == DType::kFloat32 ? 4 : 2;
    *bytes = static_cast<size_t>(T) * (Hq + Hk) * D * es;
    std::vector<int64_t> pos(T);
    for (int64_t t = 0; t < T; ++t) pos[t] = 1000 + t;
    std::vector<double> inv(D / 2);
    for (int k = 0; k < D / 2; ++k) inv[k] = std::pow(10000.0, -2.0 * k / D);
    posenc::cuda::RopeParams p{};
    p.query = RandomDevice(static_cast<size_t>(T) * Hq * D * es);
    p.key = RandomDevice(static_cast<size_t>(T) * Hk * D * es);
    p.positions = DeviceArray(pos);
    p.inv_freq = DeviceArray(inv);
    p.attention_scale = DeviceArray(std::vector<double>{1.0});
    p.slot_axis = DeviceArray(std::vector<int32_t>(D / 2, 0));
    p.num_tokens = T;
    p.dtype = dtype;
    p.layout = posenc::RopeLayout::kTHD;
    p.style = style;
    p.query_heads = Hq;
    p.key_heads = Hk;
    p.head_dim = D;
    p.rotary_dim = D;
    p.num_axes = 1;
    return p;
  };

  for (DType dtype : {DType::kBFloat16, DType::kFloat32}) {
    for (RopeStyle style : {RopeStyle::kNeox, RopeStyle::kGptj}) {
      size_t bytes;
      posenc::cuda::RopeParams p = rope_params(16384, dtype, style, &bytes);
      const double ms = MedianMs([&] { CHECK(posenc::cuda::LaunchRope(p, sms, nullptr)); });
      rows.push_back({std::string("rope ") + (dtype == DType::kBFloat16 ? "bf16" : "f32") +
                          (style == RopeStyle::kNeox ? " neox" : " gptj") + " 16384x(32+8)x128",
                      2.0 * bytes, ms, copy_ms(bytes)});
    }
  }
  // The head split's target, swept: LaunchRope splits heads over
  // blockIdx.y until the grid has kBlocksPerSm blocks per SM, so passing a
  // multiple of the SM count asks for that many times more.
  for (DType dtype : {DType::kBFloat16, DType::kFloat32}) {
    size_t bytes;
    posenc::cuda::RopeParams p = rope_params(16384, dtype, RopeStyle::kNeox, &bytes);
    const Baselines copy = copy_ms(bytes);
    for (int per_sm : {4, 8, 16}) {
      const int as_if = sms * per_sm / posenc::cuda::kBlocksPerSm;
      const double ms = MedianMs([&] { CHECK(posenc::cuda::LaunchRope(p, as_if, nullptr)); });
      rows.push_back({std::string("rope ") + (dtype == DType::kBFloat16 ? "bf16" : "f32") +
                          " neox 16384x(32+8)x128 split " + std::to_string(per_sm) + "/SM",
                      2.0 * bytes, ms, copy});
    }
  }
  for (int64_t batch : {1, 8, 32, 64, 128, 256}) {
    size_t bytes;
    posenc::cuda::RopeParams p = rope_params(batch, DType::kBFloat16, RopeStyle::kNeox, &bytes);
    const double ms =
        GraphMedianMs([&](cudaStream_t s) { CHECK(posenc::cuda::LaunchRope(p, sms, s)); }, 20, 200);
    rows.push_back(
        {"decode rope bf16 batch " + std::to_string(batch) + " x1 token", 2.0 * bytes, ms, {}});
  }
  for (DType dtype : {DType::kBFloat16, DType::kFloat32}) {
    const int64_t T = 16384, d = 4096;
    const size_t bytes = static_cast<size_t>(T) * d * (dtype == DType::kFloat32 ? 4 : 2);
    std::vector<int64_t> pos(T);
    for (int64_t t = 0; t < T; ++t) pos[t] = t;
    const int64_t F = d / 2;
    std::vector<double> omega(F);
    std::vector<uint64_t> step(F);
    std::vector<float> offset_sin(posenc::internal::kPhaseAnchorStride * F);
    std::vector<float> offset_cos(offset_sin.size());
    for (int64_t i = 0; i < F; ++i) {
      omega[i] = std::pow(10000.0, -2.0 * i / d);
      step[i] = posenc::internal::PhaseStepOf(omega[i]);
    }
    posenc::internal::BuildOffsetTable(omega.data(), F, offset_sin.data(), offset_cos.data());
    posenc::cuda::AbsoluteParams p{};
    p.x = RandomDevice(bytes);
    p.positions = DeviceArray(pos);
    p.sinusoidal = {DeviceArray(omega), DeviceArray(step), DeviceArray(offset_sin),
                    DeviceArray(offset_cos), F};
    p.num_tokens = T;
    p.dim = d;
    p.dtype = dtype;
    p.interleaved = true;
    p.has_input = true;
    p.x_scale = 1.0;
    const double ms = MedianMs([&] { CHECK(posenc::cuda::LaunchAbsolute(p, nullptr)); });
    rows.push_back({std::string("sinusoidal add ") + (dtype == DType::kBFloat16 ? "bf16" : "f32") +
                        " [16384, 4096]",
                    2.0 * bytes, ms, copy_ms(bytes)});
  }
  {
    const int64_t H = 32, Q = 2048, K = 2048;
    const size_t bytes = static_cast<size_t>(H) * Q * K * 2;
    posenc::cuda::BiasParams p{};
    p.out = RandomDevice(bytes);
    std::vector<double> slopes(H);
    for (int h = 0; h < H; ++h) slopes[h] = std::exp2(-8.0 * (h + 1) / H);
    p.slopes = DeviceArray(slopes);
    p.k_lens = DeviceArray(std::vector<int64_t>{K});
    p.k_starts = DeviceArray(std::vector<int64_t>{0});
    p.batch = 1;
    p.heads = H;
    p.q_len = Q;
    p.k_len = K;
    p.row_count = H * Q;
    p.q_offset = 0;
    p.dtype = DType::kBFloat16;
    p.form = posenc::BiasForm::kCausal;
    p.causal = true;
    p.add_to_logits = true;
    const double ms = MedianMs([&] { CHECK(posenc::cuda::LaunchBias(p, nullptr)); });
    rows.push_back(
        {"alibi+causal added to bf16 logits [1,32,2048,2048]", 2.0 * bytes, ms, copy_ms(bytes)});
    // Left padding: the first 512 keys are masked, the rest shifted (k_starts).
    const int64_t pad = 512;
    p.k_lens = DeviceArray(std::vector<int64_t>{K - pad});
    p.k_starts = DeviceArray(std::vector<int64_t>{pad});
    const double padded_ms = MedianMs([&] { CHECK(posenc::cuda::LaunchBias(p, nullptr)); });
    rows.push_back({"alibi+causal+left pad 512 added to bf16 logits [1,32,2048,2048]", 2.0 * bytes,
                    padded_ms, copy_ms(bytes)});
    // Built, not added: written only, so the baseline copies half the bytes
    // (the same traffic).
    p.add_to_logits = false;
    const double built_ms = MedianMs([&] { CHECK(posenc::cuda::LaunchBias(p, nullptr)); });
    rows.push_back({"alibi+causal+left pad 512 built as bf16 [1,32,2048,2048]", 1.0 * bytes,
                    built_ms, copy_ms(bytes / 2)});
  }

  std::printf("posenc-bench-gpu on %s (cc %d.%d, %zu MiB, driver %d)\n", prop.name, prop.major,
              prop.minor, prop.totalGlobalMem >> 20, driver);
  std::printf("%-64s %10s %10s %10s %8s %12s %8s\n", "operation", "us", "GB/s", "copy GB/s",
              "ratio", "SM copy GB/s", "ratio");
  for (const Row& r : rows) {
    const double gbs = r.bytes / (r.ms * 1e-3) / 1e9;
    if (r.base.copy_ms > 0) {
      const double cgbs = r.bytes / (r.base.copy_ms * 1e-3) / 1e9;
      const double sgbs = r.bytes / (r.base.sm_copy_ms * 1e-3) / 1e9;
      std::printf("%-64s %10.1f %10.0f %10.0f %8.2f %12.0f %8.2f\n", r.name.c_str(), r.ms * 1e3,
                  gbs, cgbs, r.base.copy_ms / r.ms, sgbs, r.base.sm_copy_ms / r.ms);
    } else {
      std::printf("%-64s %10.2f %10.0f %10s %8s %12s %8s\n", r.name.c_str(), r.ms * 1e3, gbs, "-",
                  "-", "-", "-");
    }
  }
  // The backend's whole call on host tensors: staging, copies and kernel.
  const std::vector<posenc::bench::StagingRow> staging = posenc::bench::MeasureStaging();
  if (!staging.empty()) {
    std::printf("\n%-64s %10s %10s %14s %8s\n", "whole call on host tensors", "us", "GB/s",
                "PCIe round trip", "ratio");
    for (const auto& r : staging) {
      std::printf("%-64s %10.1f %10.1f %12.1f us %8.2f\n", r.name.c_str(), r.ms * 1e3,
                  r.bytes / (r.ms * 1e-3) / 1e9, r.pcie_ms * 1e3, r.pcie_ms / r.ms);
    }
  }
  if (!json.empty()) {
    std::ofstream out(json);
    out << "{\"device\": \"" << prop.name << "\", \"driver\": " << driver << ", \"results\": [";
    for (size_t i = 0; i < rows.size(); ++i) {
      out << (i ? ", " : "") << "{\"name\": \"" << rows[i].name
          << "\", \"bytes\": " << rows[i].bytes << ", \"ms\": " << rows[i].ms
          << ", \"copy_ms\": " << rows[i].base.copy_ms
          << ", \"sm_copy_ms\": " << rows[i].base.sm_copy_ms << "}";
    }
    out << "], \"staging\": [";
    for (size_t i = 0; i < staging.size(); ++i) {
      out << (i ? ", " : "") << "{\"name\": \"" << staging[i].name
          << "\", \"bytes\": " << staging[i].bytes << ", \"ms\": " << staging[i].ms
          << ", \"pcie_round_trip_ms\": " << staging[i].pcie_ms << "}";
    }
    out << "]}\n";
  }
  return 0;
}
