// Absolute encodings on the CPU: for each token, its PE row in float32 (one
// SinCos per frequency), then y = x * x_scale + PE over the row. The element
// arithmetic is math/absolute_math.h, the same as the CUDA kernel's; 16-bit
// rows take two passes (float32 for all, double for the flagged few) so the
// first vectorises.
#include <cstdlib>
#include <vector>

#include "cpu_kernels.h"
#include "math/absolute_math.h"
#include "posenc/dtype.h"

namespace posenc::internal {
namespace {

// Element e of PE[pos] in float64: the precise value for flagged elements.
double PreciseEncoding(const AbsolutePlan& p, int64_t pos, int64_t e) {
  if (p.options.kind == AbsoluteOptions::Kind::kLearned) {
    return p.options.table->values[pos * p.dim + e];
  }
  const SinusoidalChannel ch =
      ChannelOf(p.options.sinusoidal_layout == SinusoidalLayout::kInterleaved, p.dim, e);
  return ch.is_zero ? 0.0 : SinusoidalPrecise(pos, p.omega[ch.frequency], ch.is_sin);
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
  const int64_t frequencies = static_cast<int64_t>(p.omega.size());  // (d+1)/2 interleaved
  const double dpos = static_cast<double>(pos);
  const double* omega = p.omega.data();
  for (int64_t i = 0; i < frequencies; ++i) SinCos(dpos * omega[i], &sin_buf[i], &cos_buf[i]);
  if (p.options.sinusoidal_layout == SinusoidalLayout::kInterleaved) {
    for (int64_t i = 0; i < half; ++i) {
      row[2 * i] = sin_buf[i];
      row[2 * i + 1] = cos_buf[i];
    }
    if (p.dim % 2 == 1) row[p.dim - 1] = sin_buf[half];  // odd d: a last sin channel
  } else {
    for (int64_t i = 0; i < half; ++i) {
      row[i] = sin_buf[i];
      row[half + i] = cos_buf[i];
    }
    if (p.dim % 2 == 1) row[p.dim - 1] = 0.0f;  // fairseq's zero channel for odd d
  }
}

// Per-thread buffers, separately allocated so the compiler can see they do
// not overlap.
struct Scratch {
  explicit Scratch(int64_t dim)
      : row(dim), saved(dim), sin((dim + 1) / 2), cos((dim + 1) / 2), flag(dim) {}
  std::vector<float> row;    // [dim] PE in float32
  std::vector<float> saved;  // [dim] 16-bit inputs kept for recomputation
  std::vector<float> sin, cos;
  std::vector<uint8_t> flag;  // [dim] elements to recompute in double
};

template <typename T>
POSENC_ALWAYS_INLINE void AbsoluteTokens(const AbsolutePlan& p, T* __restrict x, int64_t begin,
                                         int64_t end, Scratch& s) {
  const int64_t dim = p.dim;
  float* __restrict row = s.row.data();
  float* __restrict saved = s.saved.data();
  uint8_t* __restrict flag = s.flag.data();
  const double x_scale = p.options.x_scale;
  const float xs = static_cast<float>(x_scale);
  for (int64_t t = begin; t < end; ++t) {
    const int64_t pos = p.positions.values[t];
    EncodingRow(p, pos, row, s.sin.data(), s.cos.data());
    T* __restrict y = x + t * dim;
    auto precise = [&](int64_t i) { return PreciseEncoding(p, pos, i); };
    if (!p.has_input) {
      for (int64_t i = 0; i < dim; ++i) {
        y[i] = EncodingOnly<T>(row[i], [&] { return precise(i); });
      }
      continue;
    }
    if constexpr (std::is_same_v<T, float>) {
      for (int64_t i = 0; i < dim; ++i) AddEncoding(&y[i], row[i], x_scale, [] { return 0.0; });
    } else {
      // AddEncoding's float32 half, vectorised; its double half for the
      // flagged elements after.
      for (int64_t i = 0; i < dim; ++i) {
        const float xi = ToFloat(y[i]);
        const float u = xi * xs;
        const float r = u + row[i];
        saved[i] = xi;
        y[i] = FromFloat<T>(r);
        flag[i] = static_cast<uint8_t>(SumNeedsPrecise(r, u, row[i]));
      }
      ForEachFlagged(flag, dim, [&](int64_t i) {
        y[i] =
            FromFloat<T>(static_cast<float>(static_cast<double>(saved[i]) * x_scale + precise(i)));
      });
    }
  }
}

POSENC_CPU_CLONES void AbsoluteDispatch(const AbsolutePlan& p, void* x, int64_t begin, int64_t end,
                                        Scratch& s) {
  switch (p.dtype) {
    case DType::kFloat32:
      return AbsoluteTokens<float>(p, static_cast<float*>(x), begin, end, s);
    case DType::kFloat16:
      return AbsoluteTokens<Half>(p, static_cast<Half*>(x), begin, end, s);
    case DType::kBFloat16:
      return AbsoluteTokens<BFloat16>(p, static_cast<BFloat16*>(x), begin, end, s);
    default:
      std::abort();  // planning admits floating dtypes only
  }
}

}  // namespace

void AbsoluteTokensCpu(const AbsolutePlan& plan, void* x, int64_t begin, int64_t end) {
  Scratch scratch(plan.dim);
  AbsoluteDispatch(plan, x, begin, end, scratch);
}

}  // namespace posenc::internal
