// The reload gate on real threads: one reload runs, one waits and then
// runs, a third is refused at once; a waiting one can be cancelled; none
// runs twice at once.
#include "engine/reload_gate.h"

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "gtest/gtest.h"

namespace posenc::server {
namespace {

using std::chrono::milliseconds;

// Waits (up to 10 s) until `done` holds.
bool Eventually(const std::function<bool()>& done) {
  for (int i = 0; i < 1000 && !done(); ++i) std::this_thread::sleep_for(milliseconds(10));
  return done();
}

// Lets the parked reload go once, at the latest when the test ends (declared
// after the futures, so it runs before they wait for their threads).
struct LetGo {
  std::promise<void>* release;
  bool done = false;
  void operator()() {
    if (!done) release->set_value();
    done = true;
  }
  ~LetGo() { (*this)(); }
};

TEST(ReloadGate, OneRunsOneWaitsTheRestAreRefused) {
  ReloadGate gate("table reload");
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> running{0}, most{0}, ran{0};
  auto reload = [&] {
    const int now = ++running;
    most = std::max(most.load(), now);
    released.wait();
    ++ran;
    --running;
  };
  std::future<absl::Status> first, second;
  LetGo let_go{&release};
  first = std::async(std::launch::async, [&] { return gate.Run({}, reload); });
  ASSERT_TRUE(Eventually([&] { return running.load() == 1; }));
  second = std::async(std::launch::async, [&] { return gate.Run({}, reload); });
  ASSERT_TRUE(Eventually([&] { return gate.waiting(); }));
  // The second waits: a third finds one running and one waiting.
  const absl::Status third = gate.Run({}, [&] { ++ran; });
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted) << third;
  EXPECT_NE(third.message().find("table reload"), std::string::npos) << third;
  EXPECT_EQ(second.wait_for(milliseconds(50)), std::future_status::timeout) << "it waits";
  let_go();
  EXPECT_TRUE(first.get().ok());
  EXPECT_TRUE(second.get().ok());
  EXPECT_EQ(ran.load(), 2);
  EXPECT_EQ(most.load(), 1) << "never two at once";
  // Free again: a reload runs at once.
  EXPECT_TRUE(gate.Run({}, [&] { ++ran; }).ok());
  EXPECT_EQ(ran.load(), 3);
}

TEST(ReloadGate, AWaitingReloadCanBeCancelled) {
  ReloadGate gate("model reload");
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<bool> started{false}, stop{false}, second_ran{false};
  std::future<absl::Status> first, second, third;
  LetGo let_go{&release};
  first = std::async(std::launch::async, [&] {
    return gate.Run({}, [&] {
      started = true;
      released.wait();
    });
  });
  ASSERT_TRUE(Eventually([&] { return started.load(); }));
  second = std::async(std::launch::async, [&] {
    return gate.Run([&] { return stop.load(); }, [&] { second_ran = true; });
  });
  ASSERT_TRUE(Eventually([&] { return gate.waiting(); }));
  stop = true;
  EXPECT_EQ(second.get().code(), absl::StatusCode::kCancelled);
  EXPECT_FALSE(second_ran.load());
  EXPECT_FALSE(gate.waiting());
  // Its place is free: another may wait behind the running one.
  third = std::async(std::launch::async, [&] { return gate.Run({}, [] {}); });
  EXPECT_TRUE(Eventually([&] { return gate.waiting(); }));
  let_go();
  EXPECT_TRUE(first.get().ok());
  EXPECT_TRUE(third.get().ok());
}

}  // namespace
}  // namespace posenc::server
