// An RGB raster to draw a heatmap on: rectangles, frames and text in the
// font of heatmap_font.h. Everything drawn is clipped to the canvas, so a
// label that does not fit loses pixels instead of writing out of bounds.
#ifndef POSENC_CLI_HEATMAP_CANVAS_H_
#define POSENC_CLI_HEATMAP_CANVAS_H_

#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"

namespace posenc::cli {

struct Rgb {
  uint8_t r = 0, g = 0, b = 0;
  friend bool operator==(Rgb a, Rgb b) { return a.r == b.r && a.g == b.g && a.b == b.b; }
  friend bool operator!=(Rgb a, Rgb b) { return !(a == b); }
};

inline constexpr Rgb kWhite{255, 255, 255};
inline constexpr Rgb kBlack{0, 0, 0};

// Pixels one line of text of `text.size()` characters takes at `scale`
// (each font pixel drawn as scale x scale); no trailing gap.
int TextWidth(absl::string_view text, int scale);
int TextHeight(int scale);

class Canvas {
 public:
  // REQUIRES: width, height > 0.
  Canvas(int width, int height, Rgb background);

  int width() const { return width_; }
  int height() const { return height_; }
  // REQUIRES: 0 <= x < width(), 0 <= y < height().
  Rgb At(int x, int y) const;
  // Row-major RGB, 3 bytes a pixel, width() * 3 bytes a row.
  const uint8_t* row(int y) const { return &pixels_[static_cast<size_t>(y) * width_ * 3]; }

  void Set(int x, int y, Rgb c);
  void FillRect(int x, int y, int w, int h, Rgb c);
  // A one-pixel outline just outside the w x h box at (x, y), so a frame
  // never covers what it frames.
  void FrameOutside(int x, int y, int w, int h, Rgb c);
  // Text whose top-left corner is (x, y), left to right.
  void DrawText(int x, int y, absl::string_view text, int scale, Rgb ink);
  // Text turned a quarter counter-clockwise, read bottom to top (a y-axis
  // name); (x, y) is the top-left corner of the turned box, which is
  // TextHeight wide and TextWidth tall.
  void DrawTextUp(int x, int y, absl::string_view text, int scale, Rgb ink);

 private:
  int width_, height_;
  std::vector<uint8_t> pixels_;
};

}  // namespace posenc::cli

#endif  // POSENC_CLI_HEATMAP_CANVAS_H_
