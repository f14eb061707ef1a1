// How a call's failure or slowness reaches the log: client errors are the
// caller's business (debug), overload a warning at most once a second with a
// count of what was skipped, server faults errors; calls slower than
// --slow_call_ms a warning, likewise summarised. Every line names the method,
// the code and the call's request id.
#ifndef POSENC_SERVER_RPC_CALL_LOG_H_
#define POSENC_SERVER_RPC_CALL_LOG_H_

#include <chrono>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace posenc::server {

// Logs a failed call (nothing for OK). `request_id` (cleaned, may be empty)
// goes with the line.
void LogFailure(const std::string& method, const absl::Status& s,
                const std::string& request_id = "");

// Calls taking longer than this (from arrival to answer) are logged as
// slow, at most one line a second; zero or less: never.
void SetSlowCallThreshold(absl::Duration d);
void LogIfSlow(const std::string& method, const absl::Status& s,
               std::chrono::steady_clock::time_point start, const std::string& request_id);

}  // namespace posenc::server

#endif  // POSENC_SERVER_RPC_CALL_LOG_H_
