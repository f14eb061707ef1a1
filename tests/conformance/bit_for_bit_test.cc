// A GPU backend (real, or the CUDA kernels on the emulated grid) computes
// exactly what the CPU backend does: same operations, same order, no FMA.
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

// Both backends run the same operations in the same order (the CUDA build
// disables FMA contraction), so their outputs agree bit for bit.
TEST_P(BackendTest, AgreesWithCpuBitForBit) {
  if (backend_->kind() == BackendKind::kCpu) GTEST_SKIP() << "compares a GPU with the CPU";
  auto cpu = CreateCpuBackend(2);
  for (DType dtype : kFloatTypes) {
    for (RopeStyle style : kStyles) {
      RopeOptions o;
      o.style = style;
      o.scaling.type = ScalingType::kYarn;
      o.scaling.factor = 8;
      o.scaling.original_max_position = 4096;
      Bytes q = testing::RandomTensor(dtype, 5 * 33 * 6 * 128);
      Bytes k = testing::RandomTensor(dtype, 5 * 33 * 2 * 128);
      Bytes q2 = q, k2 = k;
      std::vector<int64_t> off = {0, 9999999, -5, 123456, 77};
      RopeTensors t;
      t.query = testing::Mutable(dtype, {5, 33, 6, 128}, q);
      t.key = testing::Mutable(dtype, {5, 33, 2, 128}, k);
      t.positions.offsets = testing::IntView(off, {5});
      auto plan = PlanRope(o, t);
      ASSERT_TRUE(plan.ok());
      ASSERT_TRUE(backend_->ApplyRope(*plan, q.data(), k.data(), {}).ok());
      ASSERT_TRUE(cpu->ApplyRope(*plan, q2.data(), k2.data(), {}).ok());
      EXPECT_EQ(q, q2) << DTypeName(dtype) << " style " << int(style);
      EXPECT_EQ(k, k2) << DTypeName(dtype) << " style " << int(style);
    }
    AbsoluteOptions a;
    auto table = PlanEncodingTable(a, 1024, dtype, TensorView{}, 300);
    ASSERT_TRUE(table.ok());
    Bytes g = testing::Poisoned(dtype, 300 * 1024), c = testing::Poisoned(dtype, 300 * 1024);
    ASSERT_TRUE(backend_->ApplyAbsolute(*table, g.data(), {}).ok());
    ASSERT_TRUE(cpu->ApplyAbsolute(*table, c.data(), {}).ok());
    EXPECT_EQ(g, c) << "sinusoidal table " << DTypeName(dtype);
  }
}

// Once for the whole backend_conformance_test binary: every TEST_P of
// BackendTest, in each of its files, runs on each backend.
INSTANTIATE_TEST_SUITE_P(Backends, BackendTest,
                         ::testing::Values("cpu", "cpu1", "emulated", "emulated_1sm",
                                           "host_runtime", "cuda"));

}  // namespace
}  // namespace posenc
