// Triton's trace extension (KServe `TraceSetting`) over posenc's sampled
// call traces (rpc/call_trace.h): lines in the log, not trace files. A
// request without settings reads them; one with settings changes them for
// the whole server (both fronts) until the next change or a restart.
//
// trace_level ["TIMESTAMPS"] turns tracing on, ["OFF"] off; trace_rate
// ["N"] traces one call in N (1 to 10^9); trace_count ["N"] stops after N
// traces (-1: no limit); a setting given with no values goes back to its
// default (OFF, 1000, -1). Each trace is written at once at info, so
// log_frequency may only be 0; trace_file may only be empty (no caller may
// point the server at a file) and trace_mode only "triton"; TENSORS is not
// traced. Settings are the server's: a model_name is refused. Anything
// else, or a value that does not parse, is INVALID_ARGUMENT by name, and
// nothing changes.
#ifndef POSENC_SERVER_KSERVE_TRACE_SETTINGS_H_
#define POSENC_SERVER_KSERVE_TRACE_SETTINGS_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/map.h"
#include "kserve/grpc_service.pb.h"
#include "rpc/call_log.h"
#include "rpc/call_trace.h"

namespace posenc::server::kserve {

using TraceSettingMap =
    google::protobuf::Map<std::string, inference::TraceSettingRequest::SettingValue>;

// The setting `settings` ask for, from `current` (settings not named keep
// their values); INVALID_ARGUMENT as above.
[[nodiscard]] absl::StatusOr<TraceConfig> RequestedTraceConfig(const TraceSettingMap& settings,
                                                               const TraceConfig& current);

// Every setting, as `config` has it.
void DescribeTraceConfig(const TraceConfig& config, inference::TraceSettingResponse* response);

// Serves one TraceSetting request: reads the server's setting and, when
// `settings` ask for a change, makes it (one at a time) and logs it at
// warn with `peer` and the caller's ids. Returns the setting after the
// call.
[[nodiscard]] absl::StatusOr<TraceConfig> UpdateTraceSettings(const TraceSettingMap& settings,
                                                              absl::string_view model_name,
                                                              absl::string_view peer,
                                                              const CallIds& ids = {});

}  // namespace posenc::server::kserve

#endif  // POSENC_SERVER_KSERVE_TRACE_SETTINGS_H_
