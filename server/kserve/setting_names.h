// What the KServe settings methods (log_settings.h, trace_settings.h) share
// in checking a request's settings by name. Internal to server/kserve.
#ifndef POSENC_SERVER_KSERVE_SETTING_NAMES_H_
#define POSENC_SERVER_KSERVE_SETTING_NAMES_H_

#include <algorithm>
#include <initializer_list>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/utf8.h"

namespace posenc::server::kserve {

// The smallest name in `settings` (a map keyed by setting name) that is
// none of `known`, or nullopt: the smallest, as a protobuf map's order is
// not fixed and an error should not depend on it.
template <typename Map>
std::optional<std::string> SmallestUnknownName(const Map& settings,
                                               std::initializer_list<const char*> known) {
  std::optional<std::string> unknown;
  for (const auto& entry : settings) {
    const std::string& name = entry.first;  // clang 14 cannot capture a structured binding
    if (std::none_of(known.begin(), known.end(), [&](const char* k) { return name == k; }) &&
        (!unknown || name < *unknown)) {
      unknown = name;
    }
  }
  return unknown;
}

// A caller's string fit to repeat in an error: quoted, valid UTF-8, at most
// 64 bytes of it.
inline std::string QuotedSetting(absl::string_view s) {
  return absl::StrCat("'", Utf8Prefix(s, 64), "'");
}

}  // namespace posenc::server::kserve

#endif  // POSENC_SERVER_KSERVE_SETTING_NAMES_H_
