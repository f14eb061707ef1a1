#include "engine/repository_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "engine/utf8.h"

namespace posenc::server {

// File names become table names and appear in skipped(), both sent as
// proto3 strings: one invalid name would make every ListTables reply
// unparseable by clients.
bool IsPrintableUtf8(absl::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) return false;
    const size_t n = Utf8SequenceAt(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

namespace {

namespace fs = std::filesystem;

// Cancellation is checked between chunks, so a reload reading a large file
// is abandoned within one chunk's read (milliseconds from page cache).
constexpr size_t kReadChunkBytes = size_t{8} << 20;

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

// `path` for messages: as is when printable, else with the name escaped.
std::string PrintablePathImpl(const fs::path& path) {
  const std::string name = path.filename().string();
  if (IsPrintableUtf8(name)) return path.string();
  return (path.parent_path() / absl::CHexEscape(name)).string();
}

// True if `p` names something strictly inside `dir` (both canonical).
bool IsInside(const fs::path& p, const fs::path& dir) {
  auto [d, q] = std::mismatch(dir.begin(), dir.end(), p.begin(), p.end());
  return d == dir.end() && q != p.end();
}

// The path to open for directory entry `path` and what it should be (stat).
// Symlinks resolve fully and must land inside the directory unless allowed.
absl::StatusOr<fs::path> Resolve(const fs::path& path, const RepositoryFileLimits& limits,
                                 struct stat* st) {
  if (lstat(path.c_str(), st) != 0) return Errno("cannot stat");
  if (!S_ISLNK(st->st_mode)) return path;
  std::error_code ec;
  fs::path target = fs::canonical(path, ec);
  if (ec)
    return absl::FailedPreconditionError(absl::StrCat("cannot resolve symlink: ", ec.message()));
  if (!limits.allow_external_symlinks && !IsInside(target, limits.canonical_dir)) {
    return absl::FailedPreconditionError(absl::StrCat("symlink target ", target.string(),
                                                      " is outside ", limits.canonical_dir.string(),
                                                      " (external symlinks are not allowed)"));
  }
  if (stat(target.c_str(), st) != 0) return Errno(absl::StrCat("cannot stat ", target.string()));
  return target;
}

// Exactly `size` bytes (the size fstat reported): a file growing meanwhile
// cannot make the read unbounded, and one shrinking is an error.
absl::StatusOr<std::string> ReadExactly(int fd, int64_t size,
                                        const std::function<bool()>& cancelled) {
  std::string bytes;
  bytes.resize(static_cast<size_t>(size));
  size_t done = 0;
  while (done < bytes.size()) {
    if (cancelled && cancelled()) return absl::CancelledError("reload cancelled");
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

// Reads a regular file without ever blocking on open: the type is checked
// before opening (opening a device can have side effects) and again on the
// descriptor, which closes the race with the entry being replaced meanwhile.
absl::StatusOr<std::string> ReadRegularFile(const fs::path& path,
                                            const RepositoryFileLimits& limits,
                                            const std::function<bool()>& cancelled) {
  struct stat expected {};
  absl::StatusOr<fs::path> target = Resolve(path, limits, &expected);
  if (!target.ok()) return target.status();
  const std::string via =
      *target == path ? "" : absl::StrCat(" (via symlink to ", target->string(), ")");
  if (!S_ISREG(expected.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("is ", KindOf(expected.st_mode), via, ", not a regular file"));
  }
  if (expected.st_size > limits.max_file_bytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        "is ", expected.st_size, " bytes", via, ", over the limit of ", limits.max_file_bytes));
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
  if (actual.st_size > limits.max_file_bytes) {
    return absl::FailedPreconditionError(
        absl::StrCat("is ", actual.st_size, " bytes, over the limit of ", limits.max_file_bytes));
  }
  return ReadExactly(fd.get(), actual.st_size, cancelled);
}

}  // namespace

absl::StatusOr<std::string> ReadRepositoryFile(const fs::path& path,
                                               const RepositoryFileLimits& limits,
                                               const std::function<bool()>& cancelled) {
  return ReadRegularFile(path, limits, cancelled);
}

std::string PrintablePath(const fs::path& path) { return PrintablePathImpl(path); }

}  // namespace posenc::server
