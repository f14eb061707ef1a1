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

TEST(Planning, ZeroSizedTensorsAreLegalAndEmpty) {
  Bytes none;
  RopeTensors in;
  in.query = testing::Mutable(DType::kBFloat16, {0, 5, 4, 64}, none);
  auto r = PlanRope(RopeOptions{}, in);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->empty());
  auto cpu = CreateCpuBackend(2);
  EXPECT_TRUE(cpu->ApplyRope(*r, none.data(), nullptr, {}).ok());
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
