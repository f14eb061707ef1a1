// Non-owning views of dense, row-major, little-endian tensors.
#ifndef POSENC_TENSOR_H_
#define POSENC_TENSOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "posenc/dtype.h"

namespace posenc {

// A read-only tensor: the caller owns `data`, which must hold
// product(shape) * SizeOf(dtype) bytes. An absent optional tensor has
// data == nullptr and an empty shape.
struct TensorView {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t nbytes = 0;

  bool present() const { return data != nullptr || !shape.empty(); }
  int64_t NumElements() const;
  int rank() const { return static_cast<int>(shape.size()); }
};

// A tensor the kernels write in place.
struct MutableTensor {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  void* data = nullptr;
  size_t nbytes = 0;

  bool present() const { return data != nullptr || !shape.empty(); }
  int64_t NumElements() const;
  int rank() const { return static_cast<int>(shape.size()); }
  TensorView view() const { return TensorView{dtype, shape, data, nbytes}; }
};

std::string ShapeString(absl::Span<const int64_t> shape);

// Checks that `shape` has no negative dimension, that the product of its
// nonzero dimensions is at most kMaxTensorElements (so nothing computed from
// it overflows, even for an empty tensor), and that nbytes ==
// product(shape) * SizeOf(dtype). `field` names the tensor in the error,
// e.g. "query".
[[nodiscard]] absl::Status ValidateTensorBytes(absl::string_view field, DType dtype,
                                               absl::Span<const int64_t> shape, size_t nbytes);

// INVALID_ARGUMENT "<name> must be in [0, max], got <value>" unless it is.
[[nodiscard]] absl::Status CheckDimension(absl::string_view name, int64_t value, int64_t max);

// INVALID_ARGUMENT unless `value` is finite and in (lo, hi] (or [lo, hi]).
[[nodiscard]] absl::Status CheckFiniteInRange(absl::string_view name, double value, double lo,
                                              double hi, bool lo_inclusive = false);

// Reads element i of an INT32 or INT64 tensor as int64.
int64_t ReadInteger(const TensorView& t, int64_t i);

}  // namespace posenc

#endif  // POSENC_TENSOR_H_
