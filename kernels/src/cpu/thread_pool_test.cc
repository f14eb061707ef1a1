#include "posenc/thread_pool.h"

#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace posenc {
namespace {

TEST(ThreadPool, CoversEveryIndexOnce) {
  ThreadPool pool(4);
  for (int64_t n : {0, 1, 7, 1000, 12345}) {
    std::vector<std::atomic<int>> hits(n);
    pool.ParallelFor(n, 3, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[i]++;
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << i << " of " << n;
  }
}

TEST(ThreadPool, ChunksRespectGrainAndMaximum) {
  for (int threads : {1, 3}) {
    ThreadPool pool(threads);
    std::atomic<int64_t> largest{0}, calls{0};
    pool.ParallelFor(
        100000, 10,
        [&](int64_t b, int64_t e) {
          calls++;
          int64_t prev = largest.load();
          while (e - b > prev && !largest.compare_exchange_weak(prev, e - b)) {
          }
        },
        1000);
    EXPECT_LE(largest.load(), 1000);
    EXPECT_GE(calls.load(), 100);
  }
}

TEST(ThreadPool, ConcurrentCallersShareThePool) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 8; ++c) {
    callers.emplace_back([&] {
      for (int r = 0; r < 50; ++r) {
        pool.ParallelFor(100, 1, [&](int64_t b, int64_t e) { total += e - b; });
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(total.load(), 8 * 50 * 100);
}

}  // namespace
}  // namespace posenc
