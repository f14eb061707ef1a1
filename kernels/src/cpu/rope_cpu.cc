// RoPE on the CPU. Tokens are taken in blocks: the block's cos/sin
// (float32, per slot, scaled and signed) are read from the backend's table
// of them by position (rotation_cache.h) or computed, and then applied to
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

#include "cpu/rotation_cache.h"
#include "cpu_kernels.h"
#include "math/rope_math.h"
#include "posenc/dtype.h"
#include "rope_avx2.inc"
#include "rope_bf16_wide.inc"
#include "rope_f32_wide.inc"
#include "rope_rows.inc"
#include "vec.h"

namespace posenc::internal {
namespace {

// Tokens whose cos/sin are kept at once (a block): [kTokenBlock, R/2]
// floats twice stay in L1/L2 for any published head size.
constexpr int64_t kTokenBlock = 32;

// float32 head-major (BHSD) tensors take longer blocks, up to
// kLongBlockTokens and as many as keep each table within kLongBlockTable
// bytes (256 tokens of a 128-dim head: 64 KiB each of c and n, read from
// L2 for every head). A block visits every head of the tensor, one run of
// its tokens each, and at 32 tokens a float32 run is 16 KiB: the memory
// ran short streams, 40 of them a block. An in-place read-modify-write
// walking BHSD's blocks that way ran at 0.79-0.90 of one along the
// tensor on the Zen 5, 0.91-0.96 at 128 tokens and 0.96-0.99 at 512
// (bench/cpu/zen5-2026-12-02-experiments/bhsd_pattern.cc); RoPE float32 BHSD
// went from 0.870 / 0.875 (NEOX / GPT-J, of the read-modify-write) to
// 0.930 / 0.945, ten alternated rounds, medians; BSHD unchanged
// (bench/RESULTS.md). bfloat16 keeps 32: its
// float tables are twice its rows' bytes, and NEOX's paired tables (cp,
// np) fit L1 at 32 tokens; longer blocks left it within noise or slower.
constexpr int64_t kLongBlockTokens = 256;
constexpr int64_t kLongBlockTable = int64_t{64} << 10;

// The tokens of plan p's blocks.
int64_t BlockTokens(const RopePlan& p) {
  if (p.dtype != DType::kFloat32 || p.layout != RopeLayout::kBHSD || p.half() <= 0) {
    return kTokenBlock;
  }
  const int64_t fit = kLongBlockTable / (p.half() * static_cast<int64_t>(sizeof(float)));
  return std::clamp<int64_t>(fit, kTokenBlock, kLongBlockTokens);
}

// Rows (heads) one RotateRows call takes at most: a token's heads, or a
// head's tokens in a block (bfloat16's, whose blocks are kTokenBlock
// long). Bounds Scratch's wide_* lists, which only bfloat16 fills.
constexpr int64_t kMaxRowsPerCall = kTokenBlock;

POSENC_ALWAYS_INLINE double SlotAngle(const RopePlan& p, int64_t t, int64_t k) {
  const int64_t half = p.half();
  const double* f = p.inv_freq.data() + static_cast<int64_t>(p.FreqSetOfToken(t)) * half;
  const int64_t* pos = p.positions.values.data() + t * p.num_axes;
  return static_cast<double>(pos[p.num_axes == 1 ? 0 : p.slot_axis[k]]) * f[k];
}

// The smallest attention scale RotateBF16Wide takes. Its exactness test
// relies on the bound 2^-12 (|u| + |v|) scale being nonzero whenever an
// input is: true for bfloat16 inputs (|u| + |v| >= 2^-133) and scale >= 2^-3.
// Smaller scales (no published model has one) take the 8-pair loop.
// RotateBF16Avx2 does not need it (its rounding is exact for subnormals),
// but shares the rule so that both wide loops take the same tokens.
inline constexpr float kWideMinScale = 0x1p-3f;

// Whether token t's heads take the wide bfloat16 loop (RotateBF16Wide or
// RotateBF16Avx2), on a CPU that has one: its attention scale is one the
// loops take.
POSENC_ALWAYS_INLINE bool WideScale(const RopePlan& p, int64_t t) {
  return static_cast<float>(p.attention_scale[p.FreqSetOfToken(t)]) >= kWideMinScale;
}

// Slots past the most pairs a run can leave to redo (Scratch::wide_*) that
// the 512-bit loops' KeepSlow may write: it stores whole vectors.
constexpr int64_t kSlowSlack = 16;

// Per-thread buffers, separately allocated so the compiler can see they do
// not overlap. A thread keeps its Scratch from call to call
// (WithThreadScratch).
struct Scratch {
  explicit Scratch(const RopePlan& p)
      : half(p.half()),
        block(BlockTokens(p)),
        c(block * p.half()),
        n(block * p.half()),
        wide(WideFor(p)),
        wide_f32(WideF32For(p)),
        spread(SpreadFor(p)),
        c2(2 * block * p.half()),  // allocated even when unused (callers
        n2(2 * block * p.half()),  // offset into them), counted in Bytes()
        paired(wide && p.style == RopeStyle::kNeox),
        wide_512(CpuHasAvx512()),
        wide_f32_512(CpuHasAvx512()),
        far_in_run(CpuIsIntel()),
        nta_prefetch(!CpuIsIntel()),
        lane_test(CpuTakesLaneTest()),
        narrowing(CpuHasAvx512Bf16() ? Narrowing::kInstruction : Narrowing::kRounding),
        cp(paired ? block * p.half() : 0),
        np(paired ? block * p.half() : 0),
        saved(p.half()),
        flag(p.half()),
        pending_k(p.half()),
        pending_u(p.half()),
        pending_v(p.half()),
        wide_k(kMaxRowsPerCall * p.half() + kSlowSlack),
        wide_u(kMaxRowsPerCall * p.half() + kSlowSlack),
        wide_v(kMaxRowsPerCall * p.half() + kSlowSlack) {}

  // Which lists plan p needs (see the members).
  static bool WideFor(const RopePlan& p) {
    return p.dtype == DType::kBFloat16 && (CpuHasAvx512() || CpuHasAvx2());
  }
  static bool WideF32For(const RopePlan& p) {
    return p.dtype == DType::kFloat32 && (CpuHasAvx512() || CpuHasAvx2());
  }
  static bool SpreadFor(const RopePlan& p) {
    return p.style == RopeStyle::kGptj &&
           (p.dtype == DType::kBFloat16 || (WideF32For(p) && !CpuHasAvx512()));
  }

  // Whether this Scratch's buffers serve plan p. It holds nothing else
  // between calls, so Restart has nothing to do.
  bool Serves(const RopePlan& p) const {
    return half == p.half() && block == BlockTokens(p) && wide == WideFor(p) &&
           wide_f32 == WideF32For(p) && spread == SpreadFor(p) &&
           paired == (WideFor(p) && p.style == RopeStyle::kNeox);
  }
  void Restart(const RopePlan&) {}

  // Roughly the bytes it holds.
  int64_t Bytes() const { return (24 * block + 12 * kMaxRowsPerCall + 24) * half; }

  const int64_t half;
  const int64_t block;  // BlockTokens
  // The token whose rows lie at the tensors' first element, and in BHSD
  // the tokens a head of such a block holds (RopeTokensCpu's `origin` and
  // `block_tokens`; 0 but for a block copied aside).
  int64_t origin = 0;
  int64_t block_tokens = 0;
  std::vector<float> c, n;  // [block, half] s cos, +-s sin
  // bfloat16 on a CPU with RotateBF16Wide (AVX-512) or RotateBF16Avx2.
  const bool wide;
  // float32 on a CPU with RotateF32Wide (AVX-512) or RotateF32Avx2.
  const bool wide_f32;
  // GPT-J in bfloat16, or in float32 on an AVX2 CPU without AVX-512
  // (spread): [block, 2 half] [c, c] and [-n, n] per slot, laid out
  // like the pairs they rotate (RotateHeadBF16's 8-pair loop, not for the
  // tokens the wide bfloat16 loops take; RotateF32Avx2). RotateF32Wide
  // splits the pairs instead and reads c and n.
  const bool spread;
  std::vector<float> c2, n2;
  // bfloat16 NEOX on a wide CPU (paired): [block, half] c and n with
  // each group's even slots first, then its odd ones, for the tokens that
  // take it: groups of 32 for RotateBF16Wide (PairSlots32), of 16 for
  // RotateBF16Avx2 (PairSlots16).
  const bool paired;
  // Which of the two wide loops runs: the 512-bit one (bfloat16, float32),
  // or the AVX2 one; and how the 512-bit bfloat16 one narrows (AVX-512
  // BF16's instruction, or integer rounding: bf16_wide.h).
  const bool wide_512, wide_f32_512;
  // Whether runs ask for their own rows kFarAheadInRun on into L2 (in
  // head-major runs rather than the next head's: RopeBlock).
  const bool far_in_run;
  // Whether the float32 512-bit loop asks for its lines with PREFETCHNTA
  // (RotateF32Wide's kNonTemporal), and the bfloat16 one in head-major runs
  // (RotateRowsWideAhead): on AMD CPUs.
  const bool nta_prefetch;
  // Whether the 512-bit bfloat16 NEOX loop tests its pairs in 16-bit lanes
  // (PairTestBF16x32) rather than by PairsToRedo (rope_wide_exactness.h):
  // CpuTakesLaneTest, on CPUs other than Intel's (RotateRowsWide512).
  const bool lane_test;
  const Narrowing narrowing;
  std::vector<float> cp, np;
  std::vector<uint32_t> saved;  // a float16 head's rotary dims before rotation (2 x half)
  std::vector<uint8_t> flag;    // [half] pairs to recompute in double (float16)
  // bfloat16: a head's pairs to recompute in double, with their inputs.
  std::vector<int32_t> pending_k;
  std::vector<float> pending_u, pending_v;
  // bfloat16 on a wide CPU: pairs of a run that RotateBF16Wide or
  // RotateBF16Avx2 left to redo (row * half + k), with their inputs.
  UninitializedArray<int32_t> wide_k;
  UninitializedArray<float> wide_u, wide_v;
};

// The block's rotations: read from `table` (kept from earlier calls; null
// for plans RotationCache does not serve) where it has the position's row,
// computed otherwise.
POSENC_ALWAYS_INLINE void ComputeRotations(const RopePlan& p, RowTable* table, int64_t t0,
                                           int64_t t1, Scratch& s) {
  const int64_t half = p.half();
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t* pos = p.positions.values.data() + t * p.num_axes;
    float* __restrict c = s.c.data() + (t - t0) * half;
    float* __restrict n = s.n.data() + (t - t0) * half;
    if (table != nullptr) {
      if (const float* row = table->Row(pos[0])) {
        std::memcpy(c, row, half * sizeof(float));
        std::memcpy(n, row + half, half * sizeof(float));
        continue;
      }
    }
    const int set = p.FreqSetOfToken(t);
    const double* __restrict f = p.inv_freq.data() + static_cast<int64_t>(set) * half;
    const double scale = p.attention_scale[set];
    // One position for every slot, or one per slot's axis: separate loops
    // so the common one vectorises.
    if (p.num_axes == 1) {
      RotationsAt(static_cast<double>(pos[0]), f, half, scale, p.inverse, c, n);
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
#ifdef POSENC_CPU_BF16_WIDE  // a plan is paired only where a wide loop runs
  if (s.paired) {
    const auto pair_slots = s.wide_512 ? PairSlots32 : PairSlots16;
    for (int64_t t = 0; t < t1 - t0; ++t) {
      if (!WideScale(p, t0 + t)) continue;
      pair_slots(s.c.data() + t * half, s.cp.data() + t * half, half);
      pair_slots(s.n.data() + t * half, s.np.data() + t * half, half);
    }
  }
#endif
  if (s.spread) {
    for (int64_t t = 0; t < t1 - t0; ++t) {
      const float* __restrict c = s.c.data() + t * half;
      const float* __restrict n = s.n.data() + t * half;
      float* __restrict c2 = s.c2.data() + t * 2 * half;
      float* __restrict n2 = s.n2.data() + t * 2 * half;
      if (s.wide && WideScale(p, t0 + t)) continue;  // RotateBF16Wide takes the token
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

// bfloat16 RoPE of one head of token t, in place, on CPUs without the wide
// loops (RotateBF16Wide, RotateBF16Avx2) or for tokens they do not take,
// 8 pairs per step in hand-written vectors (vec.h):
// RotateF32 lane by lane,
// PairNeedsPrecise as "both |a| and |b| >= its bound" (false for NaN as
// well), and one test per 8 pairs. Steps with a lane that fails it, and the
// pairs past the last multiple of 8, go pair by pair through the scalar
// contract; the pairs it flags are redone in double after the loop from
// their inputs, kept in s.pending_*. GPT-J pairs are adjacent, so a step
// rotates 16 consecutive elements as (u c + v (-n), v c + u n) with the
// slot's [c, c] and [-n, n] spread to match (ComputeRotations): x + (-y) is
// x - y in IEEE arithmetic, so the results are RotateF32's bit for bit.
template <RopeStyle kStyle>
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
  // The scalar contract for pair k; the double half after the loop.
  auto pair = [=, &pending](int64_t k) {
    const int64_t i = PairFirst(kStyle, k, half), j = PairSecond(kStyle, k, half);
    const float u = ToFloat(x[i]), v = ToFloat(x[j]);
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
  const int64_t steps_end = half / 8 * 8;
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

// The pairs a wide bfloat16 loop left in slow_k/u/v[0, num_slow) (row * half + k,
// rows in order), redone by RotatePair from their inputs, which go back in
// place first (they are bfloat16 values, so exactly). One loop for the
// whole run: a RotateHeadBF16 call for each row that has one (one row in 43
// on random data) made bfloat16 RoPE 10-25% slower, BHSD most (measured in
// bench/RESULTS.md).
template <RopeStyle kStyle>
POSENC_ALWAYS_INLINE void RedoSlowPairs(const RopePlan& p, const Rows<BFloat16>& rows,
                                        const int32_t* slow_k, const float* slow_u,
                                        const float* slow_v, int64_t num_slow) {
  const int64_t half = p.half(), D = p.head_dim;
  const double scale = p.attention_scale[p.FreqSetOfToken(rows.t0)];
  for (int64_t m = 0; m < num_slow; ++m) {
    const int64_t row = slow_k[m] / half, k = slow_k[m] - row * half;
    const int64_t kr = row * rows.dt * half + k;  // the slot's rotation
    BFloat16* x = rows.x + row * D;
    BFloat16 *first = x + PairFirst(kStyle, k, half), *second = x + PairSecond(kStyle, k, half);
    *first = FromFloat<BFloat16>(slow_u[m]);
    *second = FromFloat<BFloat16>(slow_v[m]);
    RotatePair(
        first, second, SlotRotation{rows.c[kr], rows.n[kr]},
        [&] { return SlotAngle(p, rows.t0 + row * rows.dt, k); }, scale, p.inverse);
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

#ifdef POSENC_CPU_BF16_WIDE
// The rows of a run by RotateBF16Avx2, then an 8-pair step where 8 pairs
// are left (RotateStep8BF16Avx2); the few past that (fewer than 8) are
// appended to s.wide_* with the pairs those could not narrow, all for
// RedoSlowPairs. Returns how many there are.
template <RopeStyle kStyle, bool kUnitScale, bool kFar>
POSENC_ALWAYS_INLINE int64_t RotateRowsAvx2(const Rows<BFloat16>& rows, int64_t D, int64_t half,
                                            float scale_f, Scratch& s) {
  int64_t slow = 0;
  int32_t* __restrict slow_k = s.wide_k.data();
  float* __restrict slow_u = s.wide_u.data();
  float* __restrict slow_v = s.wide_v.data();
  // 128-dim heads take a copy compiled for them, as RotateRowsWide's do.
  const int64_t k_end = half == 64 ? RotateBF16Avx2<kStyle, kUnitScale, kFar, 64>(
                                         rows, D, half, scale_f, slow_k, slow_u, slow_v, &slow)
                                   : RotateBF16Avx2<kStyle, kUnitScale, kFar, 0>(
                                         rows, D, half, scale_f, slow_k, slow_u, slow_v, &slow);
  int64_t k_rest = k_end;
  if (half - k_rest >= 8) {
    RotateStep8BF16Avx2<kStyle, kUnitScale>(rows, D, half, k_rest, scale_f, slow_k, slow_u, slow_v,
                                            &slow);
    k_rest += 8;
  }
  for (int64_t row = 0; k_rest < half && row < rows.count; ++row) {
    const BFloat16* x = rows.x + row * D;
    for (int64_t k = k_rest; k < half; ++k) {
      slow_k[slow] = static_cast<int32_t>(row * half + k);
      slow_u[slow] = ToFloat(x[PairFirst(kStyle, k, half)]);
      slow_v[slow++] = ToFloat(x[PairSecond(kStyle, k, half)]);
    }
  }
  return slow;
}

// The rows of a run by RotateBF16Wide and RotateTailsBF16Wide (AVX-512),
// narrowing as kN says, or by RotateRowsAvx2, the pairs those leave
// appended to s.wide_*; returns how many there are.
template <Narrowing kN, RopeStyle kStyle, bool kUnitScale, bool kFar, bool kNonTemporal,
          bool kLaneTest>
POSENC_ALWAYS_INLINE int64_t RotateRowsWide512(const Rows<BFloat16>& rows, int64_t D, int64_t half,
                                               float scale_f, Scratch& s) {
  int64_t slow = 0;
  // 128-dim rotary heads (nearly every published model) take a copy
  // compiled for half = 64: with the size known GCC kept the loop's
  // pointers in registers, bf16 NEOX BSHD 1.353 to 1.117 instructions per
  // element, one thread in L2 51 to 57-59 GB/s (GPT-J BHSD 58 to 60-62,
  // BSHD unchanged); from DRAM on a busy host unchanged (bench/RESULTS.md).
  //
  // A token's heads (rows.dt 0) rotate by one table row, whose 64 slots
  // the copy with kHeld loads into registers once for the run: bf16 NEOX
  // BSHD 1.012 to 0.935 instructions an element, GPT-J 1.215 to 0.907 (its
  // four steps unrolled). On the Zen 5, one thread in L2, six alternated
  // rounds: GPT-J 55.2 to 61.6 GB/s, NEOX 57.1 to 58.9; from DRAM within
  // noise (bench/RESULTS.md). Only without kFar, that is not on Intel
  // CPUs, whose BSHD runs were measured with the loop as it was: there an
  // unrolled GPT-J row once ran 10% slower from DRAM (RotateBF16Wide).
  constexpr bool kHold = !kFar;
  const int64_t k_end =
      half != 64
          ? RotateBF16Wide<kN, kStyle, kUnitScale, kFar, kNonTemporal, kLaneTest, 0>(
                rows, D, half, scale_f, s.wide_k.data(), s.wide_u.data(), s.wide_v.data(), &slow)
      : kHold && rows.dt == 0 && rows.count > 1
          ? RotateBF16Wide<kN, kStyle, kUnitScale, kFar, kNonTemporal, kLaneTest, 64, kHold>(
                rows, D, half, scale_f, s.wide_k.data(), s.wide_u.data(), s.wide_v.data(), &slow)
          : RotateBF16Wide<kN, kStyle, kUnitScale, kFar, kNonTemporal, kLaneTest, 64>(
                rows, D, half, scale_f, s.wide_k.data(), s.wide_u.data(), s.wide_v.data(), &slow);
  if (k_end < half) {
    RotateTailsBF16Wide<kN, kStyle, kUnitScale>(rows, D, half, k_end, scale_f, s.wide_k.data(),
                                                s.wide_u.data(), s.wide_v.data(), &slow);
  }
  return slow;
}
template <RopeStyle kStyle, bool kUnitScale, bool kFar, bool kNonTemporal>
POSENC_ALWAYS_INLINE int64_t RotateRowsWide(const Rows<BFloat16>& rows, int64_t D, int64_t half,
                                            float scale_f, Scratch& s) {
  if (!s.wide_512) return RotateRowsAvx2<kStyle, kUnitScale, kFar>(rows, D, half, scale_f, s);
  // NEOX on AMD CPUs tests a step's pairs in 16-bit lanes (s.lane_test:
  // PairTestBF16x32): integer operations, no VRANGEPS or VFPCLASSPS. On
  // the Zen 5, where the loop is bound by its vector operations, it ran
  // 47% faster in L2 without PairsToRedo's bound and comparison, 73%
  // without the test at all (wrong builds, bench/RESULTS.md). Intel CPUs
  // keep PairsToRedo, as their figures were measured. GPT-J keeps it
  // everywhere: a pair's two results share a 32-bit lane, so a 16-bit
  // bound would need a shuffle to reach both (as in rope_avx2.inc's GPT-J
  // steps).
  constexpr bool kNeox = kStyle == RopeStyle::kNeox;
  if (s.narrowing == Narrowing::kInstruction) {
    return kNeox && s.lane_test
               ? RotateRowsWide512<Narrowing::kInstruction, kStyle, kUnitScale, kFar, kNonTemporal,
                                   kNeox>(rows, D, half, scale_f, s)
               : RotateRowsWide512<Narrowing::kInstruction, kStyle, kUnitScale, kFar, kNonTemporal,
                                   false>(rows, D, half, scale_f, s);
  }
  return kNeox && s.lane_test ? RotateRowsWide512<Narrowing::kRounding, kStyle, kUnitScale, kFar,
                                                  kNonTemporal, kNeox>(rows, D, half, scale_f, s)
                              : RotateRowsWide512<Narrowing::kRounding, kStyle, kUnitScale, kFar,
                                                  kNonTemporal, false>(rows, D, half, scale_f, s);
}

// RotateRowsWide with the lookahead the run asks for: its own rows only
// (rows.far_bytes 0: token-major runs on AMD CPUs), or those far on as
// well, into L2 (Intel CPUs), or both with PREFETCHNTA (head-major runs on
// AMD CPUs, s.nta_prefetch, where far is the next head's rows). On the Zen
// 5, two experiments of twelve alternated rounds (medians of the ratio to
// the read-modify-write, bench/RESULTS.md): PREFETCHNTA in BHSD took bf16
// NEOX from 0.855 to 0.94 and from 0.850 to 0.900, GPT-J from 0.85 to 0.88
// and from 0.865 to 0.895. In BSHD runs as well it was slower there (NEOX
// 0.895 to 0.865, GPT-J 0.93 to 0.885), so they keep PREFETCHT0.
template <RopeStyle kStyle, bool kUnitScale>
POSENC_ALWAYS_INLINE int64_t RotateRowsWideAhead(const Rows<BFloat16>& rows, int64_t D,
                                                 int64_t half, float scale_f, Scratch& s) {
  if (rows.far_bytes == 0) {
    return RotateRowsWide<kStyle, kUnitScale, false, false>(rows, D, half, scale_f, s);
  }
  if (s.nta_prefetch) {
    return RotateRowsWide<kStyle, kUnitScale, true, true>(rows, D, half, scale_f, s);
  }
  return RotateRowsWide<kStyle, kUnitScale, true, false>(rows, D, half, scale_f, s);
}
#endif

// Rotates a run of rows. kWide: in 512-bit or 256-bit registers, every
// row in one call: bfloat16 by RotateRowsWide (AVX-512 CPUs) or
// RotateRowsAvx2 (AVX2), then the pairs those left by RedoSlowPairs;
// float32 by RotateF32Wide (AVX-512 CPUs) or RotateF32Avx2 (AVX2), the
// last few pairs of an AVX2 row pair by pair.
template <typename T, RopeStyle kStyle, bool kWide>
POSENC_ALWAYS_INLINE void RotateRows(const RopePlan& p, const Rows<T>& rows, Scratch& s) {
  const int64_t half = p.half(), D = p.head_dim;
#ifdef POSENC_CPU_BF16_WIDE
  if constexpr (kWide && std::is_same_v<T, float>) {
    const bool far = rows.far_bytes != 0;
    if (s.wide_f32_512) {
      if (s.nta_prefetch) {
        return far ? RotateF32Wide<kStyle, true, true>(rows, D, half)
                   : RotateF32Wide<kStyle, false, true>(rows, D, half);
      }
      return far ? RotateF32Wide<kStyle, true, false>(rows, D, half)
                 : RotateF32Wide<kStyle, false, false>(rows, D, half);
    }
    // 128 rotary dims take a copy compiled for them, as bfloat16's do.
    const int64_t k_end = half == 64 ? (far ? RotateF32Avx2<kStyle, true, 64>(rows, D, half)
                                            : RotateF32Avx2<kStyle, false, 64>(rows, D, half))
                                     : (far ? RotateF32Avx2<kStyle, true, 0>(rows, D, half)
                                            : RotateF32Avx2<kStyle, false, 0>(rows, D, half));
    for (int64_t i = 0; k_end < half && i < rows.count; ++i) {  // the last few pairs
      T* x = rows.x + i * D;
      const int64_t cn = i * rows.dt * half;
      for (int64_t k = k_end; k < half; ++k) {
        const int64_t a = PairFirst(kStyle, k, half), b = PairSecond(kStyle, k, half);
        RotateF32(x[a], x[b], rows.c[cn + k], rows.n[cn + k], &x[a], &x[b]);
      }
    }
    return;
  }
  if constexpr (kWide && std::is_same_v<T, BFloat16>) {
    if (WideScale(p, rows.t0)) {
      const float scale_f = static_cast<float>(p.attention_scale[p.FreqSetOfToken(rows.t0)]);
      const int64_t slow = scale_f == 1.0f
                               ? RotateRowsWideAhead<kStyle, true>(rows, D, half, scale_f, s)
                               : RotateRowsWideAhead<kStyle, false>(rows, D, half, scale_f, s);
      RedoSlowPairs<kStyle>(p, rows, s.wide_k.data(), s.wide_u.data(), s.wide_v.data(), slow);
      return;
    }
  }
#endif
  const int64_t row_bytes = D * static_cast<int64_t>(sizeof(T));
  for (int64_t i = 0; i < rows.count; ++i) {
    T* x = rows.x + i * D;
    const char* bytes = reinterpret_cast<const char*>(x);
    if (rows.near_bytes != 0) PrefetchForWrite<3>(bytes + rows.near_bytes, row_bytes);
    if (rows.far_bytes != 0) PrefetchForWrite<1>(bytes + rows.far_bytes, row_bytes);
    const int64_t cn = i * rows.dt * half;
    RotateHead<T, kStyle>(p, rows.t0 + i * rows.dt, x, rows.c + cn, rows.n + cn, rows.c2 + 2 * cn,
                          rows.n2 + 2 * cn, s);
  }
}

// How far ahead in a run the loops ask for rows into L1 (Rows::near_bytes),
// in either layout; head-major (BHSD) runs also ask for the next head's
// rows into L2 (Rows::far_bytes), except on Intel CPUs (kFarAheadInRun).
// The hardware prefetcher alone left a quarter of the bfloat16 loop's time
// waiting on loads (perf, Xeon). On the EPYC (alternated runs,
// bench/RESULTS.md):
// - BHSD used to ask for the next head's rows into L1 and for nothing in
//   its own run: bfloat16 went from 0.81-0.84 of the read-modify-write to
//   0.91-0.96 with this, float32 from 0.78-0.85 to 0.82-0.89. 16-256
//   token blocks and two heads ahead were within noise.
// - BSHD (about 100-125 runs each): 4 KiB against 2 KiB, bfloat16
//   0.90-0.91 against 0.88-0.90 on a busy host and 0.78-0.85 against
//   0.72-0.77 in the quiet runs; float32 the same busy, 0.75-0.83 against
//   0.74-0.80 quiet. 1 KiB and none were slower, and the rows 16 or 32 KiB
//   ahead into L2 as well added nothing.
constexpr int64_t kPrefetchAhead = 4096;

// How far ahead in their own run the rows are asked for into L2 as well
// (Rows::far_bytes), on Intel CPUs: in token-major (BSHD) runs where the
// 512-bit loops run, and in head-major (BHSD) ones (RopeBlock). On an
// AVX-512 BF16 Xeon (2026-11-30; six alternated rounds on a busy host,
// medians, bench/RESULTS.md) BSHD went bf16 NEOX 26.8 -> 30.9 GB/s, GPT-J
// 29.3 -> 34.0, float32 NEOX 35.1 -> 37.8, GPT-J 31.9 -> 37.4: that
// Xeon's prefetchers left the L1 requests 4 KiB ahead waiting on memory.
// On the Zen 5 EPYC the same 16 or 32 KiB in BSHD added nothing (above),
// so AMD CPUs do without; in BSHD so do the AVX2 loops, bound by their
// instructions on the Zen 3 (two more prefetches a step).
constexpr int64_t kFarAheadInRun = 16384;

template <typename T, RopeStyle kStyle, bool kWide = false>
POSENC_ALWAYS_INLINE void RopeBlock(const RopePlan& p, RowTable* table, T* q, T* k, int64_t t0,
                                    int64_t t1, Scratch& s) {
  const int64_t half = p.half(), D = p.head_dim;
  ComputeRotations(p, table, t0, t1, s);
  for (int side = 0; side < 2; ++side) {
    T* base = side == 0 ? q : k;
    if (base == nullptr) continue;
    const int64_t heads = side == 0 ? p.query_heads : p.key_heads;
    if (p.layout == RopeLayout::kBHSD) {
      // Head-major: one head's consecutive tokens are contiguous, up to the
      // end of their sequence.
      for (int64_t run = t0; run < t1;) {
        const int64_t run_end = std::min(t1, (run / p.seq_len + 1) * p.seq_len);
        // In a block copied aside, head h's rows of the block's tokens
        // follow each other (block_tokens a head).
        const HeadSpan span = s.block_tokens == 0
                                  ? HeadsOfToken(p.layout, run, p.seq_len, heads, D)
                                  : HeadSpan{(run - s.origin) * D, s.block_tokens * D};
        const int64_t cn = (run - t0) * half;
        for (int64_t h = 0; h < heads; ++h) {
          // The next head's run is far away (1 MiB for a 4096-token
          // bfloat16 sequence of 128-dim heads) and the hardware prefetcher
          // restarts at every run: its rows are fetched into L2 while these
          // rotate, and this run's into L1 kPrefetchAhead ahead (float32's
          // 512-bit loop on AMD CPUs asks for both with PREFETCHNTA, into
          // L1: RotateF32Wide's kNonTemporal). On Intel
          // CPUs the rows kFarAheadInRun on go into L2 instead (in place,
          // this head's two blocks on, for 128-dim bfloat16; in a block
          // copied aside, a later head's): on the Xeon, five alternated
          // rounds on a quiet host, bf16 NEOX 34.0 -> 39.7 GB/s, GPT-J
          // 36.1 -> 41.7, float32 NEOX 43.3 -> 50.6, GPT-J 39.9 -> 43.0,
          // where the head after next instead of the next changed nothing;
          // the Zen 5 measured the next head's (0.81-0.84 -> 0.91-0.96 of
          // the read-modify-write for bf16, above) and keeps it.
          const int64_t far = s.far_in_run    ? kFarAheadInRun
                              : h + 1 < heads ? span.stride * static_cast<int64_t>(sizeof(T))
                                              : 0;
          RotateRows<T, kStyle, kWide>(
              p,
              Rows<T>{base + span.first + h * span.stride, run_end - run, run, 1, s.c.data() + cn,
                      s.n.data() + cn, s.c2.data() + 2 * cn, s.n2.data() + 2 * cn,
                      s.paired ? s.cp.data() + cn : nullptr, s.paired ? s.np.data() + cn : nullptr,
                      kPrefetchAhead, far},
              s);
        }
        run = run_end;
      }
    } else {
      // Token-major: a token's heads are contiguous.
      const int64_t far = kWide && s.wide_512 && s.far_in_run ? kFarAheadInRun : 0;
      for (int64_t t = t0; t < t1; ++t) {
        T* x = base + HeadsOfToken(p.layout, t - s.origin, p.seq_len, heads, D).first;
        const int64_t cn = (t - t0) * half;
        for (int64_t h0 = 0; h0 < heads; h0 += kMaxRowsPerCall) {
          RotateRows<T, kStyle, kWide>(
              p,
              Rows<T>{x + h0 * D, std::min(kMaxRowsPerCall, heads - h0), t, 0, s.c.data() + cn,
                      s.n.data() + cn, s.c2.data() + 2 * cn, s.n2.data() + 2 * cn,
                      s.paired ? s.cp.data() + cn : nullptr, s.paired ? s.np.data() + cn : nullptr,
                      kPrefetchAhead, far},
              s);
        }
      }
    }
  }
}

template <typename T, RopeStyle kStyle, bool kWide = false>
POSENC_ALWAYS_INLINE void RopeTokensTyped(const RopePlan& p, RowTable* table, void* q, void* k,
                                          int64_t begin, int64_t end, Scratch& s) {
  T* kq = p.has_key ? static_cast<T*>(k) : nullptr;
  for (int64_t t0 = begin; t0 < end; t0 += s.block) {
    RopeBlock<T, kStyle, kWide>(p, table, static_cast<T*>(q), kq, t0, std::min(end, t0 + s.block),
                                s);
  }
}

// The one function compiled per instruction set: every dtype and style
// inlined into it.
// `wide`: bfloat16 takes RotateBF16Wide's steps (AVX-512 CPUs) or
// RotateBF16Avx2's (AVX2), float32 RotateF32Wide's (AVX-512) or
// RotateF32Avx2's (AVX2); the other loops are for CPUs without AVX2.
POSENC_CPU_CLONES void RopeTokensDispatch(const RopePlan& p, RowTable* table, void* q, void* k,
                                          int64_t begin, int64_t end, bool wide, Scratch& s) {
  const bool neox = p.style == RopeStyle::kNeox;
#ifdef POSENC_CPU_BF16_WIDE
  if (wide && p.dtype == DType::kBFloat16) {
    return neox ? RopeTokensTyped<BFloat16, RopeStyle::kNeox, true>(p, table, q, k, begin, end, s)
                : RopeTokensTyped<BFloat16, RopeStyle::kGptj, true>(p, table, q, k, begin, end, s);
  }
  if (wide && p.dtype == DType::kFloat32) {
    return neox ? RopeTokensTyped<float, RopeStyle::kNeox, true>(p, table, q, k, begin, end, s)
                : RopeTokensTyped<float, RopeStyle::kGptj, true>(p, table, q, k, begin, end, s);
  }
#else
  (void)wide;
#endif
  switch (p.dtype) {
    case DType::kFloat32:
      return neox ? RopeTokensTyped<float, RopeStyle::kNeox>(p, table, q, k, begin, end, s)
                  : RopeTokensTyped<float, RopeStyle::kGptj>(p, table, q, k, begin, end, s);
    case DType::kFloat16:
      return neox ? RopeTokensTyped<Half, RopeStyle::kNeox>(p, table, q, k, begin, end, s)
                  : RopeTokensTyped<Half, RopeStyle::kGptj>(p, table, q, k, begin, end, s);
    case DType::kBFloat16:
      return neox ? RopeTokensTyped<BFloat16, RopeStyle::kNeox>(p, table, q, k, begin, end, s)
                  : RopeTokensTyped<BFloat16, RopeStyle::kGptj>(p, table, q, k, begin, end, s);
    default:
      std::abort();  // PlanRope admits floating dtypes only
  }
}

}  // namespace

void RopeTokensCpu(const RopePlan& plan, RowTable* rotations, void* query, void* key, int64_t begin,
                   int64_t end, int64_t origin, int64_t block_tokens) {
  if (!KnownStyle(plan.style) || !KnownLayout(plan.layout)) std::abort();  // planning checks
  if (rotations != nullptr && !RotationCache::Serves(*rotations, plan)) {
    std::abort();  // RotationCache::For gives only the plan's own table
  }
  const bool bhsd = plan.layout == RopeLayout::kBHSD;
  if (bhsd && block_tokens == 0 && origin != 0) std::abort();  // a whole tensor starts at 0
  if (bhsd && block_tokens != 0 && (begin < origin || end > origin + block_tokens)) {
    std::abort();  // the tokens are in the block
  }
  WithThreadScratch<Scratch>(plan, [&](Scratch& s) {
    s.origin = origin;
    s.block_tokens = bhsd ? block_tokens : 0;
    RopeTokensDispatch(plan, rotations, query, key, begin, end, s.wide || s.wide_f32, s);
  });
}

}  // namespace posenc::internal
