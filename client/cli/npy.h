// Minimal NumPy .npy (format 1.0) reading and writing for the CLI.
#ifndef POSENC_CLI_NPY_H_
#define POSENC_CLI_NPY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "posenc/dtype.h"

namespace posenc::cli {

struct NpyArray {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  std::string data;  // little-endian, C order
};

// Writes FLOAT32, FLOAT16, INT32, INT64 as themselves; BFLOAT16 (which NumPy
// lacks) is widened to float32, exactly.
[[nodiscard]] absl::Status WriteNpy(const std::string& path, DType dtype,
                                    const std::vector<int64_t>& shape, const std::string& data);
// Reads <f4, <f2, <i4, <i8 arrays in C order.
[[nodiscard]] absl::StatusOr<NpyArray> ReadNpy(const std::string& path);

}  // namespace posenc::cli

#endif  // POSENC_CLI_NPY_H_
