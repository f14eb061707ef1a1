#include <vector>

#include "angle.h"
#include "cpu_kernels.h"
#include "posenc/dtype.h"

namespace posenc::internal {
namespace {

// PE row of one position, float32, [dim].
template <typename Acc>
POSENC_ALWAYS_INLINE void SinusoidalRow(const AbsolutePlan& p, int64_t pos, Acc* row) {
  const int64_t half = p.dim / 2;
  const double dpos = static_cast<double>(pos);
  const double* omega = p.omega.data();
  if (p.options.sinusoidal_layout == SinusoidalLayout::kInterleaved) {
    for (int64_t i = 0; i < half; ++i) {
      Acc s, c;
      SinCosAcc(dpos * omega[i], &s, &c);
      row[2 * i] = s;
      row[2 * i + 1] = c;
    }
  } else {
    for (int64_t i = 0; i < half; ++i) {
      Acc s, c;
      SinCosAcc(dpos * omega[i], &s, &c);
      row[i] = s;
      row[half + i] = c;
    }
  }
  if (p.dim % 2 == 1) row[p.dim - 1] = 0;  // fairseq's zero channel for odd d
}

template <typename T, typename Acc, typename PE>
POSENC_ALWAYS_INLINE void AddRow(T* y, const PE* pe, int64_t dim, Acc x_scale, bool has_input) {
  if (has_input) {
    for (int64_t i = 0; i < dim; ++i) {
      y[i] = FromFloat<T>(static_cast<float>(static_cast<Acc>(ToFloat(y[i])) * x_scale + pe[i]));
    }
  } else {
    for (int64_t i = 0; i < dim; ++i) y[i] = FromFloat<T>(static_cast<float>(pe[i]));
  }
}

template <typename T>
POSENC_ALWAYS_INLINE void AbsoluteTokens(const AbsolutePlan& p, T* x, int64_t begin, int64_t end,
                                         double* scratch) {
  using Acc = typename AccumulatorOf<T>::type;
  Acc* row = reinterpret_cast<Acc*>(scratch);
  const Acc x_scale = static_cast<Acc>(p.options.x_scale);
  const bool learned = p.options.kind == AbsoluteOptions::Kind::kLearned;
  for (int64_t t = begin; t < end; ++t) {
    const int64_t pos = p.positions.values[t];
    if (learned) {
      AddRow<T>(x + t * p.dim, p.options.table->values.data() + pos * p.dim, p.dim, x_scale,
                p.has_input);
    } else {
      SinusoidalRow(p, pos, row);
      AddRow<T>(x + t * p.dim, row, p.dim, x_scale, p.has_input);
    }
  }
}

POSENC_CPU_CLONES void AbsoluteDispatch(const AbsolutePlan& p, void* x, int64_t begin,
                                        int64_t end, double* row) {
  switch (p.dtype) {
    case DType::kFloat32:
      AbsoluteTokens<float>(p, static_cast<float*>(x), begin, end, row);
      break;
    case DType::kFloat16:
      AbsoluteTokens<Half>(p, static_cast<Half*>(x), begin, end, row);
      break;
    case DType::kBFloat16:
      AbsoluteTokens<BFloat16>(p, static_cast<BFloat16*>(x), begin, end, row);
      break;
    default:
      break;  // planning admits floating dtypes only
  }
}

}  // namespace

void AbsoluteTokensCpu(const AbsolutePlan& plan, void* x, int64_t begin, int64_t end) {
  std::vector<double> row(plan.dim + 1);  // PE row, float or double
  AbsoluteDispatch(plan, x, begin, end, row.data());
}

}  // namespace posenc::internal
