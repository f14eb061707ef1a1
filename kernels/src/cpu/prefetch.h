// Software prefetches shared by the CPU loops: the hardware prefetchers
// follow a stream of in-place writes less well on some CPUs than a plain
// read, and these loops compute too little between lines to hide a miss.
#ifndef POSENC_KERNELS_CPU_PREFETCH_H_
#define POSENC_KERNELS_CPU_PREFETCH_H_

#include <cstdint>

#include "cpu_kernels.h"

namespace posenc::internal {

// Asks for the cache lines of [p, p + bytes) ahead of a write: into L1
// (kLocality 3) or into L2 (kLocality 1). Kept a loop, never unrolled
// (also where bytes is a constant): unrolled, the prefetches of a float32
// row left in one burst, and BHSD ran 0.90-0.91 of the read-modify-write
// against 0.96-0.97 with the loop's 3 instructions between them, for 0.2
// fewer instructions an element (Zen 3, 20 alternated rounds,
// bench/RESULTS.md).
template <int kLocality = 3>
POSENC_ALWAYS_INLINE void PrefetchForWrite(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
#pragma GCC unroll 1
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(c + b, 1, kLocality);
}

// How far ahead of the keys they work on the bias loops ask for lines: two
// rows of 1024 bfloat16 keys.
constexpr int64_t kBiasAheadBytes = 4096;

// Before the line at `at` is worked on (a step of a bias loop: a line of
// the 512-bit loop, half a line of the AVX2 one): the line kBiasAheadBytes
// on. On an AVX-512 BF16 Xeon (2026-11-30, alternated runs) the 512-bit
// loop ran 0.40-0.53 of the read-modify-write without k_starts with no
// prefetch, 0.58-0.75 asking for a row's lines in one burst before the row
// (as the AVX2 loop did, measured on the Zen 3: 0.74 -> 0.76 against
// none), and 0.73-0.88 with a line a step; the AVX2 loop 25-30 GB/s with
// the burst, 28-37 a line a step. That Xeon's prefetchers leave the rows to be fetched on
// demand, and a burst of a row's requests waits for fill buffers
// (bench/RESULTS.md).
POSENC_ALWAYS_INLINE void PrefetchBiasLineAhead(const void* at) {
  __builtin_prefetch(static_cast<const char*>(at) + kBiasAheadBytes, 1, 3);
}

}  // namespace posenc::internal

#endif  // POSENC_KERNELS_CPU_PREFETCH_H_
