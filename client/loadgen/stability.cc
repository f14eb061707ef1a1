#include "stability.h"

#include <cmath>

namespace posenc::loadgen {
namespace {

bool Agree(double a, double b, double c, double percentage) {
  const double mean = (a + b + c) / 3;
  if (!(mean > 0)) return false;
  const double allowed = mean * percentage / 100;
  return std::abs(a - mean) <= allowed && std::abs(b - mean) <= allowed &&
         std::abs(c - mean) <= allowed;
}

}  // namespace

bool IsStable(const std::vector<Window>& windows, double percentage) {
  if (windows.size() < kStableWindows) return false;
  const Window* w = &windows[windows.size() - kStableWindows];
  return Agree(w[0].requests_per_s, w[1].requests_per_s, w[2].requests_per_s, percentage) &&
         Agree(w[0].p50_us, w[1].p50_us, w[2].p50_us, percentage);
}

}  // namespace posenc::loadgen
