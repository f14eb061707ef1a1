// The heatmap's colours: a perceptually ordered ramp for finite values
// (viridis-like, dark blue -> teal -> green -> yellow, readable in grey
// print and by most colour-blind readers) and one colour for each kind of
// non-finite value, chosen off that ramp so a masked cell never reads as a
// small number.
#ifndef POSENC_CLI_HEATMAP_COLORS_H_
#define POSENC_CLI_HEATMAP_COLORS_H_

#include "heatmap_canvas.h"

namespace posenc::cli {

// t in [0, 1] (clamped; NaN reads as 0) from the lowest value to the highest.
Rgb RampColor(double t);

// Neutral colours: the ramp never has equal channels, so a grey is always
// told apart from it, and -inf (a masked attention cell) is the common case.
inline constexpr Rgb kNegInfColor{150, 150, 150};
inline constexpr Rgb kPosInfColor{255, 150, 220};  // pink: nowhere on the ramp
inline constexpr Rgb kNanColor{220, 0, 0};         // red: nowhere on the ramp

}  // namespace posenc::cli

#endif  // POSENC_CLI_HEATMAP_COLORS_H_
