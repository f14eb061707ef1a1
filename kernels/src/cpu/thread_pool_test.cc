#include "cpu/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <mutex>
#include <thread>
#include <tuple>
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

// Small loops split evenly: 128 items at a grain of 51 are two chunks of 64
// (not 51, 51 and 26, whose longest thread saved little over one thread);
// every chunk holds at least a grain.
TEST(ThreadPool, ChunksAreEvenAndAtLeastTheGrain) {
  ThreadPool pool(2);
  for (auto [n, grain, want] : {std::tuple<int64_t, int64_t, int64_t>{128, 51, 2},
                                {100, 51, 1},
                                {1000, 10, 8},
                                {1001, 100, 8}}) {
    std::mutex mu;
    std::vector<int64_t> sizes;
    pool.ParallelFor(n, grain, [&](int64_t b, int64_t e) {
      std::lock_guard<std::mutex> lock(mu);
      sizes.push_back(e - b);
    });
    std::sort(sizes.begin(), sizes.end());
    ASSERT_EQ(static_cast<int64_t>(sizes.size()), want) << n << " items, grain " << grain;
    // One size, the last chunk (the smallest) perhaps shorter.
    const int64_t chunk = (n + want - 1) / want;
    EXPECT_EQ(sizes[0], n - chunk * (want - 1)) << n;
    for (size_t i = 1; i < sizes.size(); ++i) EXPECT_EQ(sizes[i], chunk) << n;
    EXPECT_GE(chunk, grain) << n;
  }
}

// Sizes near the int64_t limit (the default max_chunk is the largest one)
// cover the range once, without overflowing (UBSan checks this build).
TEST(ThreadPool, HugeGrainsAndChunksDoNotOverflow) {
  ThreadPool pool(2);
  const int64_t kMax = std::numeric_limits<int64_t>::max();
  for (auto [n, grain, max_chunk] : {std::tuple<int64_t, int64_t, int64_t>{1000, kMax, kMax},
                                     {1000, 3, kMax},
                                     {1000, kMax, 7},
                                     {kMax, kMax, kMax}}) {
    std::atomic<int64_t> covered{0}, calls{0};
    pool.ParallelFor(
        n, grain,
        [&](int64_t b, int64_t e) {
          covered += e - b;
          calls++;
        },
        max_chunk);
    EXPECT_EQ(covered.load(), n) << n << " " << grain << " " << max_chunk;
    EXPECT_GE(calls.load(), 1);
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
