// The models the KServe v2 front serves: the built-in ones plus those of the
// model repository (--model_dir, one JSON file per model:
// kserve/model_file.h). Lookups take a snapshot, and a reload swaps in a new
// one at once, so a call in flight keeps the model it started with. Like the
// table repository, the directory is shared and untrusted: a bad file is
// skipped with its reason (listed by RepositoryIndex as UNAVAILABLE) while
// the good ones load. A model unloaded (RepositoryModelUnload) stays out of
// every set until a load names it.
#ifndef POSENC_SERVER_KSERVE_MODEL_REGISTRY_H_
#define POSENC_SERVER_KSERVE_MODEL_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/reload_gate.h"
#include "kserve/models.h"

namespace posenc::server::kserve {

struct ModelRepositoryOptions {
  std::string dir;  // empty: built-in models only
  // As TableRepositoryOptions: symlinks must resolve inside `dir` (a
  // Kubernetes ConfigMap volume links through ..data/) unless this is set.
  bool allow_external_symlinks = false;
  // .json entries considered per reload; the rest are reported.
  int max_files = 1024;
};

// A model file that did not load, and why.
struct SkippedModel {
  std::string name;    // the file's name without .json (escaped if unprintable)
  std::string reason;  // "<path>: <why>"
};

// One reload's result; never changes once made.
class ModelSet {
 public:
  // Built-in models first, then the repository's in name order.
  const std::vector<std::shared_ptr<const Model>>& models() const { return models_; }
  // Files that did not load (at most 256; the last line counts the rest),
  // and directory-level problems (name "").
  const std::vector<SkippedModel>& skipped() const { return skipped_; }
  const std::string& dir() const { return dir_; }
  // NOT_FOUND naming the models (and why a file of that name did not load);
  // INVALID_ARGUMENT for a version other than "" or "1".
  [[nodiscard]] absl::StatusOr<std::shared_ptr<const Model>> Find(absl::string_view name,
                                                                  absl::string_view version) const;
  const SkippedModel* FindSkipped(absl::string_view name) const;

 private:
  friend class ModelRegistry;
  std::vector<std::shared_ptr<const Model>> models_;
  std::vector<SkippedModel> skipped_;
  std::string dir_;
};

class ModelRegistry {
 public:
  // Holds the built-in models until the first Reload.
  explicit ModelRegistry(ModelRepositoryOptions options);

  // Rescans the directory and swaps in the new set at once. Reloads run one
  // at a time, with at most one waiting (ReloadGate: a third is
  // RESOURCE_EXHAUSTED at once); lookups are never blocked by one.
  // `cancelled` (may be empty) is polled between files and while waiting;
  // once true the old set stays and this returns CANCELLED. Unloaded
  // models stay out of the new set, but `load` (if not empty), which is
  // loaded again.
  [[nodiscard]] absl::Status Reload(const std::function<bool()>& cancelled = {},
                                    absl::string_view load = {});

  // Takes the repository's model `name` out of the set at once (calls in
  // flight keep it) until a Reload loads it again: it is listed among the
  // skipped ones with the reason kUnloaded, so ModelReady is false and
  // calls are NOT_FOUND saying why, and rescans leave it out. Whether it
  // was loaded: a name that is no loaded model of the repository changes
  // nothing (as Triton unloads a model that is not loaded); a built-in
  // model's is INVALID_ARGUMENT.
  [[nodiscard]] absl::StatusOr<bool> Unload(absl::string_view name);
  static constexpr char kUnloaded[] =
      "unloaded by RepositoryModelUnload (RepositoryModelLoad loads it again)";

  std::shared_ptr<const ModelSet> Snapshot() const;
  const ModelRepositoryOptions& options() const { return options_; }

 private:
  // `set` with the unloaded models moved to its skipped ones. REQUIRES: mu_.
  void TakeOutUnloaded(ModelSet& set) const;

  const ModelRepositoryOptions options_;
  ReloadGate gate_{"model reload"};
  // Guards set_ and unloaded_; held only to swap the pointer (and take the
  // unloaded models out of a new set).
  mutable std::mutex mu_;
  std::shared_ptr<const ModelSet> set_;
  std::set<std::string, std::less<>> unloaded_;
};

}  // namespace posenc::server::kserve

#endif  // POSENC_SERVER_KSERVE_MODEL_REGISTRY_H_
