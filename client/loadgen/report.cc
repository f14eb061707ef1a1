#include "report.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace posenc::loadgen {

std::string ErrorCounts(const RunResult& r) {
  std::vector<std::string> parts;
  for (const auto& [code, n] : r.errors) parts.push_back(absl::StrCat(code, "=", n));
  if (r.check_failures > 0) parts.push_back(absl::StrCat("CHECK_FAILED=", r.check_failures));
  return absl::StrJoin(parts, " ");
}

std::string ToJson(const RunResult& r) {
  std::vector<std::string> errors, windows;
  for (const auto& [code, n] : r.errors) errors.push_back(absl::StrCat("\"", code, "\": ", n));
  for (const Window& w : r.windows) {
    windows.push_back(
        absl::StrCat("{\"requests_per_s\": ", w.requests_per_s, ", \"p50_us\": ", w.p50_us, "}"));
  }
  const RunConfig& c = r.config;
  return absl::StrCat(
      "{\"target\": \"", c.target, "\", \"ops\": \"", r.ops, "\", \"api\": \"",
      c.stream ? "stream" : "unary", "\", \"mode\": \"", c.open_loop ? "open" : "closed",
      "\", \"concurrency\": ", c.open_loop ? 0 : c.concurrency,
      ", \"rate\": ", c.open_loop ? c.rate : 0, ", \"arrival\": \"",
      c.poisson ? "poisson" : "constant", "\", \"ok\": ", r.ok,
      ", \"check_failures\": ", r.check_failures, ", \"seconds\": ", r.seconds,
      ", \"requests_per_s\": ", r.requests_per_s, ", \"gigabytes_per_s\": ", r.gigabytes_per_s,
      ", \"latency_us\": {\"p50\": ", r.p50_us, ", \"p90\": ", r.p90_us, ", \"p95\": ", r.p95_us,
      ", \"p99\": ", r.p99_us, ", \"p999\": ", r.p999_us, ", \"max\": ", r.max_us,
      ", \"mean\": ", r.mean_us, "}, \"errors\": {", absl::StrJoin(errors, ", "),
      "}, \"stable\": ", r.stable ? "true" : "false", ", \"trials\": ", r.windows.size(),
      ", \"measurement_interval_ms\": ", c.measurement_interval_ms,
      ", \"stability_percentage\": ", c.stability_percentage,
      ", \"rate_tolerance_percentage\": ", c.rate_tolerance_percentage, ", \"windows\": [",
      absl::StrJoin(windows, ", "), "], \"asked_per_s\": ", r.asked_per_s,
      ", \"dropped\": ", r.dropped, ", \"backlog\": ", r.backlog,
      ", \"sender_lag_ms\": ", r.sender_lag_ms, ", \"sustained\": ", r.sustained ? "true" : "false",
      "}");
}

std::string CsvHeader() {
  return "target,ops,api,mode,concurrency,request_rate,achieved_per_s,gigabytes_per_s,p50_us,"
         "p90_us,p95_us,p99_us,max_us,mean_us,ok,failed,check_failures,stable,trials,"
         "sustained,asked_per_s,backlog,dropped\n";
}

std::string ToCsv(const RunResult& r) {
  const RunConfig& c = r.config;
  // ops ("rope_decode:8,sinusoidal:1") holds commas: quoted.
  return absl::StrCat(c.target, ",\"", r.ops, "\",", c.stream ? "stream" : "unary", ",",
                      c.open_loop ? "open" : "closed", ",", c.open_loop ? 0 : c.concurrency, ",",
                      c.open_loop ? c.rate : 0, ",", r.requests_per_s, ",", r.gigabytes_per_s, ",",
                      r.p50_us, ",", r.p90_us, ",", r.p95_us, ",", r.p99_us, ",", r.max_us, ",",
                      r.mean_us, ",", r.ok, ",", r.failed(), ",", r.check_failures, ",",
                      r.stable ? "true" : "false", ",", r.windows.size(), ",",
                      r.sustained ? "true" : "false", ",", r.asked_per_s, ",", r.backlog, ",",
                      r.dropped, "\n");
}

}  // namespace posenc::loadgen
