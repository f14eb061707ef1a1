// RoPE on the CPU. Tokens are taken in blocks: the block's cos/sin are
// computed once (float32, per slot, scaled and signed) and then applied to
// every head, head-major for BHSD (whose heads are far apart) and
// token-major otherwise, so memory is read in long runs either way. The
// element arithmetic is math/rope_math.h, the same as the CUDA kernel's;
// loops are written so the compiler vectorises them, which is why 16-bit
// outputs take two passes: float32 for all, then double for the few the
// cancellation bound flags.
#include <algorithm>
#include <cstdlib>
#include <vector>

#include "cpu_kernels.h"
#include "math/rope_math.h"
#include "posenc/dtype.h"

namespace posenc::internal {
namespace {

// Tokens whose cos/sin are kept at once: [kTokenBlock, R/2] floats twice
// stay in L1/L2 for any published head size.
constexpr int64_t kTokenBlock = 16;

POSENC_ALWAYS_INLINE double SlotAngle(const RopePlan& p, int64_t t, int64_t k) {
  const int64_t half = p.half();
  const double* f = p.inv_freq.data() + static_cast<int64_t>(p.FreqSetOfToken(t)) * half;
  const int64_t* pos = p.positions.values.data() + t * p.num_axes;
  return static_cast<double>(pos[p.num_axes == 1 ? 0 : p.slot_axis[k]]) * f[k];
}

// Per-thread buffers, separately allocated so the compiler can see they do
// not overlap.
struct Scratch {
  explicit Scratch(int64_t half)
      : c(kTokenBlock * half), n(kTokenBlock * half), u(half), v(half), flag(half) {}
  std::vector<float> c, n;  // [kTokenBlock, half] s cos, +-s sin
  std::vector<float> u, v;  // [half] 16-bit inputs, kept for recomputation
  std::vector<uint8_t> flag;
};

POSENC_ALWAYS_INLINE void ComputeRotations(const RopePlan& p, int64_t t0, int64_t t1, Scratch& s) {
  const int64_t half = p.half();
  for (int64_t t = t0; t < t1; ++t) {
    const double scale = p.attention_scale[p.FreqSetOfToken(t)];
    float* __restrict c = s.c.data() + (t - t0) * half;
    float* __restrict n = s.n.data() + (t - t0) * half;
    for (int64_t k = 0; k < half; ++k) {
      const SlotRotation r = RotationOf(SlotAngle(p, t, k), scale, p.inverse);
      c[k] = r.c;
      n[k] = r.n;
    }
  }
}

template <typename T, RopeStyle kStyle>
POSENC_ALWAYS_INLINE void RotateHead(const RopePlan& p, int64_t t, T* __restrict x,
                                     const float* __restrict c, const float* __restrict n,
                                     Scratch& s) {
  const int64_t half = p.half();
  if constexpr (std::is_same_v<T, float>) {
    for (int64_t k = 0; k < half; ++k) {
      const int64_t i = PairFirst(kStyle, k, half), j = PairSecond(kStyle, k, half);
      RotateF32(x[i], x[j], SlotRotation{c[k], n[k]}, &x[i], &x[j]);
    }
  } else {
    const float scale = static_cast<float>(p.attention_scale[p.FreqSetOfToken(t)]);
    float* __restrict u_saved = s.u.data();
    float* __restrict v_saved = s.v.data();
    uint8_t* __restrict flag = s.flag.data();
    for (int64_t k = 0; k < half; ++k) {
      const int64_t i = PairFirst(kStyle, k, half), j = PairSecond(kStyle, k, half);
      const float u = ToFloat(x[i]), v = ToFloat(x[j]);
      float a, b;
      RotateF32(u, v, SlotRotation{c[k], n[k]}, &a, &b);
      u_saved[k] = u;
      v_saved[k] = v;
      flag[k] = static_cast<uint8_t>(NeedsPrecise(a, u, v, scale) | NeedsPrecise(b, u, v, scale));
      x[i] = FromFloat<T>(a);
      x[j] = FromFloat<T>(b);
    }
    const double scale_d = p.attention_scale[p.FreqSetOfToken(t)];
    ForEachFlagged(flag, half, [&](int64_t k) {
      float a, b;
      RotatePrecise(u_saved[k], v_saved[k], SlotAngle(p, t, k), scale_d, p.inverse, &a, &b);
      x[PairFirst(kStyle, k, half)] = FromFloat<T>(a);
      x[PairSecond(kStyle, k, half)] = FromFloat<T>(b);
    });
  }
}

template <typename T, RopeStyle kStyle>
POSENC_ALWAYS_INLINE void RopeBlock(const RopePlan& p, T* q, T* k, int64_t t0, int64_t t1,
                                    Scratch& s) {
  const int64_t half = p.half();
  ComputeRotations(p, t0, t1, s);
  auto heads_of = [&](int side) { return side == 0 ? p.query_heads : p.key_heads; };
  auto head = [&](int side, int64_t t, int64_t h) {
    T* base = side == 0 ? q : k;
    const HeadSpan span = HeadsOfToken(p.layout, t, p.seq_len, heads_of(side), p.head_dim);
    return base + span.first + h * span.stride;
  };
  for (int side = 0; side < 2; ++side) {
    if ((side == 0 ? q : k) == nullptr) continue;
    if (p.layout == RopeLayout::kBHSD) {
      for (int64_t h = 0; h < heads_of(side); ++h) {
        for (int64_t t = t0; t < t1; ++t) {
          RotateHead<T, kStyle>(p, t, head(side, t, h), s.c.data() + (t - t0) * half,
                                s.n.data() + (t - t0) * half, s);
        }
      }
    } else {
      for (int64_t t = t0; t < t1; ++t) {
        for (int64_t h = 0; h < heads_of(side); ++h) {
          RotateHead<T, kStyle>(p, t, head(side, t, h), s.c.data() + (t - t0) * half,
                                s.n.data() + (t - t0) * half, s);
        }
      }
    }
  }
}

template <typename T, RopeStyle kStyle>
POSENC_ALWAYS_INLINE void RopeTokensTyped(const RopePlan& p, void* q, void* k, int64_t begin,
                                          int64_t end, Scratch& s) {
  T* kq = p.has_key ? static_cast<T*>(k) : nullptr;
  for (int64_t t0 = begin; t0 < end; t0 += kTokenBlock) {
    RopeBlock<T, kStyle>(p, static_cast<T*>(q), kq, t0, std::min(end, t0 + kTokenBlock), s);
  }
}

// The one function compiled per instruction set: every dtype and style
// inlined into it.
POSENC_CPU_CLONES void RopeTokensDispatch(const RopePlan& p, void* q, void* k, int64_t begin,
                                          int64_t end, Scratch& s) {
  const bool neox = p.style == RopeStyle::kNeox;
  switch (p.dtype) {
    case DType::kFloat32:
      return neox ? RopeTokensTyped<float, RopeStyle::kNeox>(p, q, k, begin, end, s)
                  : RopeTokensTyped<float, RopeStyle::kGptj>(p, q, k, begin, end, s);
    case DType::kFloat16:
      return neox ? RopeTokensTyped<Half, RopeStyle::kNeox>(p, q, k, begin, end, s)
                  : RopeTokensTyped<Half, RopeStyle::kGptj>(p, q, k, begin, end, s);
    case DType::kBFloat16:
      return neox ? RopeTokensTyped<BFloat16, RopeStyle::kNeox>(p, q, k, begin, end, s)
                  : RopeTokensTyped<BFloat16, RopeStyle::kGptj>(p, q, k, begin, end, s);
    default:
      std::abort();  // PlanRope admits floating dtypes only
  }
}

}  // namespace

void RopeTokensCpu(const RopePlan& plan, void* query, void* key, int64_t begin, int64_t end) {
  if (!KnownStyle(plan.style) || !KnownLayout(plan.layout)) std::abort();  // planning checks
  Scratch scratch(plan.half());
  RopeTokensDispatch(plan, query, key, begin, end, scratch);
}

}  // namespace posenc::internal
