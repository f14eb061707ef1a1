#include "heatmap_grid.h"

#include <cmath>

namespace posenc::cli {
namespace {

struct Accumulator {
  // long double: a sum of finite doubles near DBL_MAX cannot overflow it.
  long double sum = 0;
  int64_t finite = 0;
  int64_t neg_inf = 0, pos_inf = 0, nan = 0;

  void Add(double v) {
    switch (KindOf(v)) {
      case CellKind::kFinite:
        sum += v;
        ++finite;
        break;
      case CellKind::kNegInf:
        ++neg_inf;
        break;
      case CellKind::kPosInf:
        ++pos_inf;
        break;
      case CellKind::kNan:
        ++nan;
        break;
    }
  }

  Cell Result() const {
    const int64_t non_finite = neg_inf + pos_inf + nan;
    if (non_finite > finite) {
      if (neg_inf >= pos_inf && neg_inf >= nan) return Cell{CellKind::kNegInf, 0};
      return Cell{pos_inf >= nan ? CellKind::kPosInf : CellKind::kNan, 0};
    }
    return Cell{CellKind::kFinite, static_cast<double>(sum / finite)};
  }
};

}  // namespace

CellKind KindOf(double v) {
  if (std::isfinite(v)) return CellKind::kFinite;
  if (std::isnan(v)) return CellKind::kNan;
  return v < 0 ? CellKind::kNegInf : CellKind::kPosInf;
}

std::vector<Cell> BlockAverage(absl::Span<const double> values, int64_t rows, int64_t cols,
                               int64_t block_rows, int64_t block_cols) {
  const int64_t out_rows = (rows + block_rows - 1) / block_rows;
  const int64_t out_cols = (cols + block_cols - 1) / block_cols;
  std::vector<Cell> cells;
  cells.reserve(out_rows * out_cols);
  // One band of block_rows input rows at a time: memory is one row of
  // accumulators, and the input is read once, in order.
  std::vector<Accumulator> band(out_cols);
  for (int64_t r = 0; r < rows; ++r) {
    const double* row = values.data() + r * cols;
    for (int64_t c = 0; c < cols; ++c) band[c / block_cols].Add(row[c]);
    if ((r + 1) % block_rows == 0 || r + 1 == rows) {
      for (Accumulator& a : band) {
        cells.push_back(a.Result());
        a = Accumulator();
      }
    }
  }
  return cells;
}

}  // namespace posenc::cli
