#include "rpc/logging.h"

#include <atomic>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "engine/utf8.h"
#include "spdlog/pattern_formatter.h"

namespace posenc::server {
namespace {

constexpr char kTextPattern[] = "%Y-%m-%dT%H:%M:%S.%e%z %^%l%$ posenc-server: %v";

std::atomic<LogFormat> current_format{LogFormat::kText};

// The fields of the line being logged on this thread. The default logger is
// synchronous, so its formatter runs on the thread that logs and finds them.
thread_local std::initializer_list<LogField> const* current_fields = nullptr;

class JsonFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    const spdlog::string_view_t level = spdlog::level::to_string_view(msg.level);
    std::string line = absl::StrCat(
        "{\"time\":\"",
        absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::FromChrono(msg.time), absl::UTCTimeZone()),
        "\",\"level\":\"", absl::string_view(level.data(), level.size()),
        "\",\"message\":", JsonQuote(absl::string_view(msg.payload.data(), msg.payload.size())));
    if (current_fields != nullptr) {
      for (const LogField& f : *current_fields) {
        if (!f.value.empty())
          absl::StrAppend(&line, ",", JsonQuote(f.key), ":", JsonQuote(f.value));
      }
    }
    line += "}\n";
    dest.append(line.data(), line.data() + line.size());
  }
  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonFormatter>();
  }
};

}  // namespace

absl::StatusOr<spdlog::level::level_enum> ParseLogLevel(absl::string_view name) {
  const std::string v = absl::AsciiStrToLower(name);
  if (v == "trace") return spdlog::level::trace;
  if (v == "debug") return spdlog::level::debug;
  if (v == "info") return spdlog::level::info;
  if (v == "warn" || v == "warning") return spdlog::level::warn;
  if (v == "error") return spdlog::level::err;
  if (v == "critical") return spdlog::level::critical;
  if (v == "off") return spdlog::level::off;
  return absl::InvalidArgumentError(absl::StrCat(
      "--log_level must be trace, debug, info, warn, error, critical or off, got '", name, "'"));
}

absl::StatusOr<LogFormat> ParseLogFormat(absl::string_view name) {
  const std::string v = absl::AsciiStrToLower(name);
  if (v == "text") return LogFormat::kText;
  if (v == "json") return LogFormat::kJson;
  return absl::InvalidArgumentError(
      absl::StrCat("--log_format must be text or json, got '", CleanRequestId(name), "'"));
}

const char* LogFormatName(LogFormat format) { return format == LogFormat::kJson ? "json" : "text"; }

std::unique_ptr<spdlog::formatter> NewLogFormatter(LogFormat format) {
  if (format == LogFormat::kJson) return std::make_unique<JsonFormatter>();
  return std::make_unique<spdlog::pattern_formatter>(kTextPattern);
}

void SetLogFormat(LogFormat format) {
  current_format.store(format);
  spdlog::set_formatter(NewLogFormatter(format));
}

LogFormat CurrentLogFormat() { return current_format.load(); }

void LogWithFields(spdlog::level::level_enum level, absl::string_view message,
                   std::initializer_list<LogField> fields) {
  if (!spdlog::should_log(level)) return;
  if (current_format.load() == LogFormat::kJson) {
    current_fields = &fields;
    spdlog::log(level, "{}", spdlog::string_view_t(message.data(), message.size()));
    current_fields = nullptr;
    return;
  }
  std::string line(message);
  for (const LogField& f : fields) {
    if (!f.value.empty()) absl::StrAppend(&line, " ", f.key, "=", f.value);
  }
  spdlog::log(level, "{}", line);
}

std::string JsonQuote(absl::string_view s) {
  std::string out = "\"";
  out.reserve(s.size() + 2);
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      const size_t n = Utf8SequenceAt(s, i);
      if (n == 0) {
        out += "\\ufffd";
        ++i;
      } else {
        out.append(s.data() + i, n);
        i += n;
      }
      continue;
    }
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          static const char kHex[] = "0123456789abcdef";
          out += "\\u00";
          out += kHex[c >> 4];
          out += kHex[c & 15];
        } else {
          out += static_cast<char>(c);
        }
    }
    ++i;
  }
  out += '"';
  return out;
}

std::string CleanRequestId(absl::string_view id) {
  static const char kHex[] = "0123456789abcdef";
  id = id.substr(0, kMaxRequestIdBytes);
  std::string out;
  out.reserve(id.size());
  for (char ch : id) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += ch;
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

}  // namespace posenc::server
