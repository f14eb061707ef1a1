#include "cpu/row_cache.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "test_tensors.h"

namespace posenc::internal {
namespace {

std::shared_ptr<std::atomic<int64_t>> Budget(int64_t bytes) {
  return std::make_shared<std::atomic<int64_t>>(bytes);
}

// A fill whose row r holds r * 1000 + k at k, counting the rows it wrote.
RowTable::Fill Counting(int64_t row_floats, std::shared_ptr<std::atomic<int64_t>> filled) {
  return [row_floats, filled](int64_t first, int64_t count, float* rows) {
    for (int64_t r = 0; r < count; ++r) {
      for (int64_t k = 0; k < row_floats; ++k) {
        rows[r * row_floats + k] = static_cast<float>((first + r) * 1000 + k);
      }
    }
    *filled += count;
  };
}

void ExpectRow(RowTable& table, int64_t index) {
  const float* row = table.Row(index);
  ASSERT_NE(row, nullptr) << "row " << index;
  for (int64_t k = 0; k < table.row_floats(); ++k) {
    ASSERT_EQ(row[k], static_cast<float>(index * 1000 + k)) << "row " << index << " float " << k;
  }
}

TEST(RowTable, ChunksHoldUpTo64RowsOfAbout32KiB) {
  const auto budget = Budget(int64_t{1} << 30);
  const auto filled = std::make_shared<std::atomic<int64_t>>(0);
  // 128 floats (a 128-dim rotary head): 64 rows of 512 bytes.
  EXPECT_EQ(RowTable("", 128, 10, Counting(128, filled), budget).rows_per_chunk(), 64);
  EXPECT_EQ(RowTable("", 4, 10, Counting(4, filled), budget).rows_per_chunk(), 64);
  // 4096 floats (a 4096-wide anchor row, 16 KiB): 2 rows.
  EXPECT_EQ(RowTable("", 4096, 10, Counting(4096, filled), budget).rows_per_chunk(), 2);
  EXPECT_EQ(RowTable("", 3000, 10, Counting(3000, filled), budget).rows_per_chunk(), 2);
  EXPECT_EQ(RowTable("", 20000, 10, Counting(20000, filled), budget).rows_per_chunk(), 1);
  EXPECT_EQ(filled->load(), 0) << "nothing is filled before it is asked for";
}

TEST(RowTable, RowsAreTheFillsAndEachChunkIsFilledOnce) {
  for (const int64_t row_floats : {int64_t{1}, int64_t{100}, int64_t{5000}}) {
    const auto filled = std::make_shared<std::atomic<int64_t>>(0);
    RowTable table("k", row_floats, 300, Counting(row_floats, filled), Budget(int64_t{1} << 30));
    const int64_t per = table.rows_per_chunk();
    for (int64_t index : {int64_t{0}, per - 1, per, int64_t{299}}) ExpectRow(table, index);
    const int64_t after_ends = filled->load();
    EXPECT_EQ(after_ends, 3 * per) << row_floats;
    std::uniform_int_distribution<int64_t> any(0, 299);
    for (int i = 0; i < 100; ++i) ExpectRow(table, any(testing::Rng()));
    for (int64_t index : {int64_t{0}, per - 1, per, int64_t{299}}) ExpectRow(table, index);
    EXPECT_LE(filled->load(), (300 + per - 1) / per * per) << "a chunk filled twice";
  }
}

TEST(RowTable, OutOfRangeAndOverBudgetGiveNull) {
  const auto filled = std::make_shared<std::atomic<int64_t>>(0);
  const int64_t chunk = 64 * 16 * 4;
  const auto budget = Budget(2 * chunk + 100);
  {
    RowTable table("", 16, 1000, Counting(16, filled), budget);
    ASSERT_EQ(table.chunk_bytes(), chunk);
    EXPECT_EQ(table.Row(-1), nullptr);
    EXPECT_EQ(table.Row(1000), nullptr);
    EXPECT_NE(table.Row(5), nullptr);
    EXPECT_NE(table.Row(900), nullptr);
    EXPECT_EQ(table.Row(300), nullptr) << "a third chunk over the budget";
    EXPECT_EQ(budget->load(), 100);
    ExpectRow(table, 63);  // the chunks taken still serve
  }
  EXPECT_EQ(budget->load(), 2 * chunk + 100) << "a table gives its bytes back";
}

// Readers racing on the same chunks (released together) all get whole,
// correct rows, and each chunk is kept once: the losers of a race give their
// bytes back.
TEST(RowTable, ConcurrentReadersShareOneCopyOfEachChunk) {
  const int64_t start = int64_t{1} << 30;
  const auto budget = Budget(start);
  const auto filled = std::make_shared<std::atomic<int64_t>>(0);
  RowTable table("", 128, 640, Counting(128, filled), budget);
  std::atomic<int> waiting{8}, wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      --waiting;
      while (waiting.load() > 0) {
      }
      for (int64_t i = 0; i < 640; ++i) {
        const int64_t index = (i * 7 + t % 2) % 640;  // pairs of threads in step
        const float* row = table.Row(index);
        if (row == nullptr) {
          ++wrong;
          continue;
        }
        for (int64_t k = 0; k < 128; ++k) {
          if (row[k] != static_cast<float>(index * 1000 + k)) ++wrong;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(budget->load(), start - 10 * table.chunk_bytes());
}

// The table for `key` from its second call on.
std::shared_ptr<RowTable> Kept(RowCache& cache, const std::string& key, int64_t row_floats = 16) {
  const auto filled = std::make_shared<std::atomic<int64_t>>(0);
  const auto make = [&] { return Counting(row_floats, filled); };
  std::shared_ptr<RowTable> t = cache.For({key}, row_floats, make);
  return t != nullptr ? t : cache.For({key}, row_floats, make);
}

std::string RandomKey() {
  std::string key(24, '\0');
  for (char& c : key) c = static_cast<char>(testing::Rng()());
  return key;
}

// KeyEndsMatch compares the length and the first and last 64 bytes,
// across parts, and nothing between.
TEST(RowTable, KeyEndsMatchComparesTheLengthAndBothEnds) {
  for (const size_t length : {size_t{1}, size_t{64}, size_t{128}, size_t{129}, size_t{1000}}) {
    std::string key(length, '\0');
    for (char& c : key) c = static_cast<char>(testing::Rng()());
    const auto filled = std::make_shared<std::atomic<int64_t>>(0);
    RowTable table(key, 4, 10, Counting(4, filled), Budget(1 << 20));
    for (size_t split = 0; split <= length; split += std::max<size_t>(1, length / 7)) {
      const std::string a = key.substr(0, split), b = key.substr(split);
      EXPECT_TRUE(table.KeyEndsMatch({a, b})) << length << " split at " << split;
    }
    EXPECT_FALSE(table.KeyEndsMatch({key, "x"})) << length;
    EXPECT_FALSE(table.KeyEndsMatch({key.substr(0, length - 1)})) << length;
    for (size_t i = 0; i < length; ++i) {
      std::string other = key;
      other[i] = static_cast<char>(other[i] ^ 0x10);
      const bool end = i < RowTable::kEndBytes || i + RowTable::kEndBytes >= length;
      EXPECT_EQ(table.KeyEndsMatch({other.substr(0, i / 2), other.substr(i / 2)}), !end)
          << length << " byte " << i;
      EXPECT_FALSE(table.HasKey({other})) << length << " byte " << i;
    }
  }
}

TEST(RowCache, OneTablePerKey) {
  RowCache cache(int64_t{1} << 30, 100);
  const std::string key = RandomKey();
  const auto a = Kept(cache, key);
  ASSERT_NE(a, nullptr);
  EXPECT_TRUE(a->HasKey({key}));
  EXPECT_TRUE(a->HasKey({key.substr(0, 10), key.substr(10)})) << "in parts";
  EXPECT_FALSE(a->HasKey({key, "x"}));
  EXPECT_FALSE(a->HasKey({key.substr(0, 23)}));
  EXPECT_EQ(Kept(cache, key), a);
  std::string other = key;
  other.back() = static_cast<char>(other.back() ^ 1);
  EXPECT_NE(Kept(cache, other), a) << "one bit away";
  EXPECT_NE(Kept(cache, key.substr(0, 23)), a) << "a prefix";
}

// Keys that never repeat get no table and push out none; a key's second
// call gets one, even after others came between, until kSeenOnce others
// have.
TEST(RowCache, AKeyGetsATableOnItsSecondCall) {
  const int64_t start = int64_t{1} << 30;
  RowCache cache(start, 100);
  const std::string used_key = RandomKey();
  const auto used = Kept(cache, used_key);
  ASSERT_NE(used, nullptr);
  const auto never = [] { return RowTable::Fill([](int64_t, int64_t, float*) { FAIL(); }); };
  std::vector<std::string> once;
  for (int i = 0; i < 3 * RowCache::kMaxTables; ++i) {
    once.push_back(RandomKey());
    EXPECT_EQ(cache.For({once.back()}, 16, never), nullptr) << i;
  }
  EXPECT_EQ(cache.For({used_key}, 16, never), used) << "never pushed out";
  EXPECT_NE(cache.For({once[0]}, 16, never), nullptr) << "second call";
  for (int i = 0; i < RowCache::kSeenOnce; ++i) {
    EXPECT_EQ(cache.For({RandomKey()}, 16, never), nullptr);
  }
  EXPECT_EQ(cache.For({once[1]}, 16, never), nullptr) << "forgotten";
  EXPECT_EQ(cache.budget_left(), start) << "nothing filled";
}

TEST(RowCache, EvictsTheLeastRecentlyUsedButKeepsHeldTables) {
  const int64_t start = int64_t{1} << 30;
  RowCache cache(start, 100);
  std::vector<std::string> keys;
  for (int i = 0; i <= RowCache::kMaxTables; ++i) keys.push_back(RandomKey());
  std::shared_ptr<RowTable> first = Kept(cache, keys[0]);
  ASSERT_NE(first, nullptr);
  ASSERT_NE(first->Row(10), nullptr);
  std::weak_ptr<RowTable> second = Kept(cache, keys[1]);
  for (int i = 2; i < RowCache::kMaxTables; ++i) Kept(cache, keys[i]);
  EXPECT_FALSE(second.expired()) << "the cache holds it";
  // Key 1 is now the least recently used: the next new key replaces it.
  EXPECT_EQ(Kept(cache, keys[0]), first);
  for (int i = 2; i < RowCache::kMaxTables; ++i) Kept(cache, keys[i]);
  Kept(cache, keys[RowCache::kMaxTables]);
  EXPECT_TRUE(second.expired()) << "key 1 was evicted";
  EXPECT_EQ(Kept(cache, keys[0]), first);
  // Evict key 0 while it is held: the holder's rows stay readable, and its
  // bytes come back when it is let go.
  for (int i = 0; i < RowCache::kMaxTables; ++i) Kept(cache, RandomKey());
  const std::weak_ptr<RowTable> held = first;
  ExpectRow(*first, 10);
  EXPECT_EQ(cache.budget_left(), start - first->chunk_bytes());
  first.reset();
  EXPECT_TRUE(held.expired());
  EXPECT_EQ(cache.budget_left(), start);
}

}  // namespace
}  // namespace posenc::internal
