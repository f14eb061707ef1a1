// The learned-table repository (SPEC §2.3): every .safetensors file in a
// directory, loaded at start-up and reloadable without a restart. Replicas
// share the directory through a volume, as Triton shares its model repository,
// so its contents are untrusted: a bad entry is skipped with its reason and
// never stops the others from loading, crashes, or blocks the server.
#ifndef POSENC_SERVER_ENGINE_TABLE_REPOSITORY_H_
#define POSENC_SERVER_ENGINE_TABLE_REPOSITORY_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "posenc/absolute.h"

namespace posenc::server {

struct TableEntry {
  std::shared_ptr<const LearnedTable> table;
  std::string file;
};

struct TableRepositoryOptions {
  std::string dir;  // empty: a repository with no tables
  // Symlinks are followed only when their fully resolved target lies inside
  // `dir` (Kubernetes ConfigMap volumes link through ..data/), so a link
  // cannot pull in files from elsewhere on the node unless this is set.
  bool allow_external_symlinks = false;
  // Files larger than this are skipped unread. A file is read into memory
  // whole; 1 GiB holds a [2^18, 1024] float32 table, far beyond real ones.
  int64_t max_file_bytes = int64_t{1} << 30;
  // float32 bytes of all loaded tables together (F16/BF16 sources double in
  // size). Files that would exceed it are skipped, in name order.
  int64_t max_total_bytes = int64_t{2} << 30;
  // .safetensors entries considered per reload; the rest are reported as not
  // considered. Bounds the time and the skipped() list a flooded directory costs.
  int max_files = 4096;
};

class TableRepository {
 public:
  explicit TableRepository(TableRepositoryOptions options);
  // The defaults above, for `dir` (an empty `dir` is a repository with no tables).
  explicit TableRepository(std::string dir);

  // Rescans the directory and swaps in the new set at once; calls already
  // holding a table keep it. Bad files are skipped and reported in skipped().
  // Only regular files are read, and never with a blocking open. Find() and
  // List() are not blocked meanwhile; concurrent reloads run one at a time.
  // `cancelled` (may be empty) is polled between files, between read chunks
  // and while waiting for another reload; once it returns true the reload is
  // abandoned, the previous set stays, and Reload returns false.
  bool Reload(const std::function<bool()>& cancelled = {});

  // NOT_FOUND listing the tables that exist.
  [[nodiscard]] absl::StatusOr<std::shared_ptr<const LearnedTable>> Find(
      absl::string_view name) const;

  std::vector<TableEntry> List() const;
  // What the last reload skipped and why: at most 256 lines, the last
  // counting any beyond.
  std::vector<std::string> skipped() const;
  const std::string& dir() const { return options_.dir; }
  const TableRepositoryOptions& options() const { return options_; }

 private:
  using TableMap = std::map<std::string, TableEntry, std::less<>>;

  // Waits until no other reload runs (false if cancelled meanwhile).
  bool BeginReload(const std::function<bool()>& cancelled);
  void EndReload();

  const TableRepositoryOptions options_;
  // Reloads run one at a time. A flag and a condition variable rather than a
  // timed mutex: waiting must poll `cancelled`, and TSan does not see
  // pthread_mutex_clocklock, which timed_mutex::try_lock_for uses.
  std::mutex reload_mu_;
  std::condition_variable reload_done_;
  bool reloading_ = false;  // guarded by reload_mu_
  mutable std::mutex mu_;   // guards the two fields below; never held during I/O
  TableMap tables_;
  std::vector<std::string> skipped_;
};

}  // namespace posenc::server

#endif  // POSENC_SERVER_ENGINE_TABLE_REPOSITORY_H_
