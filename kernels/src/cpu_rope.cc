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

// Per-token rotation constants: float cos/sin of every slot, scaled by the
// attention scale and signed for inverse rotation. Computed once per token,
// used by all heads.
// Per-thread buffers, separately allocated so the compiler can see they do
// not overlap (a shared buffer defeated vectorisation).
struct Scratch {
  explicit Scratch(int64_t rotary_dim)
      : cos(rotary_dim / 2), sin(rotary_dim / 2), cos_d(rotary_dim / 2), sin_d(rotary_dim / 2) {}
  std::vector<float> cos, sin;       // [half] scaled cos/sin, float32 outputs
  std::vector<double> cos_d, sin_d;  // [half] the same in double, 16-bit outputs
};

struct TokenAngles {
  float* c;    // [half] s cos (float32 outputs)
  float* n;    // [half] +-s sin
  double* cd;  // [half] s cos (16-bit outputs)
  double* nd;  // [half] +-s sin
};

// cos/sin of every slot of token t, scaled by the attention scale and signed
// for inverse rotation; once per token, shared by all heads. float32 outputs
// use float cos/sin; 16-bit outputs use double ones (see RotateHead16).
template <bool kDouble>
POSENC_ALWAYS_INLINE TokenAngles ComputeAngles(const RopePlan& p, int64_t t, Scratch& scratch) {
  const int64_t half = p.half();
  const int set = p.FreqSetOfToken(t);
  const double* f = p.inv_freq.data() + static_cast<int64_t>(set) * half;
  const double scale = p.attention_scale[set];
  const double sign = p.inverse ? -scale : scale;
  TokenAngles a{scratch.cos.data(), scratch.sin.data(), scratch.cos_d.data(), scratch.sin_d.data()};
  if constexpr (kDouble) {
    double* __restrict cd = a.cd;
    double* __restrict nd = a.nd;
    for (int64_t k = 0; k < half; ++k) {
      double s, co;
      SinCosPrecise(SlotAngle(p, t, k, f), &s, &co);
      cd[k] = co * scale;
      nd[k] = s * sign;
    }
  } else {
    float* __restrict c = a.c;
    float* __restrict n = a.n;
    const float scale_f = static_cast<float>(scale), sign_f = static_cast<float>(sign);
    for (int64_t k = 0; k < half; ++k) {
      float s, co;
      SinCos(SlotAngle(p, t, k, f), &s, &co);
      c[k] = co * scale_f;
      n[k] = s * sign_f;
    }
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

// 16-bit outputs must be within one ulp of the float64 result element by
// element, also where x*c - y*s cancels to a tiny value; float32 cannot
// promise that, double can (its error, ~2^-52 of the inputs, is far below a
// 16-bit ulp of any result above ~2^-45). Rounded double -> float -> T.
template <typename T, RopeStyle kStyle>
POSENC_ALWAYS_INLINE void RotateHead16(T* __restrict x, const TokenAngles& a, int64_t half) {
  const double* __restrict c = a.cd;
  const double* __restrict n = a.nd;
  for (int64_t k = 0; k < half; ++k) {
    const int64_t i = First<kStyle>(k, half), j = Second<kStyle>(k, half);
    const double u = ToFloat(x[i]), v = ToFloat(x[j]);
    x[i] = FromFloat<T>(static_cast<float>(u * c[k] - v * n[k]));
    x[j] = FromFloat<T>(static_cast<float>(v * c[k] + u * n[k]));
  }
}

template <typename T, RopeStyle kStyle>
POSENC_ALWAYS_INLINE void RopeTokens(const RopePlan& p, T* q, T* k, int64_t begin, int64_t end,
                                     Scratch& scratch) {
  constexpr bool kSixteenBit = !std::is_same_v<T, float>;
  const int64_t half = p.half();
  for (int64_t t = begin; t < end; ++t) {
    const TokenAngles a = ComputeAngles<kSixteenBit>(p, t, scratch);
    for (int64_t side = 0; side < 2; ++side) {
      T* base = side == 0 ? q : k;
      const int64_t heads = side == 0 ? p.query_heads : p.key_heads;
      if (base == nullptr) continue;
      for (int64_t h = 0; h < heads; ++h) {
        T* x = base + p.HeadOffset(t, h, heads);
        if constexpr (kSixteenBit) {
          RotateHead16<T, kStyle>(x, a, half);
        } else {
          RotateHeadF32<kStyle>(x, a, half);
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
