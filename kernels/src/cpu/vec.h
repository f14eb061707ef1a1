// Portable 8-lane float vectors for the CPU kernels' hand-written loops
// (GCC/clang vector extensions). Each clone (cpu_kernels.h) lowers them to
// its own instruction set, two SSE registers each for the baseline clone,
// where intrinsics would pin one. Loads and stores go through memcpy:
// unaligned. Every function taking or returning them is inlined into a
// clone, so the baseline clone's different vector ABI never shows at a call
// (CMake turns off -Wpsabi's note for the files that use them). Internal.
#ifndef POSENC_KERNELS_CPU_VEC_H_
#define POSENC_KERNELS_CPU_VEC_H_

#include <cstdint>
#include <cstring>

#include "cpu_kernels.h"
#include "posenc/dtype.h"

namespace posenc::internal {

typedef float V4 __attribute__((vector_size(16)));
typedef float V8 __attribute__((vector_size(32)));
typedef int32_t V8i __attribute__((vector_size(32)));
typedef uint32_t V8u __attribute__((vector_size(32)));
typedef uint16_t V8h __attribute__((vector_size(16)));
typedef uint16_t V16h __attribute__((vector_size(32)));
typedef uint64_t V4q __attribute__((vector_size(32)));
typedef uint64_t V2q __attribute__((vector_size(16)));

POSENC_ALWAYS_INLINE V8 Load8(const float* p) {
  V8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
POSENC_ALWAYS_INLINE void Store8(float* p, V8 v) { std::memcpy(p, &v, sizeof v); }

// |v| lane by lane (the sign bit cleared).
POSENC_ALWAYS_INLINE V8 Abs8(V8 v) { return (V8)((V8u)v & 0x7fffffffu); }

// p[0, 4) as [p0, p0, p1, p1, p2, p2, p3, p3].
POSENC_ALWAYS_INLINE V8 Spread4(const float* p) {
  V4 v;
  std::memcpy(&v, p, sizeof v);
  return __builtin_shufflevector(v, v, 0, 0, 1, 1, 2, 2, 3, 3);
}

// BFloat16ToFloat on 8 stored values, in order: each 16-bit value widened
// into the high half of its lane.
POSENC_ALWAYS_INLINE V8 BFloat16ToFloat8(const BFloat16* y) {
  V8h h;
  std::memcpy(&h, y, sizeof h);
  const V8h zero = {};
  return (V8)__builtin_shufflevector(zero, h, 0, 8, 0, 9, 0, 10, 0, 11, 0, 12, 0, 13, 0, 14, 0, 15);
}

// FloatToBFloat16's rounding in 32-bit lanes, the result in each lane's high
// half; NaN lanes are left to the caller.
POSENC_ALWAYS_INLINE V16h BFloat16Round(V8 r) {
  const V8u bits = (V8u)r;
  return (V16h)(bits + 0x7fffu + ((bits >> 16) & 1u));
}

// FloatToBFloat16 on two vectors of non-NaN values, stored as 8 values at y0
// and 8 at y1 (which may be adjacent).
POSENC_ALWAYS_INLINE void StoreBFloat16x16(V8 r0, V8 r1, BFloat16* y0, BFloat16* y1) {
  // The two results' high halves, packed into one vector.
  const V16h out = __builtin_shufflevector(BFloat16Round(r0), BFloat16Round(r1), 1, 3, 5, 7, 9, 11,
                                           13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  std::memcpy(y0, &out, 16);
  std::memcpy(y1, reinterpret_cast<const char*>(&out) + 16, 16);
}

// Whether every lane of a comparison's result is true (all bits set): the
// two halves ANDed, then the two words.
POSENC_ALWAYS_INLINE bool AllTrue(V8i m) {
  const V4q w = (V4q)m;
  const V2q h = __builtin_shufflevector(w, w, 0, 1) & __builtin_shufflevector(w, w, 2, 3);
  return (h[0] & h[1]) == ~uint64_t{0};
}

}  // namespace posenc::internal

#endif  // POSENC_KERNELS_CPU_VEC_H_
