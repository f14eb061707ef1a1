// What the GPU kernels are given, and how they are launched: plain structs,
// no CUDA headers, so the same kernel bodies (rope_body.h, absolute_body.h,
// bias_body.h) compile for the GPU (nvcc, *.cu) and for the host, where
// tests emulate the launch grid on host memory. Every pointer is device
// memory on the GPU and host memory under emulation.
#ifndef POSENC_KERNELS_CUDA_KERNEL_PARAMS_H_
#define POSENC_KERNELS_CUDA_KERNEL_PARAMS_H_

#include <cstdint>

#include "posenc/codes.h"

namespace posenc::cuda {

// blockIdx / threadIdx / gridDim / blockDim, without CUDA's types.
struct Coord {
  unsigned x = 1, y = 1, z = 1;
};
struct LaunchShape {
  Coord grid, block;
  bool empty() const { return grid.x == 0 || grid.y == 0 || block.x == 0; }
};

// Carries a type through generic lambdas of the variant dispatchers.
template <typename T>
struct TypeTag {
  using type = T;
};

// Launches spread over at least this many blocks per SM when they can: one
// token of a decode step is split by heads across the GPU.
inline constexpr int kBlocksPerSm = 2;
inline constexpr int kThreadsPerBlock = 256;

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
  DType dtype;
  RopeLayout layout;
  RopeStyle style;
  bool inverse;
  int query_heads, key_heads, head_dim, rotary_dim, num_axes;
  // Launch geometry, chosen by PlanRopeLaunch. A thread owns a slice of
  // `pairs_per_slice` pairs of one token (one 16-byte access or less) and
  // rotates it in every head of its head group.
  int pairs_per_slice;
  bool vector;  // slices are moved as one aligned access
  int threads_per_token, tokens_per_block, heads_per_group;
};

struct AbsoluteParams {
  void* x;                   // [num_tokens, dim], updated in place (or written)
  const int64_t* positions;  // [num_tokens]
  const double* omega;       // sinusoidal: [dim / 2]; nullptr for learned
  const float* table;        // learned: [rows, dim]; nullptr for sinusoidal
  int64_t num_tokens, dim;
  DType dtype;
  bool interleaved, has_input;
  double x_scale;
  // Launch geometry, chosen by PlanAbsoluteLaunch: a thread owns `width`
  // consecutive channels of one token's row.
  int width;
  bool vector;
  int threads_per_row, rows_per_block;
};

struct BiasParams {
  void* out;              // [batch, heads, q_len, k_len]
  const double* slopes;   // [heads]
  const int64_t* k_lens;  // [batch]
  int64_t batch, heads, q_len, k_len, q_offset, window;
  DType dtype;
  BiasForm form;
  bool causal, add_to_logits;
  // Launch geometry, chosen by PlanBiasLaunch: a thread owns `width`
  // consecutive keys of one row (batch, head, query).
  int width;
  bool vector;
  int threads_per_row, rows_per_block;
};

}  // namespace posenc::cuda

#endif  // POSENC_KERNELS_CUDA_KERNEL_PARAMS_H_
