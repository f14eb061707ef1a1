#include "engine/admission.h"

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace posenc::server {
namespace {

// A one-shot event on std primitives, which ThreadSanitizer understands
// (Debian's abseil is not instrumented, so absl::Notification would look
// like no synchronisation at all).
class Event {
 public:
  void Notify() {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    cv_.notify_all();
  }
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
  }
  bool WaitFor(absl::Duration d) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, absl::ToChronoSeconds(d), [&] { return done_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
};

using Ticket = AdmissionControl::Ticket;

AdmissionOptions Options(int calls, int64_t bytes, absl::Duration wait = absl::Seconds(5)) {
  return AdmissionOptions{calls, bytes, wait};
}

// A call whose answer is final gives its slot back at once and its bytes
// when it is destroyed: the next caller gets a slot, not the bytes.
TEST(Admission, ReleaseSlotKeepsTheBytesUntilReset) {
  AdmissionControl a(Options(1, 100));
  auto t1 = a.Enter();
  ASSERT_TRUE(t1.ok());
  ASSERT_TRUE(t1->TryGrow(70).ok());
  EXPECT_EQ(a.Enter().status().code(), absl::StatusCode::kResourceExhausted);
  t1->ReleaseSlot();
  t1->ReleaseSlot();  // once only: a second call must not free another's slot
  EXPECT_EQ(a.calls(), 0);
  EXPECT_EQ(a.bytes(), 70);
  auto t2 = a.Enter();
  ASSERT_TRUE(t2.ok());
  EXPECT_EQ(a.calls(), 1);
  EXPECT_EQ(t2->TryGrow(31).code(), absl::StatusCode::kResourceExhausted);
  Ticket moved = std::move(*t1);  // the slot-less state travels with the ticket
  moved.Reset();
  EXPECT_EQ(a.calls(), 1) << "Reset after ReleaseSlot freed a slot twice";
  EXPECT_EQ(a.bytes(), 0);
  EXPECT_TRUE(t2->TryGrow(100).ok());
}

TEST(Admission, SlotsAndBytesAreBoundedAndReturned) {
  AdmissionControl a(Options(2, 100));
  auto t1 = a.Enter();
  auto t2 = a.Enter();
  ASSERT_TRUE(t1.ok() && t2.ok());
  EXPECT_EQ(a.Enter().status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(t1->TryGrow(60).ok());
  EXPECT_EQ(t2->TryGrow(41).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(t2->bytes(), 0);
  EXPECT_TRUE(t2->TryGrow(40).ok());
  EXPECT_EQ(a.bytes(), 100);
  t1->Reset();
  EXPECT_EQ(a.bytes(), 40);
  EXPECT_EQ(a.calls(), 1);
  EXPECT_TRUE(t2->Resize(10).ok());
  EXPECT_EQ(a.bytes(), 10);
}

TEST(Admission, WaitersAreGrantedInOrderWhenBytesReturn) {
  AdmissionControl a(Options(8, 100));
  auto holder = a.Enter();
  ASSERT_TRUE(holder->TryGrow(90).ok());
  std::vector<int> order;
  std::mutex mu;
  std::vector<Ticket> waiters;
  for (int i = 0; i < 3; ++i) waiters.push_back(*a.Enter());
  for (int i = 0; i < 3; ++i) {
    waiters[i].Reserve(40, absl::InfiniteFuture(), [&, i](absl::Status s) {
      ASSERT_TRUE(s.ok()) << s;
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(i);
    });
  }
  // A small reservation behind them waits its turn even though it would fit.
  auto late = a.Enter();
  bool late_granted = false;
  late->Reserve(5, absl::InfiniteFuture(), [&](absl::Status s) { late_granted = s.ok(); });
  EXPECT_FALSE(late_granted);
  EXPECT_EQ(a.waiting(), 4);
  holder->Reset();  // 100 free: the first two fit (80), the third waits
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(order, (std::vector<int>{0, 1}));
  }
  waiters[0].Reset();
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(order, (std::vector<int>{0, 1, 2}));
  }
  EXPECT_TRUE(late_granted);
  EXPECT_EQ(a.waiting(), 0);
}

TEST(Admission, WaitEndsAtAdmissionWaitWithResourceExhausted) {
  AdmissionControl a(Options(4, 100, absl::Milliseconds(50)));
  auto holder = a.Enter();
  ASSERT_TRUE(holder->TryGrow(100).ok());
  auto t = a.Enter();
  Event done;
  absl::Status result;
  const absl::Time start = absl::Now();
  t->Reserve(10, absl::InfiniteFuture(), [&](absl::Status s) {
    result = s;
    done.Notify();
  });
  ASSERT_TRUE(done.WaitFor(absl::Seconds(5)));
  EXPECT_EQ(result.code(), absl::StatusCode::kResourceExhausted) << result;
  EXPECT_NE(result.message().find("--max_inflight_bytes"), absl::string_view::npos);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(45));
  EXPECT_EQ(t->bytes(), 0);
}

// The call's own deadline passing first is the caller's lack of time, not
// the server's refusal.
TEST(Admission, WaitEndsAtTheCallsDeadlineWithDeadlineExceeded) {
  AdmissionControl a(Options(4, 100, absl::Seconds(30)));
  auto holder = a.Enter();
  ASSERT_TRUE(holder->TryGrow(100).ok());
  auto t = a.Enter();
  Event done;
  absl::Status result;
  const absl::Time start = absl::Now();
  t->Reserve(10, start + absl::Milliseconds(50), [&](absl::Status s) {
    result = s;
    done.Notify();
  });
  ASSERT_TRUE(done.WaitFor(absl::Seconds(10)));
  EXPECT_EQ(result.code(), absl::StatusCode::kDeadlineExceeded) << result;
  EXPECT_NE(result.message().find("10 bytes"), absl::string_view::npos) << result;
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(45));
  EXPECT_EQ(t->bytes(), 0);
  EXPECT_EQ(a.waiting(), 0);
}

// A cancellation that comes before the Reserve it was meant for (a reactor
// chose to reserve, then gRPC cancelled the call before it did) ends that
// Reserve at once instead of leaving it to wait out --admission_wait.
TEST(Admission, CancelBeforeReserveEndsItAtOnce) {
  AdmissionControl a(Options(4, 100, absl::Seconds(30)));
  auto holder = a.Enter();
  ASSERT_TRUE(holder->TryGrow(100).ok());
  auto t = a.Enter();
  t->CancelWait(absl::CancelledError("gone"));
  Ticket moved = std::move(*t);  // the cancellation goes with the ticket
  int calls = 0;
  absl::Status result;
  moved.Reserve(10, absl::InfiniteFuture(), [&](absl::Status s) {
    ++calls;
    result = s;
  });
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(result.code(), absl::StatusCode::kCancelled) << result;
  EXPECT_EQ(a.waiting(), 0);
  EXPECT_EQ(moved.bytes(), 0);
  // Bytes free now are not taken either.
  holder->Reset();
  moved.Reserve(10, absl::InfiniteFuture(), [&](absl::Status s) {
    ++calls;
    result = s;
  });
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(result.code(), absl::StatusCode::kCancelled) << result;
  EXPECT_EQ(a.bytes(), 0);
}

TEST(Admission, DrainEndsWaitersAndRefusesNewCalls) {
  AdmissionControl a(Options(4, 100));
  auto holder = a.Enter();
  ASSERT_TRUE(holder->TryGrow(100).ok());
  auto t = a.Enter();
  absl::Status result;
  t->Reserve(10, absl::InfiniteFuture(), [&](absl::Status s) { result = s; });
  a.StartDraining();
  EXPECT_EQ(result.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(a.Enter().status().code(), absl::StatusCode::kUnavailable);
}

TEST(Admission, CancelEndsAWaitOnceAndNeverTwice) {
  AdmissionControl a(Options(4, 100));
  auto holder = a.Enter();
  ASSERT_TRUE(holder->TryGrow(100).ok());
  auto t = a.Enter();
  int calls = 0;
  absl::Status result;
  t->Reserve(10, absl::InfiniteFuture(), [&](absl::Status s) {
    ++calls;
    result = s;
  });
  t->CancelWait(absl::CancelledError("gone"));
  t->CancelWait(absl::CancelledError("gone again"));
  holder->Reset();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(result.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(a.bytes(), 0);
}

TEST(Admission, ARequestLargerThanTheBudgetIsRefusedAtOnce) {
  AdmissionControl a(Options(4, 100));
  auto t = a.Enter();
  absl::Status result;
  t->Reserve(101, absl::InfiniteFuture(), [&](absl::Status s) { result = s; });
  EXPECT_EQ(result.code(), absl::StatusCode::kResourceExhausted);
}

// Many threads entering, reserving, growing and leaving at once: the budget
// is never exceeded and everything is returned (run under TSan in CI).
TEST(Admission, ConcurrentCallsNeverExceedTheBudget) {
  AdmissionControl a(Options(16, 1000, absl::Milliseconds(200)));
  std::atomic<bool> over{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      std::mt19937 rng(i);
      for (int n = 0; n < 300; ++n) {
        auto t = a.Enter();
        if (!t.ok()) continue;
        Event granted;
        absl::Status status;
        t->Reserve(1 + rng() % 400, absl::Now() + absl::Milliseconds(100), [&](absl::Status s) {
          status = s;
          granted.Notify();
        });
        granted.Wait();
        if (status.ok()) (void)t->TryGrow(rng() % 200);
        if (a.bytes() > 1000) over = true;
        if (status.ok()) t->Shrink(t->bytes() / 2);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_FALSE(over);
  EXPECT_EQ(a.bytes(), 0);
  EXPECT_EQ(a.calls(), 0);
}

// What a pipelined stream uses: reading ahead only into free bytes with no
// one queued, tickets for more bytes under one slot, and bytes handed from
// the read's ticket to a message's without passing through the budget.
TEST(Admission, ReadAheadNeverOvertakesAQueuedCallAndBytesMoveWithoutRelease) {
  AdmissionControl a(Options(3, 100));
  auto stream = a.Enter();
  ASSERT_TRUE(stream.ok());
  Ticket read = stream->BytesOnly();
  EXPECT_EQ(a.calls(), 1) << "a bytes-only ticket takes no slot";
  EXPECT_TRUE(read.TryReserve(70));
  EXPECT_FALSE(read.TryReserve(31)) << "over the budget";
  EXPECT_EQ(read.bytes(), 70);

  // Another call queues for 50: a read ahead that would fit must not jump it.
  auto other = a.Enter();
  ASSERT_TRUE(other.ok());
  Event granted;
  absl::Status other_status = absl::UnknownError("not called");
  other->Reserve(50, absl::InfiniteFuture(), [&](absl::Status s) {
    other_status = s;
    granted.Notify();
  });
  EXPECT_EQ(a.waiting(), 1);
  EXPECT_FALSE(read.TryReserve(10)) << "a call is queued";

  // Moving the read's bytes to a message leaves nothing free for the waiter.
  Ticket message = stream->BytesOnly();
  read.GiveBytes(read.bytes(), &message);
  EXPECT_EQ(read.bytes(), 0);
  EXPECT_EQ(message.bytes(), 70);
  EXPECT_EQ(a.bytes(), 70);
  EXPECT_EQ(a.waiting(), 1);
  message.Shrink(30);  // now 60 free: the waiter gets its 50
  ASSERT_TRUE(granted.WaitFor(absl::Seconds(5)));
  EXPECT_TRUE(other_status.ok()) << other_status;
  EXPECT_EQ(a.bytes(), 90);
  message.Reset();
  EXPECT_EQ(a.calls(), 2) << "resetting a bytes-only ticket frees no slot";
  EXPECT_EQ(a.bytes(), 50);
  other->Reset();
  read.Reset();
  stream->Reset();
  EXPECT_EQ(a.calls(), 0);
  EXPECT_EQ(a.bytes(), 0);
  a.StartDraining();
  auto late = a.Enter();
  EXPECT_FALSE(late.ok());
}

}  // namespace
}  // namespace posenc::server
