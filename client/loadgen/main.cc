// posenc-loadgen: load a posenc server and, in the same run, a bare gRPC echo
// of the same messages, so the service's overhead is a ratio. Flags follow
// perf_analyzer where it has them (ranges, measurement windows, stability).
//
//   posenc-loadgen --target=localhost:50051 --op=rope_decode --concurrency=1:16:x2
//   posenc-loadgen --target=... --request_rate=200:800:200 --arrival=poisson --op=rope_1mib
//   posenc-loadgen --target=... --op=rope --shape=4,512,32,128 --dtype=fp16 --style=gptj \
//       --scaling=yarn --factor=4 --original_max_position=4096 --check --csv=out.csv
//
// Exit codes (the first that applies): 2 a flag is wrong; 4 the target
// cannot be reached; 1 a call failed; 3 a checked answer was wrong; 5 an
// open-loop rate was not sustained; 6 a load point never became stable;
// 0 otherwise.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "echo_service.h"
#include "load_range.h"
#include "posenc/backend.h"
#include "posenc/client.h"
#include "report.h"
#include "runner.h"
#include "workload.h"

ABSL_FLAG(std::string, target, "localhost:50051", "posenc server to load.");
ABSL_FLAG(std::string, baseline, "echo",
          "echo: also load an in-process gRPC echo of the same messages; none: skip it.");
ABSL_FLAG(std::string, op, "rope_decode",
          "Operation or weighted mix. Presets: rope_decode, rope_prefill, rope_1mib, sinusoidal, "
          "bias; kinds with plain defaults: rope, absolute, table, bias "
          "(e.g. rope_decode:8,sinusoidal:1). The workload flags below override them.");
ABSL_FLAG(std::string, mode, "",
          "closed (--concurrency callers) or open (--request_rate arrivals); default: open when "
          "--request_rate is given.");
ABSL_FLAG(std::string, concurrency, "1",
          "Closed loop callers: N, start:end:step (linear), start:end:xF (geometric) or a list "
          "1,2,8; one result row per point.");
ABSL_FLAG(std::string, request_rate, "",
          "Open loop requests/s: as --concurrency (e.g. 100:400:100, 50:800:x2).");
ABSL_FLAG(std::string, arrival, "constant", "Open loop arrivals: constant or poisson.");
ABSL_FLAG(std::string, api, "unary", "unary or stream (RoPE ops only).");
ABSL_FLAG(double, warmup_s, 1, "Seconds of load not measured at the start of each point.");
ABSL_FLAG(double, measurement_interval_ms, 2000, "Length of one measurement window.");
ABSL_FLAG(int, max_trials, 10,
          "Windows per point at most (>= 3); a point still unstable then is marked so.");
ABSL_FLAG(double, stability_percentage, 10,
          "Stable: the last 3 windows' throughput and p50 each within this % of their mean.");
ABSL_FLAG(double, rate_tolerance_percentage, 10,
          "Open loop: a point whose achieved rate falls short of the scheduled arrivals by more "
          "than this % is not sustained.");
ABSL_FLAG(double, timeout_s, 30, "Per-call deadline.");
ABSL_FLAG(double, connect_timeout_s, 5,
          "How long to wait for the target's first answer (GetServerInfo) before giving up.");
ABSL_FLAG(int, max_outstanding, 1024,
          "Open loop: calls in flight at most; arrivals beyond it are dropped (not sustained).");
ABSL_FLAG(bool, check, false, "Compare every response with the locally computed answer.");
ABSL_FLAG(std::string, json, "", "Write every run as JSON here.");
ABSL_FLAG(std::string, csv, "", "Write one CSV row per run here, after a header row.");
ABSL_FLAG(bool, progress, isatty(2), "A line on stderr per measurement window.");

// Workload overrides: empty keeps the preset's value.
ABSL_FLAG(std::string, shape, "",
          "rope: query B,S,H,D (bshd), B,H,S,D (bhsd) or T,H,D (thd); absolute: x B,S,D or T,D; "
          "bias: batch,heads,q_len,k_len.");
ABSL_FLAG(std::string, dtype, "", "float32 (fp32), float16 (fp16) or bfloat16 (bf16).");
ABSL_FLAG(std::string, backend, "", "default (the server's), auto, cpu or cuda.");
ABSL_FLAG(std::string, positions, "",
          "index (none sent), offsets (one per sequence) or ids (one per token; a table: its "
          "position list).");
ABSL_FLAG(std::string, position_start, "",
          "First position of sequence 0; sequence b starts 37 b later.");
ABSL_FLAG(std::string, base, "", "RoPE theta or sinusoidal base.");
ABSL_FLAG(std::string, key_heads, "", "rope: a key with this many heads (0: none).");
ABSL_FLAG(std::string, layout, "", "rope: bshd, bhsd or thd.");
ABSL_FLAG(std::string, style, "", "rope: neox or gptj.");
ABSL_FLAG(std::string, rotary_dim, "", "rope: rotary dims (0: head_dim).");
ABSL_FLAG(std::string, inverse, "", "rope: true to rotate by -angle.");
ABSL_FLAG(std::string, scaling, "",
          "rope: none, linear, dynamic_ntk, yarn, llama3, longrope or explicit.");
ABSL_FLAG(std::string, factor, "", "rope scaling factor.");
ABSL_FLAG(std::string, original_max_position, "", "rope scaling: original context length.");
ABSL_FLAG(std::string, beta_fast, "", "yarn beta_fast.");
ABSL_FLAG(std::string, beta_slow, "", "yarn beta_slow.");
ABSL_FLAG(std::string, mscale, "", "yarn mscale.");
ABSL_FLAG(std::string, mscale_all_dim, "", "yarn mscale_all_dim.");
ABSL_FLAG(std::string, attention_factor, "", "yarn/longrope/explicit attention scale.");
ABSL_FLAG(std::string, truncate, "", "yarn: true or false.");
ABSL_FLAG(std::string, low_freq_factor, "", "llama3 low_freq_factor.");
ABSL_FLAG(std::string, high_freq_factor, "", "llama3 high_freq_factor.");
ABSL_FLAG(std::string, short_factor, "", "longrope: comma list of R/2 factors.");
ABSL_FLAG(std::string, long_factor, "", "longrope: comma list of R/2 factors.");
ABSL_FLAG(std::string, longrope_mode, "", "longrope: by_sequence_length, short or long.");
ABSL_FLAG(std::string, inv_freq, "", "explicit: comma list of R/2 inverse frequencies.");
ABSL_FLAG(std::string, axis_mode, "", "rope: single, axial, mrope or mrope_interleaved.");
ABSL_FLAG(std::string, axis_dims, "", "axial: comma list of rotary dims per axis.");
ABSL_FLAG(std::string, sections, "", "mrope: comma list of slots per axis.");
ABSL_FLAG(std::string, encoding, "", "absolute/table: sinusoidal or learned.");
ABSL_FLAG(std::string, table_name, "", "absolute/table: a learned table's name.");
ABSL_FLAG(std::string, sinusoidal_layout, "", "interleaved or concatenated.");
ABSL_FLAG(std::string, x_scale, "", "absolute: x multiplier.");
ABSL_FLAG(std::string, dim, "", "table: d.");
ABSL_FLAG(std::string, count, "", "table: rows.");
ABSL_FLAG(std::string, form, "", "bias: none, causal or symmetric.");
ABSL_FLAG(std::string, slopes, "", "bias: comma list of per-head slopes (empty: ALiBi's).");
ABSL_FLAG(std::string, causal, "", "bias: true for a causal mask.");
ABSL_FLAG(std::string, window, "", "bias: sliding window (0: off).");
ABSL_FLAG(std::string, q_offset, "", "bias: position of query row 0.");
ABSL_FLAG(std::string, logits, "",
          "bias: true adds the bias to sent logits; false has the server build it alone.");

namespace {

namespace lg = posenc::loadgen;

constexpr int kExitCallsFailed = 1;
constexpr int kExitUsage = 2;
constexpr int kExitCheckFailed = 3;
constexpr int kExitUnreachable = 4;
constexpr int kExitUnsustained = 5;
constexpr int kExitUnstable = 6;

std::string VersionString() {
  return absl::StrCat("posenc-loadgen ", POSENC_VERSION, "\n", posenc::BuildDescription(), "\n");
}

int Usage(const std::string& message) {
  std::fprintf(stderr, "posenc-loadgen: %s\n", message.c_str());
  return kExitUsage;
}

// A flag that must be one of `allowed` (any case); lower-cased.
bool OneOf(const char* flag, const std::string& value, std::vector<std::string> allowed,
           std::string* out, std::string* error) {
  *out = absl::AsciiStrToLower(value);
  for (const std::string& a : allowed) {
    if (*out == a) return true;
  }
  *error = absl::StrCat("--", flag, " must be one of ", absl::StrJoin(allowed, ", "),
                        " (any case); got '", value, "'");
  return false;
}

// A number flag within [lo, hi].
bool InRange(const char* flag, double v, double lo, double hi, std::string* error) {
  if (v >= lo && v <= hi) return true;
  *error = absl::StrCat("--", flag, " must be in [", lo, ", ", hi, "]; got ", v);
  return false;
}

std::string LoadName(const lg::RunConfig& c) {
  return c.open_loop ? absl::StrCat(c.rate, "/s") : absl::StrCat(c.concurrency);
}

void PrintRow(const lg::RunResult& r) {
  std::printf("%-7s %-6s %-6s %8s %9.1f %8.3f %9.0f %9.0f %9.0f %9.0f %9.0f  %-8s %2zu  %s\n",
              r.config.target.c_str(), r.config.stream ? "stream" : "unary",
              r.config.open_loop ? "open" : "closed", LoadName(r.config).c_str(), r.requests_per_s,
              r.gigabytes_per_s, r.p50_us, r.p90_us, r.p95_us, r.p99_us, r.max_us,
              r.stable ? "stable" : "UNSTABLE", r.windows.size(), lg::ErrorCounts(r).c_str());
  if (r.config.open_loop) {
    std::printf(
        "        asked %.6g/s (schedule %.6g/s), achieved %.6g/s, backlog %lld in flight, "
        "%lld dropped, sender %.1f ms behind: %s\n",
        r.config.rate, r.asked_per_s, r.requests_per_s, static_cast<long long>(r.backlog),
        static_cast<long long>(r.dropped), r.sender_lag_ms,
        r.sustained ? "sustained" : "NOT SUSTAINED");
  }
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "posenc-loadgen: load tests for posenc with a gRPC echo baseline.\n"
      "Exit codes: 0 ok; 1 calls failed; 2 bad flags; 3 wrong answers (--check); 4 target "
      "unreachable; 5 open-loop rate not sustained; 6 a point never stable.");
  absl::FlagsUsageConfig usage;
  // --help lists this file's flags (Abseil's default matches the binary's
  // name against file names, which finds none here).
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "loadgen/main.cc");
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  usage.version_string = [] { return VersionString(); };
  absl::SetFlagsUsageConfig(usage);
  absl::ParseCommandLine(argc, argv);

  // Every flag is checked before the target is contacted.
  std::string error, mode, arrival, api, baseline;
  const std::string rates = absl::GetFlag(FLAGS_request_rate);
  if (!OneOf("mode",
             absl::GetFlag(FLAGS_mode).empty() ? (rates.empty() ? "closed" : "open")
                                               : absl::GetFlag(FLAGS_mode),
             {"closed", "open"}, &mode, &error) ||
      !OneOf("arrival", absl::GetFlag(FLAGS_arrival), {"constant", "poisson"}, &arrival, &error) ||
      !OneOf("api", absl::GetFlag(FLAGS_api), {"unary", "stream"}, &api, &error) ||
      !OneOf("baseline", absl::GetFlag(FLAGS_baseline), {"echo", "none"}, &baseline, &error) ||
      !InRange("warmup_s", absl::GetFlag(FLAGS_warmup_s), 0, 3600, &error) ||
      !InRange("measurement_interval_ms", absl::GetFlag(FLAGS_measurement_interval_ms), 10, 3.6e6,
               &error) ||
      !InRange("max_trials", absl::GetFlag(FLAGS_max_trials), lg::kStableWindows, 1000, &error) ||
      !InRange("stability_percentage", absl::GetFlag(FLAGS_stability_percentage), 0, 1000,
               &error) ||
      !InRange("rate_tolerance_percentage", absl::GetFlag(FLAGS_rate_tolerance_percentage), 0, 100,
               &error) ||
      !InRange("timeout_s", absl::GetFlag(FLAGS_timeout_s), 0.001, 86400, &error) ||
      !InRange("connect_timeout_s", absl::GetFlag(FLAGS_connect_timeout_s), 0.001, 3600, &error) ||
      !InRange("max_outstanding", absl::GetFlag(FLAGS_max_outstanding), 1, 1 << 20, &error)) {
    return Usage(error);
  }
  const bool open = mode == "open";
  if (open && rates.empty()) return Usage("--mode=open needs --request_rate");
  if (!open && !rates.empty()) return Usage("--request_rate needs the open loop (--mode=open)");
  const auto points =
      open ? lg::ExpandLoadRange("--request_rate", rates, false)
           : lg::ExpandLoadRange("--concurrency", absl::GetFlag(FLAGS_concurrency), true);
  if (!points.ok()) return Usage(std::string(points.status().message()));

  std::vector<lg::Override> overrides;
  for (const std::string& name : lg::OverrideNames()) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr) return Usage(absl::StrCat("internal: no flag --", name));
    if (const std::string v = flag->CurrentValue(); !v.empty()) overrides.push_back({name, v});
  }
  const auto mix = lg::ParseMix(absl::GetFlag(FLAGS_op), overrides, absl::GetFlag(FLAGS_check));
  if (!mix.ok()) return Usage(std::string(mix.status().message()));
  // Open-loop responses in flight are bounded in bytes too.
  constexpr int64_t kMaxBytesInFlight = int64_t{4} << 30;
  int64_t largest = 1;
  for (const lg::Op& op : mix->ops) largest = std::max(largest, op.response_bytes);
  int max_outstanding = absl::GetFlag(FLAGS_max_outstanding);
  if (open && static_cast<int64_t>(max_outstanding) * largest > kMaxBytesInFlight) {
    max_outstanding = static_cast<int>(std::max<int64_t>(1, kMaxBytesInFlight / largest));
    std::fprintf(stderr,
                 "posenc-loadgen: --max_outstanding lowered to %d: answers of %lld bytes in flight "
                 "stay under %lld bytes\n",
                 max_outstanding, static_cast<long long>(largest),
                 static_cast<long long>(kMaxBytesInFlight));
  }
  const bool stream = api == "stream";
  if (stream && !mix->AllRope()) return Usage("--api=stream carries RoPE operations only");
  // The open loop sends unary calls; its results must not be labelled stream.
  if (stream && open) return Usage("--api=stream runs closed loop only (--mode=closed)");

  std::ofstream json, csv;
  if (!absl::GetFlag(FLAGS_json).empty()) {
    json.open(absl::GetFlag(FLAGS_json));
    if (!json) return Usage(absl::StrCat("cannot write --json=", absl::GetFlag(FLAGS_json)));
  }
  if (!absl::GetFlag(FLAGS_csv).empty()) {
    csv.open(absl::GetFlag(FLAGS_csv));
    if (!csv) return Usage(absl::StrCat("cannot write --csv=", absl::GetFlag(FLAGS_csv)));
    csv << lg::CsvHeader() << std::flush;
  }

  // The target answers before any load, or the run stops here: a load test
  // of nothing would only report errors.
  struct Target {
    std::string name;
    std::unique_ptr<posenc::Client> client;
  };
  std::vector<Target> targets;
  posenc::ClientOptions co;
  co.target = absl::GetFlag(FLAGS_target);
  co.max_attempts = 2;
  auto client = posenc::Client::Create(co);
  if (!client.ok()) {
    std::fprintf(stderr, "posenc-loadgen: cannot reach --target=%s: %s\n", co.target.c_str(),
                 client.status().ToString().c_str());
    return kExitUnreachable;
  }
  posenc::CallOptions probe;
  probe.timeout = absl::Seconds(absl::GetFlag(FLAGS_connect_timeout_s));
  const auto info = (*client)->GetServerInfo(probe);
  if (!info.ok()) {
    std::fprintf(
        stderr,
        "posenc-loadgen: cannot reach --target=%s (GetServerInfo, --connect_timeout_s=%g): %s\n",
        co.target.c_str(), absl::GetFlag(FLAGS_connect_timeout_s),
        info.status().ToString().c_str());
    return kExitUnreachable;
  }
  targets.push_back({"posenc", *std::move(client)});
  absl::StatusOr<lg::EchoServer> echo;
  if (baseline == "echo") {
    echo = lg::StartEchoServer("127.0.0.1:0");
    if (!echo.ok()) {
      std::fprintf(stderr, "posenc-loadgen: %s\n", echo.status().ToString().c_str());
      return 1;
    }
    co.target = "127.0.0.1:" + std::to_string(echo->port);
    targets.push_back({"echo", posenc::Client::Create(co).value()});
  }

  std::printf(
      "posenc-loadgen: %s (posenc %s); ops %s, %s loop, %s API, %.1fs warm-up, windows of "
      "%g ms until the last 3 agree within %g%% (at most %d)\n",
      absl::GetFlag(FLAGS_target).c_str(), info->version().c_str(), absl::GetFlag(FLAGS_op).c_str(),
      open ? "open" : "closed", api.c_str(), absl::GetFlag(FLAGS_warmup_s),
      absl::GetFlag(FLAGS_measurement_interval_ms), absl::GetFlag(FLAGS_stability_percentage),
      absl::GetFlag(FLAGS_max_trials));
  std::printf("%-7s %-6s %-6s %8s %9s %8s %9s %9s %9s %9s %9s  %-8s %2s  %s\n", "target", "api",
              "loop", "load", "req/s", "GB/s", "p50 us", "p90 us", "p95 us", "p99 us", "max us", "",
              "n", "errors");
  std::vector<lg::RunResult> results;
  for (double point : *points) {
    std::vector<lg::RunResult> row;
    for (Target& t : targets) {
      lg::RunConfig c;
      c.target = t.name;
      c.open_loop = open;
      c.concurrency = static_cast<int>(point);
      c.rate = point;
      c.poisson = arrival == "poisson";
      c.stream = stream;
      c.warmup_s = absl::GetFlag(FLAGS_warmup_s);
      c.measurement_interval_ms = absl::GetFlag(FLAGS_measurement_interval_ms);
      c.max_trials = absl::GetFlag(FLAGS_max_trials);
      c.stability_percentage = absl::GetFlag(FLAGS_stability_percentage);
      c.rate_tolerance_percentage = absl::GetFlag(FLAGS_rate_tolerance_percentage);
      c.timeout_s = absl::GetFlag(FLAGS_timeout_s);
      c.max_outstanding = max_outstanding;
      c.check = absl::GetFlag(FLAGS_check) && t.name == "posenc";
      c.progress = absl::GetFlag(FLAGS_progress);
      lg::RunResult r = lg::Run(t.client->stub(), *mix, c);
      PrintRow(r);
      std::fflush(stdout);
      if (csv.is_open()) csv << lg::ToCsv(r) << std::flush;
      row.push_back(r);
      results.push_back(r);
    }
    if (row.size() == 2 && row[1].requests_per_s > 0 && row[1].p50_us > 0) {
      std::printf("        posenc / echo: throughput %.2fx, p50 latency %.2fx, p99 latency %.2fx\n",
                  row[0].requests_per_s / row[1].requests_per_s, row[0].p50_us / row[1].p50_us,
                  row[0].p99_us / row[1].p99_us);
    }
  }
  if (json.is_open()) {
    std::vector<std::string> runs;
    for (const auto& r : results) runs.push_back(lg::ToJson(r));
    json << "{\"threads\": " << std::thread::hardware_concurrency() << ", \"runs\": [\n  "
         << absl::StrJoin(runs, ",\n  ") << "\n]}\n";
  }
  if (echo.ok()) echo->server->Shutdown();

  // The exit code, and why, on stderr.
  std::map<std::string, int64_t> failed;
  int64_t wrong = 0;
  std::vector<std::string> unsustained, unstable;
  for (const lg::RunResult& r : results) {
    for (const auto& [code, n] : r.errors) failed[code] += n;
    wrong += r.check_failures;
    const std::string where = absl::StrCat(r.config.target, " at ", LoadName(r.config));
    if (!r.sustained) {
      unsustained.push_back(absl::StrCat(where, " (achieved ", absl::SixDigits(r.requests_per_s),
                                         "/s, backlog ", r.backlog, ", dropped ", r.dropped, ")"));
    }
    if (!r.stable) unstable.push_back(where);
  }
  int code = 0;
  if (!failed.empty()) {
    std::vector<std::string> counts;
    for (const auto& [c, n] : failed) counts.push_back(absl::StrCat(c, "=", n));
    std::fprintf(stderr, "posenc-loadgen: calls failed: %s\n", absl::StrJoin(counts, " ").c_str());
    code = kExitCallsFailed;
  }
  if (wrong > 0) {
    std::fprintf(stderr, "posenc-loadgen: %lld answers differ from the local reference\n",
                 static_cast<long long>(wrong));
    if (code == 0) code = kExitCheckFailed;
  }
  if (!unsustained.empty()) {
    std::fprintf(stderr, "posenc-loadgen: rate not sustained: %s\n",
                 absl::StrJoin(unsustained, "; ").c_str());
    if (code == 0) code = kExitUnsustained;
  }
  if (!unstable.empty()) {
    std::fprintf(stderr, "posenc-loadgen: no stable measurement in %d windows: %s\n",
                 absl::GetFlag(FLAGS_max_trials), absl::StrJoin(unstable, "; ").c_str());
    if (code == 0) code = kExitUnstable;
  }
  return code;
}
