// A reader for the .safetensors format model checkpoints ship in: an 8-byte
// little-endian header length N, N bytes of JSON naming each tensor's dtype,
// shape and [begin, end) byte range, then the data.
#ifndef POSENC_SERVER_SAFETENSORS_H_
#define POSENC_SERVER_SAFETENSORS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "posenc/absolute.h"

namespace posenc::server {

struct SafetensorsContents {
  std::vector<std::shared_ptr<const LearnedTable>> tables;  // named "<stem>/<tensor>"
  std::vector<std::string> skipped;  // tensors that are not 2-D float tables, with why
};

// Parses a whole file's bytes. Malformed files are INVALID_ARGUMENT (never a
// crash); tensors that are fine but not usable as tables are listed in
// `skipped`. `stem` prefixes table names.
[[nodiscard]] absl::StatusOr<SafetensorsContents> ParseSafetensors(absl::string_view bytes,
                                                                   absl::string_view stem);

// Writes float32 tables as a .safetensors file (for tests and tools).
std::string SerializeSafetensors(
    const std::vector<std::pair<std::string, const LearnedTable*>>& tables);

}  // namespace posenc::server

#endif  // POSENC_SERVER_SAFETENSORS_H_
