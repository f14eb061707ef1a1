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
#include <cstring>
#include <vector>

#include "cpu_kernels.h"
#include "math/rope_math.h"
#include "posenc/dtype.h"
#include "vec.h"

namespace posenc::internal {
namespace {

// Tokens whose cos/sin are kept at once: [kTokenBlock, R/2] floats twice
// stay in L1/L2 for any published head size.
constexpr int64_t kTokenBlock = 32;

POSENC_ALWAYS_INLINE double SlotAngle(const RopePlan& p, int64_t t, int64_t k) {
  const int64_t half = p.half();
  const double* f = p.inv_freq.data() + static_cast<int64_t>(p.FreqSetOfToken(t)) * half;
  const int64_t* pos = p.positions.values.data() + t * p.num_axes;
  return static_cast<double>(pos[p.num_axes == 1 ? 0 : p.slot_axis[k]]) * f[k];
}

// Per-thread buffers, separately allocated so the compiler can see they do
// not overlap.
struct Scratch {
  explicit Scratch(const RopePlan& p)
      : c(kTokenBlock * p.half()),
        n(kTokenBlock * p.half()),
        spread(p.dtype == DType::kBFloat16 && p.style == RopeStyle::kGptj),
        c2(2 * kTokenBlock * p.half()),  // allocated (small) even when unused:
        n2(2 * kTokenBlock * p.half()),  // callers offset into them
        saved(p.half()),
        flag(p.half()),
        pending_k(p.half()),
        pending_u(p.half()),
        pending_v(p.half()) {}
  std::vector<float> c, n;  // [kTokenBlock, half] s cos, +-s sin
  // bfloat16 GPT-J (spread): [kTokenBlock, 2 half] [c, c] and [-n, n] per
  // slot, laid out like the pairs they rotate (RotateHeadBF16).
  const bool spread;
  std::vector<float> c2, n2;
  std::vector<uint32_t> saved;  // a float16 head's rotary dims before rotation (2 x half)
  std::vector<uint8_t> flag;    // [half] pairs to recompute in double (float16)
  // bfloat16: a head's pairs to recompute in double, with their inputs.
  std::vector<int32_t> pending_k;
  std::vector<float> pending_u, pending_v;
};

POSENC_ALWAYS_INLINE void ComputeRotations(const RopePlan& p, int64_t t0, int64_t t1, Scratch& s) {
  const int64_t half = p.half();
  for (int64_t t = t0; t < t1; ++t) {
    const int set = p.FreqSetOfToken(t);
    const double* __restrict f = p.inv_freq.data() + static_cast<int64_t>(set) * half;
    const double scale = p.attention_scale[set];
    const int64_t* pos = p.positions.values.data() + t * p.num_axes;
    float* __restrict c = s.c.data() + (t - t0) * half;
    float* __restrict n = s.n.data() + (t - t0) * half;
    // One position for every slot, or one per slot's axis: separate loops
    // so the common one vectorises.
    if (p.num_axes == 1) {
      const double pos0 = static_cast<double>(pos[0]);
      for (int64_t k = 0; k < half; ++k) {
        const SlotRotation r = RotationOf(pos0 * f[k], scale, p.inverse);
        c[k] = r.c;
        n[k] = r.n;
      }
    } else {
      const int32_t* axis = p.slot_axis.data();
      for (int64_t k = 0; k < half; ++k) {
        const SlotRotation r =
            RotationOf(static_cast<double>(pos[axis[k]]) * f[k], scale, p.inverse);
        c[k] = r.c;
        n[k] = r.n;
      }
    }
  }
  if (s.spread) {
    for (int64_t t = 0; t < t1 - t0; ++t) {
      const float* __restrict c = s.c.data() + t * half;
      const float* __restrict n = s.n.data() + t * half;
      float* __restrict c2 = s.c2.data() + t * 2 * half;
      float* __restrict n2 = s.n2.data() + t * 2 * half;
      for (int64_t k = 0; k < half; ++k) {
        c2[2 * k] = c2[2 * k + 1] = c[k];
        n2[2 * k] = -n[k];
        n2[2 * k + 1] = n[k];
      }
    }
  }
}

// float32 heads: rotated in place, pair by pair.
template <RopeStyle kStyle>
POSENC_ALWAYS_INLINE void RotateHeadF32(float* __restrict x, const float* __restrict c,
                                        const float* __restrict n, int64_t half) {
  for (int64_t k = 0; k < half; ++k) {
    const int64_t i = PairFirst(kStyle, k, half), j = PairSecond(kStyle, k, half);
    RotateF32(x[i], x[j], c[k], n[k], &x[i], &x[j]);
  }
}

// The float32 pass of 16-bit RoPE over one head, in place: every pair
// rotated in float32 and stored, and flagged when its result needs double.
// One fused loop (so the head stays in L1: widening whole rows into float
// buffers first measured 30% slower), in its own function compiled per
// instruction set: inlined into the callers, GCC gave up vectorising it.
#define POSENC_ROTATE_HEAD16(Name, T, kStyle)                                              \
  POSENC_CPU_CLONES __attribute__((noinline)) void Name(                                   \
      T* __restrict x, const float* __restrict c, const float* __restrict n, int64_t half, \
      float scale, uint8_t* __restrict flag) {                                             \
    for (int64_t k = 0; k < half; ++k) {                                                   \
      const int64_t i = PairFirst(kStyle, k, half), j = PairSecond(kStyle, k, half);       \
      const float u = ToFloat(x[i]), v = ToFloat(x[j]);                                    \
      float a, b;                                                                          \
      RotateF32(u, v, c[k], n[k], &a, &b);                                                 \
      flag[k] = PairNeedsPrecise(a, b, u, v, scale);                                       \
      x[i] = FromFloat<T>(a);                                                              \
      x[j] = FromFloat<T>(b);                                                              \
    }                                                                                      \
  }
POSENC_ROTATE_HEAD16(RotateHeadHalfNeox, Half, RopeStyle::kNeox)
POSENC_ROTATE_HEAD16(RotateHeadHalfGptj, Half, RopeStyle::kGptj)
#undef POSENC_ROTATE_HEAD16

template <typename T, RopeStyle kStyle>
POSENC_ALWAYS_INLINE void RotateHead16Pass(T* x, const float* c, const float* n, int64_t half,
                                           float scale, uint8_t* flag) {
  static_assert(std::is_same_v<T, Half>);
  return kStyle == RopeStyle::kNeox ? RotateHeadHalfNeox(x, c, n, half, scale, flag)
                                    : RotateHeadHalfGptj(x, c, n, half, scale, flag);
}

// 16-bit RoPE of one head of token t: the float32 pass, then the flagged
// pairs again in double from the head's original values (a 256-byte copy
// for a 128-dim head: cheaper than keeping flagged inputs in the loop).
template <typename T, RopeStyle kStyle>
POSENC_ALWAYS_INLINE void RotateHead16(const RopePlan& p, int64_t t, T* x, const float* c,
                                       const float* n, Scratch& s) {
  const int64_t half = p.half();
  T* saved = reinterpret_cast<T*>(s.saved.data());
  std::memcpy(saved, x, 2 * half * sizeof(T));
  const double scale = p.attention_scale[p.FreqSetOfToken(t)];
  RotateHead16Pass<T, kStyle>(x, c, n, half, static_cast<float>(scale), s.flag.data());
  ForEachFlagged(s.flag.data(), half, [&](int64_t k) {
    const int64_t i = PairFirst(kStyle, k, half), j = PairSecond(kStyle, k, half);
    float a, b;
    RotatePrecise(ToFloat(saved[i]), ToFloat(saved[j]), SlotAngle(p, t, k), scale, p.inverse, &a,
                  &b);
    x[i] = FromFloat<T>(a);
    x[j] = FromFloat<T>(b);
  });
}

// bfloat16 RoPE of one head of token t, in place, 8 pairs per step in
// hand-written vectors (vec.h): RotateF32 lane by lane, PairNeedsPrecise as
// "both |a| and |b| >= its bound" (false for NaN as well), and one test per
// 8 pairs. Steps with a lane that fails it, and the pairs past the last
// multiple of 8, go pair by pair through the scalar contract; the pairs it
// flags are redone in double after the loop from their inputs, kept in
// s.pending_*. GPT-J pairs are adjacent, so a step rotates 16 consecutive
// elements as (u c + v (-n), v c + u n) with the slot's [c, c] and [-n, n]
// spread to match (ComputeRotations): x + (-y) is x - y in IEEE arithmetic,
// so the results are RotateF32's bit for bit.
template <RopeStyle kStyle>
POSENC_ALWAYS_INLINE void RotateHeadBF16(const RopePlan& p, int64_t t, BFloat16* __restrict x,
                                         const float* __restrict c, const float* __restrict n,
                                         const float* __restrict c2, const float* __restrict n2,
                                         Scratch& s) {
  const int64_t half = p.half(), steps_end = half - half % 8;
  const double scale = p.attention_scale[p.FreqSetOfToken(t)];
  const float scale_f = static_cast<float>(scale);
  int32_t* __restrict pending_k = s.pending_k.data();
  float* __restrict pending_u = s.pending_u.data();
  float* __restrict pending_v = s.pending_v.data();
  int64_t pending = 0;
  auto pair = [=, &pending](int64_t k) {
    const int64_t i = PairFirst(kStyle, k, half), j = PairSecond(kStyle, k, half);
    const float u = ToFloat(x[i]), v = ToFloat(x[j]);
    float a, b;
    RotateF32(u, v, c[k], n[k], &a, &b);
    if (PairNeedsPrecise(a, b, u, v, scale_f)) {
      pending_k[pending] = static_cast<int32_t>(k);
      pending_u[pending] = u;
      pending_v[pending++] = v;
    }
    x[i] = FromFloat<BFloat16>(a);
    x[j] = FromFloat<BFloat16>(b);
  };
  for (int64_t k = 0; k < steps_end; k += 8) {
    V8 r0, r1, bound0, bound1;
    BFloat16 *y0, *y1;
    if constexpr (kStyle == RopeStyle::kNeox) {
      y0 = x + k;
      y1 = x + half + k;
      const V8 u = BFloat16ToFloat8(y0), v = BFloat16ToFloat8(y1);
      const V8 ck = Load8(c + k), nk = Load8(n + k);
      r0 = u * ck - v * nk;
      r1 = v * ck + u * nk;
      bound0 = bound1 = kCancellationBound * (Abs8(u) + Abs8(v)) * scale_f;
    } else {
      y0 = x + 2 * k;
      y1 = x + 2 * k + 8;
      const V8 w0 = BFloat16ToFloat8(y0), w1 = BFloat16ToFloat8(y1);
      const V8 s0 = __builtin_shufflevector(w0, w0, 1, 0, 3, 2, 5, 4, 7, 6);
      const V8 s1 = __builtin_shufflevector(w1, w1, 1, 0, 3, 2, 5, 4, 7, 6);
      r0 = w0 * Load8(c2 + 2 * k) + s0 * Load8(n2 + 2 * k);
      r1 = w1 * Load8(c2 + 2 * k + 8) + s1 * Load8(n2 + 2 * k + 8);
      bound0 = kCancellationBound * (Abs8(w0) + Abs8(s0)) * scale_f;
      bound1 = kCancellationBound * (Abs8(w1) + Abs8(s1)) * scale_f;
    }
    if (__builtin_expect(AllTrue((Abs8(r0) >= bound0) & (Abs8(r1) >= bound1)), 1)) {
      StoreBFloat16x16(r0, r1, y0, y1);
    } else {
      for (int64_t j = k; j < k + 8; ++j) pair(j);
    }
  }
  for (int64_t k = steps_end; k < half; ++k) pair(k);
  for (int64_t m = 0; m < pending; ++m) {
    const int64_t k = pending_k[m];
    const int64_t i = PairFirst(kStyle, k, half), j = PairSecond(kStyle, k, half);
    float a, b;
    RotatePrecise(pending_u[m], pending_v[m], SlotAngle(p, t, k), scale, p.inverse, &a, &b);
    x[i] = FromFloat<BFloat16>(a);
    x[j] = FromFloat<BFloat16>(b);
  }
}

// One head of token t: ct/nt are its slots' rotations (and ct2/nt2 their
// spread form for bfloat16 GPT-J).
template <typename T, RopeStyle kStyle>
POSENC_ALWAYS_INLINE void RotateHead(const RopePlan& p, int64_t t, T* head, const float* ct,
                                     const float* nt, const float* ct2, const float* nt2,
                                     Scratch& s) {
  if constexpr (std::is_same_v<T, float>) {
    RotateHeadF32<kStyle>(head, ct, nt, p.half());
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    RotateHeadBF16<kStyle>(p, t, head, ct, nt, ct2, nt2, s);
  } else {
    RotateHead16<T, kStyle>(p, t, head, ct, nt, s);
  }
}

// Asks for the cache lines of [p, p + bytes) ahead of a write.
POSENC_ALWAYS_INLINE void PrefetchForWrite(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(c + b, 1, 3);
}

template <typename T, RopeStyle kStyle>
POSENC_ALWAYS_INLINE void RopeBlock(const RopePlan& p, T* q, T* k, int64_t t0, int64_t t1,
                                    Scratch& s) {
  const int64_t half = p.half(), D = p.head_dim;
  ComputeRotations(p, t0, t1, s);
  for (int side = 0; side < 2; ++side) {
    T* base = side == 0 ? q : k;
    if (base == nullptr) continue;
    const int64_t heads = side == 0 ? p.query_heads : p.key_heads;
    if (p.layout == RopeLayout::kBHSD) {
      // Head-major: one head's consecutive tokens are contiguous, up to the
      // end of their sequence.
      for (int64_t run = t0; run < t1;) {
        const int64_t run_end = std::min(t1, (run / p.seq_len + 1) * p.seq_len);
        const HeadSpan span = HeadsOfToken(p.layout, run, p.seq_len, heads, D);
        const float* c = s.c.data() + (run - t0) * half;
        const float* n = s.n.data() + (run - t0) * half;
        const float* c2 = s.c2.data() + (run - t0) * 2 * half;
        const float* n2 = s.n2.data() + (run - t0) * 2 * half;
        for (int64_t h = 0; h < heads; ++h) {
          T* x = base + span.first + h * span.stride;
          for (int64_t t = run; t < run_end; ++t) {
            T* head = x + (t - run) * D;
            // The next head's run is far away (1 MiB for a 4096-token
            // bfloat16 sequence of 128-dim heads) and the hardware
            // prefetcher restarts at every run: fetch its row while this
            // one rotates.
            if (h + 1 < heads) PrefetchForWrite(head + span.stride, D * sizeof(T));
            RotateHead<T, kStyle>(p, t, head, c + (t - run) * half, n + (t - run) * half,
                                  c2 + (t - run) * 2 * half, n2 + (t - run) * 2 * half, s);
          }
        }
        run = run_end;
      }
    } else {
      // Token-major: a token's heads are contiguous.
      for (int64_t t = t0; t < t1; ++t) {
        T* x = base + HeadsOfToken(p.layout, t, p.seq_len, heads, D).first;
        const float* c = s.c.data() + (t - t0) * half;
        const float* n = s.n.data() + (t - t0) * half;
        const float* c2 = s.c2.data() + (t - t0) * 2 * half;
        const float* n2 = s.n2.data() + (t - t0) * 2 * half;
        for (int64_t h = 0; h < heads; ++h) RotateHead<T, kStyle>(p, t, x + h * D, c, n, c2, n2, s);
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
  Scratch scratch(plan);
  RopeTokensDispatch(plan, query, key, begin, end, scratch);
}

}  // namespace posenc::internal
