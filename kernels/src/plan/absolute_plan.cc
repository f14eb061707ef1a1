#include <cmath>

#include "absl/strings/str_cat.h"
#include "math/phase.h"
#include "plan/checked_math.h"
#include "posenc/absolute.h"
#include "posenc/limits.h"
#include "posenc/status_macros.h"

namespace posenc {
namespace {

// Options that do not depend on positions: checked before anything is
// reserved or resolved.
absl::Status CheckSource(const AbsoluteOptions& o, int64_t dim) {
  if (o.kind == AbsoluteOptions::Kind::kLearned) {
    if (o.table == nullptr) return absl::InvalidArgumentError("table_name is required");
    if (o.table->dim != dim) {
      return absl::InvalidArgumentError(absl::StrCat("table '", o.table->name, "' has dim ",
                                                     o.table->dim, " but x has d = ", dim));
    }
    return absl::OkStatus();
  }
  // base > 1 keeps every w_i in (0, 1].
  POSENC_RETURN_IF_ERROR(CheckFiniteInRange("base", o.base, 1.0, kMaxBase));
  if (o.sinusoidal_layout != SinusoidalLayout::kInterleaved &&
      o.sinusoidal_layout != SinusoidalLayout::kConcatenated) {
    return absl::InvalidArgumentError("sinusoidal layout must be INTERLEAVED or CONCATENATED");
  }
  if (o.sinusoidal_layout == SinusoidalLayout::kConcatenated && dim != 0 && dim / 2 < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CONCATENATED sinusoidal needs d >= 4 (w_i = base^(-i/(d/2-1))), got d = ", dim));
  }
  return absl::OkStatus();
}

// Memory the plan will hold: resolved positions and, per sinusoidal
// frequency, omega and phase_step (8 bytes each) and 16 offsets' sin and cos
// (4 bytes each).
int64_t PlanBytes(int64_t tokens, int64_t sequences, int64_t dim) {
  return ResolvedPositionsBytes(tokens, sequences, 1) +
         ((dim + 1) / 2) * (16 + 8 * internal::kPhaseAnchorStride);
}

// Positions and the sinusoidal tables (omega, phase steps, anchor sin and
// cos) are what a GPU stages: copies of what the plan holds.
int64_t DeviceSideBytes(int64_t plan_bytes) { return plan_bytes + 5 * kDeviceSidePadding; }

absl::Status ResolveSource(const AbsoluteOptions& o, int64_t dim, AbsolutePlan& p) {
  POSENC_RETURN_IF_ERROR(CheckSource(o, dim));
  if (o.kind == AbsoluteOptions::Kind::kLearned) {
    for (int64_t t = 0; t < p.num_tokens; ++t) {
      const int64_t pos = p.positions.values[t];
      if (pos < 0 || pos >= o.table->rows) {
        return absl::InvalidArgumentError(
            absl::StrCat("position ", pos, " of token ", t, " is outside table '", o.table->name,
                         "' of length ", o.table->rows, " (valid positions: 0..", o.table->rows - 1,
                         "; learned tables do not extrapolate)"));
      }
    }
    return absl::OkStatus();
  }
  const int64_t half = dim / 2;
  switch (o.sinusoidal_layout) {
    case SinusoidalLayout::kInterleaved:
      // Odd d: channel d - 1 is sin(p w_((d-1)/2)), as the formula (and
      // DistilBERT's create_sinusoidal_embeddings) says: one more frequency.
      p.omega.resize((dim + 1) / 2);
      for (int64_t i = 0; i < (dim + 1) / 2; ++i) {
        p.omega[i] = std::pow(o.base, -static_cast<double>(2 * i) / static_cast<double>(dim));
      }
      break;
    case SinusoidalLayout::kConcatenated:
      p.omega.resize(half);
      for (int64_t i = 0; i < half; ++i) {
        p.omega[i] = std::pow(o.base, -static_cast<double>(i) / static_cast<double>(half - 1));
      }
      break;
    default:
      return absl::InvalidArgumentError("sinusoidal layout must be INTERLEAVED or CONCATENATED");
  }
  const int64_t frequencies = static_cast<int64_t>(p.omega.size());
  p.phase_step.resize(frequencies);
  for (int64_t i = 0; i < frequencies; ++i) p.phase_step[i] = internal::PhaseStepOf(p.omega[i]);
  p.offset_sin.resize(frequencies * internal::kPhaseAnchorStride);
  p.offset_cos.resize(frequencies * internal::kPhaseAnchorStride);
  internal::BuildOffsetTable(p.omega.data(), frequencies, p.offset_sin.data(), p.offset_cos.data());
  // The float64 angle reduction of the few recomputed 16-bit elements is
  // exact to float precision while |pos * w| < 2^31 (w <= 1 always holds for
  // base > 1); the kernels' phases need |pos| < 2^32.
  double max_omega = 0;
  for (double w : p.omega) max_omega = std::max(max_omega, w);
  if (static_cast<double>(p.positions.max_abs_position) * max_omega > 2147483648.0) {
    return absl::InvalidArgumentError(
        absl::StrCat("largest |position| x frequency must be <= 2^31, got position ",
                     p.positions.max_abs_position, " with base ", o.base));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<AbsolutePlan> PlanAbsolute(const AbsoluteOptions& o, const AbsoluteTensors& t,
                                          const ReserveFn& reserve) {
  if (!t.x.present()) return absl::InvalidArgumentError("x is required");
  if (!IsFloating(t.x.dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("x.dtype must be FLOAT32, FLOAT16 or BFLOAT16, got ", DTypeName(t.x.dtype)));
  }
  POSENC_RETURN_IF_ERROR(ValidateTensorBytes("x", t.x.dtype, t.x.shape, t.x.nbytes));
  POSENC_RETURN_IF_ERROR(CheckFiniteInRange("x_scale", o.x_scale, -kMaxXScale, kMaxXScale,
                                            /*lo_inclusive=*/true));
  AbsolutePlan p;
  p.options = o;
  p.dtype = t.x.dtype;
  TokenLayout layout;
  if (t.x.rank() == 3) {
    if (t.cu_seqlens.present()) {
      return absl::InvalidArgumentError(
          "cu_seqlens is only for packed x [tokens, d]; x [batch, seq, d] is padded");
    }
    const int64_t batch = t.x.shape[0], seq = t.x.shape[1];
    POSENC_RETURN_IF_ERROR(CheckDimension("x.shape[0] (batch)", batch, kMaxSequences));
    POSENC_RETURN_IF_ERROR(CheckDimension("x.shape[1] (seq)", seq, kMaxTokens));
    int64_t tokens = 0;
    if (!CheckedMul(batch, seq, &tokens) || tokens > kMaxTokens) {
      return absl::InvalidArgumentError(absl::StrCat("x.shape ", ShapeString(t.x.shape),
                                                     " has more than ", kMaxTokens, " tokens"));
    }
    layout = PaddedLayout(batch, seq);
    p.dim = t.x.shape[2];
  } else if (t.x.rank() == 2) {
    POSENC_RETURN_IF_ERROR(CheckDimension("x.shape[0] (tokens)", t.x.shape[0], kMaxTokens));
    POSENC_ASSIGN_OR_RETURN(layout, PackedLayout(t.cu_seqlens, t.x.shape[0]));
    p.dim = t.x.shape[1];
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "x.shape must be [batch, seq, d] or [tokens, d], got ", ShapeString(t.x.shape)));
  }
  POSENC_RETURN_IF_ERROR(
      CheckDimension(absl::StrCat("x.shape[", t.x.rank() - 1, "] (d)"), p.dim, kMaxDim));
  POSENC_RETURN_IF_ERROR(CheckSource(o, p.dim));
  p.num_tokens = layout.num_tokens;
  if (p.empty()) {
    POSENC_RETURN_IF_ERROR(CheckPositionInputs(layout, t.positions, 1));
    p.num_tokens = 0;
    return p;
  }
  if (reserve) {
    const int64_t plan_bytes = PlanBytes(p.num_tokens, layout.num_sequences, p.dim);
    POSENC_RETURN_IF_ERROR(reserve(PlanCost{plan_bytes, 0, DeviceSideBytes(plan_bytes)}));
  }
  POSENC_ASSIGN_OR_RETURN(p.positions, ResolvePositions(layout, t.positions, 1));
  POSENC_RETURN_IF_ERROR(ResolveSource(o, p.dim, p));
  return p;
}

absl::StatusOr<AbsolutePlan> PlanEncodingTable(const AbsoluteOptions& o, int64_t dim, DType dtype,
                                               const TensorView& positions, int64_t count,
                                               const ReserveFn& reserve) {
  if (!IsFloating(dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype must be FLOAT32, FLOAT16 or BFLOAT16, got ", DTypeName(dtype)));
  }
  POSENC_RETURN_IF_ERROR(CheckDimension("dim", dim, kMaxDim));
  AbsolutePlan p;
  p.options = o;
  p.dtype = dtype;
  p.dim = dim;
  p.has_input = false;
  PositionInputs in;
  int64_t n = count;
  if (positions.present()) {
    if (positions.rank() != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("positions.shape must be [n], got ", ShapeString(positions.shape)));
    }
    n = positions.shape[0];
    in.position_ids = positions;
    POSENC_RETURN_IF_ERROR(CheckDimension("positions.shape[0]", n, kMaxTokens));
  } else {
    POSENC_RETURN_IF_ERROR(CheckDimension("count", count, kMaxTokens));
  }
  POSENC_RETURN_IF_ERROR(CheckSource(o, dim));
  TensorView no_cu;
  POSENC_ASSIGN_OR_RETURN(TokenLayout layout, PackedLayout(no_cu, n));
  POSENC_RETURN_IF_ERROR(CheckPositionInputs(layout, in, 1));
  p.num_tokens = n;
  // n <= 2^28 and dim <= 2^16, so the byte count is exact.
  const int64_t out_bytes = n * dim * static_cast<int64_t>(SizeOf(dtype));
  if (reserve) {
    const int64_t plan_bytes = p.empty() ? 0 : PlanBytes(n, 1, dim);
    POSENC_RETURN_IF_ERROR(reserve(PlanCost{plan_bytes, out_bytes, DeviceSideBytes(plan_bytes)}));
  }
  if (p.empty()) {
    p.num_tokens = n;  // the caller still returns an [n, dim] table
    return p;
  }
  POSENC_ASSIGN_OR_RETURN(p.positions, ResolvePositions(layout, in, 1));
  POSENC_RETURN_IF_ERROR(ResolveSource(o, dim, p));
  return p;
}

}  // namespace posenc
