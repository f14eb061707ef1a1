#include "engine/table_repository.h"

#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/safetensors.h"
#include "gtest/gtest.h"

namespace posenc::server {
namespace {

namespace fs = std::filesystem;

// A reload that hangs (a FIFO opened for reading blocks until a writer comes)
// must fail the test, not hang it. Generous: a passing reload takes
// milliseconds, and a loaded machine must not make it look hung.
constexpr auto kReloadDeadline = std::chrono::seconds(20);

fs::path TempDir() {
  char pattern[] = "/tmp/posenc_tables_XXXXXX";
  return mkdtemp(pattern);
}

void Write(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary) << bytes;
}

std::mt19937& Rng() {
  static std::mt19937 rng = [] {
    const char* env = std::getenv("POSENC_TEST_SEED");
    const uint32_t seed = env != nullptr ? static_cast<uint32_t>(std::strtoul(env, nullptr, 10))
                                         : std::random_device{}();
    std::printf("random seed %u (POSENC_TEST_SEED=%u repeats it)\n", seed, seed);
    return std::mt19937(seed);
  }();
  return rng;
}

LearnedTable RandomTable(int64_t rows, int64_t dim) {
  LearnedTable t;
  t.rows = rows;
  t.dim = dim;
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int64_t i = 0; i < rows * dim; ++i) t.values.push_back(u(Rng()));
  return t;
}

// A one-table file named `name` holding a random [rows, dim] table.
LearnedTable WriteTable(const fs::path& file, const std::string& name, int64_t rows = 8,
                        int64_t dim = 4) {
  LearnedTable t = RandomTable(rows, dim);
  Write(file, SerializeSafetensors({{name, &t}}));
  return t;
}

// A file whose header is `header` verbatim and whose data is `data_bytes` zeros.
std::string RawFile(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i)
    out[i] = static_cast<char>((uint64_t{header.size()} >> (8 * i)) & 0xff);
  return out + header + std::string(data_bytes, '\0');
}

// Runs Reload() on its own thread; false if it did not finish in time. The
// repository is shared so a hung reload outliving the test stays valid.
bool ReloadWithin(const std::shared_ptr<TableRepository>& repo,
                  std::chrono::milliseconds limit = kReloadDeadline) {
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> finished = done->get_future();
  std::thread([repo, done] {
    repo->Reload().IgnoreError();
    done->set_value();
  }).detach();
  return finished.wait_for(limit) == std::future_status::ready;
}

// The skipped() line that mentions `file`, or "" if none.
std::string SkipReason(const TableRepository& repo, const std::string& file) {
  for (const std::string& s : repo.skipped()) {
    if (s.find(file) != std::string::npos) return s;
  }
  return "";
}

class TableRepositoryTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = TempDir(); }
  void TearDown() override { fs::remove_all(dir_); }

  std::shared_ptr<TableRepository> Repo(TableRepositoryOptions o = {}) {
    o.dir = dir_.string();
    return std::make_shared<TableRepository>(std::move(o));
  }

  // Reloads within the deadline; the table `good/pos` must load every time.
  void ReloadAndExpectGood(const std::shared_ptr<TableRepository>& repo) {
    ASSERT_TRUE(ReloadWithin(repo)) << "Reload() did not return within 20 s";
    auto found = repo->Find("good/pos");
    ASSERT_TRUE(found.ok()) << found.status();
    EXPECT_EQ((*found)->values, good_.values);
  }

  fs::path dir_;
  LearnedTable good_;
};

TEST_F(TableRepositoryTest, LoadsSkipsMalformedAndReloads) {
  const LearnedTable t = WriteTable(dir_ / "bert.safetensors", "position_embeddings");
  Write(dir_ / "broken.safetensors", "not a safetensors file at all");
  Write(dir_ / "notes.txt", "ignored");

  TableRepository repo(dir_.string());
  EXPECT_TRUE(repo.Reload().ok());
  ASSERT_EQ(repo.List().size(), 1u);
  auto found = repo.Find("bert/position_embeddings");
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ((*found)->rows, 8);
  EXPECT_EQ((*found)->values, t.values);
  ASSERT_EQ(repo.skipped().size(), 1u);
  EXPECT_NE(repo.skipped()[0].find("broken.safetensors"), std::string::npos);

  auto missing = repo.Find("gpt2/wpe");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("bert/position_embeddings"), absl::string_view::npos);

  // Reload without restart: a new file appears, the held table survives.
  std::shared_ptr<const LearnedTable> held = *found;
  WriteTable(dir_ / "gpt2.safetensors", "wpe");
  fs::remove(dir_ / "bert.safetensors");
  EXPECT_TRUE(repo.Reload().ok());
  EXPECT_TRUE(repo.Find("gpt2/wpe").ok());
  EXPECT_FALSE(repo.Find("bert/position_embeddings").ok());
  EXPECT_EQ(held->values, t.values);
}

// The shapes the security review found: each file is skipped with a reason;
// none crashes, none loads as a table with negative rows.
TEST_F(TableRepositoryTest, HostileShapesSkipTheFileNotTheServer) {
  good_ = WriteTable(dir_ / "good.safetensors", "pos");
  const auto entry = [](const std::string& shape, const std::string& offsets) {
    return absl::StrCat(R"({"w":{"dtype":"F32","shape":)", shape, R"(,"data_offsets":)", offsets,
                        "}}");
  };
  Write(dir_ / "u64max.safetensors", RawFile(entry("[18446744073709551615,2]", "[0,8]"), 8));
  Write(dir_ / "over_int64.safetensors", RawFile(entry("[9223372036854775808,1]", "[0,4]"), 4));
  Write(dir_ / "wraps.safetensors",
        RawFile(entry("[13835058055282163712,18446744073709551615]", "[0,0]"), 0));
  Write(dir_ / "neg_rows.safetensors", RawFile(entry("[18446744073709551615,0]", "[0,0]"), 0));
  Write(dir_ / "overlap.safetensors",
        RawFile(R"({"a":{"dtype":"F32","shape":[1,2],"data_offsets":[0,8]},)"
                R"("b":{"dtype":"F32","shape":[1,2],"data_offsets":[4,12]}})",
                12));
  auto repo = Repo();
  ReloadAndExpectGood(repo);
  for (const TableEntry& e : repo->List()) {
    EXPECT_GT(e.table->rows, 0) << e.table->name;
    EXPECT_GT(e.table->dim, 0) << e.table->name;
  }
  EXPECT_EQ(repo->List().size(), 1u);
  EXPECT_NE(SkipReason(*repo, "u64max.safetensors").find("'w'"), std::string::npos);
  EXPECT_NE(SkipReason(*repo, "over_int64.safetensors").find("2^64"), std::string::npos);
  EXPECT_NE(SkipReason(*repo, "wraps.safetensors").find("2^64"), std::string::npos);
  EXPECT_NE(SkipReason(*repo, "neg_rows.safetensors").find("is empty"), std::string::npos);
  EXPECT_NE(SkipReason(*repo, "overlap.safetensors").find("overlap"), std::string::npos);
}

TEST_F(TableRepositoryTest, FifoIsSkippedWithoutBlocking) {
  good_ = WriteTable(dir_ / "good.safetensors", "pos");
  ASSERT_EQ(mkfifo((dir_ / "x.safetensors").c_str(), 0600), 0);
  auto repo = Repo();
  ReloadAndExpectGood(repo);
  EXPECT_NE(SkipReason(*repo, "x.safetensors").find("is a FIFO"), std::string::npos)
      << absl::StrJoin(repo->skipped(), "\n");
}

TEST_F(TableRepositoryTest, DirectoriesAndSocketsAreSkipped) {
  good_ = WriteTable(dir_ / "good.safetensors", "pos");
  fs::create_directory(dir_ / "d.safetensors");
  WriteTable(dir_ / "d.safetensors" / "nested.safetensors", "pos");  // not scanned
  const int sock = socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(sock, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string sock_path = (dir_ / "s.safetensors").string();
  ASSERT_LT(sock_path.size(), sizeof(addr.sun_path));
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", sock_path.c_str());
  ASSERT_EQ(bind(sock, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  auto repo = Repo();
  ReloadAndExpectGood(repo);
  close(sock);
  EXPECT_EQ(repo->List().size(), 1u);
  EXPECT_NE(SkipReason(*repo, "d.safetensors").find("is a directory"), std::string::npos);
  EXPECT_NE(SkipReason(*repo, "s.safetensors").find("is a socket"), std::string::npos);
}

TEST_F(TableRepositoryTest, SymlinksInsideTheDirectoryLoad) {
  good_ = WriteTable(dir_ / "good.safetensors", "pos");
  fs::create_symlink("good.safetensors", dir_ / "alias.safetensors");
  // The ConfigMap layout: name -> ..data/name, ..data -> a timestamped dir.
  fs::create_directory(dir_ / "..2024_01_01");
  const LearnedTable cm = WriteTable(dir_ / "..2024_01_01" / "cm.safetensors", "pos");
  fs::create_directory_symlink("..2024_01_01", dir_ / "..data");
  fs::create_symlink("..data/cm.safetensors", dir_ / "cm.safetensors");
  auto repo = Repo();
  ReloadAndExpectGood(repo);
  auto alias = repo->Find("alias/pos");
  ASSERT_TRUE(alias.ok()) << alias.status();
  EXPECT_EQ((*alias)->values, good_.values);
  auto via_data = repo->Find("cm/pos");
  ASSERT_TRUE(via_data.ok()) << via_data.status() << absl::StrJoin(repo->skipped(), "\n");
  EXPECT_EQ((*via_data)->values, cm.values);
  EXPECT_TRUE(repo->skipped().empty()) << absl::StrJoin(repo->skipped(), "\n");
}

TEST_F(TableRepositoryTest, SymlinksOutsideTheDirectoryNeedTheOption) {
  good_ = WriteTable(dir_ / "good.safetensors", "pos");
  const fs::path outside = TempDir();
  const LearnedTable ext = WriteTable(outside / "ext.safetensors", "pos");
  fs::create_symlink(outside / "ext.safetensors", dir_ / "ext.safetensors");
  // A relative link climbing out is outside too.
  fs::create_symlink(fs::path("..") / outside.filename() / "ext.safetensors",
                     dir_ / "climb.safetensors");

  auto strict = Repo();
  ReloadAndExpectGood(strict);
  EXPECT_FALSE(strict->Find("ext/pos").ok());
  EXPECT_NE(SkipReason(*strict, "ext.safetensors").find("is outside"), std::string::npos);
  EXPECT_NE(SkipReason(*strict, "climb.safetensors").find("is outside"), std::string::npos);

  TableRepositoryOptions o;
  o.allow_external_symlinks = true;
  auto lenient = Repo(o);
  ReloadAndExpectGood(lenient);
  auto found = lenient->Find("ext/pos");
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ((*found)->values, ext.values);
  EXPECT_TRUE(lenient->Find("climb/pos").ok());
  fs::remove_all(outside);
}

TEST_F(TableRepositoryTest, SymlinksToDevicesFifosAndNowhereAreSkipped) {
  good_ = WriteTable(dir_ / "good.safetensors", "pos");
  fs::create_symlink("/dev/zero", dir_ / "zero.safetensors");
  fs::create_symlink("/dev/null", dir_ / "null.safetensors");
  fs::create_symlink("missing.safetensors", dir_ / "dangling.safetensors");
  fs::create_symlink("loop.safetensors", dir_ / "loop.safetensors");
  ASSERT_EQ(mkfifo((dir_ / "fifo").c_str(), 0600), 0);
  fs::create_symlink("fifo", dir_ / "tofifo.safetensors");
  fs::create_directory(dir_ / "sub");
  fs::create_symlink("sub", dir_ / "todir.safetensors");

  for (bool allow : {false, true}) {
    SCOPED_TRACE(allow ? "external symlinks allowed" : "external symlinks refused");
    TableRepositoryOptions o;
    o.allow_external_symlinks = allow;
    auto repo = Repo(o);
    ReloadAndExpectGood(repo);
    EXPECT_EQ(repo->List().size(), 1u);
    const std::string device = allow ? "is a character device" : "is outside";
    EXPECT_NE(SkipReason(*repo, "zero.safetensors").find(device), std::string::npos);
    EXPECT_NE(SkipReason(*repo, "null.safetensors").find(device), std::string::npos);
    EXPECT_NE(SkipReason(*repo, "dangling.safetensors").find("cannot resolve"), std::string::npos);
    EXPECT_NE(SkipReason(*repo, "loop.safetensors").find("cannot resolve"), std::string::npos);
    EXPECT_NE(SkipReason(*repo, "tofifo.safetensors").find("is a FIFO"), std::string::npos);
    EXPECT_NE(SkipReason(*repo, "todir.safetensors").find("is a directory"), std::string::npos);
  }
}

TEST_F(TableRepositoryTest, FilesOverTheSizeLimitsAreSkipped) {
  good_ = WriteTable(dir_ / "good.safetensors", "pos", 8, 4);  // 128 B of floats
  WriteTable(dir_ / "big.safetensors", "pos", 64, 64);         // 16 KiB file
  WriteTable(dir_ / "hugeish.safetensors", "pos", 16, 8);      // 512 B of floats
  TableRepositoryOptions o;
  o.max_file_bytes = 4096;
  o.max_total_bytes = 128 + 256;  // good fits, hugeish (sorted after good) does not
  auto repo = Repo(o);
  ReloadAndExpectGood(repo);
  EXPECT_EQ(repo->List().size(), 1u);
  EXPECT_NE(SkipReason(*repo, "big.safetensors").find("over the limit of 4096"), std::string::npos);
  const std::string total = SkipReason(*repo, "hugeish.safetensors");
  EXPECT_NE(total.find("need 512 bytes as float32"), std::string::npos) << total;
  EXPECT_NE(total.find("max_total_bytes is 384; 128 already loaded"), std::string::npos) << total;
}

// File names become table names and skipped() lines, sent as proto3 strings;
// one that is not UTF-8 would make every ListTables reply unparseable.
TEST_F(TableRepositoryTest, FileNamesMustBePrintableUtf8) {
  good_ = WriteTable(dir_ / "good.safetensors", "pos");
  WriteTable(dir_ / "\xff\xfe.safetensors", "pos");
  WriteTable(dir_ / "ctl\n.safetensors", "pos");
  WriteTable(dir_ / "\xed\xa0\x80.safetensors", "pos");  // a UTF-16 surrogate
  const LearnedTable utf8 = WriteTable(dir_ / "\xc3\xa9t\xc3\xa9.safetensors", "pos");
  auto repo = Repo();
  ReloadAndExpectGood(repo);
  auto found = repo->Find("\xc3\xa9t\xc3\xa9/pos");
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ((*found)->values, utf8.values);
  EXPECT_EQ(repo->List().size(), 2u);
  ASSERT_EQ(repo->skipped().size(), 3u) << absl::StrJoin(repo->skipped(), "\n");
  EXPECT_NE(SkipReason(*repo, "\\xff\\xfe.safetensors").find("not printable UTF-8"),
            std::string::npos);
  EXPECT_NE(SkipReason(*repo, "ctl\\n.safetensors").find("not printable UTF-8"), std::string::npos);
  EXPECT_NE(SkipReason(*repo, "\\xed\\xa0\\x80.safetensors").find("not printable UTF-8"),
            std::string::npos);
}

TEST_F(TableRepositoryTest, SkippedListStaysShort) {
  good_ = WriteTable(dir_ / "good.safetensors", "pos");
  for (int i = 0; i < 300; ++i) Write(dir_ / absl::StrCat("bad", i, ".safetensors"), "junk");
  auto repo = Repo();
  ReloadAndExpectGood(repo);
  const std::vector<std::string> skipped = repo->skipped();
  ASSERT_EQ(skipped.size(), 256u);
  EXPECT_EQ(skipped.back(), "45 more skipped entries not listed");
}

TEST_F(TableRepositoryTest, CancelledReloadKeepsThePreviousSet) {
  good_ = WriteTable(dir_ / "good.safetensors", "pos");
  auto repo = Repo();
  ReloadAndExpectGood(repo);
  WriteTable(dir_ / "later.safetensors", "pos");
  EXPECT_EQ(repo->Reload([] { return true; }).code(), absl::StatusCode::kCancelled);
  EXPECT_FALSE(repo->Find("later/pos").ok());
  EXPECT_TRUE(repo->Find("good/pos").ok());
  // Cancelled after the first file: nothing of the partial scan is swapped in.
  int polls = 0;
  EXPECT_EQ(repo->Reload([&] { return ++polls > 3; }).code(), absl::StatusCode::kCancelled);
  EXPECT_FALSE(repo->Find("later/pos").ok());
  EXPECT_TRUE(repo->Reload([] { return false; }).ok());
  EXPECT_TRUE(repo->Find("later/pos").ok());
}

// While a reload is inside its I/O, Find and List answer, a second reload
// waits its turn (and can give up waiting), and the first finishes.
TEST_F(TableRepositoryTest, ReloadBlocksNeitherReadersNorShutdown) {
  good_ = WriteTable(dir_ / "good.safetensors", "pos");
  auto repo = Repo();
  ReloadAndExpectGood(repo);
  WriteTable(dir_ / "later.safetensors", "pos");

  // The first reload parks inside its cancellation poll (between files).
  std::promise<void> parked, release;
  std::shared_future<void> released = release.get_future().share();
  // Whatever fails below, the parked reload is let go so the test ends.
  struct Releaser {
    std::promise<void>* p;
    bool done = false;
    void operator()() {
      if (!done) p->set_value();
      done = true;
    }
    ~Releaser() { (*this)(); }
  } let_go{&release};
  std::atomic<bool> once{false};
  auto first = std::async(std::launch::async, [&] {
    return repo
        ->Reload([&] {
          if (!once.exchange(true)) {
            parked.set_value();
            released.wait();
          }
          return false;
        })
        .ok();
  });
  ASSERT_EQ(parked.get_future().wait_for(kReloadDeadline), std::future_status::ready);

  // Readers do not wait for the parked reload (which waits for this test):
  // one that did would never finish.
  auto reads = std::async(std::launch::async, [&] {
    return repo->Find("good/pos").ok() && repo->List().size() == 1u && repo->skipped().empty();
  });
  if (reads.wait_for(kReloadDeadline) != std::future_status::ready) {
    let_go();  // so that the reader, and with it `reads`' destructor, can finish
    FAIL() << "a reader waited for the reload";
  }
  EXPECT_TRUE(reads.get());

  std::atomic<bool> second_done{false};
  auto second = std::async(std::launch::async, [&] {
    const bool ok = repo->Reload().ok();
    second_done = true;
    return ok;
  });
  for (const auto end = std::chrono::steady_clock::now() + kReloadDeadline;
       !repo->reload_waiting() && std::chrono::steady_clock::now() < end;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(repo->reload_waiting());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(second_done) << "a second reload ran alongside the first";
  // A third, while one runs and one waits, is refused at once: it holds no
  // thread (ReloadGate; its cancellation while waiting: reload_gate_test).
  EXPECT_EQ(repo->Reload().code(), absl::StatusCode::kResourceExhausted);

  let_go();
  ASSERT_EQ(first.wait_for(kReloadDeadline), std::future_status::ready);
  EXPECT_TRUE(first.get());
  ASSERT_EQ(second.wait_for(kReloadDeadline), std::future_status::ready);
  EXPECT_TRUE(second.get());
  EXPECT_TRUE(repo->Find("later/pos").ok());
}

TEST(TableRepository, EmptyDirIsARepositoryWithNoTables) {
  TableRepository repo("");
  EXPECT_TRUE(repo.Reload().ok());
  EXPECT_TRUE(repo.List().empty());
  EXPECT_TRUE(repo.skipped().empty());
  EXPECT_NE(repo.Find("a/b").status().message().find("no --table_dir"), absl::string_view::npos);
  TableRepository missing("/nonexistent/posenc/tables");
  EXPECT_TRUE(missing.Reload().ok());
  ASSERT_EQ(missing.skipped().size(), 1u);
  EXPECT_NE(missing.skipped()[0].find("cannot resolve directory"), std::string::npos);
}

}  // namespace
}  // namespace posenc::server
