#include "heatmap.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "heatmap_colors.h"
#include "heatmap_font.h"
#include "heatmap_grid.h"
#include "heatmap_layout.h"
#include "heatmap_png.h"
#include "posenc/status_macros.h"

namespace posenc::cli {
namespace {

// Every label at twice the font's size: 10 x 16-pixel letters read at a
// glance on a plot up to 1024 pixels wide.
constexpr int kScale = kHeatmapTextScale;
constexpr int kTextH = kGlyphHeight * kScale;
constexpr int kLine = kTextH + 6;
constexpr int kMargin = 16;
constexpr int kTick = 6;
constexpr int kBarGap = 28;
constexpr int kBarWidth = 24;
constexpr int kSwatch = kTextH;
constexpr Rgb kInk = kBlack;
constexpr Rgb kSubtleInk{80, 80, 80};

struct Stats {
  double lo = INFINITY, hi = -INFINITY;  // over finite entries
  int64_t neg_inf = 0, pos_inf = 0, nan = 0;
};

Stats Measure(absl::Span<const double> values) {
  Stats s;
  for (double v : values) {
    switch (KindOf(v)) {
      case CellKind::kFinite:
        s.lo = std::min(s.lo, v);
        s.hi = std::max(s.hi, v);
        break;
      case CellKind::kNegInf:
        ++s.neg_inf;
        break;
      case CellKind::kPosInf:
        ++s.pos_inf;
        break;
      case CellKind::kNan:
        ++s.nan;
        break;
    }
  }
  return s;
}

// Where v falls between lo (0) and hi (1); halves so that hi - lo cannot
// overflow. A constant array sits in the middle of the ramp.
double Normalized(double v, const Stats& s) {
  if (!(s.hi > s.lo)) return 0.5;
  return (v / 2 - s.lo / 2) / (s.hi / 2 - s.lo / 2);
}

Rgb CellColor(const Cell& c, const Stats& s) {
  switch (c.kind) {
    case CellKind::kFinite:
      return RampColor(Normalized(c.mean, s));
    case CellKind::kNegInf:
      return kNegInfColor;
    case CellKind::kPosInf:
      return kPosInfColor;
    case CellKind::kNan:
      return kNanColor;
  }
  return kNanColor;
}

int MaxChars(int pixels) { return std::max(1, (pixels / kScale + 1) / kGlyphAdvance); }

std::string Truncated(absl::string_view text, int max_chars) {
  if (static_cast<int>(text.size()) <= max_chars) return std::string(text);
  if (max_chars <= 3) return std::string(text.substr(0, max_chars));
  return absl::StrCat(text.substr(0, max_chars - 3), "...");
}

// Greedy word wrap into at most max_lines lines of max_chars; a word longer
// than a line is cut, and text beyond the last line ends in "...".
std::vector<std::string> Wrap(absl::string_view text, int max_chars, int max_lines) {
  std::vector<std::string> lines;
  std::string line;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    while (!word.empty()) {
      const int room = max_chars - static_cast<int>(line.size()) - (line.empty() ? 0 : 1);
      if (static_cast<int>(word.size()) <= room) {
        absl::StrAppend(&line, line.empty() ? "" : " ", word);
        word = {};
      } else if (line.empty()) {
        line = std::string(word.substr(0, max_chars));
        word.remove_prefix(max_chars);
      }
      if (!word.empty() || static_cast<int>(line.size()) == max_chars) {
        lines.push_back(line);
        line.clear();
      }
    }
  }
  if (!line.empty()) lines.push_back(line);
  if (static_cast<int>(lines.size()) > max_lines) {
    lines.resize(max_lines);
    std::string& last = lines.back();
    last = absl::StrCat(last.substr(0, std::max(0, max_chars - 3)), "...");
  }
  return lines;
}

// The labelled entries of an axis: round ones, and the last entry so the
// extent shows, in place of the last round one when the two would collide.
std::vector<int64_t> AxisTicks(const AxisPlan& a, int max_ticks, int min_gap_px) {
  std::vector<int64_t> ticks = IndexTicks(a.entries, max_ticks);
  const int64_t last = a.entries - 1;
  if (ticks.back() == last) return ticks;
  if (a.CenterOf(last) - a.CenterOf(ticks.back()) < min_gap_px) {
    if (ticks.size() == 1) return ticks;
    ticks.pop_back();
  }
  ticks.push_back(last);
  return ticks;
}

struct BarLabel {
  double value;
  std::string text;
};

// lo and hi, and round values between them that keep clear of both.
std::vector<BarLabel> BarLabels(const Stats& s, int bar_h) {
  if (!(s.hi > s.lo)) return {{s.lo, FormatValue(s.lo)}};
  std::vector<BarLabel> labels = {{s.lo, FormatValue(s.lo)}, {s.hi, FormatValue(s.hi)}};
  // Labels clear of one another by most of a line; a tick every ~64 pixels
  // is enough to read a value off the bar.
  const double clearance = static_cast<double>(kTextH + 12) / bar_h;
  for (double v : ValueTicks(s.lo, s.hi, std::max(1, bar_h / (kTextH + 48)))) {
    const double t = Normalized(v, s);
    if (t > clearance && t < 1 - clearance) labels.push_back({v, FormatValue(v)});
  }
  return labels;
}

int WidestText(const std::vector<std::string>& texts) {
  int w = 0;
  for (const std::string& t : texts) w = std::max(w, TextWidth(t, kScale));
  return w;
}

}  // namespace

absl::StatusOr<Canvas> RenderHeatmap(absl::Span<const double> values, int64_t rows, int64_t cols,
                                     const HeatmapLabels& labels) {
  if (rows < 1 || cols < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("heatmap: rows and cols must both be at least 1, got ", rows, " x ", cols));
  }
  int64_t n = 0;
  if (__builtin_mul_overflow(rows, cols, &n) || static_cast<uint64_t>(n) != values.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "heatmap: a ", rows, " x ", cols, " array needs rows * cols values, got ", values.size()));
  }
  const Stats s = Measure(values);
  if (!(s.lo <= s.hi)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "heatmap: no finite value to scale the colours by: all ", n, " entries are NaN (", s.nan,
        ") or infinite (", s.neg_inf, " -inf, ", s.pos_inf, " +inf)"));
  }
  const GridPlan g = PlanGrid(rows, cols);
  const std::vector<Cell> cells = BlockAverage(values, rows, cols, g.rows.block, g.cols.block);
  const int plot_w = g.cols.pixels(), plot_h = g.rows.pixels();

  // Tick labels first: their widths set the margins.
  const int index_w = TextWidth(absl::StrCat(std::max(rows, cols) - 1), kScale);
  const std::vector<int64_t> xticks =
      AxisTicks(g.cols, std::max(2, plot_w / (index_w + 24)), index_w + 12);
  const std::vector<int64_t> yticks =
      AxisTicks(g.rows, std::max(2, plot_h / (kTextH + 24)), kTextH + 16);
  std::vector<std::string> ytexts;
  for (int64_t i : yticks) ytexts.push_back(absl::StrCat(i));
  const std::vector<BarLabel> bar_labels = BarLabels(s, plot_h);
  std::vector<std::string> bar_texts;
  for (const BarLabel& b : bar_labels) bar_texts.push_back(b.text);

  const int plot_x = kMargin + kTextH + 10 + WidestText(ytexts) + 4 + kTick + 1;
  const int bar_x = plot_x + plot_w + 1 + kBarGap;
  const int bar_text_x = bar_x + kBarWidth + 1 + kTick + 4;
  const int content_w = bar_text_x + WidestText(bar_texts) + kMargin;

  // Text above the plot, wrapped to the plot's width (at least 640 pixels).
  const int text_w = std::max(content_w, 640) - 2 * kMargin;
  const std::vector<std::string> title = Wrap(labels.title, MaxChars(text_w), 3);
  std::string about = absl::StrCat(rows, " x ", cols, " entries, finite values from ",
                                   FormatValue(s.lo), " to ", FormatValue(s.hi));
  if (g.rows.block > 1 || g.cols.block > 1) {
    absl::StrAppend(&about, "; each cell is the mean of ", g.rows.block, " x ", g.cols.block,
                    " entries");
    if (s.neg_inf + s.pos_inf + s.nan > 0) absl::StrAppend(&about, " (non-finite where most are)");
  }
  const std::vector<std::string> subtitle = Wrap(about, MaxChars(text_w), 2);

  struct LegendRow {
    Rgb color;
    std::string text;
  };
  std::vector<LegendRow> legend;
  const auto add_legend = [&](int64_t count, Rgb color, absl::string_view name) {
    if (count > 0) {
      legend.push_back({color, absl::StrCat(name, ": ", count, " of ", n, " entries")});
    }
  };
  add_legend(s.neg_inf, kNegInfColor,
             labels.neg_inf_meaning.empty()
                 ? "-inf"
                 : absl::StrCat("-inf (", Truncated(labels.neg_inf_meaning, 24), ")"));
  add_legend(s.pos_inf, kPosInfColor, "+inf");
  add_legend(s.nan, kNanColor, "NaN");

  const int plot_y = kMargin + static_cast<int>(title.size() + subtitle.size()) * kLine + 8 +
                     kTextH / 2;  // room for the top bar label, centred on the bar's top
  const int xtick_text_y = plot_y + plot_h + 1 + kTick + 4;
  const int xname_y = xtick_text_y + kTextH + 10;
  const int legend_y = xname_y + kTextH + 14;
  const int height = legend_y + static_cast<int>(legend.size()) * kLine + kMargin;
  int width = text_w + 2 * kMargin;
  for (const LegendRow& row : legend) {
    width = std::max(width, plot_x + kSwatch + 8 + TextWidth(row.text, kScale) + kMargin);
  }

  Canvas canvas(width, height, kWhite);
  int y = kMargin;
  for (const std::string& line : title) {
    canvas.DrawText(kMargin, y, line, kScale, kInk);
    y += kLine;
  }
  for (const std::string& line : subtitle) {
    canvas.DrawText(kMargin, y, line, kScale, kSubtleInk);
    y += kLine;
  }

  // The cells.
  std::vector<Rgb> colors(cells.size());
  for (size_t i = 0; i < cells.size(); ++i) colors[i] = CellColor(cells[i], s);
  for (int py = 0; py < plot_h; ++py) {
    const Rgb* row = &colors[(py / g.rows.pixels_per_cell) * g.cols.cells];
    for (int px = 0; px < plot_w; ++px) {
      canvas.Set(plot_x + px, plot_y + py, row[px / g.cols.pixels_per_cell]);
    }
  }
  canvas.FrameOutside(plot_x, plot_y, plot_w, plot_h, kInk);

  // Axes: ticks at cell centres, numbers, names.
  for (int64_t i : xticks) {
    const int x = plot_x + g.cols.CenterOf(i);
    canvas.FillRect(x, plot_y + plot_h + 1, 1, kTick, kInk);
    const std::string t = absl::StrCat(i);
    canvas.DrawText(x - TextWidth(t, kScale) / 2, xtick_text_y, t, kScale, kInk);
  }
  for (size_t k = 0; k < yticks.size(); ++k) {
    const int yy = plot_y + g.rows.CenterOf(yticks[k]);
    canvas.FillRect(plot_x - 1 - kTick, yy, kTick, 1, kInk);
    canvas.DrawText(plot_x - 1 - kTick - 4 - TextWidth(ytexts[k], kScale), yy - kTextH / 2 + 1,
                    ytexts[k], kScale, kInk);
  }
  const std::string xname = Truncated(labels.col_axis, MaxChars(plot_w));
  canvas.DrawText(plot_x + (plot_w - TextWidth(xname, kScale)) / 2, xname_y, xname, kScale, kInk);
  const std::string yname = Truncated(labels.row_axis, MaxChars(plot_h));
  canvas.DrawTextUp(kMargin, plot_y + (plot_h - TextWidth(yname, kScale)) / 2, yname, kScale, kInk);

  // The colour bar: the highest value at the top.
  for (int py = 0; py < plot_h; ++py) {
    const double t = s.hi > s.lo ? 1 - static_cast<double>(py) / (plot_h - 1) : 0.5;
    canvas.FillRect(bar_x, plot_y + py, kBarWidth, 1, RampColor(t));
  }
  canvas.FrameOutside(bar_x, plot_y, kBarWidth, plot_h, kInk);
  for (const BarLabel& b : bar_labels) {
    const int yy =
        plot_y + static_cast<int>(std::lround((1 - Normalized(b.value, s)) * (plot_h - 1)));
    canvas.FillRect(bar_x + kBarWidth + 1, yy, kTick, 1, kInk);
    canvas.DrawText(bar_text_x, yy - kTextH / 2 + 1, b.text, kScale, kInk);
  }

  // What the colours off the ramp mean.
  y = legend_y;
  for (const LegendRow& row : legend) {
    canvas.FillRect(plot_x, y, kSwatch, kSwatch, row.color);
    canvas.FrameOutside(plot_x, y, kSwatch, kSwatch, kInk);
    canvas.DrawText(plot_x + kSwatch + 8, y, row.text, kScale, kInk);
    y += kLine;
  }
  return canvas;
}

absl::Status WriteHeatmapPng(const std::string& path, absl::Span<const double> values, int64_t rows,
                             int64_t cols, const HeatmapLabels& labels) {
  POSENC_ASSIGN_OR_RETURN(const Canvas canvas, RenderHeatmap(values, rows, cols, labels));
  return WritePng(path, canvas);
}

}  // namespace posenc::cli
