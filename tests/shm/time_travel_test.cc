// The time-travel harness: every time-dependent algorithm of shm/ driven in virtual time across
// every wrap of the stamps it keeps, from each start offset of time_travel.h and after each idle
// gap, asserting at each the invariant its header states:
//   - retry budget: the floor refills min(burst, floor x gap) after the gap (the gap modulo
//     2^32 ms without a daemon, nothing within the skew below the wrap), grants stay within
//     burst + ratio x first attempts + floor x seconds over every interval, and with a daemon's
//     Refresh the stamp stays young and the refill is whole;
//   - breaker window: after the gap it holds exactly the calls of its own periods, and the
//     breaker trips at exactly min_calls and the failure-rate threshold, wherever its last close
//     lies;
//   - open period: an open breaker rejects until exactly its deadline and half-opens at it, and
//     one untouched for longer than its period half-opens at the next admit;
//   - probe and bulkhead leases: held until exactly their timeout, expired from then on, and
//     expired after any longer silence;
//   - breaker seq: a probe out while the 16-bit seq wraps can neither close nor reopen a later
//     half-open;
//   - the create lock's stamp: fresh is held, old is stale, at every age modulo 2^32 ms;
//   - the status view: an open breaker's time to half-open agrees with admission, and the
//     daemon's heartbeat ages by the gap.
// The registry stamps nothing in 32 bits (pids, start times in clock ticks, attach times in
// 64-bit wall ms, shown only), so it has no wrap to cross.
#include "tests/shm/time_travel.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "shm/admission.h"
#include "shm/breaker.h"
#include "shm/clock.h"
#include "shm/dependency_table.h"
#include "shm/leases.h"
#include "shm/policy.h"
#include "shm/retry_budget.h"
#include "shm/segment.h"
#include "shm/view.h"

namespace retryd::testing {
namespace {

using shm::BreakerState;
using shm::Decision;
using shm::Outcome;
using shm::Permit;
using shm::RetryBudget;
using ::testing::Combine;
using ::testing::ValuesIn;

std::string Describe(const Offset& start, const Gap& gap) {
  return std::string("start ") + start.name + " (" + std::to_string(start.ms) + " ms), gap " +
         gap.name;
}

// ----------------------------------------------------------------------------------------
// Retry budget (retry_budget.h).

constexpr uint32_t kFloor = 10;  // tokens per second
constexpr uint32_t kBurst = 20;
constexpr uint32_t kRatioMilli = 200;

// A budget run: virtual time in ms (not wrapped; uint32_t(t) is what the algorithm sees) and
// what was granted and deposited so far.
class BudgetRun {
 public:
  explicit BudgetRun(uint64_t start_ms)
      : word_(RetryBudget::Make(0, uint32_t(start_ms))), samples_{{start_ms, 0, 0}} {}

  // Step deposits `first_attempts` at `t_ms`, then takes every token the budget grants.
  uint64_t Step(uint64_t t_ms, uint32_t first_attempts = 0) {
    for (uint32_t i = 0; i < first_attempts; ++i) RetryBudget::Deposit(word_, kRatioMilli, kBurst);
    uint64_t n = 0;
    while (n < 10 * kBurst && RetryBudget::TryWithdraw(word_, uint32_t(t_ms), kFloor, kBurst)) ++n;
    const Sample& last = samples_.back();
    samples_.push_back({t_ms, last.granted + n, last.first_attempts + first_attempts});
    return n;
  }
  bool Refresh(uint64_t t_ms) {
    return RetryBudget::Refresh(word_, uint32_t(t_ms), kFloor, kBurst);
  }
  std::atomic<uint64_t>& word() { return word_; }

  // ExpectBoundOverEveryInterval: for every pair of samples, retries granted in (t_i, t_j] <=
  // burst + ratio x first attempts deposited in (t_i, t_j] + floor x seconds.
  void ExpectBoundOverEveryInterval() const {
    for (size_t i = 0; i < samples_.size(); ++i) {
      for (size_t j = i + 1; j < samples_.size(); ++j) {
        const Sample &a = samples_[i], &b = samples_[j];
        const uint64_t allowed_milli = uint64_t{kBurst} * 1000 +
                                       kRatioMilli * (b.first_attempts - a.first_attempts) +
                                       kFloor * (b.t_ms - a.t_ms);
        ASSERT_LE((b.granted - a.granted) * 1000, allowed_milli)
            << "between " << a.t_ms << " and " << b.t_ms << " ms";
      }
    }
  }

 private:
  struct Sample {
    uint64_t t_ms;
    uint64_t granted;
    uint64_t first_attempts;
  };
  std::atomic<uint64_t> word_;
  std::vector<Sample> samples_;
};

class RetryBudgetTimeTravelTest : public ::testing::TestWithParam<Gap> {};

// An outage with first attempts and retries, an idle gap with no daemon, a second outage: the
// refill after the gap is the documented one, the floor then grants at its full rate, and the
// bound holds over every interval of the run.
TEST_P(RetryBudgetTimeTravelTest, TheFloorRefillsAfterTheGapAndGrantsStayWithinTheBound) {
  const Gap& gap = GetParam();
  for (const Offset& start : StartOffsets()) {
    BudgetRun run(start.ms);
    uint64_t t = start.ms;
    for (int i = 0; i < 50; ++i) run.Step(t += 100, /*first_attempts=*/i % 3);
    t += gap.ms;
    const uint64_t seen = gap.ms % kWrapMs;
    const bool reads_backwards = seen >= kWrapMs - RetryBudget::kMaxClockSkewMs;
    const uint64_t left = RetryBudget::Tokens(run.word().load());
    const uint64_t refill = reads_backwards ? 0 : uint64_t{kFloor} * seen;
    const uint64_t expected =
        std::min<uint64_t>(kBurst, (left + refill) / RetryBudget::kTokenScale);
    EXPECT_EQ(run.Step(t), expected) << Describe(start, gap);
    // A gap read as backwards stops the floor until the wrap has passed, then it runs in full.
    const uint64_t stalled_ms = reads_backwards ? kWrapMs - seen : 0;
    uint64_t after = 0;
    for (int i = 0; i < 100; ++i) after += run.Step(t += 100);
    for (int i = 0; i < 60; ++i) after += run.Step(t += 1'000);
    const uint64_t floor_ms = 70'000 - std::min<uint64_t>(stalled_ms, 70'000);
    EXPECT_GE(after + 1, kFloor * floor_ms / 1000) << Describe(start, gap);
    run.ExpectBoundOverEveryInterval();
  }
}

// With a daemon sweeping every ten minutes, Refresh keeps the stamp younger than
// kStampRefreshMs plus a sweep, never changes what a withdrawal would see, and after any gap
// the refill is exactly min(burst, floor x gap).
TEST_P(RetryBudgetTimeTravelTest, WithADaemonsRefreshTheRefillAfterAnyGapIsWhole) {
  const Gap& gap = GetParam();
  for (const Offset& start : StartOffsets()) {
    constexpr uint64_t kSweepMs = 600'000;
    BudgetRun run(start.ms);
    const uint64_t end = start.ms + gap.ms;
    for (uint64_t t = start.ms + kSweepMs; t < end; t += kSweepMs) {
      const uint64_t before =
          RetryBudget::Available(run.word().load(), uint32_t(t), kFloor, kBurst);
      run.Refresh(t);
      ASSERT_EQ(RetryBudget::Available(run.word().load(), uint32_t(t), kFloor, kBurst), before)
          << Describe(start, gap) << " at " << t << " ms";
      const uint32_t age = uint32_t(t) - RetryBudget::StampMs(run.word().load());
      ASSERT_LT(age, RetryBudget::kStampRefreshMs + kSweepMs)
          << Describe(start, gap) << " at " << t << " ms";
    }
    const uint64_t expected = std::min<uint64_t>(kBurst, kFloor * gap.ms / 1000);
    EXPECT_EQ(run.Step(end), expected) << Describe(start, gap);
    run.ExpectBoundOverEveryInterval();
  }
}

// The budget's own boundary: the edge of the skew window below the wrap.
std::vector<Gap> BudgetGaps() {
  return Concat(
      IdleGaps(),
      std::vector<Gap>{{"2p32msMinusSkewMinus1", kWrapMs - RetryBudget::kMaxClockSkewMs - 1},
                       {"2p32msMinusSkew", kWrapMs - RetryBudget::kMaxClockSkewMs}});
}

INSTANTIATE_TEST_SUITE_P(Wraps, RetryBudgetTimeTravelTest, ValuesIn(BudgetGaps()),
                         [](const auto& info) { return GapName(info); });

// ----------------------------------------------------------------------------------------
// Breaker window (breaker.h).

struct Call {
  uint64_t t_ns;
  bool failure;
};

// WindowModel is a closed breaker with `shape` that never trips, and the calls it was given:
// the window must hold exactly the calls whose bucket period is among its last B periods.
class WindowModel {
 public:
  WindowModel(WindowShape shape, uint64_t closed_at_ns) : shape_(shape) {
    shm::Policy p;
    p.window_ms = shape.window_ms;
    p.window_buckets = shape.buckets;
    p.min_calls = 4'000'000'000u;
    slot_ = std::make_unique<VirtualSlot>(p, closed_at_ns);
  }
  void Record(uint64_t t_ns, bool failure) {
    shm::RecordOutcome(slot_->slot(), t_ns, failure, false, slot_->caller().rng);
    calls_.push_back({t_ns, failure});
  }
  // Exact: the window at `now_ns` holds exactly the calls of its periods.
  ::testing::AssertionResult Exact(uint64_t now_ns) const {
    const uint64_t now_period = now_ns / shape_.bucket_ns();
    shm::WindowStats want;
    for (const Call& c : calls_) {
      const uint64_t p = c.t_ns / shape_.bucket_ns();
      if (p > now_period || now_period - p >= shape_.buckets) continue;
      ++want.calls;
      want.failures += c.failure ? 1 : 0;
    }
    const shm::WindowStats got = shm::ReadWindow(slot_->slot(), now_ns);
    if (got.calls == want.calls && got.failures == want.failures) {
      return ::testing::AssertionSuccess();
    }
    return ::testing::AssertionFailure()
           << "at " << now_ns << " ns the window holds " << got.calls << " calls, " << got.failures
           << " failures; its periods hold " << want.calls << " calls, " << want.failures
           << " failures";
  }

 private:
  WindowShape shape_;
  std::unique_ptr<VirtualSlot> slot_;
  std::vector<Call> calls_;
};

std::string ShapeName(const WindowShape& s) {
  return "window " + std::to_string(s.window_ms) + " ms in " + std::to_string(s.buckets) +
         " buckets";
}

// The window's own boundaries, besides the period wraps: 2^32 ms after the breaker's last close
// falling inside the window read after the gap (the close is stamped in 32-bit ms).
std::vector<Gap> WindowGaps() {
  return Concat(IdleGaps(), PeriodGaps(),
                std::vector<Gap>{{"2p32msSinceTheCloseMidWindow", kWrapMs, 0, -3}});
}

class WindowTimeTravelTest : public ::testing::TestWithParam<Gap> {};

// The breaker closes at `start`; calls over a window, the idle gap, then calls through the next
// window and a half: at every read the window holds exactly its own periods' calls.
void CheckWindowAcrossGap(const Offset& start, const Gap& gap, const WindowShape& shape) {
  const uint64_t b = shape.bucket_ns();
  const uint64_t t0 = start.ms * kMsNs;
  WindowModel w(shape, t0);
  uint64_t t = t0;
  for (uint32_t k = 0; k < 2 * shape.buckets; ++k, t += b / 2) w.Record(t, k % 3 != 0);
  ASSERT_TRUE(w.Exact(t)) << "before the gap";
  t += gap.Ns(shape);
  ASSERT_TRUE(w.Exact(t)) << "after the gap";
  w.Record(t, true);
  ASSERT_TRUE(w.Exact(t)) << "after the gap";
  for (uint32_t k = 0; k < 3 * shape.buckets; ++k) {
    t += b / 2;
    w.Record(t, k % 2 == 0);
    ASSERT_TRUE(w.Exact(t)) << "after the gap";
  }
}

TEST_P(WindowTimeTravelTest, AfterAnyIdleGapTheWindowHoldsOnlyItsOwnCalls) {
  const Gap& gap = GetParam();
  for (const Offset& start : StartOffsets()) {
    for (const WindowShape& shape : WindowShapes()) {
      SCOPED_TRACE(Describe(start, gap) + ", " + ShapeName(shape));
      CheckWindowAcrossGap(start, gap, shape);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Wraps, WindowTimeTravelTest, ValuesIn(WindowGaps()),
                         [](const auto& info) { return GapName(info); });

class TripTimeTravelTest : public ::testing::TestWithParam<Gap> {};

// The breaker closes at `start` and stays idle for the gap; then one window of calls. With
// min_calls 20 and a 50 % threshold: 10 successes and 9 failures keep it closed, and the 20th
// call (a failure: 50 %) trips it. In a second breaker, 21 calls whose 10 failures are never
// 50 % once there are 20 calls (47.6 % at the last) never trip it.
void CheckTripThresholds(const Offset& start, const Gap& gap, const WindowShape& shape) {
  shm::Policy p;
  p.window_ms = shape.window_ms;
  p.window_buckets = shape.buckets;
  p.min_calls = 20;
  p.failure_rate_pct = 50;
  p.open_jitter_ms = 0;
  const uint64_t b = shape.bucket_ns();
  const uint64_t closed_at = start.ms * kMsNs;
  // The calls start at a bucket edge and all fall in one window: 21 calls, W/24 apart.
  const uint64_t first = (closed_at + gap.Ns(shape) + b - 1) / b * b;
  const uint64_t step = shape.window_ns() / 24;

  VirtualSlot trips(p, closed_at);
  uint64_t t = first;
  for (int k = 0; k < 19; ++k, t += step) {
    trips.Call(t, k % 2 == 0 ? Outcome::kSuccess : Outcome::kFailure);
  }
  EXPECT_EQ(shm::ReadWindow(trips.slot(), t - step).calls, 19u);
  EXPECT_EQ(trips.State(), BreakerState::kClosed) << "after 19 calls";
  trips.Call(t, Outcome::kFailure);
  EXPECT_EQ(trips.State(), BreakerState::kOpen) << "after 20 calls, 50 % failures";

  VirtualSlot below(p, closed_at);
  t = first;
  for (int k = 0; k < 21; ++k, t += step) {
    below.Call(t, k % 2 == 0 || k == 19 ? Outcome::kSuccess : Outcome::kFailure);
  }
  EXPECT_EQ(shm::ReadWindow(below.slot(), t - step).calls, 21u);
  EXPECT_EQ(below.State(), BreakerState::kClosed) << "after 21 calls, 47.6 % failures";
}

// Whatever the offset, the gap, and where the last close falls modulo 2^32 ms.
TEST_P(TripTimeTravelTest, TheBreakerTripsExactlyAtMinCallsAndTheRateThreshold) {
  const Gap& gap = GetParam();
  for (const Offset& start : StartOffsets()) {
    for (const WindowShape& shape : WindowShapes()) {
      SCOPED_TRACE(Describe(start, gap) + ", " + ShapeName(shape));
      CheckTripThresholds(start, gap, shape);
    }
  }
}

// The trip's own boundary: the window straddling 2^32 ms after the close.
std::vector<Gap> TripGaps() {
  return Concat(IdleGaps(), PeriodGaps(),
                std::vector<Gap>{{"2p32msSinceTheCloseMidWindow", kWrapMs, 0, -1}});
}

INSTANTIATE_TEST_SUITE_P(Wraps, TripTimeTravelTest, ValuesIn(TripGaps()),
                         [](const auto& info) { return GapName(info); });

// ----------------------------------------------------------------------------------------
// Open period (breaker.h, clock.h DeadlinePassed).

struct OpenShape {
  const char* name;
  uint32_t open_for_ms;
  uint32_t open_for_max_ms;
  uint32_t open_jitter_ms;
};
const std::vector<OpenShape>& OpenShapes() {
  static const std::vector<OpenShape> shapes = {
      {"1ms", 1, 1, 0},
      {"1sDoublingTo8s", 1'000, 8'000, 0},
      {"1sWithJitter500ms", 1'000, 30'000, 500},
      {"1DayPlus1DayOfJitter", 86'400'000, 86'400'000, 86'400'000},  // the longest possible
  };
  return shapes;
}

shm::Policy OpenPolicy(const OpenShape& s) {
  shm::Policy p;
  p.min_calls = 1;  // one failure trips
  p.open_for_ms = s.open_for_ms;
  p.open_for_max_ms = s.open_for_max_ms;
  p.open_jitter_ms = s.open_jitter_ms;
  p.half_open_probes = 1;
  p.probe_timeout_ms = 1'000;
  return p;
}

class OpenPeriodTimeTravelTest : public ::testing::TestWithParam<std::tuple<Offset, OpenShape>> {};

// Trip at the start offset; then three reopens. Each time the breaker rejects every admit up to
// one ms before its deadline (read from the word, and within its documented bounds) and
// half-opens at the deadline itself.
TEST_P(OpenPeriodTimeTravelTest, AnOpenBreakerHalfOpensExactlyAtItsDeadline) {
  const auto& [start, shape] = GetParam();
  const std::string where = std::string("start ") + start.name + ", open " + shape.name;
  VirtualSlot s(OpenPolicy(shape), start.ms * kMsNs);
  uint64_t t = start.ms * kMsNs;
  ASSERT_TRUE(shm::IsAdmitted(s.Call(t, Outcome::kFailure))) << where;
  for (uint32_t reopens = 0; reopens < 4; ++reopens) {
    ASSERT_EQ(s.State(), BreakerState::kOpen) << where << ", reopens " << reopens;
    const uint32_t period = s.Breaker().time_ms - shm::NsToMs32(t);
    const uint64_t base = std::min<uint64_t>(uint64_t{shape.open_for_ms} << reopens,
                                             std::max(shape.open_for_ms, shape.open_for_max_ms));
    ASSERT_GE(period, base) << where << ", reopens " << reopens;
    ASSERT_LE(period, base + shape.open_jitter_ms) << where << ", reopens " << reopens;
    const uint64_t deadline = t + uint64_t{period} * kMsNs;
    Permit p;
    for (const uint64_t before : {t, t + (deadline - t) / 2, deadline - kMsNs}) {
      EXPECT_EQ(s.Admit(0, before, &p), Decision::kRejectedOpen)
          << where << ", reopens " << reopens << ", " << (deadline - before) / kMsNs
          << " ms before the deadline";
      s.Complete(&p, Outcome::kSuccess, before);
    }
    t = deadline;
    ASSERT_EQ(s.Admit(0, t, &p), Decision::kAdmittedProbe) << where << ", reopens " << reopens;
    s.Complete(&p, Outcome::kFailure, t);  // reopens, for twice as long (capped)
  }
}

INSTANTIATE_TEST_SUITE_P(Wraps, OpenPeriodTimeTravelTest,
                         Combine(ValuesIn(StartOffsets()), ValuesIn(OpenShapes())),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param).name) + "_Open" +
                                  std::get<1>(info.param).name;
                         });

class UntouchedOpenTimeTravelTest : public ::testing::TestWithParam<Gap> {};

// Trip at the start offset, then nobody admits for the gap: the next admit is rejected if the
// gap is shorter than the open period, and half-opens (a probe) if it is as long or longer,
// however long.
TEST_P(UntouchedOpenTimeTravelTest, AnOpenBreakerUntouchedForLongerThanItsPeriodHalfOpens) {
  const Gap& gap = GetParam();
  for (const Offset& start : StartOffsets()) {
    for (const OpenShape& shape : {OpenShapes()[1], OpenShapes()[3]}) {
      const std::string where = Describe(start, gap) + ", open " + shape.name;
      VirtualSlot s(OpenPolicy(shape), start.ms * kMsNs);
      const uint64_t t = start.ms * kMsNs;
      s.Call(t, Outcome::kFailure);
      ASSERT_EQ(s.State(), BreakerState::kOpen) << where;
      const uint64_t period_ms = s.Breaker().time_ms - shm::NsToMs32(t);
      Permit p;
      EXPECT_EQ(s.Admit(0, t + gap.Ns(), &p),
                gap.ms < period_ms ? Decision::kRejectedOpen : Decision::kAdmittedProbe)
          << where << " (open period " << period_ms << " ms)";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Wraps, UntouchedOpenTimeTravelTest, ValuesIn(IdleGaps()),
                         [](const auto& info) { return GapName(info); });

// ----------------------------------------------------------------------------------------
// Probe and bulkhead leases (leases.h).

enum class LeaseKind { kProbe, kBulkhead };

struct LeaseShape {
  const char* name;
  LeaseKind kind;
  uint32_t timeout_ms;
};
const std::vector<LeaseShape>& LeaseShapes() {
  static const std::vector<LeaseShape> shapes = {
      {"Probe1ms", LeaseKind::kProbe, 1},
      {"Probe2s", LeaseKind::kProbe, 2'000},
      {"Probe1Day", LeaseKind::kProbe, 86'400'000},
      {"Bulkhead1ms", LeaseKind::kBulkhead, 1},
      {"Bulkhead60s", LeaseKind::kBulkhead, 60'000},
      {"Bulkhead1Day", LeaseKind::kBulkhead, 86'400'000},
  };
  return shapes;
}

// LeaseHolder takes one lease of `shape` at `start_ns` for a holder that then goes silent (it
// died, or hangs), in a slot where that lease is the only one there is.
class LeaseHolder {
 public:
  LeaseHolder(const LeaseShape& shape, uint64_t start_ns) : shape_(shape) {
    shm::Policy p;
    p.half_open_probes = 1;
    p.probe_timeout_ms = shape.timeout_ms;
    p.bulkhead_limit = shape.kind == LeaseKind::kBulkhead ? 1 : 0;
    p.bulkhead_timeout_ms = shape.timeout_ms;
    p.open_for_ms = 86'400'000;  // a reopened breaker stays open for the whole test
    p.open_jitter_ms = 0;
    slot_ = std::make_unique<VirtualSlot>(p, start_ns);
    if (shape.kind == LeaseKind::kProbe) {
      slot_->slot().breaker.store(
          shm::BreakerWord{BreakerState::kHalfOpen, 0, 0, 7, shm::NsToMs32(start_ns)}.Encode());
    }
    taken_ = slot_->Admit(0, start_ns, &held_, /*owner=*/2);
  }
  Decision taken() const { return taken_; }
  // Held: another caller is refused at `now_ns` because the lease is still taken. Expired: the
  // other caller's admit reclaims it (a probe's expiry reopens the breaker, a bulkhead lease is
  // given to the caller).
  bool HeldAt(uint64_t now_ns) {
    Permit p;
    const Decision d = slot_->Admit(0, now_ns, &p, /*owner=*/3);
    slot_->Complete(&p, Outcome::kIgnored, now_ns);
    return d == (shape_.kind == LeaseKind::kProbe ? Decision::kRejectedHalfOpenBusy
                                                  : Decision::kRejectedBulkheadFull);
  }
  uint64_t Reclaimed() const { return slot_->Counter(shm::kLeasesReclaimedExpired); }
  VirtualSlot& slot() { return *slot_; }

 private:
  LeaseShape shape_;
  std::unique_ptr<VirtualSlot> slot_;
  Permit held_;
  Decision taken_;
};

class LeaseTimeTravelTest : public ::testing::TestWithParam<std::tuple<Offset, LeaseShape>> {};

// Taken at the start offset: held at every instant up to one ms before its timeout, expired
// exactly at it; a probe's expiry counts as a timed-out probe and reopens its half-open.
TEST_P(LeaseTimeTravelTest, ALeaseIsHeldUntilItsTimeoutAndExpiredFromThen) {
  const auto& [start, shape] = GetParam();
  const std::string where = std::string("start ") + start.name + ", lease " + shape.name;
  const uint64_t t = start.ms * kMsNs;
  LeaseHolder h(shape, t);
  ASSERT_TRUE(shm::IsAdmitted(h.taken())) << where;
  const uint64_t expiry = t + uint64_t{shape.timeout_ms} * kMsNs;
  for (const uint64_t before : {t, t + (expiry - t) / 2, expiry - kMsNs}) {
    EXPECT_TRUE(h.HeldAt(before)) << where << ", " << (expiry - before) / kMsNs
                                  << " ms before the timeout";
  }
  EXPECT_EQ(h.Reclaimed(), 0u) << where;
  EXPECT_FALSE(h.HeldAt(expiry)) << where << ", at the timeout";
  EXPECT_EQ(h.Reclaimed(), 1u) << where;
  if (shape.kind == LeaseKind::kProbe) {
    EXPECT_EQ(h.slot().Counter(shm::kProbeTimeouts), 1u) << where;
    EXPECT_EQ(h.slot().State(), BreakerState::kOpen) << where;
  }
}

INSTANTIATE_TEST_SUITE_P(Wraps, LeaseTimeTravelTest,
                         Combine(ValuesIn(StartOffsets()), ValuesIn(LeaseShapes())),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param).name) + "_" +
                                  std::get<1>(info.param).name;
                         });

class UntouchedLeaseTimeTravelTest : public ::testing::TestWithParam<Gap> {};

// Taken at the start offset by a holder that died, then nobody looks for the gap: the lease is
// still held if the gap is shorter than its timeout, and expired if as long or longer (a
// month-old lease has expired), except in the window leases.h states: a lease word keeps its
// expiry in 32 bits, so during the last kMaxDeadlineAheadMs before each multiple of 2^32 ms
// after its expiry it reads as held again. (With a daemon no expired lease ages that far: its
// sweep frees it within a sweep period.)
TEST_P(UntouchedLeaseTimeTravelTest, ALeaseUntouchedForLongerThanItsTimeoutHasExpired) {
  const Gap& gap = GetParam();
  for (const Offset& start : StartOffsets()) {
    for (const LeaseShape& shape : LeaseShapes()) {
      if (shape.timeout_ms == 1) continue;  // every gap is at least as long
      const std::string where = Describe(start, gap) + ", lease " + shape.name;
      LeaseHolder h(shape, start.ms * kMsNs);
      ASSERT_TRUE(shm::IsAdmitted(h.taken())) << where;
      const uint64_t since_expiry_mod = (gap.ms - shape.timeout_ms) % (uint64_t{1} << 32);
      const bool held = gap.ms < shape.timeout_ms ||
                        since_expiry_mod >= (uint64_t{1} << 32) - shm::kMaxDeadlineAheadMs;
      EXPECT_EQ(h.HeldAt(start.ms * kMsNs + gap.Ns()), held) << where;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Wraps, UntouchedLeaseTimeTravelTest, ValuesIn(IdleGaps()),
                         [](const auto& info) { return GapName(info); });

// ----------------------------------------------------------------------------------------
// The breaker's 16-bit transition seq (breaker.h, admission.h).

class SeqWrapTimeTravelTest : public ::testing::TestWithParam<std::tuple<Offset, uint32_t>> {};

// Two probes of one half-open stay out (their holders hang, their leases last a day) while the
// breaker goes round open/half-open `cycles` times, 2 ms each, so that at 32,768 and 65,536
// cycles the seq is theirs again. Then the stale success must not close the half-open of the
// day, the stale failure must not reopen it, and its own probe still decides.
TEST_P(SeqWrapTimeTravelTest, AStaleProbeCanNeverCloseOrReopenALaterHalfOpen) {
  const auto& [start, cycles] = GetParam();
  const std::string where =
      std::string("start ") + start.name + ", " + std::to_string(cycles) + " cycles";
  shm::Policy p;
  p.min_calls = 1;
  p.open_for_ms = 1;
  p.open_for_max_ms = 1;
  p.open_jitter_ms = 0;
  p.probe_timeout_ms = 86'400'000;
  p.close_after = 1;
  p.half_open_probes = 3;
  uint64_t t = start.ms * kMsNs;
  VirtualSlot s(p, t);
  s.Call(t, Outcome::kFailure);
  t += 2 * kMsNs;
  Permit stale_success, stale_failure;
  ASSERT_EQ(s.Admit(0, t, &stale_success, 2), Decision::kAdmittedProbe) << where;
  ASSERT_EQ(s.Admit(0, t, &stale_failure, 3), Decision::kAdmittedProbe) << where;
  const uint16_t seq = stale_success.breaker_seq;
  for (uint32_t cycle = 0; cycle < cycles; ++cycle) {
    Permit failing;
    ASSERT_EQ(s.Admit(0, t, &failing, 4), Decision::kAdmittedProbe) << where << ", cycle " << cycle;
    s.Complete(&failing, Outcome::kFailure, t);
    t += 2 * kMsNs;
  }
  Permit current;
  ASSERT_EQ(s.Admit(0, t, &current, 4), Decision::kAdmittedProbe) << where;
  const uint16_t wrapped_by = uint16_t(s.Breaker().seq - seq);
  EXPECT_EQ(wrapped_by, uint16_t(2 * cycles)) << where;
  const uint64_t opened = s.Counter(shm::kOpened), closed = s.Counter(shm::kClosed);
  s.Complete(&stale_success, Outcome::kSuccess, t);
  s.Complete(&stale_failure, Outcome::kFailure, t);
  EXPECT_EQ(s.State(), BreakerState::kHalfOpen) << where;
  EXPECT_EQ(s.Counter(shm::kClosed), closed) << where;
  EXPECT_EQ(s.Counter(shm::kOpened), opened) << where;
  // A day later their leases would have expired: the sweep reopens nothing of today's.
  EXPECT_EQ(shm::ReclaimExpired(s.slot(), t + 86'400'000 * kMsNs - kMsNs, s.caller()), 0u);
  s.Complete(&current, Outcome::kSuccess, t);
  EXPECT_EQ(s.State(), BreakerState::kClosed) << where << ": its own probe closes it";
}

INSTANTIATE_TEST_SUITE_P(Wraps, SeqWrapTimeTravelTest,
                         Combine(ValuesIn(std::vector<Offset>{StartOffsets()[0], StartOffsets()[2],
                                                              StartOffsets()[7],
                                                              StartOffsets()[11]}),
                                 ::testing::Values(32'767u, 32'768u, 32'769u, 65'536u)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param).name) + "_" +
                                  std::to_string(std::get<1>(info.param)) + "Cycles";
                         });

// ----------------------------------------------------------------------------------------
// The create lock's stamp (dependency_table.h). The lock reads the real clock, so the harness
// varies the stamp's age instead of the start offset: only the 32-bit difference of the two
// is read, so the age modulo 2^32 ms is all the clock's offset can change. The stamps carry
// namespace tag 0 (a writer the waiter cannot ask about), so the age alone decides.

struct StampAge {
  const char* name;
  int64_t ms;  // negative: stamped in the future
};

uint64_t ForeignStamp(int64_t age_ms) {
  const uint32_t now_ms = shm::NsToMs32(shm::PreciseNowNs());
  return 12'345 | (uint64_t(uint32_t(now_ms - uint32_t(uint64_t(age_ms)))) << 32);
}

class CreateLockStampTest : public ::testing::TestWithParam<StampAge> {
 protected:
  void SetUp() override { seg_ = shm::Segment::CreatePrivate(4, 4, shm::Policy{}); }
  // TryCreate tries once, without waiting, to create a dependency under a stamp of `age`.
  Status TryCreate(int64_t age_ms) {
    seg_->header().create_lock.store(ForeignStamp(age_ms));
    uint32_t index = 0;
    return seg_->PutDependency("dep" + std::to_string(n_++), shm::Policy{}, &index, 0);
  }
  std::unique_ptr<shm::Segment> seg_;
  int n_ = 0;
};

// A stamp older than 1 s, or more than 1 s in the future, is stale: a creator takes the lock at
// once, however old the stamp (as long as it does not read as fresh modulo 2^32 ms).
TEST_P(CreateLockStampTest, AnOldCreateLockStampIsStaleAtEveryAge) {
  const StampAge age = GetParam();
  const Status s = TryCreate(age.ms);
  EXPECT_TRUE(s.ok()) << "stamp " << age.name << " old: " << s.ToString();
}

INSTANTIATE_TEST_SUITE_P(Ages, CreateLockStampTest,
                         ValuesIn(std::vector<StampAge>{
                             {"1500ms", 1'500},
                             {"1min", 60'000},
                             {"1h", 3'600'000},
                             {"1Day", int64_t(kDayMs)},
                             {"2p31msMinus1", int64_t(kHalfWrapMs) - 1},
                             {"2p31ms", int64_t(kHalfWrapMs)},
                             {"2p31msPlus1", int64_t(kHalfWrapMs) + 1},
                             {"0xC0000000ms", int64_t(0xC000'0000ll)},
                             {"2p32msMinus1Day", int64_t(kWrapMs - kDayMs)},
                             {"2p32msMinus1500ms", int64_t(kWrapMs) - 1'500},
                             {"2p32msPlus1500ms", int64_t(kWrapMs) + 1'500},
                             {"1e10ms", 10'000'000'000},
                             {"AYear", int64_t(kYearMs)},
                             {"Future1500ms", -1'500},
                             {"Future1h", -3'600'000},
                             {"Future2p31msMinus1", -(int64_t(kHalfWrapMs) - 1)},
                         }),
                         [](const auto& info) { return std::string(info.param.name); });

// A fresh stamp (this second, or within a second ahead) keeps every other creator out.
TEST(CreateLockStampFreshTest, AFreshCreateLockStampIsHeld) {
  auto seg = shm::Segment::CreatePrivate(4, 4, shm::Policy{});
  for (const int64_t age_ms : {int64_t{0}, int64_t{500}, int64_t{-500}}) {
    seg->header().create_lock.store(ForeignStamp(age_ms));
    uint32_t index = 0;
    const Status s = seg->PutDependency("dep", shm::Policy{}, &index, 0);
    EXPECT_EQ(s.code(), Status::Code::kIoError) << "stamp " << age_ms << " ms old";
  }
}

// A stamp that reads as fresh only modulo 2^32 ms (taken 49.7 days and 900 ms ago) delays a
// creator by the rest of the second it seems to be in, never longer than kCreateLockWaitMs.
TEST(CreateLockStampFreshTest, AStampFreshOnlyModulo2p32MsDelaysACreatorUnderASecond) {
  auto seg = shm::Segment::CreatePrivate(4, 4, shm::Policy{});
  seg->header().create_lock.store(ForeignStamp(int64_t(kWrapMs) + 900));
  uint32_t index = 0;
  const auto before = std::chrono::steady_clock::now();
  const Status s = seg->PutDependency("dep", shm::Policy{}, &index);
  const auto waited = std::chrono::steady_clock::now() - before;
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_LT(waited, std::chrono::milliseconds(1'000));
}

// ----------------------------------------------------------------------------------------
// The status view (view.h): what retryctl and the metrics show of those stamps.

class ViewTimeTravelTest : public ::testing::TestWithParam<Gap> {
 protected:
  shm::SegmentStatus Status(shm::Segment& seg, uint64_t now_ns) {
    shm::BuildOptions opt;
    opt.now_ns = now_ns;
    opt.probe_lock = false;
    opt.check_processes = false;
    opt.pid_alive = [](pid_t) { return true; };
    shm::SegmentStatus s;
    EXPECT_TRUE(shm::BuildStatus(seg, opt, &s).ok());
    return s;
  }
};

// Trip at the start offset, then silence for the gap: the view's time to half-open is positive
// exactly when the next admit is rejected as open (and then at most the open period), and
// <= 0 exactly when the next admit half-opens.
TEST_P(ViewTimeTravelTest, TheTimeToHalfOpenShownAgreesWithTheNextAdmit) {
  const Gap& gap = GetParam();
  for (const Offset& start : StartOffsets()) {
    const shm::Policy p = OpenPolicy(OpenShapes()[1]);
    auto seg = shm::Segment::CreatePrivate(4, 4, p);
    uint32_t index = 0;
    ASSERT_TRUE(seg->PutDependency("orders", p, &index).ok());
    shm::DependencySlot& slot = *seg->dependency(index);
    const uint64_t t = start.ms * kMsNs;
    shm::Reset(slot, t);
    shm::Caller caller{1, 0, 7};
    Permit permit;
    shm::Admit(slot, index, 0, t, caller, &permit);
    shm::Complete(slot, &permit, Outcome::kFailure, kMsNs, t, caller);
    ASSERT_EQ(shm::BreakerWord::Decode(slot.breaker.load()).state, BreakerState::kOpen);
    const uint64_t now = t + gap.Ns();
    const shm::SegmentStatus status = Status(*seg, now);
    ASSERT_EQ(status.dependencies.size(), 1u);
    const int64_t shown = status.dependencies[0].half_open_in_ms;
    const Decision d = shm::Admit(slot, index, 0, now, caller, &permit);
    if (d == Decision::kRejectedOpen) {
      EXPECT_GT(shown, 0) << Describe(start, gap);
      EXPECT_LE(shown, int64_t{p.open_for_ms}) << Describe(start, gap);
    } else {
      EXPECT_EQ(d, Decision::kAdmittedProbe) << Describe(start, gap);
      EXPECT_LE(shown, 0) << Describe(start, gap) << ": due now, shown as " << shown << " ms away";
    }
  }
}

// The daemon's heartbeat is a 64-bit CLOCK_MONOTONIC stamp: its age is the gap at every offset,
// and the daemon reads stale exactly when the gap passes stale_after.
TEST_P(ViewTimeTravelTest, TheHeartbeatAgesByTheGap) {
  const Gap& gap = GetParam();
  for (const Offset& start : StartOffsets()) {
    auto seg = shm::Segment::CreatePrivate(4, 4, shm::Policy{});
    const uint64_t beat = start.ms * kMsNs + 1;  // 0 means "never beat"
    seg->header().daemon_pid.store(1);
    seg->header().heartbeat_ns.store(beat);
    const shm::SegmentStatus status = Status(*seg, beat + gap.Ns());
    ASSERT_TRUE(status.daemon.heartbeat_age_ms.has_value());
    EXPECT_EQ(*status.daemon.heartbeat_age_ms, gap.ms) << Describe(start, gap);
    EXPECT_EQ(status.daemon.state,
              gap.ms > 3'000 ? shm::DaemonState::kStale : shm::DaemonState::kUp)
        << Describe(start, gap);
  }
}

INSTANTIATE_TEST_SUITE_P(Wraps, ViewTimeTravelTest, ValuesIn(IdleGaps()),
                         [](const auto& info) { return GapName(info); });

}  // namespace
}  // namespace retryd::testing
