// posenc-bench-cpu: CPU backend throughput against a memcpy of the same bytes
// on the same threads, measured in the same run.
//
// In-place kernels read and write every byte once, as a copy does, so the
// ratio (kernel bytes/s over memcpy bytes/s) says how close to the memory
// system the kernel runs. Prints a table, and JSON with --json=PATH.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "posenc/backend.h"
#include "posenc/thread_pool.h"

namespace {

using Clock = std::chrono::steady_clock;

// Median seconds of `reps` runs after `warmup` runs.
double Median(int warmup, int reps, const std::function<void()>& fn) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto start = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

std::vector<uint8_t> Random(size_t bytes, posenc::DType dtype) {
  std::vector<uint8_t> b(bytes);
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> u(-1, 1);
  const size_t n = bytes / posenc::SizeOf(dtype);
  for (size_t i = 0; i < n; ++i) posenc::StoreElement(dtype, b.data(), i, u(rng));
  return b;
}

struct Result {
  std::string name;
  double bytes;  // read + written
  double kernel_s, memcpy_s;
};

}  // namespace

int main(int argc, char** argv) {
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  int reps = 15;
  std::string json;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--threads=", 0) == 0) threads = std::stoi(a.substr(10));
    if (a.rfind("--reps=", 0) == 0) reps = std::stoi(a.substr(7));
    if (a.rfind("--json=", 0) == 0) json = a.substr(7);
  }
  auto cpu = posenc::CreateCpuBackend(threads);
  posenc::ThreadPool pool(threads);
  std::vector<Result> results;

  // A memcpy of `bytes` split across the same number of threads.
  auto memcpy_time = [&](size_t bytes) {
    std::vector<uint8_t> src(bytes, 1), dst(bytes, 0);
    const int64_t chunks = threads * 4;
    return Median(2, reps, [&] {
      pool.ParallelFor(chunks, 1, [&](int64_t b, int64_t e) {
        const size_t lo = bytes * b / chunks, hi = bytes * e / chunks;
        std::memcpy(dst.data() + lo, src.data() + lo, hi - lo);
      });
    });
  };

  for (posenc::DType dtype : {posenc::DType::kBFloat16, posenc::DType::kFloat32}) {
    for (posenc::RopeStyle style : {posenc::RopeStyle::kNeox, posenc::RopeStyle::kGptj}) {
      const int64_t T = 4096, Hq = 32, Hk = 8, D = 128;
      const size_t es = posenc::SizeOf(dtype);
      auto q = Random(T * Hq * D * es, dtype), k = Random(T * Hk * D * es, dtype);
      posenc::RopeOptions o;
      o.style = style;
      o.layout = posenc::RopeLayout::kTHD;
      posenc::RopeTensors t;
      t.query = {dtype, {T, Hq, D}, q.data(), q.size()};
      t.key = {dtype, {T, Hk, D}, k.data(), k.size()};
      std::vector<int64_t> offsets = {1000};
      auto plan = posenc::PlanRope(o, t);
      if (!plan.ok()) return 1;
      const double s =
          Median(2, reps, [&] { (void)cpu->ApplyRope(*plan, q.data(), k.data(), {}); });
      const size_t bytes = q.size() + k.size();
      results.push_back({std::string("rope ") + posenc::DTypeName(dtype) +
                             (style == posenc::RopeStyle::kNeox ? " neox" : " gptj") +
                             " 4096x(32+8)x128",
                         2.0 * bytes, s, memcpy_time(bytes)});
    }
  }
  for (posenc::DType dtype : {posenc::DType::kFloat32, posenc::DType::kBFloat16}) {
    const int64_t T = 4096, d = 4096;
    auto x = Random(T * d * posenc::SizeOf(dtype), dtype);
    posenc::AbsoluteOptions o;
    posenc::AbsoluteTensors t;
    t.x = {dtype, {1, T, d}, x.data(), x.size()};
    auto plan = posenc::PlanAbsolute(o, t);
    if (!plan.ok()) return 1;
    const double s = Median(2, reps, [&] { (void)cpu->ApplyAbsolute(*plan, x.data(), {}); });
    results.push_back({std::string("sinusoidal add ") + posenc::DTypeName(dtype) + " [4096, 4096]",
                       2.0 * x.size(), s, memcpy_time(x.size())});
  }

  std::printf("posenc-bench-cpu: %d threads, median of %d runs\n", threads, reps);
  std::printf("%-42s %10s %10s %12s %8s\n", "operation", "MB moved", "GB/s", "memcpy GB/s",
              "ratio");
  for (const Result& r : results) {
    std::printf("%-42s %10.1f %10.2f %12.2f %8.2f\n", r.name.c_str(), r.bytes / 1e6,
                r.bytes / r.kernel_s / 1e9, r.bytes / r.memcpy_s / 1e9, r.memcpy_s / r.kernel_s);
  }
  if (!json.empty()) {
    std::ofstream out(json);
    out << "{\"threads\": " << threads << ", \"results\": [";
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      out << (i ? ", " : "") << "{\"name\": \"" << r.name << "\", \"bytes\": " << r.bytes
          << ", \"kernel_s\": " << r.kernel_s << ", \"memcpy_s\": " << r.memcpy_s
          << ", \"ratio\": " << r.memcpy_s / r.kernel_s << "}";
    }
    out << "]}\n";
  }
  return 0;
}
