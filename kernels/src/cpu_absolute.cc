#include <cmath>
#include <vector>

#include "angle.h"
#include "cpu_kernels.h"
#include "posenc/dtype.h"

namespace posenc::internal {
namespace {

// Element e of PE[pos] in float64: the precise value for flagged elements.
double PreciseEncoding(const AbsolutePlan& p, int64_t pos, int64_t e) {
  if (p.options.kind == AbsoluteOptions::Kind::kLearned) {
    return p.options.table->values[pos * p.dim + e];
  }
  const int64_t half = p.dim / 2;
  if (e >= 2 * half) return 0.0;  // the odd channel
  const bool interleaved = p.options.sinusoidal_layout == SinusoidalLayout::kInterleaved;
  const int64_t i = interleaved ? e / 2 : (e < half ? e : e - half);
  const bool is_sin = interleaved ? e % 2 == 0 : e < half;
  double s, c;
  SinCosPrecise(static_cast<double>(pos) * p.omega[i], &s, &c);
  return is_sin ? s : c;
}

// PE[pos] in float32, [dim].
POSENC_ALWAYS_INLINE void EncodingRow(const AbsolutePlan& p, int64_t pos, float* __restrict row,
                                      float* __restrict sin_buf, float* __restrict cos_buf) {
  if (p.options.kind == AbsoluteOptions::Kind::kLearned) {
    const float* src = p.options.table->values.data() + pos * p.dim;
    for (int64_t i = 0; i < p.dim; ++i) row[i] = src[i];
    return;
  }
  const int64_t half = p.dim / 2;
  const double dpos = static_cast<double>(pos);
  const double* omega = p.omega.data();
  for (int64_t i = 0; i < half; ++i) SinCos(dpos * omega[i], &sin_buf[i], &cos_buf[i]);
  if (p.options.sinusoidal_layout == SinusoidalLayout::kInterleaved) {
    for (int64_t i = 0; i < half; ++i) {
      row[2 * i] = sin_buf[i];
      row[2 * i + 1] = cos_buf[i];
    }
  } else {
    for (int64_t i = 0; i < half; ++i) {
      row[i] = sin_buf[i];
      row[half + i] = cos_buf[i];
    }
  }
  if (p.dim % 2 == 1) row[p.dim - 1] = 0.0f;  // fairseq's zero channel for odd d
}

// Per-thread buffers, separately allocated so the compiler can see they do
// not overlap.
struct Scratch {
  explicit Scratch(int64_t dim) : row(dim), result(dim), sin(dim / 2), cos(dim / 2), flag(dim) {}
  std::vector<float> row;     // [dim] PE in float32
  std::vector<float> result;  // [dim] 16-bit inputs kept for recomputation
  std::vector<float> sin, cos;
  std::vector<uint8_t> flag;  // [dim] elements to recompute in double
};

template <typename T>
POSENC_ALWAYS_INLINE void AbsoluteTokens(const AbsolutePlan& p, T* __restrict x, int64_t begin,
                                         int64_t end, Scratch& scratch) {
  const int64_t dim = p.dim;
  float* __restrict row = scratch.row.data();
  float* __restrict tmp = scratch.result.data();
  float* __restrict sin_buf = scratch.sin.data();
  float* __restrict cos_buf = scratch.cos.data();
  uint8_t* __restrict flag = scratch.flag.data();
  const float xs = static_cast<float>(p.options.x_scale);
  for (int64_t t = begin; t < end; ++t) {
    const int64_t pos = p.positions.values[t];
    EncodingRow(p, pos, row, sin_buf, cos_buf);
    T* __restrict y = x + t * dim;
    if (!p.has_input) {
      for (int64_t i = 0; i < dim; ++i) y[i] = FromFloat<T>(row[i]);
      if constexpr (!std::is_same_v<T, float>) {
        // PE alone has no cancellation, but float cos/sin can still sit an
        // ulp off near 16-bit rounding boundaries of tiny values.
        for (int64_t i = 0; i < dim; ++i) {
          if (std::fabs(row[i]) < kCancellationBound) {
            y[i] = FromFloat<T>(static_cast<float>(PreciseEncoding(p, pos, i)));
          }
        }
      }
      continue;
    }
    if constexpr (std::is_same_v<T, float>) {
      for (int64_t i = 0; i < dim; ++i) y[i] = y[i] * xs + row[i];
    } else {
      // Float results rounded and stored at once (vectorised), inputs kept;
      // then the rare flagged elements again in double.
      T* __restrict saved = reinterpret_cast<T*>(tmp);
      for (int64_t i = 0; i < dim; ++i) {
        const T xi = y[i];
        saved[i] = xi;
        const float u = ToFloat(xi) * xs;
        const float r = u + row[i];
        y[i] = FromFloat<T>(r);
        flag[i] = static_cast<uint8_t>(
            std::fabs(r) < kCancellationBound * (std::fabs(u) + std::fabs(row[i]) + 1.0f));
      }
      ForEachFlagged(flag, dim, [&](int64_t i) {
        y[i] = FromFloat<T>(
            static_cast<float>(static_cast<double>(ToFloat(saved[i])) * p.options.x_scale +
                               PreciseEncoding(p, pos, i)));
      });
    }
  }
}

POSENC_CPU_CLONES void AbsoluteDispatch(const AbsolutePlan& p, void* x, int64_t begin, int64_t end,
                                        Scratch& scratch) {
  switch (p.dtype) {
    case DType::kFloat32:
      AbsoluteTokens<float>(p, static_cast<float*>(x), begin, end, scratch);
      break;
    case DType::kFloat16:
      AbsoluteTokens<Half>(p, static_cast<Half*>(x), begin, end, scratch);
      break;
    case DType::kBFloat16:
      AbsoluteTokens<BFloat16>(p, static_cast<BFloat16*>(x), begin, end, scratch);
      break;
    default:
      break;  // planning admits floating dtypes only
  }
}

}  // namespace

void AbsoluteTokensCpu(const AbsolutePlan& plan, void* x, int64_t begin, int64_t end) {
  Scratch scratch(plan.dim);
  AbsoluteDispatch(plan, x, begin, end, scratch);
}

}  // namespace posenc::internal
