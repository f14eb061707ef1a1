// Additive attention bias (SPEC §2.4): ALiBi distances and causal,
// sliding-window and key-padding masks, as b in softmax(QK^T / sqrt(d) + b).
//
// Query row i sits at q_offset + i and key j at j, both along the stored key
// axis; sequence b's real keys are [k_starts[b], k_lens[b]). Left padding
// (k_starts) shifts queries and keys alike, so it changes no distance: over
// real keys the bias is the unpadded sequence's (BLOOM's build_alibi_tensor
// differs from it by a constant per query row, which softmax cancels; see
// posenc.proto, AttentionBiasRequest).
#ifndef POSENC_ATTENTION_BIAS_H_
#define POSENC_ATTENTION_BIAS_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "posenc/codes.h"
#include "posenc/plan_cost.h"
#include "posenc/tensor.h"

namespace posenc {

// The ALiBi paper's slopes for n heads: 2^(-8h/n), h = 1..n, for n a power of
// two; otherwise those of the largest power of two below n followed by every
// other slope of the next power of two. Empty for n < 1. REQUIRES: n <=
// kMaxHeads (callers validate; the result holds n doubles).
std::vector<double> AlibiSlopes(int64_t num_heads);

struct BiasOptions {
  BiasForm form = BiasForm::kCausal;
  std::vector<double> slopes;                              // empty: AlibiSlopes(num_heads)
  int64_t batch = 0, num_heads = 0, q_len = 0, k_len = 0;  // 0: from logits
  std::optional<int64_t> q_offset;                         // default k_len - q_len
  bool causal = false;
  int64_t window = 0;             // keep the `window` most recent keys incl. self; 0 = off
  TensorView k_lens;              // [batch] INT32/INT64, keys at j >= k_lens[b] masked
  TensorView k_starts;            // [batch] INT32/INT64, keys at j < k_starts[b] masked
  DType dtype = DType::kFloat32;  // of the built bias when no logits are given
};

struct BiasPlan {
  BiasForm form = BiasForm::kCausal;
  DType dtype = DType::kFloat32;
  bool add_to_logits = false;
  int64_t batch = 1, num_heads = 0, q_len = 0, k_len = 0, q_offset = 0;
  bool causal = false;
  int64_t window = 0;
  std::vector<double> slopes;     // [num_heads]
  std::vector<int64_t> k_lens;    // [batch]; k_len when not given
  std::vector<int64_t> k_starts;  // [batch], each <= k_lens[b]; 0 when not given

  int64_t NumElements() const { return batch * num_heads * q_len * k_len; }
  bool empty() const { return NumElements() == 0; }
};

// `logits`, when present, is [batch, heads, q_len, k_len] and receives b added
// in place; otherwise the caller allocates NumElements() of options.dtype,
// reserved through `reserve` as PlanCost::output_bytes before the plan
// allocates anything. Shapes within posenc/limits.h; |slopes| <= 1e3;
// |q_offset| <= 2^31.
[[nodiscard]] absl::StatusOr<BiasPlan> PlanAttentionBias(const BiasOptions& options,
                                                         const TensorView& logits,
                                                         const ReserveFn& reserve = {});

}  // namespace posenc

#endif  // POSENC_ATTENTION_BIAS_H_
