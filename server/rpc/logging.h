// How the server's log lines look: text for people at a terminal, or JSON
// lines for a log pipeline (--log_format). Lines about a call carry
// structured fields (method, code, request_id); in JSON they are keys of the
// line's object, in text they follow the message as key=value.
//
// Everything in a line may come from a caller (an id, a table name quoted in
// an error), so the JSON writer escapes every control character and replaces
// bytes that are not UTF-8, and request ids are cleaned before they are used.
#ifndef POSENC_SERVER_RPC_LOGGING_H_
#define POSENC_SERVER_RPC_LOGGING_H_

#include <initializer_list>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "spdlog/formatter.h"
#include "spdlog/spdlog.h"

namespace posenc::server {

enum class LogFormat { kText, kJson };

// trace, debug, info, warn(ing), error, critical or off (any case);
// otherwise INVALID_ARGUMENT naming --log_level. (spdlog reads an unknown
// name as "off", which would hide even a fatal start-up error.)
[[nodiscard]] absl::StatusOr<spdlog::level::level_enum> ParseLogLevel(absl::string_view name);

// "text" or "json" (any case); otherwise INVALID_ARGUMENT naming --log_format.
[[nodiscard]] absl::StatusOr<LogFormat> ParseLogFormat(absl::string_view name);

// The name ParseLogFormat reads as `format`: "text" or "json".
const char* LogFormatName(LogFormat format);

// Sets the format of every line the default logger writes from now on.
void SetLogFormat(LogFormat format);

// The format SetLogFormat last set (text before any call).
LogFormat CurrentLogFormat();

// The formatter of one format (for tests that log into their own sink).
std::unique_ptr<spdlog::formatter> NewLogFormatter(LogFormat format);

struct LogField {
  absl::string_view key;
  absl::string_view value;  // empty: the field is left out
};

// Logs `message` with `fields` through the default logger.
void LogWithFields(spdlog::level::level_enum level, absl::string_view message,
                   std::initializer_list<LogField> fields);

// `s` as a JSON string literal, quotes included: control characters escaped,
// bytes that are not UTF-8 replaced by U+FFFD.
std::string JsonQuote(absl::string_view s);

// The longest request id the server repeats (in logs and stream answers).
inline constexpr size_t kMaxRequestIdBytes = 128;

// A caller's request id fit for a log line: its first kMaxRequestIdBytes
// bytes, each byte outside printable ASCII written as \xNN (so no id can
// start a line of its own or hide text from a terminal).
std::string CleanRequestId(absl::string_view id);

}  // namespace posenc::server

#endif  // POSENC_SERVER_RPC_LOGGING_H_
