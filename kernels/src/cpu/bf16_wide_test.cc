// The 512-bit loops' narrowing to bfloat16 (bf16_wide.h) against the scalar
// contract's FloatToBFloat16, in both orders the loops store (interleaved
// even and odd, and in sequence): Narrowing::kRounding, for AVX-512 CPUs
// without BF16, for every value but NaN; kInstruction (VCVTNE2PS2BF16) for
// every value, a subnormal read as zero. Inputs lean on what the rounding
// could get wrong: ties and near ties, subnormals, the values that round
// to infinity.
//
// Built twice: bf16_wide_test against the emulated AVX-512 intrinsics
// (tests/support/avx512_emulation), so it runs on any x86-64 CPU with AVX2,
// and bf16_wide_native_test on the instructions (skipped without them).
#include "bf16_wide.h"

#include <cmath>
#include <cstdint>
#include <random>

#include "cpu_kernels.h"
#include "gtest/gtest.h"
#include "posenc/dtype.h"
#include "test_tensors.h"

namespace posenc::internal {
namespace {

// A float of the kinds narrowing can get wrong; NaN only when allowed.
float Draw(std::mt19937_64& rng, bool nan) {
  static constexpr uint32_t kSpecial[] = {
      0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7f7fffffu, 0xff7fffffu,
      0x7f7f8000u, 0xff7f8000u, 0x7f7f7fffu, 0x00800000u, 0x80800000u, 0x007fffffu,
      0x00008000u, 0x80018000u, 0x3f808000u, 0x3f818000u, 0x7fc00000u, 0x7f800001u};
  for (;;) {
    const uint32_t bits = static_cast<uint32_t>(rng());
    float f;
    switch (rng() % 7) {
      case 0:
        f = BitsFloat(bits);
        break;
      case 1:  // a tie: exactly half way between two bfloat16 values
        f = BitsFloat((bits & 0xffff0000u) | 0x8000u);
        break;
      case 2:  // one below or above a tie
        f = BitsFloat((bits & 0xffff0000u) | ((rng() & 1) ? 0x7fffu : 0x8001u));
        break;
      case 3:  // subnormal or zero
        f = BitsFloat(bits & 0x807fffffu);
        break;
      case 4:
        f = BitsFloat(kSpecial[rng() % std::size(kSpecial)]);
        break;
      default: {
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        f = std::ldexp(u(rng), static_cast<int>(rng() % 80) - 40);
        break;
      }
    }
    if (nan || !std::isnan(f)) return f;
  }
}

// even and odd narrowed by kN, interleaved (InterleaveBF16) and in
// sequence (NarrowBF16x32, StoreBF16x16Twice).
template <Narrowing kN>
POSENC_BF16_WIDE_TARGET __attribute__((noinline)) void Narrow(const float* even, const float* odd,
                                                              uint16_t* interleaved,
                                                              uint16_t* sequence, uint16_t* twice) {
  const __m512 e = _mm512_loadu_ps(even), o = _mm512_loadu_ps(odd);
  _mm512_storeu_si512(interleaved, InterleaveBF16<kN>(e, o));
  _mm512_storeu_si512(sequence, NarrowBF16x32<kN>(e, o));
  StoreBF16x16Twice<kN>(e, o, reinterpret_cast<BFloat16*>(twice),
                        reinterpret_cast<BFloat16*>(twice + 16));
}

// What kN must give for x.
uint16_t Expected(Narrowing n, float x) {
  const uint32_t u = FloatBits(x);
  const bool subnormal = (u & 0x7f800000u) == 0 && (u & 0x007fffffu) != 0;
  if (n == Narrowing::kInstruction && subnormal) return static_cast<uint16_t>((u >> 16) & 0x8000u);
  return FloatToBFloat16(x);
}

template <Narrowing kN>
void CheckNarrowing(bool nan) {
  std::mt19937_64& rng = testing::Rng();
  for (int round = 0; round < 20000; ++round) {
    alignas(64) float even[16], odd[16];
    for (int i = 0; i < 16; ++i) {
      even[i] = Draw(rng, nan);
      odd[i] = Draw(rng, nan);
    }
    alignas(64) uint16_t interleaved[32], sequence[32], twice[32];
    for (uint16_t* out : {interleaved, sequence, twice}) {
      for (int i = 0; i < 32; ++i) out[i] = 0xdead;  // poison: an unwritten lane shows
    }
    Narrow<kN>(even, odd, interleaved, sequence, twice);
    for (int i = 0; i < 16; ++i) {
      const uint16_t want_even = Expected(kN, even[i]), want_odd = Expected(kN, odd[i]);
      ASSERT_EQ(interleaved[2 * i], want_even)
          << "interleaved, even " << i << " of 0x" << std::hex << FloatBits(even[i]);
      ASSERT_EQ(interleaved[2 * i + 1], want_odd)
          << "interleaved, odd " << i << " of 0x" << std::hex << FloatBits(odd[i]);
      ASSERT_EQ(sequence[i], want_even) << "in sequence, " << i;
      ASSERT_EQ(sequence[16 + i], want_odd) << "in sequence, " << 16 + i;
      ASSERT_EQ(twice[i], want_even) << "stored twice, " << i;
      ASSERT_EQ(twice[16 + i], want_odd) << "stored twice, " << 16 + i;
    }
  }
}

TEST(Bf16Wide, RoundingNarrowsEveryValueButNaNAsTheScalarContract) {
  if (!CpuHasAvx512()) GTEST_SKIP() << "no AVX-512 (or, emulated, no AVX2) here";
  CheckNarrowing<Narrowing::kRounding>(/*nan=*/false);
}

TEST(Bf16Wide, InstructionNarrowsAsTheScalarContractButForSubnormals) {
  if (!CpuHasAvx512Bf16()) GTEST_SKIP() << "no AVX-512 BF16 (or, emulated, no AVX2) here";
  CheckNarrowing<Narrowing::kInstruction>(/*nan=*/true);
}

}  // namespace
}  // namespace posenc::internal
