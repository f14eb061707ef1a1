// Rotary position embedding (SPEC §2.1): options, planning and the plan every
// backend executes.
//
// Planning (PlanRope) validates shapes and options, resolves positions and
// frequencies once on the host in float64, and produces a RopePlan. Backends
// only execute plans, so every backend computes the same function.
#ifndef POSENC_ROPE_H_
#define POSENC_ROPE_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "posenc/codes.h"
#include "posenc/plan_cost.h"
#include "posenc/positions.h"
#include "posenc/tensor.h"

namespace posenc {

// RopeLayout and RopeStyle are in codes.h (the CUDA kernels use them).
enum class ScalingType : int {
  kNone = 1,
  kLinear = 2,
  kDynamicNtk = 3,
  kYarn = 4,
  kLlama3 = 5,
  kLongRope = 6,
  kExplicit = 7,
};
enum class LongRopeMode : int { kBySequenceLength = 1, kShort = 2, kLong = 3 };
enum class AxisMode : int {
  kSingle = 1,            // one position axis
  kAxial = 2,             // slots split among axes, per-axis frequencies
  kMrope = 3,             // Qwen2-VL M-RoPE: contiguous sections
  kMropeInterleaved = 4,  // Qwen3-VL: sections interleaved slot by slot
};

// Frequency scaling; defaults follow HF transformers modeling_rope_utils.py.
// Unset optionals take the per-type defaults documented in the proto.
struct RopeScaling {
  ScalingType type = ScalingType::kNone;
  std::optional<double> factor;
  std::optional<int64_t> original_max_position;
  // YaRN
  std::optional<double> beta_fast, beta_slow;
  std::optional<double> mscale, mscale_all_dim;
  bool truncate = true;
  // YaRN, LongRoPE and explicit: overrides the attention scale s.
  std::optional<double> attention_factor;
  // Llama 3
  std::optional<double> low_freq_factor, high_freq_factor;
  // LongRoPE: R/2 values each.
  std::vector<double> short_factor, long_factor;
  LongRopeMode longrope_mode = LongRopeMode::kBySequenceLength;
  // Explicit: R/2 inverse frequencies.
  std::vector<double> inv_freq;
};

struct RopeOptions {
  RopeLayout layout = RopeLayout::kBSHD;
  RopeStyle style = RopeStyle::kNeox;
  int64_t rotary_dim = 0;  // 0 means head_dim
  double base = 10000.0;
  bool inverse = false;
  RopeScaling scaling;
  AxisMode axis_mode = AxisMode::kSingle;
  std::vector<int64_t> axis_dims;  // kAxial: rotary dims per axis, summing to R
  std::vector<int64_t> sections;   // kMrope*: slots per axis, summing to R/2
};

struct RopeTensors {
  // [batch, seq, heads, head_dim] (BSHD), [batch, heads, seq, head_dim] (BHSD)
  // or [tokens, heads, head_dim] (THD). Rotated in place.
  MutableTensor query;
  MutableTensor key;  // optional; may have another head count (GQA / MQA)
  PositionInputs positions;
  TensorView cu_seqlens;  // THD only: [batch + 1]
};

struct RopePlan {
  RopeLayout layout = RopeLayout::kBSHD;
  RopeStyle style = RopeStyle::kNeox;
  DType dtype = DType::kFloat32;
  bool inverse = false;
  bool has_key = false;
  int64_t num_tokens = 0;
  int64_t seq_len = 0;  // padded layouts: tokens per sequence
  int64_t query_heads = 0, key_heads = 0, head_dim = 0, rotary_dim = 0;
  int num_axes = 1;

  ResolvedPositions positions;
  // Frequency sets: most requests have one; length-dependent scalings have
  // one per sequence so batching never changes a request's result.
  int num_freq_sets = 1;
  std::vector<double> inv_freq;            // [num_freq_sets, rotary_dim / 2]
  std::vector<double> attention_scale;     // [num_freq_sets]
  std::vector<int32_t> sequence_freq_set;  // [num_sequences]
  std::vector<int32_t> slot_axis;          // [rotary_dim / 2]

  int64_t half() const { return rotary_dim / 2; }
  bool empty() const {
    return num_tokens == 0 || rotary_dim == 0 || (query_heads == 0 && key_heads == 0);
  }
  int FreqSetOfToken(int64_t t) const { return sequence_freq_set[positions.token_sequence[t]]; }
};

// Validates `tensors` against `options` (shapes within posenc/limits.h,
// every parameter in its range) and resolves everything a backend needs.
// Errors are INVALID_ARGUMENT naming the field (e.g. "rotary_dim must be
// even, got 63"). `reserve`, when given, is asked for the plan's memory
// before it is allocated (see plan_cost.h). An empty query (no elements)
// gives an empty plan without resolved positions.
[[nodiscard]] absl::StatusOr<RopePlan> PlanRope(const RopeOptions& options,
                                                const RopeTensors& tensors,
                                                const ReserveFn& reserve = {});

struct FrequencySet {
  std::vector<double> inv_freq;  // [rotary_dim / 2]
  double attention_scale = 1.0;
  std::vector<int32_t> slot_axis;  // [rotary_dim / 2]
};

// Frequencies for one sequence of length `seq_len` (largest position + 1;
// used only by dynamic NTK and LongRoPE). Exposed for tests and the client.
[[nodiscard]] absl::StatusOr<FrequencySet> ResolveFrequencies(const RopeOptions& options,
                                                              int64_t rotary_dim, int64_t seq_len);

// Number of position axes the options imply (1, or the count of axis_dims /
// sections). REQUIRES: CheckAxisCount(options) is OK.
int NumPositionAxes(const RopeOptions& options);

// INVALID_ARGUMENT when axis_dims / sections name more than kMaxAxes axes.
[[nodiscard]] absl::Status CheckAxisCount(const RopeOptions& options);

}  // namespace posenc

#endif  // POSENC_ROPE_H_
