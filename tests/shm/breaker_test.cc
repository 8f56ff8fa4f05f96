// Tests of the breaker's state machine as a pure function (NextBreakerWord): one test per row
// of the table in shm/breaker.h, and the rows that must not apply.
#include "shm/breaker.h"

#include <gtest/gtest.h>

#include "shm/policy.h"
#include "shm/segment.h"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

namespace retryd::shm {
namespace {

constexpr uint32_t kNow = 1'000'000;

class BreakerTableTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Policy p;
    p.open_for_ms = 1'000;
    p.open_for_max_ms = 8'000;
    p.open_jitter_ms = 0;
    p.close_after = 2;
    StorePolicy(p, policy_);
  }
  static uint64_t Word(BreakerState s, uint32_t reopens, uint32_t successes, uint16_t seq,
                       uint32_t time_ms) {
    return BreakerWord{s, reopens, successes, seq, time_ms}.Encode();
  }
  std::optional<BreakerWord> Next(uint64_t word, BreakerEvent e, uint16_t seq = 0) {
    const std::optional<uint64_t> next = NextBreakerWord(policy_, word, e, kNow, seq, 0);
    if (!next) return std::nullopt;
    return BreakerWord::Decode(*next);
  }
  PolicyWords policy_;
};

TEST_F(BreakerTableTest, ClosedTripsToOpenForOpenFor) {
  const auto b = Next(Word(BreakerState::kClosed, 0, 0, 5, 0), BreakerEvent::kTrip);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->state, BreakerState::kOpen);
  EXPECT_EQ(b->reopens, 0u);
  EXPECT_EQ(b->seq, 6);
  EXPECT_EQ(b->time_ms, kNow + 1'000);
}

// The table takes kOpenPeriodOver as a fact; whether the period is over is OpenPeriodOver's to
// say (tests/shm/time_travel_test.cc drives it across every wrap).
TEST_F(BreakerTableTest, OpenGoesHalfOpenOnceItsPeriodIsOver) {
  const auto b = Next(Word(BreakerState::kOpen, 2, 0, 5, kNow), BreakerEvent::kOpenPeriodOver);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->state, BreakerState::kHalfOpen);
  EXPECT_EQ(b->reopens, 2u);
  EXPECT_EQ(b->successes, 0u);
  EXPECT_EQ(b->seq, 6);
  EXPECT_EQ(b->time_ms, kNow);
}

TEST_F(BreakerTableTest, ProbeSuccessCountsUnderTheSameSeqThenCloses) {
  const auto one =
      Next(Word(BreakerState::kHalfOpen, 1, 0, 9, kNow), BreakerEvent::kProbeSucceeded, 9);
  ASSERT_TRUE(one);
  EXPECT_EQ(one->state, BreakerState::kHalfOpen);
  EXPECT_EQ(one->successes, 1u);
  EXPECT_EQ(one->seq, 9) << "a counted success is not a transition";
  const auto two = Next(one->Encode(), BreakerEvent::kProbeSucceeded, 9);
  ASSERT_TRUE(two);
  EXPECT_EQ(two->state, BreakerState::kClosed);
  EXPECT_EQ(two->reopens, 0u);
  EXPECT_EQ(two->seq, 10);
  EXPECT_EQ(two->time_ms, kNow);
}

TEST_F(BreakerTableTest, ProbeFailureReopensOneStepLonger) {
  const auto b = Next(Word(BreakerState::kHalfOpen, 1, 1, 9, kNow), BreakerEvent::kProbeFailed, 9);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->state, BreakerState::kOpen);
  EXPECT_EQ(b->reopens, 2u);
  EXPECT_EQ(b->time_ms, kNow + 4'000);  // open_for x 2^2
  const auto capped =
      Next(Word(BreakerState::kHalfOpen, 62, 0, 9, kNow), BreakerEvent::kProbeExpired, 9);
  ASSERT_TRUE(capped);
  EXPECT_EQ(capped->reopens, 63u);
  EXPECT_EQ(capped->time_ms, kNow + 8'000);  // open_for_max
}

TEST_F(BreakerTableTest, AProbeOfAnotherHalfOpenChangesNothing) {
  const uint64_t w = Word(BreakerState::kHalfOpen, 0, 0, 9, kNow);
  EXPECT_FALSE(Next(w, BreakerEvent::kProbeSucceeded, 8));
  EXPECT_FALSE(Next(w, BreakerEvent::kProbeFailed, 8));
  EXPECT_FALSE(Next(w, BreakerEvent::kProbeExpired, 8));
}

TEST_F(BreakerTableTest, EventsOfOtherStatesDoNotApply) {
  const uint64_t closed = Word(BreakerState::kClosed, 0, 0, 3, 0);
  const uint64_t open = Word(BreakerState::kOpen, 0, 0, 3, kNow - 1);
  const uint64_t half = Word(BreakerState::kHalfOpen, 0, 0, 3, kNow);
  EXPECT_FALSE(Next(open, BreakerEvent::kTrip));
  EXPECT_FALSE(Next(half, BreakerEvent::kTrip));
  EXPECT_FALSE(Next(closed, BreakerEvent::kOpenPeriodOver));
  EXPECT_FALSE(Next(half, BreakerEvent::kOpenPeriodOver));
  for (const uint64_t w : {closed, open}) {
    EXPECT_FALSE(Next(w, BreakerEvent::kProbeSucceeded, 3));
    EXPECT_FALSE(Next(w, BreakerEvent::kProbeFailed, 3));
    EXPECT_FALSE(Next(w, BreakerEvent::kProbeExpired));
  }
}

TEST_F(BreakerTableTest, ResetClosesFromEveryState) {
  for (const BreakerState s :
       {BreakerState::kClosed, BreakerState::kOpen, BreakerState::kHalfOpen}) {
    const auto b = Next(Word(s, 5, 1, 3, 0), BreakerEvent::kReset);
    ASSERT_TRUE(b);
    EXPECT_EQ(b->state, BreakerState::kClosed);
    EXPECT_EQ(b->reopens, 0u);
    EXPECT_EQ(b->seq, 4);
  }
}

// The fleet's two rows apply to an open breaker only: the fleet's probe succeeding closes it,
// failing reopens it with the backed-off period, as its own probe would.
TEST_F(BreakerTableTest, TheFleetClosesOrReopensAnOpenBreakerOnly) {
  const auto closed = Next(Word(BreakerState::kOpen, 3, 0, 7, kNow + 500), BreakerEvent::kFleetClosed);
  ASSERT_TRUE(closed);
  EXPECT_EQ(closed->state, BreakerState::kClosed);
  EXPECT_EQ(closed->reopens, 0u);
  EXPECT_EQ(closed->seq, 8);
  EXPECT_EQ(closed->time_ms, kNow);
  const auto reopened =
      Next(Word(BreakerState::kOpen, 2, 0, 7, kNow), BreakerEvent::kFleetReopened);
  ASSERT_TRUE(reopened);
  EXPECT_EQ(reopened->state, BreakerState::kOpen);
  EXPECT_EQ(reopened->reopens, 3u);
  EXPECT_EQ(reopened->seq, 8);
  EXPECT_EQ(reopened->time_ms, kNow + 8'000);  // 1 s x 2^3, at open_for_max
  for (const BreakerState s : {BreakerState::kClosed, BreakerState::kHalfOpen}) {
    EXPECT_FALSE(Next(Word(s, 1, 0, 7, kNow), BreakerEvent::kFleetClosed));
    EXPECT_FALSE(Next(Word(s, 1, 0, 7, kNow), BreakerEvent::kFleetReopened));
  }
}

// SetOpenUntil moves the end of one open period and nothing else: not another seq's, not a
// half-open's, and the full time reads back right.
TEST(BreakerHoldTest, SetOpenUntilMovesOnlyThatOpenPeriodsEnd) {
  Policy p;
  std::unique_ptr<Segment> seg = Segment::CreatePrivate(1, 1, p);
  DependencySlot& slot = *seg->dependency(0);
  StorePolicy(p, slot.policy);
  const uint64_t now_ns = uint64_t{kNow} * 1'000'000u;
  uint32_t rng = 1;
  ASSERT_TRUE(ApplyBreakerEvent(slot, BreakerEvent::kTrip, now_ns, 0, rng));
  const BreakerWord open = BreakerWord::Decode(slot.breaker.load());
  const uint64_t opened = slot.counters[kOpened].load();
  EXPECT_FALSE(SetOpenUntil(slot, uint16_t(open.seq + 1), kNow + 60'000, now_ns));
  ASSERT_TRUE(SetOpenUntil(slot, open.seq, kNow + 60'000, now_ns));
  const BreakerWord held = BreakerWord::Decode(slot.breaker.load());
  EXPECT_EQ(held.state, BreakerState::kOpen);
  EXPECT_EQ(held.seq, open.seq);
  EXPECT_EQ(held.reopens, open.reopens);
  EXPECT_EQ(FullTimeMs(slot, held), uint64_t{kNow} + 60'000);
  EXPECT_FALSE(OpenPeriodOver(slot, held, now_ns + 59'999'000'000ull));
  EXPECT_TRUE(OpenPeriodOver(slot, held, now_ns + 60'000'000'000ull));
  EXPECT_EQ(slot.counters[kOpened].load(), opened);  // not a transition
  // Back to the past: the next admit takes it half-open.
  ASSERT_TRUE(SetOpenUntil(slot, open.seq, kNow - 1, now_ns));
  EXPECT_TRUE(ApplyBreakerEvent(slot, BreakerEvent::kOpenPeriodOver, now_ns, 0, rng));
  EXPECT_FALSE(SetOpenUntil(slot, open.seq, kNow + 60'000, now_ns));  // half-open now
}

// ApplyBreakerEvent counts each transition once, and closing restarts the window.
TEST_F(BreakerTableTest, ApplyCountsTransitionsAndRestartsTheWindowOnClose) {
  DependencySlot slot{};
  Policy p;
  p.close_after = 1;
  StorePolicy(p, slot.policy);
  const uint64_t now_ns = uint64_t{kNow} * 1'000'000;
  slot.breaker.store(Word(BreakerState::kHalfOpen, 0, 0, 4, kNow));
  const uint64_t bucket_ns = uint64_t{p.window_ms} * 1'000'000 / p.window_buckets;
  const uint64_t period = now_ns / bucket_ns;
  slot.buckets[period % p.window_buckets].store(Bucket::Make(period, 30, 30, 0));
  uint32_t rng = 7;
  EXPECT_FALSE(ApplyBreakerEvent(slot, BreakerEvent::kProbeSucceeded, now_ns, 3, rng));
  EXPECT_TRUE(ApplyBreakerEvent(slot, BreakerEvent::kProbeSucceeded, now_ns, 4, rng));
  EXPECT_EQ(rng, 7u) << "a close draws no jitter";
  EXPECT_EQ(BreakerWord::Decode(slot.breaker.load()).state, BreakerState::kClosed);
  EXPECT_EQ(ReadCounter(slot, kClosed), 1u);
  EXPECT_EQ(ReadWindow(slot, now_ns).calls, 0u);
}

// Invariant (breaker.h): every transition is one CAS from the word the deciding process read.
// Threads released together apply the same event to one half-open breaker: the first CAS
// commits it, and every other thread finds the word changed, reads it again, and finds that
// the event no longer applies. So each round makes exactly one transition, counted once. (A
// commit that is not a CAS fails this only in rounds where the threads overlap: on a loaded
// machine, not in every run.)
TEST(BreakerConcurrencyTest, EveryTransitionIsOneCasFromTheWordTheDeciderRead) {
  Policy p;
  p.open_for_ms = 1'000;
  p.open_jitter_ms = 0;
  std::unique_ptr<Segment> seg = Segment::CreatePrivate(1, 1, p);
  DependencySlot& slot = *seg->dependency(0);
  StorePolicy(p, slot.policy);
  constexpr int kThreads = 2;  // one per core of a small machine: they run at once
  constexpr int kRounds = 500;
  const uint64_t now_ns = uint64_t{kNow} * 1'000'000u;
  std::atomic<int> ready{0};
  std::atomic<int> round_go{-1};
  std::atomic<int> done{0};
  std::atomic<int> wins[kRounds] = {};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      uint32_t rng = 1 + uint32_t(t);
      for (int r = 0; r < kRounds; ++r) {
        ready.fetch_add(1);
        while (round_go.load() < r) {
        }
        // Every thread decides from the same half-open word (seq r).
        if (ApplyBreakerEvent(slot, BreakerEvent::kProbeFailed, now_ns, uint16_t(r), rng)) {
          wins[r].fetch_add(1);
        }
        done.fetch_add(1);
      }
    });
  }
  for (int r = 0; r < kRounds; ++r) {
    slot.breaker.store(BreakerWord{BreakerState::kHalfOpen, 0, 0, uint16_t(r), kNow}.Encode());
    while (ready.load() < kThreads * (r + 1)) std::this_thread::yield();
    round_go.store(r);
    while (done.load() < kThreads * (r + 1)) std::this_thread::yield();
    const BreakerWord after = BreakerWord::Decode(slot.breaker.load());
    ASSERT_EQ(after.state, BreakerState::kOpen) << "round " << r;
    ASSERT_EQ(after.seq, uint16_t(r + 1)) << "round " << r << ": one transition, one seq step";
    ASSERT_EQ(after.reopens, 1u) << "round " << r;
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < kRounds; ++r) EXPECT_EQ(wins[r].load(), 1) << "round " << r;
  EXPECT_EQ(slot.counters[kOpened].load(), uint64_t{kRounds});
}

// ApplyBreakerEvent draws the open period's jitter from the caller's state only for an event
// that opens the breaker.
TEST(BreakerConcurrencyTest, ApplyDrawsRandomnessOnlyForAnEventThatOpens) {
  Policy p;
  std::unique_ptr<Segment> seg = Segment::CreatePrivate(1, 1, p);
  DependencySlot& slot = *seg->dependency(0);
  StorePolicy(p, slot.policy);
  const uint64_t now_ns = uint64_t{kNow} * 1'000'000u;
  uint32_t rng = 777;
  slot.breaker.store(BreakerWord{BreakerState::kHalfOpen, 0, 0, 5, kNow}.Encode());
  ASSERT_TRUE(ApplyBreakerEvent(slot, BreakerEvent::kProbeSucceeded, now_ns, 5, rng));
  EXPECT_EQ(rng, 777u);
  ASSERT_TRUE(ApplyBreakerEvent(slot, BreakerEvent::kReset, now_ns, 0, rng));
  EXPECT_EQ(rng, 777u);
  ASSERT_TRUE(ApplyBreakerEvent(slot, BreakerEvent::kTrip, now_ns, 0, rng));
  EXPECT_NE(rng, 777u);
}

}  // namespace
}  // namespace retryd::shm
