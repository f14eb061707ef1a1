#include "kserve/model_registry.h"

#include <algorithm>
#include <exception>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/repository_file.h"
#include "engine/utf8.h"
#include "kserve/model_file.h"
#include "posenc/status_macros.h"

namespace posenc::server::kserve {
namespace {

namespace fs = std::filesystem;

// skipped() goes out in RepositoryIndex answers; this many entries keep a
// directory full of bad files from pushing them toward gRPC's 4 MiB limit.
constexpr size_t kMaxSkipped = 256;

// One reload's work into a fresh set.
class Scan {
 public:
  Scan(const ModelRepositoryOptions& options, const std::function<bool()>& cancelled,
       std::vector<std::shared_ptr<const Model>>* models, std::vector<SkippedModel>* skipped)
      : options_(options), cancelled_(cancelled), models_(*models), skipped_(*skipped) {}

  // False if cancelled part-way.
  bool Run() {
    std::error_code ec;
    const fs::path dir = fs::canonical(options_.dir, ec);
    if (ec) return Skip("", options_.dir, absl::StrCat("cannot resolve directory: ", ec.message()));
    limits_ = RepositoryFileLimits{dir, options_.allow_external_symlinks, kMaxModelFileBytes};
    std::vector<fs::path> files;
    int64_t not_considered = 0;
    for (fs::directory_iterator it(options_.dir, ec), end; !ec && it != end; it.increment(ec)) {
      if (Cancelled()) return false;
      if (it->path().extension() != ".json") continue;
      if (static_cast<int>(files.size()) < options_.max_files) {
        files.push_back(it->path());
      } else {
        ++not_considered;
      }
    }
    if (ec) Skip("", options_.dir, absl::StrCat("cannot list directory: ", ec.message()));
    if (not_considered > 0) {
      Skip("", options_.dir,
           absl::StrCat(not_considered, " more .json files not considered (max_files is ",
                        options_.max_files, ")"));
    }
    std::sort(files.begin(), files.end());
    for (const fs::path& path : files) {
      if (Cancelled()) return false;
      try {
        if (!Load(path)) return false;
      } catch (const std::exception& e) {  // out of memory, most likely
        Skip(path.stem().string(), PrintablePath(path), absl::StrCat("not loaded: ", e.what()));
      }
    }
    return true;
  }

 private:
  bool Cancelled() const { return cancelled_ && cancelled_(); }

  bool Skip(std::string name, absl::string_view where, absl::string_view why) {
    skipped_.push_back({std::move(name), absl::StrCat(where, ": ", why)});
    return true;
  }

  bool Load(const fs::path& path) {
    const std::string where = PrintablePath(path);
    const std::string name = path.stem().string();
    if (where != path.string()) {
      return Skip(fs::path(where).stem().string(), where, "file name is not printable UTF-8");
    }
    if (absl::Status s = CheckModelName(name); !s.ok()) return Skip(name, where, s.message());
    for (const auto& m : BuiltInModels()) {
      if (m->name == name) return Skip(name, where, "the name is a built-in model's");
    }
    absl::StatusOr<std::string> bytes = ReadRepositoryFile(path, limits_, cancelled_);
    if (absl::IsCancelled(bytes.status())) return false;
    if (!bytes.ok()) return Skip(name, where, bytes.status().message());
    absl::StatusOr<Model> model = ParseModelFile(name, *bytes);
    if (!model.ok()) return Skip(name, where, model.status().message());
    model->file = where;
    models_.push_back(std::make_shared<const Model>(std::move(*model)));
    return true;
  }

  const ModelRepositoryOptions& options_;
  const std::function<bool()>& cancelled_;
  std::vector<std::shared_ptr<const Model>>& models_;
  std::vector<SkippedModel>& skipped_;
  RepositoryFileLimits limits_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<const Model>> ModelSet::Find(absl::string_view name,
                                                            absl::string_view version) const {
  for (const auto& m : models_) {
    if (m->name != name) continue;
    if (!version.empty() && version != kModelVersion) {
      return absl::InvalidArgumentError(absl::StrCat("model ", name, " has only version ",
                                                     kModelVersion, ", got version \"",
                                                     Utf8Prefix(version, 32), "\""));
    }
    return m;
  }
  std::vector<absl::string_view> names;
  for (const auto& m : models_) names.push_back(m->name);
  std::string why;
  if (const SkippedModel* s = FindSkipped(name); s != nullptr) {
    why = absl::StrCat(" (its file did not load: ", s->reason, ")");
  }
  return absl::NotFoundError(absl::StrCat("no model \"", Utf8Prefix(name, 64), "\"", why,
                                          "; the models are ", absl::StrJoin(names, ", ")));
}

const SkippedModel* ModelSet::FindSkipped(absl::string_view name) const {
  if (name.empty()) return nullptr;
  for (const SkippedModel& s : skipped_) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

ModelRegistry::ModelRegistry(ModelRepositoryOptions options) : options_(std::move(options)) {
  auto set = std::make_shared<ModelSet>();
  set->models_ = BuiltInModels();
  set->dir_ = options_.dir;
  set_ = std::move(set);
}

absl::Status ModelRegistry::Reload(const std::function<bool()>& cancelled, absl::string_view load) {
  if (!load.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = unloaded_.find(load); it != unloaded_.end()) unloaded_.erase(it);
  }
  bool complete = true;
  POSENC_RETURN_IF_ERROR(gate_.Run(cancelled, [&] {
    auto set = std::make_shared<ModelSet>();
    set->models_ = BuiltInModels();
    set->dir_ = options_.dir;
    if (!options_.dir.empty()) {
      std::vector<std::shared_ptr<const Model>> models;
      try {
        complete = Scan(options_, cancelled, &models, &set->skipped_).Run();
      } catch (const std::exception& e) {
        set->skipped_.push_back({"", absl::StrCat(options_.dir, ": reload stopped: ", e.what())});
      }
      if (!complete) return;
      for (auto& m : models) set->models_.push_back(std::move(m));
      if (set->skipped_.size() > kMaxSkipped) {
        const size_t unlisted = set->skipped_.size() - (kMaxSkipped - 1);
        set->skipped_.resize(kMaxSkipped - 1);
        set->skipped_.push_back({"", absl::StrCat(unlisted, " more skipped files not listed")});
      }
    }
    std::shared_ptr<const ModelSet> old;
    {
      std::lock_guard<std::mutex> lock(mu_);
      TakeOutUnloaded(*set);
      old = std::exchange(set_, std::move(set));
    }
    // the old set is freed here, outside the lock, once no call holds it
  }));
  if (!complete) return absl::CancelledError("the model reload was cancelled");
  return absl::OkStatus();
}

void ModelRegistry::TakeOutUnloaded(ModelSet& set) const {
  if (unloaded_.empty()) return;
  auto served = std::stable_partition(set.models_.begin(), set.models_.end(), [&](const auto& m) {
    return unloaded_.find(m->name) == unloaded_.end();
  });
  for (auto it = served; it != set.models_.end(); ++it) {
    set.skipped_.push_back({(*it)->name, absl::StrCat((*it)->file, ": ", kUnloaded)});
  }
  set.models_.erase(served, set.models_.end());
}

absl::StatusOr<bool> ModelRegistry::Unload(absl::string_view name) {
  for (const auto& m : BuiltInModels()) {
    if (m->name == name) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model ", m->name, " is built in and always served; only --model_dir models unload"));
    }
  }
  std::shared_ptr<const ModelSet> old;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto& models = set_->models_;
    if (std::none_of(models.begin(), models.end(),
                     [&](const auto& m) { return m->name == name; })) {
      return false;  // not loaded: nothing to do
    }
    unloaded_.emplace(name);
    auto set = std::make_shared<ModelSet>(*set_);
    TakeOutUnloaded(*set);
    old = std::exchange(set_, std::move(set));
  }
  return true;
}

std::shared_ptr<const ModelSet> ModelRegistry::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return set_;
}

}  // namespace posenc::server::kserve
