#include "heatmap.h"

#include <png.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"

namespace posenc::cli {
namespace {

// A perceptually ordered ramp (dark blue -> teal -> green -> yellow).
void Color(double t, uint8_t* rgb) {
  static const double stops[5][3] = {
      {68, 1, 84}, {59, 82, 139}, {33, 145, 140}, {94, 201, 98}, {253, 231, 37}};
  t = std::clamp(t, 0.0, 1.0) * 4;
  const int i = std::min(3, static_cast<int>(t));
  const double f = t - i;
  for (int c = 0; c < 3; ++c)
    rgb[c] = static_cast<uint8_t>(stops[i][c] + f * (stops[i + 1][c] - stops[i][c]));
}

}  // namespace

absl::Status WriteHeatmapPng(const std::string& path, const std::vector<double>& values,
                             int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return absl::InvalidArgumentError("nothing to draw: empty array");
  double lo = INFINITY, hi = -INFINITY;
  for (double v : values) {
    if (std::isfinite(v)) {
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  }
  if (!(hi > lo)) hi = lo + 1;
  const int64_t scale = std::max<int64_t>(1, 256 / std::max(rows, cols));
  const int64_t w = cols * scale, h = rows * scale;
  if (w > 16384 || h > 16384)
    return absl::InvalidArgumentError("array too large for a heatmap (max 16384 px)");

  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return absl::UnavailableError(absl::StrCat("cannot write ", path));
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    std::fclose(f);
    return absl::InternalError("libpng failed");
  }
  png_init_io(png, f);
  png_set_IHDR(png, info, w, h, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  std::vector<uint8_t> row(w * 3);
  for (int64_t y = 0; y < h; ++y) {
    for (int64_t x = 0; x < w; ++x) {
      const double v = values[(y / scale) * cols + x / scale];
      uint8_t* px = &row[x * 3];
      if (std::isfinite(v)) {
        Color((v - lo) / (hi - lo), px);
      } else {
        px[0] = px[1] = px[2] = 40;
      }
    }
    png_write_row(png, row.data());
  }
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  std::fclose(f);
  return absl::OkStatus();
}

}  // namespace posenc::cli
