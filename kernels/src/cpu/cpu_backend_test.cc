// The CPU backend's thread count under a cgroup v2 CPU limit (cpu.max), as
// a Kubernetes pod's: the quota rounded up to whole CPUs, never above the
// CPUs the process may use, and anything that does not parse ignored.
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "posenc/backend.h"

namespace posenc {
namespace {

TEST(CpusWithinQuota, RoundsTheQuotaUpToWholeCpus) {
  EXPECT_EQ(CpusWithinQuota("200000 100000\n", 16), 2);
  EXPECT_EQ(CpusWithinQuota("150000 100000", 16), 2);
  EXPECT_EQ(CpusWithinQuota("50000 100000", 16), 1);
  EXPECT_EQ(CpusWithinQuota("1 100000", 16), 1);
  EXPECT_EQ(CpusWithinQuota("1600000 100000", 4), 4) << "never above the usable CPUs";
}

TEST(CpusWithinQuota, NoLimitOrAnythingUnreadableLeavesTheCpus) {
  constexpr int64_t kMax = INT64_MAX;
  for (const std::string& line :
       {std::string("max 100000"), std::string(""), std::string("100000"), std::string("0 100000"),
        std::string("-5 100000"), std::string("100000 0"), std::string("100000 -1"),
        std::string("1e5 100000"), std::string("100000 100000 7"),
        std::string("99999999999999999999 100000"), std::string("100000 99999999999999999999")}) {
    EXPECT_EQ(CpusWithinQuota(line, 6), 6) << "\"" << line << "\"";
  }
  // The largest numbers, where quota + period - 1 would overflow.
  EXPECT_EQ(CpusWithinQuota(absl::StrCat(kMax, " 100000"), 6), 6);
  EXPECT_EQ(CpusWithinQuota(absl::StrCat(kMax, " ", kMax), 6), 1);
  EXPECT_EQ(CpusWithinQuota(absl::StrCat("300000 ", kMax), 6), 1);
}

TEST(UsableCpus, IsAtLeastOne) { EXPECT_GE(UsableCpus(), 1); }

}  // namespace
}  // namespace posenc
