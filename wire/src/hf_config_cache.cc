// The resolved-config cache behind ResolveHfRopeCached: most recently used
// first, bounded in entries and in bytes per entry (so at most
// kHfCacheEntries * kHfCacheMaxBytes of JSON is held), linear lookup (32
// compares of a few hundred bytes cost well under a microsecond).
#include <list>
#include <mutex>
#include <string>
#include <utility>

#include "posenc/wire/hf_config.h"

namespace posenc::wire {

absl::StatusOr<HfRope> ResolveHfRopeCached(absl::string_view config_json) {
  static std::mutex mu;
  static auto* entries = new std::list<std::pair<std::string, HfRope>>();
  if (config_json.size() > kHfCacheMaxBytes) return ResolveHfRope(config_json);
  {
    std::lock_guard<std::mutex> lock(mu);
    for (auto it = entries->begin(); it != entries->end(); ++it) {
      if (it->first == config_json) {
        entries->splice(entries->begin(), *entries, it);
        return entries->front().second;
      }
    }
  }
  // Resolved outside the lock: a slow parse never blocks other requests.
  absl::StatusOr<HfRope> resolved = ResolveHfRope(config_json);
  if (!resolved.ok()) return resolved;
  std::lock_guard<std::mutex> lock(mu);
  entries->emplace_front(std::string(config_json), *resolved);
  if (entries->size() > kHfCacheEntries) entries->pop_back();
  return resolved;
}

}  // namespace posenc::wire
