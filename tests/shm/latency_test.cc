// The latency histogram (shm/latency.h): each bucket holds the latencies up to its bound, and
// real processes on every CPU, through the client's path (stripes and shared words alike),
// count every call in it exactly: its count is successes + failures + ignored, its sum the
// latencies given. A worker killed mid-call loses at most that call.
#include "shm/latency.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <thread>
#include <atomic>
#include <cstdint>
#include <vector>

#include "shm/admission.h"
#include "shm/breaker.h"
#include "shm/counters.h"
#include "shm/segment.h"
#include "tests/sanitized.h"
#include "tests/shm/test_util.h"

namespace retryd::shm {
namespace {

using testing::kMs;

TEST(LatencyTest, EachBucketHoldsTheLatenciesUpToItsBoundInclusive) {
  EXPECT_EQ(LatencyBucket(0), 0u);
  EXPECT_EQ(LatencyBucket(1), 0u);
  EXPECT_EQ(LatencyBucket(500'000), 0u);
  EXPECT_EQ(LatencyBucket(500'001), 1u);
  for (uint32_t b = 0; b < kLatencyLastBucket; ++b) {
    const uint64_t bound = LatencyBucketBoundNs(b);
    EXPECT_EQ(bound, uint64_t{500'000} << b);
    EXPECT_EQ(LatencyBucket(bound), b) << "a latency equal to the bound is in its bucket";
    EXPECT_EQ(LatencyBucket(bound + 1), b + 1) << "one ns more is in the next";
    if (b > 0) EXPECT_EQ(LatencyBucket(LatencyBucketBoundNs(b - 1) + 1), b);
  }
  EXPECT_EQ(LatencyBucketBoundNs(14), 8'192'000'000u);
  EXPECT_EQ(LatencyBucketBoundNs(kLatencyLastBucket), 0u) << "the last bucket has no bound";
  // Past the last bound, whatever a caller passes (UINT64_MAX for "unknown" included).
  for (uint64_t ns : {uint64_t{8'192'000'001}, uint64_t{3'600} * 1'000'000'000, UINT64_MAX,
                      UINT64_MAX - 1, uint64_t{1} << 63}) {
    EXPECT_EQ(LatencyBucket(ns), kLatencyLastBucket) << ns;
  }
}

TEST(LatencyTest, TheSumIsInMicrosecondsRoundedToTheNearest) {
  EXPECT_EQ(LatencyUs(0), 0u);
  EXPECT_EQ(LatencyUs(499), 0u);
  EXPECT_EQ(LatencyUs(500), 1u);
  EXPECT_EQ(LatencyUs(1'499), 1u);
  EXPECT_EQ(LatencyUs(1'500), 2u);
  EXPECT_EQ(LatencyUs(300'000), 300u);
  EXPECT_EQ(LatencyUs(UINT64_MAX), UINT64_MAX / 1000 + 1) << "615 ns left over round up";
}

TEST(LatencyTest, AQuantileIsTheBoundOfTheBucketHoldingItsRank) {
  LatencyHistogram h;
  EXPECT_EQ(h.Quantile(0.5), 0u) << "no call: no quantile";
  h.buckets[2] = 50;   // <= 2 ms
  h.buckets[5] = 40;   // <= 16 ms
  h.buckets[9] = 9;    // <= 256 ms
  h.buckets[15] = 1;   // > 8.192 s
  EXPECT_EQ(h.Count(), 100u);
  EXPECT_EQ(h.Quantile(0.5), 2 * kMs);
  EXPECT_EQ(h.Quantile(0.51), 16 * kMs);
  EXPECT_EQ(h.Quantile(0.9), 16 * kMs);
  EXPECT_EQ(h.Quantile(0.99), 256 * kMs);
  EXPECT_EQ(h.Quantile(1.0), UINT64_MAX) << "the last bucket's call is over every bound";
}

Policy NeverTrips() {
  Policy p;
  p.window_ms = 3'600'000;
  p.window_buckets = 2;
  p.min_calls = 1'000'000;
  p.retry_ratio_milli = 100;
  p.retry_burst = 10;
  return p;
}

using testing::Cpus;
using testing::ForkWorkers;
using testing::PinTo;

// One latency per bucket and one on each side of a bound: call i of a worker takes
// kLatencies[i % size], with outcome kOutcomes[i % 3].
constexpr std::array<uint64_t, 20> kLatencies = {
    0,           1,           499'999,       500'000,       500'001,
    1'000'000,   1'000'001,   3'000'000,     7'999'999,     16'000'000,
    33'000'000,  64'000'000,  100'000'000,   255'000'000,   512'000'001,
    1'024'000'000, 2'000'000'000, 4'096'000'000, 8'192'000'000, 60'000'000'000};
constexpr std::array<Outcome, 3> kOutcomes = {Outcome::kSuccess, Outcome::kFailure,
                                              Outcome::kIgnored};

// Worker processes on every CPU (two per CPU, so that they preempt each other) complete calls
// of every latency and outcome: successes in their stripes, the rest in the shared words. The
// histogram holds each call once, in its bucket, and the sum is exact.
TEST(LatencyTest, ProcessesOnEveryCpuCountEveryLatencyExactly) {
  testing::NamedSegment seg("latency");
  const uint32_t index = testing::AddDependency(*seg.seg, "orders", NeverTrips());
  DependencySlot& slot = *seg.seg->dependency(index);
  constexpr uint64_t kCalls = 60'000;  // a multiple of 20 and of 3
  const std::vector<pid_t> pids = ForkWorkers([&](int, Caller& caller) {
    for (uint64_t i = 0; i < kCalls; ++i) {
      testing::OnCpu(caller, CurrentCpu());
      Permit p;
      if (!IsAdmitted(Admit(slot, index, 0, &CoarseNowNs, caller, &p))) return 2;
      Complete(slot, &p, kOutcomes[i % 3], kLatencies[i % kLatencies.size()], CoarseNowNs(),
               caller);
    }
    return 0;
  });
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }
  const uint64_t workers = pids.size();
  std::array<uint64_t, kLatencyBuckets> want{};
  uint64_t want_sum = 0;
  for (uint64_t i = 0; i < kCalls; ++i) {
    const uint64_t ns = kLatencies[i % kLatencies.size()];
    want[LatencyBucket(ns)] += workers;
    want_sum += LatencyUs(ns) * workers;
  }
  const LatencyHistogram h = ReadLatency(slot);
  for (uint32_t b = 0; b < kLatencyBuckets; ++b) EXPECT_EQ(h.buckets[b], want[b]) << "bucket " << b;
  EXPECT_EQ(h.sum_us, want_sum);
  EXPECT_EQ(h.Count(), kCalls * workers);
  EXPECT_EQ(h.Count(), ReadCounter(slot, kSuccesses) + ReadCounter(slot, kFailures) +
                           ReadCounter(slot, kIgnored));
  EXPECT_EQ(ReadCounter(slot, kSuccesses), kCalls * workers / 3);
  if (CurrentCpu() != kNoStripe) {
    // The successes went through the stripes: the shared words took only aborted sequences.
    EXPECT_LT(slot.counters[kSuccesses].load(), kCalls * workers / 3 / 100);
  }
}

// Workers killed with SIGKILL at random instants: the histogram keeps every call committed. A
// success on the stripes' path counts in its bucket and its success count with one store, so
// the two never part; its latency is a second store, so a kill between them leaves the sum one
// call short. Off the stripes, the counter and the bucket are two adds: one call apart at most.
TEST(LatencyTest, AWorkerKilledMidCallLosesAtMostThatCall) {
  testing::NamedSegment seg("latency-kill");
  const uint32_t index = testing::AddDependency(*seg.seg, "orders", NeverTrips());
  DependencySlot& slot = *seg.seg->dependency(index);
  constexpr uint64_t kLatency = 3 * kMs;
  auto* started = static_cast<std::atomic<uint64_t>*>(mmap(
      nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  const std::vector<pid_t> pids = ForkWorkers([&](int w, Caller& caller) {
    for (uint64_t i = 0;; ++i) {
      testing::OnCpu(caller, CurrentCpu());
      Permit p;
      Admit(slot, index, 0, &CoarseNowNs, caller, &p);
      Complete(slot, &p, i % 5 == 0 ? Outcome::kFailure : Outcome::kSuccess, kLatency,
               CoarseNowNs(), caller);
      started[w].store(i + 1, std::memory_order_release);
    }
    return 0;
  });
  uint32_t rng = 4242;
  for (size_t w = 0; w < pids.size(); ++w) {
    for (int i = 0; i < 1'000 && started[w].load() == 0; ++i) usleep(10'000);
    usleep(NextRandom(rng) % 20'000);
    kill(pids[w], SIGKILL);
    waitpid(pids[w], nullptr, 0);
  }
  const uint64_t workers = pids.size();
  const LatencyHistogram h = ReadLatency(slot);
  const uint64_t calls = ReadCounter(slot, kSuccesses) + ReadCounter(slot, kFailures);
  ASSERT_GT(calls, workers);
  EXPECT_LE(h.Count(), calls);
  EXPECT_GE(h.Count() + workers, calls);
  EXPECT_EQ(h.buckets[LatencyBucket(kLatency)], h.Count()) << "every call in its one bucket";
  constexpr uint64_t kLatencyUs = kLatency / 1000;
  EXPECT_EQ(h.sum_us % kLatencyUs, 0u);
  EXPECT_LE(h.sum_us / kLatencyUs, h.Count());
  EXPECT_GE(h.sum_us / kLatencyUs + workers, h.Count());
  munmap(started, 4096);
}

// A slot handed from one dependency to another while threads on both CPUs complete the first
// one's calls: the new dependency starts at 0 but for the calls completing at that instant (each
// checked the slot's generation before the reassignment and wrote after the slot was zeroed),
// at most one per thread, in its histogram and its counters alike.
TEST(LatencyTest, ASlotGivenToAnotherDependencyStartsAtZeroButForTheCallsCompletingThen) {
  Policy policy = NeverTrips();
  std::unique_ptr<Segment> seg = Segment::CreatePrivate(1, 8, policy);
  uint32_t index = 0;
  ASSERT_TRUE(seg->PutDependency("old", policy, &index).ok());
  DependencySlot& slot = *seg->dependency(index);
  // The segment has one slot: every name is given this index, which the writers keep a copy of
  // (the main thread's `index` is written by each PutDependency).
  const uint32_t slot_index = index;
  const uint32_t old_generation = slot.generation.load();
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> calls{0};
  constexpr int kWriters = 2;
  std::vector<std::thread> writers;
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&, w] {
      PinTo(w % Cpus());
      Caller caller{0, 0, 12345u + uint32_t(w)};
      while (!stop.load(std::memory_order_relaxed)) {
        // The old dependency's generations have the parity of the first one.
        const uint32_t g = slot.generation.load(std::memory_order_acquire);
        if ((g & 1) != (old_generation & 1) || slot.state.load() != uint32_t(SlotState::kActive)) {
          continue;
        }
        testing::OnCpu(caller, CurrentCpu());
        Permit p;
        AdmitAsBound(slot, slot_index, g, 0, &CoarseNowNs, caller, &p);
        testing::OnCpu(caller, CurrentCpu());
        Complete(slot, &p, calls.load() % 8 ? Outcome::kSuccess : Outcome::kFailure,
                 10 * testing::kSec, CoarseNowNs(), caller);
        calls.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  uint64_t leaked = 0, rounds_leaking = 0;
  constexpr int kRounds = 1'000;
  bool held = true;
  for (int r = 0; r < kRounds && held; ++r) {
    const uint64_t before = calls.load();
    while (calls.load() < before + 4) std::this_thread::yield();  // the old one's calls run
    seg->Retire(index);
    held = seg->PutDependency("new", policy, &index).ok() &&
           (slot.generation.load() & 1) != (old_generation & 1);
    for (volatile int k = 0; k < 20'000; k = k + 1) {
    }
    // Each late call's words land on either side of the zeroing, so the histogram, its sum and
    // the counters each hold at most one call per thread, not always the same ones.
    const LatencyHistogram h = ReadLatency(slot);
    const uint64_t counted = ReadCounter(slot, kSuccesses) + ReadCounter(slot, kFailures);
    const uint64_t summed = h.sum_us / 10'000'000;
    EXPECT_LE(h.Count(), uint64_t{kWriters}) << "round " << r;
    EXPECT_LE(counted, uint64_t{kWriters}) << "round " << r;
    EXPECT_EQ(h.sum_us % 10'000'000, 0u) << "round " << r;
    EXPECT_LE(summed, uint64_t{kWriters}) << "round " << r;
    held = held && h.Count() <= kWriters && counted <= kWriters && summed <= kWriters;
    leaked += h.Count();
    rounds_leaking += h.Count() != 0;
    seg->Retire(index);
    held = held && seg->PutDependency("old", policy, &index).ok();
  }
  stop = true;
  for (std::thread& t : writers) t.join();
  ASSERT_TRUE(held);
  EXPECT_GT(calls.load(), uint64_t{kRounds}) << "the old dependency's calls ran throughout";
  std::printf("%" PRIu64 " calls of the old dependency counted in the new one, in %" PRIu64
              " of %d reassignments\n",
              leaked, rounds_leaking, kRounds);
}

// A stripe's word is written by a sequence on its CPU: a load, then the store that commits it.
// A slot given to another name while a call of the old one is between the two must not get the
// old name's count back from that store, in any word a sequence writes: the counters, the
// histogram and its sum, and the retry budget's deposits (a count written back there would be
// retries the new name never earned). The test above races real sequences; this one makes each
// load before the reassignment and each store after it, every time.
TEST(LatencyTest, ASequenceCommittingAcrossTheSlotsReassignmentCountsOneCallInTheNewName) {
  const Policy policy = NeverTrips();
  std::unique_ptr<Segment> seg = Segment::CreatePrivate(1, 8, policy);
  uint32_t index = 0;
  ASSERT_TRUE(seg->PutDependency("old", policy, &index).ok());
  DependencySlot& slot = *seg->dependency(index);
  Caller caller{0, 0, 7};
  caller.stripe = 0;
  caller.stripe_mode = StripeMode::kAtomic;
  // The budget emptied by retries, so that first attempts deposit in the stripe.
  for (int i = 0; i < 1'000; ++i) {
    Permit p;
    const bool admitted = IsAdmitted(Admit(slot, index, 1, &CoarseNowNs, caller, &p));
    Complete(slot, &p, Outcome::kFailure, 3 * kMs, CoarseNowNs(), caller);
    if (!admitted) break;
  }
  for (int i = 0; i < 1'000; ++i) {
    Permit p;
    ASSERT_TRUE(IsAdmitted(Admit(slot, index, 0, &CoarseNowNs, caller, &p)));
    Complete(slot, &p, Outcome::kSuccess, 3 * kMs, CoarseNowNs(), caller);
  }
  Stripe& st = StripeAt(slot, 0);
  const uint32_t bucket = LatencyBucket(3 * kMs);
  const uint64_t first_attempts = st.first_attempts.load();
  const uint64_t successes = st.successes_by_latency[bucket].load();
  const uint64_t latency_us = st.success_latency_us.load();
  const uint64_t deposits = st.deposits.load();
  ASSERT_GE(first_attempts, 1'000u);
  ASSERT_EQ(successes, 1'000u);
  ASSERT_EQ(latency_us, 3'000'000u);
  ASSERT_GT(PendingDeposits(slot), 0u) << "the old name's deposits wait in the stripe";

  seg->Retire(index);
  ASSERT_TRUE(seg->PutDependency("new", policy, &index).ok());
  ASSERT_EQ(seg->dependency(index), &slot);
  EXPECT_EQ(ReadCounter(slot, kFirstAttempts), 0u);
  EXPECT_EQ(ReadCounter(slot, kSuccesses), 0u);
  EXPECT_EQ(ReadLatency(slot).Count(), 0u);
  EXPECT_EQ(PendingDeposits(slot), 0u);

  // The late call's commits: its load's value plus its own.
  st.first_attempts.store(first_attempts + 1);
  st.successes_by_latency[bucket].store(successes + 1);
  st.success_latency_us.store(latency_us + 3'000);
  st.deposits.store(deposits + 100);
  EXPECT_EQ(ReadCounter(slot, kFirstAttempts), 1u);
  EXPECT_EQ(ReadCounter(slot, kSuccesses), 1u);
  LatencyHistogram h = ReadLatency(slot);
  EXPECT_EQ(h.Count(), 1u);
  EXPECT_EQ(h.buckets[bucket], 1u);
  EXPECT_EQ(h.sum_us, 3'000u);
  EXPECT_EQ(PendingDeposits(slot), 100u) << "one call's deposit, not the old name's";

  // The new name counts on from there, in the stripe and in the shared words.
  Permit p;
  ASSERT_TRUE(IsAdmitted(Admit(slot, index, 0, &CoarseNowNs, caller, &p)));
  Complete(slot, &p, Outcome::kSuccess, 3 * kMs, CoarseNowNs(), caller);
  caller.stripe = kNoStripe;
  ASSERT_TRUE(IsAdmitted(Admit(slot, index, 0, &CoarseNowNs, caller, &p)));
  Complete(slot, &p, Outcome::kFailure, 3 * kMs, CoarseNowNs(), caller);
  EXPECT_EQ(ReadCounter(slot, kFirstAttempts), 3u);
  EXPECT_EQ(ReadCounter(slot, kSuccesses), 2u);
  EXPECT_EQ(ReadCounter(slot, kFailures), 1u);
  h = ReadLatency(slot);
  EXPECT_EQ(h.Count(), 3u);
  EXPECT_EQ(h.sum_us, 9'000u);
}

// The stripes a slot uses are those its first writer saw (its stripe_count), whatever later
// writers see: a process that sees another number of CPUs (in a container) gives the slot to
// another name without changing them, so that the shared words' start, minus the stripes'
// sums, is taken over the stripes readers add. Before, a count shrunk from 8 to 2 left a reader
// between the two stores a first-attempt count of minus 6,000.
TEST(LatencyTest, AWriterSeeingOtherCpusKeepsTheSlotsStripesAndItsCountsStartAtZero) {
  const Policy policy = NeverTrips();
  std::unique_ptr<Segment> seg = Segment::CreatePrivate(1, 8, policy, 8);
  uint32_t index = 0;
  ASSERT_TRUE(seg->PutDependency("a", policy, &index).ok());
  DependencySlot& slot = *seg->dependency(index);
  slot.stripe_count.store(8);  // as a first writer on a host of 8 CPUs left it
  Caller caller{0, 0, 5};
  caller.stripe_mode = StripeMode::kAtomic;
  const auto calls_on_every_stripe = [&] {
    for (uint16_t s = 0; s < 8; ++s) {
      caller.stripe = s;
      for (int i = 0; i < 1'000; ++i) {
        Permit p;
        ASSERT_TRUE(IsAdmitted(Admit(slot, index, 0, &CoarseNowNs, caller, &p)));
        Complete(slot, &p, Outcome::kSuccess, 2 * kMs, CoarseNowNs(), caller);
      }
    }
  };
  calls_on_every_stripe();
  ASSERT_EQ(ReadCounter(slot, kFirstAttempts), 8'000u);
  for (const char* name : {"b", "c"}) {
    seg->Retire(index);
    ASSERT_TRUE(seg->PutDependency(name, policy, &index).ok());
    ASSERT_EQ(seg->dependency(index), &slot);
    EXPECT_EQ(StripeCount(slot), 8u) << name << ": given by a process that sees "
                                     << HostStripes() << " CPUs";
    EXPECT_EQ(ReadCounter(slot, kFirstAttempts), 0u) << name;
    EXPECT_EQ(ReadCounter(slot, kSuccesses), 0u) << name;
    EXPECT_EQ(ReadLatency(slot).Count(), 0u) << name;
    EXPECT_EQ(ReadLatency(slot).sum_us, 0u) << name;
    calls_on_every_stripe();
    EXPECT_EQ(ReadCounter(slot, kFirstAttempts), 8'000u) << name;
    EXPECT_EQ(ReadLatency(slot).Count(), 8'000u) << name;
  }
}

// Readers racing the reassignments, while a thread on each CPU completes the old name's calls
// through the real per-CPU path (a retry in four, so that the budget stays empty and first
// attempts deposit in the stripes): no read is ever below zero (a wrapped count), a read of
// the new name once it is set up holds at most a call per writer, and the new name's budget
// grants no more than its burst and a writer's deposit.
TEST(LatencyTest, ReadersRacingReassignmentsNeverSeeAWrappedOrInheritedCount) {
  Policy policy = NeverTrips();
  policy.retry_burst = 50;
  std::unique_ptr<Segment> seg = Segment::CreatePrivate(1, 8, policy);
  uint32_t index = 0;
  ASSERT_TRUE(seg->PutDependency("old", policy, &index).ok());
  DependencySlot& slot = *seg->dependency(index);
  const uint32_t slot_index = index;
  const uint32_t old_parity = slot.generation.load() & 1;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> calls{0};
  constexpr int kWriters = 2;
  std::vector<std::thread> threads;
  for (int w = 0; w < kWriters; ++w) {
    threads.emplace_back([&, w] {
      PinTo(w % Cpus());
      Caller caller{0, 0, 777u + uint32_t(w)};
      for (uint64_t i = 1; !stop.load(std::memory_order_relaxed);) {
        const uint32_t g = slot.generation.load(std::memory_order_acquire);
        if ((g & 1) != old_parity || slot.state.load() != uint32_t(SlotState::kActive)) continue;
        testing::OnCpu(caller, CurrentCpu());
        Permit p;
        AdmitAsBound(slot, slot_index, g, i++ % 4 == 0 ? 1 : 0, &CoarseNowNs, caller, &p);
        testing::OnCpu(caller, CurrentCpu());
        Complete(slot, &p, Outcome::kSuccess, 2 * kMs, CoarseNowNs(), caller);
        calls.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  std::atomic<uint64_t> wrapped{0}, inherited{0}, new_reads{0};
  threads.emplace_back([&] {
    constexpr uint64_t kWrapped = uint64_t{1} << 62;
    while (!stop.load(std::memory_order_relaxed)) {
      const uint32_t g1 = slot.generation.load(std::memory_order_acquire);
      const uint32_t state = slot.state.load(std::memory_order_acquire);
      const uint64_t first = ReadCounter(slot, kFirstAttempts);
      const uint64_t successes = ReadCounter(slot, kSuccesses);
      const LatencyHistogram h = ReadLatency(slot);
      const uint64_t pending = PendingDeposits(slot);
      const uint32_t g2 = slot.generation.load(std::memory_order_acquire);
      bool below_zero = first >= kWrapped || successes >= kWrapped || h.sum_us >= kWrapped ||
                        pending >= kWrapped;
      for (uint64_t b : h.buckets) below_zero |= b >= kWrapped;
      if (below_zero && wrapped.fetch_add(1) < 5) {
        std::printf("wrapped: first attempts %" PRIu64 ", successes %" PRIu64 ", sum %" PRIu64
                    " us, pending %" PRIu64 "\n", first, successes, h.sum_us, pending);
      }
      if (g1 == g2 && (g1 & 1) != old_parity && state == uint32_t(SlotState::kActive)) {
        new_reads.fetch_add(1, std::memory_order_relaxed);
        if ((first > kWriters || successes > kWriters || h.Count() > kWriters) &&
            inherited.fetch_add(1) < 5) {
          std::printf("inherited: first attempts %" PRIu64 ", successes %" PRIu64
                      ", histogram %" PRIu64 "\n", first, successes, h.Count());
        }
      }
    }
  });
  const int rounds = Rounds(150);
  for (int r = 0; r < rounds; ++r) {
    const uint64_t before = calls.load();
    while (calls.load() < before + 50) std::this_thread::yield();
    seg->Retire(index);
    ASSERT_TRUE(seg->PutDependency("new", policy, &index).ok());
    // The reader reads the new name at least once (or for 20 ms, if the scheduler keeps it out).
    const uint64_t seen = new_reads.load();
    for (const uint64_t until = PreciseNowNs() + 20 * kMs;
         new_reads.load() == seen && PreciseNowNs() < until;) {
      std::this_thread::yield();
    }
    if (r % 10 == 0) {  // retries of the new name, not completed (no histogram entry)
      Caller retrier{0, 0, 99};
      uint32_t granted = 0;
      for (int k = 0; k < 200; ++k) {
        Permit p;
        granted += IsAdmitted(Admit(slot, index, 1, &CoarseNowNs, retrier, &p));
      }
      EXPECT_LE(granted, policy.retry_burst + 1u) << "round " << r;
    }
    seg->Retire(index);
    ASSERT_TRUE(seg->PutDependency("old", policy, &index).ok());
  }
  stop = true;
  for (std::thread& t : threads) t.join();
  std::printf("%" PRIu64 " calls of the old name, %" PRIu64 " reads of the new one set up\n",
              calls.load(), new_reads.load());
  EXPECT_EQ(wrapped.load(), 0u);
  EXPECT_EQ(inherited.load(), 0u);
  EXPECT_GT(new_reads.load(), 0u) << "the reader read the new name set up";
}

// A dependency in the disabled mode records nothing, its latencies included; forced-open
// admits nothing to complete.
TEST(LatencyTest, TheDisabledModeRecordsNoLatency) {
  std::unique_ptr<Segment> seg = Segment::CreatePrivate(1, 8, NeverTrips());
  const uint32_t index = testing::AddDependency(*seg, "orders", NeverTrips());
  DependencySlot& slot = *seg->dependency(index);
  slot.mode.store(uint32_t(Mode::kDisabled));
  Caller caller{2, 0, 9};
  testing::OnCpu(caller, CurrentCpu());
  for (int i = 0; i < 10; ++i) {
    Permit p;
    ASSERT_TRUE(IsAdmitted(Admit(slot, index, 0, &CoarseNowNs, caller, &p)));
    Complete(slot, &p, i % 2 ? Outcome::kSuccess : Outcome::kFailure, 5 * kMs, CoarseNowNs(),
             caller);
  }
  EXPECT_EQ(ReadLatency(slot).Count(), 0u);
  EXPECT_EQ(ReadLatency(slot).sum_us, 0u);
}

}  // namespace
}  // namespace retryd::shm
