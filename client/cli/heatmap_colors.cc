#include "heatmap_colors.h"

#include <algorithm>
#include <cmath>

namespace posenc::cli {

Rgb RampColor(double t) {
  // Nine stops, evenly spaced, interpolated linearly in RGB.
  static constexpr double kStops[9][3] = {{68, 1, 84},    {71, 44, 122},  {59, 81, 139},
                                          {44, 113, 142}, {33, 144, 141}, {39, 173, 129},
                                          {92, 200, 99},  {170, 220, 50}, {253, 231, 37}};
  if (!(t > 0)) t = 0;  // also NaN
  t = std::min(t, 1.0) * 8;
  const int i = std::min(7, static_cast<int>(t));
  const double f = t - i;
  uint8_t c[3];
  for (int k = 0; k < 3; ++k) {
    c[k] = static_cast<uint8_t>(std::lround(kStops[i][k] + f * (kStops[i + 1][k] - kStops[i][k])));
  }
  return Rgb{c[0], c[1], c[2]};
}

}  // namespace posenc::cli
