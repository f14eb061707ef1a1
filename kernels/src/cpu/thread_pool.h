// A fixed pool of worker threads for the CPU backend's data-parallel loops.
// Internal to the kernel library (bench/cpu_bench.cc borrows it for its
// baselines, so they split work as the kernels do).
#ifndef POSENC_KERNELS_CPU_THREAD_POOL_H_
#define POSENC_KERNELS_CPU_THREAD_POOL_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace posenc {

class ThreadPool {
 public:
  // Starts num_threads - 1 workers: the thread calling ParallelFor is the
  // last one. num_threads <= 1 runs everything on the caller.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) over disjoint ranges covering [0, n), each at least
  // `grain` long (but the last) and at most max(grain, max_chunk), all of one
  // length but the last where max_chunk is at least twice the grain, and
  // returns when all have run. Safe to call from several threads at once; the
  // caller takes chunks itself, so a busy pool never leaves a loop waiting on
  // workers that have not started. If fn throws, the remaining chunks still
  // run and the first exception is rethrown here, on the caller's thread.
  void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn,
                   int64_t max_chunk = INT64_MAX);

 private:
  void WorkerLoop();

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
};

}  // namespace posenc

#endif  // POSENC_KERNELS_CPU_THREAD_POOL_H_
