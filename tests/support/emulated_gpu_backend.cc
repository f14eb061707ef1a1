#include "emulated_gpu_backend.h"

#include <vector>

#include "cuda/absolute_body.h"
#include "cuda/bias_body.h"
#include "cuda/params_from_plan.h"
#include "cuda/rope_body.h"

namespace posenc::testing {
namespace {

using cuda::Coord;
using cuda::LaunchShape;

// Every block, then every thread of it: the kernels share no memory between
// threads and have no barriers, so any order is a legal schedule.
template <typename Body>
void ForEachThread(const LaunchShape& shape, Body body) {
  for (unsigned z = 0; z < shape.grid.z; ++z) {
    for (unsigned y = 0; y < shape.grid.y; ++y) {
      for (unsigned x = 0; x < shape.grid.x; ++x) {
        for (unsigned tx = 0; tx < shape.block.x; ++tx) {
          body(Coord{x, y, z}, Coord{tx, 0, 0});
        }
      }
    }
  }
}

// Runners for the Visit* functions; `dry` runs nothing (the visit then
// only says whether a variant matched).
struct RopeRunner {
  const cuda::RopeParams& p;
  LaunchShape shape;
  bool dry = false;
  template <typename T, RopeStyle kStyle, int kPairs, bool kVector>
  void Run() {
    if (dry) return;
    ForEachThread(shape,
                  [&](Coord b, Coord t) { cuda::RopeBody<T, kStyle, kPairs, kVector>(p, b, t); });
  }
};
struct AbsoluteRunner {
  const cuda::AbsoluteParams& p;
  LaunchShape shape;
  bool dry = false;
  template <typename T, int kWidth, bool kVector>
  void Run() {
    if (dry) return;
    ForEachThread(shape,
                  [&](Coord b, Coord t) { cuda::AbsoluteBody<T, kWidth, kVector>(p, b, t); });
  }
};
struct BiasRunner {
  const cuda::BiasParams& p;
  LaunchShape shape;
  bool dry = false;
  template <typename T, int kWidth, bool kVector>
  void Run() {
    if (dry) return;
    ForEachThread(
        shape, [&](Coord b, Coord t) { cuda::BiasBody<T, kWidth, kVector>(p, b, t, shape.grid); });
  }
};

// A launch's outcome from its visit (see Emulate).
template <typename Visit>
GridOutcome Outcome(Visit visit) {
  cuda::packet_internal::misaligned_packets = 0;
  if (!visit()) return GridOutcome::kNoVariant;
  return cuda::packet_internal::misaligned_packets != 0 ? GridOutcome::kMisaligned
                                                        : GridOutcome::kRan;
}

// One emulated launch: `visit` runs the body over the grid and says whether
// a variant matched. Vector accesses the GPU would make at a misaligned
// address fail the call, as cudaErrorMisalignedAddress fails it there.
template <typename Visit>
absl::Status Emulate(const char* what, Visit visit) {
  cuda::packet_internal::misaligned_packets = 0;
  if (!visit()) {
    return absl::InternalError(absl::StrCat("no ", what, " kernel variant for this plan"));
  }
  if (const int64_t n = cuda::packet_internal::misaligned_packets; n != 0) {
    return absl::InternalError(absl::StrCat(what, " kernel: ", n,
                                            " vector accesses at addresses not aligned to their "
                                            "width (cudaErrorMisalignedAddress on a GPU)"));
  }
  return absl::OkStatus();
}

class EmulatedGpuBackend final : public Backend {
 public:
  explicit EmulatedGpuBackend(int sm_count) : sm_count_(sm_count) {}
  BackendKind kind() const override { return BackendKind::kCuda; }
  DeviceInfo device() const override {
    DeviceInfo d;
    d.name = "emulated GPU grid";
    return d;
  }

  absl::Status ApplyRope(const RopePlan& plan, void* query, void* key, const RunContext&) override {
    if (plan.empty()) return absl::OkStatus();
    const std::vector<int32_t> sets = cuda::TokenFreqSets(plan);
    cuda::RopeParams p = cuda::MakeRopeParams(
        plan, {query, key, plan.positions.values.data(), sets.empty() ? nullptr : sets.data(),
               plan.inv_freq.data(), plan.attention_scale.data(), plan.slot_axis.data()});
    const LaunchShape shape = cuda::PlanRopeLaunch(&p, sm_count_);
    if (shape.empty()) return absl::OkStatus();
    RopeRunner runner{p, shape};
    return Emulate("RoPE", [&] { return cuda::VisitRope(p, runner); });
  }

  absl::Status ApplyAbsolute(const AbsolutePlan& plan, void* x, const RunContext&) override {
    if (plan.empty()) return absl::OkStatus();
    const bool learned = plan.options.kind == AbsoluteOptions::Kind::kLearned;
    const cuda::SinusoidalTables tables{plan.omega.data(), plan.phase_step.data(),
                                        plan.offset_sin.data(), plan.offset_cos.data(),
                                        static_cast<int64_t>(plan.omega.size())};
    cuda::AbsoluteParams p =
        cuda::MakeAbsoluteParams(plan, x, plan.positions.values.data(), tables,
                                 learned ? plan.options.table->values.data() : nullptr);
    const LaunchShape shape = cuda::PlanAbsoluteLaunch(&p);
    if (shape.empty()) return absl::OkStatus();
    AbsoluteRunner runner{p, shape};
    return Emulate("absolute", [&] { return cuda::VisitAbsolute(p, runner); });
  }

  absl::Status ApplyAttentionBias(const BiasPlan& plan, void* out, const RunContext&) override {
    if (plan.empty()) return absl::OkStatus();
    cuda::BiasParams p = cuda::MakeBiasParams(plan, out, plan.slopes.data(), plan.k_lens.data(),
                                              plan.k_starts.data());
    const LaunchShape shape = cuda::PlanBiasLaunch(&p);
    if (shape.empty()) return absl::OkStatus();
    BiasRunner runner{p, shape};
    return Emulate("bias", [&] { return cuda::VisitBias(p, runner); });
  }

 private:
  const int sm_count_;
};

}  // namespace

GridOutcome EmulateRopeLaunch(const cuda::RopeParams& params, int sm_count, bool dry_run) {
  cuda::RopeParams p = params;
  const LaunchShape shape = cuda::PlanRopeLaunch(&p, sm_count);
  if (shape.empty()) return GridOutcome::kRan;
  RopeRunner runner{p, shape, dry_run};
  return Outcome([&] { return cuda::VisitRope(p, runner); });
}

GridOutcome EmulateAbsoluteLaunch(const cuda::AbsoluteParams& params, bool dry_run) {
  cuda::AbsoluteParams p = params;
  const LaunchShape shape = cuda::PlanAbsoluteLaunch(&p);
  if (shape.empty()) return GridOutcome::kRan;
  AbsoluteRunner runner{p, shape, dry_run};
  return Outcome([&] { return cuda::VisitAbsolute(p, runner); });
}

GridOutcome EmulateBiasLaunch(const cuda::BiasParams& params, bool dry_run) {
  cuda::BiasParams p = params;
  const LaunchShape shape = cuda::PlanBiasLaunch(&p);
  if (shape.empty()) return GridOutcome::kRan;
  BiasRunner runner{p, shape, dry_run};
  return Outcome([&] { return cuda::VisitBias(p, runner); });
}

std::unique_ptr<Backend> CreateEmulatedGpuBackend(int sm_count) {
  return std::make_unique<EmulatedGpuBackend>(sm_count);
}

}  // namespace posenc::testing
