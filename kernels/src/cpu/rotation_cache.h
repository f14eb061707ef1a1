// RoPE slot rotations by position, kept from call to call by the CPU
// backend. Internal to the kernel library.
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
// Bounds: a frequency set gets a table the second time a call brings it; a
// table covers positions [0, kMaxCachedPosition); its rows are allocated
// kChunk positions at a time, from a byte budget shared by the cache's
// tables, and kept while the table is; a cache keeps at most kMaxTables
// tables, the least recently used going first. Positions outside a table,
// or beyond the budget, are computed per call as before.
#ifndef POSENC_KERNELS_CPU_ROTATION_CACHE_H_
#define POSENC_KERNELS_CPU_ROTATION_CACHE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "posenc/rope.h"

namespace posenc::internal {

// The rotations of one frequency set (inv_freq, attention scale, direction)
// by position, filled on first use; safe to read and fill from any number
// of threads.
class RotationTable {
 public:
  // Positions computed and stored together.
  static constexpr int64_t kChunk = 64;

  // `budget`: bytes this table may still allocate, shared with the other
  // tables of its cache (taken per chunk, given back when the table goes).
  RotationTable(std::vector<double> inv_freq, double scale, bool inverse, int64_t max_positions,
                std::shared_ptr<std::atomic<int64_t>> budget);
  ~RotationTable();
  RotationTable(const RotationTable&) = delete;
  RotationTable& operator=(const RotationTable&) = delete;

  // Position `pos`'s row: R/2 floats s cos(pos f_k), then R/2 floats +-s
  // sin(pos f_k), as RotationsAt gives them. Null when pos is outside [0,
  // the max_positions it was made with) or its chunk does not fit the budget.
  const float* Row(int64_t pos);

  int64_t half() const { return static_cast<int64_t>(inv_freq_.size()); }
  // Whether this table serves a plan's only frequency set.
  bool Matches(const double* inv_freq, int64_t half, double scale, bool inverse) const;

 private:
  const float* FillChunk(int64_t chunk);
  int64_t ChunkBytes() const { return kChunk * 2 * half() * static_cast<int64_t>(sizeof(float)); }
  int64_t NumChunks() const { return (max_positions_ + kChunk - 1) / kChunk; }

  const std::vector<double> inv_freq_;
  const double scale_;
  const bool inverse_;
  const int64_t max_positions_;
  const std::shared_ptr<std::atomic<int64_t>> budget_;
  // One pointer per chunk; null until its rows are published.
  std::unique_ptr<std::atomic<float*>[]> chunks_;
};

// The tables of one CPU backend.
class RotationCache {
 public:
  static constexpr int64_t kMaxCachedPosition = int64_t{1} << 18;
  static constexpr int kMaxTables = 4;
  // Sets seen once that are remembered (by a hash of their key) so that a
  // second call gets them a table.
  static constexpr int kSeenOnce = 16;
  // 16 MiB: 32768 positions of a 128-dim rotary head (part of the server's
  // fixed memory overhead, docs/server.md).
  static constexpr int64_t kDefaultBudgetBytes = int64_t{16} << 20;

  explicit RotationCache(int64_t budget_bytes = kDefaultBudgetBytes,
                         int64_t max_positions = kMaxCachedPosition);

  // The table for plan p's frequencies, made on their second call; null
  // before that and for plans it does not serve (several frequency sets or
  // position axes). Callers hold the pointer for the call: a table evicted
  // meanwhile lives until then.
  std::shared_ptr<RotationTable> For(const RopePlan& p);

  // Bytes the tables may still allocate (for tests).
  int64_t budget_left() const { return budget_->load(); }

 private:
  struct Entry {
    std::shared_ptr<RotationTable> table;
    uint64_t last_use = 0;
  };
  const int64_t max_positions_;
  const std::shared_ptr<std::atomic<int64_t>> budget_;
  std::mutex mu_;
  std::vector<Entry> entries_;       // guarded by mu_
  std::vector<uint64_t> seen_once_;  // guarded by mu_; oldest first
  uint64_t uses_ = 0;                // guarded by mu_
};

}  // namespace posenc::internal

#endif  // POSENC_KERNELS_CPU_ROTATION_CACHE_H_
