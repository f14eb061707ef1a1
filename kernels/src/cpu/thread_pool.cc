#include "cpu/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <memory>

namespace posenc {

ThreadPool::ThreadPool(int num_threads) {
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::WorkerLoop() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopping and drained
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t)>& fn, int64_t max_chunk) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t largest = std::max(grain, std::max<int64_t>(1, max_chunk));
  // a / b rounded up, without the overflow of (a + b - 1) / b when b is
  // large (max_chunk defaults to the largest int64_t). a >= 0, b > 0.
  auto ceil_div = [](int64_t a, int64_t b) { return a / b + (a % b != 0 ? 1 : 0); };
  int64_t chunk;
  if (largest / 2 < grain) {
    chunk = grain;  // no room to balance between the two bounds
  } else {
    // Chunks of one size (the last may be shorter), each at least `grain`:
    // as many as n holds grains, up to four per thread (a few per thread
    // balance uneven work), and more where `largest` needs them. Equal
    // sizes matter for small loops: 128 RoPE tokens at a grain of 51 made
    // chunks of 51, 51 and 26, and 2 threads ran no faster than one.
    const int64_t max_chunks = static_cast<int64_t>(num_threads()) * 4;
    int64_t chunks = std::clamp<int64_t>(n / grain, 1, max_chunks);
    chunks = std::max(chunks, ceil_div(n, largest));
    chunk = ceil_div(n, chunks);
  }
  const int64_t num_chunks = ceil_div(n, chunk);
  if (num_chunks == 1) {
    fn(0, n);
    return;
  }

  // Shared by the caller and the helpers; helpers that start late find no
  // chunk left and return at once.
  struct Loop {
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
    std::mutex mu;
    std::condition_variable cv;
    std::exception_ptr error;  // the first exception a chunk threw
  };
  auto loop = std::make_shared<Loop>();
  auto run_chunks = [loop, n, chunk, num_chunks, &fn] {
    for (;;) {
      const int64_t c = loop->next.fetch_add(1);
      if (c >= num_chunks) return;
      const int64_t begin = c * chunk;
      // An exception must not escape a worker (std::terminate) nor leave the
      // caller waiting for a chunk that never finishes: it is kept and
      // rethrown on the calling thread once every chunk is accounted for.
      try {
        fn(begin, begin + std::min(chunk, n - begin));
      } catch (...) {
        std::lock_guard<std::mutex> lock(loop->mu);
        if (!loop->error) loop->error = std::current_exception();
      }
      if (loop->done.fetch_add(1) + 1 == num_chunks) {
        std::lock_guard<std::mutex> lock(loop->mu);
        loop->cv.notify_all();
      }
    }
  };
  const int64_t helpers = std::min<int64_t>(workers_.size(), num_chunks - 1);
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int64_t i = 0; i < helpers; ++i) tasks_.emplace_back(run_chunks);
  }
  if (helpers == 1) {
    cv_.notify_one();
  } else {
    cv_.notify_all();
  }
  run_chunks();
  std::unique_lock<std::mutex> lock(loop->mu);
  loop->cv.wait(lock, [&] { return loop->done.load() == num_chunks; });
  if (loop->error) std::rethrow_exception(loop->error);
}

}  // namespace posenc
