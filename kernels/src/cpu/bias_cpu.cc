// Attention biases on the CPU, row by row; the element arithmetic is
// math/bias_math.h, the same as the CUDA kernel's.
#include <cstdlib>

#include "cpu_kernels.h"
#include "math/bias_math.h"
#include "posenc/dtype.h"

namespace posenc::internal {
namespace {

template <typename T>
POSENC_ALWAYS_INLINE void BiasRows(const BiasPlan& p, T* out, int64_t begin, int64_t end) {
  const BiasShape shape{p.form, p.causal, p.window};
  for (int64_t row = begin; row < end; ++row) {
    const BiasRow r = BiasRowOf(row, p.num_heads, p.q_len);
    const int64_t qpos = p.q_offset + r.i;
    const double slope = p.slopes[r.h];
    const KeyRange keys{p.k_starts[r.b], p.k_lens[r.b]};
    T* y = out + row * p.k_len;
    for (int64_t j = 0; j < p.k_len; ++j) {
      StoreBias(&y[j], BiasValue(shape, slope, qpos, j, keys), p.add_to_logits);
    }
  }
}

}  // namespace

POSENC_CPU_CLONES void AttentionBiasRowsCpu(const BiasPlan& p, void* out, int64_t begin,
                                            int64_t end) {
  switch (p.dtype) {
    case DType::kFloat32:
      return BiasRows(p, static_cast<float*>(out), begin, end);
    case DType::kFloat16:
      return BiasRows(p, static_cast<Half*>(out), begin, end);
    case DType::kBFloat16:
      return BiasRows(p, static_cast<BFloat16*>(out), begin, end);
    default:
      std::abort();  // planning admits floating dtypes only
  }
}

}  // namespace posenc::internal
