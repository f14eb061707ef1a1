#include "engine/attempt_ledger.h"

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "engine/utf8.h"

namespace posenc::server {

absl::Status AttemptLedger::Claim(absl::string_view call_id, Clock::time_point now) {
  if (call_id.empty()) return absl::OkStatus();
  // A hash, not the id: 16 bytes an entry whatever the caller sends. Two of
  // a quarter million remembered 64-bit hashes collide with odds of about
  // 2^-29, and a collision refuses a call (never runs one twice).
  const uint64_t key = absl::HashOf(call_id);
  std::lock_guard<std::mutex> lock(mu_);
  ForgetOld(now);
  if (!claimed_.insert(key).second) {
    return absl::AbortedError(absl::StrCat(
        "call ", Utf8Prefix(call_id, 64),
        " (posenc-call-id) already started on this server: this attempt is a retry of an "
        "in-place call whose answer was lost, and the first may already have computed on the "
        "tensors in shared or device memory, so it is not run again (their contents are "
        "unknown: restore them and call again)"));
  }
  order_.emplace_back(key, now);
  if (order_.size() > options_.capacity) {
    claimed_.erase(order_.front().first);
    order_.pop_front();
  }
  return absl::OkStatus();
}

void AttemptLedger::ForgetOld(Clock::time_point now) {
  while (!order_.empty() && absl::FromChrono(now - order_.front().second) > options_.keep) {
    claimed_.erase(order_.front().first);
    order_.pop_front();
  }
}

size_t AttemptLedger::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return order_.size();
}

}  // namespace posenc::server
