#include <cmath>
#include <limits>

#include "cpu_kernels.h"
#include "posenc/dtype.h"

namespace posenc::internal {
namespace {

// Bias of query row i against key j, in double; -inf where masked.
inline double BiasValue(const BiasPlan& p, double slope, int64_t qpos, int64_t j, int64_t k_len_b) {
  const int64_t dist = qpos - j;
  const bool masked =
      (p.causal && dist < 0) || (p.window > 0 && (dist < 0 || dist >= p.window)) || j >= k_len_b;
  if (masked) return -std::numeric_limits<double>::infinity();
  switch (p.form) {
    case BiasForm::kCausal:
      return -slope * static_cast<double>(dist);
    case BiasForm::kSymmetric:
      return -slope * static_cast<double>(dist < 0 ? -dist : dist);
    case BiasForm::kNone:
      break;
  }
  return 0.0;
}

template <typename T>
void BiasRows(const BiasPlan& p, T* out, int64_t begin, int64_t end) {
  for (int64_t row = begin; row < end; ++row) {
    const int64_t i = row % p.q_len;
    const int64_t h = (row / p.q_len) % p.num_heads;
    const int64_t b = row / (p.q_len * p.num_heads);
    const int64_t qpos = p.q_offset + i;
    const double slope = p.slopes[h];
    T* y = out + row * p.k_len;
    for (int64_t j = 0; j < p.k_len; ++j) {
      const double v = BiasValue(p, slope, qpos, j, p.k_lens[b]);
      y[j] = FromFloat<T>(static_cast<float>(p.add_to_logits ? ToFloat(y[j]) + v : v));
    }
  }
}

}  // namespace

POSENC_CPU_CLONES void AttentionBiasRowsCpu(const BiasPlan& p, void* out, int64_t begin,
                                            int64_t end) {
  switch (p.dtype) {
    case DType::kFloat32:
      BiasRows(p, static_cast<float*>(out), begin, end);
      break;
    case DType::kFloat16:
      BiasRows(p, static_cast<Half*>(out), begin, end);
      break;
    case DType::kBFloat16:
      BiasRows(p, static_cast<BFloat16*>(out), begin, end);
      break;
    default:
      break;
  }
}

}  // namespace posenc::internal
