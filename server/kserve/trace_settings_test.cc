#include "kserve/trace_settings.h"

#include <string>
#include <utility>
#include <vector>

#include "engine/utf8.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace posenc::server::kserve {
namespace {

using ::testing::HasSubstr;

TraceSettingMap Settings(std::vector<std::pair<std::string, std::vector<std::string>>> entries) {
  TraceSettingMap m;
  for (auto& [k, values] : entries) {
    auto& v = m[k];
    for (auto& s : values) v.add_value(s);
  }
  return m;
}

TraceConfig After(const TraceConfig& from,
                  std::vector<std::pair<std::string, std::vector<std::string>>> entries) {
  absl::StatusOr<TraceConfig> c = RequestedTraceConfig(Settings(std::move(entries)), from);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : TraceConfig{true, -7, -7};
}

std::string ErrorOf(std::vector<std::pair<std::string, std::vector<std::string>>> entries) {
  absl::StatusOr<TraceConfig> c = RequestedTraceConfig(Settings(std::move(entries)), TraceConfig{});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
  return std::string(c.status().message());
}

TEST(TraceSettings, TritonsSettingsSetTheSampling) {
  const TraceConfig off;  // OFF, 1000, -1
  EXPECT_EQ(After(off, {}), off);
  EXPECT_EQ(After(off, {{"trace_level", {"TIMESTAMPS"}}, {"trace_rate", {"10"}}}),
            (TraceConfig{true, 10, -1}));
  EXPECT_EQ(After(off, {{"trace_level", {"timestamps"}}, {"trace_count", {"5"}}}),
            (TraceConfig{true, 1000, 5}));
  const TraceConfig on{true, 10, 5};
  EXPECT_EQ(After(on, {{"trace_level", {"OFF"}}}), (TraceConfig{false, 10, 5}));
  EXPECT_EQ(After(on, {{"trace_rate", {"1"}}, {"trace_count", {"-1"}}}),
            (TraceConfig{true, 1, -1}));
  // A setting given with no values goes back to its default.
  EXPECT_EQ(After(on, {{"trace_level", {}}, {"trace_rate", {}}, {"trace_count", {}}}), off);
  // What posenc does already, said again: accepted.
  EXPECT_EQ(After(on, {{"log_frequency", {"0"}},
                       {"trace_file", {""}},
                       {"trace_mode", {"triton"}},
                       {"trace_level", {"TIMESTAMPS", "TIMESTAMPS"}}}),
            on);
}

TEST(TraceSettings, WhatPosencDoesNotDoIsRefusedByName) {
  EXPECT_THAT(ErrorOf({{"trace_level", {"TENSORS"}}}), HasSubstr("TIMESTAMPS only, not TENSORS"));
  EXPECT_THAT(ErrorOf({{"trace_level", {"OFF", "TIMESTAMPS"}}}), HasSubstr("OFF beside"));
  EXPECT_THAT(ErrorOf({{"trace_level", {"ALL"}}}),
              HasSubstr("trace_level must be OFF or TIMESTAMPS, got 'ALL'"));
  EXPECT_THAT(ErrorOf({{"trace_rate", {"0"}}}),
              HasSubstr("trace_rate must be an integer in [1, 1000000000], got '0'"));
  EXPECT_THAT(ErrorOf({{"trace_rate", {"1e3"}}}), HasSubstr("got '1e3'"));
  EXPECT_THAT(ErrorOf({{"trace_rate", {"99999999999999999999"}}}), HasSubstr("trace_rate"));
  EXPECT_THAT(ErrorOf({{"trace_rate", {"10", "20"}}}), HasSubstr("takes one value, got 2"));
  EXPECT_THAT(ErrorOf({{"trace_count", {"-2"}}}),
              HasSubstr("trace_count must be an integer in [-1,"));
  EXPECT_THAT(ErrorOf({{"log_frequency", {"100"}}}), HasSubstr("log_frequency must be 0"));
  EXPECT_THAT(ErrorOf({{"trace_file", {"/etc/passwd"}}}),
              HasSubstr("trace_file must be empty, got '/etc/passwd'"));
  EXPECT_THAT(ErrorOf({{"trace_mode", {"opentelemetry"}}}), HasSubstr("trace_mode must be triton"));
  EXPECT_THAT(ErrorOf({{"zzz", {}}, {"trace_rate", {"1"}}, {"opentelemetry_url", {"x"}}}),
              HasSubstr("unknown trace setting 'opentelemetry_url'"));
  const std::string e = ErrorOf({{"trace_level", {std::string(300, 'x') + "\xff"}}});
  EXPECT_LT(e.size(), 200u);
  EXPECT_EQ(ValidUtf8(e), e);
}

TEST(TraceSettings, DescribedSettingsGiveTheConfigBack) {
  for (const TraceConfig c : {TraceConfig{}, TraceConfig{true, 1, 0}, TraceConfig{true, 77, 12}}) {
    inference::TraceSettingResponse described;
    DescribeTraceConfig(c, &described);
    EXPECT_EQ(described.settings().size(), 6u);
    TraceSettingMap back;
    for (const auto& [name, value] : described.settings()) {
      back[name].mutable_value()->CopyFrom(value.value());
    }
    absl::StatusOr<TraceConfig> again = RequestedTraceConfig(back, TraceConfig{true, 5, 5});
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(*again, c);
  }
}

TEST(TraceSettings, UpdatesTheServersSettingAndRefusesAModel) {
  absl::StatusOr<TraceConfig> c = UpdateTraceSettings(
      Settings({{"trace_level", {"TIMESTAMPS"}}, {"trace_rate", {"2"}}}), "", "unix:");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(CurrentTraceConfig(), (TraceConfig{true, 2, -1}));
  EXPECT_FALSE(SampleCall());
  EXPECT_TRUE(SampleCall());
  c = UpdateTraceSettings(Settings({{"trace_rate", {"3"}}}), "rope", "unix:");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("give no model_name"));
  c = UpdateTraceSettings(Settings({{"trace_file", {"/tmp/t.json"}}}), "", "unix:");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CurrentTraceConfig(), (TraceConfig{true, 2, -1}));
  c = UpdateTraceSettings({}, "", "unix:");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*c, (TraceConfig{true, 2, -1}));
  SetTraceConfig(TraceConfig{});
}

}  // namespace
}  // namespace posenc::server::kserve
