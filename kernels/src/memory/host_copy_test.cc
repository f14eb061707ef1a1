#include "posenc/host_copy.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace posenc {
namespace {

constexpr size_t kPage = 4096;

// A page-aligned buffer.
struct Pages {
  explicit Pages(size_t bytes)
      : data(static_cast<char*>(std::aligned_alloc(kPage, (bytes + kPage - 1) / kPage * kPage))) {}
  ~Pages() { std::free(data); }
  Pages(const Pages&) = delete;
  Pages& operator=(const Pages&) = delete;
  char* data;
};

// Every size around the 2 KiB pieces and glibc's thresholds, at source and
// destination offsets that alias (1-63 bytes apart modulo a page, copied
// in pieces) and that do not: the destination holds the source's bytes,
// and the bytes either side of it stay as they were.
TEST(CopyHostBytes, CopiesEveryByteAtEveryDistance) {
  const unsigned seed = std::random_device()();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  constexpr size_t kMax = 300000, kRoom = kMax + 2 * kPage;
  Pages src(kRoom), dst(kRoom);
  for (size_t i = 0; i < kRoom; ++i) src.data[i] = static_cast<char>(rng());
  for (size_t n : {size_t{0}, size_t{1}, size_t{63}, size_t{2047}, size_t{2048}, size_t{2049},
                   size_t{4096}, size_t{5000}, size_t{70001}, kMax}) {
    for (size_t from_at : {size_t{0}, size_t{7}, size_t{100}}) {
      for (size_t distance :
           {size_t{0}, size_t{1}, size_t{16}, size_t{63}, size_t{64}, size_t{4080}}) {
        SCOPED_TRACE(testing::Message()
                     << n << " bytes, source at +" << from_at << ", distance " << distance);
        const size_t to_at = from_at + distance;
        std::memset(dst.data, 0x5a, kRoom);
        CopyHostBytes(dst.data + to_at, src.data + from_at, n);
        ASSERT_EQ(std::memcmp(dst.data + to_at, src.data + from_at, n), 0);
        const auto untouched = [](const char* b, const char* e) {
          return std::find_if(b, e, [](char c) { return c != 0x5a; }) == e;
        };
        ASSERT_TRUE(untouched(dst.data, dst.data + to_at)) << "a byte before was written";
        ASSERT_TRUE(untouched(dst.data + to_at + n, dst.data + kRoom))
            << "a byte after was written";
      }
    }
  }
}

// Into a string whose buffer aliases the source (taken in pieces) and one
// that does not, over longer and shorter earlier contents: the string is
// then exactly the source's bytes.
TEST(AssignHostBytes, TheStringBecomesTheBytes) {
  const unsigned seed = std::random_device()();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  constexpr size_t kBytes = 200000;
  Pages src(kBytes + 2 * kPage);
  for (size_t i = 0; i < kBytes + 2 * kPage; ++i) src.data[i] = static_cast<char>(rng());
  for (size_t distance : {size_t{0}, size_t{16}, size_t{63}, size_t{64}, size_t{1000}}) {
    for (size_t before : {size_t{0}, size_t{10}, kBytes + 5}) {
      for (size_t n : {size_t{0}, size_t{3000}, kBytes}) {
        SCOPED_TRACE(testing::Message() << "distance " << distance << ", " << before
                                        << " bytes before, " << n << " bytes");
        std::string s(before, '\x5a');
        s.reserve(n);
        // A source `distance` bytes before the buffer modulo a page.
        const auto buffer = reinterpret_cast<uintptr_t>(s.data());
        const auto base = reinterpret_cast<uintptr_t>(src.data);
        const size_t from_at = (buffer - distance - base) % kPage;
        AssignHostBytes(&s, src.data + from_at, n);
        ASSERT_EQ(s.size(), n);
        ASSERT_EQ(std::memcmp(s.data(), src.data + from_at, n), 0);
      }
    }
  }
  // Its own bytes, as assign takes them: a stretch of the string itself.
  std::string s(src.data, 5000);
  const std::string tail = s.substr(1000);
  AssignHostBytes(&s, s.data() + 1000, 4000);
  EXPECT_EQ(s, tail);
}

// Ranges share a byte or they do not: touching ends do not, empty ranges
// never do, containment and partial overlap in either order do.
TEST(HostBytesOverlap, OnlySharedBytesCount) {
  char b[64];
  EXPECT_FALSE(HostBytesOverlap(b, 16, b + 16, 16));
  EXPECT_FALSE(HostBytesOverlap(b + 16, 16, b, 16));
  EXPECT_FALSE(HostBytesOverlap(b, 0, b, 16));
  EXPECT_FALSE(HostBytesOverlap(b, 16, b + 8, 0));
  EXPECT_TRUE(HostBytesOverlap(b, 17, b + 16, 16));
  EXPECT_TRUE(HostBytesOverlap(b + 16, 16, b, 17));
  EXPECT_TRUE(HostBytesOverlap(b, 64, b + 10, 1));
  EXPECT_TRUE(HostBytesOverlap(b + 10, 1, b, 64));
}

}  // namespace
}  // namespace posenc
