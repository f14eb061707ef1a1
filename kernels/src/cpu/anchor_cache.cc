#include "cpu/anchor_cache.h"

#include <array>
#include <string_view>
#include <utility>
#include <vector>

#include "cpu/cpu_kernels.h"
#include "math/phase.h"  // kPhaseAnchorStride

namespace posenc::internal {
namespace {

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
  return table.KeyEndsMatch(KeyOf(p));  // the key's length holds the row's
}

std::shared_ptr<RowTable> AnchorCache::For(const AbsolutePlan& p) {
  // A table the kernel would not read costs a comparison of the key every
  // call, and a place among the kept tables.
  if (!ReadsAnchorRows(p) || p.phase_step.empty()) return nullptr;
  const bool pairs = AnchorRowsInPairs(p);
  return rows_.For(KeyOf(p), AnchorRowFloats(p), [&]() -> RowTable::Fill {
    return [step = p.phase_step, pairs](int64_t first, int64_t count, float* rows) {
      FillAnchorRows(step.data(), static_cast<int64_t>(step.size()), pairs, first, count, rows);
    };
  });
}

}  // namespace posenc::internal
