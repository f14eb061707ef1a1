// Device-side parameter blocks and kernel launchers of the CUDA backend.
// Plain structs and cudaError_t only: no absl or STL, so nvcc sees nothing
// but CUDA. Every pointer here is device memory.
#ifndef POSENC_KERNELS_CUDA_KERNELS_H_
#define POSENC_KERNELS_CUDA_KERNELS_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace posenc::cuda {

// dtype codes match posenc::DType.
enum : int { kF32 = 1, kF16 = 2, kBF16 = 3 };
enum : int { kBSHD = 1, kBHSD = 2, kTHD = 3 };
enum : int { kNeox = 1, kGptj = 2 };

struct RopeParams {
  void* query;                    // [batch, seq, Hq, D] / [batch, Hq, seq, D] / [tokens, Hq, D]
  void* key;                      // same with Hk heads, or nullptr
  const int64_t* positions;       // [num_tokens, num_axes]
  const int32_t* token_freq_set;  // [num_tokens], or nullptr when one set
  const double* inv_freq;         // [num_freq_sets, rotary_dim / 2]
  const double* attention_scale;  // [num_freq_sets]
  const int32_t* slot_axis;       // [rotary_dim / 2]
  int64_t num_tokens;
  int64_t seq_len;  // BHSD: tokens per sequence
  int dtype, layout, style, inverse;
  int query_heads, key_heads, head_dim, rotary_dim, num_axes;
};
cudaError_t LaunchRope(const RopeParams& p, cudaStream_t stream);

struct AbsoluteParams {
  void* x;                   // [num_tokens, dim], updated in place (or written)
  const int64_t* positions;  // [num_tokens]
  const double* omega;       // sinusoidal: [dim / 2]; nullptr for learned
  const float* table;        // learned: [rows, dim]; nullptr for sinusoidal
  int64_t num_tokens, dim;
  int dtype, interleaved, has_input;
  double x_scale;
};
cudaError_t LaunchAbsolute(const AbsoluteParams& p, cudaStream_t stream);

struct BiasParams {
  void* out;              // [batch, heads, q_len, k_len]
  const double* slopes;   // [heads]
  const int64_t* k_lens;  // [batch]
  int64_t batch, heads, q_len, k_len, q_offset, window;
  int dtype, form, causal, add_to_logits;  // form: 1 none, 2 causal, 3 symmetric
};
cudaError_t LaunchBias(const BiasParams& p, cudaStream_t stream);

}  // namespace posenc::cuda

#endif  // POSENC_KERNELS_CUDA_KERNELS_H_
