// Writes a Canvas as an 8-bit RGB PNG (libpng does the encoding).
#ifndef POSENC_CLI_HEATMAP_PNG_H_
#define POSENC_CLI_HEATMAP_PNG_H_

#include <string>

#include "absl/status/status.h"
#include "heatmap_canvas.h"

namespace posenc::cli {

// On failure nothing is left at `path` (a half-written file is removed) and
// the error names the path and why: the system's reason when the file cannot
// be opened or flushed, libpng's message when encoding fails.
[[nodiscard]] absl::Status WritePng(const std::string& path, const Canvas& canvas);

}  // namespace posenc::cli

#endif  // POSENC_CLI_HEATMAP_PNG_H_
