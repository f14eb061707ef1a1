// Renders a 2-D array as a PNG heatmap a person can read: a title saying
// what was drawn, both axes named and numbered with array positions, a
// colour bar with the value range and round ticks, non-finite entries in
// colours of their own named in a legend, and a plot shaped by the rule in
// heatmap_layout.h (no 1-pixel strips; at most 1024 x 1024 plot pixels).
#ifndef POSENC_CLI_HEATMAP_H_
#define POSENC_CLI_HEATMAP_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "heatmap_canvas.h"

namespace posenc::cli {

struct HeatmapLabels {
  // What was drawn: operation, shape, dtype, options. Long titles wrap onto
  // up to three lines; characters outside printable ASCII show as '?'.
  std::string title;
  std::string row_axis = "row";     // e.g. "position", "query position"
  std::string col_axis = "column";  // e.g. "dimension", "key position"
  // Appended to "-inf" in the legend, e.g. "masked".
  std::string neg_inf_meaning;
};

// Labels are drawn at this many pixels per font pixel.
inline constexpr int kHeatmapTextScale = 2;

// The largest image RenderHeatmap makes, whatever the array and title: the
// plot is at most 1024 pixels a side; labels, colour bar and legend add a
// bounded margin.
inline constexpr int kMaxHeatmapWidth = 1600;
inline constexpr int kMaxHeatmapHeight = 1400;

// values is [rows, cols], row-major. Errors (INVALID_ARGUMENT) for an empty
// shape, a size that does not match it, or no finite value to scale the
// colours by.
[[nodiscard]] absl::StatusOr<Canvas> RenderHeatmap(absl::Span<const double> values, int64_t rows,
                                                   int64_t cols, const HeatmapLabels& labels);

// RenderHeatmap, then the PNG at `path` (see heatmap_png.h for its errors).
[[nodiscard]] absl::Status WriteHeatmapPng(const std::string& path, absl::Span<const double> values,
                                           int64_t rows, int64_t cols, const HeatmapLabels& labels);

}  // namespace posenc::cli

#endif  // POSENC_CLI_HEATMAP_H_
