// Where a heatmap's cells go: how many array entries one drawn cell stands
// for, how many pixels it takes, and which positions and values get labels.
//
// The rule, per axis and then between them:
//  1. At most kMaxCellsPerAxis cells per axis. A longer axis is cut into
//     blocks of ceil(n / kMaxCellsPerAxis) entries and each cell is the mean
//     of its block (the last block may be shorter).
//  2. Cells are square, as large as keeps the longer side within
//     kTargetLongSide pixels, and never below one pixel (so a 1024-cell axis
//     is 1024 pixels).
//  3. If that makes the plot more than kMaxAspect times as long as it is
//     wide, the shorter axis's cells are stretched (whole pixels, rounded
//     up) until it is at least 1/kMaxAspect of the longer side. A 128 x 1024
//     table is drawn 1024 x 512 pixels, not as a 1024 x 128 strip.
// So the plot is at most kMaxCellsPerAxis pixels a side, whatever the array.
#ifndef POSENC_CLI_HEATMAP_LAYOUT_H_
#define POSENC_CLI_HEATMAP_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

namespace posenc::cli {

// One pixel per cell at this many cells is as fine as a screen shows; past
// it cells would be thinner than a pixel and be lost anyway.
inline constexpr int64_t kMaxCellsPerAxis = 1024;
// Small arrays are magnified up to about this size so cells can be told
// apart and the labels have room.
inline constexpr int kTargetLongSide = 640;
// Longest side over shortest side of the plot, at most.
inline constexpr int kMaxAspect = 2;

struct AxisPlan {
  int64_t entries = 0;      // array length along the axis
  int64_t block = 1;        // entries averaged into one cell
  int64_t cells = 0;        // ceil(entries / block)
  int pixels_per_cell = 1;  // along this axis

  int pixels() const { return static_cast<int>(cells) * pixels_per_cell; }
  // Pixel offset from the plot's edge of the centre of the cell holding
  // entry i.
  int CenterOf(int64_t i) const {
    return static_cast<int>(i / block) * pixels_per_cell + pixels_per_cell / 2;
  }
};

struct GridPlan {
  AxisPlan rows;  // drawn top to bottom
  AxisPlan cols;  // drawn left to right
};

// REQUIRES: rows >= 1, cols >= 1.
GridPlan PlanGrid(int64_t rows, int64_t cols);

// Entry indices to label on an axis of n entries: 0 and the multiples of a
// 1-2-5 step (1, 2, 5, 10, 20, ...) below n, at most max_ticks of them.
std::vector<int64_t> IndexTicks(int64_t n, int max_ticks);

// Round values strictly between lo and hi, multiples of a 1-2-5 step times a
// power of ten, at most max_ticks of them (lo and hi are labelled apart).
std::vector<double> ValueTicks(double lo, double hi, int max_ticks);

// A value for a label: four significant digits, no "-0".
std::string FormatValue(double v);

}  // namespace posenc::cli

#endif  // POSENC_CLI_HEATMAP_LAYOUT_H_
