#include "rpc/call_log.h"

#include <chrono>

#include "gtest/gtest.h"

namespace posenc::server {
namespace {

using std::chrono::microseconds;
using Clock = std::chrono::steady_clock;

TEST(StageBreakdown, EveryStageOfAnAdmittedUnaryCall) {
  const Clock::time_point start = Clock::now();
  CallStages s;
  s.admitted = start + microseconds(900000);
  s.read = s.admitted + microseconds(10000);
  s.started = s.read + microseconds(1000);
  const StageTimes t = StageBreakdown(start, s.started + microseconds(320000), s);
  EXPECT_EQ(t.memory, "0.900");
  EXPECT_EQ(t.read, "0.010");
  EXPECT_EQ(t.queue, "0.001");
  EXPECT_EQ(t.work, "0.320");
}

TEST(StageBreakdown, StagesNotReachedAreLeftOutAndTheNextCountsFromTheLastReached) {
  const Clock::time_point start = Clock::now();
  // A control method: no memory to wait for.
  CallStages control;
  control.read = start + microseconds(2000);
  control.started = control.read + microseconds(3000);
  StageTimes t = StageBreakdown(start, control.started + microseconds(4000), control);
  EXPECT_EQ(t.memory, "");
  EXPECT_EQ(t.read, "0.002");
  EXPECT_EQ(t.queue, "0.003");
  EXPECT_EQ(t.work, "0.004");
  // A stream's message: its time starts once it is read.
  CallStages message;
  message.started = start + microseconds(1500000);
  t = StageBreakdown(start, message.started + microseconds(250000), message);
  EXPECT_EQ(t.memory, "");
  EXPECT_EQ(t.read, "");
  EXPECT_EQ(t.queue, "1.500");
  EXPECT_EQ(t.work, "0.250");
  // A call that ended while its request was read: the time after its last
  // stage is the read's.
  CallStages cut;
  cut.admitted = start + microseconds(5000);
  t = StageBreakdown(start, cut.admitted + microseconds(7000), cut);
  EXPECT_EQ(t.memory, "0.005");
  EXPECT_EQ(t.read, "0.007");
  EXPECT_EQ(t.queue, "");
  EXPECT_EQ(t.work, "");
  // None at all: nothing.
  t = StageBreakdown(start, start + microseconds(1000), CallStages{});
  EXPECT_EQ(t.memory + t.read + t.queue + t.work, "");
}

}  // namespace
}  // namespace posenc::server
