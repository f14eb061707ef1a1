#include "kserve/log_settings.h"

#include <cstdint>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kserve/setting_names.h"
#include "posenc/status_macros.h"
#include "spdlog/spdlog.h"

namespace posenc::server::kserve {
namespace {

using SettingValue = inference::LogSettingsRequest::SettingValue;

constexpr char kFile[] = "log_file";
constexpr char kInfo[] = "log_info";
constexpr char kWarning[] = "log_warning";
constexpr char kError[] = "log_error";
constexpr char kVerbose[] = "log_verbose_level";
constexpr char kFormat[] = "log_format";
constexpr char kLevel[] = "log_level";

absl::string_view CaseName(SettingValue::ParameterChoiceCase c) {
  switch (c) {
    case SettingValue::kBoolParam:
      return "bool_param";
    case SettingValue::kUint32Param:
      return "uint32_param";
    case SettingValue::kStringParam:
      return "string_param";
    default:
      return "no value";
  }
}

// settings[name], or nullopt where absent; INVALID_ARGUMENT where its
// value is not of type `want`.
absl::StatusOr<const SettingValue*> Find(const LogSettingMap& settings, const char* name,
                                         SettingValue::ParameterChoiceCase want) {
  auto it = settings.find(name);
  if (it == settings.end()) return nullptr;
  if (it->second.parameter_choice_case() != want) {
    return absl::InvalidArgumentError(absl::StrCat("log setting ", name, " takes a ",
                                                   CaseName(want), ", got ",
                                                   CaseName(it->second.parameter_choice_case())));
  }
  return &it->second;
}

// Triton's view of a threshold: which of its levels print.
struct Flags {
  bool info, warning, error;
  uint32_t verbose;
  bool operator==(const Flags& o) const {
    return info == o.info && warning == o.warning && error == o.error && verbose == o.verbose;
  }
};

Flags FlagsOf(spdlog::level::level_enum level) {
  return {level <= spdlog::level::info, level <= spdlog::level::warn, level <= spdlog::level::err,
          level == spdlog::level::trace   ? 2u
          : level == spdlog::level::debug ? 1u
                                          : 0u};
}

// The threshold that prints what `f` asks for, or INVALID_ARGUMENT where no
// threshold does.
absl::StatusOr<spdlog::level::level_enum> LevelOf(const Flags& f) {
  auto need = [](absl::string_view what, absl::string_view on) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " needs ", on,
                     " on as well: posenc's log levels are a threshold (every level "
                     "more severe than one that prints prints too)"));
  };
  if (f.verbose > 0) {
    if (!(f.info && f.warning && f.error)) {
      return need(absl::StrCat(kVerbose, " ", f.verbose), "log_info, log_warning and log_error");
    }
    return f.verbose >= 2 ? spdlog::level::trace : spdlog::level::debug;
  }
  if (f.info) {
    if (!(f.warning && f.error)) return need("log_info true", "log_warning and log_error");
    return spdlog::level::info;
  }
  if (f.warning) {
    if (!f.error) return need("log_warning true", "log_error");
    return spdlog::level::warn;
  }
  return f.error ? spdlog::level::err : spdlog::level::off;
}

}  // namespace

absl::string_view LogLevelName(spdlog::level::level_enum level) {
  switch (level) {
    case spdlog::level::trace:
      return "trace";
    case spdlog::level::debug:
      return "debug";
    case spdlog::level::info:
      return "info";
    case spdlog::level::warn:
      return "warn";
    case spdlog::level::err:
      return "error";
    case spdlog::level::critical:
      return "critical";
    default:
      return "off";
  }
}

absl::StatusOr<LogState> RequestedLogState(const LogSettingMap& settings, const LogState& current) {
  if (std::optional<std::string> unknown = SmallestUnknownName(
          settings, {kFile, kInfo, kWarning, kError, kVerbose, kFormat, kLevel})) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown log setting ", QuotedSetting(*unknown),
        "; posenc has log_info, log_warning, log_error, log_verbose_level, log_format, "
        "log_file and log_level"));
  }
  LogState next = current;

  POSENC_ASSIGN_OR_RETURN(const SettingValue* file,
                          Find(settings, kFile, SettingValue::kStringParam));
  if (file != nullptr && !file->string_param().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "log setting log_file must be empty, got ", QuotedSetting(file->string_param()),
        ": posenc logs to standard output only (the container runtime keeps it)"));
  }

  POSENC_ASSIGN_OR_RETURN(const SettingValue* format,
                          Find(settings, kFormat, SettingValue::kStringParam));
  if (format != nullptr) {
    absl::StatusOr<LogFormat> parsed = ParseLogFormat(format->string_param());
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("log setting log_format must be text or json, got ",
                       QuotedSetting(format->string_param())));
    }
    next.format = *parsed;
  }

  POSENC_ASSIGN_OR_RETURN(const SettingValue* level,
                          Find(settings, kLevel, SettingValue::kStringParam));
  POSENC_ASSIGN_OR_RETURN(const SettingValue* info,
                          Find(settings, kInfo, SettingValue::kBoolParam));
  POSENC_ASSIGN_OR_RETURN(const SettingValue* warning,
                          Find(settings, kWarning, SettingValue::kBoolParam));
  POSENC_ASSIGN_OR_RETURN(const SettingValue* error,
                          Find(settings, kError, SettingValue::kBoolParam));
  POSENC_ASSIGN_OR_RETURN(const SettingValue* verbose,
                          Find(settings, kVerbose, SettingValue::kUint32Param));
  const bool flags_given =
      info != nullptr || warning != nullptr || error != nullptr || verbose != nullptr;
  if (level != nullptr) {
    if (flags_given) {
      return absl::InvalidArgumentError(
          "log settings: give log_level or log_info, log_warning, log_error and "
          "log_verbose_level, not both");
    }
    absl::StatusOr<spdlog::level::level_enum> parsed = ParseLogLevel(level->string_param());
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "log setting log_level must be trace, debug, info, warn, error, critical or off, got ",
          QuotedSetting(level->string_param())));
    }
    next.level = *parsed;
  } else if (flags_given) {
    const Flags now = FlagsOf(current.level);
    const Flags asked = {info != nullptr ? info->bool_param() : now.info,
                         warning != nullptr ? warning->bool_param() : now.warning,
                         error != nullptr ? error->bool_param() : now.error,
                         verbose != nullptr ? verbose->uint32_param() : now.verbose};
    // Flags that say what the level says already keep it (critical, whose
    // flags are off's, stays critical).
    if (!(asked == now)) {
      POSENC_ASSIGN_OR_RETURN(next.level, LevelOf(asked));
    }
  }
  return next;
}

void DescribeLogState(const LogState& state, inference::LogSettingsResponse* response) {
  auto& out = *response->mutable_settings();
  const Flags f = FlagsOf(state.level);
  out[kFile].set_string_param("");
  out[kInfo].set_bool_param(f.info);
  out[kWarning].set_bool_param(f.warning);
  out[kError].set_bool_param(f.error);
  out[kVerbose].set_uint32_param(f.verbose);
  out[kFormat].set_string_param(LogFormatName(state.format));
  out[kLevel].set_string_param(std::string(LogLevelName(state.level)));
}

LogState CurrentLogState() { return {spdlog::get_level(), CurrentLogFormat()}; }

absl::StatusOr<LogState> UpdateLogSettings(const LogSettingMap& settings, absl::string_view peer,
                                           const CallIds& ids) {
  static absl::Mutex mu(absl::kConstInit);
  absl::MutexLock lock(&mu);
  const LogState before = CurrentLogState();
  if (settings.empty()) return before;
  POSENC_ASSIGN_OR_RETURN(const LogState after, RequestedLogState(settings, before));
  if (after == before) return after;
  auto note = [&] {
    LogWithFields(
        spdlog::level::warn,
        absl::StrCat("log settings changed by ", CleanRequestId(peer), ": level ",
                     LogLevelName(before.level), " -> ", LogLevelName(after.level), ", format ",
                     LogFormatName(before.format), " -> ", LogFormatName(after.format)),
        {{"request_id", ids.request_id}, {"trace_id", ids.trace_id}});
  };
  // Logged under whichever of the two levels prints more.
  const bool quieter = after.level > before.level;
  if (quieter) note();
  spdlog::set_level(after.level);
  if (after.format != before.format) SetLogFormat(after.format);
  if (!quieter) note();
  return after;
}

}  // namespace posenc::server::kserve
