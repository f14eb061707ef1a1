// The learned-table repository (SPEC §2.3): every .safetensors file in a
// directory, loaded at start-up and reloadable without a restart. Replicas
// share the directory through a volume, as Triton shares its model repository.
#ifndef POSENC_SERVER_TABLE_REPOSITORY_H_
#define POSENC_SERVER_TABLE_REPOSITORY_H_

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "posenc/absolute.h"

namespace posenc::server {

struct TableEntry {
  std::shared_ptr<const LearnedTable> table;
  std::string file;
};

class TableRepository {
 public:
  // An empty `dir` is a repository with no tables.
  explicit TableRepository(std::string dir);

  // Rescans the directory and swaps in the new set at once. Calls already
  // holding a table keep it. Malformed files are skipped and reported in
  // skipped(); they never stop the others from loading.
  void Reload();

  // NOT_FOUND listing the tables that exist.
  [[nodiscard]] absl::StatusOr<std::shared_ptr<const LearnedTable>> Find(
      absl::string_view name) const;

  std::vector<TableEntry> List() const;
  std::vector<std::string> skipped() const;
  const std::string& dir() const { return dir_; }

 private:
  const std::string dir_;
  mutable std::mutex mu_;
  std::map<std::string, TableEntry, std::less<>> tables_;
  std::vector<std::string> skipped_;
};

}  // namespace posenc::server

#endif  // POSENC_SERVER_TABLE_REPOSITORY_H_
