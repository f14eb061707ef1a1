// Sinusoidal angles without a float64 reduction per element, shared by the
// CPU and CUDA kernels (host and device). Internal to the kernel library.
//
// sin(p w) depends only on p w modulo 2 pi. Planning writes each frequency
// once as S = w / (2 pi) in turns, a 64-bit fraction rounded to nearest
// (PhaseStepOf); then p S mod 2^64 is the phase of p w in turns, by integer
// arithmetic that wraps exactly where the angle wraps. That replaces the
// float64 product and three-part reduction of SinCos (angle.h) with two
// 32-bit integer multiplies, and is more accurate at large positions: the
// phase errs by at most |p| 2^-65 turn from rounding S (2^-34 turn at
// |p| = 2^31) plus the 2^-32 turn dropped below its top word, while a float64
// angle p w is itself rounded by up to 2^-22 rad at |p| = 2^31.
//
// Evaluating sin and cos still costs ~30 vector instructions per frequency,
// which alone would hold a CPU far below memory speed. So a position p is
// split into an anchor a = p rounded down to a multiple of 16 and an offset
// k = p - a in [0, 16): sin/cos(a w) come from the phase (float, as above;
// consecutive positions share it, so the CPU evaluates it once per 16 tokens),
// sin/cos(k w) from a table planning computes once per request (in double,
// rounded to float), and one rotation in float joins them. Error of the
// result: under 2^-22 absolute (phase_test measures ~2^-22.7 worst over
// 2 x 10^5 random cases to |p| = 2^31; sin/cos straight from the phase,
// ~2^-23.4), within the 2^-21 that the 16-bit cancellation rule of absolute
// encodings allows (angle.h, absolute_math.h). Both backends evaluate exactly
// this, so they agree bit for bit.
#ifndef POSENC_KERNELS_MATH_PHASE_H_
#define POSENC_KERNELS_MATH_PHASE_H_

#include <cmath>
#include <cstdint>

#include "math/angle.h"
#include "posenc/host_device.h"

namespace posenc::internal {

// 2 pi / 2^32: radians per unit of a 32-bit phase.
inline constexpr double kRadiansPerPhaseUnit = 0x1.921fb54442d18p-30;

// The top 32 bits of (abs_pos * step) mod 2^64, step = step_hi 2^32 +
// step_lo: the high word of abs_pos * step_lo plus the low word of
// abs_pos * step_hi, modulo 2^32. The dropped low word is under 2^-32 turn.
POSENC_HOST_DEVICE uint32_t PhaseOf(uint32_t abs_pos, uint32_t step_hi, uint32_t step_lo) {
  return abs_pos * step_hi +
         static_cast<uint32_t>((static_cast<uint64_t>(abs_pos) * step_lo) >> 32);
}

// sin and cos of a phase in units of 2^-32 turn, to float precision: the
// nearest quarter turn (the top two bits, rounded) gives the quadrant; the
// signed rest, below an eighth of a turn, becomes radians exactly in double
// and is rounded once to float, as SinCos rounds its reduced angle.
POSENC_HOST_DEVICE void SinCosOfPhase(uint32_t phase, float* sin_out, float* cos_out) {
  // The low 30 bits, sign-extended: phase - quadrant * 2^30, in [-2^29, 2^29).
  const int32_t rest = static_cast<int32_t>(phase << 2) >> 2;
  const int quadrant = static_cast<int>((phase - static_cast<uint32_t>(rest)) >> 30);
  const float x = static_cast<float>(static_cast<double>(rest) * kRadiansPerPhaseUnit);
  SinCosOfReduced(x, quadrant, sin_out, cos_out);
}

// sin(pos w) and cos(pos w) for w = step in turns (PhaseStepOf). A negative
// position uses sin(-a) = -sin(a), so the integer product stays unsigned.
// REQUIRES: |pos| < 2^32 (planning admits |pos| <= 2^31).
POSENC_HOST_DEVICE void SinCosOfPosition(int64_t pos, uint64_t step, float* sin_out,
                                         float* cos_out) {
  const uint32_t abs_pos = static_cast<uint32_t>(pos < 0 ? -pos : pos);
  float s, c;
  SinCosOfPhase(PhaseOf(abs_pos, static_cast<uint32_t>(step >> 32), static_cast<uint32_t>(step)),
                &s, &c);
  *sin_out = pos < 0 ? -s : s;
  *cos_out = c;
}

// w / (2 pi) as a 64-bit fraction of a turn, rounded to nearest (whole
// turns dropped). Host only, at planning. 1 / (2 pi) is carried as a pair of
// doubles and w times it formed exactly enough (fma) that the 64-bit result
// is off by at most one unit, where a plain double product would be off by
// up to 2^8 units (its 53 bits cannot fill 64). REQUIRES: finite w >= 0.
inline uint64_t PhaseStepOf(double omega) {
  constexpr double kInvTwoPiHi = 0x1.45f306dc9c883p-3;
  constexpr double kInvTwoPiLo = -0x1.6b01ec5417056p-57;
  // turns = hi + lo with |lo| tiny: w * kInvTwoPi to about 2^-100 relative.
  double hi = omega * kInvTwoPiHi;
  double lo = std::fma(omega, kInvTwoPiHi, -hi) + omega * kInvTwoPiLo;
  // Whole turns carry no phase; drop them (exact: floor and subtraction of
  // a double's integer part are exact).
  const double whole = std::floor(hi);
  hi -= whole;
  // In units of 2^-64 turn: the integer part of hi (exact, since hi < 1 has
  // at most 53 significant bits), and the rest of hi plus lo, rounded.
  const double hi_units = std::ldexp(hi, 64);
  const double hi_int = std::floor(hi_units);
  const double rest = (hi_units - hi_int) + std::ldexp(lo, 64);
  // hi_int < 2^64; convert via two halves to stay within int64 conversions.
  const uint64_t top = static_cast<uint64_t>(std::ldexp(hi_int, -32));
  const uint64_t bottom = static_cast<uint64_t>(hi_int - std::ldexp(static_cast<double>(top), 32));
  return (top << 32) + bottom + static_cast<uint64_t>(std::llround(rest));
}

// Positions share an anchor in runs of this many; the offset table has this
// many rows.
inline constexpr int64_t kPhaseAnchorStride = 16;

// p rounded down to a multiple of kPhaseAnchorStride (toward -infinity, so the
// offset p - anchor is in [0, 16) for negative p too). |p| <= 2^31 keeps the
// anchor within [-2^31, 2^31].
POSENC_HOST_DEVICE int64_t PhaseAnchor(int64_t pos) {
  return pos - (pos & (kPhaseAnchorStride - 1));
}

// sin(a + b) and cos(a + b) from those of a (anchor) and b (offset), in float.
POSENC_HOST_DEVICE void RotateSinCos(float anchor_sin, float anchor_cos, float offset_sin,
                                     float offset_cos, float* sin_out, float* cos_out) {
  *sin_out = anchor_sin * offset_cos + anchor_cos * offset_sin;
  *cos_out = anchor_cos * offset_cos - anchor_sin * offset_sin;
}

// sin(pos w_i) and cos(pos w_i) of a sinusoidal encoding: the one formula
// both backends evaluate. offset_sin/offset_cos: [kPhaseAnchorStride,
// frequencies] from BuildOffsetTable; step: PhaseStepOf(w_i).
// In two steps, so that positions sharing an anchor (PhaseAnchor) share the
// first: SinCosOfPosition(anchor, step, &as, &ac), then this.
POSENC_HOST_DEVICE void SinusoidalFromAnchor(int64_t pos, int64_t anchor, float anchor_sin,
                                             float anchor_cos, const float* offset_sin,
                                             const float* offset_cos, int64_t frequencies,
                                             int64_t i, float* sin_out, float* cos_out) {
  const int64_t at = (pos - anchor) * frequencies + i;
  RotateSinCos(anchor_sin, anchor_cos, offset_sin[at], offset_cos[at], sin_out, cos_out);
}
POSENC_HOST_DEVICE void SinusoidalSinCos(int64_t pos, uint64_t step, const float* offset_sin,
                                         const float* offset_cos, int64_t frequencies, int64_t i,
                                         float* sin_out, float* cos_out) {
  const int64_t anchor = PhaseAnchor(pos);
  float as, ac;
  SinCosOfPosition(anchor, step, &as, &ac);
  SinusoidalFromAnchor(pos, anchor, as, ac, offset_sin, offset_cos, frequencies, i, sin_out,
                       cos_out);
}

// The offset table: sin(k w_i) and cos(k w_i) for k in [0, 16), [k][i], to
// float rounding. Host only, at planning. Row 1 in double (SinCosPrecise),
// later rows by rotating by it in double (15 steps add ~1e-15, far below
// float's half ulp): a tenth of the cost of SinCosPrecise for every entry.
inline void BuildOffsetTable(const double* omega, int64_t frequencies, float* offset_sin,
                             float* offset_cos) {
  for (int64_t i = 0; i < frequencies; ++i) {
    double s1, c1;
    SinCosPrecise(omega[i], &s1, &c1);
    double s = 0.0, c = 1.0;
    for (int64_t k = 0; k < kPhaseAnchorStride; ++k) {
      offset_sin[k * frequencies + i] = static_cast<float>(s);
      offset_cos[k * frequencies + i] = static_cast<float>(c);
      const double next_s = s * c1 + c * s1;
      c = c * c1 - s * s1;
      s = next_s;
    }
  }
}

}  // namespace posenc::internal

#endif  // POSENC_KERNELS_MATH_PHASE_H_
