#include "engine/backend_cost.h"

#include <chrono>
#include <thread>

#include "gtest/gtest.h"

namespace posenc::server {
namespace {

TEST(FitCost, RecoversALineAndNeverGoesNegative) {
  const CostModel m = FitCost({{1 << 20, 150}, {2 << 20, 250}, {4 << 20, 450}});
  EXPECT_NEAR(m.fixed_us, 50, 1e-6);
  EXPECT_NEAR(m.us_per_mib, 100, 1e-6);
  EXPECT_NEAR(m.PredictUs(8 << 20), 850, 1e-6);
  // Noise that makes bigger look cheaper is read as flat.
  const CostModel flat = FitCost({{1 << 20, 300}, {4 << 20, 200}});
  EXPECT_EQ(flat.us_per_mib, 0);
  EXPECT_NEAR(flat.fixed_us, 250, 1e-6);
  EXPECT_EQ(FitCost({}).PredictUs(1 << 20), 0);
}

// A backend whose calls take 400 us + 1000 us per MiB (waiting, so the
// machine's load does not stretch them much; and long enough that a
// loaded machine's late wake-ups, a millisecond or so, do not tilt the fit).
class TimedBackend final : public Backend {
 public:
  BackendKind kind() const override { return BackendKind::kCuda; }
  DeviceInfo device() const override { return {}; }
  absl::Status ApplyRope(const RopePlan& plan, void*, void*, const RunContext&) override {
    const double bytes =
        static_cast<double>(plan.num_tokens * plan.query_heads * plan.head_dim * 2);
    std::this_thread::sleep_for(
        std::chrono::microseconds(static_cast<int64_t>(400 + 1000 * bytes / (1 << 20))));
    return absl::OkStatus();
  }
  absl::Status ApplyAbsolute(const AbsolutePlan&, void*, const RunContext&) override {
    return absl::UnimplementedError("");
  }
  absl::Status ApplyAttentionBias(const BiasPlan&, void*, const RunContext&) override {
    return absl::UnimplementedError("");
  }
};

TEST(MeasureCost, FitsWhatABackendCosts) {
  TimedBackend b;
  auto m = MeasureCost(b, {int64_t{1} << 20, int64_t{4} << 20, int64_t{16} << 20}, 5);
  ASSERT_TRUE(m.ok()) << m.status();
  // Sleeps overshoot, more on a loaded machine; the fit must still find the
  // shape: a per-MiB part near 1000 us (leaving the bounds takes medians
  // 6 ms apart in their overshoot), a fixed part of the right order.
  EXPECT_GT(m->us_per_mib, 600) << m->ToString();
  EXPECT_LT(m->us_per_mib, 1600) << m->ToString();
  EXPECT_LT(m->fixed_us, 5000) << m->ToString();
}

TEST(MeasureCost, TheCpuBackendCostsSomethingPerByte) {
  auto cpu = CreateCpuBackend(1);
  auto m = MeasureCost(*cpu, {int64_t{64} << 10, int64_t{1} << 20, int64_t{4} << 20}, 3);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_GT(m->us_per_mib, 0) << m->ToString();
  EXPECT_GT(m->PredictUs(int64_t{4} << 20), m->PredictUs(int64_t{64} << 10));
}

}  // namespace
}  // namespace posenc::server
