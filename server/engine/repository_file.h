// Reading one entry of a repository directory that replicas share through a
// volume (the table repository, the KServe model repository): its contents
// and even its file types are untrusted, so entries are read only when they
// are regular files within a size limit, never with a blocking open, and
// symlinks only when they resolve inside the directory.
#ifndef POSENC_SERVER_ENGINE_REPOSITORY_FILE_H_
#define POSENC_SERVER_ENGINE_REPOSITORY_FILE_H_

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace posenc::server {

struct RepositoryFileLimits {
  // fs::canonical of the repository directory.
  std::filesystem::path canonical_dir;
  // Follow symlinks whose fully resolved target lies outside the directory.
  bool allow_external_symlinks = false;
  int64_t max_file_bytes = 0;
};

// The bytes of directory entry `path`. FAILED_PRECONDITION saying why not
// (not a regular file, too large, a symlink leading out, replaced while
// opened, shrank while read); CANCELLED once `cancelled` (may be empty),
// polled between read chunks, returns true.
[[nodiscard]] absl::StatusOr<std::string> ReadRepositoryFile(
    const std::filesystem::path& path, const RepositoryFileLimits& limits,
    const std::function<bool()>& cancelled);

// True if `s` is valid UTF-8 without control characters (names and
// messages go out as proto3 strings, which must be valid UTF-8).
bool IsPrintableUtf8(absl::string_view s);

// `path` for messages: as is when its name is printable, else escaped.
std::string PrintablePath(const std::filesystem::path& path);

}  // namespace posenc::server

#endif  // POSENC_SERVER_ENGINE_REPOSITORY_FILE_H_
