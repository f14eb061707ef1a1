#include "kserve/trace_settings.h"

#include <cstdint>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kserve/setting_names.h"
#include "posenc/status_macros.h"
#include "rpc/logging.h"
#include "spdlog/spdlog.h"

namespace posenc::server::kserve {
namespace {

using SettingValue = inference::TraceSettingRequest::SettingValue;

constexpr char kLevel[] = "trace_level";
constexpr char kRate[] = "trace_rate";
constexpr char kCount[] = "trace_count";
constexpr char kFrequency[] = "log_frequency";
constexpr char kFile[] = "trace_file";
constexpr char kMode[] = "trace_mode";
constexpr int64_t kMaxRate = 1000000000;
constexpr int64_t kMaxCount = int64_t{1} << 31;

// settings[name]'s one value (nullopt: not given, or given with none);
// INVALID_ARGUMENT for more than one.
absl::StatusOr<std::optional<std::string>> One(const TraceSettingMap& settings, const char* name) {
  auto it = settings.find(name);
  if (it == settings.end() || it->second.value_size() == 0) return std::nullopt;
  if (it->second.value_size() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("trace setting ", name, " takes one value, got ", it->second.value_size()));
  }
  return std::optional<std::string>(it->second.value(0));
}

// An integer setting in [lo, hi], or `fallback` where given with no value.
absl::StatusOr<int64_t> Integer(const TraceSettingMap& settings, const char* name, int64_t lo,
                                int64_t hi, int64_t now, int64_t fallback) {
  if (settings.find(name) == settings.end()) return now;
  POSENC_ASSIGN_OR_RETURN(std::optional<std::string> v, One(settings, name));
  if (!v) return fallback;
  int64_t n = 0;
  if (!absl::SimpleAtoi(*v, &n) || n < lo || n > hi) {
    return absl::InvalidArgumentError(absl::StrCat("trace setting ", name,
                                                   " must be an integer in [", lo, ", ", hi,
                                                   "], got ", QuotedSetting(*v)));
  }
  return n;
}

}  // namespace

absl::StatusOr<TraceConfig> RequestedTraceConfig(const TraceSettingMap& settings,
                                                 const TraceConfig& current) {
  if (std::optional<std::string> unknown =
          SmallestUnknownName(settings, {kLevel, kRate, kCount, kFrequency, kFile, kMode})) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown trace setting ", QuotedSetting(*unknown),
                     "; posenc has trace_level, trace_rate, trace_count, log_frequency, "
                     "trace_file and trace_mode"));
  }
  TraceConfig next = current;
  if (auto it = settings.find(kLevel); it != settings.end()) {
    next.on = false;  // no values: the default, OFF
    bool off = false;
    for (const std::string& v : it->second.value()) {
      const std::string level = absl::AsciiStrToUpper(v);
      if (level == "TIMESTAMPS") {
        next.on = true;
      } else if (level == "OFF") {
        off = true;
      } else if (level == "TENSORS") {
        return absl::InvalidArgumentError(
            "trace setting trace_level: posenc traces TIMESTAMPS only, not TENSORS");
      } else {
        return absl::InvalidArgumentError(absl::StrCat(
            "trace setting trace_level must be OFF or TIMESTAMPS, got ", QuotedSetting(v)));
      }
    }
    if (off && next.on) {
      return absl::InvalidArgumentError("trace setting trace_level: OFF beside TIMESTAMPS");
    }
  }
  POSENC_ASSIGN_OR_RETURN(next.rate, Integer(settings, kRate, 1, kMaxRate, current.rate, 1000));
  POSENC_ASSIGN_OR_RETURN(next.count, Integer(settings, kCount, -1, kMaxCount, current.count, -1));
  POSENC_ASSIGN_OR_RETURN(std::optional<std::string> frequency, One(settings, kFrequency));
  if (frequency && *frequency != "0") {
    return absl::InvalidArgumentError(absl::StrCat(
        "trace setting log_frequency must be 0 (posenc writes each trace as a log line at once), "
        "got ",
        QuotedSetting(*frequency)));
  }
  POSENC_ASSIGN_OR_RETURN(std::optional<std::string> file, One(settings, kFile));
  if (file && !file->empty()) {
    return absl::InvalidArgumentError(absl::StrCat("trace setting trace_file must be empty, got ",
                                                   QuotedSetting(*file),
                                                   ": posenc writes traces to its log only"));
  }
  POSENC_ASSIGN_OR_RETURN(std::optional<std::string> mode, One(settings, kMode));
  if (mode && absl::AsciiStrToLower(*mode) != "triton") {
    return absl::InvalidArgumentError(absl::StrCat(
        "trace setting trace_mode must be triton (traces in the log), got ", QuotedSetting(*mode)));
  }
  return next;
}

void DescribeTraceConfig(const TraceConfig& config, inference::TraceSettingResponse* response) {
  auto& out = *response->mutable_settings();
  out[kLevel].add_value(config.on ? "TIMESTAMPS" : "OFF");
  out[kRate].add_value(absl::StrCat(config.rate));
  out[kCount].add_value(absl::StrCat(config.count));
  out[kFrequency].add_value("0");
  out[kFile];  // no file
  out[kMode].add_value("triton");
}

absl::StatusOr<TraceConfig> UpdateTraceSettings(const TraceSettingMap& settings,
                                                absl::string_view model_name,
                                                absl::string_view peer, const CallIds& ids) {
  if (!model_name.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model_name ", QuotedSetting(model_name),
                     ": posenc's trace settings are the server's, for every model alike; give "
                     "no model_name"));
  }
  static absl::Mutex mu(absl::kConstInit);
  absl::MutexLock lock(&mu);
  const TraceConfig before = CurrentTraceConfig();
  if (settings.empty()) return before;
  POSENC_ASSIGN_OR_RETURN(const TraceConfig after, RequestedTraceConfig(settings, before));
  SetTraceConfig(after);
  if (after != before) {
    LogWithFields(spdlog::level::warn,
                  absl::StrCat("trace settings changed by ", CleanRequestId(peer), ": ",
                               before.on ? "TIMESTAMPS" : "OFF", " rate ", before.rate, " count ",
                               before.count, " -> ", after.on ? "TIMESTAMPS" : "OFF", " rate ",
                               after.rate, " count ", after.count),
                  {{"request_id", ids.request_id}, {"trace_id", ids.trace_id}});
  }
  return after;
}

}  // namespace posenc::server::kserve
