// Rows of float32 numbers by index, computed the first time an index is
// asked for and kept from call to call by the CPU backend: the machinery
// shared by its per-model tables (rotation_cache.h: RoPE slot rotations by
// position; anchor_cache.h: the sinusoidal add's anchor rows). Internal to
// the kernel library.
//
// A table's rows are a pure function of its key (the exact bytes of what
// they are computed from) and their index, filled by the kernel's own
// arithmetic, so a call's output is bit for bit the same whether its rows
// came from a table or were computed in the call.
//
// Bounds: a key gets a table the second time it is asked for (keys that
// never repeat, such as dynamic NTK's per-length frequencies, would each
// fill a chunk for one call and push out the tables that are used); a table
// covers indices [0, max_rows); its rows are allocated a chunk at a time
// (about kChunkBytes), from a byte budget shared by the cache's tables, and
// kept while the table is; a cache keeps at most kMaxTables tables, the
// least recently used going first. Indices outside a table, or beyond the
// budget, get no row: the caller computes them as it would without one.
#ifndef POSENC_KERNELS_CPU_ROW_CACHE_H_
#define POSENC_KERNELS_CPU_ROW_CACHE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/types/span.h"

namespace posenc::internal {

// A key in parts, read as their concatenation: callers name the bytes
// their rows are a function of where they lie, and no call copies them
// (a 4096-wide model's phase steps are 16 KiB) but the one that makes a
// table.
using KeyParts = absl::Span<const std::string_view>;

// The rows of one key, filled on first use; safe to read and fill from any
// number of threads.
class RowTable {
 public:
  // Writes rows [first, first + count), row_floats() floats each, to rows.
  using Fill = std::function<void(int64_t first, int64_t count, float* rows)>;

  // A chunk holds as many rows as fit this many bytes, at least 1 and at
  // most 64: 64 positions of a 128-dim rotary head's rotations. Large rows
  // (a 4096-wide anchor row is 16 KiB) come a few at a time, so that the
  // call that first reaches one does not compute 64 of them.
  static constexpr int64_t kChunkBytes = int64_t{32} << 10;
  static constexpr int64_t kMaxRowsPerChunk = 64;

  // `budget`: bytes this table may still allocate, shared with the other
  // tables of its cache (taken per chunk, given back when the table goes).
  RowTable(std::string key, int64_t row_floats, int64_t max_rows, Fill fill,
           std::shared_ptr<std::atomic<int64_t>> budget);
  ~RowTable();
  RowTable(const RowTable&) = delete;
  RowTable& operator=(const RowTable&) = delete;

  // Row `index`: null when it is outside [0, max_rows) or its chunk does not
  // fit the budget.
  const float* Row(int64_t index);

  // Whether this table's key is `key` (the concatenation of its parts).
  bool HasKey(KeyParts key) const;
  // Whether it may be: the same length, and the same first and last
  // kEndBytes bytes. For a kernel to check, cheaply, that the table it was
  // handed is its plan's: a 4096-wide model's key is 16 KiB, and comparing
  // it all again took a third of a one-token call's instructions
  // (RowCache::For, which gave the table, compared all of it).
  bool KeyEndsMatch(KeyParts key) const;
  static constexpr size_t kEndBytes = 64;
  int64_t row_floats() const { return row_floats_; }
  int64_t rows_per_chunk() const { return rows_per_chunk_; }
  int64_t chunk_bytes() const {
    return rows_per_chunk_ * row_floats_ * static_cast<int64_t>(sizeof(float));
  }

 private:
  const float* FillChunk(int64_t chunk);
  int64_t NumChunks() const { return (max_rows_ + rows_per_chunk_ - 1) / rows_per_chunk_; }

  const std::string key_;
  const int64_t row_floats_;
  const int64_t rows_per_chunk_;
  const int64_t max_rows_;
  const Fill fill_;
  const std::shared_ptr<std::atomic<int64_t>> budget_;
  // One pointer per chunk; null until its rows are published.
  std::unique_ptr<std::atomic<float*>[]> chunks_;
};

// The tables of one kind, keyed by bytes.
class RowCache {
 public:
  static constexpr int kMaxTables = 4;
  // Keys seen once that are remembered (by a hash) so that a second call
  // gets them a table.
  static constexpr int kSeenOnce = 16;

  RowCache(int64_t budget_bytes, int64_t max_rows);

  // The table for `key`, made on the key's second call with rows of
  // row_floats floats and make_fill()'s fill; null on its first. Callers
  // hold the pointer for the call: a table evicted meanwhile lives until
  // then. REQUIRES: row_floats > 0, and the same for every call of a key.
  std::shared_ptr<RowTable> For(KeyParts key, int64_t row_floats,
                                absl::FunctionRef<RowTable::Fill()> make_fill);

  // Bytes the tables may still allocate (for tests).
  int64_t budget_left() const { return budget_->load(); }

 private:
  struct Entry {
    std::shared_ptr<RowTable> table;
    uint64_t last_use = 0;
  };
  const int64_t max_rows_;
  const std::shared_ptr<std::atomic<int64_t>> budget_;
  std::mutex mu_;
  std::vector<Entry> entries_;       // guarded by mu_
  std::vector<uint64_t> seen_once_;  // guarded by mu_; oldest first
  uint64_t uses_ = 0;                // guarded by mu_
};

}  // namespace posenc::internal

#endif  // POSENC_KERNELS_CPU_ROW_CACHE_H_
