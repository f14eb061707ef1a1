// Asynchronous gRPC calls of one Client that gRPC still holds (internal to
// the client library).
//
// A call's result is set inside its callback, but gRPC destroys the
// callback (and with it the call's ClientContext) on its own thread
// afterwards: a caller that got its result and then destroyed the client
// raced that clean-up (an assertion "prior > 0" in gRPC's reference
// counting at shutdown, seen once in about 40 runs of
// EndToEnd.AsyncCallsAndStreamKeepOrderAndReportErrorsPerMessage). Each
// call's state holds a Token, declared before its ClientContext so that it
// is released after it; ~Client waits for the count to reach zero before
// the channel goes.
#ifndef POSENC_CLIENT_SRC_PENDING_CALLS_H_
#define POSENC_CLIENT_SRC_PENDING_CALLS_H_

#include <condition_variable>
#include <memory>
#include <mutex>

namespace posenc::client_internal {

class PendingCalls {
 public:
  class Token {
   public:
    explicit Token(std::shared_ptr<PendingCalls> p) : p_(std::move(p)) {
      std::lock_guard<std::mutex> l(p_->mu_);
      ++p_->count_;
    }
    ~Token() {
      std::lock_guard<std::mutex> l(p_->mu_);
      if (--p_->count_ == 0) p_->none_.notify_all();
    }
    Token(const Token&) = delete;
    Token& operator=(const Token&) = delete;

   private:
    std::shared_ptr<PendingCalls> p_;
  };

  void WaitForNone() {
    std::unique_lock<std::mutex> l(mu_);
    none_.wait(l, [this] { return count_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable none_;
  int count_ = 0;
};

}  // namespace posenc::client_internal

#endif  // POSENC_CLIENT_SRC_PENDING_CALLS_H_
