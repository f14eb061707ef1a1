#include "safetensors.h"

#include "gtest/gtest.h"

namespace posenc::server {
namespace {

TEST(Safetensors, RoundTripsFloatTables) {
  for (auto [rows, dim] : {std::pair<int64_t, int64_t>{3, 2}, {1024, 768}, {8192, 64}}) {
    LearnedTable t;
    t.rows = rows;
    t.dim = dim;
    for (int64_t i = 0; i < rows * dim; ++i) t.values.push_back(static_cast<float>(i % 977) / 7.0f);
    const std::string bytes = SerializeSafetensors({{"wpe.weight", &t}});
    auto parsed = ParseSafetensors(bytes, "gpt2");
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    ASSERT_EQ(parsed->tables.size(), 1u) << rows << "x" << dim;
    EXPECT_EQ(parsed->tables[0]->name, "gpt2/wpe.weight");
    EXPECT_EQ(parsed->tables[0]->values, t.values);
  }
}

TEST(Safetensors, ReadsHalfAndBFloat16AndSkipsNonTables) {
  // Hand-written file: one BF16 [1, 2] table, one F16 [2, 1], one I64 vector.
  std::string header =
      R"({"a":{"dtype":"BF16","shape":[1,2],"data_offsets":[0,4]},)"
      R"("b":{"dtype":"F16","shape":[2,1],"data_offsets":[4,8]},)"
      R"("c":{"dtype":"I64","shape":[1],"data_offsets":[8,16]},"__metadata__":{"x":"y"}})";
  std::string data = std::string("\x80\x3f\x00\x40", 4) + std::string("\x00\x3c\x00\xc0", 4) +
                     std::string(8, '\0');
  std::string file(8, '\0');
  file[0] = static_cast<char>(header.size());
  file += header + data;
  auto parsed = ParseSafetensors(file, "f");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->tables.size(), 2u);
  EXPECT_EQ(parsed->tables[0]->values, (std::vector<float>{1.0f, 2.0f}));
  EXPECT_EQ(parsed->tables[1]->values, (std::vector<float>{1.0f, -2.0f}));
  ASSERT_EQ(parsed->skipped.size(), 1u);
  EXPECT_NE(parsed->skipped[0].find("I64"), std::string::npos);
}

TEST(Safetensors, MalformedFilesAreErrorsNotCrashes) {
  LearnedTable t;
  t.rows = 4;
  t.dim = 4;
  t.values.assign(16, 0.5f);
  const std::string good = SerializeSafetensors({{"w", &t}});
  // Every truncation and a few corruptions must fail cleanly.
  for (size_t n = 0; n < good.size(); ++n) {
    EXPECT_FALSE(ParseSafetensors(good.substr(0, n), "x").ok()) << "truncated to " << n;
  }
  std::string bad = good;
  bad[0] = '\xff';
  EXPECT_FALSE(ParseSafetensors(bad, "x").ok());
  bad = good;
  bad[8] = '!';  // the header's opening brace
  EXPECT_FALSE(ParseSafetensors(bad, "x").ok());
}

}  // namespace
}  // namespace posenc::server
