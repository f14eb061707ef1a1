#include "rpc/call_trace.h"

#include <atomic>
#include <memory>
#include <sstream>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/logging.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"

namespace posenc::server {
namespace {

using ::testing::HasSubstr;

class CallTrace : public ::testing::Test {
 protected:
  void TearDown() override { SetTraceConfig(TraceConfig{}); }
};

TEST_F(CallTrace, OffSamplesNothing) {
  SetTraceConfig({false, 1, -1});
  for (int i = 0; i < 100; ++i) EXPECT_FALSE(SampleCall());
  EXPECT_EQ(CurrentTraceConfig(), (TraceConfig{false, 1, -1}));
}

TEST_F(CallTrace, OneCallInRateFromTheChange) {
  SetTraceConfig({true, 3, -1});
  std::vector<int> traced;
  for (int i = 1; i <= 12; ++i) {
    if (SampleCall()) traced.push_back(i);
  }
  EXPECT_EQ(traced, (std::vector<int>{3, 6, 9, 12}));
  SampleCall();  // 13: the count starts again at a change
  SetTraceConfig({true, 2, -1});
  EXPECT_FALSE(SampleCall());
  EXPECT_TRUE(SampleCall());
}

TEST_F(CallTrace, CountStopsTracesAndSaysWhatIsLeft) {
  SetTraceConfig({true, 1, 3});
  int traced = 0;
  for (int i = 0; i < 10; ++i) traced += SampleCall();
  EXPECT_EQ(traced, 3);
  EXPECT_EQ(CurrentTraceConfig(), (TraceConfig{true, 1, 0}));
}

TEST_F(CallTrace, ThreadsUseUpTheCountExactly) {
  // Run under TSan too (scripts/sanitize.sh).
  SetTraceConfig({true, 2, 500});
  std::atomic<int> traced{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) traced += SampleCall();
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(traced.load(), 500);  // 4000 calls, 2000 sampled, 500 allowed
  EXPECT_EQ(CurrentTraceConfig().count, 0);
}

TEST_F(CallTrace, LineNamesTheCallAndItsStages) {
  std::ostringstream out;
  auto saved = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>(
      "test", std::make_shared<spdlog::sinks::ostream_sink_mt>(out)));
  spdlog::set_level(spdlog::level::info);
  const auto start = std::chrono::steady_clock::now() - std::chrono::milliseconds(5);
  CallStages stages;
  stages.started = start + std::chrono::milliseconds(1);
  LogTrace("ApplyRope", absl::OkStatus(), start, std::chrono::steady_clock::now(), {"id-7", ""},
           stages);
  spdlog::set_default_logger(saved);
  EXPECT_THAT(out.str(), HasSubstr("ApplyRope traced: 0.00"));
  EXPECT_THAT(out.str(),
              HasSubstr("method=ApplyRope code=OK request_id=id-7 queue_s=0.001000 work_s="));
  EXPECT_THAT(out.str(), ::testing::Not(HasSubstr("read_s")));
}

}  // namespace
}  // namespace posenc::server
