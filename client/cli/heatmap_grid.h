// The cells a heatmap draws: an array averaged down in blocks (see
// heatmap_layout.h for the block sizes).
#ifndef POSENC_CLI_HEATMAP_GRID_H_
#define POSENC_CLI_HEATMAP_GRID_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace posenc::cli {

enum class CellKind { kFinite, kNegInf, kPosInf, kNan };

CellKind KindOf(double v);

struct Cell {
  CellKind kind = CellKind::kFinite;
  double mean = 0;  // of the block's finite entries; meaningful for kFinite
};

// Averages `values` ([rows, cols], row-major) over blocks of block_rows x
// block_cols entries (shorter at the bottom and right edges); the result is
// [ceil(rows / block_rows), ceil(cols / block_cols)], row-major.
// A block whose entries are mostly non-finite (more non-finite than finite)
// becomes a cell of the most common non-finite kind, so a mask keeps its
// outline to within a block instead of swallowing every block it touches;
// otherwise the cell is the mean of the finite entries.
// REQUIRES: rows, cols, block_rows, block_cols >= 1; values.size() == rows * cols.
std::vector<Cell> BlockAverage(absl::Span<const double> values, int64_t rows, int64_t cols,
                               int64_t block_rows, int64_t block_cols);

}  // namespace posenc::cli

#endif  // POSENC_CLI_HEATMAP_GRID_H_
