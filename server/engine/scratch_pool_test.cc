#include "engine/scratch_pool.h"

#include <cstdint>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace posenc::server {
namespace {

using Ticket = AdmissionControl::Ticket;

TEST(ScratchPool, ABufferIsAlignedWritableAndChargedToTheCall) {
  AdmissionControl admission({64, 1 << 20, absl::Seconds(1)});
  ScratchPool pool(&admission, 1 << 20);
  Ticket call = *admission.Enter();
  absl::StatusOr<ScratchPool::Buffer> b = pool.Lend(1000, call);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % 64, 0u);
  EXPECT_GE(b->size(), 1000);
  std::memset(b->data(), 0x5a, static_cast<size_t>(b->size()));
  EXPECT_EQ(call.bytes(), b->size());
  EXPECT_EQ(admission.bytes(), b->size());
}

TEST(ScratchPool, AReturnedBufferIsReusedWithoutNewBytes) {
  AdmissionControl admission({64, 8 << 20, absl::Seconds(1)});
  ScratchPool pool(&admission, 8 << 20);
  char* first = nullptr;
  int64_t size = 0;
  {
    Ticket call = *admission.Enter();
    ScratchPool::Buffer b = *pool.Lend(3 << 20, call);
    first = b.data();
    size = b.size();
    b.Reset();
    // Back in the pool: the bytes moved from the call to the pool.
    EXPECT_EQ(call.bytes(), 0);
    EXPECT_EQ(pool.idle_bytes(), size);
    EXPECT_EQ(admission.bytes(), size);
  }
  EXPECT_EQ(admission.bytes(), size);  // idle bytes stay in the budget
  Ticket call = *admission.Enter();
  ScratchPool::Buffer again = *pool.Lend(3 << 20, call);
  EXPECT_EQ(again.data(), first);
  EXPECT_EQ(call.bytes(), size);
  EXPECT_EQ(pool.idle_bytes(), 0);
  EXPECT_EQ(admission.bytes(), size);
}

TEST(ScratchPool, ASmallCallDoesNotTakeALargeBuffer) {
  AdmissionControl admission({64, 64 << 20, absl::Seconds(1)});
  ScratchPool pool(&admission, 64 << 20);
  Ticket call = *admission.Enter();
  char* large = nullptr;
  char* medium = nullptr;
  {
    ScratchPool::Buffer l = *pool.Lend(16 << 20, call);
    ScratchPool::Buffer m = *pool.Lend(5 << 20, call);
    large = l.data();
    medium = m.data();
  }
  EXPECT_EQ(pool.idle_buffers(), 2);
  // 4 MiB: the 5 MiB buffer fits (the smallest that does); 16 MiB is over
  // twice the ask.
  ScratchPool::Buffer a = *pool.Lend(4 << 20, call);
  EXPECT_EQ(a.data(), medium);
  ScratchPool::Buffer b = *pool.Lend(1 << 20, call);
  EXPECT_NE(b.data(), large);
  ScratchPool::Buffer c = *pool.Lend(12 << 20, call);
  EXPECT_EQ(c.data(), large);
}

TEST(ScratchPool, IdleBuffersAreBoundedAndFreedPastTheBound) {
  AdmissionControl admission({64, 64 << 20, absl::Seconds(1)});
  ScratchPool pool(&admission, 6 << 20);
  {
    Ticket call = *admission.Enter();
    ScratchPool::Buffer a = *pool.Lend(4 << 20, call);
    ScratchPool::Buffer b = *pool.Lend(4 << 20, call);
  }
  EXPECT_EQ(pool.idle_buffers(), 1);
  EXPECT_EQ(pool.idle_bytes(), 4 << 20);
  EXPECT_EQ(admission.bytes(), 4 << 20);
}

TEST(ScratchPool, IdleBuffersGiveWayToACallThatNeedsTheBudget) {
  AdmissionControl admission({64, 10 << 20, absl::Seconds(1)});
  ScratchPool pool(&admission, 10 << 20);
  {
    Ticket call = *admission.Enter();
    ScratchPool::Buffer a = *pool.Lend(6 << 20, call);
  }
  EXPECT_EQ(admission.bytes(), 6 << 20);
  // 9 MiB fits the budget only once the idle 6 MiB is given back.
  Ticket call = *admission.Enter();
  absl::StatusOr<ScratchPool::Buffer> b = pool.Lend(9 << 20, call);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(pool.idle_buffers(), 0);
  EXPECT_EQ(admission.bytes(), 9 << 20);
  // And past the budget, the call is told so, holding nothing more.
  Ticket other = *admission.Enter();
  absl::StatusOr<ScratchPool::Buffer> c = pool.Lend(2 << 20, other);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(other.bytes(), 0);
  EXPECT_EQ(pool.Lend(0, other).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool.Lend(INT64_MAX, other).status().code(), absl::StatusCode::kResourceExhausted);
}

// Idle buffers never keep a call out: a reservation that would wait for
// their bytes, a read-ahead and a growth (a region registered, say) get
// them at once. (They used to stay idle, charged, until a call already let
// in asked the pool for a buffer, so a budget held by regions and one idle
// buffer refused every call after --admission_wait.)
TEST(ScratchPool, IdleBuffersGiveWayToReservationsAndGrowth) {
  AdmissionControl admission({64, 10 << 20, absl::Seconds(30)});
  ScratchPool pool(&admission, 10 << 20);
  Ticket regions = admission.Holder();  // memory held between calls
  ASSERT_TRUE(regions.TryGrow(3 << 20).ok());
  const auto idle_buffer = [&] {
    Ticket call = *admission.Enter();
    ScratchPool::Buffer a = *pool.Lend(6 << 20, call);
  };
  idle_buffer();
  ASSERT_EQ(pool.idle_buffers(), 1);
  ASSERT_EQ(admission.bytes(), 9 << 20);
  // A reservation of 4 MiB fits only once the idle 6 MiB are given back:
  // granted at once, not after the wait.
  Ticket call = *admission.Enter();
  absl::Status granted = absl::UnknownError("not yet");
  const absl::Time start = absl::Now();
  call.Reserve(4 << 20, absl::InfiniteFuture(), [&](absl::Status s) { granted = s; });
  EXPECT_TRUE(granted.ok()) << granted;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(pool.idle_buffers(), 0);
  EXPECT_EQ(admission.bytes(), 7 << 20);
  call.Reset();
  // A read-ahead.
  idle_buffer();
  ASSERT_EQ(admission.bytes(), 9 << 20);
  Ticket reader = *admission.Enter();
  EXPECT_TRUE(reader.TryReserve(2 << 20));
  EXPECT_EQ(pool.idle_buffers(), 0);
  reader.Reset();
  // A growth that keeps room free (as registering a region does).
  idle_buffer();
  EXPECT_TRUE(regions.TryGrow(4 << 20, /*keep_free=*/2 << 20).ok());
  EXPECT_EQ(pool.idle_buffers(), 0);
  EXPECT_EQ(admission.bytes(), 7 << 20);
  // With nothing idle, refusals stand, holding nothing more.
  Ticket over = *admission.Enter();
  EXPECT_FALSE(over.TryReserve(4 << 20));
  EXPECT_EQ(over.TryGrow(4 << 20).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(over.bytes(), 0);
}

TEST(ScratchPool, CallsLendingAtOnceKeepEveryByteAccounted) {
  const unsigned seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  AdmissionControl admission({64, 256 << 20, absl::Seconds(1)});
  ScratchPool pool(&admission, 16 << 20);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(seed + t);
      for (int i = 0; i < 300; ++i) {
        Ticket call = *admission.Enter();
        const int64_t n = 1 + static_cast<int64_t>(rng() % (3 << 20));
        absl::StatusOr<ScratchPool::Buffer> b = pool.Lend(n, call);
        ASSERT_TRUE(b.ok()) << b.status();
        // Nobody else writes this buffer while it is lent.
        const char mark = static_cast<char>(t * 31 + i);
        std::memset(b->data(), mark, static_cast<size_t>(n));
        std::this_thread::yield();
        for (int64_t j = 0; j < n; j += 4093) ASSERT_EQ(b->data()[j], mark);
        ASSERT_EQ(call.bytes(), b->size());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_LE(pool.idle_bytes(), 16 << 20);
  EXPECT_EQ(admission.bytes(), pool.idle_bytes());
}

}  // namespace
}  // namespace posenc::server
