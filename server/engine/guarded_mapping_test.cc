// The SIGBUS guard: a mapping whose object is truncated under it turns into
// zero pages and reports broken, instead of killing the process; a SIGBUS
// outside every guarded mapping still does what it did before.
#include "engine/guarded_mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"

namespace posenc::server {
namespace {

// A file of `size` random bytes in /dev/shm (a tmpfs, as real regions are).
struct File {
  explicit File(int64_t size) {
    path = "/dev/shm/posenc-guard-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
    fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    EXPECT_GE(fd, 0);
    const unsigned seed = std::random_device()();
    std::printf("File %s: seed %u\n", path.c_str(), seed);
    std::mt19937 rng(seed);
    bytes.resize(size);
    for (char& c : bytes) c = static_cast<char>(rng());
    EXPECT_EQ(::pwrite(fd, bytes.data(), bytes.size(), 0), size);
  }
  ~File() {
    ::close(fd);
    ::unlink(path.c_str());
  }
  static inline int n = 0;
  std::string path;
  int fd = -1;
  std::string bytes;
};

TEST(GuardedMapping, MapsTheSliceInPlace) {
  File f(3 * 4096 + 100);
  auto m = GuardedMapping::Map(f.fd, 5000, 7000);  // an offset that is no page boundary
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(std::string((*m)->data(), 7000), f.bytes.substr(5000, 7000));
  (*m)->data()[0] = 'x';  // shared: the object sees it
  char c = 0;
  ASSERT_EQ(::pread(f.fd, &c, 1, 5000), 1);
  EXPECT_EQ(c, 'x');
  EXPECT_FALSE((*m)->broken());
}

// Sizes whose whole pages pass 2^63 (only an object that large, and
// limits that admit it, reach here) are refused, with no overflow on the
// way (UBSan checks it); empty and negative slices are refused as invalid.
TEST(GuardedMapping, SlicesThatCannotBeMappedAreRefused) {
  File f(4096);
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  for (const auto& [offset, size, code] :
       {std::tuple{int64_t{0}, kMax, absl::StatusCode::kResourceExhausted},
        std::tuple{int64_t{4097}, kMax - 4096, absl::StatusCode::kResourceExhausted},
        std::tuple{int64_t{1}, kMax - 4096, absl::StatusCode::kResourceExhausted},
        std::tuple{int64_t{0}, int64_t{0}, absl::StatusCode::kInvalidArgument},
        std::tuple{int64_t{0}, int64_t{-1}, absl::StatusCode::kInvalidArgument},
        std::tuple{int64_t{-1}, int64_t{100}, absl::StatusCode::kInvalidArgument}}) {
    auto m = GuardedMapping::Map(f.fd, offset, size);
    EXPECT_EQ(m.status().code(), code) << offset << " " << size << ": " << m.status();
  }
  auto m = GuardedMapping::Map(f.fd, 0, 4096);
  EXPECT_TRUE(m.ok()) << "every slot was given back: " << m.status();
}

TEST(GuardedMapping, TruncationUnderItBecomesZeroPagesNotASignal) {
  File f(64 * 4096);
  auto m = GuardedMapping::Map(f.fd, 0, 64 * 4096);
  ASSERT_TRUE(m.ok()) << m.status();
  const int64_t repairs = GuardedMapping::repairs();
  ASSERT_EQ(::ftruncate(f.fd, 4096), 0);
  // Reads and writes past the new end, from several threads at once.
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      char* p = (*m)->data();
      for (int64_t i = 4096 + t; i < 64 * 4096; i += 4096) {
        volatile char v = p[i];
        (void)v;
        p[i] = 'w';
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_TRUE((*m)->broken());
  EXPECT_GE(GuardedMapping::repairs(), repairs + 1);
  // The server's view is its own zero pages now; the object kept its size
  // and its first page.
  EXPECT_EQ((*m)->data()[0], 0);
  struct stat st;
  ASSERT_EQ(::fstat(f.fd, &st), 0);
  EXPECT_EQ(st.st_size, 4096);
  std::string first(4096, '\0');
  ASSERT_EQ(::pread(f.fd, first.data(), 4096, 0), 4096);
  EXPECT_EQ(first, f.bytes.substr(0, 4096));
}

TEST(GuardedMapping, ManyMappingsComeAndGoAndEachIsGuardedAlone) {
  File a(8192), b(8192);
  for (int i = 0; i < 200; ++i) {
    auto ma = GuardedMapping::Map(a.fd, 0, 8192);
    auto mb = GuardedMapping::Map(b.fd, 0, 8192);
    ASSERT_TRUE(ma.ok() && mb.ok());
    EXPECT_FALSE((*ma)->broken() || (*mb)->broken());
  }
  auto ma = GuardedMapping::Map(a.fd, 0, 8192);
  auto mb = GuardedMapping::Map(b.fd, 0, 8192);
  ASSERT_TRUE(ma.ok() && mb.ok());
  ASSERT_EQ(::ftruncate(a.fd, 0), 0);
  volatile char v = (*ma)->data()[100];
  (void)v;
  EXPECT_TRUE((*ma)->broken());
  EXPECT_FALSE((*mb)->broken()) << "only the truncated object's mapping is replaced";
  EXPECT_EQ(std::string((*mb)->data(), 8192), b.bytes);
}

// A mapping the guard does not know keeps the default: the process dies.
TEST(GuardedMappingDeathTest, ASigbusElsewhereStillKills) {
  File f(8192);
  auto guarded = GuardedMapping::Map(f.fd, 0, 8192);  // installs the handler
  ASSERT_TRUE(guarded.ok());
  EXPECT_DEATH(
      {
        File g(8192);
        char* p =
            static_cast<char*>(::mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, g.fd, 0));
        if (::ftruncate(g.fd, 0) != 0) std::abort();
        volatile char v = p[4096];
        (void)v;
      },
      "");
}

}  // namespace
}  // namespace posenc::server
