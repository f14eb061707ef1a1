// posenc-loadgen: load a posenc server and, in the same run, a bare gRPC echo
// of the same messages, so the service's overhead is a ratio.
//
//   posenc-loadgen --target=localhost:50051 --op=rope_decode --concurrency=1,4,16
//   posenc-loadgen --target=... --mode=open --rate=200,400 --arrival=poisson --op=rope_1mib
//   posenc-loadgen --target=... --op=rope_decode:8,sinusoidal:1 --check --json=out.json
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "echo_service.h"
#include "posenc/client.h"
#include "runner.h"
#include "workload.h"

ABSL_FLAG(std::string, target, "localhost:50051", "posenc server to load.");
ABSL_FLAG(std::string, baseline, "echo",
          "echo: also load an in-process gRPC echo of the same messages; none: skip it.");
ABSL_FLAG(std::string, op, "rope_decode",
          "Operation or weighted mix: rope_decode, rope_prefill, rope_1mib, sinusoidal, bias "
          "(e.g. rope_decode:8,sinusoidal:1).");
ABSL_FLAG(std::string, mode, "closed", "closed (concurrency callers) or open (arrival rate).");
ABSL_FLAG(std::string, concurrency, "1", "Closed loop: callers; a list sweeps (1,2,4,8).");
ABSL_FLAG(std::string, rate, "100", "Open loop: requests/s; a list sweeps.");
ABSL_FLAG(std::string, arrival, "constant", "Open loop arrivals: constant or poisson.");
ABSL_FLAG(std::string, api, "unary", "unary or stream (RoPE ops only).");
ABSL_FLAG(double, duration_s, 5, "Measured seconds per run (after warm-up).");
ABSL_FLAG(int64_t, requests, 0, "Stop each run after this many measured requests instead.");
ABSL_FLAG(double, warmup_s, 1, "Seconds of calls not measured at the start of each run.");
ABSL_FLAG(double, timeout_s, 30, "Per-call deadline.");
ABSL_FLAG(bool, check, false, "Compare every response with the locally computed answer.");
ABSL_FLAG(std::string, json, "", "Write every run as JSON here.");
ABSL_FLAG(bool, progress, isatty(2), "A progress line on stderr during runs.");

namespace {

std::vector<double> ParseList(const std::string& s) {
  std::vector<double> out;
  for (absl::string_view v : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    double d;
    if (absl::SimpleAtod(v, &d) && d > 0) out.push_back(d);
  }
  return out;
}

void PrintRow(const posenc::loadgen::RunResult& r) {
  std::string errors;
  for (const auto& [code, n] : r.errors) errors += code + "=" + std::to_string(n) + " ";
  if (r.check_failures > 0) errors += "CHECK_FAILED=" + std::to_string(r.check_failures);
  std::printf(
      "%-7s %-6s %-6s %6s %9.1f %9.3f %9.0f %9.0f %9.0f %9.0f  %s\n", r.config.target.c_str(),
      r.config.stream ? "stream" : "unary", r.config.open_loop ? "open" : "closed",
      (r.config.open_loop ? std::to_string(static_cast<int>(r.config.rate)) + "/s"
                          : std::to_string(r.config.concurrency))
          .c_str(),
      r.requests_per_s, r.gigabytes_per_s, r.p50_us, r.p90_us, r.p99_us, r.p999_us, errors.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("posenc-loadgen: load tests for posenc with a gRPC echo baseline");
  absl::ParseCommandLine(argc, argv);
  auto mix = posenc::loadgen::ParseMix(absl::GetFlag(FLAGS_op), absl::GetFlag(FLAGS_check));
  if (!mix.ok()) {
    std::fprintf(stderr, "posenc-loadgen: %s\n", mix.status().ToString().c_str());
    return 2;
  }
  const bool stream = absl::GetFlag(FLAGS_api) == "stream";
  if (stream && !mix->AllRope()) {
    std::fprintf(stderr, "posenc-loadgen: --api=stream carries RoPE operations only\n");
    return 2;
  }
  const bool open = absl::GetFlag(FLAGS_mode) == "open";
  const std::vector<double> points =
      ParseList(open ? absl::GetFlag(FLAGS_rate) : absl::GetFlag(FLAGS_concurrency));
  if (points.empty()) {
    std::fprintf(stderr, "posenc-loadgen: no valid --%s\n", open ? "rate" : "concurrency");
    return 2;
  }

  struct Target {
    std::string name;
    std::unique_ptr<posenc::Client> client;
  };
  std::vector<Target> targets;
  posenc::ClientOptions co;
  co.target = absl::GetFlag(FLAGS_target);
  co.max_attempts = 2;
  targets.push_back({"posenc", posenc::Client::Create(co).value()});
  absl::StatusOr<posenc::loadgen::EchoServer> echo;
  if (absl::GetFlag(FLAGS_baseline) == "echo") {
    echo = posenc::loadgen::StartEchoServer("127.0.0.1:0");
    if (!echo.ok()) {
      std::fprintf(stderr, "posenc-loadgen: %s\n", echo.status().ToString().c_str());
      return 1;
    }
    co.target = "127.0.0.1:" + std::to_string(echo->port);
    targets.push_back({"echo", posenc::Client::Create(co).value()});
  }

  std::printf("posenc-loadgen: ops %s, %s loop, %s API, %.1fs per run after %.1fs warm-up\n",
              absl::GetFlag(FLAGS_op).c_str(), open ? "open" : "closed",
              stream ? "stream" : "unary", absl::GetFlag(FLAGS_duration_s),
              absl::GetFlag(FLAGS_warmup_s));
  std::printf("%-7s %-6s %-6s %6s %9s %9s %9s %9s %9s %9s  %s\n", "target", "api", "loop", "load",
              "req/s", "GB/s", "p50 us", "p90 us", "p99 us", "p99.9 us", "errors");
  std::vector<posenc::loadgen::RunResult> results;
  int exit_code = 0;
  for (double point : points) {
    std::vector<posenc::loadgen::RunResult> row;
    for (Target& t : targets) {
      posenc::loadgen::RunConfig c;
      c.target = t.name;
      c.open_loop = open;
      c.concurrency = static_cast<int>(point);
      c.rate = point;
      c.poisson = absl::GetFlag(FLAGS_arrival) == "poisson";
      c.stream = stream;
      c.duration_s = absl::GetFlag(FLAGS_duration_s);
      c.requests = absl::GetFlag(FLAGS_requests);
      c.warmup_s = absl::GetFlag(FLAGS_warmup_s);
      c.timeout_s = absl::GetFlag(FLAGS_timeout_s);
      c.check = absl::GetFlag(FLAGS_check) && t.name == "posenc";
      c.progress = absl::GetFlag(FLAGS_progress);
      posenc::loadgen::RunResult r = posenc::loadgen::Run(t.client->stub(), *mix, c);
      PrintRow(r);
      if (r.check_failures > 0) exit_code = 3;
      row.push_back(r);
      results.push_back(r);
    }
    if (row.size() == 2 && row[1].requests_per_s > 0 && row[1].p50_us > 0) {
      std::printf("        posenc / echo: throughput %.2fx, p50 latency %.2fx, p99 latency %.2fx\n",
                  row[0].requests_per_s / row[1].requests_per_s, row[0].p50_us / row[1].p50_us,
                  row[0].p99_us / row[1].p99_us);
    }
  }
  if (!absl::GetFlag(FLAGS_json).empty()) {
    std::vector<std::string> runs;
    for (const auto& r : results) runs.push_back(posenc::loadgen::ToJson(r));
    std::ofstream(absl::GetFlag(FLAGS_json))
        << "{\"threads\": " << std::thread::hardware_concurrency() << ", \"runs\": [\n  "
        << absl::StrJoin(runs, ",\n  ") << "\n]}\n";
  }
  if (echo.ok()) echo->server->Shutdown();
  return exit_code;
}
