// RotateBF16Avx2 (NEOX, BSHD, 128-dim heads) alone: the rows of one token
// rotated again and again by one table, with no table to compute, no
// thread pool and no slow pairs redone, to tell the loop's own speed from
// the call's (posenc-bench-compute). Not part of the build:
//   g++ -O3 -std=c++17 -ffp-contract=off -fno-trapping-math \
//     -I kernels/src -I kernels/include -I build/kernels loop_alone.cc -o loop_alone
//   ./loop_alone ROWS   (40: one token's heads, in L1; 640: 16 tokens, in L2)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "cpu/rope_avx2.inc"

using namespace posenc;
using namespace posenc::internal;

int main(int argc, char** argv) {
  const int64_t rows_n = argc > 1 ? std::atoi(argv[1]) : 40, D = 128, half = 64;
  std::vector<BFloat16> x(rows_n * D);
  std::mt19937 g(1);
  std::normal_distribution<float> normal;
  for (auto& v : x) v = FromFloat<BFloat16>(normal(g));
  std::vector<float> c(half), n(half), cp(half), np(half);
  for (int i = 0; i < half; ++i) {
    c[i] = std::cos(0.37f * i);
    n[i] = std::sin(0.37f * i);
  }
  PairSlots16(c.data(), cp.data(), half);
  PairSlots16(n.data(), np.data(), half);
  const Rows<BFloat16> rows{x.data(), rows_n,  0,         0,         c.data(), n.data(),
                            nullptr,  nullptr, cp.data(), np.data(), 4096,     0};
  std::vector<int32_t> slow_k(rows_n * half);
  std::vector<float> slow_u(rows_n * half), slow_v(rows_n * half);
  double best = 0;
  for (int rep = 0; rep < 15; ++rep) {
    const int calls = 20000;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) {
      int64_t slow = 0;
      RotateBF16Avx2<RopeStyle::kNeox, true, false, 64>(rows, D, half, 1.0f, slow_k.data(),
                                                        slow_u.data(), slow_v.data(), &slow);
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, calls * rows_n * 4 / s);  // 16-pair steps a second
  }
  std::printf("%lld rows: %.1f M steps/s, best of 15 (%.1f GB/s read plus written)\n",
              static_cast<long long>(rows_n), best / 1e6, best * 128 / 1e9);
}
