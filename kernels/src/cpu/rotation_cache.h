// RoPE slot rotations by position, kept from call to call by the CPU
// backend (a RowCache, row_cache.h). Internal to the kernel library.
//
// Every RoPE call needs, per token, the float32 rotation (c, n) of each of
// its R/2 slots: a double-precision angle reduction and a float sine and
// cosine each (math/angle.h). A model's calls repeat the same frequencies
// and the same positions, so the CPU backend keeps them, as vLLM keeps a
// cos_sin_cache per model: rows are computed the first time a position is
// asked for and read after that: once a model's rows are kept, 0.09 fewer
// instructions an element in every RoPE case (4-5%), and on one AVX2 core
// 6-12% of a bfloat16 NEOX call's time (bench/RESULTS.md, "RoPE rotations
// kept by position"). Rows are filled by the kernel's own RotationsAt
// (math/rope_math.h), so a call's output is bit for bit the same whether its
// rows came from here or were computed.
//
// A table serves one frequency set (inv_freq, attention scale, direction)
// and positions [0, kMaxCachedPosition); row pos is R/2 floats s cos(pos
// f_k), then R/2 floats +-s sin(pos f_k), as RotationsAt gives them.
#ifndef POSENC_KERNELS_CPU_ROTATION_CACHE_H_
#define POSENC_KERNELS_CPU_ROTATION_CACHE_H_

#include <cstdint>
#include <memory>

#include "cpu/row_cache.h"
#include "posenc/rope.h"

namespace posenc::internal {

class RotationCache {
 public:
  static constexpr int64_t kMaxCachedPosition = int64_t{1} << 18;
  // 16 MiB: 32768 positions of a 128-dim rotary head (part of the server's
  // fixed memory overhead, docs/server.md).
  static constexpr int64_t kDefaultBudgetBytes = int64_t{16} << 20;

  explicit RotationCache(int64_t budget_bytes = kDefaultBudgetBytes,
                         int64_t max_positions = kMaxCachedPosition)
      : rows_(budget_bytes, max_positions) {}

  // The table for plan p's frequencies, made on their second call; null
  // before that and for plans it does not serve (several frequency sets or
  // position axes). Callers hold the pointer for the call.
  std::shared_ptr<RowTable> For(const RopePlan& p);

  // Whether `table` may be the one For(p) gives (its rows are a function of
  // p's frequencies, attention scale and direction, bit for bit): its key's
  // length and ends (RowTable::KeyEndsMatch), a cheap check for a kernel.
  static bool Serves(const RowTable& table, const RopePlan& p);

  // Bytes the tables may still allocate (for tests).
  int64_t budget_left() const { return rows_.budget_left(); }

 private:
  RowCache rows_;
};

}  // namespace posenc::internal

#endif  // POSENC_KERNELS_CPU_ROTATION_CACHE_H_
