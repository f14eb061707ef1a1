#include "engine/attempt_ledger.h"

#include <chrono>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace posenc::server {
namespace {

TEST(AttemptLedger, ASecondClaimOfAnIdIsAbortedNamingIt) {
  AttemptLedger ledger;
  EXPECT_TRUE(ledger.Claim("7f3a-1").ok());
  EXPECT_TRUE(ledger.Claim("7f3a-2").ok());
  const absl::Status again = ledger.Claim("7f3a-1");
  EXPECT_EQ(again.code(), absl::StatusCode::kAborted) << again;
  EXPECT_TRUE(absl::StrContains(again.message(), "7f3a-1")) << again;
  EXPECT_EQ(ledger.Claim("7f3a-1").code(), absl::StatusCode::kAborted);  // and stays so
  EXPECT_EQ(ledger.size(), 2u);
}

TEST(AttemptLedger, AnEmptyIdClaimsNothing) {
  AttemptLedger ledger;
  EXPECT_TRUE(ledger.Claim("").ok());
  EXPECT_TRUE(ledger.Claim("").ok());
  EXPECT_EQ(ledger.size(), 0u);
}

TEST(AttemptLedger, IdsAreForgottenAfterKeepAndBeyondCapacity) {
  AttemptLedger::Options o;
  o.keep = absl::Seconds(10);
  o.capacity = 3;
  AttemptLedger ledger(o);
  const AttemptLedger::Clock::time_point t0 = AttemptLedger::Clock::now();
  ASSERT_TRUE(ledger.Claim("a", t0).ok());
  ASSERT_TRUE(ledger.Claim("b", t0 + std::chrono::seconds(5)).ok());
  // Within keep: remembered.
  EXPECT_FALSE(ledger.Claim("a", t0 + std::chrono::seconds(9)).ok());
  // Past keep: "a" is forgotten, "b" is not.
  EXPECT_TRUE(ledger.Claim("a", t0 + std::chrono::seconds(11)).ok());
  EXPECT_FALSE(ledger.Claim("b", t0 + std::chrono::seconds(11)).ok());
  // Capacity 3: a fourth claim pushes out the oldest ("b").
  ASSERT_TRUE(ledger.Claim("c", t0 + std::chrono::seconds(12)).ok());
  ASSERT_TRUE(ledger.Claim("d", t0 + std::chrono::seconds(12)).ok());
  EXPECT_EQ(ledger.size(), 3u);
  EXPECT_TRUE(ledger.Claim("b", t0 + std::chrono::seconds(12)).ok());
  EXPECT_FALSE(ledger.Claim("d", t0 + std::chrono::seconds(12)).ok());
}

TEST(AttemptLedger, ManyIdsAreAllTold) {
  AttemptLedger ledger;
  for (int i = 0; i < 10000; ++i) ASSERT_TRUE(ledger.Claim(absl::StrCat("id-", i)).ok()) << i;
  for (int i = 0; i < 10000; ++i) EXPECT_FALSE(ledger.Claim(absl::StrCat("id-", i)).ok()) << i;
}

}  // namespace
}  // namespace posenc::server
