// How a call's failure or slowness reaches the log: client errors are the
// caller's business (debug), overload a warning at most once a second with a
// count of what was skipped, server faults errors; calls slower than
// --slow_call_ms a warning, likewise summarised. Every line names the method,
// the code, the call's request id and the caller's trace id.
#ifndef POSENC_SERVER_RPC_CALL_LOG_H_
#define POSENC_SERVER_RPC_CALL_LOG_H_

#include <chrono>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace posenc::server {

// What a call's log lines name it by: its request id (cleaned, may be
// empty) and the trace its caller sent (rpc/trace_context.h; may be empty).
// Each goes into a line as a field (request_id, trace_id) when not empty.
struct CallIds {
  std::string request_id;
  std::string trace_id;
};

// Logs a failed call (nothing for OK), with its ids.
void LogFailure(const std::string& method, const absl::Status& s, const CallIds& ids = {});

// When a call reached the stages of its lifecycle after it came (a
// default time point: not reached, or not one of its stages: only admitted
// methods wait for memory, and a stream's message is read when its time
// starts).
struct CallStages {
  using Time = std::chrono::steady_clock::time_point;
  Time admitted;  // its memory reserved: the request may be read
  Time read;      // its request read
  Time started;   // its work begun on a thread: parse, compute, answer
};

// Where a call's time from `start` to `end` went: the seconds of each stage
// ("0.900", to `decimals` places): `memory` waiting for the memory its request may need, `read`
// receiving the request, `queue` waiting for a thread, `work` parsing,
// computing and answering. Stages a call has not (memory for a control
// method, read for a stream's message) stay empty, and the time after the
// last stage it reached is the next one's (a call that ended while its
// request was read ends with `read`); all empty if it reached none.
struct StageTimes {
  std::string memory, read, queue, work;
};
StageTimes StageBreakdown(std::chrono::steady_clock::time_point start,
                          std::chrono::steady_clock::time_point end, const CallStages& stages,
                          int decimals = 3);

// Calls taking longer than this (from arrival to answer) are logged as
// slow, at most one line a second, with StageBreakdown's times as the
// fields memory_s, read_s, queue_s and work_s; zero or less: never.
void SetSlowCallThreshold(absl::Duration d);
void LogIfSlow(const std::string& method, const absl::Status& s,
               std::chrono::steady_clock::time_point start,
               std::chrono::steady_clock::time_point end, const CallIds& ids,
               const CallStages& stages = {});

}  // namespace posenc::server

#endif  // POSENC_SERVER_RPC_CALL_LOG_H_
