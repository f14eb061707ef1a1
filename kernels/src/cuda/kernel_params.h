// What the GPU kernels are given, and how they are launched: plain structs,
// no CUDA headers, so the same kernel bodies (rope_body.h, absolute_body.h,
// bias_body.h) compile for the GPU (nvcc, *.cu) and for the host, where
// tests emulate the launch grid on host memory. Every pointer is device
// memory on the GPU and host memory under emulation.
#ifndef POSENC_KERNELS_CUDA_KERNEL_PARAMS_H_
#define POSENC_KERNELS_CUDA_KERNEL_PARAMS_H_

#include <cstdint>
#include <initializer_list>

#include "posenc/codes.h"
#include "posenc/dtype.h"

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

// A sinusoidal plan's per-frequency arrays (AbsolutePlan; math/phase.h).
struct SinusoidalTables {
  const double* omega;         // [frequencies]
  const uint64_t* phase_step;  // [frequencies]
  const float* offset_sin;     // [16, frequencies]
  const float* offset_cos;     // [16, frequencies]
  int64_t frequencies;
};

struct AbsoluteParams {
  void* x;                      // [num_tokens, dim], updated in place (or written)
  const int64_t* positions;     // [num_tokens]
  SinusoidalTables sinusoidal;  // all null for learned
  const float* table;           // learned: [rows, dim]; nullptr for sinusoidal
  int64_t num_tokens, dim;
  DType dtype;
  bool interleaved, has_input;
  double x_scale;
  // Launch geometry, chosen by PlanAbsoluteLaunch: a thread owns `width`
  // consecutive channels of `tokens_per_thread` consecutive tokens' rows.
  int width;
  bool vector;
  int threads_per_row, rows_per_block, tokens_per_thread;
};

struct BiasParams {
  void* out;                // [batch, heads, q_len, k_len]
  const double* slopes;     // [heads]
  const int64_t* k_lens;    // [batch]
  const int64_t* k_starts;  // [batch]
  int64_t batch, heads, q_len, k_len, q_offset, window;
  // The rows [row_begin, row_begin + row_count) of the batch x heads x q_len
  // rows, with `out` at row row_begin (a chunk of a staged call); 0 and all
  // of them for a whole call.
  int64_t row_begin, row_count;
  DType dtype;
  BiasForm form;
  bool causal, add_to_logits;
  // Launch geometry, chosen by PlanBiasLaunch: a thread owns `width`
  // consecutive keys of one row (batch, head, query).
  int width;
  bool vector;
  int threads_per_row, rows_per_block;
};

// The largest power of two, at most 16, that divides every address given
// (null ones aside): the widest access a kernel may make at multiples of
// its width from them. A caller's tensor in shared device memory may start
// at any element-aligned address, and a vector access the GPU finds
// misaligned is cudaErrorMisalignedAddress, which loses the context.
inline int AddressAlignment(std::initializer_list<const void*> addresses) {
  uintptr_t bits = 16;
  for (const void* a : addresses) bits |= reinterpret_cast<uintptr_t>(a);
  return static_cast<int>(bits & (~bits + 1));
}

// The widest run of consecutive elements (at most 16 bytes, a power of two,
// and at most `alignment` bytes: AddressAlignment of the row's tensors) that
// divides `n`: what one thread moves as one access along a row of n.
inline int WidestWidth(DType dtype, int64_t n, int alignment = 16) {
  const int es = dtype == DType::kFloat32 ? 4 : 2;
  for (int width = 8; width > 1; width /= 2) {
    if (width * es <= 16 && width * es <= alignment && n % width == 0) return width;
  }
  return 1;
}
// Whether a run of `width` elements is moved as one aligned access.
inline bool VectorWidth(DType dtype, int width) {
  return width > 1 && (width * (dtype == DType::kFloat32 ? 4 : 2)) % 4 == 0;
}

// The dispatch of the element-wise kernels (absolute encodings, biases):
// visitor.template Run<T, kWidth, kVector>() for the dtype and width, false
// (nothing run) for values WidestWidth and VectorWidth never give.
template <typename Visitor>
bool VisitByWidth(DType dtype, int width, bool vector, Visitor& visitor) {
  auto by_width = [&](auto type_tag) -> bool {
    using T = typename decltype(type_tag)::type;
    switch (width) {
      case 1:
        visitor.template Run<T, 1, false>();
        return true;
      case 2:
        if (vector) visitor.template Run<T, 2, true>();
        return vector;
      case 4:
        if (vector) visitor.template Run<T, 4, true>();
        return vector;
      case 8:
        if constexpr (sizeof(T) == 2) {
          if (vector) visitor.template Run<T, 8, true>();
          return vector;
        }
        return false;
      default:
        return false;
    }
  };
  switch (dtype) {
    case DType::kFloat32:
      return by_width(TypeTag<float>());
    case DType::kFloat16:
      return by_width(TypeTag<Half>());
    case DType::kBFloat16:
      return by_width(TypeTag<BFloat16>());
    default:
      return false;
  }
}

}  // namespace posenc::cuda

#endif  // POSENC_KERNELS_CUDA_KERNEL_PARAMS_H_
