#include "table_repository.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <new>
#include <optional>
#include <system_error>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "safetensors.h"

namespace posenc::server {
namespace {

namespace fs = std::filesystem;

// Cancellation is checked between chunks, so a reload reading a large file
// is abandoned within one chunk's read (milliseconds from page cache).
constexpr size_t kReadChunkBytes = size_t{8} << 20;
// skipped() goes out in every ListTables and ReloadTables reply; this many
// lines (each at most a few hundred bytes) keep a directory full of bad files
// from pushing replies toward gRPC's 4 MiB default message limit.
constexpr size_t kMaxSkippedLines = 256;
// How often a reload waiting behind another checks for cancellation.
constexpr auto kLockPoll = std::chrono::milliseconds(20);

class UniqueFd {
 public:
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

absl::Status Errno(absl::string_view what) {
  return absl::FailedPreconditionError(absl::StrCat(what, ": ", std::strerror(errno)));
}

const char* KindOf(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symlink";
  return "not a regular file";
}

// True if `s` is valid UTF-8 without control characters. File names become
// table names and appear in skipped(), both sent as proto3 strings: one
// invalid name would make every ListTables reply unparseable by clients.
bool IsPrintableUtf8(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) return false;
    if (c < 0x80) {
      ++i;
      continue;
    }
    // Lead byte: continuation count and the range of the second byte, which
    // excludes overlong forms, surrogates and code points past U+10FFFF.
    int more = 0;
    unsigned char lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) {
      more = 1;
    } else if (c >= 0xe0 && c <= 0xef) {
      more = 2;
      if (c == 0xe0) lo = 0xa0;
      if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      more = 3;
      if (c == 0xf0) lo = 0x90;
      if (c == 0xf4) hi = 0x8f;
    } else {
      return false;
    }
    if (s.size() - i <= static_cast<size_t>(more)) return false;
    for (int k = 1; k <= more; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xbf)) return false;
    }
    i += more + 1;
  }
  return true;
}

// `path` for messages: as is when printable, else with the name escaped.
std::string Printable(const fs::path& path) {
  const std::string name = path.filename().string();
  if (IsPrintableUtf8(name)) return path.string();
  return (path.parent_path() / absl::CHexEscape(name)).string();
}

// Keeps the first kMaxSkippedLines and counts the rest.
void CapSkipped(std::vector<std::string>* lines) {
  if (lines->size() <= kMaxSkippedLines) return;
  const size_t unlisted = lines->size() - (kMaxSkippedLines - 1);
  lines->resize(kMaxSkippedLines - 1);
  lines->push_back(absl::StrCat(unlisted, " more skipped entries not listed"));
}

// True if `p` names something strictly inside `dir` (both canonical).
bool IsInside(const fs::path& p, const fs::path& dir) {
  auto [d, q] = std::mismatch(dir.begin(), dir.end(), p.begin(), p.end());
  return d == dir.end() && q != p.end();
}

// One reload's work: lists the directory and loads each file into a fresh
// set, which Reload() swaps in only if the scan ran to the end.
class Scan {
 public:
  Scan(const TableRepositoryOptions& options, const std::function<bool()>& cancelled)
      : options_(options), cancelled_(cancelled) {}

  // False if cancelled part-way.
  bool Run();

  std::map<std::string, TableEntry, std::less<>> tables;
  std::vector<std::string> skipped;

 private:
  bool Cancelled() const { return cancelled_ && cancelled_(); }
  std::optional<std::vector<fs::path>> ListFiles();
  // False if cancelled; otherwise the file's tables or its reason are recorded.
  bool LoadFile(const fs::path& path);
  bool LoadFileOrThrow(const fs::path& path);
  absl::StatusOr<fs::path> Resolve(const fs::path& path, struct stat* st) const;
  absl::StatusOr<std::string> ReadRegularFile(const fs::path& path) const;
  absl::StatusOr<std::string> ReadExactly(int fd, int64_t size) const;

  const TableRepositoryOptions& options_;
  const std::function<bool()>& cancelled_;
  fs::path canonical_dir_;
  int64_t loaded_bytes_ = 0;  // float32 bytes of `tables`
};

bool Scan::Run() {
  if (options_.dir.empty()) return true;
  std::error_code ec;
  canonical_dir_ = fs::canonical(options_.dir, ec);
  if (ec) {
    skipped.push_back(absl::StrCat(options_.dir, ": cannot resolve directory: ", ec.message()));
    return true;
  }
  std::optional<std::vector<fs::path>> files = ListFiles();
  if (!files) return false;
  for (const fs::path& path : *files) {
    if (Cancelled() || !LoadFile(path)) return false;
  }
  return true;
}

std::optional<std::vector<fs::path>> Scan::ListFiles() {
  std::vector<fs::path> files;
  int64_t not_considered = 0;
  std::error_code ec;
  // increment(ec), not a range-for: operator++ throws on a listing error.
  for (fs::directory_iterator it(options_.dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (Cancelled()) return std::nullopt;
    if (it->path().extension() != ".safetensors") continue;
    if (static_cast<int64_t>(files.size()) < options_.max_files) {
      files.push_back(it->path());
    } else {
      ++not_considered;
    }
  }
  if (ec) skipped.push_back(absl::StrCat(options_.dir, ": cannot list directory: ", ec.message()));
  if (not_considered > 0) {
    skipped.push_back(absl::StrCat(options_.dir, ": ", not_considered,
                                   " more .safetensors files not considered (max_files is ",
                                   options_.max_files, ")"));
  }
  std::sort(files.begin(), files.end());
  return files;
}

bool Scan::LoadFile(const fs::path& path) {
  // The file's bytes and tables can be large; running out of memory on one
  // file skips that file rather than ending the reload.
  try {
    return LoadFileOrThrow(path);
  } catch (const std::bad_alloc&) {
    skipped.push_back(absl::StrCat(Printable(path), ": out of memory while loading"));
    return true;
  }
}

bool Scan::LoadFileOrThrow(const fs::path& path) {
  const std::string where = Printable(path);
  if (where != path.string()) {
    skipped.push_back(absl::StrCat(where, ": file name is not printable UTF-8"));
    return true;
  }
  absl::StatusOr<std::string> bytes = ReadRegularFile(path);
  if (absl::IsCancelled(bytes.status())) return false;
  if (!bytes.ok()) {
    skipped.push_back(absl::StrCat(where, ": ", bytes.status().message()));
    return true;
  }
  SafetensorsLimits limits;
  limits.max_table_bytes =
      static_cast<uint64_t>(std::max<int64_t>(0, options_.max_total_bytes - loaded_bytes_));
  absl::StatusOr<SafetensorsContents> contents =
      ParseSafetensors(*bytes, path.stem().string(), limits);
  if (!contents.ok()) {
    skipped.push_back(absl::StrCat(where, ": ", contents.status().message()));
    if (absl::IsResourceExhausted(contents.status())) {
      absl::StrAppend(&skipped.back(), " (max_total_bytes is ", options_.max_total_bytes, "; ",
                      loaded_bytes_, " already loaded)");
    }
    return true;
  }
  for (const auto& t : contents->tables) {
    loaded_bytes_ += static_cast<int64_t>(t->values.size() * sizeof(float));
    tables[t->name] = TableEntry{t, where};
  }
  for (auto& s : contents->skipped) skipped.push_back(absl::StrCat(where, ": ", s));
  return true;
}

// The path to open for directory entry `path` and what it should be (stat).
// Symlinks resolve fully and must land inside the directory unless allowed.
absl::StatusOr<fs::path> Scan::Resolve(const fs::path& path, struct stat* st) const {
  if (lstat(path.c_str(), st) != 0) return Errno("cannot stat");
  if (!S_ISLNK(st->st_mode)) return path;
  std::error_code ec;
  fs::path target = fs::canonical(path, ec);
  if (ec)
    return absl::FailedPreconditionError(absl::StrCat("cannot resolve symlink: ", ec.message()));
  if (!options_.allow_external_symlinks && !IsInside(target, canonical_dir_)) {
    return absl::FailedPreconditionError(absl::StrCat("symlink target ", target.string(),
                                                      " is outside ", canonical_dir_.string(),
                                                      " (external symlinks are not allowed)"));
  }
  if (stat(target.c_str(), st) != 0) return Errno(absl::StrCat("cannot stat ", target.string()));
  return target;
}

// Reads a regular file without ever blocking on open: the type is checked
// before opening (opening a device can have side effects) and again on the
// descriptor, which closes the race with the entry being replaced meanwhile.
absl::StatusOr<std::string> Scan::ReadRegularFile(const fs::path& path) const {
  struct stat expected {};
  absl::StatusOr<fs::path> target = Resolve(path, &expected);
  if (!target.ok()) return target.status();
  const std::string via =
      *target == path ? "" : absl::StrCat(" (via symlink to ", target->string(), ")");
  if (!S_ISREG(expected.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("is ", KindOf(expected.st_mode), via, ", not a regular file"));
  }
  if (expected.st_size > options_.max_file_bytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        "is ", expected.st_size, " bytes", via, ", over the limit of ", options_.max_file_bytes));
  }
  // O_NOFOLLOW: `target` has no symlink left, so one appearing now is a swap.
  UniqueFd fd(open(target->c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY));
  if (fd.get() < 0) return Errno("cannot open");
  struct stat actual {};
  if (fstat(fd.get(), &actual) != 0) return Errno("cannot stat the open file");
  if (!S_ISREG(actual.st_mode) || actual.st_dev != expected.st_dev ||
      actual.st_ino != expected.st_ino) {
    return absl::FailedPreconditionError("was replaced while being opened");
  }
  if (actual.st_size > options_.max_file_bytes) {
    return absl::FailedPreconditionError(
        absl::StrCat("is ", actual.st_size, " bytes, over the limit of ", options_.max_file_bytes));
  }
  return ReadExactly(fd.get(), actual.st_size);
}

// Exactly `size` bytes (the size fstat reported): a file growing meanwhile
// cannot make the read unbounded, and one shrinking is an error.
absl::StatusOr<std::string> Scan::ReadExactly(int fd, int64_t size) const {
  std::string bytes;
  bytes.resize(static_cast<size_t>(size));
  size_t done = 0;
  while (done < bytes.size()) {
    if (Cancelled()) return absl::CancelledError("reload cancelled");
    const size_t want = std::min(kReadChunkBytes, bytes.size() - done);
    const ssize_t n = read(fd, bytes.data() + done, want);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno("cannot read");
    if (n == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("shrank while being read (", done, " of ", size, " bytes)"));
    }
    done += static_cast<size_t>(n);
  }
  return bytes;
}

}  // namespace

TableRepository::TableRepository(TableRepositoryOptions options) : options_(std::move(options)) {}

TableRepository::TableRepository(std::string dir)
    : TableRepository(TableRepositoryOptions{std::move(dir)}) {}

bool TableRepository::BeginReload(const std::function<bool()>& cancelled) {
  std::unique_lock<std::mutex> lock(reload_mu_);
  while (reloading_) {
    if (cancelled) {
      lock.unlock();  // the predicate is the caller's code: never run it under our lock
      if (cancelled()) return false;
      lock.lock();
      if (!reloading_) break;
    }
    reload_done_.wait_for(lock, kLockPoll);
  }
  reloading_ = true;
  return true;
}

void TableRepository::EndReload() {
  {
    std::lock_guard<std::mutex> lock(reload_mu_);
    reloading_ = false;
  }
  reload_done_.notify_one();
}

bool TableRepository::Reload(const std::function<bool()>& cancelled) {
  if (!BeginReload(cancelled)) return false;
  struct End {
    TableRepository* repo;
    ~End() { repo->EndReload(); }
  } end{this};
  Scan scan(options_, cancelled);
  bool complete = false;
  try {
    complete = scan.Run();
  } catch (const std::exception& e) {
    // Out of memory or a filesystem error we did not foresee: report it
    // rather than let it take down the server, keeping what loaded so far.
    scan.skipped.push_back(absl::StrCat(options_.dir, ": reload stopped early: ", e.what()));
    complete = true;
  }
  if (!complete) return false;
  CapSkipped(&scan.skipped);
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::swap(tables_, scan.tables);
    std::swap(skipped_, scan.skipped);
  }
  return true;  // the old set is freed here, outside the lock
}

absl::StatusOr<std::shared_ptr<const LearnedTable>> TableRepository::Find(
    absl::string_view name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tables_.find(name);
  if (it != tables_.end()) return it->second.table;
  std::vector<absl::string_view> names;
  for (const auto& [n, e] : tables_) names.push_back(n);
  return absl::NotFoundError(absl::StrCat(
      "table '", name, "' does not exist; tables: ",
      names.empty() ? "(none" + (options_.dir.empty() ? std::string("; no --table_dir") : "") + ")"
                    : absl::StrJoin(names, ", ")));
}

std::vector<TableEntry> TableRepository::List() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<TableEntry> out;
  for (const auto& [n, e] : tables_) out.push_back(e);
  return out;
}

std::vector<std::string> TableRepository::skipped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return skipped_;
}

}  // namespace posenc::server
