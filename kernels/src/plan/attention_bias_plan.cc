#include <cmath>

#include "absl/strings/str_cat.h"
#include "plan/checked_math.h"
#include "posenc/attention_bias.h"
#include "posenc/limits.h"
#include "posenc/status_macros.h"

namespace posenc {
namespace {

// k_lens or k_starts: one integer per sequence.
absl::Status CheckPerSequenceTensor(const char* name, const TensorView& t, int64_t batch) {
  if (!IsInteger(t.dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ".dtype must be INT32 or INT64, got ", DTypeName(t.dtype)));
  }
  POSENC_RETURN_IF_ERROR(ValidateTensorBytes(name, t.dtype, t.shape, t.nbytes));
  if (t.rank() != 1 || t.shape[0] != batch) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ".shape must be [batch] = [", batch, "], got ", ShapeString(t.shape)));
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<double> AlibiSlopes(int64_t n) {
  // Power of two p: slopes 2^(-8h/p), h = 1..p.
  auto power_of_two = [](int64_t p) {
    std::vector<double> s(p);
    for (int64_t h = 1; h <= p; ++h) s[h - 1] = std::exp2(-8.0 * h / static_cast<double>(p));
    return s;
  };
  if (n < 1) return {};
  // The largest power of two <= n, without a doubling loop that could
  // overflow for n near 2^63.
  const int64_t p = int64_t{1} << (63 - __builtin_clzll(static_cast<uint64_t>(n)));
  std::vector<double> slopes = power_of_two(p);
  if (p == n) return slopes;
  // Fill up with every other slope of the next power of two (odd h of 2p).
  const std::vector<double> next = power_of_two(2 * p);
  for (int64_t i = 0; static_cast<int64_t>(slopes.size()) < n; i += 2) slopes.push_back(next[i]);
  return slopes;
}

absl::StatusOr<BiasPlan> PlanAttentionBias(const BiasOptions& o, const TensorView& logits,
                                           const ReserveFn& reserve) {
  BiasPlan p;
  p.form = o.form;
  if (o.form != BiasForm::kNone && o.form != BiasForm::kCausal && o.form != BiasForm::kSymmetric) {
    return absl::InvalidArgumentError("form must be NONE, CAUSAL or SYMMETRIC");
  }
  int64_t batch = o.batch, heads = o.num_heads, q_len = o.q_len, k_len = o.k_len;
  if (logits.present()) {
    if (!IsFloating(logits.dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "logits.dtype must be FLOAT32, FLOAT16 or BFLOAT16, got ", DTypeName(logits.dtype)));
    }
    POSENC_RETURN_IF_ERROR(
        ValidateTensorBytes("logits", logits.dtype, logits.shape, logits.nbytes));
    if (logits.rank() != 4) {
      return absl::InvalidArgumentError(absl::StrCat(
          "logits.shape must be [batch, heads, q_len, k_len], got ", ShapeString(logits.shape)));
    }
    const int64_t dims[4] = {logits.shape[0], logits.shape[1], logits.shape[2], logits.shape[3]};
    const char* names[4] = {"batch", "num_heads", "q_len", "k_len"};
    int64_t* fields[4] = {&batch, &heads, &q_len, &k_len};
    for (int i = 0; i < 4; ++i) {
      if (*fields[i] != 0 && *fields[i] != dims[i]) {
        return absl::InvalidArgumentError(absl::StrCat(
            names[i], " = ", *fields[i], " disagrees with logits.shape[", i, "] = ", dims[i]));
      }
      *fields[i] = dims[i];
    }
    p.add_to_logits = true;
    p.dtype = logits.dtype;
  } else {
    if (!IsFloating(o.dtype)) {
      return absl::InvalidArgumentError(
          absl::StrCat("dtype must be FLOAT32, FLOAT16 or BFLOAT16, got ", DTypeName(o.dtype)));
    }
    p.dtype = o.dtype;
  }
  if (batch == 0 && !logits.present()) {
    // The first per-sequence tensor sent tells the batch; a malformed one
    // is refused below, naming itself.
    const TensorView& per_sequence = o.k_lens.present() ? o.k_lens : o.k_starts;
    if (per_sequence.present() && per_sequence.rank() == 1) batch = per_sequence.shape[0];
  }
  if (batch == 0 && !logits.present()) batch = 1;
  POSENC_RETURN_IF_ERROR(CheckDimension("batch", batch, kMaxSequences));
  POSENC_RETURN_IF_ERROR(CheckDimension("num_heads", heads, kMaxHeads));
  POSENC_RETURN_IF_ERROR(CheckDimension("q_len", q_len, kMaxAbsPosition));
  POSENC_RETURN_IF_ERROR(CheckDimension("k_len", k_len, kMaxAbsPosition));
  if (heads == 0 && !logits.present()) {
    return absl::InvalidArgumentError("num_heads must be > 0 (or send logits)");
  }
  int64_t elements = 0;
  if (!CheckedProduct({batch, heads, q_len, k_len}, &elements) || elements > kMaxBiasElements) {
    return absl::InvalidArgumentError(absl::StrCat("bias [", batch, ", ", heads, ", ", q_len, ", ",
                                                   k_len, "] has more than 2^31 elements"));
  }
  p.batch = batch;
  p.num_heads = heads;
  p.q_len = q_len;
  p.k_len = k_len;

  if (!o.slopes.empty()) {
    if (static_cast<int64_t>(o.slopes.size()) != heads) {
      return absl::InvalidArgumentError(
          absl::StrCat("slopes must have num_heads = ", heads, " values, got ", o.slopes.size()));
    }
    for (size_t h = 0; h < o.slopes.size(); ++h) {
      POSENC_RETURN_IF_ERROR(CheckFiniteInRange(absl::StrCat("slopes[", h, "]"), o.slopes[h],
                                                -kMaxSlope, kMaxSlope, /*lo_inclusive=*/true));
    }
  }
  // Query rows sit at q_offset + i and keys at j; both stay within
  // +-2^32, so every distance is exact in int64 and in double.
  p.q_offset = o.q_offset.value_or(k_len - q_len);
  if (p.q_offset < -kMaxAbsPosition || p.q_offset > kMaxAbsPosition) {
    return absl::InvalidArgumentError(
        absl::StrCat("q_offset must be in [-2^31, 2^31], got ", p.q_offset));
  }
  p.causal = o.causal;
  POSENC_RETURN_IF_ERROR(CheckDimension("window", o.window, kMaxAbsPosition));
  p.window = o.window;
  if (o.k_lens.present()) {
    POSENC_RETURN_IF_ERROR(CheckPerSequenceTensor("k_lens", o.k_lens, batch));
  }
  if (o.k_starts.present()) {
    POSENC_RETURN_IF_ERROR(CheckPerSequenceTensor("k_starts", o.k_starts, batch));
  }
  if (reserve) {
    PlanCost cost;
    cost.plan_bytes = (heads + 2 * batch) * 8;  // slopes, k_lens, k_starts
    cost.device_side_bytes = cost.plan_bytes + 3 * kDeviceSidePadding;
    cost.output_bytes = p.add_to_logits ? 0 : elements * static_cast<int64_t>(SizeOf(p.dtype));
    POSENC_RETURN_IF_ERROR(reserve(cost));
  }
  if (!o.slopes.empty()) {
    p.slopes = o.slopes;
  } else if (heads > 0) {
    p.slopes = AlibiSlopes(heads);
  }
  p.k_lens.assign(batch, k_len);
  if (o.k_lens.present()) {
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t v = ReadInteger(o.k_lens, b);
      if (v < 0 || v > k_len) {
        return absl::InvalidArgumentError(
            absl::StrCat("k_lens[", b, "] must be in [0, k_len = ", k_len, "], got ", v));
      }
      p.k_lens[b] = v;
    }
  }
  p.k_starts.assign(batch, 0);
  if (o.k_starts.present()) {
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t v = ReadInteger(o.k_starts, b);
      if (v < 0 || v > p.k_lens[b]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "k_starts[", b, "] must be in [0, ",
            o.k_lens.present() ? absl::StrCat("k_lens[", b, "]") : std::string("k_len"), " = ",
            p.k_lens[b], "], got ", v));
      }
      p.k_starts[b] = v;
    }
  }
  return p;
}

}  // namespace posenc
