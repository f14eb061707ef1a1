// Absolute position encodings (SPEC §2.2, §2.3): y = x * x_scale + PE[pos],
// with PE sinusoidal or a learned table.
#ifndef POSENC_ABSOLUTE_H_
#define POSENC_ABSOLUTE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "posenc/codes.h"
#include "posenc/plan_cost.h"
#include "posenc/positions.h"
#include "posenc/tensor.h"

namespace posenc {

// A learned table T [rows, dim], kept in float32 (exact for f16/bf16 sources).
struct LearnedTable {
  std::string name;
  int64_t rows = 0;
  int64_t dim = 0;
  DType source_dtype = DType::kFloat32;
  std::vector<float> values;  // [rows, dim]
};

struct AbsoluteOptions {
  enum class Kind { kSinusoidal, kLearned } kind = Kind::kSinusoidal;
  SinusoidalLayout sinusoidal_layout = SinusoidalLayout::kInterleaved;
  double base = 10000.0;
  double x_scale = 1.0;
  std::shared_ptr<const LearnedTable> table;  // kLearned
  // kLearned, as a request names it. A local kernel call sets `table` and
  // leaves this empty; it is here because the client and the server speak
  // the library's options for requests, and the server resolves the name
  // into `table` from its repository.
  std::string table_name;
};

struct AbsoluteTensors {
  // [batch, seq, d] or [tokens, d]; updated in place. When absent (a table
  // request) `out` receives PE itself.
  MutableTensor x;
  PositionInputs positions;
  TensorView cu_seqlens;  // [tokens, d] only
};

struct AbsolutePlan {
  AbsoluteOptions options;
  DType dtype = DType::kFloat32;
  int64_t num_tokens = 0;
  int64_t dim = 0;
  ResolvedPositions positions;
  bool has_input = true;      // false: write PE (x treated as zero, x_scale ignored)
  std::vector<double> omega;  // sinusoidal: [(d + 1) / 2 or d / 2] angular frequencies
  // sinusoidal: omega[i] / (2 pi) as a 64-bit fraction of a turn, so that
  // pos * phase_step[i] mod 2^64 is the phase of pos * omega[i] in turns.
  std::vector<uint64_t> phase_step;
  // sinusoidal: sin(k omega[i]) and cos(k omega[i]) for k in [0, 16),
  // [k][i]: the offsets from each position's anchor (kernels' math/phase.h).
  std::vector<float> offset_sin, offset_cos;

  bool empty() const { return num_tokens == 0 || dim == 0; }
};

// Validates x and the options (shapes within posenc/limits.h, base in (1,
// 1e18], |x_scale| <= 1e6) and resolves positions. `reserve`, when given,
// is asked for the plan's memory first (plan_cost.h).
[[nodiscard]] absl::StatusOr<AbsolutePlan> PlanAbsolute(const AbsoluteOptions& options,
                                                        const AbsoluteTensors& tensors,
                                                        const ReserveFn& reserve = {});

// A plan that writes PE rows for the given positions ([n] INT32/INT64) or for
// 0..count-1 when positions is absent, into an [n, dim] tensor of `dtype`
// that the caller allocates: n * dim * SizeOf(dtype) bytes, reserved through
// `reserve` as PlanCost::output_bytes before the plan allocates anything.
[[nodiscard]] absl::StatusOr<AbsolutePlan> PlanEncodingTable(const AbsoluteOptions& options,
                                                             int64_t dim, DType dtype,
                                                             const TensorView& positions,
                                                             int64_t count,
                                                             const ReserveFn& reserve = {});

}  // namespace posenc

#endif  // POSENC_ABSOLUTE_H_
