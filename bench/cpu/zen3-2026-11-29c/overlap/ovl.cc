// Does this host overlap compute with streaming memory? In-place pass over a
// buffer: each 32-byte vector gets K rounds of 4 independent FMA chains'
// worth of work, then is stored. Two threads, each its half. DRAM: 64 MiB
// each; L2: 128 KiB each, repeated. Prints GB/s moved (read + write).
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

template <int K>
__attribute__((target("avx2,fma"), noinline)) void Pass(float* p, size_t n, int ahead) {
  const __m256 a = _mm256_set1_ps(1.0000001f), b = _mm256_set1_ps(1e-7f);
  for (size_t i = 0; i < n; i += 32) {
    if (ahead) __builtin_prefetch(p + i + ahead, 1, 3);
    __m256 v0 = _mm256_load_ps(p + i), v1 = _mm256_load_ps(p + i + 8);
    __m256 v2 = _mm256_load_ps(p + i + 16), v3 = _mm256_load_ps(p + i + 24);
    for (int k = 0; k < K; ++k) {
      v0 = _mm256_fmadd_ps(v0, a, b);
      v1 = _mm256_fmadd_ps(v1, a, b);
      v2 = _mm256_fmadd_ps(v2, a, b);
      v3 = _mm256_fmadd_ps(v3, a, b);
    }
    _mm256_store_ps(p + i, v0);
    _mm256_store_ps(p + i + 8, v1);
    _mm256_store_ps(p + i + 16, v2);
    _mm256_store_ps(p + i + 24, v3);
  }
}

template <int K>
double Rate(size_t floats_per_thread, int reps, int ahead) {
  std::vector<float*> bufs;
  for (int t = 0; t < 2; ++t) {
    float* p = static_cast<float*>(std::aligned_alloc(64, floats_per_thread * 4));
    for (size_t i = 0; i < floats_per_thread; ++i) p[i] = 1.0f;
    bufs.push_back(p);
  }
  std::vector<double> rates;
  for (int r = 0; r < 9; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    std::thread th([&] {
      for (int k = 0; k < reps; ++k) Pass<K>(bufs[1], floats_per_thread, ahead);
    });
    for (int k = 0; k < reps; ++k) Pass<K>(bufs[0], floats_per_thread, ahead);
    th.join();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rates.push_back(2.0 * 2 * floats_per_thread * 4.0 * reps / s / 1e9);
  }
  std::sort(rates.begin(), rates.end());
  for (float* p : bufs) std::free(p);
  return rates[4];
}

template <int K>
void Row(int ahead) {
  const double dram = Rate<K>(size_t{16} << 20, 1, ahead);  // 64 MiB a thread
  const double l2 = Rate<K>(size_t{32} << 10, 400, ahead);  // 128 KiB a thread
  std::printf("K=%2d ahead=%4d  DRAM %6.1f  L2 %6.1f\n", K, ahead, dram, l2);
}

int main() {
  for (int ahead : {0, 1024}) {
    Row<0>(ahead);
    Row<1>(ahead);
    Row<2>(ahead);
    Row<4>(ahead);
    Row<8>(ahead);
    Row<16>(ahead);
  }
}
