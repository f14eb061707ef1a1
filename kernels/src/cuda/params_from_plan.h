// Kernel parameters from a plan: the one mapping the CUDA backend and the
// host emulation of its grid both use, so a test of the emulation tests what
// the GPU is given. Host only; the caller places the arrays (device memory
// for the GPU, host memory for the emulation) and passes their addresses.
#ifndef POSENC_KERNELS_CUDA_PARAMS_FROM_PLAN_H_
#define POSENC_KERNELS_CUDA_PARAMS_FROM_PLAN_H_

#include <cstdint>
#include <vector>

#include "kernel_params.h"
#include "posenc/absolute.h"
#include "posenc/attention_bias.h"
#include "posenc/rope.h"

namespace posenc::cuda {

// The frequency set of every token, when the plan has more than one
// (length-dependent scalings); empty otherwise.
inline std::vector<int32_t> TokenFreqSets(const RopePlan& plan) {
  std::vector<int32_t> sets;
  if (plan.num_freq_sets > 1) {
    sets.resize(plan.num_tokens);
    for (int64_t t = 0; t < plan.num_tokens; ++t) sets[t] = plan.FreqSetOfToken(t);
  }
  return sets;
}

// Where the arrays a RoPE launch reads live (copies of the plan's vectors,
// and TokenFreqSets, or nullptr when that is empty).
struct RopeArrays {
  void* query;
  void* key;  // nullptr when the plan has no key
  const int64_t* positions;
  const int32_t* token_freq_set;
  const double* inv_freq;
  const double* attention_scale;
  const int32_t* slot_axis;
};

inline RopeParams MakeRopeParams(const RopePlan& plan, const RopeArrays& a) {
  RopeParams p{};
  p.query = a.query;
  p.key = plan.has_key ? a.key : nullptr;
  p.positions = a.positions;
  p.token_freq_set = a.token_freq_set;
  p.inv_freq = a.inv_freq;
  p.attention_scale = a.attention_scale;
  p.slot_axis = a.slot_axis;
  p.num_tokens = plan.num_tokens;
  p.seq_len = plan.seq_len;
  p.dtype = plan.dtype;
  p.layout = plan.layout;
  p.style = plan.style;
  p.inverse = plan.inverse;
  p.query_heads = static_cast<int>(plan.query_heads);
  p.key_heads = static_cast<int>(plan.key_heads);
  p.head_dim = static_cast<int>(plan.head_dim);
  p.rotary_dim = static_cast<int>(plan.rotary_dim);
  p.num_axes = plan.num_axes;
  return p;
}

// `x` holds the tensor (or receives the table); `table` is the learned
// table's float32 values, or nullptr for sinusoidal (then `sinusoidal` holds
// the plan's arrays, with frequencies = plan.omega.size()).
inline AbsoluteParams MakeAbsoluteParams(const AbsolutePlan& plan, void* x,
                                         const int64_t* positions,
                                         const SinusoidalTables& sinusoidal, const float* table) {
  AbsoluteParams p{};
  p.x = x;
  p.positions = positions;
  if (table == nullptr) p.sinusoidal = sinusoidal;
  p.table = table;
  p.num_tokens = plan.num_tokens;
  p.dim = plan.dim;
  p.dtype = plan.dtype;
  p.interleaved = plan.options.sinusoidal_layout == SinusoidalLayout::kInterleaved;
  p.has_input = plan.has_input;
  p.x_scale = plan.options.x_scale;
  return p;
}

inline BiasParams MakeBiasParams(const BiasPlan& plan, void* out, const double* slopes,
                                 const int64_t* k_lens, const int64_t* k_starts) {
  BiasParams p{};
  p.out = out;
  p.slopes = slopes;
  p.k_lens = k_lens;
  p.k_starts = k_starts;
  p.batch = plan.batch;
  p.heads = plan.num_heads;
  p.q_len = plan.q_len;
  p.k_len = plan.k_len;
  p.q_offset = plan.q_offset;
  p.window = plan.window;
  p.row_begin = 0;
  p.row_count = plan.batch * plan.num_heads * plan.q_len;
  p.dtype = plan.dtype;
  p.form = plan.form;
  p.causal = plan.causal;
  p.add_to_logits = plan.add_to_logits;
  return p;
}

}  // namespace posenc::cuda

#endif  // POSENC_KERNELS_CUDA_PARAMS_FROM_PLAN_H_
