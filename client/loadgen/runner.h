// Drives a Mix against one target, closed loop (N callers, each with one call
// outstanding) or open loop (arrivals at a rate, constant or Poisson, whatever
// the latency), and reports throughput, latency percentiles and errors.
#ifndef POSENC_LOADGEN_RUNNER_H_
#define POSENC_LOADGEN_RUNNER_H_

#include <cstdint>
#include <map>
#include <string>

#include "posenc/v1/posenc.grpc.pb.h"
#include "workload.h"

namespace posenc::loadgen {

struct RunConfig {
  std::string target = "posenc";  // a label for reports
  bool open_loop = false;
  int concurrency = 1;   // closed loop: callers
  double rate = 100;     // open loop: requests per second
  bool poisson = false;  // open loop: exponential gaps instead of constant
  bool stream = false;   // RoPE over StreamRope (one stream per caller)
  double duration_s = 5;
  int64_t requests = 0;  // when > 0, stop after this many measured requests
  double warmup_s = 1;   // calls started earlier are not measured
  double timeout_s = 30;
  bool check = false;     // compare outputs with the local reference
  bool progress = false;  // a progress line on stderr each second
};

struct RunResult {
  RunConfig config;
  std::string ops;
  int64_t ok = 0;
  std::map<std::string, int64_t> errors;  // by gRPC status code name
  int64_t check_failures = 0;
  double seconds = 0;
  double requests_per_s = 0;
  double gigabytes_per_s = 0;  // tensor bytes sent plus received
  double p50_us = 0, p90_us = 0, p99_us = 0, p999_us = 0, mean_us = 0;
};

RunResult Run(v1::PositionalEncoding::Stub& stub, const Mix& mix, const RunConfig& config);

std::string ToJson(const RunResult& r);

}  // namespace posenc::loadgen

#endif  // POSENC_LOADGEN_RUNNER_H_
