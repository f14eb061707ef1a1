#include "rpc/logging.h"

#include <sstream>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "spdlog/sinks/ostream_sink.h"

namespace posenc::server {
namespace {

// Every byte value, quotes, backslashes, newlines and bytes that are not
// UTF-8 in a message: each line written is one JSON object that gives the
// message back (bad UTF-8 as U+FFFD) with its fields.
TEST(Logging, JsonLinesParseWhateverTheMessageHolds) {
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
  auto logger = std::make_shared<spdlog::logger>("test", sink);
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::trace);
  SetLogFormat(LogFormat::kJson);

  std::string every_byte;
  for (int c = 1; c < 256; ++c) every_byte += static_cast<char>(c);
  const std::vector<std::string> messages = {
      "plain",
      "a \"quoted\" word and a back\\slash",
      "two\nlines\r\nand\ttabs",
      every_byte,
      std::string("nul\0inside", 10),
      "truncated utf-8 \xe2\x82",
      "overlong \xc0\xaf and surrogate \xed\xa0\x80 and fine \xe2\x82\xac \xf0\x9f\x98\x80",
  };
  for (const std::string& m : messages) {
    LogWithFields(spdlog::level::warn, m,
                  {{"method", "ApplyRope"}, {"request_id", CleanRequestId(m)}, {"empty", ""}});
  }
  spdlog::info("no fields: {}", "\"x\"\n");
  SetLogFormat(LogFormat::kText);
  spdlog::set_default_logger(previous);

  std::istringstream lines(out.str());
  std::string line;
  size_t n = 0;
  for (; std::getline(lines, line); ++n) {
    SCOPED_TRACE(line);
    nlohmann::json j;
    ASSERT_NO_THROW(j = nlohmann::json::parse(line));
    ASSERT_TRUE(j.is_object());
    ASSERT_TRUE(j["time"].is_string());
    EXPECT_EQ(j["time"].get<std::string>().size(), 24u);  // 2026-11-25T02:03:39.123Z
    ASSERT_TRUE(j["message"].is_string());
    EXPECT_FALSE(j.contains("empty"));
    if (n < messages.size()) {
      EXPECT_EQ(j["level"], "warning");
      EXPECT_EQ(j["method"], "ApplyRope");
      EXPECT_EQ(j["request_id"], CleanRequestId(messages[n]));
      std::string want = messages[n];
      if (n == 3) {  // bytes 0x80-0xff alone are not UTF-8: one U+FFFD each
        want = want.substr(0, 127);
        for (int i = 0; i < 128; ++i) want += "\xef\xbf\xbd";
      }
      if (n == 5) want = "truncated utf-8 \xef\xbf\xbd\xef\xbf\xbd";
      if (n == 6) {
        want =
            "overlong \xef\xbf\xbd\xef\xbf\xbd and surrogate \xef\xbf\xbd\xef\xbf\xbd"
            "\xef\xbf\xbd and fine \xe2\x82\xac \xf0\x9f\x98\x80";
      }
      EXPECT_EQ(j["message"].get<std::string>(), want);
    } else {
      EXPECT_EQ(j["level"], "info");
      EXPECT_EQ(j["message"], "no fields: \"x\"\n");
      EXPECT_FALSE(j.contains("request_id"));
    }
  }
  EXPECT_EQ(n, messages.size() + 1);
}

TEST(Logging, JsonQuoteReplacesWhatIsNotUtf8) {
  EXPECT_EQ(JsonQuote("a\xffz"), "\"a\\ufffdz\"");
  EXPECT_EQ(JsonQuote("\xe2\x82"), "\"\\ufffd\\ufffd\"");
  EXPECT_EQ(JsonQuote("\xe2\x82\xac"), "\"\xe2\x82\xac\"");
  EXPECT_EQ(JsonQuote(std::string("\x01\x7f", 2)), "\"\\u0001\\u007f\"");
}

TEST(Logging, RequestIdsAreBoundedAndPrintable) {
  EXPECT_EQ(CleanRequestId("req-42"), "req-42");
  EXPECT_EQ(CleanRequestId("a\nb\\c\x01\xff"), "a\\x0ab\\x5cc\\x01\\xff");
  const std::string clean = CleanRequestId(std::string(100000, 'x'));
  EXPECT_EQ(clean.size(), kMaxRequestIdBytes);
  for (char c : CleanRequestId(std::string(1000, '\n'))) EXPECT_TRUE(c >= 0x20 && c < 0x7f);
  EXPECT_LE(CleanRequestId(std::string(1000, '\n')).size(), 4 * kMaxRequestIdBytes);
}

TEST(Logging, FormatNamesAreCheckedAndTheErrorNamesTheFlag) {
  EXPECT_EQ(*ParseLogFormat("json"), LogFormat::kJson);
  EXPECT_EQ(*ParseLogFormat("TEXT"), LogFormat::kText);
  for (const char* bad : {"", "xml", "jsonl", "text "}) {
    const auto f = ParseLogFormat(bad);
    ASSERT_FALSE(f.ok()) << bad;
    EXPECT_NE(f.status().message().find("--log_format"), std::string::npos);
  }
}

}  // namespace
}  // namespace posenc::server
