#include "posenc/tensor.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "plan/checked_math.h"
#include "posenc/limits.h"

namespace posenc {
namespace {

// REQUIRES: the shape passed ValidateTensorBytes (so the product is exact).
int64_t Product(absl::Span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

int64_t TensorView::NumElements() const { return Product(shape); }
int64_t MutableTensor::NumElements() const { return Product(shape); }

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::Status ValidateTensorBytes(absl::string_view field, DType dtype,
                                 absl::Span<const int64_t> shape, size_t nbytes) {
  // The product of the nonzero dimensions is bounded even for an empty
  // tensor: a shape like [2^40, 0, 2^40] describes nothing anyone can send,
  // and its dimensions would overflow whatever is computed from them.
  int64_t nonzero_product = 1;
  bool empty = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".shape[", i, "] must be >= 0, got ", shape[i]));
    }
    if (shape[i] == 0) {
      empty = true;
      continue;
    }
    if (!CheckedMul(nonzero_product, shape[i], &nonzero_product) ||
        nonzero_product > kMaxTensorElements) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".shape ", ShapeString(shape), " has more than 2^60 elements"));
    }
  }
  const int64_t n = empty ? 0 : nonzero_product;
  const uint64_t expected = static_cast<uint64_t>(n) * SizeOf(dtype);
  if (expected != nbytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": shape ", ShapeString(shape), " of ", DTypeName(dtype), " needs ", expected,
        " bytes (", n, " elements x ", SizeOf(dtype), "), got ", nbytes, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status CheckDimension(absl::string_view name, int64_t value, int64_t max) {
  if (value < 0 || value > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " must be in [0, ", max, "], got ", value));
  }
  return absl::OkStatus();
}

absl::Status CheckFiniteInRange(absl::string_view name, double value, double lo, double hi,
                                bool lo_inclusive) {
  const bool above_lo = lo_inclusive ? value >= lo : value > lo;
  if (!(std::isfinite(value) && above_lo && value <= hi)) {
    return absl::InvalidArgumentError(absl::StrCat(name, " must be a finite number in ",
                                                   lo_inclusive ? "[" : "(", lo, ", ", hi,
                                                   "], got ", value));
  }
  return absl::OkStatus();
}

int64_t ReadInteger(const TensorView& t, int64_t i) {
  if (t.dtype == DType::kInt32) {
    int32_t v;
    std::memcpy(&v, static_cast<const char*>(t.data) + i * 4, 4);
    return v;
  }
  int64_t v;
  std::memcpy(&v, static_cast<const char*>(t.data) + i * 8, 8);
  return v;
}

}  // namespace posenc
