// libFuzzer harness for ParseSafetensors: any bytes must give tables or an
// error, never a crash, a hang or an unbounded allocation. Small limits make
// the size checks reachable with short inputs.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/string_view.h"
#include "engine/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  posenc::server::SafetensorsLimits limits;
  limits.max_header_bytes = 1 << 16;
  limits.max_table_rows = 64;
  limits.max_table_dim = 64;
  limits.max_table_bytes = 1 << 16;
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto parsed = posenc::server::ParseSafetensors(bytes, "fuzz", limits);
  if (!parsed.ok()) return 0;
  // What the parser accepts must be what the repository can serve safely.
  for (const auto& t : parsed->tables) {
    const bool consistent = t->rows > 0 && t->dim > 0 && t->rows <= 64 && t->dim <= 64 &&
                            t->values.size() == static_cast<size_t>(t->rows * t->dim);
    if (!consistent) std::abort();
    for (float v : t->values) {
      if (!std::isfinite(v)) std::abort();
    }
  }
  return 0;
}
