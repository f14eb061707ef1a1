// Drives a Mix against one target, closed loop (N callers, each with one call
// outstanding) or open loop (arrivals at a rate, constant or Poisson, whatever
// the latency). After a warm-up the load is measured in windows until the
// last three agree (stability.h) or max_trials windows have passed; the
// result is those last windows together: throughput, latency percentiles,
// errors, and for the open loop whether the asked rate was kept.
#ifndef POSENC_LOADGEN_RUNNER_H_
#define POSENC_LOADGEN_RUNNER_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "posenc/v1/posenc.grpc.pb.h"
#include "stability.h"
#include "workload.h"

namespace posenc::loadgen {

struct RunConfig {
  std::string target = "posenc";  // a label for reports
  bool open_loop = false;
  int concurrency = 1;   // closed loop: callers
  double rate = 100;     // open loop: requests per second
  bool poisson = false;  // open loop: exponential gaps instead of constant
  bool stream = false;   // RoPE over StreamRope (one stream per caller)
  double warmup_s = 1;   // calls completing earlier are not measured
  double measurement_interval_ms = 2000;
  int max_trials = 10;  // windows at most (>= kStableWindows)
  double stability_percentage = 10;
  double rate_tolerance_percentage = 10;  // open loop: achieved may fall this short of asked
  double timeout_s = 30;
  int max_outstanding = 1024;  // open loop: calls in flight at most; more are dropped
  bool check = false;          // compare outputs with the local reference
  bool progress = false;       // a line on stderr per window
};

struct RunResult {
  RunConfig config;
  std::string ops;
  // Over the measured (last) windows:
  int64_t ok = 0;
  int64_t check_failures = 0;
  double seconds = 0;
  double requests_per_s = 0;
  double gigabytes_per_s = 0;  // tensor bytes sent plus received
  double p50_us = 0, p90_us = 0, p95_us = 0, p99_us = 0, p999_us = 0, max_us = 0, mean_us = 0;
  // Over the whole run, warm-up included: every failed call, by gRPC code.
  std::map<std::string, int64_t> errors;
  int64_t failed() const;
  // Stability: every window, and whether the last ones agreed.
  std::vector<Window> windows;
  bool stable = false;
  // Open loop: arrivals the schedule asked for in the measured windows, per
  // second; those dropped because max_outstanding calls were in flight; the
  // calls still in flight and how far the sender was behind its schedule
  // when measuring ended. Sustained: completions kept up with arrivals
  // (within rate_tolerance_percentage), nothing was dropped and the sender
  // was less than a window behind.
  double asked_per_s = 0;
  int64_t dropped = 0;
  int64_t backlog = 0;
  double sender_lag_ms = 0;
  bool sustained = true;
};

RunResult Run(v1::PositionalEncoding::Stub& stub, const Mix& mix, const RunConfig& config);

}  // namespace posenc::loadgen

#endif  // POSENC_LOADGEN_RUNNER_H_
