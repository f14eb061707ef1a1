#include "rpc/call_log.h"

#include <chrono>
#include <string>
#include <tuple>

#include "gtest/gtest.h"

namespace posenc::server {
namespace {

using std::chrono::microseconds;
using Clock = std::chrono::steady_clock;

// The four stages' seconds in order (memory, read, queue, work), so one
// check names them all and a failure prints all four.
using Four = std::tuple<std::string, std::string, std::string, std::string>;
Four Fields(const StageTimes& t) { return {t.memory, t.read, t.queue, t.work}; }

TEST(StageBreakdown, EveryStageOfAnAdmittedUnaryCall) {
  const Clock::time_point start = Clock::now();
  CallStages s;
  s.admitted = start + microseconds(900000);
  s.read = s.admitted + microseconds(10000);
  s.started = s.read + microseconds(1000);
  const StageTimes t = StageBreakdown(start, s.started + microseconds(320000), s);
  EXPECT_EQ(Fields(t), Four("0.900", "0.010", "0.001", "0.320"));
}

TEST(StageBreakdown, StagesNotReachedAreLeftOutAndTheNextCountsFromTheLastReached) {
  const Clock::time_point start = Clock::now();
  // A control method: no memory to wait for.
  CallStages control;
  control.read = start + microseconds(2000);
  control.started = control.read + microseconds(3000);
  StageTimes t = StageBreakdown(start, control.started + microseconds(4000), control);
  EXPECT_EQ(Fields(t), Four("", "0.002", "0.003", "0.004"));
  // A stream's message: its time starts once it is read.
  CallStages message;
  message.started = start + microseconds(1500000);
  t = StageBreakdown(start, message.started + microseconds(250000), message);
  EXPECT_EQ(Fields(t), Four("", "", "1.500", "0.250"));
  // A call that ended while its request was read: the time after its last
  // stage is the read's.
  CallStages cut;
  cut.admitted = start + microseconds(5000);
  t = StageBreakdown(start, cut.admitted + microseconds(7000), cut);
  EXPECT_EQ(Fields(t), Four("0.005", "0.007", "", ""));
  // None at all: nothing.
  t = StageBreakdown(start, start + microseconds(1000), CallStages{});
  EXPECT_EQ(t.memory + t.read + t.queue + t.work, "");
}

}  // namespace
}  // namespace posenc::server
