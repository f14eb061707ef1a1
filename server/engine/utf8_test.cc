#include "engine/utf8.h"

#include <random>
#include <string>

#include "gtest/gtest.h"

namespace posenc::server {
namespace {

TEST(Utf8, SequencesAreMeasuredAndMalformedOnesRefused) {
  EXPECT_EQ(Utf8SequenceAt("a", 0), 1u);
  EXPECT_EQ(Utf8SequenceAt("\xc3\xa9", 0), 2u);          // é
  EXPECT_EQ(Utf8SequenceAt("\xe2\x82\xac", 0), 3u);      // €
  EXPECT_EQ(Utf8SequenceAt("\xf0\x9f\x98\x80", 0), 4u);  // U+1F600
  for (const char* bad : {"\x80", "\xc0\xaf", "\xe0\x80\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80",
                          "\xe2\x82", "\xff"}) {
    EXPECT_EQ(Utf8SequenceAt(bad, 0), 0u) << bad;
  }
}

TEST(Utf8, ValidUtf8ReplacesEachBadByte) {
  EXPECT_EQ(ValidUtf8("a\xffz"), "a\xef\xbf\xbdz");
  EXPECT_EQ(ValidUtf8("\xe2\x82"), "\xef\xbf\xbd\xef\xbf\xbd");
  EXPECT_EQ(ValidUtf8("ok \xe2\x82\xac"), "ok \xe2\x82\xac");
}

TEST(Utf8, PrefixNeverSplitsACharacter) {
  std::string euros;
  for (int i = 0; i < 100; ++i) euros += "\xe2\x82\xac";
  for (size_t max = 0; max <= euros.size() + 1; ++max) {
    const std::string p = Utf8Prefix(euros, max);
    EXPECT_LE(p.size(), max);
    EXPECT_EQ(p.size(), std::min(euros.size(), max / 3 * 3)) << max;
    EXPECT_EQ(euros.rfind(p, 0), 0u);
  }
  // Random bytes, cut anywhere: always valid, never longer than asked.
  const uint32_t seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  for (int i = 0; i < 1000; ++i) {
    std::string s(rng() % 64, '\0');
    for (char& c : s) c = static_cast<char>(rng());
    const std::string p = Utf8Prefix(s, rng() % 64);
    for (size_t j = 0; j < p.size();) {
      const size_t n = Utf8SequenceAt(p, j);
      ASSERT_GT(n, 0u) << "invalid at " << j;
      j += n;
    }
  }
}

}  // namespace
}  // namespace posenc::server
