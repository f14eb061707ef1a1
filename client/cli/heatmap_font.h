// A 5 x 8 bitmap font of our own for the heatmap's labels: printable ASCII,
// drawn on a 6-pixel advance. Capitals and digits stand 7 pixels tall; the
// eighth row holds the descenders of g, j, p, q, y and the underscore.
#ifndef POSENC_CLI_HEATMAP_FONT_H_
#define POSENC_CLI_HEATMAP_FONT_H_

#include <cstdint>

namespace posenc::cli {

inline constexpr int kGlyphWidth = 5;
inline constexpr int kGlyphHeight = 8;
// One blank column between letters, so a label never runs together.
inline constexpr int kGlyphAdvance = kGlyphWidth + 1;

// One character: rows[y] bit (kGlyphWidth - 1 - x) is set where (x, y) is ink.
struct Glyph {
  uint8_t rows[kGlyphHeight];
  bool Ink(int x, int y) const { return (rows[y] >> (kGlyphWidth - 1 - x)) & 1; }
};

// True for the characters the font draws (printable ASCII, space included).
bool HasGlyph(char c);
// The glyph for c; characters the font lacks are drawn as '?', so an odd
// byte in a title shows up as such instead of vanishing.
const Glyph& GlyphFor(char c);

}  // namespace posenc::cli

#endif  // POSENC_CLI_HEATMAP_FONT_H_
