#include "table_repository.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "safetensors.h"

namespace posenc::server {

TableRepository::TableRepository(std::string dir) : dir_(std::move(dir)) {}

void TableRepository::Reload() {
  std::map<std::string, TableEntry, std::less<>> tables;
  std::vector<std::string> skipped;
  if (!dir_.empty()) {
    std::error_code ec;
    std::vector<std::filesystem::path> files;
    for (const auto& e : std::filesystem::directory_iterator(dir_, ec)) {
      if (e.path().extension() == ".safetensors") files.push_back(e.path());
    }
    if (ec) skipped.push_back(absl::StrCat(dir_, ": cannot list directory: ", ec.message()));
    std::sort(files.begin(), files.end());
    for (const auto& path : files) {
      std::ifstream in(path, std::ios::binary);
      std::stringstream buf;
      buf << in.rdbuf();
      if (!in.good() && !in.eof()) {
        skipped.push_back(absl::StrCat(path.string(), ": cannot read"));
        continue;
      }
      const std::string bytes = buf.str();
      auto contents = ParseSafetensors(bytes, path.stem().string());
      if (!contents.ok()) {
        skipped.push_back(absl::StrCat(path.string(), ": ", contents.status().message()));
        continue;
      }
      for (auto& t : contents->tables) tables[t->name] = TableEntry{t, path.string()};
      skipped.insert(skipped.end(), contents->skipped.begin(), contents->skipped.end());
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  tables_ = std::move(tables);
  skipped_ = std::move(skipped);
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
      names.empty() ? "(none" + (dir_.empty() ? std::string("; no --table_dir") : "") + ")"
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
