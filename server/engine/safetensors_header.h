// The header of a .safetensors file, read and checked against its data
// section: every tensor's dtype, shape and byte range, the tensors tiling the
// data section exactly (the reference reader's rules). For safetensors.cc,
// which turns the checked tensors into learned tables.
#ifndef POSENC_SERVER_ENGINE_SAFETENSORS_HEADER_H_
#define POSENC_SERVER_ENGINE_SAFETENSORS_HEADER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/safetensors.h"
#include "posenc/dtype.h"

namespace posenc::server::safetensors {

// A dtype the format defines; `table` is set for the ones a table may use.
struct DTypeInfo {
  absl::string_view name;
  uint64_t bits;
  std::optional<DType> table;
};

// A tensor whose dtype, shape and byte range are consistent.
struct TensorSpec {
  std::string name;
  const DTypeInfo* dtype = nullptr;
  std::vector<uint64_t> shape;
  uint64_t begin = 0;  // [begin, end) within the data section
  uint64_t end = 0;
};

// The file's tensors, checked, and its data section (*data). INVALID_ARGUMENT
// ("malformed safetensors: ...") saying what is wrong.
[[nodiscard]] absl::StatusOr<std::vector<TensorSpec>> ReadHeader(absl::string_view bytes,
                                                                 const SafetensorsLimits& limits,
                                                                 absl::string_view* data);

// 'text' for a message: cut, with control and non-ASCII bytes escaped.
std::string Quoted(absl::string_view text);
// A shape for a message, at most a few dims.
std::string ShapeText(const std::vector<uint64_t>& shape);

}  // namespace posenc::server::safetensors

#endif  // POSENC_SERVER_ENGINE_SAFETENSORS_HEADER_H_
