// The arithmetic of attention biases, shared by the CPU and CUDA kernels: one
// definition of the row's masks, the ALiBi distance and the rounding.
//
// A row (batch b, head h, query i) is -inf outside one contiguous range of
// keys and -slope * dist (or |dist|) inside it, so the masks are resolved
// once per row (PlanBiasRow) and the values come from the per-element
// formulas below, which the CPU loops run branch-free over the visible range
// and the GPU body runs per element.
#ifndef POSENC_KERNELS_MATH_BIAS_MATH_H_
#define POSENC_KERNELS_MATH_BIAS_MATH_H_

#include <cstdint>

#include "math/nan.h"
#include "posenc/codes.h"
#include "posenc/dtype.h"
#include "posenc/host_device.h"

namespace posenc::internal {

struct BiasShape {
  BiasForm form;
  bool causal;
  int64_t window;  // keep the `window` most recent keys including self; 0 = off
};

// Where row `row` of [batch, heads, q_len] is.
struct BiasRow {
  int64_t b, h, i;
};
POSENC_HOST_DEVICE BiasRow BiasRowOf(int64_t row, int64_t heads, int64_t q_len) {
  const int64_t bh = row / q_len;
  return BiasRow{bh / heads, bh % heads, row % q_len};
}

// The keys one sequence may attend, [begin, end) along the stored key axis:
// left padding before `begin` (k_starts), right padding from `end` (k_lens).
struct KeyRange {
  int64_t begin, end;
};

// Distances below this are exact in float, and a float slope times one is
// exact in double (24 + 24 bits): one float multiply then rounds exactly as
// the double product rounded to float does.
inline constexpr int64_t kFloatExactDistance = int64_t{1} << 24;

// One row's visible keys and how its values are computed.
struct BiasRowPlan {
  // Keys [lo, hi) carry the bias; the others are masked (-inf). lo <= hi,
  // both within [0, k_len].
  int64_t lo, hi;
  int64_t qpos;       // the query's position: dist = qpos - j
  double neg_slope;   // -slope: the bias is neg_slope * dist (|dist|)
  float neg_slope_f;  // the same, when in_float
  bool in_float;      // the float formulas below give the double ones' result
};

// Query position qpos (padding moves no position: queries and keys sit on
// the same padded axis, so qpos - j is the unpadded distance). A key j is
// masked where causal and j > qpos, where a window W is set and j is not in
// (qpos - W, qpos], and outside `keys`.
POSENC_HOST_DEVICE BiasRowPlan PlanBiasRow(BiasShape shape, double slope, int64_t qpos,
                                           KeyRange keys) {
  BiasRowPlan r;
  r.lo = keys.begin;
  r.hi = keys.end;
  if ((shape.causal || shape.window > 0) && r.hi > qpos + 1) r.hi = qpos + 1;
  if (shape.window > 0 && r.lo < qpos - shape.window + 1) r.lo = qpos - shape.window + 1;
  if (r.hi <= r.lo) r.lo = r.hi = keys.begin;  // all masked
  r.qpos = qpos;
  r.neg_slope = -slope;
  r.neg_slope_f = static_cast<float>(-slope);
  // |dist| is largest at an end of the range.
  const int64_t d_lo = qpos - r.lo, d_hi = qpos - (r.hi - 1);
  const bool near = (d_lo < 0 ? -d_lo : d_lo) < kFloatExactDistance &&
                    (d_hi < 0 ? -d_hi : d_hi) < kFloatExactDistance;
  r.in_float =
      shape.form == BiasForm::kNone || (static_cast<double>(r.neg_slope_f) == r.neg_slope && near);
  return r;
}

// Row r's keys [k0, k0 + n) as a row of n keys of their own (key k0 + j of
// r at j): the same distances, hence the same values bit for bit, by the
// formulas r chose for the whole row (in_float). For a row computed in
// pieces (bias_through.h).
POSENC_HOST_DEVICE BiasRowPlan KeysOfRow(BiasRowPlan r, int64_t k0, int64_t n) {
  r.lo = r.lo - k0 < 0 ? 0 : (r.lo - k0 > n ? n : r.lo - k0);
  r.hi = r.hi - k0 < r.lo ? r.lo : (r.hi - k0 > n ? n : r.hi - k0);
  r.qpos -= k0;
  return r;
}

// The per-element formulas. `d` is the distance (or |distance|) exactly.
//
// Writing the bias: float(-slope * d). In double it is exact for a float
// slope and |d| < 2^24, so the float product rounds to the same float.
POSENC_HOST_DEVICE float BiasOf(float neg_slope, float d) { return neg_slope * d; }
POSENC_HOST_DEVICE float BiasOf(double neg_slope, double d) {
  return static_cast<float>(neg_slope * d);
}

// A NaN sum leaves as one pattern (CanonicalNaN, nan.h), so the backends
// agree bit for bit.

// Adding it to a logit. With a float slope and |d| < 2^24 the exact sum
// logit - slope * d is rounded once to float (fmaf): the float nearest the
// exact value. Other slopes (2^(-1/2), 0.1, ...) are not floats and the
// product has to be formed in double: rounded to double, added to the logit
// in double, and that sum rounded to float.
POSENC_HOST_DEVICE float AddBias(float logit, float neg_slope, float d) {
#ifdef __CUDA_ARCH__
  return CanonicalNaN(__fmaf_rn(neg_slope, d, logit));
#else
  return CanonicalNaN(__builtin_fmaf(neg_slope, d, logit));
#endif
}
POSENC_HOST_DEVICE float AddBias(float logit, double neg_slope, double d) {
  return CanonicalNaN(static_cast<float>(static_cast<double>(logit) + neg_slope * d));
}

// NONE: zero bias. Adding +0 turns a -0 logit into +0, as the double sum did.
POSENC_HOST_DEVICE float AddZeroBias(float logit) { return CanonicalNaN(logit + 0.0f); }

// A masked key: -inf, or the logit plus -inf (NaN for a +inf or NaN logit).
POSENC_HOST_DEVICE float MaskedBias() { return BitsFloat(0xff800000u); }  // -inf
POSENC_HOST_DEVICE float AddMaskedBias(float logit) { return CanonicalNaN(logit + MaskedBias()); }

// Key j of row `r` as the float that is then stored as T (rounding once more
// for 16-bit types); `logit` is the stored value when adding. The GPU body
// uses this per element; the CPU loops inline the same formulas by range.
POSENC_HOST_DEVICE float BiasElement(const BiasRowPlan& r, BiasForm form, int64_t j, float logit,
                                     bool add_to_logits) {
  if (j < r.lo || j >= r.hi) return add_to_logits ? AddMaskedBias(logit) : MaskedBias();
  if (form == BiasForm::kNone) return add_to_logits ? AddZeroBias(logit) : 0.0f;
  int64_t dist = r.qpos - j;
  if (form == BiasForm::kSymmetric && dist < 0) dist = -dist;
  if (r.in_float) {
    // |dist| < 2^24 here (PlanBiasRow): exact through int32, whose
    // conversion is cheaper on a GPU than int64's.
    const float d = static_cast<float>(static_cast<int32_t>(dist));
    return add_to_logits ? AddBias(logit, r.neg_slope_f, d) : BiasOf(r.neg_slope_f, d);
  }
  const double d = static_cast<double>(dist);
  return add_to_logits ? AddBias(logit, r.neg_slope, d) : BiasOf(r.neg_slope, d);
}

}  // namespace posenc::internal

#endif  // POSENC_KERNELS_MATH_BIAS_MATH_H_
