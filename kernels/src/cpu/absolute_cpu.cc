// Absolute encodings on the CPU. A sinusoidal PE element is a rotation of its
// anchor's sine and cosine by an offset's (math/phase.h). Each thread keeps
// the anchor row of the tokens at hand; the next one (16 positions on) gets
// its phase from this one's by an add. For float32 and bfloat16 inputs the
// rotation is fused into the one pass that reads x and writes
// y = x * x_scale + PE, prefetching the rows ahead, and the next anchor row
// is built a slice at a time between blocks of that pass, so the arithmetic
// runs while rows stream in. The element arithmetic is math/absolute_math.h
// and math/phase.h, the same as the CUDA kernel's; every path below
// evaluates it operation for operation (the rearrangements in SinCosRange
// and AdvanceNext are exact).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "absolute_avx2.inc"
#include "absolute_bf16_wide.inc"
#include "absolute_f32_wide.inc"
#include "cpu/anchor_cache.h"
#include "cpu_kernels.h"
#include "math/absolute_math.h"
#include "math/phase.h"
#include "posenc/dtype.h"
#include "vec.h"

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

// Whether a plan's tokens take the fused pass (FusedTokens): sinusoidal PE
// added to float32 or bfloat16 inputs. One pass keeps the arithmetic under
// the stream of rows: a PE row and then an add pass leave memory idle while
// the row is computed. float16 (no vector conversion here), learned tables
// and PE-only outputs take the two-pass path, as does an x_scale of 0 (in
// float): the fused loops keep the NaN an infinite x makes there as x86 does,
// where the formula makes it CanonicalNaN (KeepInputNaN).
bool Fuses(const AbsolutePlan& p) {
  return (p.dtype == DType::kBFloat16 || p.dtype == DType::kFloat32) && p.has_input &&
         p.options.kind != AbsoluteOptions::Kind::kLearned &&
         static_cast<float>(p.options.x_scale) != 0.0f;
}

// Which cancellation test a plan's 16-bit sums take (math/absolute_math.h).
PeRange RangeOf(const AbsolutePlan& p) {
  return p.options.kind == AbsoluteOptions::Kind::kLearned ? PeRange::kAny : PeRange::kSinusoidal;
}

// One anchor's row: sin and cos of anchor * w_i for every frequency, as
// SinCosOfPosition computes them. Pairs (the fused INTERLEAVED pass): a =
// [sin_i, cos_i] and b = [cos_i, -sin_i], so that the PE pair of frequency i
// is a * cos(k w_i) + b * sin(k w_i) lane by lane; otherwise halves: a =
// sin_i, b = cos_i (the first half of each).
struct AnchorRow {
  explicit AnchorRow(size_t frequencies)
      : a(2 * frequencies), b(2 * frequencies), phase_hi(frequencies), phase_lo(frequencies) {}
  // Not a multiple of 16 until computed.
  int64_t anchor = 1;
  std::vector<float> a, b;
  // |anchor| * phase_step mod 2^64, whose high word is PhaseOf(|anchor|).
  std::vector<uint32_t> phase_hi, phase_lo;
};

// Elements the fused pass's pending lists hold: a group of rows (FusedTokens)
// is at most this many elements.
int64_t PendingCapacity(int64_t dim) { return std::max<int64_t>(dim, int64_t{1} << 16); }

// The phase steps step[0, n) and their multiples by kPhaseAnchorStride (mod
// 2^64) in 32-bit halves. Compiled per instruction set: this runs every call,
// and as plain x86-64 (SSE2) it was about half the instructions of a
// one-token float32 call of 4096 elements (posenc-count-instructions).
POSENC_CPU_CLONES void SplitPhaseSteps(const uint64_t* __restrict step, int64_t n,
                                       uint32_t* __restrict step_hi, uint32_t* __restrict step_lo,
                                       uint32_t* __restrict stride_hi,
                                       uint32_t* __restrict stride_lo) {
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t stride = step[i] * static_cast<uint64_t>(kPhaseAnchorStride);  // mod 2^64
    step_hi[i] = static_cast<uint32_t>(step[i] >> 32);
    step_lo[i] = static_cast<uint32_t>(step[i]);
    stride_hi[i] = static_cast<uint32_t>(stride >> 32);
    stride_lo[i] = static_cast<uint32_t>(stride);
  }
}

// How far ahead of its step the wide float32 loop also asks for lines
// into L2 (two [4096] rows on), on Intel CPUs. On an AVX-512 BF16 Xeon
// (2026-11-30, five alternated rounds on a quiet host, bench/RESULTS.md)
// the 8 KiB into L1 alone ran [4096, 4096] at a median 30.9 GB/s (0.68 of
// the read-modify-write), with 16 KiB into L2 as well 37.2, with 32 KiB
// 38.5 (0.87); 4 KiB into L1 alone 32.0. The Zen 5, whose runs chose the
// 8 KiB (kWideF32PrefetchAhead), was not measured with it: AMD CPUs do
// without.
constexpr int64_t kWideF32FarAhead = 32768;

// The wide bfloat16 loops ask for the same block of the row this many rows
// on: the next row's block is the very next work, too late to arrive in
// time (a block is 2 KiB of a row). On the Zen 5 EPYC, bf16 [4096, 4096]
// ran 36.7-40.9 GB/s one row ahead, 40.8-45.4 two and 43.6-45.7 three
// (three rounds, alternated; bench/RESULTS.md). On an AVX-512 BF16 Xeon
// (2026-11-30, twelve alternated rounds on a busy host) two rows ran a
// median 30.6-30.9 GB/s against 26.8-27.9 for three (in eight rounds of
// the whole bench against 10b105c, 30.5 -> 30.8). The 512-bit loop takes
// two on Intel CPUs; AMD CPUs and the AVX2 loop keep three.
constexpr int64_t kWideRowsAheadIntel512 = 2;
constexpr int64_t kWideRowsAhead = 3;

// Per-thread buffers, separately allocated so the compiler can see they do
// not overlap. A thread keeps its Scratch from call to call
// (WithThreadScratch).
struct Scratch {
  explicit Scratch(const AbsolutePlan& p)
      : dim(p.dim),
        frequencies(static_cast<int64_t>(p.phase_step.size())),
        wide(WideFor(p)),
        bf16_512(CpuHasAvx512()),
        f32_far(CpuIsIntel() ? kWideF32FarAhead / static_cast<int64_t>(sizeof(float)) : 0),
        bf16_rows_ahead(bf16_512 && CpuIsIntel() ? kWideRowsAheadIntel512 : kWideRowsAhead),
        narrowing(CpuHasAvx512Bf16() ? Narrowing::kInstruction : Narrowing::kRounding),
        pairs(PairsFor(p)),
        row(p.dim),
        saved(p.dim),
        flag(p.dim),
        pending_at(PendingCapacity(p.dim)),
        pending_x(PendingCapacity(p.dim)),
        current(p.phase_step.size()),
        next(p.phase_step.size()),
        step_hi(p.phase_step.size()),
        step_lo(p.phase_step.size()),
        stride_hi(p.phase_step.size()),
        stride_lo(p.phase_step.size()) {
    Restart(p);
  }

  // Whether plan p's fused pass runs a wide loop (FusedRangeBF16Wide or
  // FusedRangeBF16Avx2 for bfloat16, FusedRangeF32Wide for float32), and
  // whether it keeps the anchor row in pairs (the 8-lane loops).
  static bool WideFor(const AbsolutePlan& p) {
    return Fuses(p) &&
           (p.dtype == DType::kBFloat16 ? CpuHasAvx512() || CpuHasAvx2() : CpuHasAvx512());
  }
  static bool PairsFor(const AbsolutePlan& p) {
    return p.options.sinusoidal_layout == SinusoidalLayout::kInterleaved && Fuses(p) && !WideFor(p);
  }

  // Whether this Scratch's buffers and layouts serve plan p.
  bool Serves(const AbsolutePlan& p) const {
    return dim == p.dim && frequencies == static_cast<int64_t>(p.phase_step.size()) &&
           wide == WideFor(p) && pairs == PairsFor(p);
  }

  // Readies a Scratch that Serves(p) for a call on p: no anchor row
  // computed, nor its phase steps split (SplitSteps) until one is.
  void Restart(const AbsolutePlan& p) {
    phase_step = p.phase_step.data();
    steps_split = false;
    current.anchor = next.anchor = 1;  // not a multiple of 16: none
    next_done = 0;
    pending = 0;
  }

  // The call's phase steps in words, for the anchor rows it computes. Not
  // done in Restart: a call whose rows all come from the backend's table
  // computes none, and for a one-token call of 4096 elements the split was
  // 2 instructions an element (posenc-count-instructions).
  void SplitSteps() {
    SplitPhaseSteps(phase_step, frequencies, step_hi.data(), step_lo.data(), stride_hi.data(),
                    stride_lo.data());
    steps_split = true;
  }

  // Roughly the bytes it holds.
  int64_t Bytes() const { return 20 * dim + 8 * PendingCapacity(dim) + 64 * frequencies; }

  const int64_t dim;
  const int64_t frequencies;
  const bool wide;  // the fused pass runs a wide loop (WideFor)
  // Which wide loop bfloat16 takes: FusedRangeBF16Wide, else
  // FusedRangeBF16Avx2; and how the former narrows (AVX-512 BF16's
  // instruction, or integer rounding: bf16_wide.h). The CPU's, not the
  // plan's: a Scratch made for a float32 plan serves a bfloat16 one of the
  // same width (Serves).
  const bool bf16_512;
  // Elements ahead that the wide float32 loop asks for into L2 (0: none),
  // and rows ahead that the wide bfloat16 loops ask for their block.
  const int64_t f32_far, bf16_rows_ahead;
  const Narrowing narrowing;
  const bool pairs;  // AnchorRow's layout: pairs (the 8-lane fused INTERLEAVED pass) or halves
  std::vector<float> row;     // [dim] PE in float32 (paths that do not fuse)
  std::vector<float> saved;   // [dim] 16-bit inputs kept for recomputation (ditto)
  std::vector<uint8_t> flag;  // [dim] elements to recompute in double (ditto)
  // The fused pass's elements to recompute in double, and their inputs: the
  // row loop only records them, so it makes no calls (a call inside it made
  // the compiler spill its pointers for every iteration).
  UninitializedArray<int32_t> pending_at;  // [PendingCapacity]: a group's rows
  UninitializedArray<float> pending_x;
  int64_t pending = 0;
  // The backend's kept anchor rows for this call's plan, in this Scratch's
  // layout (AbsoluteTokensCpu; null where it keeps none).
  RowTable* anchors = nullptr;
  // The token whose row x starts with (AbsoluteTokensCpu's `origin`; 0 but
  // for a block copied aside).
  int64_t origin = 0;
  // The anchor of the tokens being processed (where `anchors` has no row),
  // and the one 16 positions on, of which frequencies [0, next_done) are
  // computed so far.
  AnchorRow current, next;
  int64_t next_done = 0;
  const uint64_t* phase_step = nullptr;        // the call's plan's
  bool steps_split = false;                    // the four below hold phase_step's
  std::vector<uint32_t> step_hi, step_lo;      // words of plan.phase_step
  std::vector<uint32_t> stride_hi, stride_lo;  // words of 16 * phase_step mod 2^64
};

// Frequency i's sin_i (signed for the anchor) and cos_i in an anchor row's
// layout: pairs, a = [sin_i, cos_i] and b = [cos_i, -sin_i], so that a * c +
// b * s lane by lane is RotateSinCos: sin_i c + cos_i s, and cos_i c +
// (-sin_i) s, which equals cos_i c - sin_i s exactly (negation is exact, and
// x + (-y) is x - y in IEEE arithmetic); halves, a = sin_i, b = cos_i. The
// kept rows (FillAnchorRows) are written by it too.
template <bool kPairs>
POSENC_ALWAYS_INLINE void StoreAnchorValues(int64_t i, float sn, float cs, float* __restrict a,
                                            float* __restrict b) {
  if constexpr (kPairs) {
    a[2 * i] = sn;
    a[2 * i + 1] = cs;
    b[2 * i] = cs;
    b[2 * i + 1] = -sn;
  } else {
    a[i] = sn;
    b[i] = cs;
  }
}

// sin and cos of frequencies [lo, hi) from their phases (high words) into
// an anchor row's a and b. sin(-x) = -sin(x), as SinCosOfPosition.
POSENC_ALWAYS_INLINE void SinCosOfPhases(const uint32_t* __restrict phase, bool negative,
                                         bool pairs, int64_t lo, int64_t hi, float* __restrict a,
                                         float* __restrict b) {
  auto range = [&](auto in_pairs) {
    for (int64_t i = lo; i < hi; ++i) {
      float sn, cs;
      SinCosOfPhase(phase[i], &sn, &cs);
      StoreAnchorValues<decltype(in_pairs)::value>(i, negative ? -sn : sn, cs, a, b);
    }
  };
  pairs ? range(std::true_type{}) : range(std::false_type{});
}

POSENC_ALWAYS_INLINE void SinCosRange(AnchorRow& r, bool pairs, int64_t lo, int64_t hi) {
  SinCosOfPhases(r.phase_hi.data(), r.anchor < 0, pairs, lo, hi, r.a.data(), r.b.data());
}

// s.current for `anchor`, from scratch: PhaseOf's two multiplies (|anchor| <
// 2^32: planning admits |pos| <= 2^31).
POSENC_ALWAYS_INLINE void ComputeAnchor(int64_t anchor, Scratch& s) {
  AnchorRow& r = s.current;
  r.anchor = anchor;
  const uint32_t abs_anchor = static_cast<uint32_t>(anchor < 0 ? -anchor : anchor);
  const uint32_t* __restrict step_hi = s.step_hi.data();
  const uint32_t* __restrict step_lo = s.step_lo.data();
  uint32_t* __restrict hi = r.phase_hi.data();
  uint32_t* __restrict lo = r.phase_lo.data();
  for (int64_t i = 0; i < s.frequencies; ++i) {
    const uint64_t low_product = static_cast<uint64_t>(abs_anchor) * step_lo[i];
    hi[i] = abs_anchor * step_hi[i] + static_cast<uint32_t>(low_product >> 32);
    lo[i] = static_cast<uint32_t>(low_product);
  }
  SinCosRange(r, s.pairs, 0, s.frequencies);
}

// Up to `count` more frequencies of s.next (anchor s.current.anchor + 16).
// Its phase is the current one moved by 16 S_i (|anchor| up by 16, or down
// by 16 for a negative anchor): exact in modular arithmetic, so its high
// word is PhaseOf's bit for bit, at an add where PhaseOf multiplies twice.
// The fused pass calls this between blocks of its row, so the next anchor's
// arithmetic runs while the current rows stream.
POSENC_ALWAYS_INLINE void AdvanceNext(int64_t count, Scratch& s) {
  const int64_t lo = s.next_done;
  const int64_t end = std::min(s.frequencies, lo + count);
  if (lo >= end) return;
  const uint32_t* __restrict cur_hi = s.current.phase_hi.data();
  const uint32_t* __restrict cur_lo = s.current.phase_lo.data();
  const uint32_t* __restrict dhi = s.stride_hi.data();
  const uint32_t* __restrict dlo = s.stride_lo.data();
  uint32_t* __restrict hi = s.next.phase_hi.data();
  uint32_t* __restrict low = s.next.phase_lo.data();
  if (s.current.anchor >= 0) {
    for (int64_t i = lo; i < end; ++i) {
      const uint32_t sum = cur_lo[i] + dlo[i];
      hi[i] = cur_hi[i] + dhi[i] + static_cast<uint32_t>(sum < dlo[i]);  // carry
      low[i] = sum;
    }
  } else {
    for (int64_t i = lo; i < end; ++i) {
      const uint32_t borrow = static_cast<uint32_t>(cur_lo[i] < dlo[i]);
      hi[i] = cur_hi[i] - dhi[i] - borrow;
      low[i] = cur_lo[i] - dlo[i];
    }
  }
  SinCosRange(s.next, s.pairs, lo, end);
  s.next_done = end;
}

// Makes s.current the anchor row of `anchor`: the next row, finished, when
// the tokens moved on by 16 positions, else computed afresh; then starts the
// row after it.
POSENC_ALWAYS_INLINE void MoveToAnchor(int64_t anchor, Scratch& s) {
  if (!s.steps_split) s.SplitSteps();
  if (anchor == s.next.anchor) {
    AdvanceNext(s.frequencies, s);
    std::swap(s.current, s.next);
  } else {
    ComputeAnchor(anchor, s);
  }
  s.next.anchor = anchor + kPhaseAnchorStride;
  s.next_done = 0;
}

// Where a token's PE comes from: its anchor row (in s) and its offset's row of
// the plan's table.
struct RowSource {
  const float* __restrict a;
  const float* __restrict b;
  const float* __restrict tc;  // cos(k w_i)
  const float* __restrict ts;  // sin(k w_i)
};

// The anchor row is the backend's kept one (anchor_cache.h) where it has it,
// else s.current, computed as the tokens reach it.
POSENC_ALWAYS_INLINE RowSource SourceOf(const AbsolutePlan& p, int64_t pos, Scratch& s) {
  const int64_t anchor = PhaseAnchor(pos);
  const int64_t at = (pos - anchor) * s.frequencies;
  const float* tc = p.offset_cos.data() + at;
  const float* ts = p.offset_sin.data() + at;
  if (s.anchors != nullptr) {
    // A negative anchor's index is negative too: no row.
    if (const float* row = s.anchors->Row(anchor / kPhaseAnchorStride)) {
      return {row, row + (s.pairs ? 2 : 1) * s.frequencies, tc, ts};  // AnchorRowFloats / 2
    }
  }
  if (anchor != s.current.anchor) MoveToAnchor(anchor, s);
  return {s.current.a.data(), s.current.b.data(), tc, ts};
}

// The INTERLEAVED PE pairs of frequencies [i, i + 8): elements [2i, 2i + 16)
// of the row, as two vectors. Each table value serves both elements of its
// pair, spread from a 4-value load by one permute (the old 8-value load
// took two shuffles per vector).
POSENC_ALWAYS_INLINE void InterleavedPe16(const float* __restrict a, const float* __restrict b,
                                          const float* __restrict tc, const float* __restrict ts,
                                          int64_t i, V8* pe0, V8* pe1) {
  *pe0 = Load8(a + 2 * i) * Spread4(tc + i) + Load8(b + 2 * i) * Spread4(ts + i);
  *pe1 = Load8(a + 2 * i + 8) * Spread4(tc + i + 4) + Load8(b + 2 * i + 8) * Spread4(ts + i + 4);
}

// Element e of an INTERLEAVED row, one at a time (the same operations).
POSENC_ALWAYS_INLINE float InterleavedPe1(const float* __restrict a, const float* __restrict b,
                                          const float* __restrict tc, const float* __restrict ts,
                                          int64_t e) {
  return a[e] * tc[e / 2] + b[e] * ts[e / 2];
}

// PE[pos] in float32, [dim], for the paths that do not fuse (tables, 16-bit
// float, learned encodings).
POSENC_ALWAYS_INLINE void EncodingRow(const AbsolutePlan& p, int64_t pos, Scratch& s) {
  float* __restrict row = s.row.data();
  if (p.options.kind == AbsoluteOptions::Kind::kLearned) {
    const float* src = p.options.table->values.data() + pos * p.dim;
    for (int64_t i = 0; i < p.dim; ++i) row[i] = src[i];
    return;
  }
  const RowSource r = SourceOf(p, pos, s);
  const int64_t half = p.dim / 2;
  if (p.options.sinusoidal_layout == SinusoidalLayout::kInterleaved) {
    for (int64_t i = 0; i < half; ++i) {
      RotateSinCos(r.a[i], r.b[i], r.ts[i], r.tc[i], &row[2 * i], &row[2 * i + 1]);
    }
    if (p.dim % 2 == 1) {  // odd d: a last sin channel
      float c;
      RotateSinCos(r.a[half], r.b[half], r.ts[half], r.tc[half], &row[p.dim - 1], &c);
    }
  } else {
    for (int64_t i = 0; i < half; ++i) {
      RotateSinCos(r.a[i], r.b[i], r.ts[i], r.tc[i], &row[i], &row[half + i]);
    }
    if (p.dim % 2 == 1) row[p.dim - 1] = 0.0f;  // fairseq's zero channel for odd d
  }
}

// AddEncoding on two runs of 8 consecutive elements, y0[0, 8) and y1[0, 8),
// of a float32 or bfloat16 row y, with sinusoidal PE; x is scaled only when
// kScaled (x * 1.0f is x, bit for bit, so the product is skipped for
// x_scale = 1). For bfloat16 the conversions are BFloat16ToFloat and
// FloatToBFloat16 in 32-bit lanes. A bfloat16 run with a lane that
// SinusoidalSumNeedsPrecise flags (or NaN) goes element by element instead:
// `slow(y)` for y0 and y1, before anything is stored, so that no vector needs
// to outlive the branch (the compiler spilled four per iteration when the
// lane-by-lane fix-up used them).
template <typename T, bool kScaled, typename Slow>
POSENC_ALWAYS_INLINE void Add16(T* __restrict y0, V8 pe0, T* __restrict y1, V8 pe1, float xs,
                                Slow slow) {
  if constexpr (std::is_same_v<T, float>) {
    V8 u0 = Load8(y0), u1 = Load8(y1);
    if constexpr (kScaled) {
      u0 *= xs;
      u1 *= xs;
    }
    Store8(y0, u0 + pe0);
    Store8(y1, u1 + pe1);
  } else {
    static_assert(std::is_same_v<T, BFloat16>);
    V8 u0 = BFloat16ToFloat8(y0), u1 = BFloat16ToFloat8(y1);
    if constexpr (kScaled) {
      u0 *= xs;
      u1 *= xs;
    }
    const V8 r0 = u0 + pe0, r1 = u1 + pe1;
    // |r| >= kSinusoidalSafeSum is false for the lanes
    // SinusoidalSumNeedsPrecise flags and for NaN (unordered): one compare
    // finds both. They are rare (about 1 in 1000 for random data).
    const V8i safe = (Abs8(r0) >= kSinusoidalSafeSum<T>)&(Abs8(r1) >= kSinusoidalSafeSum<T>);
    if (__builtin_expect(AllTrue(safe), 1)) {
      StoreBFloat16x16(r0, r1, y0, y1);
    } else {
      slow(y0);
      slow(y1);
    }
  }
}

// Frequencies of a row between two steps of the next anchor row: 64 per
// kNextEvery over (d+1)/2 frequencies and 16 tokens is the whole next row.
// Each block is a call of the row loop and a step of the next row, and
// each pays its set-up (about 90 instructions a call for the wide loop).
// Steps of 8 per 128 measured 7% (float32) and 13% (bfloat16) slower than
// 32 per 512; 64 per 1024 ran bf16 [4096, 4096] 45.6-52.1 GB/s against
// 47.0-49.1 and float32 51.3-57.2 against 49.0-50.7, where 128 per 2048
// ran bf16 slower again (44.0-45.9: a block's tables and rows no longer
// stay in L1 through the group; EPYC, three alternated rounds).
constexpr int64_t kNextEvery = 64 * kPhaseAnchorStride;

// How far ahead of its stores the fused pass prefetches its row (and the
// next rows): the hardware prefetcher alone left float32 rows at 20 GB/s
// where 2, 4 and 8 KiB ahead gave 27-30 (bench/RESULTS.md).
constexpr int64_t kPrefetchAhead = 4096;

// How far ahead in its row the wide float32 loop prefetches. About 1000
// runs of each distance over 15 minutes, sorted by the baseline of their
// own run: on a quiet host (read-modify-write at 90 GB/s and over) 8 KiB
// ran a median 71.0 GB/s against 65.9 for 4, 64.7 for 16 and 63.2 for 32;
// on a busy one all four ran 48.9-49.7 (bench/RESULTS.md).
constexpr int64_t kWideF32PrefetchAhead = 8192;

// Frequencies [lo, hi) (multiples of 8 apart) of the row y: INTERLEAVED
// elements [2 lo, 2 hi), or CONCATENATED [lo, hi) and [half + lo, half + hi).
// Pointers are copied to locals so that the loop keeps them in registers.
// A run that Add16 sends element by element is AddEncoding on each element,
// PE computed by the scalar form of the same operations; the elements it
// flags are recorded in s.pending (offset in y, input) for the caller.
template <typename T, bool kScaled>
POSENC_ALWAYS_INLINE void FusedRangeBody(const float* __restrict a, const float* __restrict b,
                                         const float* __restrict tc, const float* __restrict ts,
                                         bool interleaved, int64_t half, T* __restrict y,
                                         int64_t lo, int64_t hi, float xs,
                                         int32_t* __restrict pending_at,
                                         float* __restrict pending_x, int64_t* pending_count) {
  int64_t pending = *pending_count;
  // Element by element: the PE of element e, then the sum.
  auto slow = [=, &pending](T* run) {
    for (int j = 0; j < 8; ++j) {
      const int64_t e = run - y + j;
      float pe;
      if (interleaved) {
        pe = InterleavedPe1(a, b, tc, ts, e);
      } else {
        float sn, cs;
        const int64_t i = e < half ? e : e - half;
        RotateSinCos(a[i], b[i], ts[i], tc[i], &sn, &cs);
        pe = e < half ? sn : cs;
      }
      const float x = ToFloat(run[j]);
      const float r = (kScaled ? x * xs : x) + pe;
      run[j] = FromFloat<T>(r);
      if (SinusoidalSumNeedsPrecise<T>(r)) {
        pending_at[pending] = static_cast<int32_t>(e);
        pending_x[pending++] = x;
      }
    }
  };
  if (interleaved) {
    for (int64_t i = lo; i < hi; i += 8) {
      __builtin_prefetch(y + 2 * i + kPrefetchAhead / sizeof(T), 1, 3);
      V8 pe0, pe1;
      InterleavedPe16(a, b, tc, ts, i, &pe0, &pe1);
      Add16<T, kScaled>(y + 2 * i, pe0, y + 2 * i + 8, pe1, xs, slow);
    }
  } else {
    for (int64_t i = lo; i < hi; i += 8) {
      __builtin_prefetch(y + i + kPrefetchAhead / sizeof(T), 1, 3);
      __builtin_prefetch(y + half + i + kPrefetchAhead / sizeof(T), 1, 3);
      const V8 as = Load8(a + i), ac = Load8(b + i);
      const V8 c = Load8(tc + i), sn = Load8(ts + i);
      Add16<T, kScaled>(y + i, as * c + ac * sn, y + half + i, ac * c - as * sn, xs,
                        slow);  // RotateSinCos
    }
  }
  *pending_count = pending;
}

// FusedRangeBody in a function of its own per dtype and scaling, compiled
// per instruction set (cpu_kernels.h): inlined into the dispatcher with the
// rest of the file, GCC kept the loop's pointers on the stack and reloaded
// six of them every iteration.
#define POSENC_FUSED_RANGE(Name, T, kScaled)                                                       \
  POSENC_CPU_CLONES __attribute__((noinline)) void Name(                                           \
      const float* a, const float* b, const float* tc, const float* ts, bool interleaved,          \
      int64_t half, T* y, int64_t lo, int64_t hi, float xs, int32_t* pending_at, float* pending_x, \
      int64_t* pending) {                                                                          \
    FusedRangeBody<T, kScaled>(a, b, tc, ts, interleaved, half, y, lo, hi, xs, pending_at,         \
                               pending_x, pending);                                                \
  }
POSENC_FUSED_RANGE(FusedRangeF32, float, false)
POSENC_FUSED_RANGE(FusedRangeF32Scaled, float, true)
POSENC_FUSED_RANGE(FusedRangeBF16, BFloat16, false)
POSENC_FUSED_RANGE(FusedRangeBF16Scaled, BFloat16, true)
#undef POSENC_FUSED_RANGE

// Frequencies [lo, hi) of the row y of a token whose tables r gives. The
// wide loop asks for the elements `ahead` on as it goes.
template <typename T, bool kScaled>
POSENC_ALWAYS_INLINE void FusedRange(const RowSource& r, bool interleaved, int64_t half, T* y,
                                     int64_t lo, int64_t hi, float xs, int64_t ahead, Scratch& s) {
  (void)ahead;  // the wide loops' alone: the 8-lane ones prefetch kPrefetchAhead on
  auto run = [&](auto* range) {
    range(r.a, r.b, r.tc, r.ts, interleaved, half, y, lo, hi, xs, s.pending_at.data(),
          s.pending_x.data(), &s.pending);
  };
  if constexpr (std::is_same_v<T, float>) {
#ifdef POSENC_CPU_BF16_WIDE
    if (s.wide) {
      auto wide = interleaved ? FusedRangeF32Wide<kScaled, true, false>
                              : FusedRangeF32Wide<kScaled, false, false>;
      if (s.f32_far != 0) {
        wide = interleaved ? FusedRangeF32Wide<kScaled, true, true>
                           : FusedRangeF32Wide<kScaled, false, true>;
      }
      return wide(r.a, r.b, r.tc, r.ts, half, y, lo, hi, xs, ahead, s.f32_far);
    }
#endif
    run(kScaled ? FusedRangeF32Scaled : FusedRangeF32);
  } else {
#ifdef POSENC_CPU_BF16_WIDE
    if (s.wide) {
      // The layout as a template argument: tested in the loop, it cost
      // five of its 31 instructions a step.
      auto wide =
          interleaved ? FusedRangeBF16Avx2<kScaled, true> : FusedRangeBF16Avx2<kScaled, false>;
      if (s.bf16_512) {
        if (s.narrowing == Narrowing::kInstruction) {
          wide = interleaved ? FusedRangeBF16Wide<Narrowing::kInstruction, kScaled, true>
                             : FusedRangeBF16Wide<Narrowing::kInstruction, kScaled, false>;
        } else {
          wide = interleaved ? FusedRangeBF16Wide<Narrowing::kRounding, kScaled, true>
                             : FusedRangeBF16Wide<Narrowing::kRounding, kScaled, false>;
        }
      }
      return wide(r.a, r.b, r.tc, r.ts, half, y, lo, hi, xs, s.pending_at.data(),
                  s.pending_x.data(), &s.pending, ahead);
    }
#endif
    run(kScaled ? FusedRangeBF16Scaled : FusedRangeBF16);
  }
}

// The fused pass's flagged elements s.pending_at/x[0, s.pending) (offsets
// from y0, the row of the token at pos[0]), stored again with PE in double:
// PreciseEncoding's operations, a batch at a time so that SinCosPrecise runs
// in a loop the compiler vectorises. One by one, each was a chain of ~60
// dependent double operations behind a call.
template <typename T>
POSENC_ALWAYS_INLINE void FinishPending(const AbsolutePlan& p, const int64_t* pos, T* y0,
                                        Scratch& s) {
  constexpr int64_t kBatch = 64;
  const int64_t dim = p.dim;
  const bool interleaved = p.options.sinusoidal_layout == SinusoidalLayout::kInterleaved;
  for (int64_t k0 = 0; k0 < s.pending; k0 += kBatch) {
    const int64_t n = std::min(kBatch, s.pending - k0);
    const int32_t* at = s.pending_at.data() + k0;
    alignas(64) double angle[kBatch] = {}, sn[kBatch], cs[kBatch];
    for (int64_t j = 0; j < n; ++j) {
      const int64_t g = at[j] / dim;
      const SinusoidalChannel ch = ChannelOf(interleaved, dim, at[j] - g * dim);
      angle[j] = static_cast<double>(pos[g]) * p.omega[ch.frequency];
    }
    for (int64_t j = 0; j < kBatch; ++j) SinCosPrecise(angle[j], &sn[j], &cs[j]);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t g = at[j] / dim;
      const SinusoidalChannel ch = ChannelOf(interleaved, dim, at[j] - g * dim);
      const double pe = ch.is_zero ? 0.0 : ch.is_sin ? sn[j] : cs[j];
      y0[at[j]] = FromFloat<T>(
          static_cast<float>(static_cast<double>(s.pending_x[k0 + j]) * p.options.x_scale + pe));
    }
  }
}

// y = x * x_scale + PE with PE computed in the same pass (see the top of the
// file), for float32 and bfloat16 rows (Fuses).
//
// The wide loop takes tokens in groups that share an anchor (up to 16
// consecutive tokens), frequency block by block: a block's slice of the
// anchor row then serves the whole group from L1, where row by row the
// anchor row, the offset rows, the next anchor row and the row itself
// (56 KiB for d = 4096) overflowed a 48 KiB L1 every token. The other loops
// take one token at a time.
template <typename T, bool kScaled>
POSENC_ALWAYS_INLINE void FusedTokens(const AbsolutePlan& p, T* __restrict x, int64_t begin,
                                      int64_t end, Scratch& s) {
  const int64_t dim = p.dim, half = dim / 2;
  const double x_scale = p.options.x_scale;
  const float xs = static_cast<float>(x_scale);
  const bool interleaved = p.options.sinusoidal_layout == SinusoidalLayout::kInterleaved;
  // Frequencies the vector loops take: multiples of 16 for the wide loop,
  // of 8 otherwise.
  const int64_t vector_end = s.wide ? half - half % 16 : half - half % 8;
  // Groups of tokens for the bfloat16 wide loop (see above); float32 rows,
  // twice the bytes, go one at a time, prefetched within the row: in
  // groups, the wide float32 loop ran the bench 47-52 GB/s against 53-55
  // for the 8-lane loop row by row (three alternated rounds), row by row
  // 57-66 against 55-63 (five, on a quiet host). `ahead` serves the wide
  // loops only (the 8-lane ones prefetch kPrefetchAhead on).
  constexpr bool kGroups = std::is_same_v<T, BFloat16>;
  const int64_t max_group =
      kGroups && s.wide ? std::clamp<int64_t>(PendingCapacity(dim) / dim, 1, kPhaseAnchorStride)
                        : 1;
  const int64_t ahead =
      kGroups ? s.bf16_rows_ahead * dim : kWideF32PrefetchAhead / static_cast<int64_t>(sizeof(T));
  const int64_t* pos = p.positions.values.data();
  RowSource source[kPhaseAnchorStride];
  int64_t run_end = begin;  // tokens [t, run_end) are all at t's anchor
  for (int64_t t = begin; t < end;) {
    const int64_t anchor = PhaseAnchor(pos[t]);
    if (t == run_end) {
      while (run_end < end && PhaseAnchor(pos[run_end]) == anchor) ++run_end;
    }
    const int64_t group_end = std::min(run_end, t + max_group);
    const int64_t group = group_end - t;
    for (int64_t g = 0; g < group; ++g) source[g] = SourceOf(p, pos[t + g], s);
    // The next anchor row is built as the group streams only if the token
    // after this run is at it: at the end of the range, or where positions
    // jump (a decode batch), no token would use it (a 16-position call
    // built two rows for one). A row wanted but not built comes from
    // MoveToAnchor, bit for bit the same (its phases are exact sums).
    const bool advance = run_end < end && PhaseAnchor(pos[run_end]) == s.next.anchor;
    // Frequencies in blocks of kNextEvery, with a 16th of that many of the
    // next anchor row's after each, per token: a 16th of its row per token.
    // Pending elements are numbered from the group's first row.
    s.pending = 0;
    for (int64_t block = 0; block < vector_end; block += kNextEvery) {
      for (int64_t g = 0; g < group; ++g) {
        const int64_t first = s.pending;
        FusedRange<T, kScaled>(source[g], interleaved, half, x + (t - s.origin + g) * dim, block,
                               std::min(vector_end, block + kNextEvery), xs, ahead, s);
        for (int64_t k = first; k < s.pending; ++k) {
          s.pending_at[k] += static_cast<int32_t>(g * dim);
        }
      }
      if (advance) AdvanceNext(group * kNextEvery / kPhaseAnchorStride, s);
    }
    T* __restrict y0 = x + (t - s.origin) * dim;
    FinishPending(p, pos + t, y0, s);
    for (int64_t g = 0; g < group; ++g) {
      const RowSource& r = source[g];
      T* __restrict y = y0 + g * dim;
      auto one = [&](int64_t e, float pe) {
        AddEncoding(&y[e], pe, x_scale, PeRange::kSinusoidal,
                    [&] { return PreciseEncoding(p, pos[t + g], e); });
      };
      if (interleaved && s.pairs) {
        for (int64_t e = 2 * vector_end; e < dim; ++e)
          one(e, InterleavedPe1(r.a, r.b, r.tc, r.ts, e));  // odd d: a sin
      } else if (interleaved) {                             // the anchor row in halves
        for (int64_t e = 2 * vector_end; e < dim; ++e) {
          const int64_t i = e / 2;
          float sn, cs;
          RotateSinCos(r.a[i], r.b[i], r.ts[i], r.tc[i], &sn, &cs);
          one(e, e % 2 == 0 ? sn : cs);  // odd d: a sin
        }
      } else {
        for (int64_t i = vector_end; i < half; ++i) {
          float sn, cs;
          RotateSinCos(r.a[i], r.b[i], r.ts[i], r.tc[i], &sn, &cs);
          one(i, sn);
          one(half + i, cs);
        }
        if (dim % 2 == 1) one(dim - 1, 0.0f);  // fairseq's zero channel for odd d
      }
    }
    t = group_end;
  }
}

template <typename T>
POSENC_ALWAYS_INLINE void AbsoluteTokens(const AbsolutePlan& p, T* __restrict x, int64_t begin,
                                         int64_t end, Scratch& s) {
  if constexpr (std::is_same_v<T, BFloat16> || std::is_same_v<T, float>) {
    if (Fuses(p)) {
      return p.options.x_scale == 1.0 ? FusedTokens<T, false>(p, x, begin, end, s)
                                      : FusedTokens<T, true>(p, x, begin, end, s);
    }
  }
  const int64_t dim = p.dim;
  float* __restrict row = s.row.data();
  float* __restrict saved = s.saved.data();
  uint8_t* __restrict flag = s.flag.data();
  const double x_scale = p.options.x_scale;
  const float xs = static_cast<float>(x_scale);
  const PeRange range = RangeOf(p);
  for (int64_t t = begin; t < end; ++t) {
    const int64_t pos = p.positions.values[t];
    EncodingRow(p, pos, s);
    T* __restrict y = x + (t - s.origin) * dim;
    auto precise = [&](int64_t i) { return PreciseEncoding(p, pos, i); };
    if (!p.has_input) {
      for (int64_t i = 0; i < dim; ++i) {
        y[i] = EncodingOnly<T>(row[i], [&] { return precise(i); });
      }
      continue;
    }
    if constexpr (std::is_same_v<T, float>) {
      for (int64_t i = 0; i < dim; ++i) {
        AddEncoding(&y[i], row[i], x_scale, range, [] { return 0.0; });
      }
    } else if (xs == 0.0f) {
      // The loop below keeps the NaN inf * 0 makes as x86 does; this rare
      // scale takes the formula element by element.
      for (int64_t i = 0; i < dim; ++i) {
        AddEncoding(&y[i], row[i], x_scale, range, [&] { return precise(i); });
      }
    } else {
      // AddEncoding's float32 half, vectorised; its double half for the
      // flagged elements after.
      for (int64_t i = 0; i < dim; ++i) {
        const float xi = ToFloat(y[i]);
        const float u = xi * xs;
        const float r = u + row[i];
        saved[i] = xi;
        y[i] = FromFloat<T>(r);
        flag[i] = static_cast<uint8_t>(NeedsPrecise<T>(range, r, u, row[i]));
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

void AbsoluteTokensCpu(const AbsolutePlan& plan, RowTable* anchors, void* x, int64_t begin,
                       int64_t end, int64_t origin) {
  if (anchors != nullptr && !AnchorCache::Serves(*anchors, plan)) {
    std::abort();  // AnchorCache::For gives only the plan's own table
  }
  WithThreadScratch<Scratch>(plan, [&](Scratch& s) {
    s.anchors = anchors;
    s.origin = origin;
    AbsoluteDispatch(plan, x, begin, end, s);
    s.anchors = nullptr;  // the call's to hold, not the kept Scratch's
    s.origin = 0;
  });
}

bool ReadsAnchorRows(const AbsolutePlan& plan) { return Fuses(plan); }

bool AnchorRowsInPairs(const AbsolutePlan& plan) { return Scratch::PairsFor(plan); }

int64_t AnchorRowFloats(const AbsolutePlan& plan) {
  return (AnchorRowsInPairs(plan) ? 4 : 2) * static_cast<int64_t>(plan.phase_step.size());
}

POSENC_CPU_CLONES void FillAnchorRows(const uint64_t* step, int64_t frequencies, bool pairs,
                                      int64_t first, int64_t count, float* rows) {
  // ComputeAnchor's two loops: the phases (PhaseOf), then their sines and
  // cosines, each of which the compiler vectorises.
  std::vector<uint32_t> phase(frequencies);
  const int64_t row_floats = (pairs ? 4 : 2) * frequencies;
  for (int64_t j = 0; j < count; ++j) {
    const auto anchor = static_cast<uint32_t>((first + j) * kPhaseAnchorStride);
    for (int64_t i = 0; i < frequencies; ++i) {
      phase[i] =
          PhaseOf(anchor, static_cast<uint32_t>(step[i] >> 32), static_cast<uint32_t>(step[i]));
    }
    float* a = rows + j * row_floats;
    SinCosOfPhases(phase.data(), false, pairs, 0, frequencies, a, a + row_floats / 2);
  }
}

}  // namespace posenc::internal
