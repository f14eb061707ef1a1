#include "heatmap_canvas.h"

#include <algorithm>

#include "heatmap_font.h"

namespace posenc::cli {

int TextWidth(absl::string_view text, int scale) {
  if (text.empty()) return 0;
  return (static_cast<int>(text.size()) * kGlyphAdvance - 1) * scale;
}

int TextHeight(int scale) { return kGlyphHeight * scale; }

Canvas::Canvas(int width, int height, Rgb background)
    : width_(width), height_(height), pixels_(static_cast<size_t>(width) * height * 3) {
  FillRect(0, 0, width, height, background);
}

Rgb Canvas::At(int x, int y) const {
  const uint8_t* p = &pixels_[(static_cast<size_t>(y) * width_ + x) * 3];
  return Rgb{p[0], p[1], p[2]};
}

void Canvas::Set(int x, int y, Rgb c) {
  if (x < 0 || y < 0 || x >= width_ || y >= height_) return;
  uint8_t* p = &pixels_[(static_cast<size_t>(y) * width_ + x) * 3];
  p[0] = c.r;
  p[1] = c.g;
  p[2] = c.b;
}

void Canvas::FillRect(int x, int y, int w, int h, Rgb c) {
  const int x0 = std::max(x, 0), x1 = std::min(x + w, width_);
  const int y0 = std::max(y, 0), y1 = std::min(y + h, height_);
  for (int yy = y0; yy < y1; ++yy) {
    for (int xx = x0; xx < x1; ++xx) Set(xx, yy, c);
  }
}

void Canvas::FrameOutside(int x, int y, int w, int h, Rgb c) {
  FillRect(x - 1, y - 1, w + 2, 1, c);
  FillRect(x - 1, y + h, w + 2, 1, c);
  FillRect(x - 1, y, 1, h, c);
  FillRect(x + w, y, 1, h, c);
}

void Canvas::DrawText(int x, int y, absl::string_view text, int scale, Rgb ink) {
  for (size_t i = 0; i < text.size(); ++i) {
    const Glyph& g = GlyphFor(text[i]);
    const int left = x + static_cast<int>(i) * kGlyphAdvance * scale;
    for (int gy = 0; gy < kGlyphHeight; ++gy) {
      for (int gx = 0; gx < kGlyphWidth; ++gx) {
        if (g.Ink(gx, gy)) FillRect(left + gx * scale, y + gy * scale, scale, scale, ink);
      }
    }
  }
}

void Canvas::DrawTextUp(int x, int y, absl::string_view text, int scale, Rgb ink) {
  // Glyph column gx of character i lands on row (bottom - i * advance - gx),
  // glyph row gy on column x + gy: the tops of the letters face left.
  const int bottom = y + TextWidth(text, scale) - scale;
  for (size_t i = 0; i < text.size(); ++i) {
    const Glyph& g = GlyphFor(text[i]);
    const int base = bottom - static_cast<int>(i) * kGlyphAdvance * scale;
    for (int gy = 0; gy < kGlyphHeight; ++gy) {
      for (int gx = 0; gx < kGlyphWidth; ++gx) {
        if (g.Ink(gx, gy)) FillRect(x + gy * scale, base - gx * scale, scale, scale, ink);
      }
    }
  }
}

}  // namespace posenc::cli
