#include "cpu/anchor_cache.h"

#include <array>
#include <string_view>
#include <utility>
#include <vector>

#include "cpu/cpu_kernels.h"
#include "math/phase.h"

namespace posenc::internal {
namespace {

// Rows of anchors 16 first, ..., 16 (first + count - 1), in the kernel's
// layout (anchor_cache.h). Compiled per instruction set like the kernels,
// so that the call that first reaches an anchor pays about what computing
// it there would.
POSENC_CPU_CLONES void FillAnchorRows(const uint64_t* step, int64_t frequencies, bool pairs,
                                      int64_t first, int64_t count, float* rows) {
  const int64_t row_floats = (pairs ? 4 : 2) * frequencies;
  for (int64_t j = 0; j < count; ++j) {
    float* a = rows + j * row_floats;
    float* b = a + row_floats / 2;
    const int64_t anchor = (first + j) * kPhaseAnchorStride;
    for (int64_t i = 0; i < frequencies; ++i) {
      float sn, cs;
      SinCosOfPosition(anchor, step[i], &sn, &cs);
      if (pairs) {
        a[2 * i] = sn;
        a[2 * i + 1] = cs;
        b[2 * i] = cs;
        b[2 * i + 1] = -sn;
      } else {
        a[i] = sn;
        b[i] = cs;
      }
    }
  }
}

// The key of a plan: its phase steps where they lie, and the layout.
std::array<std::string_view, 2> KeyOf(const AbsolutePlan& p) {
  return {std::string_view(reinterpret_cast<const char*>(p.phase_step.data()),
                           p.phase_step.size() * sizeof(uint64_t)),
          std::string_view(AnchorRowsInPairs(p) ? "\1" : "\0", 1)};
}

}  // namespace

AnchorCache::AnchorCache(int64_t budget_bytes, int64_t max_positions)
    : rows_(budget_bytes, (max_positions + kPhaseAnchorStride - 1) / kPhaseAnchorStride) {}

bool AnchorCache::Serves(const RowTable& table, const AbsolutePlan& p) {
  const int64_t frequencies = static_cast<int64_t>(p.phase_step.size());
  return table.row_floats() == (AnchorRowsInPairs(p) ? 4 : 2) * frequencies &&
         table.KeyEndsMatch(KeyOf(p));
}

std::shared_ptr<RowTable> AnchorCache::For(const AbsolutePlan& p) {
  if (p.options.kind == AbsoluteOptions::Kind::kLearned || p.phase_step.empty()) return nullptr;
  const int64_t frequencies = static_cast<int64_t>(p.phase_step.size());
  const bool pairs = AnchorRowsInPairs(p);
  return rows_.For(KeyOf(p), (pairs ? 4 : 2) * frequencies, [&]() -> RowTable::Fill {
    return [step = p.phase_step, pairs](int64_t first, int64_t count, float* rows) {
      FillAnchorRows(step.data(), static_cast<int64_t>(step.size()), pairs, first, count, rows);
    };
  });
}

}  // namespace posenc::internal
