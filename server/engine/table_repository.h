// The learned-table repository (SPEC §2.3): every .safetensors file in a
// directory, loaded at start-up and reloadable without a restart. Replicas
// share the directory through a volume, as Triton shares its model repository,
// so its contents are untrusted: a bad entry is skipped with its reason and
// never stops the others from loading, crashes, or blocks the server.
#ifndef POSENC_SERVER_ENGINE_TABLE_REPOSITORY_H_
#define POSENC_SERVER_ENGINE_TABLE_REPOSITORY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/reload_gate.h"
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
  // List() are not blocked meanwhile. Reloads run one at a time, with at
  // most one waiting (ReloadGate): a third is RESOURCE_EXHAUSTED at once.
  // `cancelled` (may be empty) is polled between files, between read chunks
  // and while waiting for another reload; once it returns true the reload is
  // abandoned, the previous set stays, and Reload returns CANCELLED.
  [[nodiscard]] absl::Status Reload(const std::function<bool()>& cancelled = {});

  // NOT_FOUND listing the tables that exist.
  [[nodiscard]] absl::StatusOr<std::shared_ptr<const LearnedTable>> Find(
      absl::string_view name) const;

  std::vector<TableEntry> List() const;
  // What the last reload skipped and why: at most 256 lines, the last
  // counting any beyond.
  std::vector<std::string> skipped() const;
  const std::string& dir() const { return options_.dir; }
  // Whether a reload waits for another to end (ReloadGate::waiting).
  bool reload_waiting() const { return gate_.waiting(); }
  const TableRepositoryOptions& options() const { return options_; }

 private:
  using TableMap = std::map<std::string, TableEntry, std::less<>>;

  const TableRepositoryOptions options_;
  ReloadGate gate_{"table reload"};
  mutable std::mutex mu_;  // guards the two fields below; never held during I/O
  TableMap tables_;
  std::vector<std::string> skipped_;
};

}  // namespace posenc::server

#endif  // POSENC_SERVER_ENGINE_TABLE_REPOSITORY_H_
