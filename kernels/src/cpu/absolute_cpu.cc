// Absolute encodings on the CPU: for each token, its PE row in float32 (a
// rotation per frequency of its anchor's sine and cosine, math/phase.h), then
// y = x * x_scale + PE over the row. The element arithmetic is
// math/absolute_math.h and math/phase.h, the same as the CUDA kernel's;
// 16-bit rows take two passes (float32 for all, double for the flagged few)
// so the first vectorises.
#include <cstdlib>
#include <vector>

#include "cpu_kernels.h"
#include "math/absolute_math.h"
#include "math/phase.h"
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

// Per-thread buffers, separately allocated so the compiler can see they do
// not overlap.
struct Scratch {
  explicit Scratch(const AbsolutePlan& p)
      : row(p.dim),
        saved(p.dim),
        anchor_sin(p.phase_step.size()),
        anchor_cos(p.phase_step.size()),
        step_hi(p.phase_step.size()),
        step_lo(p.phase_step.size()),
        flag(p.dim) {
    for (size_t i = 0; i < p.phase_step.size(); ++i) {
      step_hi[i] = static_cast<uint32_t>(p.phase_step[i] >> 32);
      step_lo[i] = static_cast<uint32_t>(p.phase_step[i]);
    }
  }
  std::vector<float> row;    // [dim] PE in float32
  std::vector<float> saved;  // [dim] 16-bit inputs kept for recomputation
  // sin and cos of anchor * w_i (math/phase.h), for the anchor below. Not a
  // multiple of 16 until the first row, so that row computes them.
  std::vector<float> anchor_sin, anchor_cos;
  int64_t anchor = 1;
  std::vector<uint32_t> step_hi, step_lo;  // words of plan.phase_step
  std::vector<uint8_t> flag;               // [dim] elements to recompute in double
};

// sin and cos of anchor * w_i for every frequency: SinCosOfPosition with the
// position's sign hoisted out and each step's words pre-split, so the loop
// vectorises with 32-bit lanes.
POSENC_ALWAYS_INLINE void AnchorRow(int64_t anchor, int64_t frequencies, Scratch& s) {
  const uint32_t abs_pos = static_cast<uint32_t>(anchor < 0 ? -anchor : anchor);
  const uint32_t* __restrict step_hi = s.step_hi.data();
  const uint32_t* __restrict step_lo = s.step_lo.data();
  float* __restrict as = s.anchor_sin.data();
  float* __restrict ac = s.anchor_cos.data();
  for (int64_t i = 0; i < frequencies; ++i) {
    SinCosOfPhase(PhaseOf(abs_pos, step_hi[i], step_lo[i]), &as[i], &ac[i]);
  }
  if (anchor < 0) {
    for (int64_t i = 0; i < frequencies; ++i) as[i] = -as[i];
  }
  s.anchor = anchor;
}

// PE[pos] in float32, [dim]: SinusoidalSinCos per frequency, its anchor's
// sin and cos computed once for a run of tokens that share it.
POSENC_ALWAYS_INLINE void EncodingRow(const AbsolutePlan& p, int64_t pos, Scratch& s) {
  float* __restrict row = s.row.data();
  if (p.options.kind == AbsoluteOptions::Kind::kLearned) {
    const float* src = p.options.table->values.data() + pos * p.dim;
    for (int64_t i = 0; i < p.dim; ++i) row[i] = src[i];
    return;
  }
  const int64_t half = p.dim / 2;
  const int64_t frequencies = static_cast<int64_t>(p.omega.size());  // (d+1)/2 interleaved
  const int64_t anchor = PhaseAnchor(pos);
  if (anchor != s.anchor) AnchorRow(anchor, frequencies, s);
  const float* __restrict as = s.anchor_sin.data();
  const float* __restrict ac = s.anchor_cos.data();
  const float* __restrict ts = p.offset_sin.data() + (pos - anchor) * frequencies;
  const float* __restrict tc = p.offset_cos.data() + (pos - anchor) * frequencies;
  if (p.options.sinusoidal_layout == SinusoidalLayout::kInterleaved) {
    for (int64_t i = 0; i < half; ++i) {
      RotateSinCos(as[i], ac[i], ts[i], tc[i], &row[2 * i], &row[2 * i + 1]);
    }
    if (p.dim % 2 == 1) {  // odd d: a last sin channel
      float c;
      RotateSinCos(as[half], ac[half], ts[half], tc[half], &row[p.dim - 1], &c);
    }
  } else {
    for (int64_t i = 0; i < half; ++i) {
      RotateSinCos(as[i], ac[i], ts[i], tc[i], &row[i], &row[half + i]);
    }
    if (p.dim % 2 == 1) row[p.dim - 1] = 0.0f;  // fairseq's zero channel for odd d
  }
}

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
    EncodingRow(p, pos, s);
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
  Scratch scratch(plan);
  AbsoluteDispatch(plan, x, begin, end, scratch);
}

}  // namespace posenc::internal
