// Renders a 2-D float array as a PNG heatmap (seed 003's plt.matshow view).
#ifndef POSENC_CLI_HEATMAP_H_
#define POSENC_CLI_HEATMAP_H_

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace posenc::cli {

// values is [rows, cols]; -inf (masked) cells are drawn dark grey. Small
// arrays are upscaled so the image is at least ~256 pixels across.
[[nodiscard]] absl::Status WriteHeatmapPng(const std::string& path,
                                           const std::vector<double>& values, int64_t rows,
                                           int64_t cols);

}  // namespace posenc::cli

#endif  // POSENC_CLI_HEATMAP_H_
