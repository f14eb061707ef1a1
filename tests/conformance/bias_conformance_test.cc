// The attention bias on every backend against the float64 reference of
// SPEC §5: ALiBi slopes, forms and masks, left padding, sliding windows,
// rounding when added to logits, rows longer than float's exact range.
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

// -------------------------------------------------------- attention bias ----

TEST(AlibiSlopes, MatchThePaperFor1To130Heads) {
  for (int64_t n = 1; n <= 130; ++n) {
    const std::vector<double> ours = AlibiSlopes(n);
    const std::vector<double> paper = reference::PaperAlibiSlopes(n);
    ASSERT_EQ(ours.size(), paper.size()) << n;
    for (int64_t h = 0; h < n; ++h) {
      // The paper chains products, drifting by about one ulp.
      EXPECT_NEAR(ours[h], paper[h], 1e-14 * paper[h]) << "n " << n << " head " << h;
    }
  }
  EXPECT_EQ(AlibiSlopes(8)[0], 0.5);
  EXPECT_EQ(AlibiSlopes(8)[7], 1.0 / 256);
}

void CheckBias(Backend& backend, const BiasOptions& o, bool with_logits) {
  const int64_t n = o.batch * o.num_heads * o.q_len * o.k_len;
  Bytes out = with_logits ? testing::RandomTensor(o.dtype, n) : testing::Poisoned(o.dtype, n);
  std::vector<double> logits =
      with_logits ? testing::ToDoubles(o.dtype, out) : std::vector<double>(n, 0.0);
  TensorView lv;
  if (with_logits)
    lv = TensorView{o.dtype, {o.batch, o.num_heads, o.q_len, o.k_len}, out.data(), out.size()};
  auto plan = PlanAttentionBias(o, lv);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<double> ref(n);
  int64_t e = 0;
  for (int64_t b = 0; b < o.batch; ++b)
    for (int64_t h = 0; h < o.num_heads; ++h)
      for (int64_t i = 0; i < o.q_len; ++i)
        for (int64_t j = 0; j < o.k_len; ++j, ++e)
          ref[e] = logits[e] + reference::Bias(*plan, b, h, i, j);
  RunMatchingCpu(backend, {&out}, [&](Backend& be, const std::vector<Bytes*>& b) {
    return be.ApplyAttentionBias(*plan, b[0]->data(), {});
  });
  EXPECT_TRUE(testing::MatchesReference(o.dtype, ref, out.data(), 1e-6));
}

TEST_P(BackendTest, AttentionBiasFormsAndMasks) {
  std::vector<int64_t> k_lens = {9, 3};
  std::vector<int32_t> k_starts = {4, 3};
  for (DType dtype : kFloatTypes) {
    for (BiasForm form : {BiasForm::kNone, BiasForm::kCausal, BiasForm::kSymmetric}) {
      for (bool logits : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << DTypeName(dtype) << " form " << int(form) << " logits " << logits);
        BiasOptions o;
        o.dtype = dtype;
        o.form = form;
        o.batch = 2;
        o.num_heads = 12;
        o.q_len = 4;
        o.k_len = 9;
        CheckBias(*backend_, o, logits);
        o.causal = true;
        o.window = 3;
        o.k_lens = testing::IntView(k_lens, {2});
        CheckBias(*backend_, o, logits);
        o.q_offset = 2;
        o.slopes = {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, -1.2};
        CheckBias(*backend_, o, logits);
        o.k_starts = testing::IntView(k_starts, {2});  // the second sequence: no real key
        CheckBias(*backend_, o, logits);
      }
    }
  }
}

// The bias `o` describes, built on `backend` into a poisoned buffer (and
// checked against the CPU backend's for a GPU one).
Bytes BuiltBias(Backend& backend, const BiasOptions& o) {
  auto plan = PlanAttentionBias(o, {});
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return {};
  Bytes out = testing::Poisoned(o.dtype, plan->NumElements());
  RunMatchingCpu(backend, {&out}, [&](Backend& be, const std::vector<Bytes*>& b) {
    return be.ApplyAttentionBias(*plan, b[0]->data(), {});
  });
  return out;
}

// Left padding on random batches (prefill and decode, with and without
// right padding, windows, own slopes, INT32 and INT64 starts): against the
// float64 reference, built and added to logits; and then the property
// k_starts promises: keys before k_starts[b] are -inf, and sequence b's
// real keys carry exactly the bias of the same sequence sent unpadded (its
// keys and queries moved left by k_starts[b]), bit for bit.
TEST_P(BackendTest, LeftPaddingMasksKeysBeforeKStartsAndMovesNoDistance) {
  std::mt19937_64& rng = testing::Rng();
  for (int trial = 0; trial < 60; ++trial) {
    BiasOptions o;
    o.dtype = kFloatTypes[rng() % 3];
    o.form =
        std::vector<BiasForm>{BiasForm::kNone, BiasForm::kCausal, BiasForm::kSymmetric}[rng() % 3];
    o.batch = 1 + rng() % 5;
    o.num_heads = 1 + rng() % 13;
    o.k_len = 1 + rng() % 70;
    o.q_len = rng() % 2 ? o.k_len : 1 + rng() % std::min<int64_t>(o.k_len, 4);
    o.causal = rng() % 4 != 0;
    o.window = rng() % 3 == 0 ? 1 + rng() % 9 : 0;
    if (rng() % 3 == 0) {
      for (int64_t h = 0; h < o.num_heads; ++h) o.slopes.push_back((int(rng() % 200) - 100) / 37.0);
    }
    const bool right_padding = rng() % 2;
    std::vector<int64_t> ends(o.batch, o.k_len), starts(o.batch);
    for (int64_t b = 0; b < o.batch; ++b) {
      if (right_padding) ends[b] = rng() % (o.k_len + 1);
      starts[b] = rng() % (ends[b] + 1);
    }
    std::vector<int32_t> starts32(starts.begin(), starts.end());
    if (right_padding) o.k_lens = testing::IntView(ends, {o.batch});
    o.k_starts =
        rng() % 2 ? testing::IntView(starts, {o.batch}) : testing::IntView(starts32, {o.batch});
    ::testing::Message what;
    what << "trial " << trial << " " << DTypeName(o.dtype) << " form " << int(o.form) << " ["
         << o.batch << ", " << o.num_heads << ", " << o.q_len << ", " << o.k_len << "] causal "
         << o.causal << " window " << o.window << " starts";
    for (int64_t s : starts) what << " " << s;
    SCOPED_TRACE(what);
    CheckBias(*backend_, o, /*with_logits=*/false);
    CheckBias(*backend_, o, /*with_logits=*/true);

    const Bytes padded = BuiltBias(*backend_, o);
    ASSERT_FALSE(padded.empty());
    for (int64_t b = 0; b < o.batch; ++b) {
      const int64_t s = starts[b];
      BiasOptions u = o;
      u.batch = 1;
      u.k_len = o.k_len - s;
      u.q_offset = (o.k_len - o.q_len) - s;
      std::vector<int64_t> end = {ends[b] - s};
      u.k_lens = testing::IntView(end, {1});
      u.k_starts = {};
      const Bytes unpadded = BuiltBias(*backend_, u);
      if (u.k_len > 0) ASSERT_FALSE(unpadded.empty());
      int64_t bad = 0;
      for (int64_t h = 0; h < o.num_heads; ++h) {
        for (int64_t i = 0; i < o.q_len; ++i) {
          const int64_t row = (b * o.num_heads + h) * o.q_len + i;
          const int64_t urow = h * o.q_len + i;
          for (int64_t j = 0; j < o.k_len; ++j) {
            const double got = testing::ReadDouble(o.dtype, padded.data(), row * o.k_len + j);
            const double want =
                j < s ? -std::numeric_limits<double>::infinity()
                      : testing::ReadDouble(o.dtype, unpadded.data(), urow * u.k_len + j - s);
            if (got != want && bad++ < 3) {
              ADD_FAILURE() << "b " << b << " h " << h << " i " << i << " j " << j << ": got "
                            << got << ", the unpadded sequence has " << want;
            }
          }
        }
      }
      EXPECT_EQ(bad, 0) << "sequence " << b;
    }
  }
}

TEST_P(BackendTest, SlidingWindowKeepsExactlyWKeys) {
  for (int64_t W : {1, 4, 16}) {
    BiasOptions o;
    o.num_heads = 2;
    o.q_len = 40;
    o.k_len = 40;
    o.causal = true;
    o.window = W;
    auto plan = PlanAttentionBias(o, {});
    ASSERT_TRUE(plan.ok());
    Bytes out = testing::Poisoned(DType::kFloat32, plan->NumElements());
    RunMatchingCpu(*backend_, {&out}, [&](Backend& be, const std::vector<Bytes*>& b) {
      return be.ApplyAttentionBias(*plan, b[0]->data(), {});
    });
    for (int64_t row = 0; row < 2 * 40; ++row) {
      const int64_t i = row % 40;
      int64_t kept = 0;
      for (int64_t j = 0; j < 40; ++j) {
        if (std::isfinite(testing::ReadDouble(DType::kFloat32, out.data(), row * 40 + j))) ++kept;
      }
      EXPECT_EQ(kept, std::min(W, i + 1)) << "window " << W << " row " << i;
    }
  }
}

// IEEE binary128, for sums that must be exact.
#ifdef __SIZEOF_FLOAT128__
using Quad = __float128;
#else
using Quad = long double;  // binary128 where there is no __float128 (aarch64)
static_assert(std::numeric_limits<long double>::digits == 113, "no binary128 type");
#endif

// The bias kernel's rounding contract, element by element and bit for bit
// (math/bias_math.h): a written bias is the double product -m * d rounded
// to float (whatever arithmetic the kernel uses to get there); a bias added
// to a logit is, for a slope that is a float and a row whose distances are
// all below 2^24, the exact sum logit - m * d rounded once to float, and
// otherwise the double product added to the logit in double and rounded to
// float; masked keys are -inf (the logit plus -inf). Then the float is
// stored as the dtype. `logit` is the stored input; `near` is the row's.
float ModelBias(const BiasPlan& p, int64_t b, int64_t h, int64_t i, int64_t j, float logit,
                bool near) {
  const float inf = std::numeric_limits<float>::infinity();
  const double ref = reference::Bias(p, b, h, i, j);
  if (std::isinf(ref)) return p.add_to_logits ? logit + -inf : -inf;
  if (!p.add_to_logits) return static_cast<float>(ref);
  if (p.form == BiasForm::kNone) return logit + 0.0f;
  const double m = p.slopes[h];
  int64_t dist = p.q_offset + i - j;
  if (p.form == BiasForm::kSymmetric) dist = std::abs(dist);
  if (static_cast<double>(static_cast<float>(m)) == m && near) {
    // Exact in binary128 for these tests' values: the float logit and the
    // 48-bit product span far fewer than 113 bits.
    return static_cast<float>(static_cast<Quad>(logit) -
                              static_cast<Quad>(m) * static_cast<Quad>(dist));
  }
  return static_cast<float>(static_cast<double>(logit) + ref);
}

// Whether every visible key of row (b, h, i) is within 2^24 of the query.
bool RowIsNear(const BiasPlan& p, int64_t b, int64_t h, int64_t i) {
  for (int64_t j = 0; j < p.k_len; ++j) {
    if (!std::isinf(reference::Bias(p, b, h, i, j)) &&
        std::abs(p.q_offset + i - j) >= (int64_t{1} << 24)) {
      return false;
    }
  }
  return true;
}

// Logits of varied magnitudes (2^-12 to 2^20; to 2^8 in float16, whose
// range ends at 65504), so that sums round at every scale; with `specials`,
// also zeros of both signs, infinities and NaN.
Bytes VariedLogits(DType dtype, int64_t n, bool specials) {
  std::mt19937_64& rng = testing::Rng();
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Bytes b(n * SizeOf(dtype));
  const float inf = std::numeric_limits<float>::infinity();
  const float special[] = {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN()};
  for (int64_t e = 0; e < n; ++e) {
    const int top = dtype == DType::kFloat16 ? 8 : 20;
    float v = std::ldexp(u(rng), static_cast<int>(rng() % (top + 13)) - 12);
    if (specials && rng() % 8 == 0) v = special[rng() % 5];
    StoreElement(dtype, b.data(), e, v);
  }
  return b;
}

// Runs `o` (onto logits when `logits` is not empty, else into a poisoned
// buffer) and checks every element against ModelBias bit for bit, or only
// the elements `sampled` picks; against the float64 reference within SPEC §5
// when `against_reference`. GPU backends also match the CPU bit for bit.
void CheckBiasBits(Backend& backend, const BiasOptions& o, Bytes logits,
                   const std::function<bool(int64_t)>& sampled, bool against_reference) {
  const bool add = !logits.empty();
  const int64_t n = o.batch * o.num_heads * o.q_len * o.k_len;
  ASSERT_GT(n, 0) << "set batch, num_heads, q_len and k_len";
  Bytes out = add ? logits : testing::Poisoned(o.dtype, n);
  TensorView lv;
  if (add) {
    lv =
        TensorView{o.dtype, {o.batch, o.num_heads, o.q_len, o.k_len}, logits.data(), logits.size()};
  }
  auto plan = PlanAttentionBias(o, lv);
  ASSERT_TRUE(plan.ok()) << plan.status();
  RunMatchingCpu(backend, {&out}, [&](Backend& be, const std::vector<Bytes*>& b) {
    return be.ApplyAttentionBias(*plan, b[0]->data(), {});
  });
  std::vector<double> ref;
  if (against_reference) ref.resize(n);
  const int es = static_cast<int>(SizeOf(o.dtype));
  int64_t bad = 0, e = 0;
  for (int64_t b = 0; b < plan->batch; ++b) {
    for (int64_t h = 0; h < plan->num_heads; ++h) {
      for (int64_t i = 0; i < plan->q_len; ++i) {
        const bool near = RowIsNear(*plan, b, h, i);
        for (int64_t j = 0; j < plan->k_len; ++j, ++e) {
          if (!against_reference && !sampled(j)) continue;
          const double logit = add ? testing::ReadDouble(o.dtype, logits.data(), e) : 0.0;
          if (against_reference) ref[e] = logit + reference::Bias(*plan, b, h, i, j);
          if (!sampled(j)) continue;
          uint8_t want[4];
          StoreElement(o.dtype, want, 0,
                       ModelBias(*plan, b, h, i, j, static_cast<float>(logit), near));
          const double got = testing::ReadDouble(o.dtype, out.data(), e);
          const double wanted = testing::ReadDouble(o.dtype, want, 0);
          const bool same = std::memcmp(out.data() + e * es, want, es) == 0 ||
                            (std::isnan(got) && std::isnan(wanted));
          if (!same && bad++ < 3) {
            ADD_FAILURE() << "b " << b << " h " << h << " i " << i << " j " << j << " (slope "
                          << plan->slopes[h] << ", logit " << logit << "): got " << got << ", want "
                          << wanted;
          }
        }
      }
    }
  }
  EXPECT_EQ(bad, 0);
  if (against_reference) EXPECT_TRUE(testing::MatchesReference(o.dtype, ref, out.data(), 1e-6));
}

// Random shapes, masks, slopes and query offsets (near and beyond the 2^24
// where the float arithmetic stops being exact, and at +-2^31), written and
// added, in every dtype: bit for bit against the rounding contract, and
// within SPEC §5 of the float64 reference.
TEST_P(BackendTest, AttentionBiasRoundsAsSpecifiedOnRandomRows) {
  std::mt19937_64& rng = testing::Rng();
  for (int trial = 0; trial < 120; ++trial) {
    BiasOptions o;
    o.dtype = kFloatTypes[rng() % 3];
    o.form =
        std::vector<BiasForm>{BiasForm::kNone, BiasForm::kCausal, BiasForm::kSymmetric}[rng() % 3];
    o.batch = 1 + rng() % 3;
    o.num_heads = 1 + rng() % 13;
    o.k_len = 1 + rng() % 80;
    o.q_len = 1 + rng() % 40;
    o.causal = rng() % 2;
    o.window = rng() % 3 == 0 ? 1 + rng() % (o.k_len + 3) : 0;
    const int64_t k = o.k_len;
    // Far rows overflow float16 (a -inf where the reference is finite):
    // those are checked bit for bit only.
    const int offset_case = rng() % 5;
    const bool far = offset_case >= 2;
    switch (offset_case) {
      case 0:  // default: bottom-right aligned
        break;
      case 1:
        o.q_offset = static_cast<int64_t>(rng() % 200) - 100;
        break;
      case 2:  // rows whose distances straddle 2^24
        o.q_offset = (int64_t{1} << 24) - o.q_len + static_cast<int64_t>(rng() % (2 * k)) - k;
        break;
      case 3:
        o.q_offset = -(int64_t{1} << 24) + static_cast<int64_t>(rng() % (2 * k)) - k;
        break;
      default:
        o.q_offset = rng() % 2 ? int64_t{1} << 31 : -(int64_t{1} << 31);
        break;
    }
    const int slopes = rng() % 4;  // default, float, not float, mixed
    if (slopes > 0) {
      for (int64_t h = 0; h < o.num_heads; ++h) {
        const bool as_float = slopes == 1 || (slopes == 3 && rng() % 2);
        const double s = as_float ? std::ldexp(static_cast<double>(1 + rng() % 4096),
                                               -12 - static_cast<int>(rng() % 12))
                                  : static_cast<double>(1 + rng() % 997) / 37.0;
        o.slopes.push_back(rng() % 4 == 0 ? -s : s);
      }
    }
    std::vector<int64_t> ends(o.batch, k), starts(o.batch, 0);
    const bool right = rng() % 2, left = rng() % 2;
    for (int64_t b = 0; b < o.batch; ++b) {
      if (right) ends[b] = rng() % (k + 1);
      if (left) starts[b] = rng() % (ends[b] + 1);
    }
    std::vector<int32_t> ends32(ends.begin(), ends.end());
    if (right) {
      o.k_lens =
          rng() % 2 ? testing::IntView(ends, {o.batch}) : testing::IntView(ends32, {o.batch});
    }
    if (left) o.k_starts = testing::IntView(starts, {o.batch});
    const int64_t n = o.batch * o.num_heads * o.q_len * k;
    for (int mode = 0; mode < 3; ++mode) {  // written, added, added with inf and NaN logits
      SCOPED_TRACE(::testing::Message()
                   << "trial " << trial << " mode " << mode << " " << DTypeName(o.dtype) << " form "
                   << int(o.form) << " [" << o.batch << ", " << o.num_heads << ", " << o.q_len
                   << ", " << k << "] q_offset " << o.q_offset.value_or(k - o.q_len) << " causal "
                   << o.causal << " window " << o.window << " slopes " << slopes << " right "
                   << right << " left " << left);
      CheckBiasBits(
          *backend_, o, mode == 0 ? Bytes{} : VariedLogits(o.dtype, n, mode == 2),
          [](int64_t) { return true; },
          /*against_reference=*/mode < 2 && !(far && o.dtype == DType::kFloat16));
    }
  }
}

// Rows longer than 2^24 keys: the CPU kernel walks them in chunks, and one
// row here is within 2^24 (float) while the next is not (double).
TEST_P(BackendTest, AttentionBiasRowsLongerThanTheFloatRange) {
  if (GetParam() == "cpu1") GTEST_SKIP() << "the cpu backend covers it";
  constexpr int64_t kBig = int64_t{1} << 24;
  for (bool add : {false, true}) {
    for (BiasForm form : {BiasForm::kCausal, BiasForm::kNone}) {
      SCOPED_TRACE(::testing::Message() << "add " << add << " form " << int(form));
      BiasOptions o;
      o.dtype = DType::kBFloat16;
      o.form = form;
      o.batch = 1;
      o.num_heads = 1;
      o.q_len = 2;
      o.k_len = kBig + 3;
      o.q_offset = kBig - 1;  // row 0 sees keys [0, 2^24), row 1 one more
      o.causal = true;
      o.slopes = {0.75};
      // Sampled: the ends, both sides of each chunk boundary, and a stride.
      auto sampled = [](int64_t j) {
        return j < 4 || j % 4099 == 0 || std::abs(j - kBig) < 4 || j > kBig;
      };
      CheckBiasBits(*backend_, o, add ? VariedLogits(o.dtype, 2 * o.k_len, false) : Bytes{},
                    sampled, /*against_reference=*/false);
    }
  }
}

// Results that are float subnormals or cancel to them, and NaN sums: the
// bfloat16 keeps the float's bits as FloatToBFloat16 rounds them (the wide
// CPU loop's VCVTNE2PS2BF16 would flush a subnormal to zero, so those lanes
// must take the scalar formula), for float and double slopes, written and
// added, at every lane of a 32-key step and in the tail.
TEST_P(BackendTest, AttentionBiasKeepsSubnormalAndNaNResultsBitForBit) {
  std::mt19937_64& rng = testing::Rng();
  for (bool add : {false, true}) {
    for (BiasForm form : {BiasForm::kCausal, BiasForm::kSymmetric}) {
      SCOPED_TRACE(::testing::Message() << "add " << add << " form " << int(form));
      BiasOptions o;
      o.dtype = DType::kBFloat16;
      o.form = form;
      o.batch = 1;
      o.num_heads = 4;
      o.q_len = 3;
      o.k_len = 77;
      o.causal = form == BiasForm::kCausal;
      // Float slopes whose products are subnormal floats, and slopes that
      // are not floats (the double formula) whose products round to them.
      o.slopes = {std::ldexp(1.0, -140), std::ldexp(3.0, -135), 1e-41, 3.3e-40};
      Bytes logits;
      if (add) {
        // Logits that cancel -slope * d to a subnormal or to zero, and NaN.
        logits.resize(o.num_heads * o.q_len * o.k_len * 2);
        for (int64_t e = 0; e < o.num_heads * o.q_len * o.k_len; ++e) {
          const int pick = static_cast<int>(rng() % 4);
          const float v = pick == 0   ? std::ldexp(static_cast<float>(rng() % 64), -133)
                          : pick == 1 ? -std::ldexp(static_cast<float>(rng() % 64), -133)
                          : pick == 2 ? std::numeric_limits<float>::quiet_NaN()
                                      : 0.0f;
          StoreElement(o.dtype, logits.data(), e, v);
        }
      }
      CheckBiasBits(
          *backend_, o, logits, [](int64_t) { return true; },
          /*against_reference=*/false);
    }
  }
}

// A row whose first visible key, partway into a vector step, is 2^24 - 1
// away: its distances are exact in float while those of the masked keys
// before it are not, and every visible lane must still get its own. Left
// padding at each offset of a 32-key step, written and added.
TEST_P(BackendTest, AttentionBiasRowsStartingJustInsideTheFloatRange) {
  for (int64_t start = 0; start < 40; ++start) {
    for (bool add : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "start " << start << " add " << add);
      BiasOptions o;
      o.dtype = DType::kBFloat16;
      o.batch = 1;
      o.num_heads = 1;
      o.q_len = 1;
      o.k_len = 70;
      o.causal = true;
      o.slopes = {0.01727294921875};  // a float
      o.q_offset = (int64_t{1} << 24) - 1 + start;
      std::vector<int64_t> starts = {start};
      o.k_starts = testing::IntView(starts, {1});
      CheckBiasBits(
          *backend_, o, add ? VariedLogits(o.dtype, o.k_len, false) : Bytes{},
          [](int64_t) { return true; }, /*against_reference=*/false);
    }
  }
}

}  // namespace
}  // namespace posenc
