// The shared-memory registry against real objects in /dev/shm: keys that
// would leave it, slices beyond the object, the caps and the memory budget,
// names taken, a caller shrinking the object after registering it (the
// mapping's guard turns the SIGBUS into an error for that region), and
// unregistering a region a request still holds (it waits).
#include "engine/shared_memory_registry.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "stand_in_device.h"

namespace posenc::server {
namespace {

using ::testing::HasSubstr;

// A shared-memory object of `size` seeded random bytes, removed at the end.
class ShmObject {
 public:
  explicit ShmObject(int64_t size) {
    static int n = 0;
    key_ = absl::StrCat("/posenc-test-", ::getpid(), "-", n++);
    path_ = "/dev/shm" + key_;
    const int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    EXPECT_GE(fd, 0) << path_;
    const unsigned seed = std::random_device()();
    std::printf("ShmObject %s: seed %u\n", key_.c_str(), seed);
    std::mt19937 rng(seed);
    bytes_.resize(size);
    for (char& c : bytes_) c = static_cast<char>(rng());
    EXPECT_EQ(::pwrite(fd, bytes_.data(), bytes_.size(), 0), size);
    ::close(fd);
  }
  ~ShmObject() { ::unlink(path_.c_str()); }
  const std::string& key() const { return key_; }
  const std::string& path() const { return path_; }
  const std::string& bytes() const { return bytes_; }
  void Truncate(int64_t size) const { ASSERT_EQ(::truncate(path_.c_str(), size), 0); }
  std::string Contents() const {
    std::string out(bytes_.size(), '\0');
    const int fd = ::open(path_.c_str(), O_RDONLY);
    out.resize(std::max<ssize_t>(0, ::pread(fd, out.data(), out.size(), 0)));
    ::close(fd);
    return out;
  }

 private:
  std::string key_;
  std::string path_;
  std::string bytes_;
};

SharedMemoryOptions On() {
  SharedMemoryOptions o;
  o.enabled = true;
  return o;
}

// The memory budget regions are admitted against.
AdmissionControl* Budget() {
  static AdmissionControl* a = new AdmissionControl(AdmissionOptions{64, int64_t{1} << 30});
  return a;
}

TEST(SharedMemoryTest, OffRefusesEverythingSayingHowToEnable) {
  SharedMemoryRegistry r{SharedMemoryOptions{}, Budget()};
  ShmObject obj(64);
  for (const absl::Status& s : {r.Register("a", obj.key(), 0, 64), r.Unregister(""),
                                r.Status("").status(), r.Find("input 0", "a").status()}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(s.message().find("--enable_system_shared_memory"), std::string::npos) << s;
  }
}

TEST(SharedMemoryTest, ReadsAndWritesTheRegisteredSlice) {
  SharedMemoryRegistry r(On(), Budget());
  ShmObject obj(4096);
  ASSERT_TRUE(r.Register("in", obj.key(), 1024, 2048).ok());
  auto region = r.Find("input 0", "in");
  ASSERT_TRUE(region.ok()) << region.status();
  std::string got = "poison";
  ASSERT_TRUE((*region)->Read("input 0", 16, 100, &got).ok());
  EXPECT_EQ(got, obj.bytes().substr(1024 + 16, 100));
  ASSERT_TRUE((*region)->Write("output 0", 2000, std::string(48, 'z')).ok());
  EXPECT_EQ(obj.Contents().substr(1024 + 2000, 48), std::string(48, 'z'));
  EXPECT_EQ(obj.Contents().substr(0, 1024 + 2000), obj.bytes().substr(0, 1024 + 2000));
  // Slices beyond the region, overflow-safe.
  for (auto [off, size] : {std::pair<int64_t, int64_t>{2000, 49},
                           {2049, 0},
                           {-1, 1},
                           {0, -1},
                           {INT64_MAX, INT64_MAX},
                           {1, INT64_MAX}}) {
    absl::Status s = (*region)->Read("input 0", off, size, &got);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << off << " " << size;
    EXPECT_NE(s.message().find("input 0"), std::string::npos) << s;
  }
  EXPECT_EQ((*region)->Write("output 0", 2040, std::string(9, 'x')).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SharedMemoryTest, KeysMustStayUnderDevShm) {
  SharedMemoryRegistry r(On(), Budget());
  ShmObject obj(64);
  for (const std::string& key :
       {std::string(""), std::string("/"), std::string("/a/b"), std::string("//x"),
        std::string("/.."), std::string(".."), std::string("/."), std::string("/x..y"),
        std::string("../etc/passwd"), std::string("/dev/shm/x"), std::string("/x\n"),
        std::string("/a b"), std::string("/") + std::string(256, 'k'), std::string("x\0y", 3)}) {
    absl::Status s = r.Register("a", key, 0, 1);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << key << ": " << s;
  }
  // Both spellings of a good key.
  EXPECT_TRUE(r.Register("a", obj.key(), 0, 64).ok());
  EXPECT_TRUE(r.Register("b", obj.key().substr(1), 0, 64).ok());
  EXPECT_EQ(r.Register("c", "/posenc-test-does-not-exist", 0, 1).code(),
            absl::StatusCode::kNotFound);
}

TEST(SharedMemoryTest, OnlyRegularObjectsAndNoSymlinks) {
  SharedMemoryRegistry r(On(), Budget());
  ShmObject obj(64);
  const std::string fifo = obj.path() + "-fifo";
  const std::string link = obj.path() + "-link";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  ASSERT_EQ(::symlink("/etc/hostname", link.c_str()), 0);
  // A FIFO would block a plain open; it must be refused at once.
  EXPECT_EQ(r.Register("fifo", obj.key() + "-fifo", 0, 1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(r.Register("link", obj.key() + "-link", 0, 1).ok());
  EXPECT_EQ(r.count(), 0);
  ::unlink(fifo.c_str());
  ::unlink(link.c_str());
}

TEST(SharedMemoryTest, SlicesMustLieWithinTheObject) {
  SharedMemoryRegistry r(On(), Budget());
  ShmObject obj(100);
  EXPECT_EQ(r.Register("a", obj.key(), 0, 101).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.Register("a", obj.key(), 1, 100).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.Register("a", obj.key(), 0, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.Register("a", obj.key(), UINT64_MAX, 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.Register("a", obj.key(), 50, UINT64_MAX - 10).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.Register("a", obj.key(), uint64_t{1} << 63, uint64_t{1} << 63).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(r.Register("a", obj.key(), 99, 1).ok());
  EXPECT_EQ(r.count(), 1);
}

TEST(SharedMemoryTest, NamesAreUniqueAndCapsHold) {
  SharedMemoryOptions o = On();
  o.max_regions = 2;
  o.max_total_bytes = 150;
  SharedMemoryRegistry r(o, Budget());
  ShmObject obj(100);
  ASSERT_TRUE(r.Register("a", obj.key(), 0, 100).ok());
  EXPECT_EQ(r.Register("a", obj.key(), 0, 10).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(r.Register("b", obj.key(), 0, 51).code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(r.Register("b", obj.key(), 0, 50).ok());
  EXPECT_EQ(r.Register("c", obj.key(), 0, 1).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(r.Register("", obj.key(), 0, 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.Register(std::string(129, 'n'), obj.key(), 0, 1).code(),
            absl::StatusCode::kInvalidArgument);
  // Unregistering gives the room back; unknown names are not an error.
  ASSERT_TRUE(r.Unregister("a").ok());
  ASSERT_TRUE(r.Unregister("a").ok());
  EXPECT_TRUE(r.Register("c", obj.key(), 0, 100).ok());
  auto all = r.Status("");
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0]->name(), "b");
  EXPECT_EQ((*all)[1]->name(), "c");
  EXPECT_EQ(r.Status("a").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(r.Find("input 0", "a").status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(r.Unregister("").ok());
  EXPECT_EQ(r.count(), 0);
  EXPECT_TRUE(r.Register("d", obj.key(), 0, 100).ok());
}

TEST(SharedMemoryTest, OneClientCannotTakeEveryRegion) {
  SharedMemoryOptions o = On();
  o.max_regions = 5;
  o.max_regions_per_client = 2;
  SharedMemoryRegistry r(o, Budget());
  ShmObject obj(100);
  ASSERT_TRUE(r.Register("a1", obj.key(), 0, 10, "ipv4:127.0.0.1:1000").ok());
  ASSERT_TRUE(r.Register("a2", obj.key(), 0, 10, "ipv4:127.0.0.1:1000").ok());
  const absl::Status third = r.Register("a3", obj.key(), 0, 10, "ipv4:127.0.0.1:1000");
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(third.message(), HasSubstr("--max_shared_memory_regions_per_client"));
  EXPECT_THAT(third.message(), HasSubstr("ipv4:127.0.0.1:1000"));
  // Others still can, up to their own cap and the registry's.
  ASSERT_TRUE(r.Register("b1", obj.key(), 0, 10, "ipv4:127.0.0.1:2000").ok());
  ASSERT_TRUE(r.Register("b2", obj.key(), 0, 10, "ipv4:127.0.0.1:2000").ok());
  ASSERT_TRUE(r.Register("c1", obj.key(), 0, 10, "unix:").ok());
  const absl::Status full = r.Register("c2", obj.key(), 0, 10, "unix:");
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(full.message(), HasSubstr("--max_shared_memory_regions)"));
  // A region unregistered, by anyone, counts no more against its client.
  ASSERT_TRUE(r.Unregister("a1").ok());
  EXPECT_TRUE(r.Register("a3", obj.key(), 0, 10, "ipv4:127.0.0.1:1000").ok());
  EXPECT_EQ(r.Status("a3").value()[0]->client(), "ipv4:127.0.0.1:1000");
  ASSERT_TRUE(r.Unregister("").ok());
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(r.Register(absl::StrCat("a", i), obj.key(), 0, 10, "ipv4:127.0.0.1:1000").ok());
  }
  o.max_regions_per_client = 0;
  SharedMemoryRegistry none(o, Budget());
  EXPECT_EQ(none.Register("x", obj.key(), 0, 10, "unix:").code(),
            absl::StatusCode::kResourceExhausted);
}

// Each mapping is pinned once mapped and unpinned before it goes, after
// the last request holding its region is done.
TEST(SharedMemoryTest, RegionsArePinnedWhileMapped) {
  SharedMemoryRegistry r(On(), Budget());
  std::map<char*, int64_t> pinned;
  std::string pinned_name;
  int unpins = 0;
  r.SetPinning(
      [&](absl::string_view name, char* p, int64_t n) {
        pinned[p] = n;
        pinned_name = std::string(name);
        return true;
      },
      [&](char* p) {
        EXPECT_EQ(pinned.erase(p), 1u);
        ++unpins;
      });
  ShmObject obj(1 << 20);
  ASSERT_TRUE(r.Register("a", obj.key(), 4096, 8192).ok());
  ASSERT_EQ(pinned.size(), 1u);
  auto held = r.Find("x", "a");
  ASSERT_TRUE(held.ok());
  EXPECT_EQ(pinned.begin()->first, (*held)->At(0));
  EXPECT_EQ(pinned.begin()->second, 8192);
  EXPECT_EQ(pinned_name, "a");
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    held->reset();
  });
  ASSERT_TRUE(r.Unregister("a").ok());
  later.join();
  EXPECT_EQ(unpins, 1);
  EXPECT_TRUE(pinned.empty());
  // A refused registration pins nothing.
  EXPECT_FALSE(r.Register("b", obj.key(), 0, 2 << 20).ok());
  EXPECT_TRUE(pinned.empty());
}

// A device reads and writes the pages it pinned without a fault, so no
// SIGBUS marks a truncated object there: a pinned region also compares the
// object's size. Truncated below the slice's end (and nothing touched),
// it is FAILED_PRECONDITION; an unpinned region shows the truncation when
// the server touches it (TruncatedUnderTheMappingIsAnErrorNotASignal).
TEST(SharedMemoryTest, APinnedRegionSeesItsObjectShrinkWithoutTouchingIt) {
  SharedMemoryRegistry r(On(), Budget());
  bool pin = true;
  r.SetPinning([&](absl::string_view, char*, int64_t) { return pin; }, [](char*) {});
  ShmObject obj(1 << 20);
  ASSERT_TRUE(r.Register("pinned", obj.key(), 4096, 8192).ok());
  pin = false;
  ASSERT_TRUE(r.Register("unpinned", obj.key(), 4096, 8192).ok());
  auto pinned = r.Find("x", "pinned");
  auto unpinned = r.Find("x", "unpinned");
  ASSERT_TRUE(pinned.ok() && unpinned.ok());
  EXPECT_TRUE((*pinned)->CheckIntact("input 0").ok());
  obj.Truncate(4096 + 8192);  // the slice's end: still whole
  EXPECT_TRUE((*pinned)->CheckIntact("input 0").ok());
  obj.Truncate(4096 + 8191);
  const absl::Status s = (*pinned)->CheckIntact("input 0");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("truncated"), std::string::npos) << s;
  EXPECT_TRUE((*unpinned)->CheckIntact("input 0").ok()) << "untouched: nothing seen yet";
  pinned->reset();
  unpinned->reset();
  ASSERT_TRUE(r.Unregister("").ok());
}

TEST(SharedMemoryTest, TruncatedUnderTheMappingIsAnErrorNotASignal) {
  SharedMemoryRegistry r(On(), Budget());
  ShmObject obj(1 << 20);
  ASSERT_TRUE(r.Register("r", obj.key(), 4096, (1 << 20) - 4096).ok());
  auto region = r.Find("input 0", "r");
  ASSERT_TRUE(region.ok());
  // Mapped in place: the slice's bytes are the object's.
  EXPECT_EQ(std::string((*region)->At(0), 4096), obj.bytes().substr(4096, 4096));
  obj.Truncate(8192);
  // What is still there reads, and the region is intact.
  std::string got;
  ASSERT_TRUE((*region)->Read("input 0", 0, 4096, &got).ok());
  EXPECT_EQ(got, obj.bytes().substr(4096, 4096));
  // Past the new end: a SIGBUS the guard repairs; the region is void from
  // then on, for this request and every later one.
  absl::Status s = (*region)->Read("input 0", 0, 65536, &got);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("truncated"), std::string::npos) << s;
  EXPECT_TRUE(got.empty());
  EXPECT_EQ((*region)->Write("output 0", 0, "abc").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.Find("input 1", "r").status().code(), absl::StatusCode::kFailedPrecondition);
  // The object itself was not grown or written by the server.
  struct stat st;
  ASSERT_EQ(::stat(obj.path().c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 8192);
  EXPECT_EQ(obj.Contents().substr(0, 8192), obj.bytes().substr(0, 8192));
  // Unregistered, the name takes a fresh registration.
  region->reset();
  ASSERT_TRUE(r.Unregister("r").ok());
  ASSERT_TRUE(r.Register("r", obj.key(), 0, 8192).ok());
  EXPECT_TRUE(r.Find("input 0", "r").ok());
}

TEST(SharedMemoryTest, UnregisterWaitsForTheRequestsHoldingTheRegion) {
  SharedMemoryRegistry r(On(), Budget());
  ShmObject obj(4096);
  ASSERT_TRUE(r.Register("r", obj.key(), 0, 4096).ok());
  auto held = r.Find("input 0", "r");  // a request in flight holds it
  ASSERT_TRUE(held.ok());
  // With a deadline that passes, the name is gone and the region lives on.
  absl::Status s = r.Unregister("r", absl::Now() + absl::Milliseconds(50));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_EQ(r.Find("input 0", "r").status().code(), absl::StatusCode::kNotFound);
  // The caller even removes the object: the held mapping still reads it.
  ::unlink(obj.path().c_str());
  std::string got;
  ASSERT_TRUE((*held)->Read("input 0", 0, 4096, &got).ok());
  EXPECT_EQ(got, obj.bytes());
  // A second region: Unregister returns once its request lets go.
  ShmObject other(16);
  ASSERT_TRUE(r.Register("s", other.key(), 0, 16).ok());
  auto held2 = r.Find("input 0", "s");
  ASSERT_TRUE(held2.ok());
  // (Ordered, not timed: a stalled test thread could reach Unregister
  // after the request let go, and then it need not wait at all.)
  std::atomic<bool> let_go{false};
  std::thread request([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    let_go = true;
    held2->reset();
  });
  EXPECT_TRUE(r.Unregister("s").ok());
  EXPECT_TRUE(let_go.load()) << "Unregister returned while a request held the region";
  request.join();
}

TEST(SharedMemoryTest, RegionsAreAdmittedAgainstTheBudgetWhileRegistered) {
  AdmissionControl budget(AdmissionOptions{8, int64_t{1} << 20});
  SharedMemoryRegistry r(On(), &budget);
  ShmObject obj(int64_t{1} << 20);
  ASSERT_TRUE(r.Register("a", obj.key(), 0, 768 << 10).ok());
  EXPECT_EQ(budget.bytes(), 768 << 10);
  EXPECT_EQ(budget.calls(), 0) << "a region holds memory, not a slot";
  const absl::Status s = r.Register("b", obj.key(), 0, 512 << 10);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("--max_inflight_bytes"), std::string::npos) << s;
  ASSERT_TRUE(r.Unregister("a").ok());
  EXPECT_EQ(budget.bytes(), 0);
  EXPECT_TRUE(r.Register("b", obj.key(), 0, 512 << 10).ok());
  ASSERT_TRUE(r.Unregister("").ok());
}

// Regions leave room for a call to be read: without it, regions holding the
// whole budget would leave every call (those using them too) waiting.
TEST(SharedMemoryTest, RegionsLeaveRoomForACall) {
  AdmissionControl budget(AdmissionOptions{8, int64_t{1} << 20});
  SharedMemoryRegistry r(On(), &budget, /*keep_free=*/256 << 10);
  ShmObject obj(int64_t{1} << 20);
  ASSERT_TRUE(r.Register("a", obj.key(), 0, 512 << 10).ok());
  const absl::Status s = r.Register("b", obj.key(), 0, 512 << 10);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("kept for calls"), std::string::npos) << s;
  ASSERT_TRUE(r.Register("b", obj.key(), 0, 256 << 10).ok());
  EXPECT_EQ(budget.bytes(), 768 << 10);
  // What is left is a call's.
  auto call = budget.Enter();
  ASSERT_TRUE(call.ok());
  EXPECT_TRUE(call->TryGrow(256 << 10).ok());
  ASSERT_TRUE(r.Unregister("").ok());
}

// CUDA regions, opened by a stand-in for the backend (stand_in_device.h),
// so the registry's part (names, kinds, caps, lifetimes, copies) is tested
// without a GPU. The backend's part is in cuda_backend_test.cc.
using testing::StandInDevice;

SharedMemoryOptions CudaOn() {
  SharedMemoryOptions o;
  o.cuda_enabled = true;
  o.max_regions = 3;
  return o;
}

TEST(CudaSharedMemoryTest, OffOrWithoutAGpuIsRefusedSayingWhy) {
  SharedMemoryRegistry off{SharedMemoryOptions{}, Budget()};
  for (const absl::Status& s : {off.RegisterCuda("g", "good-handle", 0, 64),
                                off.Unregister("", absl::InfiniteFuture(), MemoryKind::kCuda),
                                off.Status("", MemoryKind::kCuda).status()}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(s.message(), HasSubstr("--enable_cuda_shared_memory"));
  }
  SharedMemoryRegistry no_gpu{CudaOn(), Budget()};
  no_gpu.SetDeviceOpener(nullptr, "this server has no GPU backend (no CUDA driver)");
  const absl::Status s = no_gpu.RegisterCuda("g", "good-handle", 0, 64);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("no CUDA driver"));
  EXPECT_THAT(s.message(), HasSubstr("\"g\""));
}

TEST(CudaSharedMemoryTest, RegionsOpenOnceShareTheNamespaceAndCloseAfterTheirLastRequest) {
  StandInDevice dev;
  SharedMemoryOptions o = CudaOn();
  o.enabled = true;
  SharedMemoryRegistry r(o, Budget());
  r.SetDeviceOpener(dev.Opener(), "");
  ShmObject obj(64);
  ASSERT_TRUE(r.Register("sys", obj.key(), 0, 64).ok());
  ASSERT_TRUE(r.RegisterCuda("gpu", "good-handle", 0, 4096, "client-a").ok());
  EXPECT_EQ(dev.open, 1);
  // One namespace for both kinds, as in Triton.
  EXPECT_EQ(r.RegisterCuda("sys", "good-handle", 0, 64).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(r.Register("gpu", obj.key(), 0, 64).code(), absl::StatusCode::kAlreadyExists);
  // Each kind's status lists its own.
  auto cuda = r.Status("", MemoryKind::kCuda);
  ASSERT_TRUE(cuda.ok());
  ASSERT_EQ(cuda->size(), 1u);
  EXPECT_EQ((*cuda)[0]->name(), "gpu");
  EXPECT_TRUE((*cuda)[0]->on_device());
  EXPECT_EQ(r.Status("gpu").status().code(), absl::StatusCode::kNotFound) << "not a system one";
  EXPECT_EQ(r.Status("sys", MemoryKind::kCuda).status().code(), absl::StatusCode::kNotFound);
  cuda->clear();
  // Unregistering every system region leaves the CUDA one.
  ASSERT_TRUE(r.Unregister("").ok());
  EXPECT_EQ(r.count(), 1);

  // Reads and writes are the device's copies, within the slice only.
  auto held = r.Find("input 0", "gpu");
  ASSERT_TRUE(held.ok()) << held.status();
  ASSERT_TRUE((*held)->Write("output 0", 100, "abc").ok());
  EXPECT_EQ(dev.memory.substr(99, 5), "dabcd");
  std::string got;
  ASSERT_TRUE((*held)->Read("input 0", 100, 3, &got).ok());
  EXPECT_EQ(got, "abc");
  EXPECT_EQ(dev.copied, 6);
  EXPECT_EQ((*held)->Write("output 0", 4095, "ab").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dev.copied, 6) << "nothing copied past the region";

  // Unregistering waits for the request holding the region; the handle
  // closes after it.
  std::thread unregister(
      [&] { ASSERT_TRUE(r.Unregister("gpu", absl::InfiniteFuture(), MemoryKind::kCuda).ok()); });
  // The name goes as soon as that thread runs (polled: it may be slow to
  // start), the handle stays open while the request holds the region.
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  while (r.Find("input 1", "gpu").ok() && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(r.Find("input 1", "gpu").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(dev.open, 1);
  held->reset();
  unregister.join();
  EXPECT_EQ(dev.open, 0);
}

// Which slices are the same bytes: of one region, by their offsets; of two
// registrations of one object, by where each lies in it, as for two CUDA
// registrations of one handle (one allocation, one device address); of two
// objects, or a system and a CUDA region, none.
TEST(CudaSharedMemoryTest, SlicesShareBytesOfOneObjectOrOneRegion) {
  StandInDevice dev;
  SharedMemoryOptions o = CudaOn();
  o.enabled = true;
  o.max_regions = 8;
  SharedMemoryRegistry r(o, Budget());
  r.SetDeviceOpener(dev.Opener(), "");
  ShmObject obj(4096), other(4096);
  ASSERT_TRUE(r.Register("a", obj.key(), 0, 4096).ok());
  ASSERT_TRUE(r.Register("b", obj.key(), 1024, 2048).ok());  // b:x is a:(1024 + x)
  ASSERT_TRUE(r.Register("c", other.key(), 0, 4096).ok());
  ASSERT_TRUE(r.RegisterCuda("g", "good-handle", 0, 4096).ok());
  ASSERT_TRUE(r.RegisterCuda("h", "good-handle", 0, 4096).ok());
  const auto find = [&](const char* name) { return *r.Find("test", name); };
  const auto a = find("a"), b = find("b"), c = find("c"), g = find("g"), h = find("h");
  // One region: [0, 100) and [99, 199) meet; [0, 100) and [100, 200) do not.
  EXPECT_TRUE(a->SharesBytes(0, 100, *a, 99, 100));
  EXPECT_FALSE(a->SharesBytes(0, 100, *a, 100, 100));
  EXPECT_TRUE(g->SharesBytes(0, 100, *g, 99, 100));
  EXPECT_FALSE(g->SharesBytes(0, 100, *g, 100, 100));
  EXPECT_FALSE(g->SharesBytes(0, 0, *g, 0, 100)) << "an empty slice holds no bytes";
  // Two registrations: a:[1000, 1025) holds b's first byte; a:[0, 1024) none of b.
  EXPECT_TRUE(a->SharesBytes(1000, 25, *b, 0, 10));
  EXPECT_TRUE(b->SharesBytes(0, 10, *a, 1000, 25));
  EXPECT_FALSE(a->SharesBytes(0, 1024, *b, 0, 2048));
  EXPECT_TRUE(b->SharesBytes(2047, 1, *a, 3071, 1));
  EXPECT_FALSE(b->SharesBytes(2047, 1, *a, 3072, 1));
  EXPECT_TRUE(g->SharesBytes(4000, 96, *h, 4095, 1));
  EXPECT_FALSE(g->SharesBytes(0, 2048, *h, 2048, 2048));
  // Two objects; a system and a CUDA region.
  EXPECT_FALSE(a->SharesBytes(0, 4096, *c, 0, 4096));
  EXPECT_FALSE(a->SharesBytes(0, 4096, *g, 0, 4096));
  EXPECT_FALSE(g->SharesBytes(0, 4096, *a, 0, 4096));
}

TEST(CudaSharedMemoryTest, HandlesThatDoNotOpenAreRefusedNamingTheRegion) {
  StandInDevice dev;
  SharedMemoryRegistry r(CudaOn(), Budget());
  r.SetDeviceOpener(dev.Opener(), "");
  struct Case {
    const char* handle;
    int64_t device;
    uint64_t bytes;
    const char* says;
  };
  for (const Case& c :
       {Case{"forged", 0, 64, "does not open"}, Case{"good-handle", 1, 64, "device_id 1"},
        Case{"good-handle", 0, 8192, "too small"}, Case{"good-handle", 0, 0, "byte_size must be 1"},
        Case{"good-handle", 0, uint64_t{1} << 63, "byte_size must be 1"}}) {
    const absl::Status s = r.RegisterCuda("bad", c.handle, c.device, c.bytes);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), HasSubstr(c.says));
    EXPECT_THAT(s.message(), HasSubstr("\"bad\""));
  }
  EXPECT_EQ(dev.open, 0);
  EXPECT_EQ(r.count(), 0);
  // The caps count CUDA regions too.
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(r.RegisterCuda(absl::StrCat("g", i), "good-handle", 0, 64).ok());
  }
  EXPECT_EQ(r.RegisterCuda("g3", "good-handle", 0, 64).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(dev.open, 3);
  ASSERT_TRUE(r.Unregister("", absl::InfiniteFuture(), MemoryKind::kCuda).ok());
  EXPECT_EQ(dev.open, 0);
}

}  // namespace
}  // namespace posenc::server
