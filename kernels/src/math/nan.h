// One NaN pattern for results the backends compute from NaN (or inf - inf,
// inf * 0): x86 keeps a NaN operand's sign and payload (which operand, when
// both are NaN, depends on how the compiler ordered a commutative add), and
// makes 0xffc00000 of inf - inf; a GPU makes 0x7fffffff of either. Kernels
// whose results must agree bit for bit across backends and code paths pass
// them through CanonicalNaN. Internal to the kernel library.
#ifndef POSENC_KERNELS_MATH_NAN_H_
#define POSENC_KERNELS_MATH_NAN_H_

#include "posenc/dtype.h"
#include "posenc/host_device.h"

namespace posenc::internal {

// v, or the positive quiet NaN 0x7fc00000 when v is a NaN.
POSENC_HOST_DEVICE float CanonicalNaN(float v) { return v != v ? BitsFloat(0x7fc00000u) : v; }

}  // namespace posenc::internal

#endif  // POSENC_KERNELS_MATH_NAN_H_
