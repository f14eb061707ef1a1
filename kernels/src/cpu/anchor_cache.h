// The sinusoidal add's anchor rows by anchor, kept from call to call by the
// CPU backend (a RowCache, row_cache.h). Internal to the kernel library.
//
// A sinusoidal PE element is its anchor's sine and cosine rotated by its
// offset's (math/phase.h): positions share an anchor in runs of 16, and a
// call computes each anchor row it reaches, sin and cos of anchor * w_i for
// every frequency: about 14 instructions a frequency on an AVX2 core, 0.4
// an element of a bfloat16 [4096, 4096] call (a sixth of it) and a fifth
// of its time there. A model's calls repeat the same frequencies and
// positions, so the backend keeps the rows, as it keeps RoPE's rotations
// (rotation_cache.h).
//
// A table serves one plan's phase steps (the frequencies, bit for bit) and
// anchors 0, 16, ... below kMaxCachedPosition, in the layout the kernel
// keeps its own anchor rows in (AnchorRowsInPairs): row j is anchor 16 j's
// F = phase_step.size() values sin_i = sin(16 j w_i), then its F values cos_i
// (halves), or [sin_i, cos_i] for each i, then [cos_i, -sin_i] for each i
// (pairs), sin_i and cos_i as SinCosOfPosition gives them: what the kernel
// computes for that anchor, bit for bit. Negative anchors are computed per
// call.
#ifndef POSENC_KERNELS_CPU_ANCHOR_CACHE_H_
#define POSENC_KERNELS_CPU_ANCHOR_CACHE_H_

#include <cstdint>
#include <memory>

#include "cpu/row_cache.h"
#include "posenc/absolute.h"

namespace posenc::internal {

class AnchorCache {
 public:
  static constexpr int64_t kMaxCachedPosition = int64_t{1} << 18;
  // 16 MiB: 16384 positions of a 4096-wide model, 65536 of a 1024-wide one
  // (part of the server's fixed memory overhead, docs/server.md).
  static constexpr int64_t kDefaultBudgetBytes = int64_t{16} << 20;

  explicit AnchorCache(int64_t budget_bytes = kDefaultBudgetBytes,
                       int64_t max_positions = kMaxCachedPosition);

  // The table for plan p's frequencies, made on their second call; null
  // before that and for plans whose kernel reads no kept rows (learned
  // tables, float16, PE only, an x_scale of 0: ReadsAnchorRows). Callers
  // hold the pointer for the call.
  std::shared_ptr<RowTable> For(const AbsolutePlan& p);

  // Whether `table` may be the one For(p) gives (its rows are a function of
  // p's phase steps, bit for bit, and their layout): its key's length and
  // ends (RowTable::KeyEndsMatch), a cheap check for a kernel.
  static bool Serves(const RowTable& table, const AbsolutePlan& p);

  // Bytes the tables may still allocate (for tests).
  int64_t budget_left() const { return rows_.budget_left(); }

 private:
  RowCache rows_;
};

}  // namespace posenc::internal

#endif  // POSENC_KERNELS_CPU_ANCHOR_CACHE_H_
