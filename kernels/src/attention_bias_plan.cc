#include <cmath>

#include "absl/strings/str_cat.h"
#include "posenc/attention_bias.h"
#include "posenc/status_macros.h"

namespace posenc {

std::vector<double> AlibiSlopes(int64_t n) {
  // Power of two p: slopes 2^(-8h/p), h = 1..p.
  auto power_of_two = [](int64_t p) {
    std::vector<double> s(p);
    for (int64_t h = 1; h <= p; ++h) s[h - 1] = std::exp2(-8.0 * h / static_cast<double>(p));
    return s;
  };
  int64_t p = 1;
  while (p * 2 <= n) p *= 2;
  std::vector<double> slopes = power_of_two(p);
  if (p == n) return slopes;
  // Fill up with every other slope of the next power of two (odd h of 2p).
  const std::vector<double> next = power_of_two(2 * p);
  for (int64_t i = 0; static_cast<int64_t>(slopes.size()) < n; i += 2) slopes.push_back(next[i]);
  return slopes;
}

absl::StatusOr<BiasPlan> PlanAttentionBias(const BiasOptions& o, const TensorView& logits) {
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
  if (o.k_lens.present() && batch == 0 && !logits.present()) {
    batch = o.k_lens.rank() == 1 ? o.k_lens.shape[0] : 0;
  }
  if (batch == 0 && !logits.present()) batch = 1;
  for (auto [name, v] : {std::pair<const char*, int64_t>{"batch", batch},
                         {"num_heads", heads},
                         {"q_len", q_len},
                         {"k_len", k_len}}) {
    if (v < 0) return absl::InvalidArgumentError(absl::StrCat(name, " must be >= 0, got ", v));
  }
  if (heads == 0 && !logits.present()) {
    return absl::InvalidArgumentError("num_heads must be > 0 (or send logits)");
  }
  // A bias of 2^31 elements or more is far beyond any sane request.
  constexpr double kMaxElements = 2147483648.0;
  if (static_cast<double>(batch) * heads * q_len * k_len >= kMaxElements) {
    return absl::InvalidArgumentError(absl::StrCat("bias [", batch, ", ", heads, ", ", q_len, ", ",
                                                   k_len, "] has 2^31 elements or more"));
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
      if (!std::isfinite(o.slopes[h])) {
        return absl::InvalidArgumentError(absl::StrCat("slopes[", h, "] must be finite"));
      }
    }
    p.slopes = o.slopes;
  } else if (heads > 0) {
    p.slopes = AlibiSlopes(heads);
  }

  p.q_offset = o.q_offset.value_or(k_len - q_len);
  p.causal = o.causal;
  if (o.window < 0) {
    return absl::InvalidArgumentError(absl::StrCat("window must be >= 0, got ", o.window));
  }
  p.window = o.window;
  p.k_lens.assign(batch, k_len);
  if (o.k_lens.present()) {
    if (!IsInteger(o.k_lens.dtype)) {
      return absl::InvalidArgumentError(
          absl::StrCat("k_lens.dtype must be INT32 or INT64, got ", DTypeName(o.k_lens.dtype)));
    }
    POSENC_RETURN_IF_ERROR(
        ValidateTensorBytes("k_lens", o.k_lens.dtype, o.k_lens.shape, o.k_lens.nbytes));
    if (o.k_lens.rank() != 1 || o.k_lens.shape[0] != batch) {
      return absl::InvalidArgumentError(absl::StrCat("k_lens.shape must be [batch] = [", batch,
                                                     "], got ", ShapeString(o.k_lens.shape)));
    }
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t v = ReadInteger(o.k_lens, b);
      if (v < 0 || v > k_len) {
        return absl::InvalidArgumentError(
            absl::StrCat("k_lens[", b, "] must be in [0, k_len = ", k_len, "], got ", v));
      }
      p.k_lens[b] = v;
    }
  }
  return p;
}

}  // namespace posenc
