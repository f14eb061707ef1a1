#include "cpu/rotation_cache.h"

#include <array>
#include <string_view>
#include <utility>
#include <vector>

#include "cpu/cpu_kernels.h"
#include "math/rope_math.h"

namespace posenc::internal {
namespace {

// Rows of positions [first, first + count), each its c then its n.
// Compiled per instruction set like the kernels, so that the call that
// first reaches a position pays about what computing it there would.
POSENC_CPU_CLONES void FillRows(const double* f, int64_t half, double scale, bool inverse,
                                int64_t first, int64_t count, float* rows) {
  for (int64_t i = 0; i < count; ++i) {
    float* c = rows + i * 2 * half;
    RotationsAt(static_cast<double>(first + i), f, half, scale, inverse, c, c + half);
  }
}

// The key of a plan with one set: its frequencies, attention scale and
// direction, where they lie in the plan.
std::array<std::string_view, 3> KeyOf(const RopePlan& p) {
  return {
      std::string_view(reinterpret_cast<const char*>(p.inv_freq.data()), p.half() * sizeof(double)),
      std::string_view(reinterpret_cast<const char*>(p.attention_scale.data()), sizeof(double)),
      std::string_view(p.inverse ? "\1" : "\0", 1)};
}

}  // namespace

bool RotationCache::Serves(const RowTable& table, const RopePlan& p) {
  // The key's length holds the row's (2 half floats).
  return p.num_axes == 1 && p.num_freq_sets == 1 && table.KeyEndsMatch(KeyOf(p));
}

std::shared_ptr<RowTable> RotationCache::For(const RopePlan& p) {
  if (p.num_axes != 1 || p.num_freq_sets != 1 || p.half() <= 0) return nullptr;
  const int64_t half = p.half();
  return rows_.For(KeyOf(p), 2 * half, [&]() -> RowTable::Fill {
    return [f = std::vector<double>(p.inv_freq.begin(), p.inv_freq.begin() + half),
            scale = p.attention_scale[0],
            inverse = p.inverse](int64_t first, int64_t count, float* rows) {
      FillRows(f.data(), static_cast<int64_t>(f.size()), scale, inverse, first, count, rows);
    };
  });
}

}  // namespace posenc::internal
