// The .npy reader and writer: round trips, <f8 narrowing, and every class of
// hostile input the reader must refuse with a specific code and message.
#include "npy.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <iostream>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace posenc::cli {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// A whole .npy file with `dict` as its header, padded as NumPy pads it.
std::string Npy(const std::string& dict, const std::string& data, int major = 1) {
  const size_t len_bytes = major == 1 ? 2 : 4;
  std::string header = dict;
  while ((8 + len_bytes + header.size() + 1) % 64 != 0) header.push_back(' ');
  header.push_back('\n');
  std::string out("\x93NUMPY", 6);
  out.push_back(static_cast<char>(major));
  out.push_back('\0');
  for (size_t i = 0; i < len_bytes; ++i) out.push_back(static_cast<char>(header.size() >> (8 * i)));
  return out + header + data;
}

std::string F4Dict(const std::string& shape) {
  return absl::StrCat("{'descr': '<f4', 'fortran_order': False, 'shape': ", shape, ", }");
}

template <typename T>
std::string Bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

std::vector<float> Floats(const std::string& data) {
  std::vector<float> v(data.size() / 4);
  std::memcpy(v.data(), data.data(), data.size());
  return v;
}

void ExpectInvalid(const std::string& bytes, const std::string& part1, const std::string& part2) {
  const absl::StatusOr<NpyArray> a = ParseNpy(bytes);
  ASSERT_FALSE(a.ok()) << "accepted " << part1 << " / " << part2;
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << a.status();
  EXPECT_THAT(std::string(a.status().message()), AllOf(HasSubstr(part1), HasSubstr(part2)))
      << "wanted: " << part1 << " / " << part2;
}

class NpyFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (std::filesystem::temp_directory_path() / "npy_test.XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  std::string WriteFile(const std::string& name, const std::string& bytes) const {
    const std::string path = Path(name);
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }

  std::filesystem::path dir_;
};

// ---------------------------------------------------------------------------
// Round trips.

TEST_F(NpyFileTest, EveryDtypeRoundTripsWithRandomData) {
  const char* env = std::getenv("NPY_TEST_SEED");
  const uint32_t seed = env != nullptr ? static_cast<uint32_t>(std::strtoul(env, nullptr, 10))
                                       : std::random_device{}();
  std::cout << "NPY_TEST_SEED=" << seed << "\n";
  RecordProperty("seed", std::to_string(seed));
  std::mt19937 rng(seed);
  const std::vector<std::vector<int64_t>> shapes = {{}, {0}, {7}, {3, 5}, {2, 0, 4}, {2, 3, 4, 5}};
  for (const DType dtype : {DType::kFloat32, DType::kFloat16, DType::kInt32, DType::kInt64}) {
    for (const std::vector<int64_t>& shape : shapes) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      // Random bytes: every bit pattern (NaNs included) must come back as is.
      std::string data(n * SizeOf(dtype), '\0');
      for (char& c : data) c = static_cast<char>(rng());
      const std::string path = Path("rt.npy");
      ASSERT_TRUE(WriteNpy(path, dtype, shape, data).ok());
      const absl::StatusOr<NpyArray> a = ReadNpy(path);
      ASSERT_TRUE(a.ok()) << DTypeName(dtype) << " " << a.status();
      EXPECT_EQ(a->dtype, dtype);
      EXPECT_EQ(a->shape, shape);
      EXPECT_TRUE(a->data == data) << DTypeName(dtype) << " data differs, seed " << seed;
    }
  }
}

TEST_F(NpyFileTest, BFloat16IsWrittenAsFloat32Exactly) {
  const std::vector<uint16_t> bf16 = {0x3f80, 0xc040, 0x0001, 0x7f80, 0x7fc1};
  const std::string path = Path("bf16.npy");
  ASSERT_TRUE(WriteNpy(path, DType::kBFloat16, {5}, Bytes(bf16)).ok());
  const absl::StatusOr<NpyArray> a = ReadNpy(path);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->dtype, DType::kFloat32);
  const std::vector<float> f = Floats(a->data);
  ASSERT_EQ(f.size(), bf16.size());
  for (size_t i = 0; i < bf16.size(); ++i) EXPECT_EQ(FloatBits(f[i]), uint32_t{bf16[i]} << 16);
}

TEST(NpyWrite, RefusesDataThatDoesNotMatchTheShape) {
  const absl::Status s =
      WriteNpy("/nonexistent/never-written.npy", DType::kFloat32, {2, 3}, std::string(20, '\0'));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), AllOf(HasSubstr("needs 24 bytes"), HasSubstr("got 20")));
}

TEST(NpyWrite, AFullDeviceIsAnErrorEvenForASmallArray) {
  // 16 floats stay in the stream's buffer until it is closed: the close's
  // failure must be the caller's error, not a file reported written.
  if (::access("/dev/full", W_OK) != 0) GTEST_SKIP() << "no writable /dev/full here";
  const absl::Status s = WriteNpy("/dev/full", DType::kFloat32, {4, 4}, std::string(64, '\0'));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("No space left"));
}

TEST(NpyWrite, ADirectoryIsRefusedByName) {
  const absl::Status s = WriteNpy("/tmp", DType::kFloat32, {1}, std::string(4, '\0'));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("/tmp"));
}

// ---------------------------------------------------------------------------
// <f8 narrowing.

TEST(NpyParse, Float64BecomesFloat32RoundedToNearest) {
  const double tie_down = 1.0 + std::ldexp(1.0, -24);    // halfway, even neighbour 1.0
  const double tie_up = 1.0 + 3 * std::ldexp(1.0, -24);  // halfway, even neighbour 1+2^-22
  const std::vector<double> in = {0.1,
                                  -2.5,
                                  tie_down,
                                  tie_up,
                                  1e-50,
                                  3.4e38,
                                  -0.0,
                                  std::numeric_limits<double>::infinity(),
                                  std::numeric_limits<double>::quiet_NaN()};
  const absl::StatusOr<NpyArray> a =
      ParseNpy(Npy("{'descr': '<f8', 'fortran_order': False, 'shape': (3, 3), }", Bytes(in)));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->dtype, DType::kFloat32);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{3, 3}));
  const std::vector<float> f = Floats(a->data);
  ASSERT_EQ(f.size(), in.size());
  EXPECT_EQ(f[0], 0.1f);
  EXPECT_EQ(f[1], -2.5f);
  EXPECT_EQ(f[2], 1.0f);
  EXPECT_EQ(f[3], 1.0f + std::ldexp(1.0f, -22));
  EXPECT_EQ(f[4], 0.0f);
  EXPECT_EQ(f[5], 3.4e38f);
  EXPECT_TRUE(std::signbit(f[6]) && f[6] == 0.0f);
  EXPECT_TRUE(std::isinf(f[7]) && f[7] > 0);
  EXPECT_TRUE(std::isnan(f[8]));
}

TEST(NpyParse, Float64BeyondFloat32RangeIsAnError) {
  const std::vector<double> in = {1.0, -1e300};
  ExpectInvalid(Npy("{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }", Bytes(in)),
                "element 1", "outside float32's range");
}

// ---------------------------------------------------------------------------
// Header syntax NumPy (or a hand-written file) may use.

TEST(NpyParse, AcceptsTheHeaderVariantsNumPyReads) {
  const std::string six(24, '\0');
  const std::vector<std::pair<std::string, int>> ok = {
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 1},
      {"{\"shape\": (2, 3), \"fortran_order\": False, \"descr\": \"<f4\"}", 1},
      {"{ 'fortran_order' :False,'shape':(2,3,),'descr':'<f4' }", 1},
      {"{'descr':\t'<f4',\n 'fortran_order': False,\r\n 'shape': ( 2 , 3 ) ,}", 1},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2L, 3L), }", 1},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 2},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 3},
  };
  for (const auto& [dict, major] : ok) {
    const absl::StatusOr<NpyArray> a = ParseNpy(Npy(dict, six, major));
    ASSERT_TRUE(a.ok()) << dict << " v" << major << ": " << a.status();
    EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3})) << dict;
  }
}

TEST(NpyParse, ScalarAndOneDimensionalShapes) {
  absl::StatusOr<NpyArray> a = ParseNpy(Npy(F4Dict("()"), std::string(4, '\0')));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->shape.empty());
  EXPECT_EQ(a->data.size(), 4u);
  a = ParseNpy(Npy(F4Dict("(5,)"), std::string(20, '\0')));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->shape, (std::vector<int64_t>{5}));
  ExpectInvalid(Npy(F4Dict("(5)"), std::string(20, '\0')), "shape", "not a tuple");
}

TEST(NpyParse, ZeroDimensionEmptiesTheArrayButTheOthersMustNotOverflow) {
  const absl::StatusOr<NpyArray> a = ParseNpy(Npy(F4Dict("(1099511627776, 0, 3)"), ""));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->shape, (std::vector<int64_t>{int64_t{1} << 40, 0, 3}));
  EXPECT_TRUE(a->data.empty());
  // NumPy refuses this too ("array is too big"): code that multiplies the
  // shape before meeting the zero would overflow.
  ExpectInvalid(Npy(F4Dict("(4611686018427387904, 0, 4611686018427387904)"), ""), "shape",
                "needs more than 2^63-1 bytes");
}

// ---------------------------------------------------------------------------
// Malformed files, one class at a time.

TEST(NpyParse, HundredKilobyteHeaderIsRefusedNotEvaluated) {
  // The old regex reader overflowed its stack on this.
  const std::string dict = F4Dict("(1,)") + std::string(100 * 1024, ' ');
  ExpectInvalid(Npy(dict, std::string(4, '\0'), 2), "header length", "exceeds the limit of 10000");
  // A 1.0 header can be up to 65535 bytes.
  ExpectInvalid(Npy(F4Dict("(1,)") + std::string(60000, ' '), std::string(4, '\0'), 1),
                "header length", "exceeds the limit");
  // At the cap, with the quote characters that made std::regex recurse.
  const std::string quotes =
      "{'fortran_order': False, 'shape': (), 'descr': '" + std::string(9000, 'x') + "'}";
  ExpectInvalid(Npy(quotes, ""), "descr: 'xxxx", "not supported");
}

TEST(NpyParse, HeaderLengthPastTheEndOfTheFile) {
  std::string bytes = Npy(F4Dict("(1,)"), std::string(4, '\0'));
  bytes[8] = '\xff';
  bytes[9] = '\x7f';
  ExpectInvalid(bytes, "header length: 32767", "runs past the end of the file");
  std::string v2 = Npy(F4Dict("(1,)"), std::string(4, '\0'), 2);
  v2[11] = '\xff';  // 4-byte length, top byte
  ExpectInvalid(v2, "header length", "runs past the end of the file");
}

TEST(NpyParse, NegativeDimension) {
  ExpectInvalid(Npy(F4Dict("(2, -3)"), ""), "shape[1]", "must be >= 0, got -3");
}

TEST(NpyParse, DimensionBeyondInt64) {
  ExpectInvalid(Npy(F4Dict("(99999999999999999999,)"), ""), "shape[0]", "does not fit");
}

TEST(NpyParse, OverflowingShapeProduct) {
  // (2**62, 2**62): the old reader multiplied signed int64s (UB).
  ExpectInvalid(Npy(F4Dict("(4611686018427387904, 4611686018427387904)"), ""), "shape",
                "needs more than 2^63-1 bytes");
  // 2**61 * 2 elements fit in int64; times 8 bytes does not.
  ExpectInvalid(
      Npy("{'descr': '<f8', 'fortran_order': False, 'shape': (2305843009213693952, 2)}", ""),
      "shape", "needs more than 2^63-1 bytes");
}

TEST(NpyParse, TooManyDimensions) {
  std::string shape = "(";
  for (int i = 0; i < kMaxNpyDims + 1; ++i) shape += "1, ";
  ExpectInvalid(Npy(F4Dict(shape + ")"), std::string(4, '\0')), "shape", "more than 64");
}

TEST(NpyParse, DataSizeMustMatchTheShapeExactly) {
  ExpectInvalid(Npy(F4Dict("(2, 3)"), std::string(20, '\0')), "data",
                "needs 24 bytes, the file has 20");
  ExpectInvalid(Npy(F4Dict("(2, 3)"), std::string(28, '\0')), "data",
                "needs 24 bytes, the file has 28");
}

TEST(NpyParse, BigEndianIsRefused) {
  ExpectInvalid(
      Npy("{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }", std::string(4, '\0')),
      "descr", "big-endian");
}

TEST(NpyParse, UnsupportedDtypeIsRefused) {
  ExpectInvalid(Npy("{'descr': '|u1', 'fortran_order': False, 'shape': (1,), }", "x"), "'|u1'",
                "expected '<f4', '<f8'");
  ExpectInvalid(Npy("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }",
                    std::string(4, '\0')),
                "descr", "quoted dtype");
}

TEST(NpyParse, FortranOrderIsRefused) {
  ExpectInvalid(
      Npy("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", std::string(24, '\0')),
      "fortran_order", "not supported");
}

TEST(NpyParse, MissingKeys) {
  ExpectInvalid(Npy("{'fortran_order': False, 'shape': (1,)}", std::string(4, '\0')), "header",
                "no 'descr' key");
  ExpectInvalid(Npy("{'descr': '<f4', 'shape': (1,)}", std::string(4, '\0')), "header",
                "no 'fortran_order' key");
  ExpectInvalid(Npy("{'descr': '<f4', 'fortran_order': False}", std::string(4, '\0')), "header",
                "no 'shape' key");
}

TEST(NpyParse, Garbage) {
  const std::string four(4, '\0');
  ExpectInvalid("PK\x03\x04 not numpy at all", "magic", "not a .npy file");
  ExpectInvalid("", "magic", "not a .npy file");
  std::string v4 = Npy(F4Dict("(1,)"), four);
  v4[6] = 4;
  ExpectInvalid(v4, "version", "4.0 is not supported");
  ExpectInvalid(Npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}", four),
                "unknown key 'x'", "expected 'descr'");
  ExpectInvalid(
      Npy("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,)}", four),
      "header", "duplicate key 'descr'");
  ExpectInvalid(Npy("{'descr': '<f4', 'fortran_order': 0, 'shape': (1,)}", four),
                "fortran_order as True or False", "got '0");
  ExpectInvalid(Npy("{'descr': '<f4', 'fortran_order': Falsey, 'shape': (1,)}", four),
                "True or False", "got 'Falsey");
  ExpectInvalid(Npy("{'descr': '<f4', 'fortran_order': False, 'shape': [1]}", four),
                "shape as a tuple", "got '[1]");
  ExpectInvalid(Npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1.5,)}", four),
                "expected ',' or ')' in shape", "got '.5");
  ExpectInvalid(Npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1,)} junk", four),
                "only whitespace after the header dict", "got 'junk");
  ExpectInvalid(Npy("{'descr' '<f4', 'fortran_order': False, 'shape': (1,)}", four),
                "expected ':' after key 'descr'", "got '\\'<f4");
  ExpectInvalid(Npy("{'descr': '<f4", four), "header", "unterminated string");
  ExpectInvalid(Npy("{'descr': '<\\x66\\x34', 'fortran_order': False, 'shape': (1,)}", four),
                "header", "without escapes");
  ExpectInvalid(Npy("{'descr': '<f4' 'fortran_order': False, 'shape': (1,)}", four),
                "expected ',' or '}'", "got '\\'fortran_order");
  ExpectInvalid(Npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1,)", four),
                "expected ',' or '}'", "the end of the header");
  ExpectInvalid(Npy("('descr', '<f4')", four), "'{' opening the header dict", "got '(");
}

TEST(NpyParse, EveryTruncationIsInvalidArgument) {
  const std::string whole = Npy(F4Dict("(2, 3)"), std::string(24, '\1'));
  ASSERT_TRUE(ParseNpy(whole).ok());
  for (size_t n = 0; n < whole.size(); ++n) {
    const absl::StatusOr<NpyArray> a = ParseNpy(whole.substr(0, n));
    ASSERT_FALSE(a.ok()) << "a " << n << "-byte prefix was accepted";
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << n << ": " << a.status();
  }
}

// ---------------------------------------------------------------------------
// Files that are not regular files, or not there.

TEST_F(NpyFileTest, TruncatedFileNamesThePath) {
  const std::string whole = Npy(F4Dict("(2, 3)"), std::string(24, '\0'));
  const std::string path = WriteFile("cut.npy", whole.substr(0, whole.size() - 1));
  const absl::StatusOr<NpyArray> a = ReadNpy(path);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(a.status().message()),
              AllOf(HasSubstr(path), HasSubstr("needs 24 bytes, the file has 23")));
}

TEST_F(NpyFileTest, FifoIsRefusedWithoutBlocking) {
  const std::string path = Path("fifo.npy");
  ASSERT_EQ(mkfifo(path.c_str(), 0600), 0) << std::strerror(errno);
  auto done = std::make_shared<std::promise<absl::Status>>();
  std::future<absl::Status> result = done->get_future();
  std::thread reader([done, path] { done->set_value(ReadNpy(path).status()); });
  if (result.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    // Unblock the reader (a writer appearing and leaving gives it EOF).
    const int w = open(path.c_str(), O_WRONLY | O_NONBLOCK);
    if (w >= 0) close(w);
    reader.join();
    FAIL() << "ReadNpy blocked on a FIFO";
  }
  reader.join();
  const absl::Status s = result.get();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr(path), HasSubstr("is a FIFO"), HasSubstr("regular file")));
}

TEST_F(NpyFileTest, DirectoryIsRefused) {
  const absl::Status s = ReadNpy(dir_.string()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), AllOf(HasSubstr(dir_.string()), HasSubstr("directory")));
}

TEST(NpyRead, CharacterDeviceIsRefused) {
  if (!std::filesystem::exists("/dev/null")) GTEST_SKIP() << "no /dev/null";
  const absl::Status s = ReadNpy("/dev/null").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("character device"));
}

TEST_F(NpyFileTest, MissingFileIsNotFound) {
  const std::string path = Path("absent.npy");
  const absl::Status s = ReadNpy(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(std::string(s.message()), AllOf(HasSubstr("cannot open"), HasSubstr(path)));
}

TEST_F(NpyFileTest, OversizedFileIsRefusedBeforeReading) {
  const std::string path = Path("huge.npy");
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(fd, 0);
  // Sparse: costs no disk, and the reader must refuse it from fstat alone.
  const int rc = ftruncate(fd, static_cast<off_t>(kMaxNpyFileBytes + 1));
  close(fd);
  if (rc != 0) GTEST_SKIP() << "no sparse file here: " << std::strerror(errno);
  const absl::Status s = ReadNpy(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr(path), HasSubstr(absl::StrCat("the limit is ", kMaxNpyFileBytes))));
}

}  // namespace
}  // namespace posenc::cli
