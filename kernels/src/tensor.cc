#include "posenc/tensor.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace posenc {
namespace {

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
  // Tensors beyond 2^62 bytes cannot exist; the bound keeps products exact.
  constexpr int64_t kMaxElements = int64_t{1} << 60;
  int64_t n = 1;
  bool zero = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".shape[", i, "] must be >= 0, got ", shape[i]));
    }
    if (shape[i] == 0) zero = true;
  }
  if (!zero) {
    for (int64_t d : shape) {
      if (n > kMaxElements / d) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".shape ", ShapeString(shape), " has too many elements"));
      }
      n *= d;
    }
  } else {
    n = 0;
  }
  const uint64_t expected = static_cast<uint64_t>(n) * SizeOf(dtype);
  if (expected != nbytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": shape ", ShapeString(shape), " of ", DTypeName(dtype), " needs ", expected,
        " bytes (", n, " elements x ", SizeOf(dtype), "), got ", nbytes, " bytes"));
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
