#include "kserve/log_settings.h"

#include <atomic>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "engine/utf8.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"

namespace posenc::server::kserve {
namespace {

using ::testing::HasSubstr;
using SettingValue = inference::LogSettingsRequest::SettingValue;
namespace level = spdlog::level;

constexpr level::level_enum kLevels[] = {level::trace, level::debug,    level::info, level::warn,
                                         level::err,   level::critical, level::off};

SettingValue Bool(bool b) {
  SettingValue v;
  v.set_bool_param(b);
  return v;
}
SettingValue Uint(uint32_t u) {
  SettingValue v;
  v.set_uint32_param(u);
  return v;
}
SettingValue Str(std::string s) {
  SettingValue v;
  v.set_string_param(std::move(s));
  return v;
}

// A setting as the response has it, as a request's (the two messages are
// the same on the wire).
SettingValue Back(const inference::LogSettingsResponse::SettingValue& v) {
  SettingValue r;
  EXPECT_TRUE(r.ParseFromString(v.SerializeAsString()));
  return r;
}

LogSettingMap Settings(std::vector<std::pair<std::string, SettingValue>> entries) {
  LogSettingMap m;
  for (auto& [k, v] : entries) m[k] = v;
  return m;
}

LogState At(level::level_enum l, LogFormat f = LogFormat::kText) { return {l, f}; }

level::level_enum LevelAfter(const LogState& from,
                             std::vector<std::pair<std::string, SettingValue>> entries) {
  absl::StatusOr<LogState> s = RequestedLogState(Settings(std::move(entries)), from);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? s->level : level::n_levels;
}

std::string ErrorOf(const LogState& from,
                    std::vector<std::pair<std::string, SettingValue>> entries) {
  absl::StatusOr<LogState> s = RequestedLogState(Settings(std::move(entries)), from);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << s.status();
  return std::string(s.status().message());
}

TEST(LogSettings, NoSettingsChangeNothing) {
  for (level::level_enum l : kLevels) {
    for (LogFormat f : {LogFormat::kText, LogFormat::kJson}) {
      absl::StatusOr<LogState> s = RequestedLogState({}, At(l, f));
      ASSERT_TRUE(s.ok());
      EXPECT_EQ(*s, At(l, f));
    }
  }
}

TEST(LogSettings, TritonFlagsMoveTheThreshold) {
  EXPECT_EQ(LevelAfter(At(level::info), {{"log_verbose_level", Uint(1)}}), level::debug);
  EXPECT_EQ(LevelAfter(At(level::info), {{"log_verbose_level", Uint(2)}}), level::trace);
  EXPECT_EQ(LevelAfter(At(level::info), {{"log_verbose_level", Uint(4000000000u)}}), level::trace);
  EXPECT_EQ(LevelAfter(At(level::trace), {{"log_verbose_level", Uint(0)}}), level::info);
  EXPECT_EQ(LevelAfter(At(level::info), {{"log_info", Bool(false)}}), level::warn);
  EXPECT_EQ(LevelAfter(At(level::info), {{"log_info", Bool(false)}, {"log_warning", Bool(false)}}),
            level::err);
  EXPECT_EQ(LevelAfter(At(level::info), {{"log_info", Bool(false)},
                                         {"log_warning", Bool(false)},
                                         {"log_error", Bool(false)}}),
            level::off);
  EXPECT_EQ(LevelAfter(At(level::warn), {{"log_info", Bool(true)}}), level::info);
  EXPECT_EQ(LevelAfter(At(level::off), {{"log_error", Bool(true)}}), level::err);
  EXPECT_EQ(LevelAfter(At(level::off), {{"log_verbose_level", Uint(1)},
                                        {"log_info", Bool(true)},
                                        {"log_warning", Bool(true)},
                                        {"log_error", Bool(true)}}),
            level::debug);
  // Flags that say what the level says already keep it: critical (whose
  // flags are off's) is not turned into off.
  EXPECT_EQ(LevelAfter(At(level::critical), {{"log_verbose_level", Uint(0)}}), level::critical);
  EXPECT_EQ(LevelAfter(At(level::critical), {{"log_error", Bool(true)}}), level::err);
}

TEST(LogSettings, FlagsThatAreNoThresholdAreRefused) {
  EXPECT_THAT(ErrorOf(At(level::info), {{"log_warning", Bool(false)}}),
              HasSubstr("log_info true needs log_warning and log_error on"));
  EXPECT_THAT(ErrorOf(At(level::warn), {{"log_error", Bool(false)}}),
              HasSubstr("log_warning true needs log_error on"));
  EXPECT_THAT(ErrorOf(At(level::trace), {{"log_info", Bool(false)}}),
              HasSubstr("log_verbose_level 2 needs log_info, log_warning and log_error on"));
  EXPECT_THAT(ErrorOf(At(level::off), {{"log_verbose_level", Uint(1)}}),
              HasSubstr("log_verbose_level 1 needs"));
}

TEST(LogSettings, DescribedFlagsGiveTheirLevelBackFromAnyLevel) {
  for (level::level_enum want : kLevels) {
    inference::LogSettingsResponse described;
    DescribeLogState(At(want, LogFormat::kJson), &described);
    const auto& d = described.settings();
    ASSERT_EQ(d.size(), 7u);
    EXPECT_EQ(d.at("log_file").string_param(), "");
    EXPECT_EQ(d.at("log_format").string_param(), "json");
    EXPECT_EQ(d.at("log_level").string_param(), LogLevelName(want));
    EXPECT_EQ(d.at("log_info").bool_param(), want <= level::info);
    EXPECT_EQ(d.at("log_warning").bool_param(), want <= level::warn);
    EXPECT_EQ(d.at("log_error").bool_param(), want <= level::err);
    for (level::level_enum from : kLevels) {
      SCOPED_TRACE(std::string(LogLevelName(from)) + " -> " + std::string(LogLevelName(want)));
      // Triton's four flags: every level but critical, whose flags are off's
      // (they keep critical, and give off from any other level).
      const level::level_enum by_flags =
          LevelAfter(At(from), {{"log_info", Back(d.at("log_info"))},
                                {"log_warning", Back(d.at("log_warning"))},
                                {"log_error", Back(d.at("log_error"))},
                                {"log_verbose_level", Back(d.at("log_verbose_level"))}});
      if (want == level::critical || want == level::off) {
        EXPECT_EQ(by_flags, from == level::critical ? level::critical : level::off);
      } else {
        EXPECT_EQ(by_flags, want);
      }
      // posenc's log_level: every level.
      EXPECT_EQ(LevelAfter(At(from), {{"log_level", Back(d.at("log_level"))}}), want);
    }
  }
}

TEST(LogSettings, LogLevelAndFormatByName) {
  EXPECT_EQ(LevelAfter(At(level::info), {{"log_level", Str("WARNING")}}), level::warn);
  EXPECT_EQ(LevelAfter(At(level::info), {{"log_level", Str("Debug")}}), level::debug);
  absl::StatusOr<LogState> json =
      RequestedLogState(Settings({{"log_format", Str("JSON")}}), At(level::info));
  ASSERT_TRUE(json.ok());
  EXPECT_EQ(*json, At(level::info, LogFormat::kJson));
  absl::StatusOr<LogState> text =
      RequestedLogState(Settings({{"log_format", Str("text")}, {"log_level", Str("error")}}),
                        At(level::trace, LogFormat::kJson));
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, At(level::err, LogFormat::kText));
  EXPECT_THAT(ErrorOf(At(level::info), {{"log_level", Str("verbose")}}),
              HasSubstr("log_level must be trace, debug, info, warn, error, critical or off, got "
                        "'verbose'"));
  EXPECT_THAT(ErrorOf(At(level::info), {{"log_format", Str("ISO8601")}}),
              HasSubstr("log_format must be text or json, got 'ISO8601'"));
  EXPECT_THAT(ErrorOf(At(level::info), {{"log_level", Str("debug")}, {"log_info", Bool(true)}}),
              HasSubstr("give log_level or log_info"));
}

TEST(LogSettings, LogFileMayOnlyBeEmpty) {
  EXPECT_EQ(LevelAfter(At(level::warn), {{"log_file", Str("")}}), level::warn);
  EXPECT_THAT(ErrorOf(At(level::info), {{"log_file", Str("/etc/cron.d/x")}}),
              HasSubstr("log_file must be empty, got '/etc/cron.d/x'"));
}

TEST(LogSettings, WrongTypesAndUnknownNamesAreRefusedByName) {
  EXPECT_THAT(ErrorOf(At(level::info), {{"log_info", Str("true")}}),
              HasSubstr("log setting log_info takes a bool_param, got string_param"));
  EXPECT_THAT(ErrorOf(At(level::info), {{"log_verbose_level", Bool(true)}}),
              HasSubstr("log_verbose_level takes a uint32_param, got bool_param"));
  EXPECT_THAT(ErrorOf(At(level::info), {{"log_format", SettingValue()}}),
              HasSubstr("log_format takes a string_param, got no value"));
  EXPECT_THAT(ErrorOf(At(level::info), {{"log_file", Uint(1)}}),
              HasSubstr("log_file takes a string_param, got uint32_param"));
  // The smallest unknown name, whatever the map's order.
  EXPECT_THAT(ErrorOf(At(level::info), {{"zz", Bool(true)},
                                        {"log_info", Bool(true)},
                                        {"log_rotation", Bool(true)},
                                        {"log_directory", Str("/")}}),
              HasSubstr("unknown log setting 'log_directory'"));
  // A hostile name is repeated cut short and as valid UTF-8.
  const std::string hostile = std::string(500, 'x') + "\xff\xfe";
  const std::string e = ErrorOf(At(level::info), {{"\xc3(" + hostile, Bool(true)}});
  EXPECT_LT(e.size(), 300u);
  EXPECT_EQ(ValidUtf8(e), e);
}

// UpdateLogSettings on the process's default logger, captured.
class LogSettingsOnTheServer : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_ = spdlog::default_logger();
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out_);
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("test", sink));
    SetLogFormat(LogFormat::kText);
    spdlog::set_level(level::info);
  }
  void TearDown() override {
    SetLogFormat(LogFormat::kText);
    spdlog::set_default_logger(saved_);
  }
  std::ostringstream out_;
  std::shared_ptr<spdlog::logger> saved_;
};

TEST_F(LogSettingsOnTheServer, ChangesTheLevelAndFormatAndSaysWhoChangedThem) {
  absl::StatusOr<LogState> s =
      UpdateLogSettings(Settings({{"log_verbose_level", Uint(1)}}), "ipv4:127.0.0.1:5\n");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s, At(level::debug));
  EXPECT_EQ(CurrentLogState(), At(level::debug));
  EXPECT_THAT(out_.str(),
              HasSubstr("log settings changed by ipv4:127.0.0.1:5\\x0a: level info -> debug"));
  spdlog::debug("now shown");
  EXPECT_THAT(out_.str(), HasSubstr("now shown"));

  // Quieter: the line is written before the change, so it still shows.
  out_.str("");
  s = UpdateLogSettings(Settings({{"log_level", Str("error")}, {"log_format", Str("json")}}),
                        "unix:");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(CurrentLogState(), At(level::err, LogFormat::kJson));
  EXPECT_THAT(out_.str(), HasSubstr("level debug -> error, format text -> json"));
  spdlog::warn("now hidden");
  EXPECT_THAT(out_.str(), ::testing::Not(HasSubstr("now hidden")));
  spdlog::error("json now");
  EXPECT_THAT(out_.str(), HasSubstr("\"message\":\"json now\""));

  // A read, an unchanged state and a refusal change nothing and say nothing.
  out_.str("");
  s = UpdateLogSettings({}, "unix:");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*s, At(level::err, LogFormat::kJson));
  s = UpdateLogSettings(Settings({{"log_error", Bool(true)}}), "unix:");
  ASSERT_TRUE(s.ok());
  s = UpdateLogSettings(Settings({{"log_file", Str("/tmp/x")}}), "unix:");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CurrentLogState(), At(level::err, LogFormat::kJson));
  EXPECT_EQ(out_.str(), "");
}

TEST_F(LogSettingsOnTheServer, ChangesWhileOtherThreadsLogLoseNoLine) {
  // Run under TSan too (scripts/sanitize.sh): level and format flip while
  // two threads log lines at error, which every state here prints.
  std::atomic<bool> stop{false};
  std::atomic<int> logged{0};
  std::vector<std::thread> loggers;
  for (int t = 0; t < 2; ++t) {
    loggers.emplace_back([&, t] {
      while (!stop.load()) {
        LogWithFields(level::err, "line", {{"thread", t == 0 ? "a" : "b"}});
        spdlog::error("plain");
        logged.fetch_add(2);
      }
    });
  }
  while (logged.load() < 100) std::this_thread::yield();  // both are logging
  for (int i = 0; i < 200; ++i) {
    const char* format = i % 2 == 0 ? "json" : "text";
    const char* lvl = i % 3 == 0 ? "trace" : i % 3 == 1 ? "warn" : "error";
    ASSERT_TRUE(
        UpdateLogSettings(Settings({{"log_format", Str(format)}, {"log_level", Str(lvl)}}), "t")
            .ok());
  }
  const int during = logged.load();
  stop = true;
  for (auto& t : loggers) t.join();
  EXPECT_GE(during, 100);
  const std::string out = out_.str();
  int lines = 0;
  for (char c : out) lines += c == '\n';
  int changes = 0;
  for (size_t at = 0; (at = out.find("log settings changed", at)) != std::string::npos; ++at) {
    ++changes;
  }
  EXPECT_EQ(lines, logged.load() + changes);
  EXPECT_GT(changes, 0);
}

}  // namespace
}  // namespace posenc::server::kserve
