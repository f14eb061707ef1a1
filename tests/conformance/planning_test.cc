// Planning, whatever the backend: errors name the field, the expectation and
// the value; zero-sized tensors are legal; a cancelled call stops.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "backends.h"
#include "gtest/gtest.h"
#include "posenc/backend.h"
#include "reference.h"
#include "test_tensors.h"

namespace posenc {
namespace {

using testing::BackendTest;
using testing::Bytes;
using testing::kFloatTypes;
using testing::kStyles;
using testing::RunMatchingCpu;

// ------------------------------------------------------- planning errors ----

TEST(Planning, ErrorsNameFieldExpectationAndValue) {
  Bytes q = testing::RandomTensor(DType::kFloat32, 2 * 3 * 4 * 64);
  RopeTensors in;
  in.query = testing::Mutable(DType::kFloat32, {2, 3, 4, 64}, q);
  RopeOptions o;
  o.rotary_dim = 63;
  auto r = PlanRope(o, in);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("rotary_dim must be even"), std::string_view::npos)
      << r.status();
  EXPECT_NE(r.status().message().find("got 63"), std::string_view::npos) << r.status();

  o.rotary_dim = 0;
  in.query.nbytes -= 4;
  r = PlanRope(o, in);
  EXPECT_NE(r.status().message().find("needs 6144 bytes"), std::string_view::npos) << r.status();
  EXPECT_NE(r.status().message().find("got 6140 bytes"), std::string_view::npos) << r.status();

  in.query.nbytes += 4;
  Bytes k = testing::RandomTensor(DType::kFloat32, 2 * 3 * 4 * 32);
  in.key = testing::Mutable(DType::kFloat32, {2, 3, 4, 32}, k);
  r = PlanRope(o, in);
  EXPECT_NE(r.status().message().find("key.shape"), std::string_view::npos) << r.status();

  in.key = {};
  in.query.shape = {2, 3, 256};
  r = PlanRope(o, in);
  EXPECT_NE(r.status().message().find("rank 4"), std::string_view::npos) << r.status();
}

// Each refusal of SPEC §3, one case a row: INVALID_ARGUMENT whose message
// names the field, the expectation and what came.
TEST(Planning, EveryRefusalNamesItsFieldExpectationAndValue) {
  Bytes q = testing::RandomTensor(DType::kFloat32, 2 * 3 * 4 * 64);
  std::vector<int64_t> cu, offsets;
  struct Case {
    const char* what;
    std::function<void(RopeOptions&, RopeTensors&)> change;
    std::vector<const char*> says;
  };
  const std::vector<Case> cases = {
      {"LongRoPE short factors",
       [](RopeOptions& o, RopeTensors&) {
         o.scaling.type = ScalingType::kLongRope;
         o.scaling.original_max_position = 4096;
         o.scaling.short_factor.assign(31, 1.0);
         o.scaling.long_factor.assign(32, 2.0);
       },
       {"scaling.short_factor must have rotary_dim/2 = 32 values", "got 31"}},
      {"LongRoPE long factors",
       [](RopeOptions& o, RopeTensors&) {
         o.scaling.type = ScalingType::kLongRope;
         o.scaling.original_max_position = 4096;
         o.scaling.short_factor.assign(32, 1.0);
         o.scaling.long_factor.assign(33, 2.0);
       },
       {"scaling.long_factor must have rotary_dim/2 = 32 values", "got 33"}},
      {"LongRoPE mode outside the enum",
       [](RopeOptions& o, RopeTensors&) {
         o.scaling.type = ScalingType::kLongRope;
         o.scaling.original_max_position = 4096;
         o.scaling.short_factor.assign(32, 1.0);
         o.scaling.long_factor.assign(32, 2.0);
         o.scaling.longrope_mode = static_cast<LongRopeMode>(9);
       },
       {"scaling.longrope_mode must be", "got 9"}},
      {"explicit frequencies",
       [](RopeOptions& o, RopeTensors&) {
         o.scaling.type = ScalingType::kExplicit;
         o.scaling.inv_freq.assign(5, 0.5);
       },
       {"scaling.inv_freq must have rotary_dim/2 = 32 values", "got 5"}},
      {"Llama 3 factors",
       [](RopeOptions& o, RopeTensors&) {
         o.scaling.type = ScalingType::kLlama3;
         o.scaling.low_freq_factor = 2.0;
         o.scaling.high_freq_factor = 1.0;
       },
       {"scaling.high_freq_factor must exceed scaling.low_freq_factor", "got 1 <= 2"}},
      {"dynamic NTK without original_max_position",
       [](RopeOptions& o, RopeTensors&) {
         o.scaling.type = ScalingType::kDynamicNtk;
         o.scaling.factor = 2.0;
       },
       {"scaling.original_max_position is required for dynamic scaling"}},
      {"dynamic NTK on two rotary dims",
       [](RopeOptions& o, RopeTensors&) {
         o.scaling.type = ScalingType::kDynamicNtk;
         o.scaling.factor = 2.0;
         o.scaling.original_max_position = 16;
         o.rotary_dim = 2;
       },
       {"dynamic NTK scaling needs rotary_dim > 2", "got 2"}},
      {"axial dims",
       [](RopeOptions& o, RopeTensors&) {
         o.axis_mode = AxisMode::kAxial;
         o.axis_dims = {32, 30};
       },
       {"axis_dims must sum to rotary_dim = 64"}},
      {"M-RoPE sections",
       [](RopeOptions& o, RopeTensors&) {
         o.axis_mode = AxisMode::kMrope;
         o.sections = {16, 8, 4};
       },
       {"sections must sum to rotary_dim/2 = 32"}},
      {"cu_seqlens not starting at 0",
       [&](RopeOptions& o, RopeTensors& t) {
         o.layout = RopeLayout::kTHD;
         t.query.shape = {6, 4, 64};
         t.query.nbytes = 6 * 4 * 64 * 4;
         cu = {1, 6};
         t.cu_seqlens = testing::IntView(cu, {2});
       },
       {"cu_seqlens[0] must be 0", "got 1"}},
      {"cu_seqlens short of the tokens",
       [&](RopeOptions& o, RopeTensors& t) {
         o.layout = RopeLayout::kTHD;
         t.query.shape = {6, 4, 64};
         t.query.nbytes = 6 * 4 * 64 * 4;
         cu = {0, 2, 5};
         t.cu_seqlens = testing::IntView(cu, {3});
       },
       {"must equal the token count 6", "5"}},
      {"offsets of another batch",
       [&](RopeOptions&, RopeTensors& t) {
         offsets = {0, 1, 2};
         t.positions.offsets = testing::IntView(offsets, {3});
       },
       {"offsets.shape must be [2", "[3]"}},
      {"a negative dimension",
       [](RopeOptions&, RopeTensors& t) {
         t.query.shape = {2, -3, 4, 64};
       },
       {"query.shape[1] must be >= 0", "got -3"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    RopeTensors in;
    in.query = testing::Mutable(DType::kFloat32, {2, 3, 4, 64}, q);
    RopeOptions o;
    c.change(o, in);
    auto r = PlanRope(o, in);
    ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    for (const char* s : c.says) {
      EXPECT_NE(r.status().message().find(s), std::string_view::npos) << s << " in " << r.status();
    }
  }

  // The sinusoidal CONCATENATED layout on d = 2.
  Bytes x = testing::RandomTensor(DType::kFloat32, 3 * 2);
  AbsoluteTensors a;
  a.x = testing::Mutable(DType::kFloat32, {3, 2}, x);
  AbsoluteOptions ao;
  ao.sinusoidal_layout = SinusoidalLayout::kConcatenated;
  auto abs = PlanAbsolute(ao, a);
  EXPECT_EQ(abs.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(abs.status().message().find("CONCATENATED sinusoidal needs d >= 4"),
            std::string_view::npos)
      << abs.status();
  EXPECT_NE(abs.status().message().find("got d = 2"), std::string_view::npos) << abs.status();

  // The caller's slopes, one short of the heads.
  BiasOptions bo;
  bo.batch = 1;
  bo.num_heads = 4;
  bo.q_len = 2;
  bo.k_len = 2;
  bo.slopes = {0.5, 0.25, 0.125};
  auto bias = PlanAttentionBias(bo, TensorView());
  EXPECT_EQ(bias.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bias.status().message().find("slopes must have num_heads = 4 values, got 3"),
            std::string_view::npos)
      << bias.status();
}

TEST(Planning, ZeroSizedTensorsAreLegalAndEmpty) {
  Bytes none;
  RopeTensors in;
  in.query = testing::Mutable(DType::kBFloat16, {0, 5, 4, 64}, none);
  auto r = PlanRope(RopeOptions{}, in);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->empty());
  auto cpu = CreateCpuBackend(2);
  EXPECT_TRUE(cpu->ApplyRope(*r, none.data(), nullptr, {}).ok());

  // Sequences of length 0 take the position_ids of their batch ([2, 0],
  // or [1, 0] shared), as the absolute encoding's [2, 0, d] does.
  std::vector<int64_t> no_ids;
  for (const std::vector<int64_t>& ids_shape :
       {std::vector<int64_t>{2, 0}, std::vector<int64_t>{1, 0}}) {
    in.query = testing::Mutable(DType::kBFloat16, {2, 0, 4, 64}, none);
    in.positions.position_ids = testing::IntView(no_ids, ids_shape);
    r = PlanRope(RopeOptions{}, in);
    ASSERT_TRUE(r.ok()) << ShapeString(ids_shape) << ": " << r.status();
    EXPECT_TRUE(r->empty());
    AbsoluteTensors a;
    a.x = testing::Mutable(DType::kBFloat16, {2, 0, 64}, none);
    a.positions.position_ids = testing::IntView(no_ids, ids_shape);
    auto abs = PlanAbsolute(AbsoluteOptions{}, a);
    ASSERT_TRUE(abs.ok()) << ShapeString(ids_shape) << ": " << abs.status();
  }
}

TEST(Planning, CancelledCallStops) {
  auto cpu = CreateCpuBackend(2);
  Bytes q = testing::RandomTensor(DType::kFloat32, 64 * 8 * 64);
  RopeTensors in;
  in.query = testing::Mutable(DType::kFloat32, {1, 64, 8, 64}, q);
  auto plan = PlanRope(RopeOptions{}, in);
  ASSERT_TRUE(plan.ok());
  RunContext ctx;
  ctx.cancelled = [] { return true; };
  EXPECT_EQ(cpu->ApplyRope(*plan, q.data(), nullptr, ctx).code(), absl::StatusCode::kCancelled);
}

}  // namespace
}  // namespace posenc
