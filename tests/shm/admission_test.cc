// Admission with virtual time on a private segment: breaker transitions, probes, bulkhead,
// budget, modes. Each test drives one dependency slot through the real algorithms.
#include "shm/admission.h"

#include <cstdlib>
#include <new>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "shm/breaker.h"
#include "shm/leases.h"
#include "shm/retry_budget.h"
#include "tests/sanitized.h"
#include "tests/shm/test_util.h"

// Counts the allocations of the thread that sets `count_allocations` (admission.h promises
// Admit and Complete make none).
namespace {
thread_local bool count_allocations = false;
thread_local uint64_t allocations = 0;
}  // namespace

#if defined(RETRYD_ADDRESS_SANITIZER) || defined(RETRYD_THREAD_SANITIZER)
// A sanitizer's runtime owns operator new (clang links every form of it in, so none can be
// replaced): its allocator's hook counts instead, malloc's calls included.
#include <sanitizer/allocator_interface.h>
namespace {
void CountAllocation(const volatile void*, std::size_t) {
  if (count_allocations) ++allocations;
}
void IgnoreFree(const volatile void*) {}
[[maybe_unused]] const int kHooksInstalled =
    __sanitizer_install_malloc_and_free_hooks(CountAllocation, IgnoreFree);
}  // namespace
#else
void* operator new(std::size_t n) {
  if (count_allocations) ++allocations;
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
// The matching deletes: memory from the operator new above goes back to malloc's free. GCC
// cannot see that they match.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

namespace retryd::shm {
namespace {

using testing::kMs;
using testing::kSec;

class AdmissionTest : public ::testing::Test {
 protected:
  void SetUpPolicy(const Policy& p) {
    seg_ = Segment::CreatePrivate(4, 4, p);
    index_ = testing::AddDependency(*seg_, "orders", p);
    slot_ = seg_->dependency(index_);
  }
  void SetUp() override {
    Policy p;
    p.min_calls = 10;
    p.open_for_ms = 1000;
    p.open_jitter_ms = 0;
    p.close_after = 2;
    p.half_open_probes = 1;
    SetUpPolicy(p);
  }
  Decision Admit(uint32_t attempt, Permit* p, uint16_t owner = 1) {
    caller_.owner = owner;
    return shm::Admit(*slot_, index_, attempt, now_, caller_, p);
  }
  void Complete(Permit* p, Outcome o, uint64_t latency = kMs) {
    shm::Complete(*slot_, p, o, latency, now_, caller_);
  }
  // Call runs one admitted first attempt to `o`.
  void Call(Outcome o) {
    Permit p;
    ASSERT_TRUE(IsAdmitted(Admit(0, &p)));
    Complete(&p, o);
  }
  BreakerState State() const { return BreakerWord::Decode(slot_->breaker.load()).state; }
  uint64_t Counter(Counter c) const { return ReadCounter(*slot_, c); }

  std::unique_ptr<Segment> seg_;
  uint32_t index_ = 0;
  DependencySlot* slot_ = nullptr;
  Caller caller_{1, 0, 12345};
  uint64_t now_ = 1000 * kSec;
};

TEST_F(AdmissionTest, TripsOnlyAtMinCallsAndThreshold) {
  for (int i = 0; i < 9; ++i) Call(Outcome::kFailure);  // 9 < min_calls
  EXPECT_EQ(State(), BreakerState::kClosed);
  Call(Outcome::kFailure);
  EXPECT_EQ(State(), BreakerState::kOpen);
  EXPECT_EQ(Counter(kOpened), 1u);
  Permit p;
  EXPECT_EQ(Admit(0, &p), Decision::kRejectedOpen);
  Complete(&p, Outcome::kSuccess);  // a rejected permit completes as a no-op
  EXPECT_EQ(Counter(kRejectedOpen), 1u);
  EXPECT_EQ(Counter(kSuccesses), 0u);
}

TEST_F(AdmissionTest, FailureRateBelowThresholdDoesNotTrip) {
  for (int i = 0; i < 30; ++i) Call(i % 3 == 0 ? Outcome::kFailure : Outcome::kSuccess);  // 33 %
  EXPECT_EQ(State(), BreakerState::kClosed);
}

TEST_F(AdmissionTest, IgnoredOutcomesDoNotCount) {
  for (int i = 0; i < 50; ++i) Call(Outcome::kIgnored);
  for (int i = 0; i < 9; ++i) Call(Outcome::kFailure);
  EXPECT_EQ(State(), BreakerState::kClosed);
  EXPECT_EQ(ReadWindow(*slot_, now_).calls, 9u);
  EXPECT_EQ(Counter(kIgnored), 50u);
}

TEST_F(AdmissionTest, OldFailuresLeaveTheWindow) {
  for (int i = 0; i < 9; ++i) Call(Outcome::kFailure);
  now_ += 11 * kSec;  // past the 10 s window
  Call(Outcome::kFailure);
  EXPECT_EQ(State(), BreakerState::kClosed);
  EXPECT_EQ(ReadWindow(*slot_, now_).calls, 1u);
}

TEST_F(AdmissionTest, HalfOpenGrantsExactlyTheConfiguredProbes) {
  for (int i = 0; i < 10; ++i) Call(Outcome::kFailure);
  now_ += 999 * kMs;
  Permit p;
  EXPECT_EQ(Admit(0, &p), Decision::kRejectedOpen);
  now_ += 1 * kMs;
  Permit probe;
  EXPECT_EQ(Admit(0, &probe), Decision::kAdmittedProbe);
  EXPECT_EQ(State(), BreakerState::kHalfOpen);
  for (int i = 0; i < 100; ++i) {
    Permit other;
    EXPECT_EQ(Admit(i % 2, &other, uint16_t(2 + i % 3)), Decision::kRejectedHalfOpenBusy);
  }
  Complete(&probe, Outcome::kSuccess);
  EXPECT_EQ(State(), BreakerState::kHalfOpen);  // close_after = 2
  ASSERT_EQ(Admit(0, &probe), Decision::kAdmittedProbe);
  Complete(&probe, Outcome::kSuccess);
  EXPECT_EQ(State(), BreakerState::kClosed);
  EXPECT_EQ(Counter(kProbesGranted), 2u);
  // The window restarted: the failures that tripped it are gone.
  EXPECT_EQ(ReadWindow(*slot_, now_).failures, 0u);
  Call(Outcome::kFailure);
  EXPECT_EQ(State(), BreakerState::kClosed);
}

// An ignored outcome (not the dependency's fault) says nothing of its health: a probe that ends
// so hands its place to the next caller, which probes in the same half-open. The places bound
// the probes out at once; each ignored probe adds one to the episode's count.
TEST_F(AdmissionTest, AnIgnoredProbeHandsItsPlaceToTheNextCaller) {
  for (int i = 0; i < 10; ++i) Call(Outcome::kFailure);
  now_ += 1 * kSec;
  for (int i = 0; i < 5; ++i) {
    Permit probe;
    ASSERT_EQ(Admit(0, &probe), Decision::kAdmittedProbe);
    Permit other;
    EXPECT_EQ(Admit(1, &other), Decision::kRejectedHalfOpenBusy) << "one probe at once";
    Complete(&probe, Outcome::kIgnored);
    EXPECT_EQ(State(), BreakerState::kHalfOpen);
  }
  EXPECT_EQ(Counter(kProbesGranted), 5u);
  EXPECT_EQ(Counter(kHalfOpened), 1u);
  Permit probe;
  ASSERT_EQ(Admit(0, &probe), Decision::kAdmittedProbe);
  Complete(&probe, Outcome::kFailure);
  EXPECT_EQ(State(), BreakerState::kOpen);
}

TEST_F(AdmissionTest, ProbeFailureReopensWithDoubledPeriod) {
  for (int i = 0; i < 10; ++i) Call(Outcome::kFailure);
  now_ += 1 * kSec;
  Permit probe;
  ASSERT_EQ(Admit(0, &probe), Decision::kAdmittedProbe);
  Complete(&probe, Outcome::kFailure);
  EXPECT_EQ(State(), BreakerState::kOpen);
  const BreakerWord b = BreakerWord::Decode(slot_->breaker.load());
  EXPECT_EQ(b.reopens, 1u);
  EXPECT_EQ(b.time_ms, NsToMs32(now_) + 2000);  // open_for x 2^1
  now_ += 1999 * kMs;
  EXPECT_EQ(Admit(0, &probe), Decision::kRejectedOpen);
  now_ += 1 * kMs;
  EXPECT_EQ(Admit(0, &probe), Decision::kAdmittedProbe);
}

TEST_F(AdmissionTest, OpenPeriodIsCappedForAnyReopenCount) {
  slot_->policy.open_for_max_ms.store(5000);
  for (uint32_t r : {0u, 1u, 2u, 3u, 10u, 31u, 63u}) {
    const uint32_t ms = OpenPeriodMs(slot_->policy, r, 0);
    EXPECT_LE(ms, 5000u) << r;
    EXPECT_GE(ms, 1000u) << r;
  }
  EXPECT_EQ(OpenPeriodMs(slot_->policy, 63, 7), 5000u);
}

TEST_F(AdmissionTest, OpenJitterIsUniformWithinBounds) {
  slot_->policy.open_jitter_ms.store(500);
  uint64_t sum = 0;
  uint32_t lo = ~0u, hi = 0;
  Caller c{1, 0, 99};
  for (int i = 0; i < 20000; ++i) {
    c.rng ^= c.rng << 13; c.rng ^= c.rng >> 17; c.rng ^= c.rng << 5;
    const uint32_t ms = OpenPeriodMs(slot_->policy, 0, c.rng);
    lo = std::min(lo, ms);
    hi = std::max(hi, ms);
    sum += ms;
  }
  EXPECT_GE(lo, 1000u);
  EXPECT_LE(hi, 1500u);
  EXPECT_NEAR(double(sum) / 20000, 1250.0, 10.0);
}

TEST_F(AdmissionTest, ExpiredProbeCountsAsFailureAndFreesTheLease) {
  for (int i = 0; i < 10; ++i) Call(Outcome::kFailure);
  now_ += 1 * kSec;
  Permit lost;
  ASSERT_EQ(Admit(0, &lost), Decision::kAdmittedProbe);  // its holder never completes
  now_ += 2 * kSec;                                       // probe_timeout is 2 s
  Permit p;
  EXPECT_EQ(Admit(0, &p), Decision::kRejectedOpen);       // the timeout reopened it
  EXPECT_EQ(Counter(kProbeTimeouts), 1u);
  EXPECT_EQ(Counter(kLeasesReclaimedExpired), 1u);
  EXPECT_EQ(slot_->probe_leases[0].load(), 0u);
  // The late completion of the lost probe changes nothing.
  Complete(&lost, Outcome::kSuccess);
  EXPECT_EQ(State(), BreakerState::kOpen);
}

// A probe of an earlier half-open neither takes a probe place in a later one nor reopens it
// when its lease expires: with two probes, A (of half-open #1) hangs, B fails, and half-open #2
// collects two successes; then A's lease would have expired.
TEST_F(AdmissionTest, AStaleProbeNeitherOccupiesNorReopensALaterHalfOpen) {
  slot_->policy.half_open_probes.store(2);
  slot_->policy.close_after.store(3);
  slot_->policy.probe_timeout_ms.store(5'000);
  for (int i = 0; i < 10; ++i) Call(Outcome::kFailure);
  now_ += 1 * kSec;
  Permit a, b;
  ASSERT_EQ(Admit(0, &a, 2), Decision::kAdmittedProbe);  // hangs
  ASSERT_EQ(Admit(0, &b, 3), Decision::kAdmittedProbe);
  Complete(&b, Outcome::kFailure);  // reopens: half-open #1 is over
  ASSERT_EQ(State(), BreakerState::kOpen);
  now_ += 2 * kSec;  // open for 2 s after one reopen; A's lease has 3 s left
  Permit c, d;
  ASSERT_EQ(Admit(0, &c, 4), Decision::kAdmittedProbe);  // half-open #2
  EXPECT_EQ(Counter(kLeasesReclaimedVoided), 1u) << "A's lease was voided when #2 began";
  ASSERT_EQ(Admit(0, &d, 5), Decision::kAdmittedProbe) << "A must not hold one of #2's places";
  Complete(&c, Outcome::kSuccess);
  Complete(&d, Outcome::kSuccess);
  ASSERT_EQ(State(), BreakerState::kHalfOpen);
  const uint64_t reopens = Counter(kOpened);
  now_ += 4 * kSec;  // past A's expiry
  EXPECT_EQ(ReclaimExpired(*slot_, now_, caller_), 0u);
  Complete(&a, Outcome::kFailure);  // A's late failure
  EXPECT_EQ(State(), BreakerState::kHalfOpen);
  EXPECT_EQ(Counter(kOpened), reopens);
  EXPECT_EQ(BreakerWord::Decode(slot_->breaker.load()).successes, 2u);
  EXPECT_EQ(Counter(kProbeTimeouts), 0u);
}

// The same when A's lease is still there when it expires (its voider died before voiding):
// the expiry frees it without reopening half-open #2.
TEST_F(AdmissionTest, AnExpiredProbeOfAnEarlierHalfOpenDoesNotReopen) {
  slot_->policy.half_open_probes.store(2);
  slot_->policy.close_after.store(3);
  for (int i = 0; i < 10; ++i) Call(Outcome::kFailure);
  now_ += 1 * kSec;
  Permit a;
  ASSERT_EQ(Admit(0, &a, 2), Decision::kAdmittedProbe);
  const uint64_t a_word = slot_->probe_leases[a.probe_index].load();
  // Half-open #2 begins, and its beginner dies before voiding: the word stays A's.
  const BreakerWord h = BreakerWord::Decode(slot_->breaker.load());
  slot_->breaker.store(BreakerWord{BreakerState::kHalfOpen, 1, 2, uint16_t(h.seq + 2),
                                   NsToMs32(now_)}.Encode());
  now_ += 3 * kSec;  // past A's 2 s probe timeout
  EXPECT_EQ(ReclaimExpired(*slot_, now_, caller_), 1u);
  EXPECT_EQ(slot_->probe_leases[a.probe_index].load(), 0u) << std::hex << a_word;
  EXPECT_EQ(State(), BreakerState::kHalfOpen);
  EXPECT_EQ(Counter(kProbeTimeouts), 0u);
  EXPECT_EQ(Counter(kLeasesReclaimedExpired), 1u);
}

// A probe granted under seq S must not report into another half-open whose seq is S again
// after 2^16 transitions (32,768 open/half-open cycles while it is out).
TEST_F(AdmissionTest, AProbeOutWhileTheSeqWrapsCannotCloseTheBreaker) {
  slot_->policy.open_for_ms.store(1);
  slot_->policy.open_for_max_ms.store(1);
  slot_->policy.probe_timeout_ms.store(86'400'000);
  slot_->policy.close_after.store(1);
  slot_->policy.half_open_probes.store(2);
  for (int i = 0; i < 10; ++i) Call(Outcome::kFailure);
  now_ += 2 * kMs;
  Permit stale;
  ASSERT_EQ(Admit(0, &stale, 2), Decision::kAdmittedProbe);
  const uint16_t seq = stale.breaker_seq;
  for (int cycle = 0; cycle < 32'768; ++cycle) {
    Permit failing;
    ASSERT_EQ(Admit(0, &failing, 3), Decision::kAdmittedProbe) << cycle;
    Complete(&failing, Outcome::kFailure);  // reopens
    now_ += 2 * kMs;
  }
  Permit again;
  ASSERT_EQ(Admit(0, &again, 3), Decision::kAdmittedProbe);
  ASSERT_EQ(BreakerWord::Decode(slot_->breaker.load()).seq, seq) << "the seq has wrapped";
  const uint64_t closed = Counter(kClosed);
  Complete(&stale, Outcome::kSuccess);
  EXPECT_EQ(State(), BreakerState::kHalfOpen);
  EXPECT_EQ(Counter(kClosed), closed);
  Complete(&again, Outcome::kFailure);
  EXPECT_EQ(State(), BreakerState::kOpen);
}

TEST_F(AdmissionTest, AnOpenBreakerUntouchedForAMonthHalfOpensOnTheNextAdmit) {
  for (int i = 0; i < 10; ++i) Call(Outcome::kFailure);
  ASSERT_EQ(State(), BreakerState::kOpen);
  now_ += 25ull * 86'400 * kSec;  // past 2^31 ms: the 32-bit "until" reads as ahead
  Permit p;
  EXPECT_EQ(Admit(0, &p), Decision::kAdmittedProbe);
}

TEST_F(AdmissionTest, ALeaseUntouchedForAMonthHasExpired) {
  for (int i = 0; i < 10; ++i) Call(Outcome::kFailure);
  now_ += 1 * kSec;
  Permit lost;
  ASSERT_EQ(Admit(0, &lost), Decision::kAdmittedProbe);  // its holder dies with it
  now_ += 25ull * 86'400 * kSec;
  Caller janitor{0, 0, 5};
  EXPECT_EQ(ReclaimExpired(*slot_, now_, janitor), 1u);
}

TEST_F(AdmissionTest, OneFailedProbeReopensWhateverTheOthersReport) {
  slot_->policy.half_open_probes.store(2);
  slot_->policy.close_after.store(255);
  // Many rounds of two probes completing at once, one success and one failure: the failure
  // must win every time, even when the success changes the word between its read and its CAS.
  for (int round = 0; round < 2000; ++round) {
    slot_->breaker.store(
        BreakerWord{BreakerState::kHalfOpen, 0, 0, uint16_t(round), NsToMs32(now_)}.Encode());
    Permit good, bad;
    Caller a{2, 0, 11}, b{3, 0, 13};
    ASSERT_EQ(shm::Admit(*slot_, index_, 0, now_, a, &good), Decision::kAdmittedProbe);
    ASSERT_EQ(shm::Admit(*slot_, index_, 0, now_, b, &bad), Decision::kAdmittedProbe);
    std::atomic<int> ready{0};
    std::thread t([&] {
      ready.fetch_add(1);
      while (ready.load() < 2) std::this_thread::yield();
      shm::Complete(*slot_, &good, Outcome::kSuccess, kMs, now_, a);
    });
    ready.fetch_add(1);
    while (ready.load() < 2) std::this_thread::yield();
    shm::Complete(*slot_, &bad, Outcome::kFailure, kMs, now_, b);
    t.join();
    ASSERT_EQ(State(), BreakerState::kOpen) << "round " << round;
  }
}

// No probe success is lost to contention: kMaxProbes probes of one half-open complete at once,
// each CAS racing the others', and close_after of them must close the breaker every time.
TEST_F(AdmissionTest, EveryProbeSuccessCountsWhenAllProbesCompleteAtOnce) {
  constexpr int kProbes = int(kMaxProbes);
  slot_->policy.half_open_probes.store(kProbes);
  slot_->policy.close_after.store(kProbes);
  for (int round = 0; round < Rounds(500); ++round) {
    slot_->breaker.store(
        BreakerWord{BreakerState::kHalfOpen, 0, 0, uint16_t(round), NsToMs32(now_)}.Encode());
    std::vector<Permit> permits(kProbes);
    std::vector<Caller> callers;
    for (int i = 0; i < kProbes; ++i) {
      callers.push_back(Caller{uint16_t(2 + i), 0, uint32_t(7 + i)});
      ASSERT_EQ(shm::Admit(*slot_, index_, 0, now_, callers[i], &permits[i]),
                Decision::kAdmittedProbe);
    }
    std::atomic<int> ready{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < kProbes; ++i) {
      threads.emplace_back([&, i] {
        ready.fetch_add(1);
        while (ready.load() < kProbes) std::this_thread::yield();
        shm::Complete(*slot_, &permits[i], Outcome::kSuccess, kMs, now_, callers[i]);
      });
    }
    for (auto& t : threads) t.join();
    ASSERT_EQ(State(), BreakerState::kClosed) << "round " << round;
  }
}

// The breaker judges its window when a failure or a slow call is recorded, never on a success:
// a success cannot make a dependency look worse. Resilience4j judges after every call, so with
// min_calls 10 and a 50 % threshold, 5 failures then 5 successes open it at the 10th call (a
// success); here the breaker stays closed, and the next failure opens it if the window still
// says so (6 of 11).
TEST_F(AdmissionTest, ASuccessNeverTripsTheNextFailureDoes) {
  slot_->policy.failure_rate_pct.store(50);
  for (int i = 0; i < 5; ++i) Call(Outcome::kFailure);
  for (int i = 0; i < 5; ++i) Call(Outcome::kSuccess);
  EXPECT_EQ(State(), BreakerState::kClosed);  // 5 of 10 failed, judged at no success
  Call(Outcome::kFailure);
  EXPECT_EQ(State(), BreakerState::kOpen);
}

// The longest open period a policy can give (open_for_max plus all of open_jitter) holds for
// every reader, one whose clock read lags the process that opened it included: the guard
// against a month-old deadline must not take it for one from the far past.
TEST_F(AdmissionTest, TheLongestOpenPeriodHoldsForALaggingReader) {
  slot_->policy.open_for_ms.store(kMaxKnobDurationMs);
  slot_->policy.open_for_max_ms.store(kMaxKnobDurationMs);
  slot_->policy.open_jitter_ms.store(kMaxKnobDurationMs);
  const uint32_t longest = OpenPeriodMs(slot_->policy, 63, kMaxKnobDurationMs);
  ASSERT_EQ(longest, kMaxStampedAheadMs);
  const uint64_t opened = now_;
  slot_->breaker.store(
      BreakerWord{BreakerState::kOpen, 63, 0, 5, NsToMs32(opened) + longest}.Encode());
  Permit p;
  for (uint64_t lag_ms : {uint64_t{1}, uint64_t{1000}, uint64_t{kMaxClockSkewMs}}) {
    now_ = opened - lag_ms * kMs;
    EXPECT_EQ(Admit(0, &p), Decision::kRejectedOpen) << "lag " << lag_ms << " ms";
  }
  now_ = opened + (longest - 1) * kMs;
  EXPECT_EQ(Admit(0, &p), Decision::kRejectedOpen);
  now_ = opened + longest * kMs;
  EXPECT_EQ(Admit(0, &p), Decision::kAdmittedProbe);
  Complete(&p, Outcome::kSuccess);
}

// A retry that wins a probe lease but finds the budget empty does not go out: it is counted as a
// denied retry, not as a probe, and its lease is free again for the next attempt.
TEST_F(AdmissionTest, AProbeRefusedByTheBudgetIsNotCountedAsAProbe) {
  slot_->policy.min_retries_per_sec.store(0);
  slot_->budget.store(RetryBudget::Make(0, NsToMs32(now_)));
  slot_->breaker.store(BreakerWord{BreakerState::kHalfOpen, 0, 0, 3, NsToMs32(now_)}.Encode());
  Permit p;
  EXPECT_EQ(Admit(1, &p), Decision::kRejectedBudgetEmpty);
  EXPECT_EQ(Counter(kProbesGranted), 0u);
  EXPECT_EQ(Counter(kRetriesDenied), 1u);
  for (const auto& l : slot_->probe_leases) EXPECT_EQ(l.load(), 0u);
  Permit q;
  EXPECT_EQ(Admit(0, &q), Decision::kAdmittedProbe);
  EXPECT_EQ(Counter(kProbesGranted), 1u);
  Complete(&q, Outcome::kSuccess);
}

TEST_F(AdmissionTest, RetriesSpendTheBudgetFirstAttemptsRefillIt) {
  slot_->policy.min_retries_per_sec.store(0);
  slot_->budget.store(RetryBudget::Make(0, NsToMs32(now_)));
  Permit p;
  EXPECT_EQ(Admit(1, &p), Decision::kRejectedBudgetEmpty);
  Complete(&p, Outcome::kFailure);
  for (int i = 0; i < 10; ++i) Call(Outcome::kSuccess);  // 10 x 0.2 = 2 tokens
  EXPECT_EQ(Admit(1, &p), Decision::kAdmitted);
  Complete(&p, Outcome::kSuccess);
  EXPECT_EQ(Admit(2, &p), Decision::kAdmitted);
  Complete(&p, Outcome::kSuccess);
  EXPECT_EQ(Admit(1, &p), Decision::kRejectedBudgetEmpty);
  EXPECT_EQ(Counter(kRetriesGranted), 2u);
  EXPECT_EQ(Counter(kRetriesDenied), 2u);
  EXPECT_EQ(Counter(kFirstAttempts), 10u);
}

TEST_F(AdmissionTest, BulkheadLimitsCallsInFlight) {
  slot_->policy.bulkhead_limit.store(3);
  Permit held[3];
  for (auto& p : held) ASSERT_EQ(Admit(0, &p), Decision::kAdmitted);
  Permit extra;
  EXPECT_EQ(Admit(0, &extra), Decision::kRejectedBulkheadFull);
  Complete(&held[1], Outcome::kSuccess);
  EXPECT_EQ(Admit(0, &extra), Decision::kAdmitted);
  EXPECT_EQ(Counter(kRejectedBulkheadFull), 1u);
  // A lease whose holder vanished comes back after bulkhead_timeout.
  now_ += 61 * kSec;
  Permit late;
  EXPECT_EQ(Admit(0, &late), Decision::kAdmitted);
  EXPECT_GE(Counter(kLeasesReclaimedExpired), 1u);
}

TEST_F(AdmissionTest, RejectedRetryReleasesItsBulkheadLease) {
  slot_->policy.bulkhead_limit.store(1);
  slot_->policy.min_retries_per_sec.store(0);
  slot_->budget.store(RetryBudget::Make(0, NsToMs32(now_)));
  Permit p;
  EXPECT_EQ(Admit(1, &p), Decision::kRejectedBudgetEmpty);
  EXPECT_EQ(slot_->bulkhead_leases[0].load(), 0u);
  EXPECT_EQ(Admit(0, &p), Decision::kAdmitted);
}

TEST_F(AdmissionTest, ShadowModeDecidesButAlwaysAdmits) {
  slot_->mode.store(uint32_t(Mode::kShadow));
  for (int i = 0; i < 10; ++i) Call(Outcome::kFailure);
  EXPECT_EQ(State(), BreakerState::kOpen);  // the breaker still works...
  Permit p;
  EXPECT_EQ(Admit(0, &p), Decision::kAdmitted);  // ...but nothing is rejected
  Complete(&p, Outcome::kFailure);
  EXPECT_EQ(Counter(kShadowWouldReject), 1u);
  EXPECT_EQ(Counter(kRejectedOpen), 0u);
}

// Shadow takes every step enforce takes: an attempt the breaker would refuse still passes the
// bulkhead and the budget (a first attempt deposits and counts, since it really goes out), and
// each attempt enforce refuses counts once, whichever step refused it and however many would.
TEST_F(AdmissionTest, ShadowCountsEveryStepEnforceWouldTake) {
  struct Counts {
    uint64_t first_attempts, retries_granted, would_reject, rejected, budget_tokens;
  };
  // Drives one slot in `mode` through the same attempts: breaker open, bulkhead of 1 held, an
  // empty budget with no floor; then a first attempt, a retry, and a retry after a deposit.
  auto run = [&](Mode mode) {
    SetUp();
    slot_->policy.bulkhead_limit.store(1);
    slot_->policy.min_retries_per_sec.store(0);
    slot_->policy.retry_ratio_milli.store(1000);  // one token per first attempt
    slot_->budget.store(RetryBudget::Make(0, NsToMs32(now_)));
    for (int i = 0; i < 10; ++i) Call(Outcome::kFailure);  // opens the breaker
    EXPECT_EQ(State(), BreakerState::kOpen);
    slot_->budget.store(RetryBudget::Make(0, NsToMs32(now_)));
    const uint64_t first_before = Counter(kFirstAttempts);
    slot_->mode.store(uint32_t(mode));
    Permit first, retry;
    const Decision d0 = Admit(0, &first);  // refused by the breaker in enforce
    const Decision d1 = Admit(1, &retry);  // breaker, bulkhead and budget all refuse it
    Counts c{Counter(kFirstAttempts) - first_before, Counter(kRetriesGranted),
             Counter(kShadowWouldReject),
             Counter(kRejectedOpen) + Counter(kRejectedBulkheadFull) + Counter(kRetriesDenied),
             RetryBudget::Tokens(slot_->budget.load())};
    Complete(&first, Outcome::kFailure);
    Complete(&retry, Outcome::kFailure);
    return std::make_pair(std::make_pair(d0, d1), c);
  };
  const auto [enforce_d, enforce] = run(Mode::kEnforce);
  EXPECT_EQ(enforce_d.first, Decision::kRejectedOpen);
  EXPECT_EQ(enforce_d.second, Decision::kRejectedOpen);
  EXPECT_EQ(enforce.rejected, 2u);
  EXPECT_EQ(enforce.would_reject, 0u);
  EXPECT_EQ(enforce.first_attempts, 0u);  // refused attempts never went out

  const auto [shadow_d, shadow] = run(Mode::kShadow);
  EXPECT_EQ(shadow_d.first, Decision::kAdmitted);
  EXPECT_EQ(shadow_d.second, Decision::kAdmitted);
  EXPECT_EQ(shadow.would_reject, enforce.rejected);  // once per refused attempt
  EXPECT_EQ(shadow.rejected, 0u);
  EXPECT_EQ(shadow.first_attempts, 1u);  // it went out: counted, and it deposited ...
  EXPECT_EQ(shadow.retries_granted, 1u);  // ... the token the retry then took
  EXPECT_EQ(shadow.budget_tokens, 0u);
}

TEST_F(AdmissionTest, DisabledRecordsNothingForcedOpenRejectsAll) {
  slot_->mode.store(uint32_t(Mode::kDisabled));
  for (int i = 0; i < 20; ++i) Call(Outcome::kFailure);
  EXPECT_EQ(State(), BreakerState::kClosed);
  EXPECT_EQ(Counter(kFailures), 0u);
  slot_->mode.store(uint32_t(Mode::kForcedOpen));
  Permit p;
  EXPECT_EQ(Admit(0, &p), Decision::kRejectedOpen);
  EXPECT_EQ(Counter(kRejectedOpen), 1u);
}

TEST_F(AdmissionTest, SlowCallsTripTheBreaker) {
  slot_->policy.slow_call_ms.store(200);
  slot_->policy.slow_call_rate_pct.store(60);
  for (int i = 0; i < 10; ++i) {
    Permit p;
    ASSERT_TRUE(IsAdmitted(Admit(0, &p)));
    Complete(&p, Outcome::kSuccess, 300 * kMs);
  }
  EXPECT_EQ(State(), BreakerState::kOpen);
  EXPECT_EQ(Counter(kSlowCalls), 10u);
}

TEST_F(AdmissionTest, TimeGoingBackwardsNeverUnblocksAnOpenBreaker) {
  for (int i = 0; i < 10; ++i) Call(Outcome::kFailure);
  now_ -= 5 * kSec;
  Permit p;
  EXPECT_EQ(Admit(0, &p), Decision::kRejectedOpen);
  EXPECT_EQ(State(), BreakerState::kOpen);
}

TEST_F(AdmissionTest, ResetClosesAndRefills) {
  for (int i = 0; i < 10; ++i) Call(Outcome::kFailure);
  slot_->budget.store(RetryBudget::Make(0, NsToMs32(now_)));
  Reset(*slot_, now_);
  EXPECT_EQ(State(), BreakerState::kClosed);
  EXPECT_EQ(ReadWindow(*slot_, now_).calls, 0u);
  EXPECT_EQ(RetryBudget::Tokens(slot_->budget.load()), uint64_t{Policy{}.retry_burst} * RetryBudget::kTokenScale);
}

TEST_F(AdmissionTest, PermitOfAReassignedSlotIsHarmless) {
  Permit p;
  ASSERT_EQ(Admit(0, &p), Decision::kAdmitted);
  slot_->generation.fetch_add(1);
  Complete(&p, Outcome::kFailure);
  EXPECT_EQ(Counter(kFailures), 0u);
}

// admission.h: Admit with a clock reads it at most once, and not at all for a first attempt on
// a closed breaker.
uint64_t clock_reads = 0;
uint64_t clock_now_ns = 0;
uint64_t CountingClock() {
  ++clock_reads;
  return clock_now_ns;
}

TEST_F(AdmissionTest, TheClockIsReadAtMostOnceAndNeverForAFirstAttemptOnAClosedBreaker) {
  clock_now_ns = now_;
  Permit p;
  clock_reads = 0;
  ASSERT_EQ(shm::Admit(*slot_, index_, 0, &CountingClock, caller_, &p), Decision::kAdmitted);
  EXPECT_EQ(clock_reads, 0u);
  Complete(&p, Outcome::kSuccess);
  clock_reads = 0;
  ASSERT_EQ(shm::Admit(*slot_, index_, 1, &CountingClock, caller_, &p), Decision::kAdmitted);
  EXPECT_LE(clock_reads, 1u);
  Complete(&p, Outcome::kSuccess);
  while (State() == BreakerState::kClosed) Call(Outcome::kFailure);
  ASSERT_EQ(State(), BreakerState::kOpen);
  for (uint64_t advance : {uint64_t{0}, 2 * kSec}) {  // open, then due to half-open
    clock_now_ns = now_ + advance;
    for (uint32_t attempt : {0u, 1u}) {
      clock_reads = 0;
      shm::Admit(*slot_, index_, attempt, &CountingClock, caller_, &p);
      EXPECT_LE(clock_reads, 1u) << "attempt " << attempt << " at +" << advance / kSec << " s";
      shm::Complete(*slot_, &p, Outcome::kSuccess, kMs, clock_now_ns, caller_);
    }
  }
}

// admission.h: calling Complete twice with one permit is a no-op the second time.
TEST_F(AdmissionTest, CompletingAPermitTwiceIsANoOpTheSecondTime) {
  Permit p;
  ASSERT_EQ(Admit(0, &p), Decision::kAdmitted);
  Complete(&p, Outcome::kFailure);
  const uint64_t failures = Counter(kFailures);
  const WindowStats before = ReadWindow(*slot_, now_);
  Complete(&p, Outcome::kFailure);
  Complete(&p, Outcome::kSuccess);
  EXPECT_EQ(Counter(kFailures), failures);
  EXPECT_EQ(Counter(kSuccesses), 0u);
  EXPECT_EQ(ReadWindow(*slot_, now_).calls, before.calls);

  // A probe completed twice counts one success toward close_after (2), not two.
  while (State() == BreakerState::kClosed) Call(Outcome::kFailure);
  now_ += 2 * kSec;
  Permit probe;
  ASSERT_EQ(Admit(0, &probe), Decision::kAdmittedProbe);
  Complete(&probe, Outcome::kSuccess);
  Complete(&probe, Outcome::kSuccess);
  EXPECT_EQ(State(), BreakerState::kHalfOpen);
  EXPECT_EQ(BreakerWord::Decode(slot_->breaker.load()).successes, 1u);
}

// admission.h: no allocation and no exception on the hot path, on every path it takes (first
// attempts, retries, a trip, the open breaker, probes, the bulkhead, an empty budget) and on a
// slot whose words hold garbage.
TEST_F(AdmissionTest, AdmitAndCompleteNeitherAllocateNorThrow) {
  Policy p;
  p.min_calls = 5;
  p.open_for_ms = 10;
  p.open_jitter_ms = 0;
  p.bulkhead_limit = 2;
  p.retry_burst = 2;
  p.min_retries_per_sec = 0;
  SetUpPolicy(p);
  std::unique_ptr<Segment> scribbled = Segment::CreatePrivate(1, 1, p);
  DependencySlot& junk = *scribbled->dependency(0);
  uint64_t x = 0x9E3779B97F4A7C15ull;
  auto next = [&x] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  auto run = [&] {
    for (int i = 0; i < 20'000; ++i) {
      Permit a, b;
      const Decision d = Admit(uint32_t(i % 3), &a);
      if (IsAdmitted(d) && i % 5 != 0) Admit(1, &b);
      Complete(&a, i % 4 == 0 ? Outcome::kSuccess : Outcome::kFailure, i % 7 == 0 ? kSec : kMs);
      Complete(&b, Outcome::kSuccess);
      if (i % 100 == 0) ReclaimExpired(*slot_, now_, caller_);
      now_ += kMs;
    }
    for (int i = 0; i < 2'000; ++i) {
      auto* words = reinterpret_cast<std::atomic<uint64_t>*>(&junk);
      for (size_t w = 0; w < sizeof(DependencySlot) / 8; ++w) words[w].store(next());
      Permit a;
      shm::Admit(junk, 0, uint32_t(i % 2), now_, caller_, &a);
      shm::Complete(junk, &a, Outcome::kFailure, kSec, now_, caller_);
      ReclaimExpired(junk, now_, caller_);
    }
  };
  count_allocations = true;
  allocations = 0;
  int* volatile probe = new int(1);  // the counter counts, or the check below proves nothing
  delete probe;
  ASSERT_EQ(allocations, 1u);
  allocations = 0;
  EXPECT_NO_THROW(run());
  count_allocations = false;
  EXPECT_EQ(allocations, 0u);
}

}  // namespace
}  // namespace retryd::shm
