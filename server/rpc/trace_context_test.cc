#include "rpc/trace_context.h"

#include <random>
#include <string>

#include "gtest/gtest.h"
#include "test_tensors.h"

namespace posenc::server {
namespace {

std::string RandomHex(size_t n) {
  static const char kDigits[] = "0123456789abcdef";
  std::uniform_int_distribution<int> digit(0, 15);
  std::string s;
  for (size_t i = 0; i < n; ++i) s += kDigits[digit(testing::Rng())];
  return s;
}

TEST(TraceContext, TheSpecificationsExample) {
  EXPECT_EQ(TraceIdOf("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(TraceIdOf("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"),
            "4bf92f3577b34da6a3ce929d0e0e4736");
}

// Random valid values give their trace id back; each one broken in one
// place (every position, every kind of wrong character) gives nothing.
TEST(TraceContext, RandomValuesAndEachOneBrokenInOnePlace) {
  for (int round = 0; round < 200; ++round) {
    std::string trace = RandomHex(32), parent = RandomHex(16);
    trace[round % 32] = '1';  // not all zeros
    parent[round % 16] = 'a';
    const std::string v = "00-" + trace + "-" + parent + "-" + RandomHex(2);
    ASSERT_EQ(TraceIdOf(v), trace) << v;
    for (size_t i = 0; i < v.size(); ++i) {
      for (char bad : {'G', 'A', 'F', 'x', ' ', '-', '\0', '\xff'}) {
        std::string broken = v;
        if (broken[i] == bad) continue;
        broken[i] = bad;
        EXPECT_EQ(TraceIdOf(broken), "") << "position " << i << " of " << broken;
      }
    }
    EXPECT_EQ(TraceIdOf(v.substr(0, v.size() - 1)), "");
    EXPECT_EQ(TraceIdOf(v + "-"), "") << "version 00 has exactly four fields";
    EXPECT_EQ(TraceIdOf(v + "0"), "");
  }
}

TEST(TraceContext, ZerosAndVersions) {
  const std::string trace = "4bf92f3577b34da6a3ce929d0e0e4736", parent = "00f067aa0ba902b7";
  EXPECT_EQ(TraceIdOf("00-" + std::string(32, '0') + "-" + parent + "-01"), "");
  EXPECT_EQ(TraceIdOf("00-" + trace + "-" + std::string(16, '0') + "-01"), "");
  EXPECT_EQ(TraceIdOf("ff-" + trace + "-" + parent + "-01"), "") << "ff is not a version";
  // A later version may append fields after a '-', and is read for the four
  // it shares with 00.
  EXPECT_EQ(TraceIdOf("01-" + trace + "-" + parent + "-01"), trace);
  EXPECT_EQ(TraceIdOf("cc-" + trace + "-" + parent + "-01-what-comes-later"), trace);
  EXPECT_EQ(TraceIdOf("cc-" + trace + "-" + parent + "-01what"), "");
  EXPECT_EQ(TraceIdOf(""), "");
  EXPECT_EQ(TraceIdOf(std::string(4096, '0')), "");
}

}  // namespace
}  // namespace posenc::server
