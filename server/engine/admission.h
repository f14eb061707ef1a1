// Admission control: the one place that decides whether the server takes on
// a call and the memory it will hold. A call holds a Ticket from arrival:
// a slot (--max_inflight) until its answer is final, and bytes
// (--max_inflight_bytes), reserved before it reads or allocates anything,
// until the answer has been sent. Because every byte a call will hold is reserved first, the
// memory of calls in flight never exceeds the budget, whatever the mix.
//
// Reservations that do not fit wait in arrival order (a call that has not
// been read holds no memory: its body stays behind HTTP/2 flow control)
// until bytes are released, --admission_wait passes (RESOURCE_EXHAUSTED),
// the call's deadline passes first (DEADLINE_EXCEEDED: the caller ran out
// of time, which logs and metrics must not count as the server's refusal),
// the caller cancels, or the server drains (UNAVAILABLE).
#ifndef POSENC_SERVER_ENGINE_ADMISSION_H_
#define POSENC_SERVER_ENGINE_ADMISSION_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace posenc::server {

struct AdmissionOptions {
  int max_calls = 64;                          // --max_inflight
  int64_t max_bytes = int64_t{4} << 30;        // --max_inflight_bytes
  absl::Duration max_wait = absl::Seconds(1);  // --admission_wait_ms
};

class AdmissionControl {
 public:
  class Ticket;

  explicit AdmissionControl(const AdmissionOptions& options);
  // Ends waiting reservations (UNAVAILABLE). REQUIRES: no Ticket outlives it.
  ~AdmissionControl();
  AdmissionControl(const AdmissionControl&) = delete;
  AdmissionControl& operator=(const AdmissionControl&) = delete;

  // A slot for a new call holding no bytes yet: UNAVAILABLE while draining,
  // RESOURCE_EXHAUSTED when --max_inflight calls are in flight.
  [[nodiscard]] absl::StatusOr<Ticket> Enter();

  // A ticket with no slot and no bytes yet, for memory the server keeps
  // between calls (idle scratch buffers): held, but not work in progress.
  Ticket Holder();

  // Memory the server keeps between calls and can give up (idle scratch
  // buffers, ScratchPool): `reclaim` is run when a reservation would
  // otherwise wait, or a growth or read-ahead be refused, so that such
  // bytes never keep a call out (they would stay idle until a call that
  // was let in asked for a buffer). It moves what it gives up into the
  // ticket it is handed (GiveBytes), which is released once no lock is
  // held, granting the waiters that then fit. Null clears it.
  void SetReclaimer(std::function<void(Ticket* freed)> reclaim);

  // Refuses new calls (UNAVAILABLE) and ends waiting reservations.
  void StartDraining();
  bool draining() const;

  int calls() const;
  int64_t bytes() const;
  int waiting() const;
  const AdmissionOptions& options() const { return options_; }
  // When a call was last let in: a drain waits for admitted work, not for
  // refused arrivals (which would extend it without end).
  absl::Time last_entry() const;

 private:
  struct Waiter {
    Ticket* ticket;
    int64_t bytes;
    absl::Time deadline;       // the earlier of the two below
    absl::Time call_deadline;  // the caller's
    std::function<void(absl::Status)> done;
  };
  void Release(int64_t bytes, bool slot);
  // Runs the reclaimer, if any. REQUIRES: mu_ not held.
  void Reclaim();
  // Grants waiters that fit, in order, and expires those past deadline;
  // returns the callbacks to run (outside the lock) with their statuses.
  std::vector<std::pair<std::function<void(absl::Status)>, absl::Status>> ServiceQueueLocked(
      absl::Time now);
  void TimerLoop();

  const AdmissionOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int calls_ = 0;
  int64_t bytes_ = 0;
  bool draining_ = false;
  bool stopping_ = false;
  absl::Time last_entry_ = absl::InfinitePast();
  std::deque<Waiter> waiters_;
  // Before mu_ (and the reclaimer's own locks) in lock order; held while
  // the reclaimer runs, so that clearing it waits for a run to end.
  std::mutex reclaim_mu_;
  std::function<void(Ticket*)> reclaim_;
  std::thread timer_;
};

// A call's claim: one slot and the bytes it holds. Released when destroyed.
class AdmissionControl::Ticket {
 public:
  Ticket() = default;
  Ticket(Ticket&& o) noexcept
      : control_(o.control_),
        bytes_(o.bytes_),
        slot_(o.slot_),
        cancelled_(std::exchange(o.cancelled_, std::nullopt)) {
    o.control_ = nullptr;
  }
  Ticket& operator=(Ticket&& o) noexcept;
  ~Ticket() { Reset(); }

  // Holds `bytes` more now, or RESOURCE_EXHAUSTED (holding nothing more)
  // when that would leave less than `keep_free` of the budget. Never waits.
  [[nodiscard]] absl::Status TryGrow(int64_t bytes, int64_t keep_free = 0);
  // Holds `bytes` more now if they fit and no reservation is waiting (a
  // call reading ahead must not overtake calls queued for memory); returns
  // whether it did. Never waits.
  [[nodiscard]] bool TryReserve(int64_t bytes);
  // Holds `bytes` more as soon as they fit (see the file comment); `done`
  // runs exactly once, perhaps on this thread before Reserve returns,
  // perhaps on another. At most one Reserve may wait per ticket.
  void Reserve(int64_t bytes, absl::Time deadline, std::function<void(absl::Status)> done);
  // Ends a waiting Reserve with `why` (e.g. CANCELLED), or, when none waits,
  // has every later Reserve on this ticket end with it at once: a caller
  // that leaves between a reactor choosing to reserve and its Reserve call
  // must not leave that reservation waiting out --admission_wait (holding
  // its slot meanwhile). The ticket is not moved while CancelWait may run.
  void CancelWait(const absl::Status& why);
  // Returns bytes to the budget (at most what it holds).
  void Shrink(int64_t bytes);
  // Holds exactly `bytes`: shrinks, or grows without waiting.
  [[nodiscard]] absl::Status Resize(int64_t bytes);
  // Releases the slot and the bytes.
  void Reset();
  // Gives the slot back and keeps the bytes: for a call whose answer is
  // final and handed to gRPC to send. The bytes stay until the call object
  // goes (gRPC's OnDone), because the answer's buffers live until then; the
  // slot does not, because OnDone runs on gRPC's own threads and under CPU
  // pressure lags the caller's receipt of the answer by tens of
  // milliseconds, so a caller at concurrency 2 could be told "64 requests
  // in flight". Slots bound the work in progress, bytes the memory.
  void ReleaseSlot();

  // A ticket for more of this call's bytes that holds no slot of its own
  // (one stream message of several in flight). REQUIRES: valid(); it is
  // reset before this ticket is.
  [[nodiscard]] Ticket BytesOnly() const;
  // Moves `bytes` this ticket holds to `to` (same control) without
  // releasing them to the budget, so no waiting call can take them between.
  void GiveBytes(int64_t bytes, Ticket* to);

  int64_t bytes() const { return bytes_; }
  bool valid() const { return control_ != nullptr; }

 private:
  friend class AdmissionControl;
  // TryGrow and TryReserve without the reclaimer.
  [[nodiscard]] absl::Status TryGrowOnce(int64_t bytes, int64_t keep_free);
  [[nodiscard]] bool TryReserveOnce(int64_t bytes);
  Ticket(AdmissionControl* control, bool slot) : control_(control), slot_(slot) {}
  AdmissionControl* control_ = nullptr;
  int64_t bytes_ = 0;
  bool slot_ = true;
  std::optional<absl::Status> cancelled_;  // under control_->mu_: CancelWait came first
};

}  // namespace posenc::server

#endif  // POSENC_SERVER_ENGINE_ADMISSION_H_
