// Reloads of a directory (learned tables, KServe models) one at a time,
// with at most one more waiting to start. A reload asked for while one runs
// waits and starts after it, so it sees the files as they are then. One
// asked for while another already waits is refused: the waiting one will
// see everything it would. So a flood of reload calls holds at most two of
// the executor's threads, where each used to hold one while it waited.
#ifndef POSENC_SERVER_ENGINE_RELOAD_GATE_H_
#define POSENC_SERVER_ENGINE_RELOAD_GATE_H_

#include <condition_variable>
#include <functional>
#include <mutex>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace posenc::server {

class ReloadGate {
 public:
  explicit ReloadGate(absl::string_view what) : what_(what) {}

  // Runs `reload` once no other runs: OK when it ran; RESOURCE_EXHAUSTED
  // when one runs and another already waits; CANCELLED when `cancelled`
  // (may be empty; polled while waiting, never under the gate's lock)
  // returned true first.
  [[nodiscard]] absl::Status Run(const std::function<bool()>& cancelled,
                                 const std::function<void()>& reload);

  // Whether a reload waits to start (for tests and the curious).
  bool waiting() const {
    std::lock_guard<std::mutex> lock(mu_);
    return waiting_;
  }

 private:
  const absl::string_view what_;  // "table reload", in messages
  // A flag and a condition variable rather than a timed mutex: waiting must
  // poll `cancelled`, and TSan does not see pthread_mutex_clocklock, which
  // timed_mutex::try_lock_for uses.
  mutable std::mutex mu_;
  std::condition_variable done_;
  bool running_ = false;  // guarded by mu_
  bool waiting_ = false;  // guarded by mu_
};

}  // namespace posenc::server

#endif  // POSENC_SERVER_ENGINE_RELOAD_GATE_H_
