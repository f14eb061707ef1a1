// Attention biases on the CPU, row by row: each row's masks become two
// ranges filled with -inf and one visible range whose values are computed in
// a loop without branches, which GCC vectorises. The formulas are
// math/bias_math.h, the same as the CUDA kernel's.
#include <algorithm>
#include <cstdlib>
#include <type_traits>

#include "bias_avx2.inc"
#include "bias_bf16_wide.inc"
#include "cpu_kernels.h"
#include "math/bias_math.h"
#include "posenc/dtype.h"

namespace posenc::internal {
namespace {

// The visible range is walked in chunks that an int32 counter covers and
// whose distances are exact in float when the row's are (|dist| < 2^24).
constexpr int64_t kChunk = kFloatExactDistance;

template <typename T, bool kAdd>
POSENC_ALWAYS_INLINE void FillMasked(T* y, int64_t n) {
  for (int64_t k = 0; k < n; ++k) {
    y[k] = FromFloat<T>(kAdd ? AddMaskedBias(ToFloat(y[k])) : MaskedBias());
  }
}

// Keys at distances d0, d0 - 1, ..., d0 - (n - 1) from the query, with the
// float formulas. REQUIRES: every |distance| < 2^24 (unused for NONE).
template <typename T, BiasForm kForm, bool kAdd>
POSENC_ALWAYS_INLINE void VisibleInFloat(T* y, int32_t n, int32_t d0, float neg_slope) {
  for (int32_t k = 0; k < n; ++k) {
    float v;
    if constexpr (kForm == BiasForm::kNone) {
      v = kAdd ? AddZeroBias(ToFloat(y[k])) : 0.0f;
    } else {
      float d = static_cast<float>(d0 - k);
      if constexpr (kForm == BiasForm::kSymmetric) d = __builtin_fabsf(d);
      v = kAdd ? AddBias(ToFloat(y[k]), neg_slope, d) : BiasOf(neg_slope, d);
    }
    y[k] = FromFloat<T>(v);
  }
}

// The same with the double formulas; d0 - k is exact (integers < 2^53).
template <typename T, BiasForm kForm, bool kAdd>
POSENC_ALWAYS_INLINE void VisibleInDouble(T* y, int32_t n, double d0, double neg_slope) {
  for (int32_t k = 0; k < n; ++k) {
    double d = d0 - static_cast<double>(k);
    if constexpr (kForm == BiasForm::kSymmetric) d = __builtin_fabs(d);
    y[k] = FromFloat<T>(kAdd ? AddBias(ToFloat(y[k]), neg_slope, d) : BiasOf(neg_slope, d));
  }
}

template <typename T, BiasForm kForm, bool kAdd>
POSENC_ALWAYS_INLINE void BiasRows(const BiasPlan& p, T* out, int64_t begin, int64_t end,
                                   int64_t origin, KeyWindow keys) {
#ifdef POSENC_CPU_BF16_WIDE
  if constexpr (std::is_same_v<T, BFloat16>) {
    // AVX-512 CPUs without BF16 (Intel's, up to Ice Lake) take the AVX2
    // loop: narrowed by integer rounding in order, which needs VPERMT2W,
    // the 512-bit loop came to 13 cycles per 32 keys on llvm-mca's Ice
    // Lake server against the AVX2 loop's 10 (its shuffles and 512-bit
    // integer operations share two ports; bench/RESULTS.md).
    if (CpuHasAvx512Bf16()) return BiasRowsBF16Wide<kForm, kAdd>(p, out, begin, end, origin, keys);
    if (CpuHasAvx2()) return BiasRowsBF16Avx2<kForm, kAdd>(p, out, begin, end, origin, keys);
  }
#endif
  const BiasShape shape{kForm, p.causal, p.window};
  const int64_t k_len = keys.count;
  const bool in_pieces = k_len != p.k_len;  // else whole rows: no need to move r
  for (int64_t row = begin; row < end; ++row) {
    const BiasRow where = BiasRowOf(row, p.num_heads, p.q_len);
    BiasRowPlan r = PlanBiasRow(shape, p.slopes[where.h], p.q_offset + where.i,
                                KeyRange{p.k_starts[where.b], p.k_lens[where.b]});
    if (in_pieces) r = KeysOfRow(r, keys.first, k_len);
    T* y = out + (row - origin) * k_len;
    // In address order: the masked head, the visible range, the masked
    // tail (the tail first made each row two streams out of order, which
    // the prefetcher follows less well).
    FillMasked<T, kAdd>(y, r.lo);
    for (int64_t c = r.lo; c < r.hi; c += kChunk) {
      const auto n = static_cast<int32_t>(std::min(kChunk, r.hi - c));
      if (r.in_float) {
        const int32_t d0 = kForm == BiasForm::kNone ? 0 : static_cast<int32_t>(r.qpos - c);
        VisibleInFloat<T, kForm, kAdd>(y + c, n, d0, r.neg_slope_f);
      } else {
        VisibleInDouble<T, kForm, kAdd>(y + c, n, static_cast<double>(r.qpos - c), r.neg_slope);
      }
    }
    FillMasked<T, kAdd>(y + r.hi, k_len - r.hi);
  }
}

template <typename T>
POSENC_ALWAYS_INLINE void BiasRowsOfType(const BiasPlan& p, T* out, int64_t begin, int64_t end,
                                         int64_t origin, KeyWindow k) {
  switch (p.form) {
    case BiasForm::kNone:
      return p.add_to_logits ? BiasRows<T, BiasForm::kNone, true>(p, out, begin, end, origin, k)
                             : BiasRows<T, BiasForm::kNone, false>(p, out, begin, end, origin, k);
    case BiasForm::kCausal:
      return p.add_to_logits ? BiasRows<T, BiasForm::kCausal, true>(p, out, begin, end, origin, k)
                             : BiasRows<T, BiasForm::kCausal, false>(p, out, begin, end, origin, k);
    case BiasForm::kSymmetric:
      return p.add_to_logits
                 ? BiasRows<T, BiasForm::kSymmetric, true>(p, out, begin, end, origin, k)
                 : BiasRows<T, BiasForm::kSymmetric, false>(p, out, begin, end, origin, k);
  }
  std::abort();  // planning admits these forms only
}

POSENC_ALWAYS_INLINE void BiasRowsOfDType(const BiasPlan& p, void* out, int64_t begin, int64_t end,
                                          int64_t origin, KeyWindow k) {
  switch (p.dtype) {
    case DType::kFloat32:
      return BiasRowsOfType(p, static_cast<float*>(out), begin, end, origin, k);
    case DType::kFloat16:
      return BiasRowsOfType(p, static_cast<Half*>(out), begin, end, origin, k);
    case DType::kBFloat16:
      return BiasRowsOfType(p, static_cast<BFloat16*>(out), begin, end, origin, k);
    default:
      std::abort();  // planning admits floating dtypes only
  }
}

}  // namespace

POSENC_CPU_CLONES void AttentionBiasRowsCpu(const BiasPlan& p, void* out, int64_t begin,
                                            int64_t end, int64_t origin) {
  BiasRowsOfDType(p, out, begin, end, origin, KeyWindow{0, p.k_len});
}

POSENC_CPU_CLONES void AttentionBiasKeysCpu(const BiasPlan& p, void* out, int64_t row,
                                            int64_t k_begin, int64_t k_end) {
  BiasRowsOfDType(p, out, row, row + 1, row, KeyWindow{k_begin, k_end - k_begin});
}

}  // namespace posenc::internal
