// The x86 intrinsics of the CPU kernels' hand-written loops. In the
// emulated AVX-512 test build (POSENC_EMULATE_AVX512: tests/conformance)
// the AVX-512 ones become portable code, so that the 512-bit loops run, and
// are proven bit for bit, on CPUs without AVX-512. Internal.
#ifndef POSENC_KERNELS_CPU_X86_INTRINSICS_H_
#define POSENC_KERNELS_CPU_X86_INTRINSICS_H_

#include <immintrin.h>

#ifdef POSENC_EMULATE_AVX512
#include "avx512_emulation.h"  // tests/support/avx512_emulation
#endif

#endif  // POSENC_KERNELS_CPU_X86_INTRINSICS_H_
