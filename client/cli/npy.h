// NumPy .npy reading and writing for the CLI.
//
// The reader treats every file as hostile: it never uses a regex or an
// evaluator on the header, bounds every size before allocating, and rejects
// anything it does not understand with an INVALID_ARGUMENT naming the field.
#ifndef POSENC_CLI_NPY_H_
#define POSENC_CLI_NPY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "posenc/dtype.h"

namespace posenc::cli {

struct NpyArray {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  std::string data;  // little-endian, C order; exactly product(shape) * SizeOf(dtype) bytes
};

// NumPy's own reader refuses headers longer than 10000 bytes by default
// (np.load's max_header_size) because a long header is the classic way to make
// a literal evaluator burn time; 64 dimensions of 19-digit sizes need under
// 2 KB, so nothing NumPy writes by default comes near it.
inline constexpr uint64_t kMaxNpyHeaderBytes = 10000;
// NumPy 2's NPY_MAXDIMS; NumPy 1 allowed 32.
inline constexpr int kMaxNpyDims = 64;
// ReadNpy refuses larger files before reading a byte of them.
inline constexpr uint64_t kMaxNpyFileBytes = uint64_t{4} << 30;

// Writes FLOAT32, FLOAT16, INT32, INT64 as themselves; BFLOAT16 (which NumPy
// lacks) is widened to float32, exactly. `data` must hold
// product(shape) * SizeOf(dtype) bytes.
[[nodiscard]] absl::Status WriteNpy(const std::string& path, DType dtype,
                                    const std::vector<int64_t>& shape, const std::string& data);

// Parses a whole .npy file held in memory (format 1.0, 2.0 or 3.0; C order;
// little-endian). <f4, <f2, <i4 and <i8 come back as themselves; <f8 comes
// back as FLOAT32, rounded to nearest, and a finite value beyond float32's
// range is an error rather than a silent infinity. No I/O.
[[nodiscard]] absl::StatusOr<NpyArray> ParseNpy(absl::string_view bytes);

// Reads and parses the .npy file at `path`, which must be a regular file of
// at most kMaxNpyFileBytes: FIFOs, devices and directories are refused
// without blocking. Errors name the path.
[[nodiscard]] absl::StatusOr<NpyArray> ReadNpy(const std::string& path);

}  // namespace posenc::cli

#endif  // POSENC_CLI_NPY_H_
