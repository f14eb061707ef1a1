#include "engine/reload_gate.h"

#include <chrono>

#include "absl/strings/str_cat.h"

namespace posenc::server {
namespace {

// How often a waiting reload asks `cancelled`.
constexpr std::chrono::milliseconds kPoll{20};

}  // namespace

absl::Status ReloadGate::Run(const std::function<bool()>& cancelled,
                             const std::function<void()>& reload) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (running_ && waiting_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("a ", what_,
                       " is running and another is waiting to start after it, which will see "
                       "the files as they are then; retry once it has answered"));
    }
    if (running_) {
      waiting_ = true;
      while (running_) {
        if (cancelled) {
          lock.unlock();  // the predicate is the caller's code: never run it under our lock
          const bool stop = cancelled();
          lock.lock();
          if (stop) {
            waiting_ = false;
            return absl::CancelledError(absl::StrCat("the ", what_, " was cancelled"));
          }
          if (!running_) break;
        }
        done_.wait_for(lock, kPoll);
      }
      waiting_ = false;
    }
    running_ = true;
  }
  struct Done {
    ReloadGate* gate;
    ~Done() {
      {
        std::lock_guard<std::mutex> lock(gate->mu_);
        gate->running_ = false;
      }
      gate->done_.notify_all();
    }
  } done{this};
  reload();
  return absl::OkStatus();
}

}  // namespace posenc::server
