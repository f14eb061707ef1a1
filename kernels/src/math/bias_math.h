// The per-element arithmetic of attention biases, shared by the CPU and CUDA
// kernels: one definition of the ALiBi distance, the masks and the store.
#ifndef POSENC_KERNELS_MATH_BIAS_MATH_H_
#define POSENC_KERNELS_MATH_BIAS_MATH_H_

#include <cstdint>

#include "posenc/codes.h"
#include "posenc/dtype.h"
#include "posenc/host_device.h"

namespace posenc::internal {

struct BiasShape {
  BiasForm form;
  bool causal;
  int64_t window;  // keep the `window` most recent keys including self; 0 = off
};

// Where row `row` of [batch, heads, q_len] is.
struct BiasRow {
  int64_t b, h, i;
};
POSENC_HOST_DEVICE BiasRow BiasRowOf(int64_t row, int64_t heads, int64_t q_len) {
  const int64_t bh = row / q_len;
  return BiasRow{bh / heads, bh % heads, row % q_len};
}

// The keys one sequence may attend, [begin, end) along the stored key axis:
// left padding before `begin` (k_starts), right padding from `end` (k_lens).
struct KeyRange {
  int64_t begin, end;
};

// The bias of query position qpos against key j in double; -inf where
// masked (causal, outside the window, or padding). Padding moves no
// position: queries and keys sit on the same padded axis, so qpos - j is
// the unpadded distance.
POSENC_HOST_DEVICE double BiasValue(BiasShape shape, double slope, int64_t qpos, int64_t j,
                                    KeyRange keys) {
  const int64_t dist = qpos - j;
  const bool masked = (shape.causal && dist < 0) ||
                      (shape.window > 0 && (dist < 0 || dist >= shape.window)) || j < keys.begin ||
                      j >= keys.end;
  if (masked) return -__builtin_huge_val();
  switch (shape.form) {
    case BiasForm::kCausal:
      return -slope * static_cast<double>(dist);
    case BiasForm::kSymmetric:
      return -slope * static_cast<double>(dist < 0 ? -dist : dist);
    case BiasForm::kNone:
      break;
  }
  return 0.0;
}

// Writes (or adds to the logit in) one stored element, rounding once.
template <typename T>
POSENC_HOST_DEVICE void StoreBias(T* out, double bias, bool add_to_logits) {
  *out = FromFloat<T>(
      static_cast<float>(add_to_logits ? static_cast<double>(ToFloat(*out)) + bias : bias));
}

}  // namespace posenc::internal

#endif  // POSENC_KERNELS_MATH_BIAS_MATH_H_
