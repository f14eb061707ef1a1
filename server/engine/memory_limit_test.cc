#include "engine/memory_limit.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "gtest/gtest.h"

namespace posenc::server {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

// This session machine's own lines: a hybrid host, memory in cgroup v1.
constexpr char kHybridMountinfo[] =
    "25 30 0:23 / /sys ro,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw\n"
    "30 25 0:26 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "31 30 0:27 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
    "32 30 0:28 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    "33 30 0:29 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
constexpr char kHybridCgroup[] = "4:memory:/process_api/26bc6aa8\n3:cpuset:/\n1:cpu:/\n0::/\n";

TEST(FindMemoryCgroup, TakesV1MemoryOnAHybridHost) {
  const std::optional<MemoryCgroup> c = FindMemoryCgroup(kHybridMountinfo, kHybridCgroup);
  ASSERT_TRUE(c.has_value());
  EXPECT_FALSE(c->mount.v2);
  EXPECT_EQ(c->mount.mount_point, "/sys/fs/cgroup/memory");
  EXPECT_EQ(c->mount.root, "/");
  EXPECT_EQ(c->path, "/process_api/26bc6aa8");
}

TEST(FindMemoryCgroup, TakesCgroup2WithoutAV1MemoryHierarchy) {
  // Two optional fields before the separator, as a Kubernetes node has.
  const std::optional<MemoryCgroup> c = FindMemoryCgroup(
      "28 22 0:25 /kubepods/pod1/c1 /sys/fs/cgroup rw,nosuid shared:4 master:9 - cgroup2 cgroup2 "
      "rw,nsdelegate\n"
      "31 30 0:27 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu,cpuacct\n",
      "0::/kubepods/pod1/c1\n");
  ASSERT_TRUE(c.has_value());
  EXPECT_TRUE(c->mount.v2);
  EXPECT_EQ(c->mount.root, "/kubepods/pod1/c1");
  EXPECT_EQ(c->mount.mount_point, "/sys/fs/cgroup");
}

TEST(FindMemoryCgroup, TakesTheMountThatHoldsTheProcessesCgroup) {
  // A monitoring pod: the host's whole tree mounted first, its own after.
  const std::string two_views =
      "40 22 0:25 / /host/sys/fs/cgroup ro - cgroup2 cgroup2 rw\n"
      "41 22 0:25 /kubepods/pod1/c1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
  std::optional<MemoryCgroup> c = FindMemoryCgroup(two_views, "0::/kubepods/pod1/c1\n");
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->mount.mount_point, "/sys/fs/cgroup");  // the longest root that holds it
  // Another pod's tree first: it does not hold this process's cgroup.
  c = FindMemoryCgroup(
      "40 22 0:25 /kubepods/pod2 /other rw - cgroup2 cgroup2 rw\n"
      "41 22 0:25 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
      "0::/kubepods/pod1/c1\n");
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->mount.mount_point, "/sys/fs/cgroup");
  // None holds it (a namespace's view): the first.
  c = FindMemoryCgroup("40 22 0:25 /kubepods/pod2 /other rw - cgroup2 cgroup2 rw\n",
                       "0::/kubepods/pod1/c1\n");
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->mount.mount_point, "/other");
}

TEST(MemoryCgroupMounts, DecodesEscapesAndSkipsWhatDoesNotParse) {
  const std::vector<CgroupMount> mounts = MemoryCgroupMounts(
      "garbage\n"
      "1 2 3 4 5 6 7 8 9\n"                                                   // too few fields
      "32 30 0:28 / /cg/memory rw a b c - cgroup\n"                           // fields missing
      "32 30 0:28 / /cg/memory rw a b c d e\n"                                // no separator
      "32 30 0:28 /../x /cg/memory rw - cgroup cgroup rw,memory\n"            // root leaves
      "32 30 0:28 / relative rw - cgroup cgroup rw,memory\n"                  // not absolute
      "31 30 0:27 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"  // not memory
      "30 25 0:26 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"   // not cgroup
      "32 30 0:28 / /my\\040cgroups/mem rw - cgroup cgroup rw,memory\n");     // a space
  ASSERT_EQ(mounts.size(), 1u);
  EXPECT_EQ(mounts[0].mount_point, "/my cgroups/mem");
  EXPECT_FALSE(mounts[0].v2);
  EXPECT_TRUE(MemoryCgroupMounts("").empty());
  EXPECT_FALSE(FindMemoryCgroup("", "0::/\n").has_value());
  EXPECT_FALSE(FindMemoryCgroup(kHybridMountinfo, "").has_value());
}

TEST(CgroupPathOf, FindsEachHierarchysLine) {
  EXPECT_EQ(CgroupPathOf(kHybridCgroup, false), "/process_api/26bc6aa8");
  EXPECT_EQ(CgroupPathOf(kHybridCgroup, true), "/");
  EXPECT_EQ(CgroupPathOf("9:cpu,memory,pids:/a/b\n", false), "/a/b");
  EXPECT_EQ(CgroupPathOf("0::/kubepods/pod:1/c\n", true), "/kubepods/pod:1/c");
  EXPECT_FALSE(CgroupPathOf("9:memorya:/a\n", false).has_value());
  EXPECT_FALSE(CgroupPathOf("1:name=systemd:/\n", true).has_value());
}

TEST(CgroupPathOf, RefusesPathsThatCouldLeaveTheMount) {
  for (const char* bad :
       {"0::/../etc\n", "0::relative\n", "0::/a//b\n", "0::/a/./b\n", "0::\n", "0::/a/..\n"}) {
    EXPECT_FALSE(CgroupPathOf(bad, true).has_value()) << bad;
  }
}

TEST(RelativeToMount, StripsTheMountsRoot) {
  EXPECT_EQ(RelativeToMount("/a/b", "/"), "/a/b");
  EXPECT_EQ(RelativeToMount("/", "/"), "");
  EXPECT_EQ(RelativeToMount("/a/b", "/a"), "/b");
  EXPECT_EQ(RelativeToMount("/a", "/a"), "");
  // Outside the root (a cgroup namespace's view): the mount point.
  EXPECT_EQ(RelativeToMount("/ab/c", "/a"), "");
  EXPECT_EQ(RelativeToMount("/", "/a"), "");
}

TEST(ParseLimitBytes, TakesDecimalBytesOnly) {
  EXPECT_EQ(ParseLimitBytes("536870912\n"), 536870912);
  EXPECT_EQ(ParseLimitBytes("0"), 0);
  EXPECT_EQ(ParseLimitBytes("9223372036854775807\n"), INT64_MAX);
  // v1's "unlimited" is a number, which is larger than any budget.
  EXPECT_EQ(ParseLimitBytes("9223372036854771712\n"), 9223372036854771712);
  for (const char* bad : {"max\n", "", "\n", "-1\n", "12a\n", " 5\n", "5\n\n", "5 \n",
                          "9223372036854775808\n", "99999999999999999999\n", "+5\n", "0x10\n"}) {
    EXPECT_FALSE(ParseLimitBytes(bad).has_value()) << bad;
  }
}

// A cgroup tree in a directory of the test's own, read as the process's.
class FakeCgroupTree : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/posenc-cgroup-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    files_.mountinfo = dir_ + "/mountinfo";
    files_.cgroup = dir_ + "/cgroup";
    files_.mount_prefix = dir_ + "/root";
    files_.physical_memory_bytes = int64_t{16} << 30;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  void Write(const std::string& path, const std::string& text) {
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    std::ofstream(path, std::ios::binary) << text;
  }
  // `file` under the fake mount point `mount`.
  void Limit(const std::string& mount, const std::string& file, const std::string& text) {
    Write(files_.mount_prefix + mount + file, text);
  }
  // The limit read from the tree, or -1 for none.
  int64_t LimitBytes() const {
    const std::optional<MemoryLimit> limit = ReadCgroupMemoryLimit(files_);
    return limit.has_value() ? limit->bytes : -1;
  }

  std::string dir_;
  CgroupFiles files_;
};

TEST_F(FakeCgroupTree, V2TakesTheLeastLimitOnTheWayUp) {
  Write(files_.mountinfo, "28 22 0:25 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
  Write(files_.cgroup, "0::/kubepods/pod1/c1\n");
  Limit("/sys/fs/cgroup", "/kubepods/pod1/c1/memory.max", "max\n");
  Limit("/sys/fs/cgroup", "/kubepods/pod1/memory.max", "1073741824\n");
  Limit("/sys/fs/cgroup", "/kubepods/memory.max", "2147483648\n");
  const std::optional<MemoryLimit> limit = ReadCgroupMemoryLimit(files_);
  ASSERT_TRUE(limit.has_value());
  EXPECT_EQ(limit->bytes, 1073741824);
  EXPECT_EQ(limit->file, files_.mount_prefix + "/sys/fs/cgroup/kubepods/pod1/memory.max");
}

TEST_F(FakeCgroupTree, V2InItsOwnNamespaceReadsTheMountPoint) {
  Write(files_.mountinfo, "28 22 0:25 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
  Write(files_.cgroup, "0::/\n");
  Limit("/sys/fs/cgroup", "/memory.max", "536870912\n");
  EXPECT_EQ(LimitBytes(), 536870912);
}

TEST_F(FakeCgroupTree, V1WithTheContainersCgroupMountedAsTheRoot) {
  // Docker without a cgroup namespace: the mount's root and the process's
  // path are both the container's cgroup.
  Write(files_.mountinfo,
        "32 30 0:28 /docker/abc /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n");
  Write(files_.cgroup, "4:memory:/docker/abc\n");
  Limit("/sys/fs/cgroup/memory", "/memory.limit_in_bytes", "268435456\n");
  EXPECT_EQ(LimitBytes(), 268435456);
}

TEST_F(FakeCgroupTree, V1OnAHybridHost) {
  Write(files_.mountinfo, kHybridMountinfo);
  Write(files_.cgroup, kHybridCgroup);
  Limit("/sys/fs/cgroup/memory", "/memory.limit_in_bytes", "9223372036854771712\n");
  Limit("/sys/fs/cgroup/memory", "/process_api/memory.limit_in_bytes", "9223372036854771712\n");
  Limit("/sys/fs/cgroup/memory", "/process_api/26bc6aa8/memory.limit_in_bytes", "805306368\n");
  // cgroup v2's file is there too, but memory is not its controller here.
  Limit("/sys/fs/cgroup/unified", "/memory.max", "1048576\n");
  EXPECT_EQ(LimitBytes(), 805306368);
}

TEST_F(FakeCgroupTree, ALimitAboveTheMachinesMemoryIsNone) {
  Write(files_.mountinfo, kHybridMountinfo);
  Write(files_.cgroup, kHybridCgroup);
  Limit("/sys/fs/cgroup/memory", "/memory.limit_in_bytes", "9223372036854771712\n");
  Limit("/sys/fs/cgroup/memory", "/process_api/26bc6aa8/memory.limit_in_bytes", "17179869184\n");
  EXPECT_FALSE(ReadCgroupMemoryLimit(files_).has_value());  // 16 GiB, on a 16 GiB machine
  Limit("/sys/fs/cgroup/memory", "/process_api/memory.limit_in_bytes", "17179865088\n");
  EXPECT_EQ(LimitBytes(), 17179865088);
}

TEST_F(FakeCgroupTree, NoLimitWhereNothingReadsAsOne) {
  Write(files_.mountinfo, "28 22 0:25 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
  Write(files_.cgroup, "0::/a/b\n");
  EXPECT_FALSE(ReadCgroupMemoryLimit(files_).has_value());  // no limit files at all
  Limit("/sys/fs/cgroup", "/a/b/memory.max", "max\n");
  Limit("/sys/fs/cgroup", "/a/memory.max", "lots\n");
  Limit("/sys/fs/cgroup", "/memory.max", std::string(8192, '1'));  // past the read cap
  EXPECT_FALSE(ReadCgroupMemoryLimit(files_).has_value());
  Limit("/sys/fs/cgroup", "/a/memory.max", "4096\n");
  EXPECT_EQ(LimitBytes(), 4096);
}

TEST_F(FakeCgroupTree, NoLimitWithoutItsProcFiles) {
  EXPECT_FALSE(ReadCgroupMemoryLimit(files_).has_value());  // neither file
  Write(files_.mountinfo, "28 22 0:25 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
  EXPECT_FALSE(ReadCgroupMemoryLimit(files_).has_value());  // no /proc/self/cgroup
  Write(files_.cgroup, "0::/../../etc\n");
  Limit("/sys/fs/cgroup", "/memory.max", "4096\n");
  EXPECT_FALSE(ReadCgroupMemoryLimit(files_).has_value());  // a path that would leave
}

TEST_F(FakeCgroupTree, WithoutACgroupLimitTheMachinesMemoryIsTheLimit) {
  Write(files_.mountinfo, "28 22 0:25 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
  Write(files_.cgroup, "0::/a\n");
  Limit("/sys/fs/cgroup", "/a/memory.max", "max\n");
  std::optional<MemoryLimit> limit = ReadMemoryLimit(files_);
  ASSERT_TRUE(limit.has_value());
  EXPECT_EQ(limit->bytes, files_.physical_memory_bytes);
  EXPECT_NE(limit->file.find("machine"), std::string::npos) << limit->file;
  Limit("/sys/fs/cgroup", "/a/memory.max", "1073741824\n");
  limit = ReadMemoryLimit(files_);
  ASSERT_TRUE(limit.has_value());
  EXPECT_EQ(limit->bytes, 1073741824);
  EXPECT_EQ(limit->file, files_.mount_prefix + "/sys/fs/cgroup/a/memory.max");
}

TEST(ReadCgroupMemoryLimit, ReadsThisProcessWithoutFailing) {
  // Whatever this machine has; printed for the log.
  const std::optional<MemoryLimit> limit = ReadCgroupMemoryLimit();
  if (limit.has_value()) {
    std::printf("this process: %lld bytes (%s)\n", static_cast<long long>(limit->bytes),
                limit->file.c_str());
    EXPECT_GE(limit->bytes, 0);
  } else {
    std::printf("this process: no memory limit\n");
  }
  const std::optional<MemoryLimit> any = ReadMemoryLimit();
  ASSERT_TRUE(any.has_value());  // at least the machine's memory
  EXPECT_GT(any->bytes, 0);
  if (limit.has_value()) EXPECT_LE(any->bytes, limit->bytes);
}

TEST(InflightBytesUnder, LeavesTheOverheadTwoMessagesAndTheTables) {
  const int64_t message = 68 * kMiB, unconstrained = int64_t{4} << 30;
  EXPECT_EQ(InflightBytesUnder(std::nullopt, message, 0, unconstrained), unconstrained);
  EXPECT_EQ(InflightBytesUnder(1024 * kMiB, message, 0, unconstrained), (1024 - 96 - 136) * kMiB);
  EXPECT_EQ(InflightBytesUnder(1024 * kMiB, message, 256 * kMiB, unconstrained),
            (1024 - 96 - 136 - 256) * kMiB);
  EXPECT_EQ(InflightBytesUnder(int64_t{64} << 30, message, 0, unconstrained), unconstrained);
  EXPECT_EQ(InflightBytesUnder(INT64_MAX, message, INT64_MAX, unconstrained), 2 * message);
  EXPECT_EQ(InflightBytesUnder(INT64_MAX, message, 0, unconstrained), unconstrained);
  // Too small for two messages: the least a budget can be.
  EXPECT_EQ(InflightBytesUnder(256 * kMiB, message, 0, unconstrained), 2 * message);
  EXPECT_EQ(InflightBytesUnder(0, message, 0, unconstrained), 2 * message);
  EXPECT_EQ(InflightBytesUnder(0, INT64_MAX, 0, unconstrained), INT64_MAX);
  // Negative sizes (refused by Validate afterwards) count as 0, and do not
  // overflow on the way.
  EXPECT_EQ(InflightBytesUnder(1024 * kMiB, -message, -1, unconstrained), (1024 - 96) * kMiB);
  EXPECT_EQ(InflightBytesUnder(1024 * kMiB, INT64_MIN, INT64_MIN, unconstrained),
            (1024 - 96) * kMiB);
}

TEST(InflightBytesUnder, ItsPeakFitsUnderEveryLimitThatCanHoldIt) {
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 10000; ++i) {
    const int64_t message = std::uniform_int_distribution<int64_t>(1, INT32_MAX)(rng);
    const int64_t tables =
        rng() % 2 == 0 ? 0 : std::uniform_int_distribution<int64_t>(0, int64_t{8} << 30)(rng);
    const int64_t limit = std::uniform_int_distribution<int64_t>(0, int64_t{1} << 40)(rng);
    const int64_t budget = InflightBytesUnder(limit, message, tables, int64_t{4} << 30);
    ASSERT_GE(budget, 2 * message);
    ASSERT_LE(budget, std::max(2 * message, int64_t{4} << 30));
    const int64_t peak = PeakMemoryBytes(budget, message, budget + 2 * message, tables);
    if (limit >= 4 * message + tables + kFixedOverheadBytes) {
      ASSERT_LE(peak, limit) << limit << " " << message << " " << tables;
    } else {
      // The least budget there is, and start-up warns that it does not fit.
      ASSERT_EQ(budget, 2 * message) << limit << " " << message << " " << tables;
      ASSERT_GT(peak, limit) << limit << " " << message << " " << tables;
    }
  }
}

TEST(PeakMemoryBytes, SaturatesRatherThanOverflows) {
  EXPECT_EQ(PeakMemoryBytes(100 * kMiB, 10 * kMiB, 120 * kMiB, 0), 216 * kMiB);
  EXPECT_EQ(PeakMemoryBytes(100 * kMiB, 10 * kMiB, 120 * kMiB, 50 * kMiB), 266 * kMiB);
  // A transport quota set above the budget and two messages.
  EXPECT_EQ(PeakMemoryBytes(100 * kMiB, 10 * kMiB, 200 * kMiB, 0), 296 * kMiB);
  EXPECT_EQ(PeakMemoryBytes(INT64_MAX - 1, 10, 0, 0), INT64_MAX);
  EXPECT_EQ(PeakMemoryBytes(10, INT64_MAX, 0, 0), INT64_MAX);
  EXPECT_EQ(PeakMemoryBytes(10, 10, INT64_MAX, 0), INT64_MAX);
  EXPECT_EQ(PeakMemoryBytes(10, 10, 0, INT64_MAX), INT64_MAX);
  EXPECT_EQ(PeakMemoryBytes(INT64_MIN, INT64_MIN, INT64_MIN, INT64_MIN), kFixedOverheadBytes);
}

}  // namespace
}  // namespace posenc::server
