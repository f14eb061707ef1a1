#include "engine/aligned_work.h"

#include <cstring>
#include <random>
#include <string>

#include "gtest/gtest.h"

namespace posenc::server {
namespace {

AdmissionControl& Budget() {
  static AdmissionControl* a = new AdmissionControl(AdmissionOptions{8, int64_t{1} << 20});
  return *a;
}

TEST(AlignedWork, AlignedTensorsAreUsedWhereTheyAre) {
  alignas(8) char bytes[64] = {};
  auto ticket = Budget().Enter();
  ASSERT_TRUE(ticket.ok());
  AlignedWork w(*ticket);
  MutableTensor t{DType::kFloat32, {4}, bytes + 4, 16};
  ASSERT_TRUE(w.Align(t).ok());
  EXPECT_EQ(t.data, bytes + 4);
  auto out = w.Output(bytes + 2, 8, DType::kBFloat16);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, bytes + 2);
  EXPECT_EQ(ticket->bytes(), 0) << "nothing copied, nothing admitted";
}

// A misaligned tensor is worked on in an aligned copy of its bytes, which
// goes back to its place only on CopyBack; a misaligned output likewise.
TEST(AlignedWork, MisalignedTensorsAreComputedAsideAndCopiedBack) {
  const unsigned seed = std::random_device()();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  alignas(8) char region[256];
  for (char& c : region) c = static_cast<char>(rng());
  const std::string before(region, sizeof region);
  auto ticket = Budget().Enter();
  ASSERT_TRUE(ticket.ok());
  AlignedWork w(*ticket);
  MutableTensor t{DType::kFloat32, {10}, region + 3, 40};
  ASSERT_TRUE(w.Align(t).ok());
  ASSERT_NE(t.data, region + 3);
  ASSERT_TRUE(AlignedFor(t.data, DType::kFloat32));
  EXPECT_EQ(std::memcmp(t.data, before.data() + 3, 40), 0) << "the copy holds the tensor";
  EXPECT_EQ(ticket->bytes(), 40) << "the copy is admitted";
  auto out = w.Output(region + 101, 30, DType::kFloat16);
  ASSERT_TRUE(out.ok());
  ASSERT_TRUE(AlignedFor(*out, DType::kFloat16));
  // The work: every element of both changed.
  for (int i = 0; i < 10; ++i) static_cast<float*>(t.data)[i] = static_cast<float>(i) + 0.5f;
  std::memset(*out, 0x5a, 30);
  EXPECT_EQ(std::string(region, sizeof region), before) << "nothing home before CopyBack";
  w.CopyBack();
  for (int i = 0; i < 10; ++i) {
    float f;
    std::memcpy(&f, region + 3 + 4 * i, 4);
    EXPECT_EQ(f, static_cast<float>(i) + 0.5f);
  }
  for (int i = 101; i < 131; ++i) EXPECT_EQ(region[i], 0x5a);
  // Only those bytes.
  EXPECT_EQ(std::memcmp(region, before.data(), 3), 0);
  EXPECT_EQ(std::memcmp(region + 43, before.data() + 43, 101 - 43), 0);
  EXPECT_EQ(std::memcmp(region + 131, before.data() + 131, sizeof region - 131), 0);
}

TEST(AlignedWork, ACopyBeyondTheBudgetIsRefused) {
  AdmissionControl small(AdmissionOptions{8, 100});
  auto ticket = small.Enter();
  ASSERT_TRUE(ticket.ok());
  AlignedWork w(*ticket);
  std::string bytes(201, '\0');
  MutableTensor t{DType::kFloat32, {50}, bytes.data() + 1, 200};
  EXPECT_EQ(w.Align(t).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(t.data, bytes.data() + 1);
}

}  // namespace
}  // namespace posenc::server
