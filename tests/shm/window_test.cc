// The breaker window in virtual time: after any idle gap, across every 16- and 32-bit wrap,
// the window holds exactly the calls recorded in its buckets' periods, never a stale bucket.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <algorithm>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "shm/breaker.h"
#include "shm/clock.h"
#include "shm/policy.h"

namespace retryd::shm {
namespace {

constexpr uint64_t kMsNs = 1'000'000;

struct Shape {
  uint32_t window_ms;
  uint32_t buckets;
  uint64_t bucket_ns() const { return uint64_t{window_ms} * kMsNs / buckets; }
};

struct Call {
  uint64_t t_ns;
  bool failure;
};

// A closed breaker with `shape` that never trips (min_calls is out of reach), and the calls it
// was given: the model the window must match.
class Window {
 public:
  explicit Window(Shape shape, uint64_t closed_at_ns) : shape_(shape) {
    Policy p;
    p.window_ms = shape.window_ms;
    p.window_buckets = shape.buckets;
    p.min_calls = 4'000'000'000u;
    StorePolicy(p, slot_.policy);
    const BreakerWord closed{BreakerState::kClosed, 0, 0, 0, NsToMs32(closed_at_ns)};
    slot_.breaker.store(closed.Encode());
  }
  void Record(uint64_t t_ns, bool failure) {
    uint32_t rng = 1;
    RecordOutcome(slot_, t_ns, failure, false, rng);
    in_order_ = in_order_ && (calls_.empty() || calls_.back().t_ns <= t_ns);
    calls_.push_back({t_ns, failure});
  }
  // The calls whose bucket period is in the window of `now_ns`. Calls recorded in time order
  // are read from the newest back to the first one before the window, so that a test reading
  // after every call of a long run stays linear.
  WindowStats Expected(uint64_t now_ns) const {
    const uint64_t now_period = now_ns / shape_.bucket_ns();
    WindowStats w;
    for (auto c = calls_.rbegin(); c != calls_.rend(); ++c) {
      const uint64_t p = c->t_ns / shape_.bucket_ns();
      if (p > now_period) continue;
      if (now_period - p >= shape_.buckets) {
        if (in_order_) break;
        continue;
      }
      ++w.calls;
      w.failures += c->failure ? 1 : 0;
    }
    return w;
  }
  void ExpectExact(uint64_t now_ns) const {
    const WindowStats got = ReadWindow(slot_, now_ns);
    const WindowStats want = Expected(now_ns);
    EXPECT_EQ(got.calls, want.calls) << "at " << now_ns << " ns";
    EXPECT_EQ(got.failures, want.failures) << "at " << now_ns << " ns";
  }
  DependencySlot& slot() { return slot_; }

 private:
  Shape shape_;
  DependencySlot slot_{};
  std::vector<Call> calls_;
  bool in_order_ = true;
};

class WindowGapTest : public ::testing::TestWithParam<Shape> {};

// Calls across a window, an idle gap, calls again: at every read the window holds exactly the
// calls recorded in its periods.
TEST_P(WindowGapTest, AfterAnyIdleGapTheWindowHoldsOnlyItsOwnCalls) {
  const Shape shape = GetParam();
  const uint64_t b = shape.bucket_ns();
  const uint64_t wrap_ms = uint64_t{1} << 32;
  const std::vector<std::pair<std::string, uint64_t>> gaps = {
      {"1 ms", kMsNs},
      {"1 s", 1'000 * kMsNs},
      {"1 h", 3'600'000 * kMsNs},
      {"18.2 h", 65'536'000 * kMsNs},
      {"24.8 d", wrap_ms / 2 * kMsNs},
      {"37.3 d", 0xC000'0001ull * kMsNs},
      {"49.7 d", 4'294'000'000ull * kMsNs},
      {"2^32 ms - 1", (wrap_ms - 1) * kMsNs},
      {"2^32 ms", wrap_ms * kMsNs},
      {"2^32 ms + 1", (wrap_ms + 1) * kMsNs},
      {"65,536 periods - 1", (65'536 - 1) * b},
      {"65,536 periods", 65'536 * b},
      {"65,536 periods + 1", (65'536 + 1) * b},
      {"65,536 periods + B - 1", (65'536 + shape.buckets - 1) * b},
      {"2 x 65,536 periods", 2 * 65'536 * b},
      {"a year", 31'536'000'000ull * kMsNs},
  };
  for (const auto& [name, gap] : gaps) {
    SCOPED_TRACE(name);
    const uint64_t t0 = 5 * 86'400'000 * kMsNs + 123 * kMsNs;
    Window w(shape, t0);
    // Two calls per bucket period over a whole window, two of every three failing.
    uint64_t t = t0;
    for (uint32_t k = 0; k < 2 * shape.buckets; ++k, t += b / 2) w.Record(t, k % 3 != 0);
    w.ExpectExact(t);
    t += gap;
    w.ExpectExact(t);
    // One failure after the gap, then calls through the next window.
    w.Record(t, true);
    w.ExpectExact(t);
    for (uint32_t k = 0; k < 3 * shape.buckets; ++k) {
      t += b / 3;
      w.Record(t, k % 2 == 0);
      w.ExpectExact(t);
    }
  }
}

// Traffic in every fifth period only: the other buckets are never written again, and must not
// read as current when their 16-bit period numbers come round.
TEST_P(WindowGapTest, BucketsThatSparseTrafficLeavesAloneNeverComeBack) {
  const Shape shape = GetParam();
  const uint64_t b = shape.bucket_ns();
  uint64_t t = 1'000 * b;
  Window w(shape, t);
  for (uint32_t k = 0; k < shape.buckets; ++k, t += b) w.Record(t, true);
  for (uint32_t k = 0; k < 3 * 65'536 / 5; ++k, t += 5 * b) {
    w.Record(t, false);
    w.ExpectExact(t);
    if (::testing::Test::HasFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, WindowGapTest,
                         ::testing::Values(Shape{10'000, 10},  // 1 s buckets
                                           Shape{800, 16},     // 50 ms buckets, 2^16 % 16 == 0
                                           Shape{3'000, 3}),   // 1 s buckets, B odd
                         [](const auto& info) {
                           return std::to_string(info.param.window_ms) + "ms_" +
                                  std::to_string(info.param.buckets);
                         });

// The case as an operator sees it: 19 failures, 65,536 one-second periods of quiet, then one
// failure. The window holds one call, not 20, and the breaker stays closed.
TEST(WindowTest, NineteenFailuresDoNotComeBackAfter65536Periods) {
  DependencySlot slot{};
  Policy p;  // window 10 s in 10 buckets, min_calls 20, failure rate 50 %
  StorePolicy(p, slot.policy);
  const uint64_t t0 = 3'600'000 * kMsNs;
  slot.breaker.store(BreakerWord{BreakerState::kClosed, 0, 0, 0, NsToMs32(t0)}.Encode());
  uint32_t rng = 1;
  for (int i = 0; i < 19; ++i) RecordOutcome(slot, t0 + 100 * kMsNs, true, false, rng);
  const uint64_t later = t0 + 100 * kMsNs + 65'536 * 1'000 * kMsNs;
  RecordOutcome(slot, later, true, false, rng);
  EXPECT_EQ(ReadWindow(slot, later).calls, 1u);
  EXPECT_EQ(BreakerWord::Decode(slot.breaker.load()).state, BreakerState::kClosed);
}

// A clock read that lags: a call within the window counts in its own period; one a window
// behind the newest period is not counted, and does not disturb the window.
TEST(WindowTest, LaggingClockReadsCountInTheirPeriodOrNotAtAll) {
  const Shape shape{10'000, 10};
  const uint64_t b = shape.bucket_ns();
  const uint64_t t = 7'777 * b + b / 2;
  Window w(shape, 0);
  w.Record(t, true);
  w.Record(t - b, true);       // one period back: still in the window
  w.ExpectExact(t);
  EXPECT_EQ(ReadWindow(w.slot(), t).calls, 2u);
  uint32_t rng = 1;
  RecordOutcome(w.slot(), t - 10 * b, true, false, rng);  // a window back: not counted
  w.ExpectExact(t);
}

// A head scribbled far into the future is not trusted: the window reads empty, and the next
// call starts it anew.
TEST(WindowTest, AHeadFarAheadOfTheClockIsIgnored) {
  const Shape shape{10'000, 10};
  const uint64_t t = 12'345 * shape.bucket_ns();
  Window w(shape, 0);
  w.Record(t, true);
  w.slot().window_head.store(WindowHead::Make((t / kMsNs) + 3'600'000, 0xFFFF));
  EXPECT_EQ(ReadWindow(w.slot(), t).calls, 0u);
  w.Record(t + 1, true);
  EXPECT_EQ(ReadWindow(w.slot(), t + 1).calls, 1u);
}

// Threads racing to make the first call of each new bucket period lose at most one call per
// racing thread (breaker.h), however they are scheduled: a first call replaces, with one CAS,
// only the bucket as read before the head, never calls a racer made since.
TEST(WindowRaceTest, FirstCallsOfAPeriodLoseAtMostOneCallPerRacer) {
  constexpr int kThreads = 4;
  constexpr int kCallsPerThread = 200;
  constexpr int kRounds = 200;
  DependencySlot slot{};
  Policy p;
  p.window_ms = 1'000;
  p.window_buckets = 10;
  p.min_calls = 4'000'000'000u;
  StorePolicy(p, slot.policy);
  const uint64_t bucket_ns = 100 * kMsNs;
  const uint64_t t0 = 1'000'000 * bucket_ns;
  slot.breaker.store(BreakerWord{BreakerState::kClosed, 0, 0, 0, NsToMs32(t0)}.Encode());
  std::atomic<int> round{-1}, done{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      uint32_t rng = 1;
      for (int r = 0; r < kRounds; ++r) {
        while (round.load() < r) std::this_thread::yield();
        const uint64_t now = t0 + uint64_t(r) * bucket_ns + bucket_ns / 2;
        for (int i = 0; i < kCallsPerThread; ++i) RecordOutcome(slot, now, i % 2 == 0, false, rng);
        done.fetch_add(1);
      }
    });
  }
  int worst = 0;
  for (int r = 0; r < kRounds; ++r) {
    round.store(r);
    while (done.load() < (r + 1) * kThreads) std::this_thread::yield();
    const uint64_t period = (t0 + uint64_t(r) * bucket_ns) / bucket_ns;
    const uint64_t w = slot.buckets[period % 10].load();
    ASSERT_EQ(Bucket::Period(w), Bucket::PeriodOf(period)) << "round " << r;
    const int lost = kThreads * kCallsPerThread - int(Bucket::Calls(w));
    worst = std::max(worst, lost);
    ASSERT_GE(lost, 0) << "round " << r;
    ASSERT_LE(lost, kThreads - 1) << "round " << r;
  }
  for (auto& t : threads) t.join();
  RecordProperty("worst_lost", worst);
}

// Approximation (breaker.h): a bucket counts at most 65,535 calls; beyond, its rates are those
// of its first 65,535 calls, and no count wraps into the next field.
// Past 65,535 calls a bucket doubles its unit: its fields never wrap into each other, its
// counts stay those of every call to within a unit, and so do its rates (breaker.h, Bucket::Add).
TEST(WindowTest, ABucketPast65535CallsKeepsItsCountsAndRatesAndNeverWraps) {
  const Shape shape{10'000, 10};
  const uint64_t t = 12'345 * shape.bucket_ns();
  Window w(shape, 0);
  DependencySlot& slot = w.slot();
  uint32_t rng = 1;
  for (int i = 0; i < 70'000; ++i) RecordOutcome(slot, t, /*failure=*/i % 2 == 0, false, rng);
  const WindowStats stats = ReadWindow(slot, t);
  EXPECT_NEAR(double(stats.calls), 70'000, 70'000 * 0.01);
  EXPECT_NEAR(double(stats.failures) / double(stats.calls), 0.5, 0.01);
  EXPECT_EQ(stats.slow, 0u);
  for (int i = 0; i < 1'000'000; ++i) RecordOutcome(slot, t, /*failure=*/true, false, rng);
  const WindowStats more = ReadWindow(slot, t);
  EXPECT_NEAR(double(more.calls), 1'070'000, 1'070'000 * 0.01);
  EXPECT_NEAR(double(more.failures) / double(more.calls), 1'035'000.0 / 1'070'000, 0.01);
  EXPECT_LE(more.failures, more.calls);
  EXPECT_EQ(Bucket::Period(slot.buckets[12'345 % 10].load()), Bucket::PeriodOf(12'345));
  // A lump larger than a bucket: 16.7 M successes on 40,000 failures.
  const uint64_t word = Bucket::Add(Bucket::Make(7, 40'000, 40'000, 0), 16'777'215, 0, 0, 12345);
  EXPECT_EQ(Bucket::Period(word), 7u);
  EXPECT_EQ(Bucket::Scale(word), 9u);
  EXPECT_NEAR(double(Bucket::Calls(word)), 16'817'215, 16'817'215 * 0.001);
  EXPECT_NEAR(double(Bucket::Failures(word)) / double(Bucket::Calls(word)), 40'000.0 / 16'817'215,
              0.0001);
  // The largest count a bucket keeps: 65,535 units of 2^15 calls, and no wrap past it.
  const uint64_t full = Bucket::Add(Bucket::Make(3, 0, 0, 0), uint64_t{1} << 40, 1, 1, 0);
  EXPECT_EQ(Bucket::Calls(full), Bucket::kMax << Bucket::kMaxScale);
  EXPECT_EQ(Bucket::Period(full), 3u);
  // A scribbled word with more failures than calls adds no more failures than calls.
  const uint64_t scribbled =
      Bucket::Add(Bucket::Make(1, 3, Bucket::kMax, Bucket::kMax), 1, 1, 1, 0);
  EXPECT_EQ(Bucket::Calls(scribbled), 4u);
  EXPECT_EQ(Bucket::Failures(scribbled), 4u);
  EXPECT_EQ(Bucket::Slow(scribbled), 4u);
}

// Past the largest unit (2^15 calls: 2.1 billion calls in one bucket) the bucket keeps its rate:
// its fields are halved in that unit, not pinned while failures still count. A healthy period
// (4 % failures) fed as the slot feeds it, the failures as they come and the successes in a full
// stripe's lumps, reads 4 % up to 4 billion calls, never the 5 % that would trip it.
TEST(WindowTest, ABucketPastTwoBillionCallsKeepsItsRate) {
  uint64_t w = Bucket::Make(7, 0, 0, 0);
  uint32_t rng = 12345;
  const uint64_t lump = StripeWindow::kStripeWindowMax;
  uint64_t calls = 0, waiting = 0;
  double worst = 0;
  while (calls < 4'000'000'000ull) {
    // 25,000 calls: 1,000 failures, 24,000 successes waiting for a lump.
    w = Bucket::Add(w, 1'000, 1'000, 0, NextRandom(rng));
    calls += 25'000;
    waiting += 24'000;
    if (waiting >= lump) {
      waiting -= lump;
      w = Bucket::Add(w, lump, 0, 0, NextRandom(rng));
      const double rate = double(Bucket::Failures(w)) / double(Bucket::Calls(w));
      worst = std::max(worst, std::abs(rate - 0.04));
    }
  }
  EXPECT_EQ(Bucket::Scale(w), Bucket::kMaxScale);
  EXPECT_LT(worst, 0.002) << "the rate drifted from 4 % by " << worst * 100 << " points";
  EXPECT_EQ(Bucket::Period(w), 7u);
}

}  // namespace
}  // namespace retryd::shm
