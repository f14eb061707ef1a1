// Triton's logging extension (KServe `LogSettings`) over posenc's log, which
// has one threshold (--log_level) and one format (--log_format). A request
// without settings reads them; one with settings changes them, for the
// whole server, until the next change or a restart (an operator turning on
// debug lines to see why a client's calls are rejected, with their request
// ids, then off again).
//
// Triton's settings are flags per level (log_info, log_warning, log_error)
// and a verbose level; posenc's levels are a threshold, so the flags must
// describe one: a level on with a more severe one off is refused rather
// than approximated. log_verbose_level 1 is debug, 2 and over trace.
// posenc's own log_level (trace ... off) may be given instead of the four.
// log_file may only be empty: the log goes to standard output, where the
// container runtime collects it, and no caller may point the server at a
// file. Unknown settings and values of the wrong type are refused by name.
#ifndef POSENC_SERVER_KSERVE_LOG_SETTINGS_H_
#define POSENC_SERVER_KSERVE_LOG_SETTINGS_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/map.h"
#include "kserve/grpc_service.pb.h"
#include "rpc/call_log.h"
#include "rpc/logging.h"
#include "spdlog/common.h"

namespace posenc::server::kserve {

struct LogState {
  spdlog::level::level_enum level = spdlog::level::info;
  LogFormat format = LogFormat::kText;

  bool operator==(const LogState& o) const { return level == o.level && format == o.format; }
  bool operator!=(const LogState& o) const { return !(*this == o); }
};

using LogSettingMap =
    google::protobuf::Map<std::string, inference::LogSettingsRequest::SettingValue>;

// The state `settings` ask for, from `current` (settings not named keep
// their values): INVALID_ARGUMENT naming the setting, what it takes and
// what came, for an unknown setting, a value of another type or out of
// range, flags that describe no threshold, log_level beside the flags, or
// a log_file.
[[nodiscard]] absl::StatusOr<LogState> RequestedLogState(const LogSettingMap& settings,
                                                         const LogState& current);

// Every setting a request may name, as `state` has it.
void DescribeLogState(const LogState& state, inference::LogSettingsResponse* response);

// The server's state: the default logger's level, CurrentLogFormat.
LogState CurrentLogState();

// Serves one LogSettings request: reads the server's state, and when
// `settings` ask for a change makes it (one change at a time) and logs
// it at warn with `peer` and the caller's ids, where the level before or
// after lets it show. Returns the state after the call.
[[nodiscard]] absl::StatusOr<LogState> UpdateLogSettings(const LogSettingMap& settings,
                                                         absl::string_view peer,
                                                         const CallIds& ids = {});

// posenc's name of a level, as --log_level takes it.
absl::string_view LogLevelName(spdlog::level::level_enum level);

}  // namespace posenc::server::kserve

#endif  // POSENC_SERVER_KSERVE_LOG_SETTINGS_H_
