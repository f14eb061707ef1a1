// A run of rows that one call of the CPU RoPE loops rotates, shared by
// rope_cpu.cc and its AVX-512 BF16 loop (rope_bf16_wide.h). Internal.
#ifndef POSENC_KERNELS_CPU_ROPE_ROWS_H_
#define POSENC_KERNELS_CPU_ROPE_ROWS_H_

#include <cstdint>

#include "cpu_kernels.h"

namespace posenc::internal {
// Unnamed: only rope_cpu.cc includes this (also through rope_bf16_wide.h).
namespace {

// A run of rows (heads) that one call rotates: row i is x + i D, the head of
// token t0 + i dt, with rotations c + i dt half, n likewise (c2, n2 + 2 i dt
// half). dt = 0: the heads of one token (token-major layouts); dt = 1: one
// head's consecutive tokens (BHSD). Every row lies in one sequence, so one
// attention scale holds for all of them. Each row's cache lines at
// prefetch_bytes past it are asked for before it is rotated (0: none).
template <typename T>
struct Rows {
  T* x;
  int64_t count, t0, dt;
  const float *c, *n, *c2, *n2;
  const float *cp, *np;  // c and n as Scratch::cp/np (bfloat16 NEOX, wide), else null
  int64_t prefetch_bytes;
};

// Asks for the cache lines of [p, p + bytes) ahead of a write.
POSENC_ALWAYS_INLINE void PrefetchForWrite(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(c + b, 1, 3);
}

}  // namespace
}  // namespace posenc::internal

#endif  // POSENC_KERNELS_CPU_ROPE_ROWS_H_
