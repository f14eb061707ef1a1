// The heatmap as a reader gets it: each test writes a PNG, reads it back
// with libpng and finds the plot and the colour bar by their black frames,
// so what is asserted is what the file shows, not what the renderer meant.
#include "heatmap.h"

#include <png.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "heatmap_colors.h"
#include "heatmap_font.h"
#include "heatmap_grid.h"

namespace posenc::cli {
namespace {

constexpr int kScale = kHeatmapTextScale;

struct Image {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;
  Rgb At(int x, int y) const {
    const uint8_t* p = &rgb[(static_cast<size_t>(y) * width + x) * 3];
    return Rgb{p[0], p[1], p[2]};
  }
  bool Black(int x, int y) const { return At(x, y) == kBlack; }
};

// Inside a one-pixel black frame.
struct Box {
  int x = 0, y = 0, w = 0, h = 0;
};

Image ReadPng(const std::string& path) {
  png_image png{};
  png.version = PNG_IMAGE_VERSION;
  Image img;
  if (!png_image_begin_read_from_file(&png, path.c_str())) {
    ADD_FAILURE() << path << ": " << png.message;
    return img;
  }
  png.format = PNG_FORMAT_RGB;
  img.rgb.resize(PNG_IMAGE_SIZE(png));
  if (!png_image_finish_read(&png, nullptr, img.rgb.data(), 0, nullptr)) {
    ADD_FAILURE() << path << ": " << png.message;
    return img;
  }
  img.width = png.width;
  img.height = png.height;
  return img;
}

class TempDir {
 public:
  TempDir() {
    char dir[] = "/tmp/posenc_heatmap_XXXXXX";
    path_ = mkdtemp(dir);
  }
  ~TempDir() { std::system(("rm -rf " + path_).c_str()); }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

Image Render(const std::vector<double>& v, int64_t rows, int64_t cols,
             const HeatmapLabels& labels = {}) {
  TempDir dir;
  const absl::Status s = WriteHeatmapPng(dir / "h.png", v, rows, cols, labels);
  EXPECT_TRUE(s.ok()) << s;
  return s.ok() ? ReadPng(dir / "h.png") : Image();
}

// The plot is the box with the longest black frame edge; the colour bar is
// the next frame to its right, on the same top row.
Box FindFramed(const Image& img, int from_x, int top_row) {
  Box b;
  int x = from_x;
  while (x < img.width && !img.Black(x, top_row)) ++x;
  const int x0 = x;
  while (x < img.width && img.Black(x, top_row)) ++x;
  int y = top_row;
  while (y < img.height && img.Black(x0, y)) ++y;
  return Box{x0 + 1, top_row + 1, x - x0 - 2, y - top_row - 2};
}

Box FindPlot(const Image& img) {
  int best = 0, best_x = 0, best_y = 0;
  for (int y = 0; y < img.height; ++y) {
    for (int x = 0; x < img.width;) {
      int run = 0;
      while (x + run < img.width && img.Black(x + run, y)) ++run;
      if (run > best) best = run, best_x = x, best_y = y;
      x += std::max(run, 1);
    }
  }
  return FindFramed(img, best_x, best_y);
}

Box FindBar(const Image& img, const Box& plot) {
  return FindFramed(img, plot.x + plot.w + 1, plot.y - 1);
}

std::vector<double> RandomArray(int64_t n, uint64_t seed, double lo = -1, double hi = 1) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(n);
  for (double& x : v) x = u(rng);
  return v;
}

uint64_t Seed() {
  const uint64_t seed =
      std::random_device{}() * uint64_t{0x9E3779B97F4A7C15} ^ std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  return seed;
}

// Whether `text` drawn black at kScale (upright or turned up) appears in img
// pixel for pixel, ink and background, anywhere in the region.
bool HasText(const Image& img, const std::string& text, bool up, int x0, int y0, int x1, int y1) {
  const int tw = TextWidth(text, kScale), th = TextHeight(kScale);
  const int pw = up ? th : tw, ph = up ? tw : th;
  Canvas pattern(pw, ph, kWhite);
  if (up) {
    pattern.DrawTextUp(0, 0, text, kScale, kBlack);
  } else {
    pattern.DrawText(0, 0, text, kScale, kBlack);
  }
  for (int y = std::max(0, y0); y <= std::min(y1, img.height - ph); ++y) {
    for (int x = std::max(0, x0); x <= std::min(x1, img.width - pw); ++x) {
      bool match = true;
      for (int py = 0; py < ph && match; ++py) {
        for (int px = 0; px < pw && match; ++px) {
          match = (pattern.At(px, py) == kBlack) == img.Black(x + px, y + py);
        }
      }
      if (match) return true;
    }
  }
  return false;
}

int Distance(Rgb a, Rgb b) {
  return std::abs(a.r - b.r) + std::abs(a.g - b.g) + std::abs(a.b - b.b);
}

// The rule of heatmap_layout.h, worked by hand for each shape.
TEST(Heatmap, PlotSizeFollowsTheAspectRule) {
  const uint64_t seed = Seed();
  struct Case {
    int64_t rows, cols;
    int plot_w, plot_h;
  };
  for (const Case& c : {
           // 1024 columns at 1 px; 128 rows stretched to half of that: 4 px.
           Case{128, 1024, 1024, 512},
           // 1024 rows at 1 px; 16 columns stretched to 512: 32 px.
           Case{1024, 16, 512, 1024},
           // 64 x 64: square cells of 640 / 64 = 10 px.
           Case{64, 64, 640, 640},
           // 3000 rows in blocks of 3 = 1000 cells at 1 px; 5 columns of 100.
           Case{3000, 5, 500, 1000},
           // One entry: magnified to 640.
           Case{1, 1, 640, 640},
       }) {
    SCOPED_TRACE(testing::Message() << c.rows << " x " << c.cols);
    const Image img = Render(RandomArray(c.rows * c.cols, seed), c.rows, c.cols);
    const Box plot = FindPlot(img);
    EXPECT_EQ(plot.w, c.plot_w);
    EXPECT_EQ(plot.h, c.plot_h);
    EXPECT_LE(img.width, kMaxHeatmapWidth);
    EXPECT_LE(img.height, kMaxHeatmapHeight);
    const Box bar = FindBar(img, plot);
    EXPECT_EQ(bar.h, plot.h) << "the colour bar runs the plot's height";
    EXPECT_GT(bar.w, 8);
  }
}

TEST(Heatmap, ColourBarEndsAreTheColoursOfTheExtremeCells) {
  const uint64_t seed = Seed();
  std::vector<double> v = RandomArray(64 * 64, seed);
  v[0] = -3.25;          // the minimum, top-left
  v[64 * 64 - 1] = 5.5;  // the maximum, bottom-right
  HeatmapLabels labels;
  labels.title = "extremes";
  const Image img = Render(v, 64, 64, labels);
  const Box plot = FindPlot(img);
  ASSERT_EQ(plot.w, 640);  // 10 px cells
  const Box bar = FindBar(img, plot);
  const Rgb min_cell = img.At(plot.x + 5, plot.y + 5);
  const Rgb max_cell = img.At(plot.x + 635, plot.y + 635);
  const Rgb bar_bottom = img.At(bar.x + bar.w / 2, bar.y + bar.h - 1);
  const Rgb bar_top = img.At(bar.x + bar.w / 2, bar.y);
  EXPECT_EQ(bar_bottom, min_cell);
  EXPECT_EQ(bar_top, max_cell);
  EXPECT_GT(Distance(bar_top, bar_bottom), 200);
  // A middle value is neither end.
  const Rgb other = img.At(plot.x + 15, plot.y + 5);
  EXPECT_NE(other, min_cell);
  EXPECT_NE(other, max_cell);
  // The ends are labelled with their values beside the bar.
  const int label_x = bar.x + bar.w;
  const int th = TextHeight(kScale);
  EXPECT_TRUE(HasText(img, "5.5", false, label_x, bar.y - th, label_x + 40, bar.y + 2));
  EXPECT_TRUE(
      HasText(img, "-3.25", false, label_x, bar.y + bar.h - th, label_x + 40, bar.y + bar.h + 2));
}

TEST(Heatmap, NonFiniteCellsHaveTheirOwnColoursAndALegend) {
  // A causal mask: key j > query i is -inf. One NaN and one +inf besides.
  constexpr int n = 48;
  std::vector<double> v(n * n);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) v[i * n + j] = j > i ? -INFINITY : -0.5 * (i - j);
  }
  v[40 * n + 1] = NAN;
  v[47 * n + 2] = INFINITY;
  HeatmapLabels labels;
  labels.neg_inf_meaning = "masked";
  const Image img = Render(v, n, n, labels);
  const Box plot = FindPlot(img);
  const int cell = plot.w / n;
  ASSERT_EQ(plot.w, n * cell);
  const auto at_cell = [&](int i, int j) {
    return img.At(plot.x + j * cell + cell / 2, plot.y + i * cell + cell / 2);
  };
  EXPECT_EQ(at_cell(0, n - 1), kNegInfColor);
  EXPECT_EQ(at_cell(10, 11), kNegInfColor);
  EXPECT_NE(at_cell(11, 10), kNegInfColor);
  EXPECT_NE(at_cell(n - 1, 0), kNegInfColor);
  EXPECT_EQ(at_cell(40, 1), kNanColor);
  EXPECT_EQ(at_cell(47, 2), kPosInfColor);
  // No value on the ramp could be mistaken for one of them.
  for (int k = 0; k <= 1000; ++k) {
    const Rgb ramp = RampColor(k / 1000.0);
    for (Rgb off : {kNegInfColor, kPosInfColor, kNanColor}) ASSERT_GT(Distance(ramp, off), 60);
  }
  // The legend, below the plot: a swatch of each colour and its name.
  for (Rgb off : {kNegInfColor, kPosInfColor, kNanColor}) {
    int swatch = 0;
    for (int y = plot.y + plot.h + 2; y < img.height; ++y) {
      for (int x = 0; x < img.width; ++x) swatch += img.At(x, y) == off;
    }
    EXPECT_GE(swatch, TextHeight(kScale) * TextHeight(kScale));
  }
  const int below = plot.y + plot.h;
  EXPECT_TRUE(
      HasText(img, "-inf (masked): 1128 of 2304 entries", false, 0, below, img.width, img.height));
  EXPECT_TRUE(HasText(img, "NaN: 1 of 2304 entries", false, 0, below, img.width, img.height));
  EXPECT_TRUE(HasText(img, "+inf: 1 of 2304 entries", false, 0, below, img.width, img.height));
}

TEST(HeatmapFont, EveryCharacterHasItsOwnGlyph) {
  std::set<std::vector<uint8_t>> seen;
  for (char c = ' '; c <= '~'; ++c) {
    ASSERT_TRUE(HasGlyph(c)) << c;
    const Glyph& g = GlyphFor(c);
    const std::vector<uint8_t> bits(g.rows, g.rows + kGlyphHeight);
    int ink = 0;
    for (int y = 0; y < kGlyphHeight; ++y) {
      for (int x = 0; x < kGlyphWidth; ++x) ink += g.Ink(x, y);
      EXPECT_EQ(g.rows[y] >> kGlyphWidth, 0) << "ink outside the 5-pixel cell: " << c;
    }
    EXPECT_EQ(ink == 0, c == ' ') << c;
    EXPECT_TRUE(seen.insert(bits).second) << "'" << c << "' looks like another character";
  }
  for (char c : {'\t', '\n', '\x7f', '\x80', '\xff'}) {
    EXPECT_FALSE(HasGlyph(c));
    EXPECT_EQ(&GlyphFor(c), &GlyphFor('?'));
  }
}

// Ink lands inside the text's box, in every character's cell, and nowhere
// else; turned text is the upright text turned.
TEST(HeatmapFont, TextPutsInkWhereTheLabelIs) {
  const std::string text = "x=42, dim";
  constexpr int scale = 3, x0 = 7, y0 = 5;
  Canvas c(200, 60, kWhite);
  c.DrawText(x0, y0, text, scale, kBlack);
  const int w = TextWidth(text, scale), h = TextHeight(scale);
  std::vector<int> ink_per_char(text.size());
  for (int y = 0; y < c.height(); ++y) {
    for (int x = 0; x < c.width(); ++x) {
      if (c.At(x, y) != kBlack) continue;
      ASSERT_TRUE(x >= x0 && x < x0 + w && y >= y0 && y < y0 + h) << x << "," << y;
      ++ink_per_char[(x - x0) / (kGlyphAdvance * scale)];
    }
  }
  for (size_t i = 0; i < text.size(); ++i) EXPECT_EQ(ink_per_char[i] == 0, text[i] == ' ') << i;

  Canvas up(60, 220, kWhite);
  up.DrawTextUp(3, 4, text, scale, kBlack);
  for (int y = 0; y < up.height(); ++y) {
    for (int x = 0; x < up.width(); ++x) {
      // Upright pixel (u, v) turns to (3 + v, 4 + w - 1 - u).
      const bool inside = x >= 3 && x < 3 + h && y >= 4 && y < 4 + w;
      const bool expect = inside && c.At(x0 + (4 + w - 1 - y), y0 + (x - 3)) == kBlack;
      ASSERT_EQ(up.At(x, y) == kBlack, expect) << x << "," << y;
    }
  }
}

TEST(Heatmap, TitleAndAxisNamesAreWhereAReaderLooks) {
  HeatmapLabels labels;
  labels.title = "sinusoidal table, base 10000, float32 [100, 256]";
  labels.row_axis = "position";
  labels.col_axis = "dimension";
  const Image img = Render(RandomArray(100 * 256, 1), 100, 256, labels);
  const Box plot = FindPlot(img);
  EXPECT_TRUE(HasText(img, labels.title, false, 0, 0, img.width, plot.y));
  EXPECT_TRUE(
      HasText(img, "dimension", false, plot.x, plot.y + plot.h, plot.x + plot.w, img.height));
  EXPECT_TRUE(HasText(img, "position", true, 0, plot.y, plot.x, plot.y + plot.h));
  // Numbered axes: 0 and the last position and dimension.
  EXPECT_TRUE(HasText(img, "99", false, 0, plot.y, plot.x, plot.y + plot.h));
  EXPECT_TRUE(HasText(img, "255", false, plot.x, plot.y + plot.h, img.width, img.height));
}

// The test's own block mean, the slow obvious way.
Cell NaiveBlock(const std::vector<double>& v, int64_t cols, int64_t r0, int64_t r1, int64_t c0,
                int64_t c1) {
  double sum = 0;
  int64_t finite = 0, neg = 0, pos = 0, nan = 0;
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t c = c0; c < c1; ++c) {
      const double x = v[r * cols + c];
      if (std::isnan(x)) {
        ++nan;
      } else if (x == INFINITY) {
        ++pos;
      } else if (x == -INFINITY) {
        ++neg;
      } else {
        sum += x;
        ++finite;
      }
    }
  }
  if (neg + pos + nan > finite) {
    if (neg >= pos && neg >= nan) return Cell{CellKind::kNegInf, 0};
    return Cell{pos >= nan ? CellKind::kPosInf : CellKind::kNan, 0};
  }
  return Cell{CellKind::kFinite, sum / finite};
}

TEST(HeatmapGrid, BlocksAreAveraged) {
  const uint64_t seed = Seed();
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t rows = 1 + rng() % 40, cols = 1 + rng() % 40;
    const int64_t br = 1 + rng() % 7, bc = 1 + rng() % 7;
    std::vector<double> v = RandomArray(rows * cols, rng(), -100, 100);
    // Some non-finite entries, sometimes most of a block.
    const double odd[] = {-INFINITY, INFINITY, NAN};
    for (double& x : v) {
      if (rng() % 4 == 0) x = odd[rng() % 3];
    }
    const std::vector<Cell> cells = BlockAverage(v, rows, cols, br, bc);
    const int64_t out_rows = (rows + br - 1) / br, out_cols = (cols + bc - 1) / bc;
    ASSERT_EQ(cells.size(), static_cast<size_t>(out_rows * out_cols));
    for (int64_t i = 0; i < out_rows; ++i) {
      for (int64_t j = 0; j < out_cols; ++j) {
        const Cell want = NaiveBlock(v, cols, i * br, std::min(rows, (i + 1) * br), j * bc,
                                     std::min(cols, (j + 1) * bc));
        const Cell& got = cells[i * out_cols + j];
        ASSERT_EQ(got.kind, want.kind) << rows << "x" << cols << " /" << br << "x" << bc;
        if (want.kind == CellKind::kFinite) ASSERT_NEAR(got.mean, want.mean, 1e-9);
      }
    }
  }
}

// Through the PNG: 2050 rows are drawn as blocks of 3 (the last one a single
// row); each cell's colour, read back against the colour bar, is its block's
// mean (and not, say, its first entry).
TEST(Heatmap, DownsampledCellsShowTheirBlockMeans) {
  const uint64_t seed = Seed();
  constexpr int64_t rows = 2050, cols = 3;
  const std::vector<double> v = RandomArray(rows * cols, seed);
  double lo = INFINITY, hi = -INFINITY;
  for (double x : v) lo = std::min(lo, x), hi = std::max(hi, x);
  const Image img = Render(v, rows, cols);
  const Box plot = FindPlot(img);
  ASSERT_EQ(plot.h, 684);  // ceil(2050 / 3) cells of 1 pixel
  const Box bar = FindBar(img, plot);
  const int cell_w = plot.w / cols;
  int far_from_first = 0;
  for (int64_t i = 0; i < 684; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      const Rgb got = img.At(plot.x + j * cell_w + cell_w / 2, plot.y + i);
      int best = 0;
      for (int y = 1; y < bar.h; ++y) {
        if (Distance(img.At(bar.x + 1, bar.y + y), got) <
            Distance(img.At(bar.x + 1, bar.y + best), got)) {
          best = y;
        }
      }
      const double shown = hi - (hi - lo) * best / (bar.h - 1);
      const Cell want = NaiveBlock(v, cols, i * 3, std::min(rows, i * 3 + 3), j, j + 1);
      ASSERT_NEAR(shown, want.mean, 0.02 * (hi - lo)) << "cell " << i << "," << j;
      far_from_first += std::abs(v[i * 3 * cols + j] - want.mean) > 0.1;
    }
  }
  EXPECT_GT(far_from_first, 684) << "the data must tell a mean from a first entry";
}

TEST(Heatmap, BadInputsGetClearErrors) {
  TempDir dir;
  const std::vector<double> sixteen(16, 1.0);
  absl::Status s = WriteHeatmapPng(dir / "a.png", {}, 0, 16, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("at least 1, got 0 x 16"), absl::string_view::npos) << s;
  s = WriteHeatmapPng(dir / "a.png", sixteen, 4, 5, {});
  EXPECT_NE(s.message().find("a 4 x 5 array needs rows * cols values, got 16"),
            absl::string_view::npos)
      << s;
  s = WriteHeatmapPng(dir / "a.png", sixteen, int64_t{1} << 40, int64_t{1} << 40, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  const std::vector<double> nans(12, NAN);
  s = WriteHeatmapPng(dir / "a.png", nans, 3, 4, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("no finite value"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("all 12 entries are NaN (12)"), absl::string_view::npos) << s;
  EXPECT_NE(access((dir / "a.png").c_str(), F_OK), 0) << "nothing is written for bad input";

  // Paths that cannot be written: the error names the path and the reason.
  for (const std::string& path : {dir / "no/such/dir/h.png", dir / ""}) {
    s = WriteHeatmapPng(path, sixteen, 4, 4, {});
    EXPECT_FALSE(s.ok()) << path;
    EXPECT_NE(s.message().find("cannot write PNG '" + path + "'"), absl::string_view::npos) << s;
  }
  s = WriteHeatmapPng("", sixteen, 4, 4, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  if (access("/dev/full", W_OK) == 0) {  // a disk that is always full
    s = WriteHeatmapPng("/dev/full", sixteen, 4, 4, {});
    EXPECT_NE(s.message().find("No space left"), absl::string_view::npos) << s;
    EXPECT_EQ(access("/dev/full", F_OK), 0) << "a failed write removes only regular files";
  }
}

TEST(Heatmap, HostileValuesAndLabelsStayInBounds) {
  // Extremes whose difference overflows a double still span the ramp.
  std::vector<double> v = {-1.7e308, 0, 1.7e308, 5e307};
  const Image img = Render(v, 2, 2);
  const Box plot = FindPlot(img);
  const Box bar = FindBar(img, plot);
  EXPECT_EQ(img.At(plot.x + 5, plot.y + 5), img.At(bar.x + 1, bar.y + bar.h - 1));
  EXPECT_EQ(img.At(plot.x + 5, plot.y + plot.h - 5), img.At(bar.x + 1, bar.y));
  // A constant array and a very long, odd title; a huge thin array.
  HeatmapLabels labels;
  for (int i = 0; i < 3000; ++i) labels.title += static_cast<char>(i % 256);
  labels.row_axis = std::string(500, 'r');
  labels.neg_inf_meaning = std::string(500, 'm');
  std::vector<double> wide(3 * 200000, 7.0);
  wide[5] = -INFINITY;
  const Image huge = Render(wide, 3, 200000, labels);
  EXPECT_LE(huge.width, kMaxHeatmapWidth);
  EXPECT_LE(huge.height, kMaxHeatmapHeight);
  // Blocks of ceil(200000 / 1024) = 196 columns: 1021 cells of 1 pixel.
  EXPECT_EQ(FindPlot(huge).w, 1021);
}

}  // namespace
}  // namespace posenc::cli
