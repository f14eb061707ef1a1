#include "posenc/positions.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "posenc/status_macros.h"

namespace posenc {
namespace {

absl::Status CheckIntegerTensor(absl::string_view field, const TensorView& t) {
  if (!IsInteger(t.dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".dtype must be INT32 or INT64, got ", DTypeName(t.dtype)));
  }
  return ValidateTensorBytes(field, t.dtype, t.shape, t.nbytes);
}

// How position_ids is indexed: per token (broadcast_batch false) or shared by
// every sequence of a padded layout ([1, seq, ...]).
struct PositionIdShape {
  bool broadcast_batch = false;
};

absl::StatusOr<PositionIdShape> CheckPositionIdShape(const TokenLayout& layout,
                                                     const TensorView& ids, int num_axes) {
  std::vector<int64_t> want;
  std::vector<int64_t> want_broadcast;
  if (layout.padded || (layout.num_tokens == 0 && layout.cu_seqlens.empty())) {
    want = {layout.num_sequences, layout.padded_seq_len};
    want_broadcast = {1, layout.padded_seq_len};
  } else {
    want = {layout.num_tokens};
  }
  const bool padded = want.size() == 2;
  auto with_axes = [&](std::vector<int64_t> s) {
    if (num_axes > 1) s.push_back(num_axes);
    return s;
  };
  auto with_unit_axis = [&](std::vector<int64_t> s) {
    s.push_back(1);
    return s;
  };
  std::vector<std::vector<int64_t>> accepted = {with_axes(want)};
  if (num_axes == 1) accepted.push_back(with_unit_axis(want));
  if (padded) {
    accepted.push_back(with_axes(want_broadcast));
    if (num_axes == 1) accepted.push_back(with_unit_axis(want_broadcast));
  }
  for (size_t i = 0; i < accepted.size(); ++i) {
    if (ids.shape == accepted[i]) {
      PositionIdShape s;
      s.broadcast_batch = padded && i >= (num_axes == 1 ? 2u : 1u) && layout.num_sequences != 1;
      return s;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "position_ids.shape must be ", ShapeString(accepted[0]),
      padded
          ? absl::StrCat(" (or ", ShapeString(with_axes(want_broadcast)), " shared by the batch)")
          : std::string(),
      num_axes > 1 ? absl::StrCat(" with one position per axis (", num_axes, " axes)")
                   : std::string(),
      ", got ", ShapeString(ids.shape)));
}

}  // namespace

TokenLayout PaddedLayout(int64_t batch, int64_t seq_len) {
  TokenLayout l;
  l.padded = true;
  l.num_sequences = batch;
  l.padded_seq_len = seq_len;
  l.num_tokens = batch * seq_len;
  l.cu_seqlens.resize(batch + 1);
  for (int64_t b = 0; b <= batch; ++b) l.cu_seqlens[b] = b * seq_len;
  return l;
}

absl::StatusOr<TokenLayout> PackedLayout(const TensorView& cu_seqlens, int64_t num_tokens) {
  TokenLayout l;
  l.num_tokens = num_tokens;
  if (!cu_seqlens.present()) {
    l.num_sequences = 1;
    l.cu_seqlens = {0, num_tokens};
    return l;
  }
  POSENC_RETURN_IF_ERROR(CheckIntegerTensor("cu_seqlens", cu_seqlens));
  if (cu_seqlens.rank() != 1 || cu_seqlens.shape[0] < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("cu_seqlens.shape must be [batch + 1] with batch >= 0, got ",
                     ShapeString(cu_seqlens.shape)));
  }
  const int64_t n = cu_seqlens.shape[0];
  POSENC_RETURN_IF_ERROR(
      CheckDimension("cu_seqlens.shape[0] - 1 (sequences)", n - 1, kMaxSequences));
  // Each entry is checked before the next is compared with it, so no
  // difference of hostile values is ever formed.
  l.num_sequences = n - 1;
  l.cu_seqlens.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = ReadInteger(cu_seqlens, i);
    if (i == 0 && v != 0) {
      return absl::InvalidArgumentError(absl::StrCat("cu_seqlens[0] must be 0, got ", v));
    }
    if (i > 0 && (v < l.cu_seqlens[i - 1] || v > num_tokens)) {
      return absl::InvalidArgumentError(
          absl::StrCat("cu_seqlens must be non-decreasing and at most the token count ", num_tokens,
                       ", but cu_seqlens[", i, "] = ", v, " after cu_seqlens[", i - 1,
                       "] = ", l.cu_seqlens[i - 1]));
    }
    l.cu_seqlens[i] = v;
  }
  if (l.cu_seqlens[n - 1] != num_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("cu_seqlens[", n - 1,
                                                   "] must equal the token count ", num_tokens,
                                                   ", got ", l.cu_seqlens[n - 1]));
  }
  return l;
}

int64_t ResolvedPositionsBytes(int64_t num_tokens, int64_t num_sequences, int num_axes) {
  // values (int64 per axis) and token_sequence (int32) per token;
  // sequence_length and the layout's cu_seqlens (int64) per sequence.
  return num_tokens * (8 * num_axes + 4) + (num_sequences + 1) * 16;
}

absl::Status CheckPositionInputs(const TokenLayout& layout, const PositionInputs& inputs,
                                 int num_axes) {
  const TensorView& ids = inputs.position_ids;
  const TensorView& offsets = inputs.offsets;
  if (ids.present() && offsets.present()) {
    return absl::InvalidArgumentError(
        "position_ids and offsets are mutually exclusive: send one or neither");
  }
  if (ids.present()) {
    POSENC_RETURN_IF_ERROR(CheckIntegerTensor("position_ids", ids));
    return CheckPositionIdShape(layout, ids, num_axes).status();
  }
  if (offsets.present()) {
    POSENC_RETURN_IF_ERROR(CheckIntegerTensor("offsets", offsets));
    if (offsets.rank() != 1 || offsets.shape[0] != layout.num_sequences) {
      return absl::InvalidArgumentError(
          absl::StrCat("offsets.shape must be [", layout.num_sequences,
                       "] (one per sequence), got ", ShapeString(offsets.shape)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ResolvedPositions> ResolvePositions(const TokenLayout& layout,
                                                   const PositionInputs& inputs, int num_axes) {
  POSENC_RETURN_IF_ERROR(CheckPositionInputs(layout, inputs, num_axes));
  const TensorView& ids = inputs.position_ids;
  const TensorView& offsets = inputs.offsets;
  ResolvedPositions r;
  r.num_axes = num_axes;
  const int64_t T = layout.num_tokens;
  r.values.resize(static_cast<size_t>(T) * num_axes);
  r.token_sequence.resize(T);
  r.sequence_length.assign(layout.num_sequences, 0);
  for (int64_t s = 0; s < layout.num_sequences; ++s) {
    for (int64_t t = layout.cu_seqlens[s]; t < layout.cu_seqlens[s + 1]; ++t) {
      r.token_sequence[t] = static_cast<int32_t>(s);
    }
  }

  if (ids.present()) {
    POSENC_ASSIGN_OR_RETURN(PositionIdShape shape, CheckPositionIdShape(layout, ids, num_axes));
    const int64_t per_seq = layout.padded_seq_len;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t src = shape.broadcast_batch ? t % per_seq : t;
      for (int a = 0; a < num_axes; ++a) {
        r.values[t * num_axes + a] = ReadInteger(ids, src * num_axes + a);
      }
    }
  } else if (offsets.present()) {
    for (int64_t s = 0; s < layout.num_sequences; ++s) {
      const int64_t off = ReadInteger(offsets, s);
      if (off > kMaxAbsPosition || off < -kMaxAbsPosition) {
        return absl::InvalidArgumentError(
            absl::StrCat("offsets[", s, "] = ", off, " is outside [-2^31, 2^31]"));
      }
      for (int64_t t = layout.cu_seqlens[s]; t < layout.cu_seqlens[s + 1]; ++t) {
        for (int a = 0; a < num_axes; ++a) {
          r.values[t * num_axes + a] = off + (t - layout.cu_seqlens[s]);
        }
      }
    }
  } else {
    for (int64_t s = 0; s < layout.num_sequences; ++s) {
      for (int64_t t = layout.cu_seqlens[s]; t < layout.cu_seqlens[s + 1]; ++t) {
        for (int a = 0; a < num_axes; ++a) {
          r.values[t * num_axes + a] = t - layout.cu_seqlens[s];
        }
      }
    }
  }

  for (int64_t t = 0; t < T; ++t) {
    for (int a = 0; a < num_axes; ++a) {
      const int64_t p = r.values[t * num_axes + a];
      if (p > kMaxAbsPosition || p < -kMaxAbsPosition) {
        return absl::InvalidArgumentError(absl::StrCat(
            "position of token ", t, (num_axes > 1 ? absl::StrCat(" axis ", a) : std::string()),
            " is ", p, ", outside the supported range [-2^31, 2^31]"));
      }
      r.max_abs_position = std::max(r.max_abs_position, std::abs(p));
      int64_t& len = r.sequence_length[r.token_sequence[t]];
      len = std::max(len, p + 1);
    }
  }
  return r;
}

}  // namespace posenc
