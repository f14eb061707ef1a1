#include "engine/safetensors.h"

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace posenc::server {
namespace {

// Random contents, reproducible: the seed is printed and POSENC_TEST_SEED repeats it.
std::mt19937 SeededRng() {
  const char* env = std::getenv("POSENC_TEST_SEED");
  const uint32_t seed = env != nullptr ? static_cast<uint32_t>(std::strtoul(env, nullptr, 10))
                                       : std::random_device{}();
  std::printf("random seed %u (POSENC_TEST_SEED=%u repeats it)\n", seed, seed);
  return std::mt19937(seed);
}

LearnedTable RandomTable(int64_t rows, int64_t dim, std::mt19937& rng) {
  LearnedTable t;
  t.rows = rows;
  t.dim = dim;
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  for (int64_t i = 0; i < rows * dim; ++i) t.values.push_back(u(rng));
  return t;
}

// A file with this header text (unpadded) and data section.
std::string File(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i)
    out[i] = static_cast<char>((uint64_t{header.size()} >> (8 * i)) & 0xff);
  return out + header + data;
}

// A header entry: "name":{"dtype":..,"shape":..,"data_offsets":..}.
std::string Entry(const std::string& name, const std::string& dtype, const std::string& shape,
                  const std::string& offsets) {
  return absl::StrCat("\"", name, "\":{\"dtype\":\"", dtype, "\",\"shape\":", shape,
                      ",\"data_offsets\":", offsets, "}");
}

// A shape of `n` ones.
std::string Dims(int n) {
  std::string out = "[1";
  for (int i = 1; i < n; ++i) out += ",1";
  return out + "]";
}

std::string Floats(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

TEST(Safetensors, RoundTripsRandomFloatTables) {
  std::mt19937 rng = SeededRng();
  for (auto [rows, dim] : {std::pair<int64_t, int64_t>{3, 2}, {1024, 768}, {8192, 64}}) {
    const LearnedTable t = RandomTable(rows, dim, rng);
    const LearnedTable u = RandomTable(5, 7, rng);
    const std::string bytes = SerializeSafetensors({{"wpe.weight", &t}, {"other", &u}});
    auto parsed = ParseSafetensors(bytes, "gpt2");
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    ASSERT_EQ(parsed->tables.size(), 2u) << rows << "x" << dim;
    const LearnedTable* wpe = nullptr;
    const LearnedTable* other = nullptr;
    for (const auto& p : parsed->tables) {
      if (p->name == "gpt2/wpe.weight") wpe = p.get();
      if (p->name == "gpt2/other") other = p.get();
    }
    ASSERT_NE(wpe, nullptr);
    ASSERT_NE(other, nullptr);
    EXPECT_EQ(wpe->rows, rows);
    EXPECT_EQ(wpe->dim, dim);
    EXPECT_EQ(wpe->source_dtype, DType::kFloat32);
    EXPECT_EQ(wpe->values, t.values);
    EXPECT_EQ(other->values, u.values);
  }
}

TEST(Safetensors, ReadsHalfAndBFloat16AndSkipsNonTables) {
  // One BF16 [1, 2] table, one F16 [2, 1], one I64 vector, metadata.
  const std::string header = absl::StrCat(
      "{", Entry("a", "BF16", "[1,2]", "[0,4]"), ",", Entry("b", "F16", "[2,1]", "[4,8]"), ",",
      Entry("c", "I64", "[1]", "[8,16]"), R"(,"__metadata__":{"x":"y"}})");
  const std::string data = std::string("\x80\x3f\x00\x40", 4) + std::string("\x00\x3c\x00\xc0", 4) +
                           std::string(8, '\0');
  auto parsed = ParseSafetensors(File(header, data), "f");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->tables.size(), 2u);
  EXPECT_EQ(parsed->tables[0]->values, (std::vector<float>{1.0f, 2.0f}));
  EXPECT_EQ(parsed->tables[0]->source_dtype, DType::kBFloat16);
  EXPECT_EQ(parsed->tables[1]->values, (std::vector<float>{1.0f, -2.0f}));
  ASSERT_EQ(parsed->skipped.size(), 1u);
  EXPECT_NE(parsed->skipped[0].find("f/c"), std::string::npos) << parsed->skipped[0];
  EXPECT_NE(parsed->skipped[0].find("I64"), std::string::npos) << parsed->skipped[0];
}

// Well-formed tensors that are not usable tables are skipped, with why.
TEST(Safetensors, SkipsTensorsThatAreNotUsableTables) {
  struct Case {
    std::string entry;
    std::string data;
    std::string why;
  };
  const std::vector<Case> cases = {
      {Entry("t", "F32", "[2]", "[0,8]"), std::string(8, '\0'), "is not [max_positions, dim]"},
      {Entry("t", "F32", "[1,1,2]", "[0,8]"), std::string(8, '\0'), "is not [max_positions"},
      {Entry("t", "U8", "[2,4]", "[0,8]"), std::string(8, '\0'), "dtype U8"},
      {Entry("t", "F4", "[4,4]", "[0,8]"), std::string(8, '\0'), "dtype F4"},
      {Entry("t", "F32", "[0,4]", "[0,0]"), "", "is empty"},
      // Once read as int64 this was a table of -1 rows.
      {Entry("t", "F32", "[18446744073709551615,0]", "[0,0]"), "",
       "[18446744073709551615, 0] is empty"},
      {Entry("t", "F32", "[2,0]", "[0,0]"), "", "is empty"},
      {Entry("t", "F32", "[1,2]", "[0,8]"), Floats({1.0f, std::nanf("")}), "value [0, 1] is nan"},
      {Entry("t", "F32", "[2,1]", "[0,8]"), Floats({1.0f, -HUGE_VALF}), "value [1, 0] is -inf"},
  };
  for (const Case& c : cases) {
    auto parsed = ParseSafetensors(File("{" + c.entry + "}", c.data), "f");
    ASSERT_TRUE(parsed.ok()) << c.entry << ": " << parsed.status();
    EXPECT_TRUE(parsed->tables.empty()) << c.entry;
    ASSERT_EQ(parsed->skipped.size(), 1u) << c.entry;
    EXPECT_NE(parsed->skipped[0].find(c.why), std::string::npos)
        << c.entry << ": " << parsed->skipped[0];
  }
}

TEST(Safetensors, SkipsTablesOverTheRowAndDimLimits) {
  SafetensorsLimits limits;
  limits.max_table_rows = 4;
  limits.max_table_dim = 2;
  const std::string data = std::string(40, '\0');
  auto rows =
      ParseSafetensors(File("{" + Entry("t", "F32", "[5,2]", "[0,40]") + "}", data), "f", limits);
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->skipped.size(), 1u);
  EXPECT_NE(rows->skipped[0].find("5 rows are over the limit of 4"), std::string::npos);
  auto dim =
      ParseSafetensors(File("{" + Entry("t", "F32", "[2,5]", "[0,40]") + "}", data), "f", limits);
  ASSERT_TRUE(dim.ok()) << dim.status();
  ASSERT_EQ(dim->skipped.size(), 1u);
  EXPECT_NE(dim->skipped[0].find("dim 5 is over the limit of 2"), std::string::npos);
  EXPECT_EQ(kMaxTableRows, uint64_t{1} << 31);
  EXPECT_EQ(kMaxTableDim, uint64_t{65536});
}

struct MalformedCase {
  std::string what;
  std::string file;
  std::vector<std::string> needles;  // each must appear in the error
};

void ExpectMalformed(const MalformedCase& c, const SafetensorsLimits& limits = {}) {
  auto parsed = ParseSafetensors(c.file, "f", limits);
  ASSERT_FALSE(parsed.ok()) << c.what;
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument)
      << c.what << ": " << parsed.status();
  for (const std::string& needle : c.needles) {
    EXPECT_NE(parsed.status().message().find(needle), absl::string_view::npos)
        << c.what << ": '" << needle << "' not in: " << parsed.status().message();
  }
}

TEST(Safetensors, ShapesBeyondInt64AreErrorsNotNegativeOrHugeTables) {
  const std::vector<MalformedCase> cases = {
      {"2^64-1 rows",
       File("{" + Entry("w", "F32", "[18446744073709551615,2]", "[0,8]") + "}",
            std::string(8, '\0')),
       {"'w'", "needs more than 2^64 bits"}},
      {"> INT64_MAX rows",
       File("{" + Entry("w", "F32", "[9223372036854775808,1]", "[0,8]") + "}",
            std::string(8, '\0')),
       {"'w'", "2^64"}},
      // As int64 these are -2^62 and -1: their product 2^62 elements wrapped
      // to 0 bytes and the old reader allocated 2^62 floats.
      {"rows x dim wraps to zero bytes",
       File("{" + Entry("w", "F32", "[13835058055282163712,18446744073709551615]", "[0,0]") + "}",
            ""),
       {"'w'", "2^64"}},
      {"rows x dim overflows",
       File("{" + Entry("w", "BF16", "[4294967296,4294967296]", "[0,8]") + "}",
            std::string(8, '\0')),
       {"'w'", "2^64"}},
      {"shape past 2^64-1 (a float to JSON)",
       File("{" + Entry("w", "F32", "[18446744073709551616,1]", "[0,0]") + "}", ""),
       {"'w'", "shape[0] is 18446744073709551616", "expected an integer"}},
      {"negative dim",
       File("{" + Entry("w", "F32", "[1,-2]", "[0,0]") + "}", ""),
       {"'w'", "shape[1] is -2"}},
      {"fractional dim",
       File("{" + Entry("w", "F32", "[1,2.5]", "[0,0]") + "}", ""),
       {"shape[1] is 2.5"}},
      {"string dim",
       File("{" + Entry("w", "F32", "[1,\"2\"]", "[0,0]") + "}", ""),
       {"shape[1] is '2'"}},
      {"65 dims",
       File("{" + Entry("w", "F32", Dims(65), "[0,4]") + "}", std::string(4, '\0')),
       {"'w'", "shape has more than 64 dims"}},
      {"sub-byte total",
       File("{" + Entry("w", "F4", "[3]", "[0,2]") + "}", std::string(2, '\0')),
       {"'w'", "12 bits, not a whole number of bytes"}},
  };
  for (const MalformedCase& c : cases) ExpectMalformed(c);
  auto rank64 = ParseSafetensors(
      File("{" + Entry("w", "F32", Dims(64), "[0,4]") + "}", std::string(4, '\0')), "f");
  ASSERT_TRUE(rank64.ok()) << rank64.status();
  EXPECT_EQ(rank64->skipped.size(), 1u);
}

TEST(Safetensors, OffsetsMustTileTheDataSection) {
  const std::string d8(8, '\0'), d12(12, '\0'), d16(16, '\0'), d20(20, '\0');
  const std::string a = Entry("a", "F32", "[1,2]", "[0,8]");
  const std::vector<MalformedCase> cases = {
      {"overlap",
       File("{" + a + "," + Entry("b", "F32", "[1,2]", "[4,12]") + "}", d12),
       {"'b'", "[4, 12] overlap tensor 'a' [0, 8]"}},
      {"aliasing",
       File("{" + a + "," + Entry("b", "F32", "[2,1]", "[0,8]") + "}", d8),
       {"overlap tensor"}},
      {"contained",
       File("{" + Entry("a", "F32", "[1,4]", "[0,16]") + "," + Entry("b", "F32", "[1,1]", "[4,8]") +
                "}",
            d16),
       {"'b'", "overlap tensor 'a'"}},
      {"gap",
       File("{" + a + "," + Entry("b", "F32", "[1,2]", "[12,20]") + "}", d20),
       {"'b'", "leave bytes [8, 12) of the data section unused"}},
      {"not from 0",
       File("{" + Entry("a", "F32", "[1,2]", "[4,12]") + "}", d12),
       {"'a'", "leave bytes [0, 4)"}},
      {"trailing bytes", File("{" + a + "}", d12), {"cover 8 bytes", "has 12"}},
      {"past the data",
       File("{" + Entry("a", "F32", "[1,4]", "[0,16]") + "}", d8),
       {"'a'", "[0, 16] are not a range within the data section of 8 bytes"}},
      {"begin after end",
       File("{" + Entry("a", "F32", "[1,2]", "[8,0]") + "}", d8),
       {"'a'", "[8, 0]"}},
      {"huge end",
       File("{" + Entry("a", "F32", "[1,2]", "[0,18446744073709551615]") + "}", d8),
       {"'a'", "not a range"}},
      {"size mismatch",
       File("{" + Entry("a", "F32", "[1,2]", "[0,4]") + "}", std::string(4, 0)),
       {"'a'", "hold 4 bytes but shape [1, 2] of F32 needs 8"}},
      {"three offsets",
       File("{" + Entry("a", "F32", "[1,2]", "[0,8,8]") + "}", d8),
       {"'a'", "more than 2 entries"}},
      {"one offset",
       File("{" + Entry("a", "F32", "[1,2]", "[8]") + "}", d8),
       {"'a'", "has 1 entries"}},
      {"negative offset",
       File("{" + Entry("a", "F32", "[1,2]", "[-8,0]") + "}", d8),
       {"'a'", "data_offsets[0] is -8"}},
      {"offsets not a list",
       File("{" + Entry("a", "F32", "[1,2]", "8") + "}", d8),
       {"'a'", "data_offsets is 8; expected a list"}},
  };
  for (const MalformedCase& c : cases) ExpectMalformed(c);
  // Zero-byte tensors may share an offset: they own no bytes.
  auto empty = ParseSafetensors(File("{" + Entry("e", "F32", "[0,2]", "[0,0]") + "," +
                                         Entry("z", "F32", "[2,0]", "[0,0]") + "," + a + "}",
                                     Floats({1, 2})),
                                "f");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->tables.size(), 1u);
}

TEST(Safetensors, HeaderLengthIsCheckedAgainstTheFileAndTheCap) {
  auto with_length = [](uint64_t n, const std::string& rest) {
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    return out + rest;
  };
  const std::vector<MalformedCase> cases = {
      {"past the file", with_length(1000, "{}"), {"header length 1000 runs past the end", "(2"}},
      {"2^64-1", with_length(~uint64_t{0}, "{}"), {"18446744073709551615 is over the limit"}},
      {"over the default cap", with_length(kDefaultMaxHeaderBytes + 1, "{}"), {"over the limit"}},
      {"empty file", "", {"file of 0 bytes"}},
      {"7 bytes", std::string(7, '\0'), {"file of 7 bytes"}},
  };
  for (const MalformedCase& c : cases) ExpectMalformed(c);
  SafetensorsLimits small;
  small.max_header_bytes = 16;
  ExpectMalformed({"over a small cap",
                   File(std::string(17, ' ') + "{}", ""),
                   {"header length 19 is over the limit of 16 bytes"}},
                  small);
  EXPECT_TRUE(ParseSafetensors(File("{}      ", ""), "f", small).ok());
}

TEST(Safetensors, HeaderMustBeAJsonObjectOfTensorEntries) {
  const std::string d8(8, '\0');
  const std::vector<MalformedCase> cases = {
      {"list", File("[]", ""), {"header is a list, not a JSON object"}},
      {"number", File("5", ""), {"header is 5, not a JSON object"}},
      {"string", File("\"x\"", ""), {"not a JSON object"}},
      {"null", File("null", ""), {"header is null"}},
      {"empty", File("", ""), {"not valid JSON"}},
      {"not JSON", File("{\"a\":", ""), {"not valid JSON"}},
      {"trailing garbage", File("{} x", ""), {"not valid JSON"}},
      {"two objects", File("{}{}", ""), {"not valid JSON"}},
      {"NUL hides the rest", File(std::string("{}\0\"junk\"", 9), ""), {"NUL byte at offset 2"}},
      {"invalid UTF-8", File("{\"\xff\":{}}", ""), {"not valid JSON"}},
      {"entry not an object", File("{\"w\":[1,2]}", ""), {"'w'", "entry is a list"}},
      {"entry a number", File("{\"w\":1}", ""), {"'w'", "entry is 1"}},
      {"no dtype",
       File(R"({"w":{"shape":[1,2],"data_offsets":[0,8]}})", d8),
       {"'w'", "lacks dtype"}},
      {"no shape",
       File(R"({"w":{"dtype":"F32","data_offsets":[0,8]}})", d8),
       {"'w'", "lacks shape"}},
      {"no offsets",
       File(R"({"w":{"dtype":"F32","shape":[1,2]}})", d8),
       {"'w'", "lacks data_offsets"}},
      {"dtype a number",
       File(R"({"w":{"dtype":4,"shape":[1,2],"data_offsets":[0,8]}})", d8),
       {"'w'", "dtype is 4; expected a string"}},
      {"unknown dtype",
       File("{" + Entry("w", "F33", "[1,2]", "[0,8]") + "}", d8),
       {"'w'", "dtype 'F33' is not a safetensors dtype"}},
      {"shape an object",
       File(R"({"w":{"dtype":"F32","shape":{},"data_offsets":[0,8]}})", d8),
       {"'w'", "shape is an object"}},
      {"nested shape",
       File(R"({"w":{"dtype":"F32","shape":[[1],2],"data_offsets":[0,8]}})", d8),
       {"'w'", "shape[0] is a list"}},
      {"duplicate tensor",
       File("{" + Entry("w", "F32", "[1,2]", "[0,8]") + "," + Entry("w", "F32", "[1,2]", "[0,8]") +
                "}",
            d8),
       {"'w'", "appears twice"}},
      {"duplicate field",
       File(R"({"w":{"dtype":"F32","dtype":"I64","shape":[1,2],"data_offsets":[0,8]}})", d8),
       {"'w'", "two 'dtype' fields"}},
      {"metadata value",
       File(R"({"__metadata__":{"k":5}})", ""),
       {"__metadata__ value for 'k' is 5; expected a string"}},
      {"metadata nested",
       File(R"({"__metadata__":{"k":{"a":"b"}}})", ""),
       {"__metadata__ value for 'k' is an object"}},
      {"metadata a string", File(R"({"__metadata__":"x"})", ""), {"__metadata__ is '"}},
      {"metadata twice",
       File(R"({"__metadata__":{},"__metadata__":{}})", ""),
       {"__metadata__ appears twice"}},
      {"control bytes are escaped", File("{\"a\\u0001\\n\":1}", ""), {"'a\\x01\\n'"}},
  };
  for (const MalformedCase& c : cases) ExpectMalformed(c);
}

TEST(Safetensors, IgnoresUnknownFieldsHoweverDeep) {
  // Fields other than dtype/shape/data_offsets are ignored (as the reference
  // reader does), including deeply nested ones: no recursion, no stack use.
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::string header = R"({"w":{"extra":)" + deep +
                             R"(,"dtype":"F32","shape":[1,2],"more":{"x":[1,{"y":null}]},)"
                             R"("data_offsets":[0,8]},"__metadata__":{"format":"pt"}})";
  auto parsed = ParseSafetensors(File(header, Floats({1, 2})), "f");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->tables.size(), 1u);
  EXPECT_EQ(parsed->tables[0]->values, (std::vector<float>{1, 2}));
  // Deep nesting where the format has none is an error, not a crash.
  ExpectMalformed({"deep", File(R"({"w":)" + deep + "}", ""), {"'w'", "entry is a list"}});
  ExpectMalformed({"deeper", File(deep, ""), {"header is a list"}});
}

TEST(Safetensors, ManyTensorsParseInLinearTime) {
  // 100k zero-byte entries: a reader that rescans the object per entry
  // (quadratic) would take minutes.
  std::string header = "{";
  for (int i = 0; i < 100000; ++i) {
    absl::StrAppend(&header, i == 0 ? "" : ",",
                    Entry(absl::StrCat("t", i), "F32", "[0,1]", "[0,0]"));
  }
  header += "}";
  const auto start = std::chrono::steady_clock::now();
  auto parsed = ParseSafetensors(File(header, ""), "f");
  const auto elapsed = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  // skipped() lines go out in ListTables replies: 16 are listed, the rest counted.
  ASSERT_EQ(parsed->skipped.size(), 17u);
  EXPECT_EQ(parsed->skipped.back(), "'f': 99984 more tensors skipped");
  EXPECT_LT(elapsed, std::chrono::seconds(10));
}

TEST(Safetensors, TablesOverTheByteBudgetAreResourceExhausted) {
  SafetensorsLimits limits;
  limits.max_table_bytes = 7;
  // A BF16 [1, 2] table is 4 bytes in the file but 8 as float32.
  auto parsed = ParseSafetensors(
      File("{" + Entry("a", "BF16", "[1,2]", "[0,4]") + "}", std::string(4, '\0')), "f", limits);
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kResourceExhausted) << parsed.status();
  EXPECT_NE(parsed.status().message().find("need 8 bytes as float32"), absl::string_view::npos);
  limits.max_table_bytes = 8;
  EXPECT_TRUE(
      ParseSafetensors(File("{" + Entry("a", "BF16", "[1,2]", "[0,4]") + "}", std::string(4, '\0')),
                       "f", limits)
          .ok());
}

TEST(Safetensors, MalformedFilesAreErrorsNotCrashes) {
  std::mt19937 rng = SeededRng();
  const LearnedTable t = RandomTable(4, 4, rng);
  const std::string good = SerializeSafetensors({{"w", &t}});
  // Every truncation and every single-byte corruption fails cleanly or parses.
  for (size_t n = 0; n < good.size(); ++n) {
    EXPECT_FALSE(ParseSafetensors(good.substr(0, n), "x").ok()) << "truncated to " << n;
  }
  for (size_t i = 0; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] = static_cast<char>(rng());
    (void)ParseSafetensors(bad, "x");
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
