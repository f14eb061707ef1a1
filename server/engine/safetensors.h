// A reader for the .safetensors format model checkpoints ship in: an 8-byte
// little-endian header length N, N bytes of JSON naming each tensor's dtype,
// shape and [begin, end) byte range, then the data.
//
// Every byte is treated as hostile: the files come from a volume that any
// replica's operator (or a compromised job) can write to, and one poisoned
// file must never crash, hang or exhaust a replica.
#ifndef POSENC_SERVER_ENGINE_SAFETENSORS_H_
#define POSENC_SERVER_ENGINE_SAFETENSORS_H_

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "posenc/absolute.h"

namespace posenc::server {

// The reference implementation accepts headers up to 100 MB. A JSON header is
// expanded several-fold in memory while it is read, and even a header naming
// every tensor of a large checkpoint (thousands of tensors, a few hundred bytes
// each) stays well under 1 MiB; 16 MiB leaves room for bulky __metadata__
// while bounding what a hostile header can make a replica allocate.
inline constexpr uint64_t kDefaultMaxHeaderBytes = uint64_t{16} << 20;

// Positions reach a table as INT32 or INT64 tensors; 2^31 rows is every
// position an INT32 can name, far beyond any trained context (~10^6).
inline constexpr uint64_t kMaxTableRows = uint64_t{1} << 31;

// The widest production models have hidden sizes of 16-32K. 65536 leaves
// headroom while keeping rows * dim <= 2^47, far inside int64 arithmetic.
inline constexpr uint64_t kMaxTableDim = uint64_t{1} << 16;

struct SafetensorsLimits {
  uint64_t max_header_bytes = kDefaultMaxHeaderBytes;
  uint64_t max_table_rows = kMaxTableRows;  // larger tensors are skipped, not loaded
  uint64_t max_table_dim = kMaxTableDim;
  // float32 bytes all tables of one file may occupy once converted (F16 and
  // BF16 double in size); above it the file is RESOURCE_EXHAUSTED.
  uint64_t max_table_bytes = std::numeric_limits<uint64_t>::max();
};

struct SafetensorsContents {
  std::vector<std::shared_ptr<const LearnedTable>> tables;  // named "<stem>/<tensor>"
  // Tensors that are not usable 2-D float tables, with why: the first 16,
  // then one line counting the rest (these lines reach ListTables replies).
  std::vector<std::string> skipped;
};

// Parses a whole file's bytes; pure (no I/O), so it is what the fuzzer runs.
// Follows the reference implementation's rules: a known dtype, a shape of
// unsigned 64-bit integers, and data_offsets that, sorted, tile the data
// section exactly (no gaps, no overlaps, no trailing bytes). A malformed file is
// INVALID_ARGUMENT naming the tensor and the problem (never a crash or an
// exception); one whose tables exceed max_table_bytes is RESOURCE_EXHAUSTED.
// Well-formed tensors that are not usable as tables (another dtype, rank != 2,
// empty, over the row/dim limits, non-finite values) are listed in `skipped`.
// `stem` prefixes table names.
[[nodiscard]] absl::StatusOr<SafetensorsContents> ParseSafetensors(absl::string_view bytes,
                                                                   absl::string_view stem,
                                                                   const SafetensorsLimits& limits);
[[nodiscard]] absl::StatusOr<SafetensorsContents> ParseSafetensors(absl::string_view bytes,
                                                                   absl::string_view stem);

// Writes float32 tables as a .safetensors file (for tests and tools).
std::string SerializeSafetensors(
    const std::vector<std::pair<std::string, const LearnedTable*>>& tables);

}  // namespace posenc::server

#endif  // POSENC_SERVER_ENGINE_SAFETENSORS_H_
