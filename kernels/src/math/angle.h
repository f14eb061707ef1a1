// Accurate sine and cosine of large angles, shared by every kernel (host and
// device). Internal to the kernel library.
//
// Why not sinf(pos * f)? Forming the angle in float32 loses everything at
// large positions (at 10^6 a float32 angle is off by up to 0.03 rad; see
// GPT-NeoX#1003, FlashInfer#585). We form the angle in float64, reduce it by
// pi/2 with a three-part Cody-Waite constant (each part 21 bits, so q * part
// is exact for |q| < 2^32), and evaluate minimax polynomials in float on
// [-pi/4, pi/4]. The code is branch-free so loops over it vectorise.
#ifndef POSENC_KERNELS_MATH_ANGLE_H_
#define POSENC_KERNELS_MATH_ANGLE_H_

#include <cstdint>
#include <type_traits>

#include "posenc/dtype.h"
#include "posenc/host_device.h"

namespace posenc::internal {

inline constexpr double kTwoOverPi = 0.63661977236758134308;
// pi/2 = kPio2A + kPio2B + kPio2C (+ 8.5e-32).
inline constexpr double kPio2A = 0x1.921fb00000000p+0;
inline constexpr double kPio2B = 0x1.5110b00000000p-22;
inline constexpr double kPio2C = 0x1.18469898cc517p-44;
// Adding then subtracting 1.5 * 2^52 rounds a double to an integer (ties to
// even) for |x| < 2^51 without a library call.
inline constexpr double kRoundMagic = 6755399441055744.0;

// sin(x + quadrant * pi/2) and cos(x + quadrant * pi/2) for a reduced
// x in [-pi/4, pi/4]: minimax polynomials in float, then the quadrant's swap
// and signs. Every float sine and cosine in the library ends here.
POSENC_HOST_DEVICE void SinCosOfReduced(float x, int quadrant, float* sin_out, float* cos_out) {
  const float x2 = x * x;
  // Minimax coefficients on [-pi/4, pi/4] (Cephes sinf/cosf).
  const float sp =
      x + x * x2 * (-1.6666654611e-1f + x2 * (8.3321608736e-3f + x2 * -1.9515295891e-4f));
  const float cp =
      1.0f - 0.5f * x2 +
      x2 * x2 *
          (4.166664568298827e-2f + x2 * (-1.388731625493765e-3f + x2 * 2.443315711809948e-5f));
  float s = (quadrant & 1) ? cp : sp;
  float c = (quadrant & 1) ? sp : cp;
  s = (quadrant & 2) ? -s : s;
  c = ((quadrant + 1) & 2) ? -c : c;
  *sin_out = s;
  *cos_out = c;
}

// sin(angle) and cos(angle) to float precision. REQUIRES: |angle| <= 2^31.
POSENC_HOST_DEVICE void SinCos(double angle, float* sin_out, float* cos_out) {
  const double q = (angle * kTwoOverPi + kRoundMagic) - kRoundMagic;
  const double r = ((angle - q * kPio2A) - q * kPio2B) - q * kPio2C;
  // |q| < 2^31, so a 32-bit conversion suffices (and vectorises on AVX2).
  SinCosOfReduced(static_cast<float>(r), static_cast<int32_t>(q) & 3, sin_out, cos_out);
}

// sin(angle) and cos(angle) to about 1e-16 absolute, for outputs whose
// one-ulp bar float32 arithmetic cannot meet (16-bit results that cancel to
// tiny values). Same reduction; fdlibm's kernel polynomials in double.
POSENC_HOST_DEVICE void SinCosPrecise(double angle, double* sin_out, double* cos_out) {
  const double q = (angle * kTwoOverPi + kRoundMagic) - kRoundMagic;
  const double x = ((angle - q * kPio2A) - q * kPio2B) - q * kPio2C;
  const double z = x * x;
  const double sp =
      x + x * z *
              (-1.66666666666666324348e-01 +
               z * (8.33333333332248946124e-03 +
                    z * (-1.98412698298579493134e-04 +
                         z * (2.75573137070700676789e-06 + z * (-2.50507602534068634195e-08 +
                                                                z * 1.58969099521155010221e-10)))));
  const double cp =
      1.0 - 0.5 * z +
      z * z *
          (4.16666666666666019037e-02 +
           z * (-1.38888888888741095749e-03 +
                z * (2.48015872894767294178e-05 +
                     z * (-2.75573143513906633035e-07 +
                          z * (2.08757232129817482790e-09 + z * -1.13596475577881948265e-11)))));
  const int quadrant = static_cast<int32_t>(q) & 3;
  double s = (quadrant & 1) ? cp : sp;
  double c = (quadrant & 1) ? sp : cp;
  s = (quadrant & 2) ? -s : s;
  c = ((quadrant + 1) & 2) ? -c : c;
  *sin_out = s;
  *cos_out = c;
}

// 16-bit outputs must land within one ulp of the float64 result, element by
// element (SPEC §5). Every kernel computes them in float32 and recomputes in
// double only the elements where float32 could miss: a float result r of terms
// t = a*c, b*n (or x*s, pe) errs by at most e = 2^-21.7 (|a| + |b|) |scale|
// (float cos/sin are good to ~2^-23 absolute, plus three roundings). Rounded
// to 16 bits, r lands within half its ulp plus e of the float64 result, which
// is within one ulp while e is under half an ulp: at least 2^-12 |r| for
// float16 (and 2^-25 absolute in its subnormal range), 2^-9 |r| for bfloat16.
// So r is safe when |r| >= 2^-9.7 (|a| + |b|) |scale| for float16 and
// 2^-12.7 (...) for bfloat16; the bounds below are the powers of two above
// those. bfloat16's is 8x lower than float16's, so 8x fewer of its elements
// take the double path: one RoPE pair in 2400 where inputs are uniform in
// [-1, 1] and angles uniform (one in 300 at float16's bound).
template <typename T>
inline constexpr float kCancellationBound = std::is_same_v<T, BFloat16> ? 0x1p-12f : 0x1p-9f;

}  // namespace posenc::internal

#endif  // POSENC_KERNELS_MATH_ANGLE_H_
