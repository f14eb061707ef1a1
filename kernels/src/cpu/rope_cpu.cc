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

#ifdef POSENC_CPU_BF16_WIDE
#include <immintrin.h>
#endif

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
        pending_v(p.half()),
        wide_k(p.half()),
        wide_u(p.half()),
        wide_v(p.half()) {}
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
  // bfloat16, AVX-512 BF16: pairs of 16-pair steps to redo, with their inputs.
  std::vector<int32_t> wide_k;
  std::vector<float> wide_u, wide_v;
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
      flag[k] = PairNeedsPrecise<T>(a, b, u, v, scale);                                    \
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

#ifdef POSENC_CPU_BF16_WIDE
#define POSENC_BF16_WIDE_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,bmi2")))

// 16 stored bfloat16 values widened to float.
POSENC_BF16_WIDE_TARGET POSENC_ALWAYS_INLINE __m512 WidenBFloat16x16(const BFloat16* y) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// The bound a lane's float result must reach for VCVTNE2PS2BF16 to narrow
// it as FloatToBFloat16 does with nothing to recompute: the cancellation
// bound, and at least 2^-126, below which the instruction flushes to zero.
POSENC_BF16_WIDE_TARGET POSENC_ALWAYS_INLINE __m512 NarrowBound(__m512 cancellation_bound) {
  return _mm512_max_ps(cancellation_bound, _mm512_set1_ps(0x1p-126f));
}

// Lanes that narrow exactly: |r| >= bound (false for NaN), or inputs both
// zero (sum = |u| + |v| = 0), whose result is an exact zero.
POSENC_BF16_WIDE_TARGET POSENC_ALWAYS_INLINE __mmask16 NarrowsExactly(__m512 r, __m512 bound,
                                                                      __mmask16 zero_inputs) {
  return _kor_mask16(_mm512_cmp_ps_mask(_mm512_abs_ps(r), bound, _CMP_GE_OQ), zero_inputs);
}

// RotateHeadBF16's 16-pair steps (pairs [0, returned)), in 512-bit registers
// and narrowed by VCVTNE2PS2BF16. Every step is stored; a pair with a lane
// NarrowsExactly rejects (about one step in ten on random data) is also
// appended, with its inputs, to slow_k/u/v[*num_slow] for the caller to
// redo by the scalar contract. Not inlined: a default-target caller cannot
// inline AVX-512 code; one call per head.
template <RopeStyle kStyle>
POSENC_BF16_WIDE_TARGET __attribute__((noinline)) int64_t RotateBF16Wide(
    BFloat16* __restrict x, const float* __restrict c, const float* __restrict n,
    const float* __restrict c2, const float* __restrict n2, int64_t half, float scale_f,
    int32_t* __restrict slow_k, float* __restrict slow_u, float* __restrict slow_v,
    int64_t* num_slow) {
  const __m512 bound_scale = _mm512_set1_ps(kCancellationBound<BFloat16>);
  const __m512 scale_v = _mm512_set1_ps(scale_f);
  int64_t k0 = 0;
  for (; k0 + 16 <= half; k0 += 16) {
    __m512 r0, r1, bound0, bound1, in0, in1;  // in0/in1: the step's inputs
    __mmask16 zero0, zero1;                   // lanes whose pair's inputs are both zero
    const __m512 zero = _mm512_setzero_ps();
    if constexpr (kStyle == RopeStyle::kNeox) {
      const __m512 u = WidenBFloat16x16(x + k0), v = WidenBFloat16x16(x + half + k0);
      in0 = u;
      in1 = v;
      const __m512 ck = _mm512_loadu_ps(c + k0), nk = _mm512_loadu_ps(n + k0);
      r0 = _mm512_sub_ps(_mm512_mul_ps(u, ck), _mm512_mul_ps(v, nk));
      r1 = _mm512_add_ps(_mm512_mul_ps(v, ck), _mm512_mul_ps(u, nk));
      const __m512 sum = _mm512_add_ps(_mm512_abs_ps(u), _mm512_abs_ps(v));
      zero0 = zero1 = _mm512_cmp_ps_mask(sum, zero, _CMP_EQ_OQ);
      bound0 = bound1 = NarrowBound(_mm512_mul_ps(_mm512_mul_ps(bound_scale, sum), scale_v));
    } else {
      // Spread rotations as in the 8-pair step: lanes (u, v) of a pair see
      // [c, c] and [-n, n], and their neighbour swapped in s.
      const __m512 w0 = WidenBFloat16x16(x + 2 * k0), w1 = WidenBFloat16x16(x + 2 * k0 + 16);
      in0 = w0;
      in1 = w1;
      const __m512 s0 = _mm512_permute_ps(w0, 0xb1), s1 = _mm512_permute_ps(w1, 0xb1);
      r0 = _mm512_add_ps(_mm512_mul_ps(w0, _mm512_loadu_ps(c2 + 2 * k0)),
                         _mm512_mul_ps(s0, _mm512_loadu_ps(n2 + 2 * k0)));
      r1 = _mm512_add_ps(_mm512_mul_ps(w1, _mm512_loadu_ps(c2 + 2 * k0 + 16)),
                         _mm512_mul_ps(s1, _mm512_loadu_ps(n2 + 2 * k0 + 16)));
      const __m512 sum0 = _mm512_add_ps(_mm512_abs_ps(w0), _mm512_abs_ps(s0));
      const __m512 sum1 = _mm512_add_ps(_mm512_abs_ps(w1), _mm512_abs_ps(s1));
      zero0 = _mm512_cmp_ps_mask(sum0, zero, _CMP_EQ_OQ);
      zero1 = _mm512_cmp_ps_mask(sum1, zero, _CMP_EQ_OQ);
      bound0 = NarrowBound(_mm512_mul_ps(_mm512_mul_ps(bound_scale, sum0), scale_v));
      bound1 = NarrowBound(_mm512_mul_ps(_mm512_mul_ps(bound_scale, sum1), scale_v));
    }
    const __mmask16 ok0 = NarrowsExactly(r0, bound0, zero0);
    const __mmask16 ok1 = NarrowsExactly(r1, bound1, zero1);
    // Bit i: pair k0 + i narrows exactly. NEOX pair i is lane i of r0 and
    // r1; GPT-J pair i is lanes 2i, 2i + 1 of r0 (i < 8) or of r1.
    uint32_t ok_pairs;
    if constexpr (kStyle == RopeStyle::kNeox) {
      ok_pairs = ok0 & ok1;
    } else {
      ok_pairs = _pext_u32(ok0 & (ok0 >> 1), 0x5555u) | _pext_u32(ok1 & (ok1 >> 1), 0x5555u) << 8;
    }
    if (__builtin_expect(ok_pairs != 0xffffu, 0)) {
      alignas(64) float a0[16], a1[16];
      _mm512_store_ps(a0, in0);
      _mm512_store_ps(a1, in1);
      for (uint32_t bad = ~ok_pairs & 0xffffu; bad != 0; bad &= bad - 1) {
        const int i = __builtin_ctz(bad);
        slow_k[*num_slow] = static_cast<int32_t>(k0 + i);
        if constexpr (kStyle == RopeStyle::kNeox) {
          slow_u[*num_slow] = a0[i];
          slow_v[*num_slow] = a1[i];
        } else {
          const float* w = i < 8 ? a0 : a1;
          slow_u[*num_slow] = w[2 * (i % 8)];
          slow_v[*num_slow] = w[2 * (i % 8) + 1];
        }
        ++*num_slow;
      }
    }
    // Low half r0, high half r1.
    const __m512i out = (__m512i)_mm512_cvtne2ps_pbh(r1, r0);
    if constexpr (kStyle == RopeStyle::kNeox) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(x + k0), _mm512_castsi512_si256(out));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(x + half + k0),
                          _mm512_extracti64x4_epi64(out, 1));
    } else {
      _mm512_storeu_si512(x + 2 * k0, out);
    }
  }
  return k0;
}
#endif

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
//
// kWide (AVX-512 BF16 CPUs only): first RotateBF16Wide's 16-pair steps,
// narrowed by VCVTNE2PS2BF16, whose rounding is FloatToBFloat16's (to
// nearest even, NaN quieted) except that it flushes results below 2^-126 to
// zero: a pair with such a result, like one the cancellation bound flags, is
// redone by pair_from from the inputs RotateBF16Wide kept.
template <RopeStyle kStyle, bool kWide>
POSENC_ALWAYS_INLINE void RotateHeadBF16(const RopePlan& p, int64_t t, BFloat16* __restrict x,
                                         const float* __restrict c, const float* __restrict n,
                                         const float* __restrict c2, const float* __restrict n2,
                                         Scratch& s) {
  const int64_t half = p.half();
  const double scale = p.attention_scale[p.FreqSetOfToken(t)];
  const float scale_f = static_cast<float>(scale);
  int32_t* __restrict pending_k = s.pending_k.data();
  float* __restrict pending_u = s.pending_u.data();
  float* __restrict pending_v = s.pending_v.data();
  int64_t pending = 0;
  // The scalar contract for pair k from its inputs u, v.
  auto pair_from = [=, &pending](int64_t k, float u, float v) {
    const int64_t i = PairFirst(kStyle, k, half), j = PairSecond(kStyle, k, half);
    float a, b;
    RotateF32(u, v, c[k], n[k], &a, &b);
    if (PairNeedsPrecise<BFloat16>(a, b, u, v, scale_f)) {
      pending_k[pending] = static_cast<int32_t>(k);
      pending_u[pending] = u;
      pending_v[pending++] = v;
    }
    x[i] = FromFloat<BFloat16>(a);
    x[j] = FromFloat<BFloat16>(b);
  };
  auto pair = [=, &pair_from](int64_t k) {
    pair_from(k, ToFloat(x[PairFirst(kStyle, k, half)]), ToFloat(x[PairSecond(kStyle, k, half)]));
  };
  int64_t k0 = 0;
#ifdef POSENC_CPU_BF16_WIDE
  if constexpr (kWide) {
    int64_t slow = 0;
    k0 = RotateBF16Wide<kStyle>(x, c, n, c2, n2, half, scale_f, s.wide_k.data(), s.wide_u.data(),
                                s.wide_v.data(), &slow);
    for (int64_t m = 0; m < slow; ++m) pair_from(s.wide_k[m], s.wide_u[m], s.wide_v[m]);
  }
#endif
  const int64_t steps_end = k0 + (half - k0) / 8 * 8;
  for (int64_t k = k0; k < steps_end; k += 8) {
    V8 r0, r1, bound0, bound1;
    BFloat16 *y0, *y1;
    if constexpr (kStyle == RopeStyle::kNeox) {
      y0 = x + k;
      y1 = x + half + k;
      const V8 u = BFloat16ToFloat8(y0), v = BFloat16ToFloat8(y1);
      const V8 ck = Load8(c + k), nk = Load8(n + k);
      r0 = u * ck - v * nk;
      r1 = v * ck + u * nk;
      bound0 = bound1 = kCancellationBound<BFloat16> * (Abs8(u) + Abs8(v)) * scale_f;
    } else {
      y0 = x + 2 * k;
      y1 = x + 2 * k + 8;
      const V8 w0 = BFloat16ToFloat8(y0), w1 = BFloat16ToFloat8(y1);
      const V8 s0 = __builtin_shufflevector(w0, w0, 1, 0, 3, 2, 5, 4, 7, 6);
      const V8 s1 = __builtin_shufflevector(w1, w1, 1, 0, 3, 2, 5, 4, 7, 6);
      r0 = w0 * Load8(c2 + 2 * k) + s0 * Load8(n2 + 2 * k);
      r1 = w1 * Load8(c2 + 2 * k + 8) + s1 * Load8(n2 + 2 * k + 8);
      bound0 = kCancellationBound<BFloat16> * (Abs8(w0) + Abs8(s0)) * scale_f;
      bound1 = kCancellationBound<BFloat16> * (Abs8(w1) + Abs8(s1)) * scale_f;
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
template <typename T, RopeStyle kStyle, bool kWide>
POSENC_ALWAYS_INLINE void RotateHead(const RopePlan& p, int64_t t, T* head, const float* ct,
                                     const float* nt, const float* ct2, const float* nt2,
                                     Scratch& s) {
  if constexpr (std::is_same_v<T, float>) {
    RotateHeadF32<kStyle>(head, ct, nt, p.half());
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    RotateHeadBF16<kStyle, kWide>(p, t, head, ct, nt, ct2, nt2, s);
  } else {
    RotateHead16<T, kStyle>(p, t, head, ct, nt, s);
  }
}

// How far ahead the token-major loop asks for its rows: the hardware
// prefetcher alone left a quarter of the bfloat16 loop's time waiting on
// loads (perf), and 2-4 KiB ahead measured 10-25% faster (RESULTS.md).
constexpr int64_t kPrefetchAhead = 2048;

// Asks for the cache lines of [p, p + bytes) ahead of a write.
POSENC_ALWAYS_INLINE void PrefetchForWrite(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(c + b, 1, 3);
}

template <typename T, RopeStyle kStyle, bool kWide = false>
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
            RotateHead<T, kStyle, kWide>(p, t, head, c + (t - run) * half, n + (t - run) * half,
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
        for (int64_t h = 0; h < heads; ++h) {
          PrefetchForWrite(reinterpret_cast<const char*>(x + h * D) + kPrefetchAhead,
                           D * static_cast<int64_t>(sizeof(T)));
          RotateHead<T, kStyle, kWide>(p, t, x + h * D, c, n, c2, n2, s);
        }
      }
    }
  }
}

template <typename T, RopeStyle kStyle, bool kWide = false>
POSENC_ALWAYS_INLINE void RopeTokensTyped(const RopePlan& p, void* q, void* k, int64_t begin,
                                          int64_t end, Scratch& s) {
  T* kq = p.has_key ? static_cast<T*>(k) : nullptr;
  for (int64_t t0 = begin; t0 < end; t0 += kTokenBlock) {
    RopeBlock<T, kStyle, kWide>(p, static_cast<T*>(q), kq, t0, std::min(end, t0 + kTokenBlock), s);
  }
}

// The one function compiled per instruction set: every dtype and style
// inlined into it.
// `wide`: bfloat16 takes RotateBF16Wide's 16-pair steps (AVX-512 BF16 CPUs,
// which run the x86-64-v4 clone).
POSENC_CPU_CLONES void RopeTokensDispatch(const RopePlan& p, void* q, void* k, int64_t begin,
                                          int64_t end, bool wide, Scratch& s) {
  const bool neox = p.style == RopeStyle::kNeox;
#ifdef POSENC_CPU_BF16_WIDE
  if (wide && p.dtype == DType::kBFloat16) {
    return neox ? RopeTokensTyped<BFloat16, RopeStyle::kNeox, true>(p, q, k, begin, end, s)
                : RopeTokensTyped<BFloat16, RopeStyle::kGptj, true>(p, q, k, begin, end, s);
  }
#else
  (void)wide;
#endif
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

#ifdef POSENC_CPU_BF16_WIDE
bool CpuHasAvx512Bf16() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           std::getenv("POSENC_NO_AVX512BF16") == nullptr;
  }();
  return has;
}
#endif

}  // namespace

void RopeTokensCpu(const RopePlan& plan, void* query, void* key, int64_t begin, int64_t end) {
  if (!KnownStyle(plan.style) || !KnownLayout(plan.layout)) std::abort();  // planning checks
  Scratch scratch(plan);
#ifdef POSENC_CPU_BF16_WIDE
  const bool wide = CpuHasAvx512Bf16();
#else
  const bool wide = false;
#endif
  RopeTokensDispatch(plan, query, key, begin, end, wide, scratch);
}

}  // namespace posenc::internal
