// rmw in BHSD-like patterns vs linear: 2 threads, chunks of 512 tokens taken dynamically.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
using Clock = std::chrono::steady_clock;
constexpr int64_t T = 4096, Hq = 32, Hk = 8, D = 128;
static void rmw(uint64_t* p, int64_t words) {
  for (int64_t i = 0; i < words; ++i) p[i] ^= 0x5a5a5a5a5a5a5a5aull;
}
static void rmw_pf(uint64_t* p, int64_t words, int64_t ahead) {
  for (int64_t i = 0; i < words; i += 8) {
    __builtin_prefetch(p + i + ahead / 8, 0, 0);
    for (int j = 0; j < 8; ++j) p[i + j] ^= 0x5a5a5a5a5a5a5a5aull;
  }
}
int main(int argc, char** argv) {
  const int64_t es = 4;  // fp32
  std::vector<float> q(Hq * T * D), k(Hk * T * D);
  std::memset(q.data(), 1, q.size() * 4);
  std::memset(k.data(), 1, k.size() * 4);
  const int64_t chunk = 512;
  auto run = [&](int mode, int64_t block) {
    std::atomic<int64_t> next{0};
    auto worker = [&] {
      for (;;) {
        int64_t c = next.fetch_add(1);
        if (c * chunk >= T) return;
        int64_t t0 = c * chunk, t1 = t0 + chunk;
        if (mode == 0) {  // linear (BSHD-like): the chunk's bytes of q and k as contiguous ranges
          rmw((uint64_t*)(q.data() + t0 * Hq * D), chunk * Hq * D * es / 8);
          rmw((uint64_t*)(k.data() + t0 * Hk * D), chunk * Hk * D * es / 8);
        } else {
          for (int64_t b = t0; b < t1; b += block)
            for (int side = 0; side < 2; ++side) {
              float* base = side ? k.data() : q.data();
              int64_t H = side ? Hk : Hq;
              for (int64_t h = 0; h < H; ++h) {
                uint64_t* p = (uint64_t*)(base + (h * T + b) * D);
                if (mode == 1)
                  rmw(p, block * D * es / 8);
                else
                  rmw_pf(p, block * D * es / 8, 4096);
              }
            }
        }
      }
    };
    auto s = Clock::now();
    std::thread th(worker);
    worker();
    th.join();
    return 2.0 * (q.size() + k.size()) * 4 /
           std::chrono::duration<double>(Clock::now() - s).count() / 1e9;
  };
  struct Cfg {
    int mode;
    int64_t block;
    const char* name;
  };
  std::vector<Cfg> cfgs = {{0, 0, "linear"},
                           {1, 32, "bhsd32"},
                           {2, 32, "bhsd32-nta4k"},
                           {1, 128, "bhsd128"},
                           {1, 512, "bhsd512"}};
  int reps = argc > 1 ? atoi(argv[1]) : 11;
  std::vector<std::vector<double>> r(cfgs.size());
  for (int i = 0; i < 2; ++i)
    for (auto& c : cfgs) run(c.mode, c.block);
  for (int i = 0; i < reps; ++i)
    for (size_t j = 0; j < cfgs.size(); ++j) r[j].push_back(run(cfgs[j].mode, cfgs[j].block));
  for (size_t j = 0; j < cfgs.size(); ++j) {
    auto v = r[j];
    std::sort(v.begin(), v.end());
    printf("%-14s med %.1f min %.1f max %.1f GB/s\n", cfgs[j].name, v[v.size() / 2], v[0],
           v.back());
  }
}
