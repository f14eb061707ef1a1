// posenc's left padding (AttentionBias k_starts) against what BLOOM computes
// for a left-padded batch: transformers' build_alibi_tensor and BLOOM's
// attention mask, ported below in BLOOM's own float32 arithmetic, on random
// batches (prefill and decode, left padding and sometimes right padding too)
// on every backend this build has.
//
// BLOOM's bias for key j is m * p_j, p_j the key's position counted from the
// sequence's first real token; posenc's is -m * (q - j), q the query's
// position on the same padded axis. They differ by m * (q - k_starts[b]),
// one constant per query row, so the test asserts: the same entries masked;
// over unmasked keys, posenc = BLOOM - m * (q - k_starts[b]); and the
// attention weights softmax(logits + bias) agree (the constant cancels).
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backends.h"
#include "gtest/gtest.h"
#include "posenc/attention_bias.h"
#include "posenc/backend.h"
#include "test_tensors.h"

namespace posenc {
namespace {

using testing::Bytes;

// BLOOM's inputs: attention_mask [batch, k_len] of 0/1, and the number of
// query tokens at the end of the key axis (q_len = k_len in prefill, 1 in
// decode with a KV cache of k_len - 1 tokens).
struct BloomBatch {
  int64_t batch = 0, num_heads = 0, q_len = 0, k_len = 0;
  std::vector<std::vector<int64_t>> attention_mask;
};

// build_alibi_tensor of transformers' src/transformers/models/bloom/
// modeling_bloom.py, step by step in the tensor dtypes it uses: the slopes
// are float32 powers (torch.pow of a float32 base by int32 exponents) of
// base = 2^(-2^-(log2(p) - 3)) for p the largest power of two <= num_heads,
// followed by odd powers of the next power of two's base for the remaining
// heads; each key's position is (cumsum(mask) - 1) * mask (int64), and
// alibi = slope * position in float32. Returns [batch, heads, k_len]
// (BLOOM broadcasts it over the query rows) and the slopes.
std::vector<float> BuildAlibiTensor(const BloomBatch& in, std::vector<float>* slopes_out) {
  const int64_t n = in.num_heads;
  const int64_t closest_power_of_2 = int64_t{1} << static_cast<int>(std::floor(std::log2(n)));
  const float base = static_cast<float>(
      std::pow(2.0, -std::pow(2.0, -(std::log2(static_cast<double>(closest_power_of_2)) - 3))));
  std::vector<float> slopes;
  for (int32_t power = 1; power <= closest_power_of_2; ++power) {
    slopes.push_back(std::pow(base, static_cast<float>(power)));
  }
  if (closest_power_of_2 != n) {
    const float extra_base = static_cast<float>(std::pow(
        2.0, -std::pow(2.0, -(std::log2(static_cast<double>(2 * closest_power_of_2)) - 3))));
    const int64_t num_remaining_heads = std::min(closest_power_of_2, n - closest_power_of_2);
    for (int32_t power = 1; power < 1 + 2 * num_remaining_heads; power += 2) {
      slopes.push_back(std::pow(extra_base, static_cast<float>(power)));
    }
  }
  std::vector<float> alibi(in.batch * n * in.k_len);
  for (int64_t b = 0; b < in.batch; ++b) {
    int64_t cumsum = 0;
    for (int64_t j = 0; j < in.k_len; ++j) {
      const int64_t mask = in.attention_mask[b][j];
      cumsum += mask;
      const int64_t arange = (cumsum - 1) * mask;
      for (int64_t h = 0; h < n; ++h) {
        alibi[(b * n + h) * in.k_len + j] = slopes[h] * static_cast<float>(arange);
      }
    }
  }
  *slopes_out = slopes;
  return alibi;
}

// BLOOM's mask (_make_causal_mask | _expand_mask in the same file): query i
// is token k_len - q_len + i; it may not see later tokens (the cache's are
// all earlier) nor keys whose attention_mask is 0.
bool BloomMasks(const BloomBatch& in, int64_t b, int64_t i, int64_t j) {
  const int64_t past_key_values_length = in.k_len - in.q_len;
  return j > past_key_values_length + i || in.attention_mask[b][j] == 0;
}

// Softmax of one row in double; -inf entries weigh 0.
std::vector<double> Softmax(const std::vector<double>& row) {
  double top = -std::numeric_limits<double>::infinity();
  for (double v : row) top = std::max(top, v);
  std::vector<double> p(row.size());
  double sum = 0;
  for (size_t j = 0; j < row.size(); ++j) sum += p[j] = std::exp(row[j] - top);
  for (double& v : p) v /= sum;
  return p;
}

using testing::MakeBackend;

class BloomLeftPadding : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    backend_ = MakeBackend(GetParam());
    if (backend_ == nullptr) GTEST_SKIP() << "no " << GetParam() << " device visible";
  }
  std::unique_ptr<Backend> backend_;
};

TEST_P(BloomLeftPadding, BiasMatchesBuildAlibiTensorUpToOneConstantPerRow) {
  std::mt19937_64& rng = testing::Rng();
  const int64_t kHeads[] = {1, 2, 3, 5, 8, 12, 16, 30, 32, 112};  // BLOOM-176B has 112
  for (int trial = 0; trial < 40; ++trial) {
    BloomBatch in;
    in.batch = 1 + rng() % 6;
    in.num_heads = kHeads[rng() % std::size(kHeads)];
    in.k_len = 1 + rng() % 80;
    const int kind = rng() % 3;  // prefill, one decode step, a chunk of a few queries
    in.q_len = kind == 0 ? in.k_len : kind == 1 ? 1 : 1 + rng() % std::min<int64_t>(in.k_len, 5);
    // Left padding everywhere; right padding too in a third of the batches
    // (build_alibi_tensor takes any mask).
    const bool right = rng() % 3 == 0;
    std::vector<int64_t> starts(in.batch), ends(in.batch, in.k_len);
    for (int64_t b = 0; b < in.batch; ++b) {
      if (right) ends[b] = rng() % (in.k_len + 1);
      starts[b] = rng() % (ends[b] + 1);
      std::vector<int64_t> mask(in.k_len, 0);
      for (int64_t j = starts[b]; j < ends[b]; ++j) mask[j] = 1;
      in.attention_mask.push_back(mask);
    }
    ::testing::Message what;
    what << "trial " << trial << " [" << in.batch << ", " << in.num_heads << ", " << in.q_len
         << ", " << in.k_len << "] starts";
    for (int64_t s : starts) what << " " << s;
    if (right) {
      what << " ends";
      for (int64_t e : ends) what << " " << e;
    }
    SCOPED_TRACE(what);

    std::vector<float> bloom_slopes;
    const std::vector<float> alibi = BuildAlibiTensor(in, &bloom_slopes);

    // posenc: BLOOM's causal ALiBi with the paper's slopes (the default),
    // padding as k_starts (and k_lens), built into a poisoned buffer.
    BiasOptions o;
    o.form = BiasForm::kCausal;
    o.causal = true;
    o.batch = in.batch;
    o.num_heads = in.num_heads;
    o.q_len = in.q_len;
    o.k_len = in.k_len;
    o.k_starts = testing::IntView(starts, {in.batch});
    if (right) o.k_lens = testing::IntView(ends, {in.batch});
    auto plan = PlanAttentionBias(o, {});
    ASSERT_TRUE(plan.ok()) << plan.status();
    Bytes bias = testing::Poisoned(DType::kFloat32, plan->NumElements());
    ASSERT_TRUE(backend_->ApplyAttentionBias(*plan, bias.data(), {}).ok());

    // The same bias added to random logits, as a caller would send them.
    Bytes logits = testing::RandomTensor(DType::kFloat32, plan->NumElements());
    const std::vector<double> raw_logits = testing::ToDoubles(DType::kFloat32, logits);
    TensorView lv{DType::kFloat32,
                  {in.batch, in.num_heads, in.q_len, in.k_len},
                  logits.data(),
                  logits.size()};
    auto add_plan = PlanAttentionBias(o, lv);
    ASSERT_TRUE(add_plan.ok()) << add_plan.status();
    ASSERT_TRUE(backend_->ApplyAttentionBias(*add_plan, logits.data(), {}).ok());

    int64_t bad = 0;
    auto fail = [&](const std::string& message) {
      if (bad++ < 5) ADD_FAILURE() << message;
    };
    for (int64_t b = 0; b < in.batch; ++b) {
      for (int64_t h = 0; h < in.num_heads; ++h) {
        const double m = bloom_slopes[h];
        for (int64_t i = 0; i < in.q_len; ++i) {
          const int64_t row = (b * in.num_heads + h) * in.q_len + i;
          const std::string at =
              "b " + std::to_string(b) + " h " + std::to_string(h) + " i " + std::to_string(i);
          // The query's position counted from the first real token.
          const int64_t q = in.k_len - in.q_len + i - starts[b];
          // BLOOM's scores: logits + alibi, masked to float32's lowest.
          // BLOOM's float32 slopes (a float32 power of a rounded base drifts
          // by up to ~p float32 ulps at power p) and products against
          // posenc's double: relative to the row's largest term.
          const double tol = 4e-6 * std::max(1.0, m * static_cast<double>(in.k_len));
          std::vector<double> bloom_row(in.k_len), ours_row(in.k_len);
          bool any_visible = false;
          for (int64_t j = 0; j < in.k_len; ++j) {
            const int64_t e = row * in.k_len + j;
            const double ours = testing::ReadDouble(DType::kFloat32, bias.data(), e);
            const double bloom = alibi[(b * in.num_heads + h) * in.k_len + j];
            ours_row[j] = testing::ReadDouble(DType::kFloat32, logits.data(), e);
            const bool masked = BloomMasks(in, b, i, j);
            bloom_row[j] = masked ? std::numeric_limits<float>::lowest()
                                  : static_cast<double>(static_cast<float>(raw_logits[e] + bloom));
            any_visible |= !masked;
            if (masked) {
              if (ours != -std::numeric_limits<double>::infinity()) {
                fail(at + " j " + std::to_string(j) + ": BLOOM masks it, posenc has " +
                     std::to_string(ours));
              }
              continue;
            }
            const double want = bloom - m * static_cast<double>(q);
            if (!(std::abs(ours - want) <= tol)) {
              fail(at + " j " + std::to_string(j) + ": posenc " + std::to_string(ours) +
                   ", BLOOM " + std::to_string(bloom) + " - m * " + std::to_string(q) + " = " +
                   std::to_string(want));
            }
          }
          if (!any_visible) continue;  // BLOOM's softmax of an all-masked row is meaningless
          const std::vector<double> p_ours = Softmax(ours_row);
          const std::vector<double> p_bloom = Softmax(bloom_row);
          for (int64_t j = 0; j < in.k_len; ++j) {
            // Logits that differ by at most tol give weights within ~2 tol,
            // relatively.
            if (!(std::abs(p_ours[j] - p_bloom[j]) <= 3 * tol * p_bloom[j] + 1e-9)) {
              fail(at + " j " + std::to_string(j) + ": attention weight " +
                   std::to_string(p_ours[j]) + ", BLOOM's " + std::to_string(p_bloom[j]));
            }
          }
        }
      }
    }
    EXPECT_EQ(bad, 0);
  }
}

// BLOOM's slopes (float32 powers) and posenc's defaults (double) agree to
// float32 rounding for every head count BLOOM checkpoints use and more: the
// float32 base's rounding grows with the power, so h + 3 float32 ulps.
TEST(BloomSlopes, DefaultSlopesAreBloomsToFloat32Rounding) {
  for (int64_t n = 1; n <= 130; ++n) {
    BloomBatch in;
    in.batch = 1;
    in.num_heads = n;
    in.k_len = 1;
    in.attention_mask = {{1}};
    std::vector<float> bloom;
    BuildAlibiTensor(in, &bloom);
    const std::vector<double> ours = AlibiSlopes(n);
    ASSERT_EQ(bloom.size(), ours.size()) << n;
    for (int64_t h = 0; h < n; ++h) {
      EXPECT_NEAR(ours[h], bloom[h], (h + 3) * 0x1p-24 * ours[h]) << "heads " << n << " head " << h;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, BloomLeftPadding,
                         ::testing::Values("cpu", "emulated", "host_runtime", "cuda"));

}  // namespace
}  // namespace posenc
