#include <cmath>
#include <vector>

#include "angle.h"
#include "cpu_kernels.h"
#include "posenc/dtype.h"

namespace posenc::internal {
namespace {

// The angle of slot k of token t, in float64.
POSENC_ALWAYS_INLINE double SlotAngle(const RopePlan& p, int64_t t, int64_t k, const double* f) {
  const int64_t* pos = p.positions.values.data() + t * p.num_axes;
  return static_cast<double>(pos[p.num_axes == 1 ? 0 : p.slot_axis[k]]) * f[k];
}

// Per-thread buffers, separately allocated so the compiler can see they do
// not overlap (a shared buffer defeated vectorisation).
struct Scratch {
  explicit Scratch(int64_t rotary_dim)
      : cos(rotary_dim / 2), sin(rotary_dim / 2), saved(rotary_dim), flag(rotary_dim / 2) {}
  std::vector<float> cos, sin;  // [half] scaled cos/sin of the token
  std::vector<uint16_t> saved;  // [rotary_dim] one head's 16-bit inputs
  std::vector<uint8_t> flag;    // [half] pairs to recompute in double
};

// Per-token rotation constants: float cos/sin of every slot, scaled by the
// attention scale and signed for inverse rotation. Computed once per token,
// used by all heads.
struct TokenAngles {
  const double* f;
  double scale;  // s
  double sign;   // s, or -s for inverse rotation
  float* c;      // [half] s cos
  float* n;      // [half] +-s sin
};

POSENC_ALWAYS_INLINE TokenAngles ComputeAngles(const RopePlan& p, int64_t t, float* __restrict c,
                                               float* __restrict n) {
  const int64_t half = p.half();
  const int set = p.FreqSetOfToken(t);
  TokenAngles a{p.inv_freq.data() + static_cast<int64_t>(set) * half, p.attention_scale[set], 0, c, n};
  a.sign = p.inverse ? -a.scale : a.scale;
  const float scale = static_cast<float>(a.scale), sign = static_cast<float>(a.sign);
  for (int64_t k = 0; k < half; ++k) {
    float s, co;
    SinCos(SlotAngle(p, t, k, a.f), &s, &co);
    c[k] = co * scale;
    n[k] = s * sign;
  }
  return a;
}

// Element indices of pair k.
template <RopeStyle kStyle>
POSENC_ALWAYS_INLINE int64_t First(int64_t k, int64_t /*half*/) {
  return kStyle == RopeStyle::kNeox ? k : 2 * k;
}
template <RopeStyle kStyle>
POSENC_ALWAYS_INLINE int64_t Second(int64_t k, int64_t half) {
  return kStyle == RopeStyle::kNeox ? k + half : 2 * k + 1;
}

// float32 outputs: float arithmetic meets their relative-norm bar.
template <RopeStyle kStyle>
POSENC_ALWAYS_INLINE void RotateHeadF32(float* __restrict x, const TokenAngles& a, int64_t half) {
  const float* __restrict c = a.c;
  const float* __restrict n = a.n;
  for (int64_t k = 0; k < half; ++k) {
    const int64_t i = First<kStyle>(k, half), j = Second<kStyle>(k, half);
    const float u = x[i], v = x[j];
    x[i] = u * c[k] - v * n[k];
    x[j] = v * c[k] + u * n[k];
  }
}

// 16-bit outputs: float arithmetic, rounded once to T and stored at once;
// the inputs are kept in `saved` so that the pairs the cancellation bound
// flags (see angle.h) can be recomputed in double afterwards.
template <typename T, RopeStyle kStyle>
POSENC_ALWAYS_INLINE void RotateHead16(const RopePlan& p, int64_t t, T* __restrict x,
                                       const TokenAngles& a, int64_t half, T* __restrict saved,
                                       uint8_t* __restrict flag) {
  const float* __restrict c = a.c;
  const float* __restrict n = a.n;
  const float bound = kCancellationBound * std::fabs(static_cast<float>(a.scale));
  for (int64_t k = 0; k < half; ++k) {
    const int64_t i = First<kStyle>(k, half), j = Second<kStyle>(k, half);
    const T xi = x[i], xj = x[j];
    saved[i] = xi;
    saved[j] = xj;
    const float u = ToFloat(xi), v = ToFloat(xj);
    const float r1 = u * c[k] - v * n[k];
    const float r2 = v * c[k] + u * n[k];
    x[i] = FromFloat<T>(r1);
    x[j] = FromFloat<T>(r2);
    const float m = bound * (std::fabs(u) + std::fabs(v));
    flag[k] = static_cast<uint8_t>((std::fabs(r1) < m) | (std::fabs(r2) < m));
  }
  ForEachFlagged(flag, half, [&](int64_t k) {
    const int64_t i = First<kStyle>(k, half), j = Second<kStyle>(k, half);
    const double u = ToFloat(saved[i]), v = ToFloat(saved[j]);
    double s, co;
    SinCosPrecise(SlotAngle(p, t, k, a.f), &s, &co);
    const double cd = co * a.scale, nd = s * a.sign;
    x[i] = FromFloat<T>(static_cast<float>(u * cd - v * nd));
    x[j] = FromFloat<T>(static_cast<float>(v * cd + u * nd));
  });
}

template <typename T, RopeStyle kStyle>
POSENC_ALWAYS_INLINE void RopeTokens(const RopePlan& p, T* q, T* k, int64_t begin, int64_t end,
                                     Scratch& scratch) {
  const int64_t half = p.half();
  float* c = scratch.cos.data();
  float* n = scratch.sin.data();
  T* saved = reinterpret_cast<T*>(scratch.saved.data());
  uint8_t* flag = scratch.flag.data();
  for (int64_t t = begin; t < end; ++t) {
    const TokenAngles a = ComputeAngles(p, t, c, n);
    for (int64_t side = 0; side < 2; ++side) {
      T* base = side == 0 ? q : k;
      const int64_t heads = side == 0 ? p.query_heads : p.key_heads;
      if (base == nullptr) continue;
      for (int64_t h = 0; h < heads; ++h) {
        T* x = base + p.HeadOffset(t, h, heads);
        if constexpr (std::is_same_v<T, float>) {
          RotateHeadF32<kStyle>(x, a, half);
        } else {
          RotateHead16<T, kStyle>(p, t, x, a, half, saved, flag);
        }
      }
    }
  }
}

template <typename T>
POSENC_ALWAYS_INLINE void RopeTokensTyped(const RopePlan& p, void* q, void* k, int64_t begin,
                                          int64_t end, Scratch& scratch) {
  T* kq = p.has_key ? static_cast<T*>(k) : nullptr;
  if (p.style == RopeStyle::kNeox) {
    RopeTokens<T, RopeStyle::kNeox>(p, static_cast<T*>(q), kq, begin, end, scratch);
  } else {
    RopeTokens<T, RopeStyle::kGptj>(p, static_cast<T*>(q), kq, begin, end, scratch);
  }
}

POSENC_CPU_CLONES void RopeTokensDispatch(const RopePlan& p, void* q, void* k, int64_t begin,
                                          int64_t end, Scratch& scratch) {
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
  Scratch scratch(plan.rotary_dim);
  RopeTokensDispatch(plan, query, key, begin, end, scratch);
}

}  // namespace posenc::internal
