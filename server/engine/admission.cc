#include "engine/admission.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace posenc::server {

AdmissionControl::AdmissionControl(const AdmissionOptions& options)
    : options_(options), timer_([this] { TimerLoop(); }) {}

AdmissionControl::~AdmissionControl() {
  StartDraining();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  timer_.join();
}

absl::StatusOr<AdmissionControl::Ticket> AdmissionControl::Enter() {
  std::lock_guard<std::mutex> lock(mu_);
  if (draining_) return absl::UnavailableError("server is draining; retry on another replica");
  if (calls_ >= options_.max_calls) {
    return absl::ResourceExhaustedError(
        absl::StrCat("server is saturated: ", options_.max_calls,
                     " requests in flight (--max_inflight); retry with backoff"));
  }
  ++calls_;
  last_entry_ = absl::Now();
  return Ticket(this, /*slot=*/true);
}

void AdmissionControl::StartDraining() {
  std::vector<std::pair<std::function<void(absl::Status)>, absl::Status>> ready;
  {
    std::lock_guard<std::mutex> lock(mu_);
    draining_ = true;
    for (Waiter& w : waiters_) {
      ready.emplace_back(std::move(w.done),
                         absl::UnavailableError("server is draining; retry on another replica"));
    }
    waiters_.clear();
  }
  for (auto& [done, status] : ready) done(status);
}

void AdmissionControl::SetReclaimer(std::function<void(Ticket*)> reclaim) {
  std::lock_guard<std::mutex> lock(reclaim_mu_);
  reclaim_ = std::move(reclaim);
}

void AdmissionControl::Reclaim() {
  Ticket freed = Holder();
  {
    std::lock_guard<std::mutex> lock(reclaim_mu_);
    if (reclaim_) reclaim_(&freed);
  }
  freed.Reset();  // with no lock held: the grants' callbacks may run here
}

bool AdmissionControl::draining() const {
  std::lock_guard<std::mutex> lock(mu_);
  return draining_;
}
int AdmissionControl::calls() const {
  std::lock_guard<std::mutex> lock(mu_);
  return calls_;
}
int64_t AdmissionControl::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}
int AdmissionControl::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(waiters_.size());
}
absl::Time AdmissionControl::last_entry() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_entry_;
}

void AdmissionControl::Release(int64_t bytes, bool slot) {
  std::vector<std::pair<std::function<void(absl::Status)>, absl::Status>> ready;
  {
    std::lock_guard<std::mutex> lock(mu_);
    bytes_ -= bytes;
    if (slot) --calls_;
    ready = ServiceQueueLocked(absl::Now());
  }
  for (auto& [done, status] : ready) done(status);
}

std::vector<std::pair<std::function<void(absl::Status)>, absl::Status>>
AdmissionControl::ServiceQueueLocked(absl::Time now) {
  std::vector<std::pair<std::function<void(absl::Status)>, absl::Status>> ready;
  // First come, first served: a large reservation at the head is not
  // starved by smaller ones behind it.
  while (!waiters_.empty() && bytes_ + waiters_.front().bytes <= options_.max_bytes) {
    Waiter w = std::move(waiters_.front());
    waiters_.pop_front();
    bytes_ += w.bytes;
    w.ticket->bytes_ += w.bytes;
    ready.emplace_back(std::move(w.done), absl::OkStatus());
  }
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (it->deadline <= now) {
      ready.emplace_back(
          std::move(it->done),
          // Labelled by the limit that applied, however late the timer ran.
          it->call_deadline <= it->deadline
              ? absl::DeadlineExceededError(absl::StrCat(
                    "the call's deadline passed while it waited for ", it->bytes, " bytes (",
                    bytes_, " of ", options_.max_bytes, " in flight, --max_inflight_bytes)"))
              : absl::ResourceExhaustedError(absl::StrCat(
                    "server is saturated: waited ", absl::FormatDuration(options_.max_wait),
                    " for ", it->bytes, " bytes while ", bytes_, " of ", options_.max_bytes,
                    " are in flight (--max_inflight_bytes); retry with backoff")));
      it = waiters_.erase(it);
    } else {
      ++it;
    }
  }
  return ready;
}

void AdmissionControl::TimerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    absl::Time next = absl::InfiniteFuture();
    for (const Waiter& w : waiters_) next = std::min(next, w.deadline);
    if (next == absl::InfiniteFuture()) {
      cv_.wait(lock);
    } else {
      cv_.wait_until(lock, absl::ToChronoTime(next));
    }
    auto ready = ServiceQueueLocked(absl::Now());
    if (ready.empty()) continue;
    lock.unlock();
    for (auto& [done, status] : ready) done(status);
    lock.lock();
  }
}

AdmissionControl::Ticket& AdmissionControl::Ticket::operator=(Ticket&& o) noexcept {
  if (this != &o) {
    Reset();
    control_ = o.control_;
    bytes_ = o.bytes_;
    slot_ = o.slot_;
    cancelled_ = std::exchange(o.cancelled_, std::nullopt);
    o.control_ = nullptr;
  }
  return *this;
}

absl::Status AdmissionControl::Ticket::TryGrow(int64_t bytes, int64_t keep_free) {
  if (absl::Status s = TryGrowOnce(bytes, keep_free); !s.ok()) {
    control_->Reclaim();  // idle memory gives way first
    return TryGrowOnce(bytes, keep_free);
  }
  return absl::OkStatus();
}

absl::Status AdmissionControl::Ticket::TryGrowOnce(int64_t bytes, int64_t keep_free) {
  if (bytes <= 0) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(control_->mu_);
  const int64_t limit = control_->options_.max_bytes - std::max<int64_t>(keep_free, 0);
  // Waiting reservations are not considered: a call growing here is already
  // running (ahead of every waiter), and refusing it would waste its work.
  if (bytes > limit - control_->bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "server is saturated: this request needs ", bytes, " more bytes while ", control_->bytes_,
        " of ", limit, " are in flight (--max_inflight_bytes); retry with backoff"));
  }
  control_->bytes_ += bytes;
  bytes_ += bytes;
  return absl::OkStatus();
}

bool AdmissionControl::Ticket::TryReserve(int64_t bytes) {
  if (TryReserveOnce(bytes)) return true;
  control_->Reclaim();
  return TryReserveOnce(bytes);
}

bool AdmissionControl::Ticket::TryReserveOnce(int64_t bytes) {
  if (bytes <= 0) return true;
  std::lock_guard<std::mutex> lock(control_->mu_);
  if (control_->draining_ || !control_->waiters_.empty() ||
      bytes > control_->options_.max_bytes - control_->bytes_) {
    return false;
  }
  control_->bytes_ += bytes;
  bytes_ += bytes;
  return true;
}

AdmissionControl::Ticket AdmissionControl::Holder() { return Ticket(this, /*slot=*/false); }

AdmissionControl::Ticket AdmissionControl::Ticket::BytesOnly() const {
  return Ticket(control_, /*slot=*/false);
}

void AdmissionControl::Ticket::GiveBytes(int64_t bytes, Ticket* to) {
  // Under the control's lock: a grant to either ticket writes its count there.
  std::lock_guard<std::mutex> lock(control_->mu_);
  bytes = std::min(bytes, bytes_);
  if (bytes <= 0) return;
  bytes_ -= bytes;
  to->bytes_ += bytes;
}

void AdmissionControl::Ticket::Reserve(int64_t bytes, absl::Time deadline,
                                       std::function<void(absl::Status)> done) {
  absl::Status refused;
  bool queued = false;
  {
    std::lock_guard<std::mutex> lock(control_->mu_);
    const AdmissionOptions& o = control_->options_;
    if (cancelled_) {
      refused = *cancelled_;
    } else if (control_->draining_) {
      refused = absl::UnavailableError("server is draining; retry on another replica");
    } else if (bytes > o.max_bytes) {
      refused = absl::ResourceExhaustedError(
          absl::StrCat("this call needs ", bytes, " bytes, over the server's whole budget of ",
                       o.max_bytes, " (--max_inflight_bytes)"));
    } else if (control_->waiters_.empty() && control_->bytes_ + bytes <= o.max_bytes) {
      control_->bytes_ += bytes;
      bytes_ += bytes;
    } else {
      control_->waiters_.push_back(Waiter{this, bytes, std::min(deadline, absl::Now() + o.max_wait),
                                          deadline, std::move(done)});
      control_->cv_.notify_all();  // the timer learns the new deadline
      queued = true;
    }
  }
  if (queued) {
    // Idle memory given back grants this waiter (and any before it) now.
    control_->Reclaim();
    return;
  }
  done(refused);
}

void AdmissionControl::Ticket::CancelWait(const absl::Status& why) {
  std::function<void(absl::Status)> done;
  {
    std::lock_guard<std::mutex> lock(control_->mu_);
    for (auto it = control_->waiters_.begin(); it != control_->waiters_.end(); ++it) {
      if (it->ticket == this) {
        done = std::move(it->done);
        control_->waiters_.erase(it);
        break;
      }
    }
    if (!done) cancelled_ = why;
  }
  if (done) done(why);
}

void AdmissionControl::Ticket::Shrink(int64_t bytes) {
  bytes = std::min(bytes, bytes_);
  if (bytes <= 0) return;
  bytes_ -= bytes;
  control_->Release(bytes, /*slot=*/false);
}

absl::Status AdmissionControl::Ticket::Resize(int64_t bytes) {
  if (bytes < bytes_) {
    Shrink(bytes_ - bytes);
    return absl::OkStatus();
  }
  return TryGrow(bytes - bytes_);
}

void AdmissionControl::Ticket::ReleaseSlot() {
  if (control_ == nullptr || !slot_) return;
  slot_ = false;
  control_->Release(0, /*slot=*/true);
}

void AdmissionControl::Ticket::Reset() {
  if (control_ == nullptr) return;
  AdmissionControl* c = control_;
  control_ = nullptr;
  c->Release(bytes_, slot_);
  bytes_ = 0;
}

}  // namespace posenc::server
