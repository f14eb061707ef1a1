// libFuzzer harness for the .npy parser: any bytes must give either an
// array whose data matches its shape or an INVALID_ARGUMENT with a message;
// anything else (crash, sanitizer report, other code) is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/string_view.h"
#include "npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  const absl::StatusOr<posenc::cli::NpyArray> a = posenc::cli::ParseNpy(bytes);
  if (!a.ok()) {
    if (a.status().code() != absl::StatusCode::kInvalidArgument || a.status().message().empty()) {
      std::abort();
    }
    return 0;
  }
  // The parser's promises: no negative dimension; the non-zero dimensions
  // multiply without overflowing int64 (even when a zero empties the
  // array); the data is exactly product(shape) elements of dtype, which
  // cannot exceed the input (<f8 narrowing only shrinks it).
  int64_t nonzero = 1;
  bool empty = false;
  for (const int64_t d : a->shape) {
    if (d < 0) std::abort();
    if (d == 0) {
      empty = true;
    } else if (__builtin_mul_overflow(nonzero, d, &nonzero)) {
      std::abort();
    }
  }
  const uint64_t n = empty ? 0 : static_cast<uint64_t>(nonzero);
  if (n * posenc::SizeOf(a->dtype) != a->data.size() || a->data.size() > size) std::abort();
  return 0;
}
