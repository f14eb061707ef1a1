#include "cpu/rotation_cache.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <utility>

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

}  // namespace

RotationTable::RotationTable(std::vector<double> inv_freq, double scale, bool inverse,
                             int64_t max_positions, std::shared_ptr<std::atomic<int64_t>> budget)
    : inv_freq_(std::move(inv_freq)),
      scale_(scale),
      inverse_(inverse),
      max_positions_(std::max<int64_t>(0, max_positions)),
      budget_(std::move(budget)),
      chunks_(new std::atomic<float*>[NumChunks()]) {
  for (int64_t i = 0; i < NumChunks(); ++i) chunks_[i] = nullptr;
}

RotationTable::~RotationTable() {
  int64_t freed = 0;
  for (int64_t i = 0; i < NumChunks(); ++i) {
    if (float* rows = chunks_[i].load(std::memory_order_acquire)) {
      delete[] rows;
      freed += ChunkBytes();
    }
  }
  budget_->fetch_add(freed);
}

bool RotationTable::Matches(const double* inv_freq, int64_t half, double scale,
                            bool inverse) const {
  // Bitwise: the rows are a function of these exact doubles.
  return half == this->half() && inverse == inverse_ &&
         std::memcmp(&scale, &scale_, sizeof scale) == 0 &&
         std::memcmp(inv_freq, inv_freq_.data(), half * sizeof(double)) == 0;
}

const float* RotationTable::Row(int64_t pos) {
  if (pos < 0 || pos >= max_positions_) return nullptr;
  const int64_t chunk = pos / kChunk;
  const float* rows = chunks_[chunk].load(std::memory_order_acquire);
  if (rows == nullptr) rows = FillChunk(chunk);
  if (rows == nullptr) return nullptr;
  return rows + (pos - chunk * kChunk) * 2 * half();
}

const float* RotationTable::FillChunk(int64_t chunk) {
  const int64_t bytes = ChunkBytes();
  // A spent budget is the common case past it (every token of a long
  // context): a plain load, not two writes to a line every thread shares.
  if (budget_->load(std::memory_order_relaxed) < bytes) return nullptr;
  // Take the chunk's bytes from the budget first; give them back if another
  // thread publishes the chunk first, or the budget was spent meanwhile.
  if (budget_->fetch_sub(bytes) < bytes) {
    budget_->fetch_add(bytes);
    return nullptr;
  }
  float* rows = new (std::nothrow) float[kChunk * 2 * half()];
  if (rows == nullptr) {
    budget_->fetch_add(bytes);
    return nullptr;
  }
  FillRows(inv_freq_.data(), half(), scale_, inverse_, chunk * kChunk, kChunk, rows);
  float* expected = nullptr;
  if (chunks_[chunk].compare_exchange_strong(expected, rows, std::memory_order_acq_rel)) {
    return rows;
  }
  delete[] rows;
  budget_->fetch_add(bytes);
  return expected;
}

RotationCache::RotationCache(int64_t budget_bytes, int64_t max_positions)
    : max_positions_(max_positions),
      budget_(std::make_shared<std::atomic<int64_t>>(budget_bytes)) {}

namespace {

// FNV-1a over the bytes that make a table's key.
uint64_t KeyHash(const double* inv_freq, int64_t half, double scale, bool inverse) {
  uint64_t h = 1469598103934665603ull;
  const auto mix = [&h](const void* data, size_t n) {
    const auto* b = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  mix(inv_freq, half * sizeof(double));
  mix(&scale, sizeof scale);
  mix(&inverse, sizeof inverse);
  return h;
}

}  // namespace

std::shared_ptr<RotationTable> RotationCache::For(const RopePlan& p) {
  if (p.num_axes != 1 || p.num_freq_sets != 1 || p.half() <= 0) return nullptr;
  const double* inv_freq = p.inv_freq.data();
  const double scale = p.attention_scale[0];
  std::lock_guard<std::mutex> lock(mu_);
  ++uses_;
  for (Entry& e : entries_) {
    if (e.table->Matches(inv_freq, p.half(), scale, p.inverse)) {
      e.last_use = uses_;
      return e.table;
    }
  }
  // A set gets a table the second time it is seen. Sets that never repeat
  // (dynamic NTK's frequencies change with every length, so decoding past
  // the original context makes a new set per step) would otherwise each
  // fill a chunk for one token and push out the tables that are used.
  const uint64_t key = KeyHash(inv_freq, p.half(), scale, p.inverse);
  const auto seen = std::find(seen_once_.begin(), seen_once_.end(), key);
  if (seen == seen_once_.end()) {
    if (static_cast<int>(seen_once_.size()) >= kSeenOnce) seen_once_.erase(seen_once_.begin());
    seen_once_.push_back(key);
    return nullptr;
  }
  seen_once_.erase(seen);
  if (static_cast<int>(entries_.size()) >= kMaxTables) {
    // The least recently used goes; calls still holding it keep it alive.
    auto oldest =
        std::min_element(entries_.begin(), entries_.end(),
                         [](const Entry& a, const Entry& b) { return a.last_use < b.last_use; });
    entries_.erase(oldest);
  }
  entries_.push_back(
      Entry{std::make_shared<RotationTable>(std::vector<double>(inv_freq, inv_freq + p.half()),
                                            scale, p.inverse, max_positions_, budget_),
            uses_});
  return entries_.back().table;
}

}  // namespace posenc::internal
