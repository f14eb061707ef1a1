// The in-place calls a server has started, by the id their caller gave them
// (the posenc-call-id metadata), so that a second attempt of one is refused
// instead of computed.
//
// gRPC's retry policy sends a call again when its connection drops before
// the answer's headers arrive. For a call on the socket that is harmless:
// the retry carries the same tensors. A call computed in place in the
// caller's shared memory or device memory is not: the first attempt may
// already have rotated the tensors there, and a second would rotate them
// again and answer OK. The clients give every in-place call an id of its
// own; the server claims it before the call starts and refuses (ABORTED) an
// attempt whose id it has already claimed. Attempts refused before they
// started (a draining server's UNAVAILABLE, an admission refusal) claim
// nothing, so rolling restarts keep their retries.
#ifndef POSENC_SERVER_ENGINE_ATTEMPT_LEDGER_H_
#define POSENC_SERVER_ENGINE_ATTEMPT_LEDGER_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace posenc::server {

class AttemptLedger {
 public:
  struct Options {
    // How long a claimed id is remembered: gRPC's retries of a call come
    // within its backoffs (the clients' at most 5 attempts, 2 s apart at
    // most), well inside this.
    absl::Duration keep = absl::Seconds(60);
    // The most ids remembered (about 32 bytes each: a 64-bit hash and its
    // time, and the hash set's slot; 8 MiB at most); past it the oldest go first,
    // so a retry could then run again: only above capacity / keep in-place
    // calls a second (4369/s with the defaults: far more than a node's
    // shared memory serves at useful sizes).
    size_t capacity = size_t{1} << 18;
  };
  AttemptLedger() : AttemptLedger(Options()) {}
  explicit AttemptLedger(Options options) : options_(options) {}

  // Claims are aged by the monotonic clock: a step of the wall clock (NTP,
  // a VM resumed) must neither forget them early nor keep them forever.
  using Clock = std::chrono::steady_clock;

  // OK the first time `call_id` is claimed, which is then remembered;
  // ABORTED, naming the id, every time after. An empty id claims nothing.
  [[nodiscard]] absl::Status Claim(absl::string_view call_id, Clock::time_point now = Clock::now());

  size_t size() const;

 private:
  void ForgetOld(Clock::time_point now);  // REQUIRES: mu_ held

  const Options options_;
  mutable std::mutex mu_;
  std::deque<std::pair<uint64_t, Clock::time_point>> order_;  // oldest first
  absl::flat_hash_set<uint64_t> claimed_;
};

}  // namespace posenc::server

#endif  // POSENC_SERVER_ENGINE_ATTEMPT_LEDGER_H_
