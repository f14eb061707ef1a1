#include "cpu/row_cache.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <string>
#include <utility>

namespace posenc::internal {

RowTable::RowTable(std::string key, int64_t row_floats, int64_t max_rows, Fill fill,
                   std::shared_ptr<std::atomic<int64_t>> budget)
    : key_(std::move(key)),
      row_floats_(std::max<int64_t>(1, row_floats)),
      rows_per_chunk_(std::clamp<int64_t>(
          kChunkBytes / (row_floats_ * static_cast<int64_t>(sizeof(float))), 1, kMaxRowsPerChunk)),
      max_rows_(std::max<int64_t>(0, max_rows)),
      fill_(std::move(fill)),
      budget_(std::move(budget)),
      // Value-initialised: all null. One by one, the seq_cst stores cost
      // 12 instructions a chunk, 197 000 for a 4096-wide anchor table's
      // 16 384 (posenc-count-instructions --cold); the table reaches other
      // threads through RowCache's mutex.
      chunks_(new std::atomic<float*>[NumChunks()]()) {}

RowTable::~RowTable() {
  int64_t freed = 0;
  for (int64_t i = 0; i < NumChunks(); ++i) {
    if (float* rows = chunks_[i].load(std::memory_order_acquire)) {
      delete[] rows;
      freed += chunk_bytes();
    }
  }
  budget_->fetch_add(freed);
}

namespace {

size_t SizeOf(KeyParts key) {
  size_t size = 0;
  for (const std::string_view part : key) size += part.size();
  return size;
}

// Whether bytes [lo, hi) of the concatenation of `key` are those of `bytes`.
bool RangeMatches(KeyParts key, const std::string& bytes, size_t lo, size_t hi) {
  size_t at = 0;
  for (const std::string_view part : key) {
    const size_t b = std::max(lo, at), e = std::min(hi, at + part.size());
    if (b < e && std::memcmp(part.data() + (b - at), bytes.data() + b, e - b) != 0) return false;
    at += part.size();
  }
  return true;
}

}  // namespace

bool RowTable::HasKey(KeyParts key) const {
  return SizeOf(key) == key_.size() && RangeMatches(key, key_, 0, key_.size());
}

bool RowTable::KeyEndsMatch(KeyParts key) const {
  const size_t size = key_.size(), ends = std::min(kEndBytes, size);
  return SizeOf(key) == size && RangeMatches(key, key_, 0, ends) &&
         RangeMatches(key, key_, size - ends, size);
}

const float* RowTable::Row(int64_t index) {
  if (index < 0 || index >= max_rows_) return nullptr;
  const int64_t chunk = index / rows_per_chunk_;
  const float* rows = chunks_[chunk].load(std::memory_order_acquire);
  if (rows == nullptr) rows = FillChunk(chunk);
  if (rows == nullptr) return nullptr;
  return rows + (index - chunk * rows_per_chunk_) * row_floats_;
}

const float* RowTable::FillChunk(int64_t chunk) {
  const int64_t bytes = chunk_bytes();
  // A spent budget is the common case past it (every token of a long
  // context): a plain load, not two writes to a line every thread shares.
  if (budget_->load(std::memory_order_relaxed) < bytes) return nullptr;
  // Take the chunk's bytes from the budget first; give them back if another
  // thread publishes the chunk first, or the budget was spent meanwhile.
  if (budget_->fetch_sub(bytes) < bytes) {
    budget_->fetch_add(bytes);
    return nullptr;
  }
  float* rows = new (std::nothrow) float[rows_per_chunk_ * row_floats_];
  if (rows == nullptr) {
    budget_->fetch_add(bytes);
    return nullptr;
  }
  // The last chunk may reach past max_rows: its rows there are filled too
  // (they are well defined) and never handed out.
  fill_(chunk * rows_per_chunk_, rows_per_chunk_, rows);
  float* expected = nullptr;
  if (chunks_[chunk].compare_exchange_strong(expected, rows, std::memory_order_acq_rel)) {
    return rows;
  }
  delete[] rows;
  budget_->fetch_add(bytes);
  return expected;
}

RowCache::RowCache(int64_t budget_bytes, int64_t max_rows)
    : max_rows_(max_rows), budget_(std::make_shared<std::atomic<int64_t>>(budget_bytes)) {}

namespace {

// FNV-1a's steps over a key's 8-byte words (and a part's last few bytes):
// a byte at a time it was 115 000 instructions for a 4096-wide model's 16
// KiB of phase steps. Only for remembering keys seen once, where a
// collision costs no more than a table made one call early.
uint64_t KeyHash(KeyParts key) {
  uint64_t h = 1469598103934665603ull;
  for (const std::string_view part : key) {
    size_t i = 0;
    for (; i + 8 <= part.size(); i += 8) {
      uint64_t word;
      std::memcpy(&word, part.data() + i, 8);
      h = (h ^ word) * 1099511628211ull;
    }
    for (; i < part.size(); ++i) h = (h ^ static_cast<unsigned char>(part[i])) * 1099511628211ull;
  }
  return h;
}

}  // namespace

std::shared_ptr<RowTable> RowCache::For(KeyParts key, int64_t row_floats,
                                        absl::FunctionRef<RowTable::Fill()> make_fill) {
  std::lock_guard<std::mutex> lock(mu_);
  ++uses_;
  for (Entry& e : entries_) {
    if (e.table->HasKey(key)) {
      e.last_use = uses_;
      return e.table;
    }
  }
  // A key gets a table the second time it is seen (row_cache.h).
  const uint64_t hash = KeyHash(key);
  const auto seen = std::find(seen_once_.begin(), seen_once_.end(), hash);
  if (seen == seen_once_.end()) {
    if (static_cast<int>(seen_once_.size()) >= kSeenOnce) seen_once_.erase(seen_once_.begin());
    seen_once_.push_back(hash);
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
  std::string bytes;
  for (const std::string_view part : key) bytes.append(part);
  entries_.push_back(Entry{
      std::make_shared<RowTable>(std::move(bytes), row_floats, max_rows_, make_fill(), budget_),
      uses_});
  return entries_.back().table;
}

}  // namespace posenc::internal
