// AUTO by measured cost: an engine with a GPU to choose times both backends
// at start-up and sends each request where it is predicted faster. The
// "GPU" here is a stand-in that computes on the CPU after a fixed wait
// (what staging and a launch cost), so small requests belong to the CPU and
// large ones to it.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "gtest/gtest.h"
#include "posenc/rope.h"

namespace posenc::server {
namespace {

// kCuda in name only: each call waits `fixed_us` (what staging and a launch
// cost) and computes nothing, so it costs next to nothing per byte, like a
// GPU behind a fast link. Routing is what is tested; results are not read.
class SlowStartGpu final : public Backend {
 public:
  explicit SlowStartGpu(int fixed_us) : fixed_us_(fixed_us) {}
  BackendKind kind() const override { return BackendKind::kCuda; }
  DeviceInfo device() const override {
    DeviceInfo d;
    d.name = "stand-in GPU";
    return d;
  }
  absl::Status ApplyRope(const RopePlan&, void*, void*, const RunContext&) override {
    std::this_thread::sleep_for(std::chrono::microseconds(fixed_us_));
    return absl::OkStatus();
  }
  absl::Status ApplyAbsolute(const AbsolutePlan&, void*, const RunContext&) override {
    return absl::OkStatus();
  }
  absl::Status ApplyAttentionBias(const BiasPlan&, void*, const RunContext&) override {
    return absl::OkStatus();
  }

 private:
  const int fixed_us_;
};

EngineOptions Options() {
  EngineOptions o;
  o.cpu_threads = 1;
  o.enable_cuda = false;
  o.auto_gpu_min_bytes = 0;
  o.max_request_tensor_bytes = int64_t{64} << 20;
  return o;
}

std::string Served(Engine& e, int64_t tokens) {
  std::vector<uint16_t> q(static_cast<size_t>(tokens * 32 * 128), 0x3f80);
  RopeTensors t;
  t.query = {DType::kBFloat16, {1, tokens, 32, 128}, q.data(), q.size() * 2};
  auto ticket = e.admission().Enter();
  EXPECT_TRUE(ticket.ok());
  CallEnv env{RunContext{}, *ticket};
  env.backend = BackendChoice::kAuto;
  auto served = e.ApplyRope(RopeOptions{}, t, env);
  EXPECT_TRUE(served.ok()) << served.status();
  return served.ok() ? *served : "";
}

TEST(AutoRouting, SendsEachRequestWhereItIsPredictedFaster) {
  auto gpu = std::make_unique<SlowStartGpu>(/*fixed_us=*/500);
  auto engine = Engine::CreateWith(Options(), CreateCpuBackend(1), std::move(gpu), "");
  ASSERT_TRUE(engine.ok()) << engine.status();
  Engine& e = **engine;
  ASSERT_TRUE(e.cpu_cost().has_value());
  ASSERT_TRUE(e.cuda_cost().has_value());
  std::printf("cpu %s, gpu %s\n", e.cpu_cost()->ToString().c_str(),
              e.cuda_cost()->ToString().c_str());
  // The models have the shapes the backends have: the stand-in's fixed half
  // millisecond and next to nothing per byte, the CPU the other way round.
  EXPECT_GT(e.cuda_cost()->fixed_us, 300);
  EXPECT_LT(e.cuda_cost()->us_per_mib, e.cpu_cost()->us_per_mib);
  // Each request goes where its model says: 8 KiB and 64 MiB (on a quiet
  // machine the CPU and the stand-in, in that order).
  for (int64_t tokens : {int64_t{1}, int64_t{8192}}) {
    const int64_t bytes = tokens * 32 * 128 * 2;
    const bool gpu_faster = e.cuda_cost()->PredictUs(bytes) < e.cpu_cost()->PredictUs(bytes);
    EXPECT_EQ(Served(e, tokens), gpu_faster ? "cuda:0" : "cpu") << bytes;
  }
  EXPECT_LT(e.cuda_cost()->PredictUs(int64_t{64} << 20), e.cpu_cost()->PredictUs(int64_t{64} << 20))
      << "64 MiB: milliseconds on one CPU thread against the stand-in's 0.5 ms";
}

TEST(AutoRouting, WithoutMeasurementTheThresholdDecides) {
  EngineOptions o = Options();
  o.auto_by_measured_cost = false;
  o.auto_gpu_min_bytes = int64_t{1} << 20;
  auto engine = Engine::CreateWith(o, CreateCpuBackend(1), std::make_unique<SlowStartGpu>(10), "");
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_FALSE((*engine)->cuda_cost().has_value());
  EXPECT_EQ(Served(**engine, 1), "cpu");
  EXPECT_EQ(Served(**engine, 256), "cuda:0");  // 2 MiB
}

// kCuda in name only: fails its first call with `failure` and is then
// unhealthy, as a GPU is after a sticky error.
class FailingGpu final : public Backend {
 public:
  explicit FailingGpu(absl::Status failure) : failure_(std::move(failure)) {}
  BackendKind kind() const override { return BackendKind::kCuda; }
  DeviceInfo device() const override { return DeviceInfo{}; }
  absl::Status health() const override {
    return failed_ ? absl::FailedPreconditionError("the stand-in GPU has failed")
                   : absl::OkStatus();
  }
  absl::Status ApplyRope(const RopePlan&, void*, void*, const RunContext&) override {
    failed_ = true;
    return failure_;
  }
  absl::Status ApplyAbsolute(const AbsolutePlan&, void*, const RunContext&) override {
    return absl::OkStatus();
  }
  absl::Status ApplyAttentionBias(const BiasPlan&, void*, const RunContext&) override {
    return absl::OkStatus();
  }

 private:
  const absl::Status failure_;
  std::atomic<bool> failed_{false};
};

// Under AUTO a GPU that failed leaves the call to the CPU, unless it says
// it had begun writing the results (DATA_LOSS): the tensors are then partly
// rotated, and rotating them again on the CPU would answer wrong bytes.
TEST(AutoRouting, AFailedGpuLeavesTheCallToTheCpuUnlessItPartlyWroteIt) {
  for (const bool partly : {false, true}) {
    EngineOptions o = Options();
    o.auto_by_measured_cost = false;
    auto engine = Engine::CreateWith(
        o, CreateCpuBackend(1),
        std::make_unique<FailingGpu>(partly ? absl::DataLossError("copy failed midway")
                                            : absl::InternalError("launch failed")),
        "");
    ASSERT_TRUE(engine.ok()) << engine.status();
    std::vector<uint16_t> q(8 * 32 * 128, 0x3f80);
    RopeTensors t;
    t.query = {DType::kBFloat16, {1, 8, 32, 128}, q.data(), q.size() * 2};
    auto ticket = (*engine)->admission().Enter();
    ASSERT_TRUE(ticket.ok());
    CallEnv env{RunContext{}, *ticket};
    env.backend = BackendChoice::kAuto;
    auto served = (*engine)->ApplyRope(RopeOptions{}, t, env);
    if (partly) {
      EXPECT_EQ(served.status().code(), absl::StatusCode::kDataLoss) << served.status();
    } else {
      ASSERT_TRUE(served.ok()) << served.status();
      EXPECT_EQ(*served, "cpu");
    }
  }
}

// kCuda in name only: stages host copies, as a GPU does (the engine
// charges them to the call), and covers no operation (UNIMPLEMENTED), so
// under AUTO every call it is given goes on to the CPU.
class StagingGpuThatCoversNothing final : public Backend {
 public:
  BackendKind kind() const override { return BackendKind::kCuda; }
  DeviceInfo device() const override { return DeviceInfo{}; }
  int64_t StagingBytes(int64_t tensor_bytes, int64_t /*row_bytes*/) const override {
    return tensor_bytes;
  }
  absl::Status ApplyRope(const RopePlan&, void*, void*, const RunContext&) override {
    return absl::UnimplementedError("the stand-in covers nothing");
  }
  absl::Status ApplyAbsolute(const AbsolutePlan&, void*, const RunContext&) override {
    return absl::UnimplementedError("the stand-in covers nothing");
  }
  absl::Status ApplyAttentionBias(const BiasPlan&, void*, const RunContext&) override {
    return absl::UnimplementedError("the stand-in covers nothing");
  }
};

// A call the GPU gave up on gives its staging charge (a whole tensor) back
// before the CPU retries it: while the CPU computes (its cancellation
// checks read the call's ticket), the call holds less than a tensor: it
// needs nothing there, in place or through its blocks into another
// buffer.
// RoPE, the sinusoidal encoding and the bias added to logits, in place,
// and RoPE and the sinusoidal encoding into another buffer
// (Engine::RopeIntoHost, whose stand-in GPU is lent work memory for its
// through, as a backend that does not say it needs none is; and
// Engine::IntoHost).
TEST(AutoRouting, ACallTheGpuGaveUpOnGivesTheStagingChargeBackToTheCpu) {
  EngineOptions o = Options();
  o.auto_by_measured_cost = false;
  auto engine = Engine::CreateWith(o, CreateCpuBackend(1),
                                   std::make_unique<StagingGpuThatCoversNothing>(), "");
  ASSERT_TRUE(engine.ok()) << engine.status();
  Engine& e = **engine;
  constexpr int64_t kTokens = 512, kDim = 256, kBytes = kTokens * kDim * 4;  // 512 KiB
  std::vector<float> data(static_cast<size_t>(kTokens * kDim), 0.5f);
  std::vector<float> out(data.size());
  for (const char* op : {"rope", "sinusoidal", "bias", "rope into another buffer",
                         "sinusoidal into another buffer"}) {
    SCOPED_TRACE(op);
    auto ticket = e.admission().Enter();
    ASSERT_TRUE(ticket.ok());
    int64_t most_held_while_computing = -1;
    RunContext ctx;
    ctx.cancelled = [&] {
      most_held_while_computing = std::max(most_held_while_computing, ticket->bytes());
      return false;
    };
    CallEnv env{ctx, *ticket};
    env.backend = BackendChoice::kAuto;
    absl::StatusOr<std::string> served;
    const std::string op_name = op;
    if (op_name.rfind("rope", 0) == 0) {
      RopeTensors t;
      t.query = {DType::kFloat32, {1, kTokens, 4, kDim / 4}, data.data(), kBytes};
      if (op_name != "rope") env.query_out = reinterpret_cast<char*>(out.data());
      served = e.ApplyRope(RopeOptions{}, t, env);
    } else if (op_name.rfind("sinusoidal", 0) == 0) {
      AbsoluteTensors t;
      t.x = {DType::kFloat32, {1, kTokens, kDim}, data.data(), kBytes};
      if (op_name != "sinusoidal") env.x_out = reinterpret_cast<char*>(out.data());
      served = e.AddAbsolute(AbsoluteOptions{}, t, env);
    } else {
      MutableTensor logits{DType::kFloat32, {1, 4, kTokens / 4, kDim}, data.data(), kBytes};
      BiasOptions b;
      b.form = BiasForm::kCausal;
      std::string unused;
      auto produced = e.AttentionBias(b, logits, &unused, env);
      served = produced.ok() ? absl::StatusOr<std::string>(produced->backend) : produced.status();
    }
    ASSERT_TRUE(served.ok()) << served.status();
    EXPECT_EQ(*served, "cpu");
    ASSERT_GE(most_held_while_computing, 0) << "the CPU never checked for cancellation";
    EXPECT_LT(most_held_while_computing, kBytes)
        << "the GPU's staging charge (or its work memory) was still held";
  }
}

TEST(AutoRouting, NoGpuNoMeasurement) {
  auto engine = Engine::CreateWith(Options(), CreateCpuBackend(1), nullptr, "none here");
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_FALSE((*engine)->cpu_cost().has_value());
  EXPECT_EQ(Served(**engine, 256), "cpu");
}

}  // namespace
}  // namespace posenc::server
