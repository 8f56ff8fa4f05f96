#include "shm/retry_budget.h"

#include <gtest/gtest.h>

namespace retryd::shm {
namespace {

constexpr uint64_t kToken = RetryBudget::kTokenScale;

TEST(RetryBudgetTest, RetriesNeedDepositsOrTheFloor) {
  std::atomic<uint64_t> w{RetryBudget::Make(0, 1000)};
  // No floor, no deposit: no retry.
  EXPECT_FALSE(RetryBudget::TryWithdraw(w, 1000, /*floor=*/0, /*burst=*/100));
  // Five first attempts at ratio 0.2 make one token.
  for (int i = 0; i < 5; ++i) RetryBudget::Deposit(w, 200, 100);
  EXPECT_TRUE(RetryBudget::TryWithdraw(w, 1000, 0, 100));
  EXPECT_FALSE(RetryBudget::TryWithdraw(w, 1000, 0, 100));
}

TEST(RetryBudgetTest, FloorRefillsWithElapsedTime) {
  std::atomic<uint64_t> w{RetryBudget::Make(0, 1000)};
  // 10 per second: after 250 ms, two and a half tokens.
  EXPECT_TRUE(RetryBudget::TryWithdraw(w, 1250, 10, 100));
  EXPECT_TRUE(RetryBudget::TryWithdraw(w, 1250, 10, 100));
  EXPECT_FALSE(RetryBudget::TryWithdraw(w, 1250, 10, 100));
  EXPECT_EQ(RetryBudget::Tokens(w.load()), kToken / 2);
}

TEST(RetryBudgetTest, CapBoundsDepositsAndRefill) {
  std::atomic<uint64_t> w{RetryBudget::Make(0, 0)};
  for (int i = 0; i < 1000; ++i) RetryBudget::Deposit(w, 1000, 3);
  EXPECT_EQ(RetryBudget::Tokens(w.load()), 3 * kToken);  // deposits stop at the cap
  int granted = 0;
  while (RetryBudget::TryWithdraw(w, 1'000'000, 10, 3)) ++granted;  // a long idle refill
  EXPECT_EQ(granted, 3);
}

TEST(RetryBudgetTest, TimeGoingBackwardsAddsNothing) {
  std::atomic<uint64_t> w{RetryBudget::Make(0, 5000)};
  EXPECT_FALSE(RetryBudget::TryWithdraw(w, 4000, 10, 100));  // 1 s in the past
  EXPECT_TRUE(RetryBudget::TryWithdraw(w, 5100, 10, 100));   // 100 ms later: one token
  EXPECT_FALSE(RetryBudget::TryWithdraw(w, 5050, 10, 100));  // stamp never moves back
  EXPECT_EQ(RetryBudget::StampMs(w.load()), 5100u);
}

TEST(RetryBudgetTest, MillisecondWrapIsContinuous) {
  const uint32_t before_wrap = 0xFFFF'FF00u;
  std::atomic<uint64_t> w{RetryBudget::Make(0, before_wrap)};
  // 512 ms later the 32-bit clock wrapped: 5 tokens at 10/s.
  int granted = 0;
  while (RetryBudget::TryWithdraw(w, before_wrap + 512, 10, 100)) ++granted;
  EXPECT_EQ(granted, 5);
}

TEST(RetryBudgetTest, FloorStillRefillsAfterAMonthIdle) {
  // 25 days without a retry: the 32-bit difference reads as negative, yet it is elapsed time.
  const uint32_t stamp = 1000;
  std::atomic<uint64_t> w{RetryBudget::Make(0, stamp)};
  const uint32_t later = stamp + 25u * 86'400'000u;
  int granted = 0;
  while (granted < 100 && RetryBudget::TryWithdraw(w, later, 10, 100)) ++granted;
  EXPECT_EQ(granted, 100);  // the floor refilled the whole burst
}

}  // namespace
}  // namespace retryd::shm
