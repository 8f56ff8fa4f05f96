#include "shm/retry_budget.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

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

// The idle gaps rule 6 asks for, in ms: each bucket or budget boundary, each wrap, and a year.
constexpr uint64_t kWrapMs = uint64_t{1} << 32;
constexpr uint64_t kIdleGapsMs[] = {
    1,                  // 1 ms
    1'000,              // 1 s
    3'600'000,          // 1 h
    65'536'000,         // 18.2 h: 65,536 one-second periods
    kWrapMs / 2,        // 24.8 days: the signed 32-bit difference turns negative
    0xC000'0001ull,     // 37.3 days: past the old "backwards" threshold
    4'294'000'000,      // 49.7 days, just short of the wrap and its skew window
    kWrapMs - 1,        // one ms short of the wrap: within the skew window
    kWrapMs,            // the wrap exactly: the gap reads as 0
    kWrapMs + 1,        // just past it
    31'536'000'000,     // a year
};

constexpr uint32_t kFloor = 10;  // tokens per second
constexpr uint32_t kBurst = 20;

// One sample of a virtual-time run: the time (ms, not wrapped) and retries granted so far.
struct Sample {
  uint64_t t_ms;
  uint64_t granted;
};

// Drain takes every token the budget grants at `t_ms` (uint32_t(t_ms) is the clock the
// algorithm sees) and records the sample.
uint64_t Drain(std::atomic<uint64_t>& w, uint64_t t_ms, std::vector<Sample>& run) {
  uint64_t n = 0;
  while (n < 10 * kBurst && RetryBudget::TryWithdraw(w, uint32_t(t_ms), kFloor, kBurst)) ++n;
  run.push_back({t_ms, (run.empty() ? 0 : run.back().granted) + n});
  return n;
}

// ExpectBoundOverEveryInterval: retries granted in (t_i, t_j] <= burst + floor x seconds, for
// every pair of samples (no first attempts, so no ratio term).
void ExpectBoundOverEveryInterval(const std::vector<Sample>& run) {
  for (size_t i = 0; i < run.size(); ++i) {
    for (size_t j = i + 1; j < run.size(); ++j) {
      const uint64_t allowed = kBurst + kFloor * (run[j].t_ms - run[i].t_ms) / 1000;
      ASSERT_LE(run[j].granted - run[i].granted, allowed)
          << "between " << run[i].t_ms << " and " << run[j].t_ms << " ms";
    }
  }
}

class RetryBudgetIdleGapTest : public ::testing::TestWithParam<uint64_t> {};

// An outage, an idle gap, and a second outage: the bound holds exactly over every interval,
// the floor's refill after the gap is the gap modulo 2^32 ms (nothing within the skew window
// below the wrap), and the floor grants at its full rate from then on.
TEST_P(RetryBudgetIdleGapTest, FloorWorksAfterTheGapAndTheBoundHolds) {
  const uint64_t gap = GetParam();
  const uint64_t start = 4'000'000'000;  // the first outage crosses a 32-bit wrap
  std::atomic<uint64_t> w{RetryBudget::Make(0, uint32_t(start))};
  std::vector<Sample> run{{start, 0}};
  uint64_t t = start;
  for (int i = 0; i < 50; ++i) EXPECT_EQ(Drain(w, t += 100, run), 1u);  // 10 per second
  t += gap;
  const uint64_t seen = gap % kWrapMs;
  const bool in_skew_window = seen >= kWrapMs - RetryBudget::kMaxClockSkewMs;
  const uint64_t expected = in_skew_window ? 0 : std::min<uint64_t>(kBurst, kFloor * seen / 1000);
  EXPECT_EQ(Drain(w, t, run), expected);
  uint64_t after = 0;
  for (int i = 0; i < 100; ++i) after += Drain(w, t += 100, run);
  // Ten seconds at 10 per second; at most 1 ms of it lost to the skew window (gap 2^32 - 1).
  EXPECT_GE(after, 99u);
  ExpectBoundOverEveryInterval(run);
}

INSTANTIATE_TEST_SUITE_P(Gaps, RetryBudgetIdleGapTest, ::testing::ValuesIn(kIdleGapsMs));

TEST(RetryBudgetTest, TimeGoingBackwardsByTheSkewAddsNothing) {
  // The stamp is 30 s after a wrap, so a clock read a full skew earlier is before the wrap.
  const uint32_t stamp = 30'000;
  std::atomic<uint64_t> w{RetryBudget::Make(0, stamp)};
  EXPECT_FALSE(RetryBudget::TryWithdraw(w, stamp - RetryBudget::kMaxClockSkewMs, kFloor, kBurst));
  EXPECT_FALSE(RetryBudget::TryWithdraw(w, stamp - 1, kFloor, kBurst));
  EXPECT_EQ(RetryBudget::StampMs(w.load()), stamp);  // the stamp never moved back
  // 100 ms after the stamp: exactly one token, the lagging reads credited nothing.
  EXPECT_TRUE(RetryBudget::TryWithdraw(w, stamp + 100, kFloor, kBurst));
  EXPECT_FALSE(RetryBudget::TryWithdraw(w, stamp + 100, kFloor, kBurst));
}

TEST(RetryBudgetTest, BeyondTheSkewOverGrantsAtMostBurstPlusFloorTimesLag) {
  const uint32_t stamp = 5'000'000;
  const uint32_t lag_ms = RetryBudget::kMaxClockSkewMs + 1;
  std::atomic<uint64_t> w{RetryBudget::Make(0, stamp)};
  uint64_t granted = 0;
  // A process stopped between its clock read and its CAS reads the lag as 49.7 days.
  while (RetryBudget::TryWithdraw(w, stamp - lag_ms, kFloor, kBurst)) ++granted;
  while (RetryBudget::TryWithdraw(w, stamp, kFloor, kBurst)) ++granted;
  // From `stamp` on the invariant allows kBurst; the documented excess is burst + floor x lag.
  EXPECT_GT(granted, uint64_t{kBurst});
  EXPECT_LE(granted, kBurst + (kBurst + uint64_t{kFloor} * lag_ms / 1000));
}

// With a daemon sweeping every 5 s, Refresh keeps the stamp young: a gap that reads as time
// going backwards without it (2^32 - 1 ms) refills the whole burst, and the bound holds.
TEST(RetryBudgetTest, RefreshKeepsTheStampYoungAcrossTheWrap) {
  const uint64_t start = 1'000;
  std::atomic<uint64_t> w{RetryBudget::Make(0, uint32_t(start))};
  std::vector<Sample> run{{start, 0}};
  uint64_t refreshes = 0;
  for (uint64_t t = start; t < start + kWrapMs - 1; t += 5'000) {
    refreshes += RetryBudget::Refresh(w, uint32_t(t), kFloor, kBurst) ? 1 : 0;
    const uint32_t age = uint32_t(t) - RetryBudget::StampMs(w.load());
    ASSERT_LT(age, RetryBudget::kStampRefreshMs + 5'000u) << t;
  }
  EXPECT_GT(refreshes, 1000u);  // about once an hour for 49.7 days
  EXPECT_EQ(Drain(w, start + kWrapMs - 1, run), uint64_t{kBurst});
  ExpectBoundOverEveryInterval(run);
}

TEST(RetryBudgetTest, RefreshFoldsTheRefillExactlyAndSkipsYoungOrLaggingStamps) {
  const uint32_t stamp = 7'000;
  std::atomic<uint64_t> w{RetryBudget::Make(0, stamp)};
  // Younger than kStampRefreshMs, or a clock read lagging the stamp: no write.
  EXPECT_FALSE(RetryBudget::Refresh(w, stamp + RetryBudget::kStampRefreshMs - 1, 1, 1'000'000));
  EXPECT_FALSE(RetryBudget::Refresh(w, stamp - 1, 1, 1'000'000));
  EXPECT_EQ(w.load(), RetryBudget::Make(0, stamp));
  // One token per second for an hour and a bit: exactly what a withdrawal would have seen.
  const uint32_t now = stamp + RetryBudget::kStampRefreshMs + 500;
  const uint64_t available = RetryBudget::Available(w.load(), now, 1, 1'000'000);
  EXPECT_TRUE(RetryBudget::Refresh(w, now, 1, 1'000'000));
  EXPECT_EQ(RetryBudget::Tokens(w.load()), available);
  EXPECT_EQ(available, 3'600'500u);
  EXPECT_EQ(RetryBudget::StampMs(w.load()), now);
}

// A first attempt on a full bucket and a denied retry cost no write (retry_budget.h): the
// word is left exactly as it was, its stamp included.
TEST(RetryBudgetTest, AFullBucketAndADeniedRetryWriteNothing) {
  const uint64_t full = RetryBudget::Make(10 * kToken, 5'000);
  std::atomic<uint64_t> w{full};
  RetryBudget::Deposit(w, 200, /*burst=*/10);
  EXPECT_EQ(w.load(), full);
  // Less than a token, and a floor that adds less than one in the time elapsed.
  const uint64_t poor = RetryBudget::Make(400, 5'000);
  w.store(poor);
  EXPECT_FALSE(RetryBudget::TryWithdraw(w, 5'100, /*floor=*/1, /*burst=*/10));
  EXPECT_EQ(w.load(), poor);
}

// Concurrent deposits may push the stored count past the cap by at most one ratio per racing
// process, and every withdrawal applies the cap again (retry_budget.h).
TEST(RetryBudgetTest, RacingDepositsOvershootTheCapByAtMostOneRatioPerRacerAndWithdrawalsCapAgain) {
  constexpr uint32_t kBurst = 10;
  constexpr uint32_t kRatio = 300;
  constexpr int kThreads = 4;
  for (int round = 0; round < 50; ++round) {
    std::atomic<uint64_t> w{RetryBudget::Make(kBurst * kToken - 1, 5'000)};
    std::atomic<bool> go{false};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&] {
        while (!go.load()) std::this_thread::yield();
        for (int i = 0; i < 50; ++i) RetryBudget::Deposit(w, kRatio, kBurst);
      });
    }
    go.store(true);
    for (std::thread& t : threads) t.join();
    ASSERT_LE(RetryBudget::Tokens(w.load()), kBurst * kToken - 1 + kThreads * kRatio);
  }
  // A count stored past the cap is capped before a withdrawal takes its token.
  std::atomic<uint64_t> w{RetryBudget::Make(kBurst * kToken + 3 * kRatio, 5'000)};
  ASSERT_TRUE(RetryBudget::TryWithdraw(w, 5'000, 0, kBurst));
  EXPECT_EQ(RetryBudget::Tokens(w.load()), (kBurst - 1) * kToken);
}

}  // namespace
}  // namespace retryd::shm
