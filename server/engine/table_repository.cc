#include "engine/table_repository.h"

#include <algorithm>
#include <filesystem>
#include <new>
#include <optional>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/repository_file.h"
#include "engine/safetensors.h"
#include "posenc/status_macros.h"

namespace posenc::server {
namespace {

namespace fs = std::filesystem;

// skipped() goes out in every ListTables and ReloadTables reply; this many
// lines (each at most a few hundred bytes) keep a directory full of bad files
// from pushing replies toward gRPC's 4 MiB default message limit.
constexpr size_t kMaxSkippedLines = 256;

// Keeps the first kMaxSkippedLines and counts the rest.
void CapSkipped(std::vector<std::string>* lines) {
  if (lines->size() <= kMaxSkippedLines) return;
  const size_t unlisted = lines->size() - (kMaxSkippedLines - 1);
  lines->resize(kMaxSkippedLines - 1);
  lines->push_back(absl::StrCat(unlisted, " more skipped entries not listed"));
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
    skipped.push_back(absl::StrCat(PrintablePath(path), ": out of memory while loading"));
    return true;
  }
}

bool Scan::LoadFileOrThrow(const fs::path& path) {
  const std::string where = PrintablePath(path);
  if (where != path.string()) {
    skipped.push_back(absl::StrCat(where, ": file name is not printable UTF-8"));
    return true;
  }
  absl::StatusOr<std::string> bytes = ReadRepositoryFile(
      path, {canonical_dir_, options_.allow_external_symlinks, options_.max_file_bytes},
      cancelled_);
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

}  // namespace

TableRepository::TableRepository(TableRepositoryOptions options) : options_(std::move(options)) {}

TableRepository::TableRepository(std::string dir)
    : TableRepository(TableRepositoryOptions{std::move(dir)}) {}

absl::Status TableRepository::Reload(const std::function<bool()>& cancelled) {
  bool complete = false;
  POSENC_RETURN_IF_ERROR(gate_.Run(cancelled, [&] {
    Scan scan(options_, cancelled);
    try {
      complete = scan.Run();
    } catch (const std::exception& e) {
      // Out of memory or a filesystem error we did not foresee: report it
      // rather than let it take down the server, keeping what loaded so far.
      scan.skipped.push_back(absl::StrCat(options_.dir, ": reload stopped early: ", e.what()));
      complete = true;
    }
    if (!complete) return;
    CapSkipped(&scan.skipped);
    std::lock_guard<std::mutex> lock(mu_);
    std::swap(tables_, scan.tables);
    std::swap(skipped_, scan.skipped);
  }));  // the old set is freed with the scan, outside the lock
  if (!complete) return absl::CancelledError("the table reload was cancelled");
  return absl::OkStatus();
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
