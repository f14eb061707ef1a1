// Overflow-checked integer arithmetic for sizes and counts that come from
// requests, for the planners. Each returns false (and leaves *out
// unspecified) on overflow. Internal to the kernel library.
#ifndef POSENC_KERNELS_PLAN_CHECKED_MATH_H_
#define POSENC_KERNELS_PLAN_CHECKED_MATH_H_

#include <cstdint>
#include <initializer_list>

namespace posenc {

[[nodiscard]] inline bool CheckedMul(int64_t a, int64_t b, int64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}
// The product of non-negative factors.
[[nodiscard]] inline bool CheckedProduct(std::initializer_list<int64_t> factors, int64_t* out) {
  int64_t p = 1;
  for (int64_t f : factors) {
    if (!CheckedMul(p, f, &p)) return false;
  }
  *out = p;
  return true;
}

}  // namespace posenc

#endif  // POSENC_KERNELS_PLAN_CHECKED_MATH_H_
