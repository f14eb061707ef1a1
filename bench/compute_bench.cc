// posenc-bench-compute: each kernel case (bench/kernel_cases.h) on one thread with its tensors
// in L2, where memory cannot be what limits it, against an in-place
// read-modify-write of as many bytes in the same run. A kernel that runs
// here at less than twice what the memory-bound target asks of one core is
// bound by its instructions (bench/RESULTS.md, issue 26). Medians of 7.
// --tokens=N scales the tensors (default 16).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernel_cases.h"

namespace {

// GB/s moved (read plus written) by `run` over `bytes`, median of 7.
double Rate(int64_t bytes, const std::function<void()>& run) {
  const int64_t reps = std::max<int64_t>(3, 400'000'000 / std::max<int64_t>(bytes, 1));
  std::vector<double> rates;
  for (int k = 0; k < 7; ++k) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < reps; ++i) run();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rates.push_back(2.0 * static_cast<double>(bytes) * static_cast<double>(reps) / s / 1e9);
  }
  std::sort(rates.begin(), rates.end());
  return rates[3];
}

}  // namespace

int main(int argc, char** argv) {
  int64_t tokens = 16;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--tokens=", 0) == 0) tokens = std::max<int64_t>(1, std::atoll(a.c_str() + 9));
  }
  auto cpu = posenc::CreateCpuBackend(1);
  std::printf("posenc-bench-compute: 1 thread, tensors in L2, median of 7\n");
  std::printf("%-40s %8s %8s %8s\n", "kernel (bfloat16 unless named)", "KiB", "GB/s", "rmw GB/s");
  for (const posenc::bench::KernelCase& c : posenc::bench::KernelCases(*cpu, tokens)) {
    std::vector<uint64_t> words(static_cast<size_t>(c.bytes) / 8);
    const double kernel = Rate(c.bytes, c.run);
    const double rmw = Rate(c.bytes, [&] {
      for (uint64_t& w : words) w ^= 0x0001000100010001ull;
      asm volatile("" ::: "memory");  // keep every pass
    });
    std::printf("%-40s %8lld %8.1f %8.1f\n", c.name.c_str(), static_cast<long long>(c.bytes / 1024),
                kernel, rmw);
  }
  return 0;
}
