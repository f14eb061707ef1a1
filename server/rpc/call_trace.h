// Sampled call traces: while tracing is on, one call in `rate` of either
// front (any method, a stream's messages one by one) is logged at info
// with where its time went (the stages of call_log.h), until `count` such
// lines have been written. The setting is the server's; KServe's
// TraceSetting changes it (kserve/trace_settings.h).
#ifndef POSENC_SERVER_RPC_CALL_TRACE_H_
#define POSENC_SERVER_RPC_CALL_TRACE_H_

#include <chrono>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "rpc/call_log.h"

namespace posenc::server {

struct TraceConfig {
  bool on = false;      // Triton's trace_level TIMESTAMPS (on) or OFF
  int64_t rate = 1000;  // one call in this many is traced
  int64_t count = -1;   // traces still to write; -1: no limit

  bool operator==(const TraceConfig& o) const {
    return on == o.on && rate == o.rate && count == o.count;
  }
  bool operator!=(const TraceConfig& o) const { return !(*this == o); }
};

// The server's setting now (`count`: the traces still to write).
TraceConfig CurrentTraceConfig();

// Makes `config` the server's; calls are counted afresh from here.
// REQUIRES: config.rate >= 1, config.count >= -1.
void SetTraceConfig(const TraceConfig& config);

// Whether the call finishing now is traced (counts it while tracing is on;
// a call it traces uses up one of `count`).
bool SampleCall();

// A traced call's line: "<method> traced: <s> s", with its method, code,
// ids and StageBreakdown's seconds as fields.
void LogTrace(const std::string& method, const absl::Status& s,
              std::chrono::steady_clock::time_point start,
              std::chrono::steady_clock::time_point end, const CallIds& ids,
              const CallStages& stages);

}  // namespace posenc::server

#endif  // POSENC_SERVER_RPC_CALL_TRACE_H_
