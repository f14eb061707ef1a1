#include <vector>

#include "angle.h"
#include "cpu_kernels.h"
#include "posenc/dtype.h"

namespace posenc::internal {
namespace {

// cos/sin of every frequency slot of one token, scaled by the attention scale
// and negated for inverse rotation. Computed once per token, used by all heads.
template <typename Acc>
POSENC_ALWAYS_INLINE void TokenAngles(const RopePlan& p, int64_t t, Acc* cos_out, Acc* sin_out) {
  const int64_t half = p.half();
  const double* f = p.inv_freq.data() + static_cast<int64_t>(p.FreqSetOfToken(t)) * half;
  const Acc scale = static_cast<Acc>(p.attention_scale[p.FreqSetOfToken(t)]);
  const Acc sign = p.inverse ? -scale : scale;
  const int64_t* pos = p.positions.values.data() + t * p.num_axes;
  if (p.num_axes == 1) {
    const double pos0 = static_cast<double>(pos[0]);
    for (int64_t k = 0; k < half; ++k) {
      Acc s, c;
      SinCosAcc(pos0 * f[k], &s, &c);
      cos_out[k] = c * scale;
      sin_out[k] = s * sign;
    }
  } else {
    const int32_t* axis = p.slot_axis.data();
    for (int64_t k = 0; k < half; ++k) {
      Acc s, c;
      SinCosAcc(static_cast<double>(pos[axis[k]]) * f[k], &s, &c);
      cos_out[k] = c * scale;
      sin_out[k] = s * sign;
    }
  }
}

template <typename T, RopeStyle kStyle, typename Acc>
POSENC_ALWAYS_INLINE void RotateHead(T* x, const Acc* c, const Acc* n, int64_t half) {
  if constexpr (kStyle == RopeStyle::kNeox) {
    T* y = x + half;
    for (int64_t i = 0; i < half; ++i) {
      const Acc a = ToFloat(x[i]), b = ToFloat(y[i]);
      x[i] = FromFloat<T>(static_cast<float>(a * c[i] - b * n[i]));
      y[i] = FromFloat<T>(static_cast<float>(b * c[i] + a * n[i]));
    }
  } else {
    for (int64_t i = 0; i < half; ++i) {
      const Acc a = ToFloat(x[2 * i]), b = ToFloat(x[2 * i + 1]);
      x[2 * i] = FromFloat<T>(static_cast<float>(a * c[i] - b * n[i]));
      x[2 * i + 1] = FromFloat<T>(static_cast<float>(b * c[i] + a * n[i]));
    }
  }
}

template <typename T, RopeStyle kStyle, typename Acc>
POSENC_ALWAYS_INLINE void RopeTokens(const RopePlan& p, T* q, T* k, int64_t begin, int64_t end,
                                     Acc* c, Acc* n) {
  const int64_t half = p.half();
  for (int64_t t = begin; t < end; ++t) {
    TokenAngles(p, t, c, n);
    for (int64_t h = 0; h < p.query_heads; ++h) {
      RotateHead<T, kStyle>(q + p.HeadOffset(t, h, p.query_heads), c, n, half);
    }
    if (k != nullptr) {
      for (int64_t h = 0; h < p.key_heads; ++h) {
        RotateHead<T, kStyle>(k + p.HeadOffset(t, h, p.key_heads), c, n, half);
      }
    }
  }
}

template <typename T>
POSENC_ALWAYS_INLINE void RopeTokensTyped(const RopePlan& p, void* q, void* k, int64_t begin,
                                          int64_t end, double* scratch) {
  using Acc = typename AccumulatorOf<T>::type;
  Acc* c = reinterpret_cast<Acc*>(scratch);
  Acc* n = c + p.half();
  T* kq = p.has_key ? static_cast<T*>(k) : nullptr;
  if (p.style == RopeStyle::kNeox) {
    RopeTokens<T, RopeStyle::kNeox>(p, static_cast<T*>(q), kq, begin, end, c, n);
  } else {
    RopeTokens<T, RopeStyle::kGptj>(p, static_cast<T*>(q), kq, begin, end, c, n);
  }
}

POSENC_CPU_CLONES void RopeTokensDispatch(const RopePlan& p, void* q, void* k, int64_t begin,
                                          int64_t end, double* scratch) {
  switch (p.dtype) {
    case DType::kFloat32:
      RopeTokensTyped<float>(p, q, k, begin, end, scratch);
      break;
    case DType::kFloat16:
      RopeTokensTyped<Half>(p, q, k, begin, end, scratch);
      break;
    case DType::kBFloat16:
      RopeTokensTyped<BFloat16>(p, q, k, begin, end, scratch);
      break;
    default:
      break;  // PlanRope admits floating dtypes only
  }
}

}  // namespace

void RopeTokensCpu(const RopePlan& plan, void* query, void* key, int64_t begin, int64_t end) {
  std::vector<double> scratch(2 * plan.half());  // cos and sin, float or double
  RopeTokensDispatch(plan, query, key, begin, end, scratch.data());
}

}  // namespace posenc::internal
