#include "heatmap_layout.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"

namespace posenc::cli {
namespace {

AxisPlan Blocked(int64_t n) {
  AxisPlan a;
  a.entries = n;
  a.block = (n + kMaxCellsPerAxis - 1) / kMaxCellsPerAxis;
  a.cells = (n + a.block - 1) / a.block;
  return a;
}

// The smallest 1-2-5 step (times a power of ten) that fits `span` into at
// most max_ticks - 1 intervals.
double NiceStep(double span, int max_ticks) {
  const double rough = span / std::max(1, max_ticks - 1);
  double step = std::pow(10.0, std::floor(std::log10(rough)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * step >= rough) return m * step;
  }
  return 10 * step;
}

}  // namespace

GridPlan PlanGrid(int64_t rows, int64_t cols) {
  GridPlan g{Blocked(rows), Blocked(cols)};
  AxisPlan& longer = g.rows.cells >= g.cols.cells ? g.rows : g.cols;
  AxisPlan& shorter = g.rows.cells >= g.cols.cells ? g.cols : g.rows;
  const int square = std::max<int>(1, kTargetLongSide / static_cast<int>(longer.cells));
  longer.pixels_per_cell = square;
  const int64_t min_short = (longer.pixels() + kMaxAspect - 1) / kMaxAspect;
  const int stretched = static_cast<int>((min_short + shorter.cells - 1) / shorter.cells);
  shorter.pixels_per_cell = std::max(square, stretched);
  return g;
}

std::vector<int64_t> IndexTicks(int64_t n, int max_ticks) {
  std::vector<int64_t> ticks;
  if (n <= 0) return ticks;
  const int64_t step =
      std::max<int64_t>(1, static_cast<int64_t>(NiceStep(static_cast<double>(n - 1), max_ticks)));
  for (int64_t i = 0; i < n && static_cast<int>(ticks.size()) < max_ticks; i += step) {
    ticks.push_back(i);
  }
  return ticks;
}

std::vector<double> ValueTicks(double lo, double hi, int max_ticks) {
  std::vector<double> ticks;
  if (!(hi > lo) || max_ticks <= 0) return ticks;
  // Halves, so that hi - lo cannot overflow for values near DBL_MAX.
  const double step = 2 * NiceStep(hi / 2 - lo / 2, max_ticks);
  if (!std::isfinite(step) || step <= 0) return ticks;
  // Counted, not `while (v < hi)`: far from zero k + 1 can round to k.
  const double first = std::ceil(lo / step);
  for (int i = 0; i <= max_ticks && static_cast<int>(ticks.size()) < max_ticks; ++i) {
    const double v = (first + i) * step;
    if (v >= hi) break;
    if (v > lo) ticks.push_back(v == 0 ? 0.0 : v);
  }
  return ticks;
}

std::string FormatValue(double v) {
  std::string s = absl::StrFormat("%.4g", v);
  if (s == "-0") s = "0";
  return s;
}

}  // namespace posenc::cli
