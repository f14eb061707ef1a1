#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "plan/checked_math.h"
#include "posenc/limits.h"
#include "posenc/rope.h"
#include "posenc/status_macros.h"

namespace posenc {
namespace {

bool LengthDependent(const RopeScaling& s) {
  return s.type == ScalingType::kDynamicNtk ||
         (s.type == ScalingType::kLongRope && s.longrope_mode == LongRopeMode::kBySequenceLength);
}

absl::string_view LayoutName(RopeLayout l) {
  switch (l) {
    case RopeLayout::kBSHD:
      return "BSHD [batch, seq, heads, head_dim]";
    case RopeLayout::kBHSD:
      return "BHSD [batch, heads, seq, head_dim]";
    case RopeLayout::kTHD:
      return "THD [tokens, heads, head_dim]";
  }
  return "?";
}

// Splits a tensor's shape into (batch, seq or tokens, heads, head_dim).
struct Dims {
  int64_t batch = 1, seq = 0, heads = 0, head_dim = 0;
};

absl::StatusOr<Dims> ReadDims(absl::string_view field, RopeLayout layout, const MutableTensor& t) {
  if (!IsFloating(t.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".dtype must be FLOAT32, FLOAT16 or BFLOAT16, got ", DTypeName(t.dtype)));
  }
  POSENC_RETURN_IF_ERROR(ValidateTensorBytes(field, t.dtype, t.shape, t.nbytes));
  const int want_rank = layout == RopeLayout::kTHD ? 3 : 4;
  if (t.rank() != want_rank) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".shape must have rank ", want_rank,
                                                   " for layout ", LayoutName(layout), ", got ",
                                                   ShapeString(t.shape)));
  }
  Dims d;
  int batch_axis = 0, seq_axis = 1, heads_axis = 2, dim_axis = 3;
  switch (layout) {
    case RopeLayout::kBSHD:
      break;
    case RopeLayout::kBHSD:
      seq_axis = 2;
      heads_axis = 1;
      break;
    case RopeLayout::kTHD:
      batch_axis = -1;
      seq_axis = 0;
      heads_axis = 1;
      dim_axis = 2;
      break;
  }
  auto dim_name = [&](int axis, absl::string_view what) {
    return absl::StrCat(field, ".shape[", axis, "] (", what, ")");
  };
  if (batch_axis >= 0) {
    d.batch = t.shape[batch_axis];
    POSENC_RETURN_IF_ERROR(CheckDimension(dim_name(batch_axis, "batch"), d.batch, kMaxSequences));
  }
  d.seq = t.shape[seq_axis];
  d.heads = t.shape[heads_axis];
  d.head_dim = t.shape[dim_axis];
  POSENC_RETURN_IF_ERROR(CheckDimension(
      dim_name(seq_axis, layout == RopeLayout::kTHD ? "tokens" : "seq"), d.seq, kMaxTokens));
  POSENC_RETURN_IF_ERROR(CheckDimension(dim_name(heads_axis, "heads"), d.heads, kMaxHeads));
  POSENC_RETURN_IF_ERROR(CheckDimension(dim_name(dim_axis, "head_dim"), d.head_dim, kMaxDim));
  int64_t tokens = 0;
  if (!CheckedMul(d.batch, d.seq, &tokens) || tokens > kMaxTokens) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".shape ", ShapeString(t.shape),
                                                   " has more than ", kMaxTokens,
                                                   " tokens (batch x seq)"));
  }
  return d;
}

}  // namespace

absl::StatusOr<RopePlan> PlanRope(const RopeOptions& o, const RopeTensors& t,
                                  const ReserveFn& reserve) {
  if (o.layout != RopeLayout::kBSHD && o.layout != RopeLayout::kBHSD &&
      o.layout != RopeLayout::kTHD) {
    return absl::InvalidArgumentError("layout must be BSHD, BHSD or THD");
  }
  if (o.style != RopeStyle::kNeox && o.style != RopeStyle::kGptj) {
    return absl::InvalidArgumentError("style must be NEOX or GPTJ");
  }
  if (!t.query.present()) return absl::InvalidArgumentError("query is required");
  POSENC_ASSIGN_OR_RETURN(Dims q, ReadDims("query", o.layout, t.query));

  RopePlan p;
  p.layout = o.layout;
  p.style = o.style;
  p.dtype = t.query.dtype;
  p.inverse = o.inverse;
  p.query_heads = q.heads;
  p.head_dim = q.head_dim;

  if (t.key.present()) {
    POSENC_ASSIGN_OR_RETURN(Dims k, ReadDims("key", o.layout, t.key));
    if (t.key.dtype != t.query.dtype) {
      return absl::InvalidArgumentError(absl::StrCat("key.dtype must equal query.dtype ",
                                                     DTypeName(t.query.dtype), ", got ",
                                                     DTypeName(t.key.dtype)));
    }
    if (k.batch != q.batch || k.seq != q.seq || k.head_dim != q.head_dim) {
      return absl::InvalidArgumentError(
          absl::StrCat("key.shape ", ShapeString(t.key.shape), " must match query.shape ",
                       ShapeString(t.query.shape), " in every dimension but heads"));
    }
    p.has_key = true;
    p.key_heads = k.heads;
  }

  const int64_t R = o.rotary_dim == 0 ? q.head_dim : o.rotary_dim;
  if (o.rotary_dim < 0 || R % 2 != 0 || R > q.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rotary_dim must be even and <= head_dim (", q.head_dim, "), or 0 for head_dim; got ",
        o.rotary_dim, R != o.rotary_dim ? absl::StrCat(" (head_dim ", R, " is odd)") : ""));
  }
  p.rotary_dim = R;

  POSENC_RETURN_IF_ERROR(CheckAxisCount(o));
  TokenLayout layout;
  if (o.layout == RopeLayout::kTHD) {
    POSENC_ASSIGN_OR_RETURN(layout, PackedLayout(t.cu_seqlens, q.seq));
  } else {
    if (t.cu_seqlens.present()) {
      return absl::InvalidArgumentError(
          "cu_seqlens is only for layout THD; padded layouts take sequence lengths from shape");
    }
    layout = PaddedLayout(q.batch, q.seq);
    p.seq_len = q.seq;
  }
  p.num_tokens = layout.num_tokens;
  p.num_axes = NumPositionAxes(o);
  const int64_t num_seq = layout.num_sequences;

  // Options are checked in full (frequencies for a length the scaling cannot
  // reject) before anything is reserved or resolved.
  POSENC_ASSIGN_OR_RETURN(FrequencySet probe, ResolveFrequencies(o, R, 0));
  if (p.empty()) {
    // Nothing to rotate: the inputs are checked, nothing is materialised.
    POSENC_RETURN_IF_ERROR(CheckPositionInputs(layout, t.positions, p.num_axes));
    p.num_tokens = 0;
    p.slot_axis = probe.slot_axis;
    return p;
  }
  if (reserve) {
    // Positions, one frequency set (and a map node) per distinct sequence
    // length at most, and the per-sequence set index.
    const int64_t max_sets = LengthDependent(o.scaling) ? std::min(num_seq, p.num_tokens) : 1;
    PlanCost cost;
    cost.plan_bytes = ResolvedPositionsBytes(p.num_tokens, num_seq, p.num_axes) +
                      max_sets * (p.half() * 8 + 8 + 64) + num_seq * 4 + p.half() * 4;
    // Positions, frequencies, scales and slot axes, and with several sets
    // the per-token set index (built on the host, then staged: 8 bytes).
    cost.device_side_bytes =
        cost.plan_bytes + (max_sets > 1 ? 8 * p.num_tokens : 0) + 5 * kDeviceSidePadding;
    POSENC_RETURN_IF_ERROR(reserve(cost));
  }
  POSENC_ASSIGN_OR_RETURN(p.positions, ResolvePositions(layout, t.positions, p.num_axes));

  // Frequencies: one set, or one per distinct sequence length when the
  // scaling depends on it.
  p.sequence_freq_set.assign(num_seq, 0);
  std::map<int64_t, int32_t> set_of_length;
  std::vector<int64_t> set_lengths;
  if (LengthDependent(o.scaling)) {
    for (int64_t s = 0; s < num_seq; ++s) {
      const int64_t L = p.positions.sequence_length[s];
      auto [it, inserted] = set_of_length.emplace(L, static_cast<int32_t>(set_lengths.size()));
      if (inserted) set_lengths.push_back(L);
      p.sequence_freq_set[s] = it->second;
    }
  }
  if (set_lengths.empty()) set_lengths.push_back(0);
  p.num_freq_sets = static_cast<int>(set_lengths.size());
  double max_freq = 0;
  for (int64_t L : set_lengths) {
    POSENC_ASSIGN_OR_RETURN(FrequencySet fs, ResolveFrequencies(o, R, L));
    p.inv_freq.insert(p.inv_freq.end(), fs.inv_freq.begin(), fs.inv_freq.end());
    p.attention_scale.push_back(fs.attention_scale);
    p.slot_axis = fs.slot_axis;
    for (double f : fs.inv_freq) max_freq = std::max(max_freq, std::abs(f));
  }
  // The angle reduction is exact to float precision while |pos * f| < 2^31.
  if (static_cast<double>(p.positions.max_abs_position) * max_freq > 2147483648.0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "largest |position| x frequency must be <= 2^31 for accurate angles; position ",
        p.positions.max_abs_position, " x inverse frequency ", max_freq, " exceeds it"));
  }
  return p;
}

}  // namespace posenc
