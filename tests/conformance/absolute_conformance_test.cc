// Sinusoidal and learned absolute encodings on every backend against the
// float64 reference of SPEC §5. Inputs are fresh random data each run;
// write-only outputs are poisoned with NaN so unwritten elements fail.
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

// Adds sinusoidal PE at `ids` to fresh random [ids.size(), d] inputs on
// `backend` (bit for bit against the CPU backend, see RunMatchingCpu) and
// checks the sums against the float64 reference at SPEC §5's bar.
void ExpectSinusoidalAddMatchesReference(Backend& backend, SinusoidalLayout layout, int64_t d,
                                         DType dtype, const std::vector<int64_t>& ids) {
  const int64_t T = static_cast<int64_t>(ids.size());
  Bytes x = testing::RandomTensor(dtype, T * d);
  std::vector<double> ref = testing::ToDoubles(dtype, x);
  AbsoluteOptions o;
  o.sinusoidal_layout = layout;
  for (int64_t t = 0; t < T; ++t) {
    auto row = reference::SinusoidalRow(layout, o.base, d, ids[t]);
    for (int64_t i = 0; i < d; ++i) ref[t * d + i] += row[i];
  }
  AbsoluteTensors in;
  in.x = testing::Mutable(dtype, {T, d}, x);
  in.positions.position_ids = testing::IntView(ids, {T});
  auto plan = PlanAbsolute(o, in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  RunMatchingCpu(backend, {&x}, [&](Backend& be, const std::vector<Bytes*>& b) {
    return be.ApplyAbsolute(*plan, b[0]->data(), {});
  });
  // The reference's angle p * w (w <= 1) is good to |p| 2^-53 radians: a sum
  // that cancels is owed no more than that beyond its ulp.
  int64_t far = 0;
  for (int64_t p : ids) far = std::max(far, p < 0 ? -p : p);
  EXPECT_TRUE(testing::MatchesReference(dtype, ref, x.data(), 1e-6, std::ldexp(double(far), -52)));
}

TEST_P(BackendTest, SinusoidalBothLayoutsMatchReference) {
  for (SinusoidalLayout layout :
       {SinusoidalLayout::kInterleaved, SinusoidalLayout::kConcatenated}) {
    for (int64_t d : {4, 64, 77, 512}) {
      for (DType dtype : kFloatTypes) {
        SCOPED_TRACE(::testing::Message()
                     << "layout " << int(layout) << " d " << d << " " << DTypeName(dtype));
        const int64_t B = 3, S = 6;
        Bytes x = testing::RandomTensor(dtype, B * S * d);
        std::vector<double> ref = testing::ToDoubles(dtype, x);
        std::vector<int64_t> ids(B * S);
        std::uniform_int_distribution<int64_t> p(0, 2000000);
        for (auto& v : ids) v = p(testing::Rng());
        AbsoluteOptions o;
        o.sinusoidal_layout = layout;
        o.base = d == 4 ? 100 : 10000;
        o.x_scale = std::sqrt(double(d));
        for (int64_t t = 0; t < B * S; ++t) {
          auto row = reference::SinusoidalRow(layout, o.base, d, ids[t]);
          for (int64_t i = 0; i < d; ++i) ref[t * d + i] = ref[t * d + i] * o.x_scale + row[i];
        }
        AbsoluteTensors in;
        in.x = testing::Mutable(dtype, {B, S, d}, x);
        in.positions.position_ids = testing::IntView(ids, {B, S});
        auto plan = PlanAbsolute(o, in);
        ASSERT_TRUE(plan.ok()) << plan.status();
        RunMatchingCpu(*backend_, {&x}, [&](Backend& be, const std::vector<Bytes*>& b) {
          return be.ApplyAbsolute(*plan, b[0]->data(), {});
        });
        EXPECT_TRUE(testing::MatchesReference(dtype, ref, x.data(), 1e-5));
      }
    }
  }
}

// A float32 sinusoidal add and then a bfloat16 one of the same width: the
// CPU backend keeps a thread's buffers from call to call, and the second
// call must not take the loop the first chose (a float32 call on an AVX-512
// CPU without BF16 once left the bfloat16 call on that thread the AVX-512
// BF16 loop, an illegal instruction there; the avx512.* run of this suite,
// POSENC_NO_AVX512BF16=1, is that CPU on any AVX-512 machine).
TEST_P(BackendTest, SinusoidalFloat32ThenBFloat16OfOneWidth) {
  std::vector<int64_t> ids(40);
  std::uniform_int_distribution<int64_t> p(0, 100000);
  for (auto& v : ids) v = p(testing::Rng());
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat32, DType::kBFloat16}) {
    SCOPED_TRACE(DTypeName(dtype));
    ExpectSinusoidalAddMatchesReference(*backend_, SinusoidalLayout::kInterleaved, 256, dtype, ids);
  }
}

// The kernels' fixed-point phases (math/phase.h) wrap where the angle wraps
// and treat negative positions by symmetry: float32 outputs at positions out
// to +-2^31 (the limit) still meet the bar SPEC §5 sets for 10^6, and every
// 16-bit element is within one ulp out to +-10^7. (Not further: there the
// float64 reference's own angle, rounded to 2^-22 rad at 2^31, is coarser
// than an ulp of fp16's small values, so "the float64 result" depends on how
// it forms the angle: p / base^(2i/d) or p * base^(-2i/d).)
TEST_P(BackendTest, SinusoidalLargeAndNegativePositionsMatchReference) {
  for (SinusoidalLayout layout :
       {SinusoidalLayout::kInterleaved, SinusoidalLayout::kConcatenated}) {
    for (int64_t d : {64, 77}) {
      for (DType dtype : kFloatTypes) {
        SCOPED_TRACE(::testing::Message()
                     << "layout " << int(layout) << " d " << d << " " << DTypeName(dtype));
        const int64_t kLimit = dtype == DType::kFloat32 ? int64_t{1} << 31 : 10000000;
        const int64_t T = 40;
        std::vector<int64_t> ids = {kLimit, -kLimit, kLimit - 1, -(kLimit - 1), -1, 0, 1, -4096};
        std::uniform_int_distribution<int64_t> p(-kLimit, kLimit);
        while (static_cast<int64_t>(ids.size()) < T) ids.push_back(p(testing::Rng()));
        ExpectSinusoidalAddMatchesReference(*backend_, layout, d, dtype, ids);
      }
    }
  }
}

// Runs of consecutive positions: the CPU carries each anchor's 64-bit phase
// to the next (16 positions on, |anchor| up or down by 16, across zero and up
// to the +-2^31 limit) where the GPU multiplies afresh; both must still agree
// bit for bit and with the reference, in rows wide enough for the CPU's
// vector loop and its scalar tail (d = 77, 130) and aligned ones (512).
TEST_P(BackendTest, SinusoidalConsecutiveRunsMatchReference) {
  for (SinusoidalLayout layout :
       {SinusoidalLayout::kInterleaved, SinusoidalLayout::kConcatenated}) {
    for (int64_t d : {77, 130, 512}) {
      for (DType dtype : kFloatTypes) {
        SCOPED_TRACE(::testing::Message()
                     << "layout " << int(layout) << " d " << d << " " << DTypeName(dtype));
        const int64_t kLimit = dtype == DType::kFloat32 ? int64_t{1} << 31 : 10000000;
        std::vector<int64_t> ids;
        auto run = [&](int64_t from, int64_t to) {  // inclusive, either direction
          for (int64_t p = from;; p += from <= to ? 1 : -1) {
            ids.push_back(p);
            if (p == to) break;
          }
        };
        run(-50, 50);                // |anchor| down to 0, then up
        run(kLimit - 70, kLimit);    // up to the limit
        run(-kLimit, -kLimit + 40);  // from the negative limit
        run(120, 60);                // descending positive positions
        std::uniform_int_distribution<int64_t> p(-kLimit + 40, kLimit - 40);
        const int64_t start = p(testing::Rng());
        run(start, start + 37);
        const int64_t T = static_cast<int64_t>(ids.size());
        ExpectSinusoidalAddMatchesReference(*backend_, layout, d, dtype, ids);
        AbsoluteOptions o;
        o.sinusoidal_layout = layout;
        AbsoluteTensors in;
        in.positions.position_ids = testing::IntView(ids, {T});
        // Inputs the CPU's vectorised conversions must treat as the scalar
        // ones (FloatToBFloat16) do, bit for bit: NaN of either sign stays NaN
        // (quieted), with a payload too (whose rounding would carry into it),
        // infinities, overflow to inf, signed zeros.
        auto from_bits = [](uint32_t bits) {
          float f;
          std::memcpy(&f, &bits, sizeof f);
          return f;
        };
        const float payload_nan = from_bits(0x7fa10000);  // signaling
        const float negative_payload_nan = from_bits(0xffc30000);
        const float specials[] = {NAN,      -NAN,      payload_nan, negative_payload_nan,
                                  INFINITY, -INFINITY, 3e38f,       -3e38f,
                                  0.0f,     -0.0f};
        constexpr int64_t kSpecials = sizeof(specials) / sizeof(specials[0]);
        // Scaled, unscaled (the CPU's loops without the multiply), and 0,
        // where an infinite x makes a NaN of its own (inf * 0).
        for (double x_scale : {3.0, 1.0, 0.0}) {
          SCOPED_TRACE(::testing::Message() << "x_scale " << x_scale);
          Bytes y = testing::RandomTensor(dtype, T * d);
          for (int64_t i = 0; i < T * d; i += 7) {
            StoreElement(dtype, y.data(), i, specials[(i / 7) % kSpecials]);
          }
          const Bytes stored = y;  // 3e38 is inf in float16
          o.x_scale = x_scale;
          in.x = testing::Mutable(dtype, {T, d}, y);
          auto special_plan = PlanAbsolute(o, in);
          ASSERT_TRUE(special_plan.ok()) << special_plan.status();
          RunMatchingCpu(*backend_, {&y}, [&](Backend& be, const std::vector<Bytes*>& b) {
            return be.ApplyAbsolute(*special_plan, b[0]->data(), {});
          });
          for (int64_t i = 0; i < T * d; i += 7) {
            // x * x_scale + PE is NaN exactly where x is (inf and overflow
            // stay inf), and where x is infinite at x_scale 0.
            const float x = LoadElement(dtype, stored.data(), i);
            ASSERT_EQ(std::isnan(LoadElement(dtype, y.data(), i)),
                      std::isnan(x) || (x_scale == 0.0 && std::isinf(x)))
                << "element " << i;
            // That NaN is the sum's own: one pattern on every backend (x86
            // makes 0xffc00000 of inf * 0, a GPU 0x7fffffff).
            if (x_scale == 0.0 && std::isinf(x)) {
              ASSERT_EQ(FloatBits(LoadElement(dtype, y.data(), i)), 0x7fc00000u)
                  << "element " << i << ": inf * 0 + PE is not CanonicalNaN";
            }
          }
        }
      }
    }
  }
}

// Sums that cancel: x is -PE rounded to the dtype (times x_scale's
// inverse), so x * x_scale + PE is PE's rounding residue, often far below an
// ulp of PE. float32 arithmetic alone misses the one-ulp bar there; the
// kernels must find these elements (SinusoidalSumNeedsPrecise) and redo them
// in double. Consecutive positions and d = 4096 take the CPU's fused vector
// loop, d = 77 its scalar tail.
TEST_P(BackendTest, SinusoidalCancellingSumsMeetTheBar) {
  for (SinusoidalLayout layout :
       {SinusoidalLayout::kInterleaved, SinusoidalLayout::kConcatenated}) {
    for (int64_t d : {77, 4096}) {
      for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
        for (double x_scale : {1.0, 8.0}) {
          SCOPED_TRACE(::testing::Message() << "layout " << int(layout) << " d " << d << " "
                                            << DTypeName(dtype) << " x_scale " << x_scale);
          std::uniform_int_distribution<int64_t> start(0, 1000000);
          const int64_t first = start(testing::Rng());
          const int64_t T = d == 77 ? 64 : 48;
          std::vector<int64_t> ids(T);
          for (int64_t t = 0; t < T; ++t) ids[t] = first + t;
          AbsoluteOptions o;
          o.sinusoidal_layout = layout;
          o.x_scale = x_scale;
          Bytes x(T * d * SizeOf(dtype));
          std::vector<double> ref(T * d);
          std::bernoulli_distribution cancel(0.75);
          std::uniform_real_distribution<float> other(-1.0f, 1.0f);
          auto store = [&](int64_t e, double v, double pe) {
            StoreElement(dtype, x.data(), e, static_cast<float>(v));
            ref[e] = LoadElement(dtype, x.data(), e) * x_scale + pe;
          };
          for (int64_t t = 0; t < T; ++t) {
            const auto row = reference::SinusoidalRow(layout, o.base, d, ids[t]);
            for (int64_t i = 0; i < d; ++i) {
              const int64_t e = t * d + i;
              store(e, cancel(testing::Rng()) ? -row[i] / x_scale : other(testing::Rng()), row[i]);
              // Residues under 2^-20 are left out: the float64 reference's
              // own angle errs by up to ~2^-35 at these positions, which is
              // more than an ulp of a residue near 2^-30. Above 2^-20 an ulp
              // is 2^-27 or more, while float32 arithmetic errs by ~2^-22.
              if (std::abs(ref[e]) < 0x1p-20) store(e, other(testing::Rng()), row[i]);
            }
          }
          AbsoluteTensors in;
          in.x = testing::Mutable(dtype, {T, d}, x);
          in.positions.position_ids = testing::IntView(ids, {T});
          auto plan = PlanAbsolute(o, in);
          ASSERT_TRUE(plan.ok()) << plan.status();
          RunMatchingCpu(*backend_, {&x}, [&](Backend& be, const std::vector<Bytes*>& b) {
            return be.ApplyAbsolute(*plan, b[0]->data(), {});
          });
          EXPECT_TRUE(testing::MatchesReference(dtype, ref, x.data(), 1e-6));
        }
      }
    }
  }
}

TEST_P(BackendTest, Seed003TableIsReproduced) {
  // Seed 003 prints getPositionEncoding(seq_len=4, d=4, n=100).
  const double printed[4][4] = {{0., 1., 0., 1.},
                                {0.84147098, 0.54030231, 0.09983342, 0.99500417},
                                {0.90929743, -0.41614684, 0.19866933, 0.98006658},
                                {0.14112001, -0.9899925, 0.29552021, 0.95533649}};
  AbsoluteOptions o;
  o.base = 100;
  auto plan = PlanEncodingTable(o, 4, DType::kFloat32, TensorView{}, 4);
  ASSERT_TRUE(plan.ok()) << plan.status();
  Bytes out = testing::Poisoned(DType::kFloat32, 16);
  RunMatchingCpu(*backend_, {&out}, [&](Backend& be, const std::vector<Bytes*>& b) {
    return be.ApplyAbsolute(*plan, b[0]->data(), {});
  });
  for (int p = 0; p < 4; ++p) {
    for (int i = 0; i < 4; ++i) {
      EXPECT_NEAR(testing::ReadDouble(DType::kFloat32, out.data(), p * 4 + i), printed[p][i], 6e-8)
          << "PE[" << p << ", " << i << "]";
    }
  }
}

TEST_P(BackendTest, LearnedTableAddsRowsAndRejectsOutOfRange) {
  auto table = std::make_shared<LearnedTable>();
  table->name = "gpt2/wpe";
  table->rows = 50;
  table->dim = 24;
  Bytes tb = testing::RandomTensor(DType::kFloat32, 50 * 24);
  for (double v : testing::ToDoubles(DType::kFloat32, tb)) table->values.push_back(float(v));
  AbsoluteOptions o;
  o.kind = AbsoluteOptions::Kind::kLearned;
  o.table = table;
  o.x_scale = 0.5;
  for (DType dtype : kFloatTypes) {
    Bytes x = testing::RandomTensor(dtype, 7 * 24);
    std::vector<double> ref = testing::ToDoubles(dtype, x);
    std::vector<int32_t> cu = {0, 3, 7};
    std::vector<int32_t> off = {10, 46};  // the second sequence ends at 49
    for (int64_t t = 0; t < 7; ++t) {
      const int64_t pos = t < 3 ? 10 + t : 46 + (t - 3);
      for (int i = 0; i < 24; ++i)
        ref[t * 24 + i] = ref[t * 24 + i] * 0.5 + table->values[pos * 24 + i];
    }
    AbsoluteTensors in;
    in.x = testing::Mutable(dtype, {7, 24}, x);
    in.cu_seqlens = testing::IntView(cu, {3});
    in.positions.offsets = testing::IntView(off, {2});
    auto plan = PlanAbsolute(o, in);
    ASSERT_TRUE(plan.ok()) << plan.status();
    RunMatchingCpu(*backend_, {&x}, [&](Backend& be, const std::vector<Bytes*>& b) {
      return be.ApplyAbsolute(*plan, b[0]->data(), {});
    });
    EXPECT_TRUE(testing::MatchesReference(dtype, ref, x.data(), 1e-6)) << DTypeName(dtype);

    off[1] = 47;  // last token at 50: out of the table
    auto bad = PlanAbsolute(o, in);
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(bad.status().message().find("position 50"), std::string_view::npos) << bad.status();
    EXPECT_NE(bad.status().message().find("length 50"), std::string_view::npos) << bad.status();
  }
}

}  // namespace
}  // namespace posenc
