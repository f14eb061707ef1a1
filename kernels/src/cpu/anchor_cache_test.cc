#include "cpu/anchor_cache.h"

#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cpu/cpu_kernels.h"
#include "gtest/gtest.h"
#include "math/phase.h"
#include "posenc/absolute.h"
#include "posenc/backend.h"
#include "test_tensors.h"

namespace posenc::internal {
namespace {

using testing::Bytes;

// The table for plan p, from its frequencies' second call on.
std::shared_ptr<RowTable> Kept(AnchorCache& cache, const AbsolutePlan& p) {
  std::shared_ptr<RowTable> t = cache.For(p);
  return t != nullptr ? t : cache.For(p);
}

AbsolutePlan PlanWithSteps(int64_t frequencies) {
  AbsolutePlan p;
  p.phase_step.resize(frequencies);
  for (uint64_t& s : p.phase_step) s = testing::Rng()();
  return p;
}

// Row j of `table` is SinCosOfPosition's (sin, cos) of anchor 16 j for every
// frequency, bit for bit, in halves or pairs (anchor_cache.h).
void ExpectRow(RowTable& table, const std::vector<uint64_t>& step, bool pairs, int64_t j) {
  const float* row = table.Row(j);
  ASSERT_NE(row, nullptr) << "anchor row " << j;
  const int64_t n = static_cast<int64_t>(step.size());
  for (int64_t i = 0; i < n; ++i) {
    float sn, cs;
    SinCosOfPosition(j * kPhaseAnchorStride, step[i], &sn, &cs);
    const float neg = -sn;
    const std::vector<std::pair<const float*, const float*>> want =
        pairs ? std::vector<std::pair<const float*, const float*>>{{&row[2 * i], &sn},
                                                                   {&row[2 * i + 1], &cs},
                                                                   {&row[2 * n + 2 * i], &cs},
                                                                   {&row[2 * n + 2 * i + 1], &neg}}
              : std::vector<std::pair<const float*, const float*>>{{&row[i], &sn},
                                                                   {&row[n + i], &cs}};
    for (size_t w = 0; w < want.size(); ++w) {
      ASSERT_EQ(std::memcmp(want[w].first, want[w].second, 4), 0)
          << "value " << w << ", anchor row " << j << " frequency " << i;
    }
  }
}

TEST(AnchorCache, RowsAreSinCosOfPositionBitForBit) {
  for (const SinusoidalLayout layout :
       {SinusoidalLayout::kInterleaved, SinusoidalLayout::kConcatenated}) {
    for (const int64_t frequencies : {int64_t{1}, int64_t{40}, int64_t{2048}}) {
      AbsolutePlan p = PlanWithSteps(frequencies);
      p.options.sinusoidal_layout = layout;
      const bool pairs = AnchorRowsInPairs(p);
      AnchorCache cache(int64_t{1} << 30, 16 * 1000);
      const std::shared_ptr<RowTable> table = Kept(cache, p);
      ASSERT_NE(table, nullptr);
      EXPECT_EQ(table->row_floats(), (pairs ? 4 : 2) * frequencies);
      for (int64_t j : {int64_t{0}, int64_t{1}, table->rows_per_chunk(), int64_t{999}}) {
        ExpectRow(*table, p.phase_step, pairs, j);
      }
      EXPECT_EQ(table->Row(1000), nullptr) << "past the table";
      EXPECT_EQ(table->Row(-1), nullptr) << "a negative anchor";
      std::uniform_int_distribution<int64_t> any(0, 999);
      for (int i = 0; i < 50; ++i) ExpectRow(*table, p.phase_step, pairs, any(testing::Rng()));
    }
  }
}

TEST(AnchorCache, OneTablePerFrequencySetAndNoneWhereTheKernelReadsNone) {
  AnchorCache cache;
  const AbsolutePlan p = PlanWithSteps(64);
  const auto a = Kept(cache, p);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(cache.For(p), a);
  AbsolutePlan q = p;
  q.phase_step[63] ^= 1;
  EXPECT_NE(Kept(cache, q), a) << "one step one unit away";
  AbsolutePlan learned = p;
  learned.options.kind = AbsoluteOptions::Kind::kLearned;
  EXPECT_EQ(Kept(cache, learned), nullptr);
  EXPECT_EQ(Kept(cache, PlanWithSteps(0)), nullptr);
  // The two-pass path computes whole PE rows (ReadsAnchorRows).
  AbsolutePlan half = p, pe_only = p, unscaled_to_zero = p;
  half.dtype = DType::kFloat16;
  pe_only.has_input = false;
  unscaled_to_zero.options.x_scale = 0.0;
  for (const AbsolutePlan* two_pass : {&half, &pe_only, &unscaled_to_zero}) {
    EXPECT_FALSE(ReadsAnchorRows(*two_pass));
    EXPECT_EQ(Kept(cache, *two_pass), nullptr);
  }
}

// The kernel with anchor rows from a table (cold: filled by this call;
// warm: read) writes exactly what it writes computing every anchor itself,
// in float32 and bfloat16, each layout, adding to x scaled or not (float16
// and PE-only plans, which read no kept rows, get no table), where the
// table has some of the anchors and not others: it covers
// positions below 320 (anchors 0-19) with a budget of three 32 KiB chunks
// (every anchor of the narrower rows; 12 of 2048-wide ones, 4 a chunk), and
// the call asks for positions 0-99, 250-349 and -40 to -1 (no row:
// negative), and 40 scattered in [0, 400).
TEST(AbsoluteTokensCpu, AnchorRowsFromTheTableGiveTheComputedResultBitForBit) {
  std::vector<int64_t> ids;
  for (int64_t pos = 0; pos < 100; ++pos) ids.push_back(pos);
  for (int64_t pos = 250; pos < 350; ++pos) ids.push_back(pos);
  for (int64_t pos = -40; pos < 0; ++pos) ids.push_back(pos);
  std::uniform_int_distribution<int64_t> any(0, 399);
  for (int i = 0; i < 40; ++i) ids.push_back(any(testing::Rng()));
  const int64_t T = static_cast<int64_t>(ids.size());
  for (const DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (const SinusoidalLayout layout :
         {SinusoidalLayout::kInterleaved, SinusoidalLayout::kConcatenated}) {
      // Wide loops' whole steps, steps and a remainder, an odd width, rows
      // that outrun the budget.
      for (const int64_t d : {int64_t{256}, int64_t{80}, int64_t{77}, int64_t{2048}}) {
        for (const double x_scale : {1.0, 0.5}) {
          for (const bool pe_only : {false, true}) {
            if (pe_only && x_scale != 1.0) continue;
            AbsoluteOptions o;
            o.sinusoidal_layout = layout;
            o.x_scale = x_scale;
            const Bytes x = testing::RandomTensor(dtype, T * d);
            Bytes out = x;
            absl::StatusOr<AbsolutePlan> plan;
            if (pe_only) {
              plan = PlanEncodingTable(o, d, dtype, testing::IntView(ids, {T}), 0);
            } else {
              AbsoluteTensors in;
              in.x = testing::Mutable(dtype, {T, d}, out);
              in.positions.position_ids = testing::IntView(ids, {T});
              plan = PlanAbsolute(o, in);
            }
            ASSERT_TRUE(plan.ok()) << plan.status();
            const auto run = [&](RowTable* table) {
              Bytes y = x;
              if (pe_only) std::memset(y.data(), 0xff, y.size());  // NaN: unwritten shows
              AbsoluteTokensCpu(*plan, table, y.data(), 0, T);
              return y;
            };
            const Bytes computed = run(nullptr);
            const std::string what = std::string(DTypeName(dtype)) + " layout " +
                                     std::to_string(static_cast<int>(layout)) + " d " +
                                     std::to_string(d) + " x_scale " + std::to_string(x_scale) +
                                     (pe_only ? " PE only" : "");
            AnchorCache cache(int64_t{96} << 10, 320);
            EXPECT_EQ(cache.For(*plan), nullptr) << "a set's first call";
            const std::shared_ptr<RowTable> table = cache.For(*plan);
            // float16 and PE only take the two-pass path, which reads no
            // kept rows: no table for them.
            EXPECT_EQ(table != nullptr, dtype != DType::kFloat16 && !pe_only) << what;
            if (table == nullptr) continue;
            EXPECT_EQ(run(table.get()), computed) << "cold, " << what;
            if (d == 2048) {
              EXPECT_EQ(cache.budget_left(), 0) << "the budget ran out, " << what;
            }
            EXPECT_EQ(run(table.get()), computed) << "warm, " << what;
          }
        }
      }
    }
  }
}

// Calls racing on one backend (four callers, four pool threads; the same
// frequencies, overlapping new positions, so its chunks are filled while
// other calls read them) each give what a backend computing alone gives.
TEST(CpuBackend, ConcurrentCallsSharingAnchorRowsGiveTheSameBits) {
  const int64_t T = 3000, d = 512;
  const auto plan_for = [&](Bytes& x, std::vector<int64_t>& ids, int64_t offset) {
    ids.resize(T);
    for (int64_t t = 0; t < T; ++t) ids[t] = offset + t;
    AbsoluteTensors in;
    in.x = testing::Mutable(DType::kBFloat16, {T, d}, x);
    in.positions.position_ids = testing::IntView(ids, {T});
    auto plan = PlanAbsolute(AbsoluteOptions{}, in);
    EXPECT_TRUE(plan.ok()) << plan.status();
    return *plan;
  };
  std::vector<Bytes> inputs, want;
  auto alone = CreateCpuBackend(1);
  for (int c = 0; c < 4; ++c) {
    inputs.push_back(testing::RandomTensor(DType::kBFloat16, T * d));
    want.push_back(inputs.back());
    std::vector<int64_t> ids;
    ASSERT_TRUE(
        alone->ApplyAbsolute(plan_for(want.back(), ids, 700 * c), want.back().data(), {}).ok());
  }
  auto shared = CreateCpuBackend(4);
  for (int round = 0; round < 3; ++round) {  // the rows are kept from the second call
    std::vector<Bytes> got = inputs;
    std::vector<std::thread> callers;
    for (int c = 0; c < 4; ++c) {
      callers.emplace_back([&, c] {
        std::vector<int64_t> ids;
        const AbsolutePlan plan = plan_for(got[c], ids, 700 * c);
        EXPECT_TRUE(shared->ApplyAbsolute(plan, got[c].data(), {}).ok());
      });
    }
    for (std::thread& t : callers) t.join();
    for (int c = 0; c < 4; ++c) EXPECT_EQ(got[c], want[c]) << "round " << round << " caller " << c;
  }
}

}  // namespace
}  // namespace posenc::internal
