#include "cpu/rotation_cache.h"

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cpu/cpu_kernels.h"
#include "gtest/gtest.h"
#include "math/rope_math.h"
#include "posenc/backend.h"
#include "posenc/rope.h"
#include "test_tensors.h"

namespace posenc::internal {
namespace {

using testing::Bytes;

std::vector<double> RandomInvFreq(int64_t half) {
  std::uniform_real_distribution<double> u(-12.0, 0.5);
  std::vector<double> f(half);
  for (double& x : f) x = std::exp(u(testing::Rng()));
  return f;
}

// 64 positions a chunk while a row is at most 512 bytes (row_cache.h).
int64_t ChunkBytes(int64_t half) { return 64 * 2 * half * 4; }

// Row pos of `table` is RotationOf's (c, n) for every slot, bit for bit.
void ExpectRow(RowTable& table, const std::vector<double>& f, double scale, bool inverse,
               int64_t pos) {
  const float* row = table.Row(pos);
  ASSERT_NE(row, nullptr) << "position " << pos;
  const int64_t half = static_cast<int64_t>(f.size());
  for (int64_t k = 0; k < half; ++k) {
    const SlotRotation r = RotationOf(static_cast<double>(pos) * f[k], scale, inverse);
    ASSERT_EQ(std::memcmp(&row[k], &r.c, 4), 0) << "c, position " << pos << " slot " << k;
    ASSERT_EQ(std::memcmp(&row[half + k], &r.n, 4), 0) << "n, position " << pos << " slot " << k;
  }
}

RopePlan PlanWith(std::vector<double> inv_freq, double scale, bool inverse) {
  RopePlan p;
  p.rotary_dim = 2 * static_cast<int64_t>(inv_freq.size());
  p.inv_freq = std::move(inv_freq);
  p.attention_scale = {scale};
  p.inverse = inverse;
  return p;
}

// The table for plan p, from its set's second call on.
std::shared_ptr<RowTable> Kept(RotationCache& cache, const RopePlan& p) {
  std::shared_ptr<RowTable> t = cache.For(p);
  return t != nullptr ? t : cache.For(p);
}

TEST(RotationCache, RowsAreRotationOfBitForBit) {
  for (const bool inverse : {false, true}) {
    const int64_t half = 1 + static_cast<int64_t>(testing::Rng()() % 80);
    const std::vector<double> f = RandomInvFreq(half);
    const double scale = inverse ? 0.7071 : 1.0;
    RotationCache cache(int64_t{1} << 30, 1000);
    const std::shared_ptr<RowTable> table = Kept(cache, PlanWith(f, scale, inverse));
    ASSERT_NE(table, nullptr);
    // Both ends of the table and of a chunk, then random positions.
    for (int64_t pos : {int64_t{0}, int64_t{63}, int64_t{64}, int64_t{999}}) {
      ExpectRow(*table, f, scale, inverse, pos);
    }
    EXPECT_EQ(table->Row(1000), nullptr) << "past the table";
    std::uniform_int_distribution<int64_t> any(0, 999);
    for (int i = 0; i < 200; ++i) ExpectRow(*table, f, scale, inverse, any(testing::Rng()));
  }
}

TEST(RotationCache, OneTablePerFrequencySet) {
  RotationCache cache;
  const std::vector<double> f = RandomInvFreq(64);
  const auto a = Kept(cache, PlanWith(f, 1.0, false));
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->row_floats(), 128);
  EXPECT_EQ(cache.For(PlanWith(f, 1.0, false)), a);
  EXPECT_NE(Kept(cache, PlanWith(f, 1.0, true)), a) << "inverse";
  EXPECT_NE(Kept(cache, PlanWith(f, 0.5, false)), a) << "attention scale";
  std::vector<double> g = f;
  g[63] = std::nextafter(g[63], 1.0);
  EXPECT_NE(Kept(cache, PlanWith(g, 1.0, false)), a) << "one frequency one ulp away";
  const auto fewer =
      Kept(cache, PlanWith(std::vector<double>(f.begin(), f.begin() + 32), 1.0, false));
  ASSERT_NE(fewer, nullptr);
  EXPECT_EQ(fewer->row_floats(), 64) << "fewer slots";
}

TEST(RotationCache, PlansWithSeveralSetsOrAxesAreNotServed) {
  RotationCache cache;
  RopePlan sets = PlanWith(RandomInvFreq(8), 1.0, false);
  sets.num_freq_sets = 2;
  sets.inv_freq.resize(16, 0.5);
  sets.attention_scale = {1.0, 1.0};
  EXPECT_EQ(Kept(cache, sets), nullptr);
  RopePlan axes = PlanWith(RandomInvFreq(8), 1.0, false);
  axes.num_axes = 3;
  EXPECT_EQ(Kept(cache, axes), nullptr);
}

// The kernel with rows from a table (cold: filled by this call; warm: read)
// writes exactly what it writes computing every rotation itself, in every
// dtype, style and layout, where the table has some of the positions and not
// others: it covers positions up to 300 with a budget of 3 chunks, and the
// call asks for 0-99 (chunks 0, 1) and 250-349 (chunk 3; chunk 4 over the
// budget; 300 and after outside the table).
TEST(RopeTokensCpu, RowsFromTheTableGiveTheComputedResultBitForBit) {
  for (const DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (const RopeStyle style : {RopeStyle::kNeox, RopeStyle::kGptj}) {
      for (const RopeLayout layout : {RopeLayout::kBSHD, RopeLayout::kBHSD}) {
        for (const int64_t rotary : {int64_t{128}, int64_t{48}}) {
          // Attention scales of 1, 0.7 and 0.1 (under the wide bfloat16
          // loops' 1/8: their 8-pair loop).
          for (const double scale : {1.0, 0.7, 0.1}) {
            const int64_t B = 2, S = 100, H = 3, KH = 2, D = 128;
            const std::vector<int64_t> offsets = {0, 250};
            RopeOptions o;
            o.layout = layout;
            o.style = style;
            o.rotary_dim = rotary;
            o.inverse = style == RopeStyle::kGptj;
            if (scale != 1.0) {
              o.scaling.type = ScalingType::kExplicit;
              o.scaling.inv_freq = RandomInvFreq(rotary / 2);
              o.scaling.attention_factor = scale;
            }
            Bytes q = testing::RandomTensor(dtype, B * S * H * D);
            Bytes k = testing::RandomTensor(dtype, B * S * KH * D);
            const auto shape = [&](int64_t heads) {
              return layout == RopeLayout::kBHSD ? std::vector<int64_t>{B, heads, S, D}
                                                 : std::vector<int64_t>{B, S, heads, D};
            };
            // Runs the kernel on copies of q and k.
            const auto run = [&](RowTable* table) {
              Bytes qo = q, ko = k;
              RopeTensors t;
              t.query = testing::Mutable(dtype, shape(H), qo);
              t.key = testing::Mutable(dtype, shape(KH), ko);
              t.positions.offsets = testing::IntView(offsets, {B});
              auto plan = PlanRope(o, t);
              EXPECT_TRUE(plan.ok()) << plan.status();
              if (!plan.ok()) return Bytes();
              RopeTokensCpu(*plan, table, qo.data(), ko.data(), 0, plan->num_tokens);
              qo.insert(qo.end(), ko.begin(), ko.end());
              return qo;
            };
            const Bytes computed = run(nullptr);
            RotationCache cache(3 * ChunkBytes(rotary / 2), 300);
            RopeTensors t;
            Bytes qo = q, ko = k;
            t.query = testing::Mutable(dtype, shape(H), qo);
            t.key = testing::Mutable(dtype, shape(KH), ko);
            t.positions.offsets = testing::IntView(offsets, {B});
            const auto plan = PlanRope(o, t);
            ASSERT_TRUE(plan.ok()) << plan.status();
            EXPECT_EQ(cache.For(*plan), nullptr) << "a set's first call";
            const std::shared_ptr<RowTable> table = cache.For(*plan);
            ASSERT_NE(table, nullptr);
            const std::string what = std::string(DTypeName(dtype)) + " style " +
                                     std::to_string(static_cast<int>(style)) + " layout " +
                                     std::to_string(static_cast<int>(layout)) + " rotary " +
                                     std::to_string(rotary) + " scale " + std::to_string(scale);
            EXPECT_EQ(run(table.get()), computed) << "cold, " << what;
            EXPECT_EQ(cache.budget_left(), 0) << what;
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
TEST(CpuBackend, ConcurrentCallsSharingRotationsGiveTheSameBits) {
  const int64_t S = 700, H = 4, D = 128;
  const auto plan_for = [&](Bytes& q, int64_t offset) {
    RopeTensors t;
    t.query = testing::Mutable(DType::kBFloat16, {1, S, H, D}, q);
    const std::vector<int64_t> offsets = {offset};
    t.positions.offsets = testing::IntView(offsets, {1});
    auto plan = PlanRope(RopeOptions{}, t);
    EXPECT_TRUE(plan.ok()) << plan.status();
    return *plan;
  };
  std::vector<Bytes> inputs, want;
  auto alone = CreateCpuBackend(1);
  for (int c = 0; c < 4; ++c) {
    inputs.push_back(testing::RandomTensor(DType::kBFloat16, S * H * D));
    want.push_back(inputs.back());
    ASSERT_TRUE(
        alone->ApplyRope(plan_for(want.back(), 100 * c), want.back().data(), nullptr, {}).ok());
  }
  auto shared = CreateCpuBackend(4);
  for (int round = 0; round < 3; ++round) {  // the set's rows are kept from its second call
    std::vector<Bytes> got = inputs;
    std::vector<std::thread> callers;
    for (int c = 0; c < 4; ++c) {
      callers.emplace_back([&, c] {
        const RopePlan plan = plan_for(got[c], 100 * c);
        EXPECT_TRUE(shared->ApplyRope(plan, got[c].data(), nullptr, {}).ok());
      });
    }
    for (std::thread& t : callers) t.join();
    for (int c = 0; c < 4; ++c) EXPECT_EQ(got[c], want[c]) << "round " << round << " caller " << c;
  }
}

}  // namespace
}  // namespace posenc::internal
