// A before_write for the tests of the through operations (posenc/backend.h)
// that fails its n-th ask, and counts what was asked after it.
//
// Which asks may follow the error is partly a matter of timing. The thread
// that got the error may ask nothing more: it sets the call's stop before
// it can ask again, whatever the scheduler does. Another thread may ask
// while the failing one is between its check's return and that stop, and a
// thread descheduled there can stay there for milliseconds, during which
// the other goes on block after block. So each ask another thread makes
// after the error waits `late_ask_delay` before it returns: a thread that
// goes on advances at most one block a delay, and a test's bound on those
// asks fails only where the failing thread stalled for that many delays
// (a stop that never comes makes every remaining block late).
#ifndef POSENC_TESTS_FAILING_CHECK_H_
#define POSENC_TESTS_FAILING_CHECK_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/status/status.h"

namespace posenc::testing {

class FailingCheck {
 public:
  FailingCheck(int fail_at, absl::Status error,
               std::chrono::milliseconds late_ask_delay = std::chrono::milliseconds(5))
      : fail_at_(fail_at), error_(std::move(error)), late_ask_delay_(late_ask_delay) {}

  // The before_write to give the backend; *this outlives the call.
  std::function<absl::Status()> Ask() {
    return [this]() -> absl::Status {
      const int n = ++asked_;
      if (n < fail_at_) return absl::OkStatus();
      std::unique_lock<std::mutex> lock(mu_);
      if (n == fail_at_) {
        failing_thread_ = std::this_thread::get_id();
        named_.notify_all();
        return error_;
      }
      // After the failing ask began: wait until it has named its thread.
      named_.wait(lock, [this] { return failing_thread_ != std::thread::id(); });
      const bool failing = failing_thread_ == std::this_thread::get_id();
      lock.unlock();
      if (failing) {
        ++failing_thread_asks_after_;
      } else {
        ++other_asks_after_;
        std::this_thread::sleep_for(late_ask_delay_);
      }
      return absl::OkStatus();
    };
  }

  // Asks from the thread that got the error, after it: none may come.
  int failing_thread_asks_after() const { return failing_thread_asks_after_.load(); }
  // Asks from other threads after the error: one a thread at most unless
  // the failing thread stalled (see above).
  int other_asks_after() const { return other_asks_after_.load(); }

 private:
  const int fail_at_;
  const absl::Status error_;
  const std::chrono::milliseconds late_ask_delay_;
  std::atomic<int> asked_{0};
  std::atomic<int> failing_thread_asks_after_{0};
  std::atomic<int> other_asks_after_{0};
  std::mutex mu_;
  std::condition_variable named_;
  std::thread::id failing_thread_;  // none (the default id) until the failing ask
};

}  // namespace posenc::testing

#endif  // POSENC_TESTS_FAILING_CHECK_H_
