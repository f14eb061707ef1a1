#include <cmath>

#include "absl/strings/str_cat.h"
#include "posenc/absolute.h"
#include "posenc/status_macros.h"

namespace posenc {
namespace {

absl::Status ResolveSource(const AbsoluteOptions& o, int64_t dim, AbsolutePlan& p) {
  if (o.kind == AbsoluteOptions::Kind::kLearned) {
    if (o.table == nullptr) return absl::InvalidArgumentError("table_name is required");
    if (o.table->dim != dim) {
      return absl::InvalidArgumentError(absl::StrCat("table '", o.table->name, "' has dim ",
                                                     o.table->dim, " but x has d = ", dim));
    }
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
  if (!(std::isfinite(o.base) && o.base > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("base must be a finite number > 0, got ", o.base));
  }
  const int64_t half = dim / 2;
  p.omega.resize(half);
  switch (o.sinusoidal_layout) {
    case SinusoidalLayout::kInterleaved:
      for (int64_t i = 0; i < half; ++i) {
        p.omega[i] = std::pow(o.base, -static_cast<double>(2 * i) / static_cast<double>(dim));
      }
      break;
    case SinusoidalLayout::kConcatenated:
      if (dim != 0 && half < 2) {
        return absl::InvalidArgumentError(absl::StrCat(
            "CONCATENATED sinusoidal needs d >= 4 (w_i = base^(-i/(d/2-1))), got d = ", dim));
      }
      for (int64_t i = 0; i < half; ++i) {
        p.omega[i] = std::pow(o.base, -static_cast<double>(i) / static_cast<double>(half - 1));
      }
      break;
    default:
      return absl::InvalidArgumentError("sinusoidal layout must be INTERLEAVED or CONCATENATED");
  }
  // The angle reduction is exact to float precision while |pos * w| < 2^31
  // (w <= 1 always holds for base >= 1).
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

absl::StatusOr<AbsolutePlan> PlanAbsolute(const AbsoluteOptions& o, const AbsoluteTensors& t) {
  if (!t.x.present()) return absl::InvalidArgumentError("x is required");
  if (!IsFloating(t.x.dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("x.dtype must be FLOAT32, FLOAT16 or BFLOAT16, got ", DTypeName(t.x.dtype)));
  }
  POSENC_RETURN_IF_ERROR(ValidateTensorBytes("x", t.x.dtype, t.x.shape, t.x.nbytes));
  if (!std::isfinite(o.x_scale)) {
    return absl::InvalidArgumentError(absl::StrCat("x_scale must be finite, got ", o.x_scale));
  }
  AbsolutePlan p;
  p.options = o;
  p.dtype = t.x.dtype;
  TokenLayout layout;
  if (t.x.rank() == 3) {
    if (t.cu_seqlens.present()) {
      return absl::InvalidArgumentError(
          "cu_seqlens is only for packed x [tokens, d]; x [batch, seq, d] is padded");
    }
    layout = PaddedLayout(t.x.shape[0], t.x.shape[1]);
    p.dim = t.x.shape[2];
  } else if (t.x.rank() == 2) {
    POSENC_ASSIGN_OR_RETURN(layout, PackedLayout(t.cu_seqlens, t.x.shape[0]));
    p.dim = t.x.shape[1];
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "x.shape must be [batch, seq, d] or [tokens, d], got ", ShapeString(t.x.shape)));
  }
  p.num_tokens = layout.num_tokens;
  POSENC_ASSIGN_OR_RETURN(p.positions, ResolvePositions(layout, t.positions, 1));
  POSENC_RETURN_IF_ERROR(ResolveSource(o, p.dim, p));
  return p;
}

absl::StatusOr<AbsolutePlan> PlanEncodingTable(const AbsoluteOptions& o, int64_t dim, DType dtype,
                                               const TensorView& positions, int64_t count) {
  if (!IsFloating(dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype must be FLOAT32, FLOAT16 or BFLOAT16, got ", DTypeName(dtype)));
  }
  if (dim < 0) return absl::InvalidArgumentError(absl::StrCat("dim must be >= 0, got ", dim));
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
  } else if (count < 0) {
    return absl::InvalidArgumentError(absl::StrCat("count must be >= 0, got ", count));
  }
  TensorView no_cu;
  POSENC_ASSIGN_OR_RETURN(TokenLayout layout, PackedLayout(no_cu, n));
  p.num_tokens = n;
  POSENC_ASSIGN_OR_RETURN(p.positions, ResolvePositions(layout, in, 1));
  POSENC_RETURN_IF_ERROR(ResolveSource(o, dim, p));
  return p;
}

}  // namespace posenc
