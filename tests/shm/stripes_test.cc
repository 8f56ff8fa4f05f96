// The per-CPU stripes (shm/stripes.h): the restartable sequences lose no update however often
// their threads are preempted, real processes on every CPU count exactly, a worker killed
// mid-call loses at most that call, and the folds (window, deposits) give what one shared word
// would. The model test (model_test.cc) drives the stripes from virtual CPUs against the
// reference model; here they run on the real CPUs.
#include "shm/stripes.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "shm/admission.h"
#include "shm/breaker.h"
#include "shm/counters.h"
#include "shm/policy.h"
#include "shm/registry.h"
#include "shm/retry_budget.h"
#include "shm/segment.h"
#include "tests/sanitized.h"
#include "tests/shm/test_util.h"

namespace retryd::shm {
namespace {

using testing::kMs;
using testing::kSec;

// ThreadSanitizer holds a signal until its thread reaches a safe point, never inside a sequence.
#if defined(RETRYD_THREAD_SANITIZER)
constexpr bool kSignalsDeferred = true;
#else
constexpr bool kSignalsDeferred = false;
#endif

using testing::Cpus;
using testing::ForkWorkers;
using testing::PinTo;
using testing::RaceClock;

// Shared memory a forked child writes its figures to.
template <typename T>
T* SharedPage() {
  void* p = mmap(nullptr, sizeof(T), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  return new (p) T();
}

// Interrupter sends a no-op signal to `threads` in a loop until each has counted itself in
// `finished`: a signal delivered in the middle of a restartable sequence aborts it, so the tests
// below meet aborts by the thousand rather than relying on the scheduler's rare preemption at
// that instruction. Each thread blocks the signal before it counts itself, so a signal sent after
// the interrupter's last check stays pending on a thread that discards it when it exits. Join the
// interrupter (Wait), then the threads, then Restore the old handler.
class Interrupter {
 public:
  Interrupter(std::vector<std::thread>& threads, const std::atomic<int>& finished) {
    struct sigaction sa = {};
    sa.sa_handler = [](int) {};
    sigaction(SIGUSR1, &sa, &old_);
    for (auto& t : threads) handles_.push_back(t.native_handle());
    thread_ = std::thread([this, &finished] {
      // A thread that counted itself may have exited: from then on, no signal is sent to any.
      while (finished.load() < int(handles_.size())) {
        for (pthread_t h : handles_) pthread_kill(h, SIGUSR1);
        ++sent_;
      }
    });
  }
  // Wait returns the rounds of signals sent.
  uint64_t Wait() {
    thread_.join();
    return sent_;
  }
  // Restore puts the old handler back: call it once the signalled threads have been joined.
  void Restore() { sigaction(SIGUSR1, &old_, nullptr); }

  // BlockInThisThread blocks the signal in the calling thread: call it before counting the
  // thread in `finished`.
  static void BlockInThisThread() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
  }

 private:
  struct sigaction old_ = {};
  std::vector<pthread_t> handles_;
  uint64_t sent_ = 0;
  std::thread thread_;
};

#define SKIP_WITHOUT_RSEQ() \
  if (CurrentCpu() == kNoStripe) GTEST_SKIP() << "no rseq registered: nothing is striped"

// Hammer runs `op` in kThreadsPerCpu threads pinned to each CPU, under an Interrupter, until
// `aborts` reaches kWantAborts or kMaxSeconds pass, and returns the calls of `op` made. `op()`
// makes one add through a sequence, or returns false when the sequence aborted (the add not
// made): Hammer then counts it in `aborts`, the stand-in for the shared word. About one signal
// in a hundred lands inside a sequence, and a loaded machine runs the interrupter seldom: past
// kMaxSeconds without an abort, Hammer goes on until the first one, for up to kGiveUpSeconds.
constexpr int kThreadsPerCpu = 4;
constexpr uint64_t kWantAborts = 20;
constexpr int kMaxSeconds = 3;
constexpr int kGiveUpSeconds = 60;

template <typename Op>
uint64_t Hammer(Op op, std::atomic<uint64_t>& aborts) {
  std::atomic<bool> stop{false};
  std::atomic<int> finished{0};
  std::atomic<uint64_t> calls{0};
  std::vector<std::thread> threads;
  for (int cpu = 0; cpu < Cpus(); ++cpu) {
    for (int t = 0; t < kThreadsPerCpu; ++t) {
      threads.emplace_back([&, cpu] {
        PinTo(cpu);
        uint64_t n = 0;
        while (!stop.load(std::memory_order_relaxed)) {
          for (int i = 0; i < 1024; ++i, ++n) {
            if (!op()) aborts.fetch_add(1);
          }
        }
        calls.fetch_add(n);
        Interrupter::BlockInThisThread();
        finished.fetch_add(1);
      });
    }
  }
  Interrupter interrupter(threads, finished);
  for (int i = 0; i < kGiveUpSeconds * 100; ++i) {
    const uint64_t seen = aborts.load();
    if (seen >= kWantAborts || (seen > 0 && i >= kMaxSeconds * 100)) break;
    usleep(10'000);
  }
  stop = true;
  interrupter.Wait();
  for (auto& t : threads) t.join();
  interrupter.Restore();
  return calls.load();
}

// Many threads on each CPU add to that CPU's word through the sequence, falling back to a
// shared atomic when it aborts: preemption and signals in the middle of a sequence must neither
// lose an add nor apply one twice.
TEST(StripesTest, ARestartableAddLosesNothingAcrossPreemptionAndSignals) {
  SKIP_WITHOUT_RSEQ();
  Stripe stripes[kMaxStripes] = {};
  std::atomic<uint64_t> fallback{0};
  const uint64_t calls = Hammer(
      [&] {
        const uint16_t c = CurrentCpu();
        return c != kNoStripe && StripeAdd(stripes[c].first_attempts, 1, c, StripeMode::kPerCpu);
      },
      fallback);
  uint64_t total = fallback.load();
  for (const Stripe& s : stripes) total += s.first_attempts.load();
  EXPECT_EQ(total, calls);
  if (!kSignalsDeferred) {
    EXPECT_GT(fallback.load(), 0u) << "no sequence aborted";
  }
}

// The same for the compare-and-store that counts a stripe's window: an increment that read the
// word before another thread of its CPU changed it must find it changed.
TEST(StripesTest, ARestartableCompareAndStoreLosesNothingAcrossPreemptionAndSignals) {
  SKIP_WITHOUT_RSEQ();
  Stripe stripes[kMaxStripes] = {};
  std::atomic<uint64_t> fallback{0};
  const uint64_t calls = Hammer(
      [&] {
        for (;;) {
          const uint16_t c = CurrentCpu();
          if (c == kNoStripe) break;
          const uint64_t w = stripes[c].window.load(std::memory_order_relaxed);
          const int r = StripeCompareStore(stripes[c].window, w, w + 1, c, StripeMode::kPerCpu);
          if (r == 0) return true;
          if (r < 0) break;
        }
        return false;
      },
      fallback);
  uint64_t total = fallback.load();
  for (const Stripe& s : stripes) total += s.window.load();
  EXPECT_EQ(total, calls);
  if (!kSignalsDeferred) {
    EXPECT_GT(fallback.load(), 0u) << "no sequence aborted";
  }
}

Policy LongWindowPolicy() {
  Policy p;
  // Two buckets of 30 minutes: the test's calls are in one period, or in two when it runs across
  // a bucket's edge, and both are in the window; but past 65,535 calls a period's stripe
  // successes reach its bucket rounded (testing::BucketPeriods), so a test that counts the
  // window exactly makes a run across an edge again.
  p.window_ms = 3'600'000;
  p.window_buckets = 2;
  p.min_calls = 1'000'000;  // never trips
  p.retry_ratio_milli = 100;
  p.retry_burst = 10;
  return p;
}

struct Figures {
  std::atomic<uint64_t> done[16];
};

// Worker processes on every CPU (two per CPU, so they preempt each other) admit and complete
// first attempts on one dependency through the client's path: every counter and the window
// count every call exactly, and the stripes did the counting.
TEST(StripesTest, ProcessesOnEveryCpuCountEveryCallExactly) {
  SKIP_WITHOUT_RSEQ();
  // A run across a bucket's edge is made again (testing::BucketPeriods): the window's count is
  // exact within one period.
  const Policy policy = LongWindowPolicy();
  for (int attempt = 1;; ++attempt) {
    const uint64_t start_ns = CoarseNowNs();
    testing::NamedSegment seg("stripes");
    const uint32_t index = testing::AddDependency(*seg.seg, "orders", policy);
    DependencySlot& slot = *seg.seg->dependency(index);
    constexpr uint64_t kCalls = 300'000;
    const std::vector<pid_t> pids = ForkWorkers([&](int, Caller& caller) {
      for (uint64_t i = 0; i < kCalls; ++i) {
        testing::OnCpu(caller, CurrentCpu());
        Permit p;
        if (!IsAdmitted(Admit(slot, index, 0, &CoarseNowNs, caller, &p))) return 2;
        Complete(slot, &p, Outcome::kSuccess, kMs, CoarseNowNs(), caller);
      }
      return 0;
    });
    for (pid_t pid : pids) {
      int status = 0;
      waitpid(pid, &status, 0);
      ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    }
    const uint64_t total = kCalls * uint64_t(pids.size());
    if (testing::BucketPeriods(start_ns, policy.window_ms, policy.window_buckets) > 1 &&
        attempt < 3) {
      std::printf("the run crossed a bucket's edge: again\n");
      continue;
    }
    EXPECT_EQ(ReadCounter(slot, kFirstAttempts), total);
    EXPECT_EQ(ReadCounter(slot, kSuccesses), total);
    EXPECT_EQ(ReadWindow(slot, CoarseNowNs()).calls, total);
    // Nearly all of it through the stripes: the shared words took only the aborted sequences.
    EXPECT_LT(slot.counters[kSuccesses].load(), total / 100);
    break;
  }
}

// PinnedHere pins the calling thread to CPU 0 for its life, then gives it back its CPUs.
struct PinnedHere {
  cpu_set_t was;
  PinnedHere() {
    sched_getaffinity(0, sizeof(was), &was);
    PinTo(0);
  }
  ~PinnedHere() { sched_setaffinity(0, sizeof(was), &was); }
};

// The client's common path (AdmitFirstAttemptOnStripe, then CompleteOnAdmitStripe) counts what
// Admit and Complete count for the same calls: two dependencies of one policy, one driven each
// way through the same mix of outcomes and latencies (every bucket, slow calls, failures,
// ignored), read the same in every counter, the latency histogram, the window, the waiting
// deposits and the budget; and the permits are the same but for kPermitOnStripe.
TEST(StripesTest, TheCommonPathCountsWhatAdmitAndCompleteCount) {
  SKIP_WITHOUT_RSEQ();
  PinnedHere pinned;
  Policy policy = LongWindowPolicy();
  policy.retry_burst = 1'000'000;  // the budget never fills: every first attempt deposits
  policy.slow_call_ms = 3'000;
  std::unique_ptr<Segment> seg = Segment::CreatePrivate(2, 1, policy, HostStripes());
  uint32_t fi = 0, pi = 0;
  ASSERT_TRUE(seg->PutDependency("common", policy, &fi).ok());
  ASSERT_TRUE(seg->PutDependency("plain", policy, &pi).ok());
  DependencySlot& fast = *seg->dependency(fi);
  DependencySlot& plain = *seg->dependency(pi);
  const uint64_t now = 1'000 * kSec;
  for (DependencySlot* d : {&fast, &plain}) d->budget.store(RetryBudget::Make(0, NsToMs32(now)));
  constexpr uint64_t kCalls = 20'000;
  uint64_t common_admits = 0, common_completes = 0;
  for (uint64_t i = 0; i < kCalls; ++i) {
    // Every bucket; one call in four may be slow (over 3 s).
    const uint64_t latency =
        i % 97 == 0 ? 0 : (i * 7'919'000 + i % 1000) % (i % 4 == 0 ? 20 * kSec : 3 * kSec);
    const Outcome outcome =
        i % 13 == 0 ? Outcome::kFailure : i % 17 == 0 ? Outcome::kIgnored : Outcome::kSuccess;
    Caller caller{1, 0, 1};
    caller.OnCpu(CurrentCpu());
    Permit pf, pp;
    if (AdmitFirstAttemptOnStripe(fast, fi, fast.generation.load(), 0, CurrentCpu(), &pf)) {
      ++common_admits;
    } else {
      ASSERT_EQ(Admit(fast, fi, 0, now, caller, &pf), Decision::kAdmitted);
    }
    ASSERT_EQ(Admit(plain, pi, 0, now, caller, &pp), Decision::kAdmitted);
    EXPECT_EQ(pf.flags & ~kPermitOnStripe, pp.flags);
    EXPECT_EQ(pf.decision, pp.decision);
    EXPECT_EQ(pf.generation, pp.generation);
    if (CompletesOnAdmitStripe(pf, outcome) && CompleteOnAdmitStripe(fast, &pf, latency, now)) {
      ++common_completes;
    } else {
      Complete(fast, &pf, outcome, latency, now, caller);
    }
    Complete(plain, &pp, outcome, latency, now, caller);
    EXPECT_EQ(pf.flags & ~kPermitOnStripe, pp.flags);
  }
  EXPECT_GT(common_admits, kCalls * 9 / 10);
  EXPECT_GT(common_completes, kCalls / 2);
  for (uint32_t c = 0; c < kCounterCount; ++c) {
    EXPECT_EQ(ReadCounter(fast, Counter(c)), ReadCounter(plain, Counter(c))) << c;
  }
  const LatencyHistogram hf = ReadLatency(fast), hp = ReadLatency(plain);
  for (uint32_t b = 0; b < kLatencyBuckets; ++b) EXPECT_EQ(hf.buckets[b], hp.buckets[b]) << b;
  EXPECT_EQ(hf.sum_us, hp.sum_us);
  EXPECT_EQ(hf.Count(), kCalls);
  const WindowStats wf = ReadWindow(fast, now), wp = ReadWindow(plain, now);
  EXPECT_EQ(wf.calls, wp.calls);
  EXPECT_EQ(wf.failures, wp.failures);
  EXPECT_EQ(wf.slow, wp.slow);
  EXPECT_GT(PendingDeposits(fast), 0u);
  EXPECT_EQ(PendingDeposits(fast), PendingDeposits(plain));
  EXPECT_EQ(RetryBudget::Tokens(fast.budget.load()), RetryBudget::Tokens(plain.budget.load()));
}

// The common path declines, having written nothing, whatever it does not take: then Admit or
// Complete decides.
TEST(StripesTest, TheCommonPathDeclinesWithoutWritingAnything) {
  SKIP_WITHOUT_RSEQ();
  PinnedHere pinned;
  const uint32_t stripes = HostStripes();
  Policy policy = LongWindowPolicy();
  policy.slow_call_ms = 3'000;
  std::unique_ptr<Segment> seg = Segment::CreatePrivate(1, 1, policy, stripes);
  uint32_t index = 0;
  ASSERT_TRUE(seg->PutDependency("orders", policy, &index).ok());
  DependencySlot& slot = *seg->dependency(index);
  const uint64_t now = 1'000 * kSec;
  const auto bytes = [&] {
    const auto* b = reinterpret_cast<const unsigned char*>(&slot);
    return std::vector<unsigned char>(b, b + SlotStride(stripes));
  };
  const uint32_t gen = slot.generation.load();
  Permit p;
  // The stripe's first write is Admit's (it puts the stripe in the map first).
  std::vector<unsigned char> before = bytes();
  EXPECT_FALSE(AdmitFirstAttemptOnStripe(slot, index, gen, 0, CurrentCpu(), &p));
  EXPECT_EQ(bytes(), before);
  Caller caller{1, 0, 1};
  caller.OnCpu(CurrentCpu());
  ASSERT_EQ(Admit(slot, index, 0, now, caller, &p), Decision::kAdmitted);
  Complete(slot, &p, Outcome::kSuccess, kMs, now, caller);
  before = bytes();
  EXPECT_FALSE(AdmitFirstAttemptOnStripe(slot, index, gen, 1, CurrentCpu(), &p));  // a retry
  EXPECT_FALSE(AdmitFirstAttemptOnStripe(slot, index, gen, 0, kNoStripe, &p));
  EXPECT_EQ(bytes(), before);
  for (Mode m : {Mode::kDisabled, Mode::kForcedOpen}) {
    slot.mode.store(uint32_t(m));
    before = bytes();
    EXPECT_FALSE(AdmitFirstAttemptOnStripe(slot, index, gen, 0, CurrentCpu(), &p));
    EXPECT_EQ(bytes(), before);
  }
  slot.mode.store(uint32_t(Mode::kShadow));
  ASSERT_TRUE(AdmitFirstAttemptOnStripe(slot, index, gen, 0, CurrentCpu(), &p));
  // A permit of the common path, completed in every way the common path does not take.
  const Permit admitted = p;
  const auto declines = [&](Outcome outcome, uint64_t latency, uint64_t at) {
    Permit q = admitted;
    const std::vector<unsigned char> b = bytes();
    const bool declined =
        !CompletesOnAdmitStripe(q, outcome) || !CompleteOnAdmitStripe(slot, &q, latency, at);
    return declined && bytes() == b && q.flags == admitted.flags;
  };
  EXPECT_TRUE(declines(Outcome::kFailure, kMs, now));
  EXPECT_TRUE(declines(Outcome::kIgnored, kMs, now));
  EXPECT_TRUE(declines(Outcome::kSuccess, 60 * kSec, now));      // slow
  EXPECT_TRUE(declines(Outcome::kSuccess, kMs, now + 3'600 * kSec));  // past the stripe's period
  slot.generation.fetch_add(1);  // given to another name
  EXPECT_TRUE(declines(Outcome::kSuccess, kMs, now));
  slot.generation.fetch_sub(1);
  Permit q = admitted;
  q.flags &= uint8_t(~kPermitOnStripe);  // admitted by Admit
  EXPECT_FALSE(CompletesOnAdmitStripe(q, Outcome::kSuccess));
  q = admitted;
  q.cpu = kMaxStripes;  // a scribbled permit
  EXPECT_TRUE(CompletesOnAdmitStripe(q, Outcome::kSuccess));
  EXPECT_FALSE(CompleteOnAdmitStripe(slot, &q, kMs, now));
  // A breaker that is not closed.
  slot.mode.store(uint32_t(Mode::kEnforce));
  const uint64_t closed = slot.breaker.load();
  BreakerWord open = BreakerWord::Decode(closed);
  open.state = BreakerState::kOpen;
  open.time_ms = NsToMs32(now) + 60'000;
  slot.breaker.store(open.Encode());
  EXPECT_FALSE(AdmitFirstAttemptOnStripe(slot, index, gen, 0, CurrentCpu(), &p));
  EXPECT_TRUE(declines(Outcome::kSuccess, kMs, now));
  slot.breaker.store(closed);
  EXPECT_FALSE(declines(Outcome::kSuccess, kMs, now));  // the common path takes it now
  // A bulkhead.
  slot.policy.bulkhead_limit.store(4);
  before = bytes();
  EXPECT_FALSE(AdmitFirstAttemptOnStripe(slot, index, gen, 0, CurrentCpu(), &p));
  EXPECT_EQ(bytes(), before);
}

// A permit that straddles a page boundary (where 2 stack placements in 256 put a caller's) is
// written whole by every way an admit fills it, every word at once and nothing around it: its
// words are 8-byte stores (ClearPermit), none split across the pages. Both pages are mapped
// apart, so that a store running past the permit lands in bytes the test checks. What the split
// stores cost is `BM_Retryd_FirstAttemptPermitAt`'s business (bench/).
TEST(StripesTest, APermitAcrossTwoPagesIsWrittenWholeAndNothingAroundIt) {
  SKIP_WITHOUT_RSEQ();
  PinnedHere pinned;
  std::unique_ptr<Segment> seg = Segment::CreatePrivate(1, 1, LongWindowPolicy(), HostStripes());
  uint32_t index = 0;
  ASSERT_TRUE(seg->PutDependency("orders", LongWindowPolicy(), &index).ok());
  DependencySlot& slot = *seg->dependency(index);
  const uint64_t now = 1'000 * kSec;
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  auto* pages = static_cast<unsigned char*>(
      mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(pages, MAP_FAILED);
  constexpr unsigned char kScribble = 0xA5;
  const auto around_untouched = [&](size_t at) {
    for (size_t i = 0; i < 2 * page; ++i) {
      if ((i < at || i >= at + sizeof(Permit)) && pages[i] != kScribble) return false;
    }
    return true;
  };
  const uint32_t gen = slot.generation.load();
  Caller caller{1, 0, 1};
  caller.OnCpu(CurrentCpu());
  Permit first;  // the stripe's first write, and its first success opens its period
  ASSERT_EQ(Admit(slot, index, 0, now, caller, &first), Decision::kAdmitted);
  Complete(slot, &first, Outcome::kSuccess, kMs, now, caller);
  // Every 8-byte placement of the permit that crosses the boundary, the first word's included.
  for (size_t at = page - sizeof(Permit) + 8; at < page; at += 8) {
    SCOPED_TRACE("permit at page offset " + std::to_string(at));
    memset(pages, kScribble, 2 * page);
    auto* p = reinterpret_cast<Permit*>(pages + at);
    ClearPermit(p);
    EXPECT_EQ(std::vector<unsigned char>(pages + at, pages + at + sizeof(Permit)),
              std::vector<unsigned char>(sizeof(Permit), 0));
    EXPECT_TRUE(around_untouched(at));

    // The common path, into a permit full of another call's bytes.
    memset(pages, kScribble, 2 * page);
    ASSERT_TRUE(AdmitFirstAttemptOnStripe(slot, index, gen, 0, CurrentCpu(), p));
    Permit expected{};
    expected.dependency = index;
    expected.generation = gen;
    expected.cpu = CurrentCpu();
    expected.flags = kPermitActive | kPermitRecord | kPermitOnStripe;
    expected.decision = uint8_t(Decision::kAdmitted);
    EXPECT_EQ(memcmp(p, &expected, sizeof(Permit)), 0);
    EXPECT_TRUE(around_untouched(at));
    ASSERT_TRUE(CompletesOnAdmitStripe(*p, Outcome::kSuccess));
    ASSERT_TRUE(CompleteOnAdmitStripe(slot, p, kMs, now));
    EXPECT_EQ(p->flags, kPermitRecord | kPermitOnStripe);
    EXPECT_TRUE(around_untouched(at));

    // The general path: a retry.
    memset(pages, kScribble, 2 * page);
    ASSERT_EQ(Admit(slot, index, 1, now, caller, p), Decision::kAdmitted);
    EXPECT_EQ(p->dependency, index);
    EXPECT_EQ(p->generation, gen);
    EXPECT_EQ(p->probe_lease, 0u);
    EXPECT_EQ(p->bulkhead_lease, 0u);
    EXPECT_EQ(p->probe_index, 0u);
    EXPECT_EQ(p->bulkhead_index, 0u);
    EXPECT_EQ(p->breaker_seq, 0u);
    EXPECT_EQ(p->cpu, caller.cpu);
    EXPECT_EQ(p->flags, kPermitActive | kPermitRecord);
    EXPECT_TRUE(around_untouched(at));
    Complete(slot, p, Outcome::kSuccess, kMs, now, caller);
    EXPECT_TRUE(around_untouched(at));
  }
  munmap(pages, 2 * page);
}

// The permit of the common path carries the generation its caller checked, not the slot's read
// again: a slot given to another name between the client's check and the admit records no
// outcome of the call (as AdmitAsBound, RebindRaceTest), in the common path or in Complete.
TEST(StripesTest, TheCommonPathsPermitCarriesTheGenerationItsCallerChecked) {
  SKIP_WITHOUT_RSEQ();
  PinnedHere pinned;
  std::unique_ptr<Segment> seg = Segment::CreatePrivate(1, 1, LongWindowPolicy(), HostStripes());
  uint32_t index = 0;
  ASSERT_TRUE(seg->PutDependency("orders", LongWindowPolicy(), &index).ok());
  DependencySlot& slot = *seg->dependency(index);
  const uint64_t now = 1'000 * kSec;
  Caller caller{1, 0, 1};
  caller.OnCpu(CurrentCpu());
  Permit p;
  ASSERT_EQ(Admit(slot, index, 0, now, caller, &p), Decision::kAdmitted);  // the stripe's first
  Complete(slot, &p, Outcome::kSuccess, kMs, now, caller);
  const uint32_t checked = slot.generation.load();
  slot.generation.fetch_add(1);  // given to another name after the check
  ASSERT_TRUE(AdmitFirstAttemptOnStripe(slot, index, checked, 0, CurrentCpu(), &p));
  EXPECT_EQ(p.generation, checked);
  const uint64_t successes = ReadCounter(slot, kSuccesses);
  EXPECT_TRUE(CompletesOnAdmitStripe(p, Outcome::kSuccess));
  EXPECT_FALSE(CompleteOnAdmitStripe(slot, &p, kMs, now));
  Complete(slot, &p, Outcome::kFailure, kMs, now, caller);
  EXPECT_EQ(ReadCounter(slot, kSuccesses), successes);
  EXPECT_EQ(ReadCounter(slot, kFailures), 0u);
  EXPECT_EQ(ReadWindow(slot, now).failures, 0u);
}

// Workers killed with SIGKILL at random instants, mid-call or not: each loses at most the call
// it was in (an admit counted whose completion never came), and nothing it committed.
TEST(StripesTest, AWorkerKilledMidCallLosesAtMostThatCall) {
  SKIP_WITHOUT_RSEQ();
  // A run across a bucket's edge is made again (testing::BucketPeriods): the window's count is
  // exact within one period.
  const Policy policy = LongWindowPolicy();
  for (int attempt = 1;; ++attempt) {
    const uint64_t start_ns = CoarseNowNs();
    testing::NamedSegment seg("stripes-kill");
    const uint32_t index = testing::AddDependency(*seg.seg, "orders", policy);
    DependencySlot& slot = *seg.seg->dependency(index);
    Figures* figures = SharedPage<Figures>();
    const std::vector<pid_t> pids = ForkWorkers([&](int w, Caller& caller) {
      for (;;) {
        testing::OnCpu(caller, CurrentCpu());
        Permit p;
        Admit(slot, index, 0, &CoarseNowNs, caller, &p);
        Complete(slot, &p, Outcome::kSuccess, kMs, CoarseNowNs(), caller);
        figures->done[w].fetch_add(1, std::memory_order_release);
      }
      return 0;
    });
    const int workers = int(pids.size());
    // Each is killed at a random instant once it has completed calls of its own.
    uint32_t rng = 12345;
    for (int w = 0; w < workers; ++w) {
      for (int i = 0; i < 1'000 && figures->done[w].load() == 0; ++i) usleep(10'000);
      usleep(NextRandom(rng) % 30'000);
      kill(pids[size_t(w)], SIGKILL);
      waitpid(pids[size_t(w)], nullptr, 0);
    }
    uint64_t done = 0;
    for (int w = 0; w < workers; ++w) done += figures->done[w].load();
    if (testing::BucketPeriods(start_ns, policy.window_ms, policy.window_buckets) > 1 &&
        attempt < 3) {
      std::printf("the run crossed a bucket's edge after %llu calls: again\n",
                  (unsigned long long)done);
      munmap(figures, sizeof(Figures));
      continue;
    }
    ASSERT_GT(done, 0u);
    // A worker dies after its completion and before its own count, or between admit and complete.
    const uint64_t first = ReadCounter(slot, kFirstAttempts);
    const uint64_t successes = ReadCounter(slot, kSuccesses);
    EXPECT_GE(first, done);
    EXPECT_LE(first, done + uint64_t(workers));
    EXPECT_GE(successes + uint64_t(workers), first);
    EXPECT_LE(successes, first);
    // A worker killed between its window's count and its success counter's leaves one more in the
    // window (a period's hand-over would lose one period, but the run stayed within one).
    const uint64_t window = ReadWindow(slot, CoarseNowNs()).calls;
    EXPECT_GE(window, successes);
    EXPECT_LE(window, successes + uint64_t(workers));
    munmap(figures, sizeof(Figures));
    break;
  }
}

class StripeFoldTest : public ::testing::Test {
 protected:
  StripeFoldTest() {
    seg_ = Segment::CreatePrivate(1, 8, policy_, testing::StripesFor(4));
    index_ = testing::AddDependency(*seg_, "orders", policy_);
    slot_ = seg_->dependency(index_);
  }
  // The caller on virtual CPU `cpu`: one per CPU, kept across calls as a thread keeps its own
  // (its random state draws the open periods' jitter and a scaled bucket's rounding).
  Caller& On(uint16_t cpu) {
    Caller& c = callers_[cpu % 5];
    if (c.rng == 0) c = Caller{2, 0, 99u + cpu};
    testing::OnCpu(c, cpu);
    c.stripe_mode = StripeMode::kAtomic;
    return c;
  }
  void Call(uint16_t cpu, uint64_t now_ns, Outcome outcome, uint32_t attempt = 0) {
    Caller& c = On(cpu);
    Permit p;
    Admit(*slot_, index_, attempt, now_ns, c, &p);
    Complete(*slot_, &p, outcome, kMs, now_ns, c);
  }

  Policy policy_ = [] {
    Policy p;
    p.window_ms = 10'000;
    p.window_buckets = 10;
    p.min_calls = 20;
    p.failure_rate_pct = 50;
    p.retry_ratio_milli = 100;
    p.retry_burst = 2;
    p.min_retries_per_sec = 0;
    return p;
  }();
  std::unique_ptr<Segment> seg_;
  uint32_t index_ = 0;
  DependencySlot* slot_ = nullptr;
  Caller callers_[5] = {};
};

// A stripe holds its newest period; the first success of the next one hands the count to the
// shared bucket of its period, and the window reads the same before and after.
TEST_F(StripeFoldTest, TheNextPeriodHandsTheStripesCountToItsBucket) {
  const uint64_t t0 = 1'000 * kSec;
  for (int i = 0; i < 7; ++i) Call(0, t0 + 10 * kMs, Outcome::kSuccess);
  for (int i = 0; i < 5; ++i) Call(1, t0 + 20 * kMs, Outcome::kSuccess);
  EXPECT_EQ(StripeWindow::Count(testing::StripeOfCpu(*slot_, 0).window.load()), 7u);
  EXPECT_EQ(ReadWindow(*slot_, t0 + 500 * kMs).calls, 12u);
  const uint64_t t1 = t0 + 1'200 * kMs;  // the next 1 s bucket
  Call(0, t1, Outcome::kSuccess);
  EXPECT_EQ(StripeWindow::Count(testing::StripeOfCpu(*slot_, 0).window.load()), 1u);
  EXPECT_EQ(Bucket::Calls(slot_->buckets[(t0 / kSec) % 10].load()), 7u);
  EXPECT_EQ(ReadWindow(*slot_, t1).calls, 13u);
  // A window later, all of it is gone, from the buckets and the stripes alike.
  EXPECT_EQ(ReadWindow(*slot_, t1 + 10 * kSec).calls, 0u);
}

// The trip decision folds the stripes: 10 successes on three CPUs and 10 failures trip at the
// 20th call (50 %), not before; 11 successes and 9 failures do not.
TEST_F(StripeFoldTest, ATripCountsTheSuccessesOfEveryStripe) {
  const uint64_t t0 = 2'000 * kSec;
  for (int i = 0; i < 10; ++i) Call(uint16_t(i % 3), t0 + uint64_t(i) * kMs, Outcome::kSuccess);
  for (int i = 0; i < 9; ++i) Call(3, t0 + 20 * kMs, Outcome::kFailure);
  EXPECT_EQ(BreakerWord::Decode(slot_->breaker.load()).state, BreakerState::kClosed);
  Call(3, t0 + 21 * kMs, Outcome::kFailure);
  EXPECT_EQ(BreakerWord::Decode(slot_->breaker.load()).state, BreakerState::kOpen);
}

// A stripe full in a period (16.7 M successes there on one CPU) hands its count to the shared
// bucket and counts on: the window counts every call, so failures at 1 % of them never read as
// more (they read 5 % and tripped once the stripe counted no more and the bucket counted the
// failures past 65,535 calls).
TEST_F(StripeFoldTest, AFullStripeSendsItsSuccessesToTheSharedBucket) {
  const uint64_t t0 = 5'000 * kSec;
  Call(0, t0, Outcome::kSuccess);
  Stripe& st = testing::StripeOfCpu(*slot_, 0);
  const uint64_t w = st.window.load();
  st.window.store(StripeWindow::Make(StripeWindow::End40(w), StripeWindow::kStripeWindowMax));
  for (int i = 0; i < 1'000'000; ++i) {
    Call(0, t0 + kMs, i % 100 == 0 ? Outcome::kFailure : Outcome::kSuccess);
  }
  EXPECT_NEAR(double(StripeWindow::Count(st.window.load())), 990'000, 10);
  const WindowStats read = ReadWindow(*slot_, t0 + kMs);
  EXPECT_NEAR(double(read.calls), 17'777'215, 17'777'215 * 0.001);
  // Past the bucket's 65,535 calls a failure counts as a whole unit (here 512 calls) with the
  // matching probability: the count is unbiased, and the rate within a few hundredths of a
  // percentage point.
  EXPECT_NEAR(double(read.failures) / double(read.calls), 10'000.0 / 17'777'215, 0.0005);
  EXPECT_EQ(BreakerWord::Decode(slot_->breaker.load()).state, BreakerState::kClosed);
}

// A reload that changes the window's shape races a call that read the old shape: the call's
// head, stamped at a period start of the old shape that is none of the new, must not blind the
// new window (rounded up to the next hour's period, it dropped every call until then: 5,000
// straight failures did not trip the breaker).
TEST_F(StripeFoldTest, AHeadStampedUnderTheOldShapeDoesNotBlindTheNewWindow) {
  const uint64_t t0 = 7'261 * kSec;  // a 1 s period start, not an hour's
  Policy hour = policy_;
  hour.window_ms = 3'600'000;
  hour.window_buckets = 1;
  testing::AddDependency(*seg_, "orders", hour);  // the reload: the window starts anew
  // The racing call's head CAS lands after the reload, with its old-shape stamp.
  slot_->window_head.store(WindowHead::Make(t0 / kMs, 1u << 1));
  for (int i = 0; i < 5'000; ++i) Call(uint16_t(i % 4), t0 + 500 * kMs, Outcome::kFailure);
  EXPECT_EQ(BreakerWord::Decode(slot_->breaker.load()).state, BreakerState::kOpen);
}

// More than 65,535 calls in one bucket period: the failures go to the shared bucket at once, the
// stripes' successes in one lump when the next period begins. The bucket scales down as a whole
// when the lump does not fit, so the period reads 1 failure in 6 after the hand-over as before
// it, and a 50 % breaker stays closed (a bucket that kept its failures and dropped the lump read
// 40,000 failures in 65,535 calls, 61 %, and tripped).
TEST_F(StripeFoldTest, AHandOverPast65535CallsKeepsThePeriodsRate) {
  const uint64_t t0 = 6'000 * kSec;
  for (int i = 0; i < 240'000; ++i) {
    Call(uint16_t(i % 4), t0 + uint64_t(i % 900) * kMs,
         i % 6 == 0 ? Outcome::kFailure : Outcome::kSuccess);
  }
  auto rate = [](const WindowStats& w) { return double(w.failures) / double(w.calls); };
  const WindowStats during = ReadWindow(*slot_, t0 + 950 * kMs);
  EXPECT_EQ(during.calls, 240'000u);
  EXPECT_EQ(during.failures, 40'000u);
  // The next period: one success per stripe hands its lump over, then failures arrive, each a
  // trip check.
  const uint64_t t1 = t0 + 1'100 * kMs;
  for (uint16_t cpu = 0; cpu < 4; ++cpu) Call(cpu, t1, Outcome::kSuccess);
  const WindowStats after = ReadWindow(*slot_, t1);
  EXPECT_NEAR(double(after.calls), 240'004, 240'004 * 0.001);
  EXPECT_NEAR(rate(after), 1.0 / 6, 0.001) << after.failures << "/" << after.calls;
  for (int i = 0; i < 20; ++i) Call(uint16_t(i % 4), t1, Outcome::kFailure);
  EXPECT_EQ(BreakerWord::Decode(slot_->breaker.load()).state, BreakerState::kClosed);
  // Past 65,535 calls one by one, too: the rate stays that of every call.
  const uint64_t t2 = t0 + 3'000 * kMs;
  for (int i = 0; i < 300'000; ++i) Call(3, t2, i % 4 == 0 ? Outcome::kFailure : Outcome::kIgnored);
  Caller& c = On(4);
  c.stripe = kNoStripe;  // a thread without a stripe: every call to the shared bucket
  for (int i = 0; i < 300'000; ++i) {
    Permit p;
    Admit(*slot_, index_, 0, t2, c, &p);
    Complete(*slot_, &p, i % 4 == 0 ? Outcome::kFailure : Outcome::kSuccess, kMs, t2, c);
  }
  // With the periods before it in the window: 615,024 calls, 190,020 failures.
  const WindowStats direct = ReadWindow(*slot_, t2);
  EXPECT_NEAR(double(direct.calls), 615'024, 615'024 * 0.01);
  EXPECT_NEAR(rate(direct), 190'020.0 / 615'024, 0.005) << direct.failures << "/" << direct.calls;
}

// A reload from one long bucket to short ones: the stripes held the successes of a 600 s period,
// which is no period of the new shape. The window starts anew with the new shape, and the
// successes that follow count in it: 25 failures in 1,000 calls (2.5 %) do not trip it (they did
// when the stripes went on counting in the old period, which the window read as the future).
TEST_F(StripeFoldTest, AReloadThatShortensTheBucketKeepsCountingSuccesses) {
  Policy long_window = policy_;
  long_window.window_ms = 600'000;
  long_window.window_buckets = 1;
  testing::AddDependency(*seg_, "orders", long_window);
  const uint64_t t0 = 7'200 * kSec;  // a 600 s period starts here
  for (int i = 0; i < 400; ++i) Call(uint16_t(i % 4), t0 + uint64_t(i) * kMs, Outcome::kSuccess);
  EXPECT_EQ(ReadWindow(*slot_, t0 + kSec).calls, 400u);
  Policy short_window = policy_;                          // 10 s in 10 buckets
  testing::AddDependency(*seg_, "orders", short_window);  // the daemon's reload
  EXPECT_EQ(ReadWindow(*slot_, t0 + kSec).calls, 0u) << "the window starts anew";
  const uint64_t t1 = t0 + 2 * kSec;
  for (int i = 0; i < 1'000; ++i) {
    Call(uint16_t(i % 4), t1 + uint64_t(i) * kMs,
         i % 40 == 39 ? Outcome::kFailure : Outcome::kSuccess);
  }
  const WindowStats w = ReadWindow(*slot_, t1 + 1'000 * kMs);
  EXPECT_EQ(w.failures, 25u);
  EXPECT_EQ(w.calls, 1'000u);
  EXPECT_EQ(BreakerWord::Decode(slot_->breaker.load()).state, BreakerState::kClosed);
  // And back to the long bucket: the same.
  testing::AddDependency(*seg_, "orders", long_window);
  for (int i = 0; i < 1'000; ++i) {
    Call(uint16_t(i % 4), t1 + 2 * kSec + uint64_t(i) * kMs,
         i % 40 == 39 ? Outcome::kFailure : Outcome::kSuccess);
  }
  EXPECT_EQ(ReadWindow(*slot_, t1 + 3 * kSec).calls, 1'000u);
  EXPECT_EQ(BreakerWord::Decode(slot_->breaker.load()).state, BreakerState::kClosed);
}

// Deposits wait in the stripes; a retry folds them first, so it finds every deposit made, each
// taken once, and no more than the burst.
// A reload that changes the window's shape (600 s / 10 buckets to 10 s / 10) races a stripe's
// first success of a period, which read the old shape: that success must not leave a period of
// the old shape in the stripe, which the new window would read as a later one and skip, with
// every success the stripe counts in it, so that 1 % failures trip a 50 % breaker. One thread
// starts a new stripe period at every call; another reloads once, at a different moment in each
// of 300 trials.
TEST(StripesTest, AReloadRacingAStripesFirstSuccessNeverHidesItsSuccesses) {
  testing::NamedSegment seg("reloadrace", 4, 8);
  Policy wide;
  wide.min_calls = 20;
  wide.failure_rate_pct = 50;
  wide.window_ms = 600'000;
  wide.window_buckets = 10;
  wide.open_for_ms = 60'000;
  wide.open_for_max_ms = 60'000;
  wide.retry_burst = 1000;
  Policy narrow = wide;
  narrow.window_ms = 10'000;
  const uint32_t index = testing::AddDependency(*seg.seg, "dep", wide);
  DependencySlot& slot = *seg.seg->dependency(index);
  int stale = 0, tripped = 0;
  uint64_t base = uint64_t{1} << 42;
  for (int trial = 0; trial < 300; ++trial) {
    base += 3'600 * kSec;
    StorePolicyOf(slot, wide);
    Reset(slot, base);
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> last_now{0};
    std::thread writer([&] {
      Caller c{1, 0, 4242, 0, StripeMode::kAtomic};
      testing::OnCpu(c, 0);
      for (uint64_t now = base; !stop.load(std::memory_order_relaxed);) {
        now += 60 * kSec + 7 * kMs;  // a new period of the old shape at every call
        Permit p;
        Admit(slot, index, 0, now, c, &p);
        Complete(slot, &p, Outcome::kSuccess, 0, now, c);
        last_now.store(now);
      }
    });
    while (last_now.load() == 0) std::this_thread::yield();
    for (int spin = 0; spin < (trial * 7919) % 3000; ++spin) asm volatile("" ::: "memory");
    StorePolicyOf(slot, narrow);  // the daemon's reload
    stop.store(true);
    writer.join();
    const uint64_t w = testing::StripeOfCpu(slot, 0).window.load();
    const uint64_t start = testing::StripeOfCpu(slot, 0).window_start.load();
    stale += w != 0 && start != ~uint64_t{0} &&
             StripeWindow::End40(w) - (start & StripeWindow::kEndMask) > 1'000;
    // Healthy traffic under the new shape: 1 % failures, on both stripes.
    Caller ok{1, 0, 99, 0, StripeMode::kAtomic}, bad{1, 0, 77, 1, StripeMode::kAtomic};
    testing::OnCpu(ok, 0);
    testing::OnCpu(bad, 1);
    uint64_t now = last_now.load() + kMs;
    for (int i = 0; i < 2'020; ++i) {
      now += 100'000;
      const bool fail = i % 101 == 100;
      Permit p;
      if (Admit(slot, index, 0, now, fail ? bad : ok, &p) == Decision::kRejectedOpen) break;
      Complete(slot, &p, fail ? Outcome::kFailure : Outcome::kSuccess, 0, now, fail ? bad : ok);
    }
    tripped += BreakerWord::Decode(slot.breaker.load()).state != BreakerState::kClosed;
  }
  EXPECT_EQ(stale, 0) << "trials that left a period of the old shape in the stripe";
  EXPECT_EQ(tripped, 0) << "trials where 1 % failures tripped a 50 % breaker";
}

// Two worker processes call flat out through their CPUs' stripes on the real clock, 1 % of the
// calls failing against a 50 % threshold, while a third reloads the policy every 5 ms through
// four window shapes. A trip check racing a reload's StartWindowAnew read the old buckets'
// failures after the stripes' successes were gone, and tripped the healthy dependency (4 runs
// of 6 of 15 s); a reload now empties the buckets first, and a read that sees the head move
// reads again. With a thousand stripes to empty (the run with the stripes of CPU 1,000 and up),
// the successes a stripe counted while the reload went through the others were emptied with it
// while the failures of the same moment stayed in the new buckets (1 run in 6 tripped beside a
// CPU hog): a reload now puts every stripe's period out of reach before it empties anything.
TEST(StripesTest, AHealthyDependencyNeverTripsWhileReloadsChangeTheWindowsShape) {
  testing::NamedSegment seg("healthyreload", 4, 64);
  Policy p;
  p.min_calls = 20;
  p.failure_rate_pct = 50;
  p.open_for_ms = 1'000;
  const uint32_t index = testing::AddDependency(*seg.seg, "dep", p);
  DependencySlot& slot = *seg.seg->dependency(index);
  auto* stop = static_cast<std::atomic<int>*>(
      mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  std::vector<pid_t> kids;
  for (int w = 0; w < 2; ++w) {
    const pid_t kid = fork();
    if (kid == 0) {
      Caller c{RegisterProcess(*seg.seg, getpid()), 0, uint32_t(777 + w)};
      for (uint64_t n = 1; !stop->load(std::memory_order_relaxed); ++n) {
        testing::OnCpu(c, CurrentCpu());
        Permit permit;
        Admit(slot, index, 0, CoarseNowNs(), c, &permit);
        Complete(slot, &permit, n % 100 == 0 ? Outcome::kFailure : Outcome::kSuccess, 0,
                 CoarseNowNs(), c);
      }
      _exit(0);
    }
    kids.push_back(kid);
  }
  const struct {
    uint32_t window_ms, buckets;
  } shapes[] = {{10'000, 10}, {1'000, 5}, {600, 3}, {2'000, 10}};
  const RaceClock race(StressNs(3 * kSec));
  for (int k = 0; race.GoesOn(ReadCounter(slot, kFirstAttempts) > 10'000); ++k) {
    usleep(5'000);
    Policy q = p;
    q.window_ms = shapes[k % 4].window_ms;
    q.window_buckets = shapes[k % 4].buckets;
    StorePolicyOf(slot, q);
  }
  stop->store(1);
  for (const pid_t kid : kids) waitpid(kid, nullptr, 0);
  munmap(stop, 4096);
  EXPECT_GT(ReadCounter(slot, kFirstAttempts), 10'000u);
  EXPECT_EQ(slot.counters[kOpened].load(), 0u) << "1 % failures tripped a 50 % breaker";
}

// What a test does where a window read or a full stripe's handover may be stopped
// (window_internal::g_read_pause), as other processes would while the scheduler stops it: each
// action runs once, and the calls an action makes do not pause.
class WindowPauses {
 public:
  ~WindowPauses() { window_internal::g_read_pause.store(nullptr); }
  std::function<void()>& at(WindowReadPause p) { return at_[int(p)]; }
  void Arm() {
    self_ = this;
    window_internal::g_read_pause.store([](WindowReadPause p) {
      if (pausing_) return;
      std::function<void()> f;
      std::swap(f, self_->at_[int(p)]);
      pausing_ = true;
      if (f) f();
      pausing_ = false;
    });
  }

 private:
  static inline WindowPauses* self_ = nullptr;
  static inline bool pausing_ = false;
  std::function<void()> at_[4];
};

// The reload stopped halfway, as above, in every pair of ten shapes (periods from 50 ms to an
// hour, 1 to 10 buckets) and at ten offsets into the old shape's period, with and without a
// close (an operator's reset) just before: a stripe's period of the old shape need not end on a
// period's edge of the new, and was then read one period early and dropped (by the window of one
// bucket, or by the close's floor). 219 and 346 of the 900 cases each tripped before.
class StoppedReloadTest : public ::testing::Test {
 protected:
  struct Shape {
    uint32_t window_ms, buckets;
  };
  static constexpr Shape kShapes[] = {{10'000, 10}, {1'000, 5}, {600, 3},    {2'000, 10},
                                      {1'000, 1},   {100, 2},   {60'000, 1}, {3'600'000, 1},
                                      {3'000, 4},   {700, 7}};
  void Make(Shape from, uint32_t stripes = 2) {
    p_.window_ms = from.window_ms;
    p_.window_buckets = from.buckets;
    p_.min_calls = 20;
    p_.failure_rate_pct = 50;
    stripes_ = stripes;
    seg_ = Segment::CreatePrivate(1, 8, p_, testing::StripesFor(stripes));
    slot_ = seg_->dependency(testing::AddDependency(*seg_, "orders", p_));
  }
  // n calls, `gap` ns apart, round-robin over the stripes; every 100th fails (every one with
  // `outage`).
  void Calls(int n, uint64_t gap = 10'000, bool outage = false) {
    for (int i = 1; i <= n; ++i, now_ += gap) {
      RecordOutcome(*slot_, now_, outage || i % 100 == 0, false, rng_,
                    uint16_t(testing::StripeBase() + i % stripes_), StripeMode::kAtomic);
    }
  }
  void StoreShape(Shape to) {  // the reload's first step; its daemon stopped there
    Policy q = p_;
    q.window_ms = to.window_ms;
    q.window_buckets = to.buckets;
    StorePolicy(q, slot_->policy);
  }
  uint64_t Opened() const { return slot_->counters[kOpened].load(); }
  // Calls failing, 1 ms apart, from now until the breaker opens (or `limit`): how long, in ms.
  uint64_t MsToTrip(uint64_t limit) {
    const uint64_t start = now_, opened = Opened();
    while (Opened() == opened && now_ < start + limit) Calls(1, kMs, true);
    return (now_ - start) / kMs;
  }
  static std::string Name(Shape s) {
    return std::to_string(s.window_ms) + " ms in " + std::to_string(s.buckets);
  }

  Policy p_;
  uint32_t stripes_ = 2;
  std::unique_ptr<Segment> seg_;
  DependencySlot* slot_ = nullptr;
  uint32_t rng_ = 7;
  uint64_t now_ = 0;
};

// A reload that changes the window's shape stores the new policy, then starts the window anew
// (StorePolicyOf). A daemon the scheduler stops between the two steps leaves writers and readers
// with the new shape over the old window: successes still counted in a stripe's period of the
// old shape, which a reader of the new shape did not find in its window, and failures in a
// shared bucket of the new shape, which it did. One thread, a virtual clock: 1 % failures before
// the reload, then with the reload stopped halfway, then after it; every change of shape that
// AHealthyDependencyNeverTripsWhileReloadsChangeTheWindowsShape makes, each way.
TEST_F(StoppedReloadTest, AReloadStoppedBetweenTheShapeAndTheWindowNeverTripsAHealthyDependency) {
  const Shape shapes[] = {{10'000, 10}, {1'000, 5}, {600, 3}, {2'000, 10}, {1'000, 1}};
  for (const Shape& from : shapes) {
    for (const Shape& to : shapes) {
      if (&from == &to) continue;
      SCOPED_TRACE(Name(from) + " to " + Name(to));
      Make(from);
      now_ = 5'000 * kSec + 100 * kMs;
      Calls(10'000);  // 100 ms, 1 % failures, on two stripes
      StoreShape(to);
      Calls(30'000);
      EXPECT_EQ(Opened(), 0u) << "1 % failures tripped a 50 % breaker";
      StartWindowAnew(*slot_);  // the daemon runs again
      Calls(10'000);
      EXPECT_EQ(Opened(), 0u) << "1 % failures tripped a 50 % breaker";
    }
  }
}

TEST_F(StoppedReloadTest, AHealthyDependencyNeverTripsAtAnyOffsetOrAfterAClose) {
  const uint64_t offsets_ms[] = {0, 1, 50, 100, 150, 199, 250, 333, 500, 999};
  int tripped = 0;
  for (const bool close : {false, true}) {
    for (const Shape& from : kShapes) {
      for (const Shape& to : kShapes) {
        if (&from == &to) continue;
        // Under a sanitizer, every third offset (tests/sanitized.h).
        for (size_t k = 0; k < std::size(offsets_ms); k += kSanitizedBuild ? 3 : 1) {
          Make(from);
          now_ = 5'000 * kSec + 100 * kMs;
          Calls(10'000);  // 100 ms
          now_ += offsets_ms[k] * kMs;
          if (close) Reset(*slot_, now_);
          Calls(1'000);
          StoreShape(to);
          Calls(30'000);  // 300 ms with the reload stopped
          const bool stopped = Opened() != 0;
          StartWindowAnew(*slot_);
          Calls(10'000);
          if (Opened() != 0 && ++tripped <= 5) {
            ADD_FAILURE() << Name(from) << " to " << Name(to) << ", " << offsets_ms[k]
                          << " ms into the old period" << (close ? " after a close" : "")
                          << ": tripped " << (stopped ? "with the reload stopped" : "after it");
          }
        }
      }
    }
  }
  EXPECT_EQ(tripped, 0);
}

// An outage in the stopped state still trips the breaker within about one window of the new
// shape, however long the old period and however many successes it held: the first failure's
// read finds the two shapes mixed and starts the window anew for the stopped reload (before,
// 5 s of successes in an hour's period held a total outage closed for the rest of the hour).
TEST_F(StoppedReloadTest, AnOutageStillTripsWithinAWindowOfTheNewShape) {
  const struct {
    Shape from, to;
    uint64_t healthy_ms;
  } cases[] = {{{3'600'000, 1}, {1'000, 5}, 600'000},
               {{3'600'000, 1}, {1'000, 5}, 5'000},
               {{3'600'000, 1}, {10'000, 10}, 600'000},
               {{60'000, 1}, {1'000, 5}, 10'000},
               {{10'000, 10}, {600, 3}, 500}};
  for (const auto& c : cases) {
    SCOPED_TRACE(Name(c.from) + " to " + Name(c.to) + " after " + std::to_string(c.healthy_ms) +
                 " ms healthy");
    Make(c.from);
    now_ = 7'200 * kSec;  // an hour's start: every old period starts here
    Calls(int(c.healthy_ms), kMs);
    StoreShape(c.to);
    EXPECT_TRUE(ReadWindow(*slot_, now_).mixed_shapes);
    EXPECT_LE(MsToTrip(3'600 * kSec), 2 * uint64_t{c.to.window_ms});
  }
}

// A full stripe's count on its way to its bucket (the success that found it full stopped between
// its take and its add) in the stopped state: the count is of the stripe's own period, which
// holds now, and counts.
TEST_F(StoppedReloadTest, AFullStripesCountOnItsWayStillCounts) {
  Make({3'600'000, 1}, 1);
  now_ = 7'200 * kSec;
  Calls(100'000, 100'000);  // 10 s
  StoreShape({1'000, 5});
  Calls(20'000, 100'000);  // 2 s
  Stripe& st = testing::StripeOfCpu(*slot_, 0);
  const uint64_t full =
      StripeWindow::Make(StripeWindow::End40(st.window.load()), StripeWindow::kStripeWindowMax);
  st.window.store(full);
  st.handing.store(full);  // BeginHandover
  st.handovers.fetch_add(1);
  st.window.store(StripeWindow::Make(StripeWindow::End40(full), 1));  // the take; no add yet
  RecordOutcome(*slot_, now_, true, false, rng_, 0, StripeMode::kAtomic);
  EXPECT_EQ(Opened(), 0u) << "1 % failures tripped a 50 % breaker";
}

// A close in the stopped state (a probe's success) handed the stripes' period of the old shape,
// which holds now, to a bucket of the new shape in the future and moved the window's head there:
// a 1 s window then counted nothing for 56 s of a total outage. That period is the close's own,
// and its successes are dropped with it.
TEST_F(StoppedReloadTest, ACloseInTheStoppedStateLeavesTheWindowSeeing) {
  Make({600'000, 10});  // periods of 60 s
  now_ = 7'200 * kSec;
  Calls(200, kMs / 2);
  StoreShape({1'000, 5});
  ASSERT_LT(MsToTrip(60 * kSec), 5'000u);
  now_ += 2 * kSec;
  ASSERT_TRUE(ApplyBreakerEvent(*slot_, BreakerEvent::kOpenPeriodOver, now_, 0, rng_));
  const uint16_t seq = BreakerWord::Decode(slot_->breaker.load()).seq;
  for (int i = 0; i < 3; ++i) {
    ApplyBreakerEvent(*slot_, BreakerEvent::kProbeSucceeded, now_, seq, rng_);
  }
  ASSERT_EQ(BreakerWord::Decode(slot_->breaker.load()).state, BreakerState::kClosed);
  EXPECT_LT(MsToTrip(120 * kSec), 5'000u) << "a 1 s window blind for this long";
}

// A reload from periods of a minute to an hour in one bucket, stopped halfway within the first
// minute of an hour: the head's start is a period's start under both shapes, so the head read
// as current with its bucket's bit, but the bucket held the old shape's period number, which
// reads as later than the new one, and every failure was dropped as a call whose clock lags: a
// total outage read 0 failures and tripped after 3,599 s (58.7 s from 10 s in 10 to a minute).
// That bucket is started afresh now.
TEST_F(StoppedReloadTest, AnOutageIsCountedInAWindowOfOneLongBucket) {
  const struct {
    Shape from, to;
  } cases[] = {{{60'000, 1}, {3'600'000, 1}}, {{10'000, 10}, {60'000, 1}}};
  for (const auto& c : cases) {
    SCOPED_TRACE(Name(c.from) + " to " + Name(c.to));
    Make(c.from, 1);
    now_ = 7'200 * kSec + 100 * kMs;  // the hour's first minute
    Calls(21'000);                    // 210 ms, 1 % failures
    StoreShape(c.to);
    Calls(1'000, kMs, true);  // 1 s of total outage, a call a ms
    EXPECT_GE(ReadWindow(*slot_, now_).failures, 1'000u);
    // As soon as its failures outnumber the window's 20,790 successes: 20 s at a call a ms.
    EXPECT_LE(MsToTrip(3'700 * kSec), 21'000u);
  }
}

// A close in the last, partial ms of a bucket period (periods of 700 ms / 3 are not whole ms):
// the close's period is the next one, but its floor, from its ms, is this one. The stripe's
// successes of this period are handed to its bucket with the failures from before the trip, as
// before a close dropped a stripe period that holds its now: then the failures alone stayed,
// and the first failure after the close tripped it again.
TEST_F(StoppedReloadTest, ACloseInAPeriodsLastMsKeepsItsSuccessesBesideItsFailures) {
  Make({700, 3}, 2);
  p_.close_after = 1;
  p_.open_for_ms = 1;
  p_.open_jitter_ms = 0;
  StorePolicy(p_, slot_->policy);
  const uint64_t b = 700 * kMs / 3;
  uint64_t k = 5'000 * kSec / b;
  while (((k + 1) * b) % kMs == 0) ++k;
  now_ = k * b + 10 * kMs;
  for (int i = 0; i < 19; ++i)
    RecordOutcome(*slot_, now_, false, false, rng_, 0, StripeMode::kAtomic);
  for (int i = 0; i < 19; ++i)
    RecordOutcome(*slot_, now_, true, false, rng_, 1, StripeMode::kAtomic);
  ASSERT_EQ(Opened(), 1u);
  const uint64_t close_ns = (k + 1) * b + 1;  // period k + 1, in the ms that began in k
  ASSERT_TRUE(ApplyBreakerEvent(*slot_, BreakerEvent::kOpenPeriodOver, close_ns, 0, rng_));
  const uint16_t seq = BreakerWord::Decode(slot_->breaker.load()).seq;
  ASSERT_TRUE(ApplyBreakerEvent(*slot_, BreakerEvent::kProbeSucceeded, close_ns, seq, rng_));
  const uint64_t t = close_ns + kMs;
  RecordOutcome(*slot_, t, false, false, rng_, 0, StripeMode::kAtomic);
  RecordOutcome(*slot_, t, false, false, rng_, 0, StripeMode::kAtomic);
  RecordOutcome(*slot_, t, true, false, rng_, 1, StripeMode::kAtomic);
  EXPECT_EQ(Opened(), 1u) << "the first failure after the close tripped it again";
}

// Stopped processes at the two points a read or a handover can be stopped across restarts,
// which workers now make too (a failure that reads a window of two shapes starts it anew).
class StoppedAcrossRestartsTest : public StoppedReloadTest {
 protected:
  WindowPauses pauses_;
  void Call(uint64_t now, bool failure, uint16_t stripe) {
    RecordOutcome(*slot_, now, failure, false, rng_, stripe, StripeMode::kAtomic);
  }
  // Sixteen restarts while a reader is stopped just after its load of the head, then the new
  // window's first success and (once the reader has read the stripes) its first failure: the
  // head is the reader's again, bit for bit, its 4-bit epoch round. When the stripes' counts of
  // handovers were read after the head, the read took the stripes' one success beside the old
  // window's 30 failures, and a healthy dependency (3,030 calls at 1 %) tripped.
  void RestartsWhileTheReaderIsStopped(int restarts) {
    Make({1'000, 5});
    const uint64_t t0 = 7'000 * kSec + 10 * kMs;
    for (int i = 0; i < 3'000; ++i) Call(t0, false, 0);
    for (int i = 0; i < 29; ++i) Call(t0, true, 1);
    ASSERT_EQ(Opened(), 0u);
    pauses_.at(WindowReadPause::kHeadRead) = [&] {
      for (int i = 0; i < restarts; ++i) StartWindowAnew(*slot_);
      Call(t0, false, 0);
    };
    pauses_.at(WindowReadPause::kBucketsRead) = [&] { Call(t0, true, 1); };
    pauses_.Arm();
    Call(t0, true, 1);  // the old window's 30th failure: its trip check is the stopped read
    EXPECT_EQ(Opened(), 0u) << "3,030 calls at 1 % failures, then 2 calls at 50 %, tripped";
  }
};

TEST_F(StoppedAcrossRestartsTest, SixteenRestartsWhileAReaderIsStoppedAreSeen) {
  RestartsWhileTheReaderIsStopped(16);
}

TEST_F(StoppedAcrossRestartsTest, FifteenRestartsWhileAReaderIsStoppedAreSeen) {
  RestartsWhileTheReaderIsStopped(15);
}

// A full stripe's handover in the stopped reload (an hour in one bucket to 1 s in 5), stopped
// between its take and its add while another worker's failure reads the two shapes and starts
// the window anew: the hour's 16.7 million successes went to the new shape's period holding the
// hour's last ms, 49.8 s ahead of the clock, and moved the head there, and a total outage on a
// 1 s window tripped after 49 s. The count goes to the call's own period now.
TEST_F(StoppedAcrossRestartsTest, AFullStripesHandoverStoppedAcrossARestartLeavesTheWindowSeeing) {
  for (const bool restart : {true, false}) {
    SCOPED_TRACE(restart ? "a restart during the handover" : "no restart");
    Make({3'600'000, 1}, 1);
    uint64_t now = 7'200 * kSec + 3'550 * kSec;  // 50 s before the old period's end
    for (int i = 0; i < 100; ++i) Call(now, false, 0);
    Stripe& st = testing::StripeOfCpu(*slot_, 0);
    st.window.store(
        StripeWindow::Make(StripeWindow::End40(st.window.load()), StripeWindow::kStripeWindowMax));
    StoreShape({1'000, 5});
    if (restart) {
      pauses_.at(WindowReadPause::kHandoverTaken) = [&] { Call(now, true, 0); };
    }
    pauses_.Arm();
    Call(now, false, 0);  // finds the stripe full: the handover
    window_internal::g_read_pause.store(nullptr);
    EXPECT_LE(WindowHead::StartMs(slot_->window_head.load()), now / kMs + 1'000);
    const uint64_t start = now;
    while (Opened() == 0 && now < start + 120 * kSec) Call(now += kMs, true, 0);
    EXPECT_LE((now - start) / kMs, 2'000u) << "ms of a total outage before a 1 s window trips";
  }
}

// A window read is several words read one after another, and its reader may be stopped between
// any two. One thread keeps a young window (each round starts it anew, as a reload that
// changes its shape does, then gives it 61 calls, 20 of them failures, the successes in a
// stripe), while another reads it flat out on the other CPU and asks whether it should trip.
// No read may find half failures: the reader took the stripes before the buckets (so failures
// came without their successes), and a window started anew soon had its old head back (the
// same period, the same bucket), so a read across the restart took the old buckets for the new
// window's. Before the fixes, 168 of 60 million reads in 5 s said trip.
TEST(StripesTest, AWindowReadAcrossCallsAndRestartsNeverFindsAYoungWindowFailing) {
  Policy p;
  p.window_ms = 1'000;
  p.window_buckets = 5;
  p.min_calls = 20;
  p.failure_rate_pct = 50;
  auto seg = Segment::CreatePrivate(1, 8, p, testing::StripesFor(2));
  const uint32_t index = testing::AddDependency(*seg, "orders", p);
  DependencySlot& slot = *seg->dependency(index);
  const uint64_t t0 = 5'000 * kSec + 10 * kMs;  // one period throughout
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> reads{0}, failing{0};
  std::thread reader([&] {
    PinTo(1 % Cpus());
    while (!stop.load(std::memory_order_relaxed)) {
      failing += ShouldTrip(slot, ReadWindow(slot, t0));
      reads.fetch_add(1, std::memory_order_relaxed);
    }
  });
  PinTo(0);
  uint32_t rng = 7;
  auto call = [&](bool failure) {
    RecordOutcome(slot, t0, failure, false, rng, uint16_t(testing::StripeBase()),
                  StripeMode::kAtomic);
  };
  uint64_t rounds = 0;
  // The race's time, and on a loaded machine on until both threads had their share of it.
  const RaceClock race(StressNs(2 * kSec));
  for (; race.GoesOn(rounds > 1'000 && reads.load() > 100'000); ++rounds) {
    StartWindowAnew(slot);
    call(false);  // the stripe starts the period: the head has it, with no bucket bit yet
    call(true);   // the bucket's first failure: the head is what it was before the restart
    for (int i = 0; i < 40; ++i) call(false);
    for (int i = 0; i < 19; ++i) call(true);
  }
  stop = true;
  reader.join();
  EXPECT_GT(rounds, 1'000u);
  EXPECT_GT(reads.load(), 100'000u);
  EXPECT_EQ(failing.load(), 0u) << "reads of " << reads.load() << " that said trip, over " << rounds
                                << " restarts";
  EXPECT_EQ(slot.counters[kOpened].load(), 0u);
}

// A breaker that closes after an outage must never be found closed beside the outage's failures:
// a caller that read it closed in between would count them in the new window, and a closer
// stopped there would keep them for every caller. One thread trips a dependency with 30
// failures and closes it again by a probe, round after round, all in one bucket period; the
// other watches the breaker word on the other CPU and reads the window the moment it reads
// closed. Before the window was restarted ahead of the close, it found the failures there.
TEST(StripesTest, ABreakerFoundClosedNeverHoldsTheOutagesFailures) {
  Policy p;
  p.window_ms = 1'000;
  p.window_buckets = 1;
  p.min_calls = 20;
  p.failure_rate_pct = 50;
  p.close_after = 1;
  p.half_open_probes = 1;
  auto seg = Segment::CreatePrivate(1, 8, p, testing::StripesFor(2));
  const uint32_t index = testing::AddDependency(*seg, "orders", p);
  DependencySlot& slot = *seg->dependency(index);
  const uint64_t t0 = 5'000 * kSec + 10 * kMs;
  std::atomic<bool> stop{false};
  std::atomic<uint32_t> checked{0};  // the last close's seq the watcher has read
  std::atomic<uint64_t> closes_seen{0}, found_failing{0};
  std::thread watcher([&] {
    PinTo(1 % Cpus());
    while (!stop.load(std::memory_order_relaxed)) {
      const BreakerWord b = BreakerWord::Decode(slot.breaker.load(std::memory_order_acquire));
      if (b.state != BreakerState::kClosed || b.seq == checked.load()) continue;
      found_failing += ReadWindow(slot, t0).failures != 0;
      ++closes_seen;
      checked.store(b.seq);
    }
  });
  PinTo(0);
  uint32_t rng = 7;
  uint64_t rounds = 0;
  const RaceClock race(StressNs(2 * kSec));
  for (; race.GoesOn(rounds > 1'000 && closes_seen.load() > 1'000); ++rounds) {
    for (int i = 0; i < 30; ++i) RecordOutcome(slot, t0, true, false, rng, 0, StripeMode::kAtomic);
    BreakerWord b = BreakerWord::Decode(slot.breaker.load());
    ASSERT_EQ(b.state, BreakerState::kOpen);
    b.state = BreakerState::kHalfOpen;  // the open period over: a test's write
    b.seq = uint16_t(b.seq + 1);
    slot.breaker.store(b.Encode());
    ASSERT_TRUE(ApplyBreakerEvent(slot, BreakerEvent::kProbeSucceeded, t0, b.seq, rng));
    const uint16_t closed_seq = uint16_t(b.seq + 1);
    while (checked.load() != closed_seq && !stop.load()) {
    }
  }
  stop = true;
  watcher.join();
  EXPECT_GT(rounds, 1'000u);
  EXPECT_GT(closes_seen.load(), 1'000u);
  EXPECT_EQ(found_failing.load(), 0u)
      << "closes found beside the outage's failures, of " << closes_seen.load();
}

TEST_F(StripeFoldTest, ARetryFindsTheDepositsOfEveryStripeEachOnce) {
  const uint64_t t0 = 3'000 * kSec;
  // Drain the burst of 2.
  Call(0, t0, Outcome::kSuccess, 1);
  Call(0, t0, Outcome::kSuccess, 1);
  Caller c = On(0);
  Permit p;
  EXPECT_EQ(Admit(*slot_, index_, 1, t0, c, &p), Decision::kRejectedBudgetEmpty);
  // 15 first attempts of 0.1 token on four CPUs: 1.5 tokens, in the stripes.
  for (int i = 0; i < 15; ++i) Call(uint16_t(i % 4), t0, Outcome::kSuccess);
  EXPECT_EQ(RetryBudget::Tokens(slot_->budget.load()), 0u);
  EXPECT_EQ(PendingDeposits(*slot_), 1'500u);
  EXPECT_TRUE(IsAdmitted(Admit(*slot_, index_, 1, t0, c, &p)));
  Complete(*slot_, &p, Outcome::kSuccess, kMs, t0, c);
  EXPECT_EQ(PendingDeposits(*slot_), 0u);
  EXPECT_EQ(RetryBudget::Tokens(slot_->budget.load()), 500u);
  EXPECT_EQ(Admit(*slot_, index_, 1, t0, c, &p), Decision::kRejectedBudgetEmpty);
  // 50 more (5 tokens) fold to the burst of 2, not 5.
  for (int i = 0; i < 50; ++i) Call(uint16_t(i % 4), t0, Outcome::kSuccess);
  int granted = 0;
  while (IsAdmitted(Admit(*slot_, index_, 1, t0, c, &p))) {
    Complete(*slot_, &p, Outcome::kSuccess, kMs, t0, c);
    ++granted;
  }
  EXPECT_EQ(granted, 2);
}

// A stripe hands its period's successes over to their shared bucket when its next period starts:
// it takes the count from the stripe, then adds it to the bucket. A process the scheduler stops
// between the two holds the count where no window read sees it, while the failures beside those
// successes stay in the bucket: a young window read then as failing. The count waits in the
// stripe's `handing` word meanwhile; here the stripe is left as such a stopped process leaves it.
TEST_F(StripeFoldTest, ASuccessCountOnItsWayToItsBucketStillCounts) {
  const uint64_t t0 = 6'000 * kSec;
  for (int i = 0; i < 1'000; ++i) Call(0, t0, Outcome::kSuccess);
  for (int i = 0; i < 30; ++i) Call(1, t0, Outcome::kFailure);
  ASSERT_EQ(ReadWindow(*slot_, t0).calls, 1'030u);
  Stripe& st = testing::StripeOfCpu(*slot_, 0);
  const uint64_t taken = st.window.load();
  ASSERT_EQ(StripeWindow::Count(taken), 1'000u);
  // The next period's first success on CPU 0 has taken the count and not yet added it.
  const uint64_t t1 = t0 + kSec;
  st.handing.store(taken);
  st.window.store(StripeWindow::Make((t1 / kSec + 1) * 1'000, 1));
  st.window_start.store(t1 / kMs);
  const WindowStats w = ReadWindow(*slot_, t1);
  EXPECT_EQ(w.calls, 1'031u);
  EXPECT_EQ(w.failures, 30u);
  EXPECT_FALSE(ShouldTrip(*slot_, w));
  // The stopped process never came back; put the stripe as it was, and let the real handover
  // run: it ends with the count in its bucket, counted once, and nothing on its way.
  st.handing.store(0);
  st.window.store(taken);
  st.window_start.store(t0 / kMs);
  Call(0, t1, Outcome::kSuccess);
  EXPECT_EQ(st.handing.load(), 0u);
  EXPECT_EQ(ReadWindow(*slot_, t1).calls, 1'031u);
}

// A window read that the scheduler stops, while other processes go on: the reader reads the
// stripes, then the buckets, then the stripes again (ReadWindow), and a test can act at each of
// those points as other processes would (window_internal::g_read_pause). Stopped after its first
// read of the stripes, the reader's dependency made 995 more successes and 15 more failures,
// then the next period began on the stripe's CPU; the read must still count them all.
class StoppedReaderTest : public StripeFoldTest {
 protected:
  static constexpr uint64_t kT0 = 7'000 * kSec;
  static constexpr uint64_t kT1 = kT0 + kSec;  // the next bucket period (1 s buckets)

  // Each test sets what happens at each pause.
  WindowPauses pauses_;
  // The 5 successes and the failure before the read, and the 995 successes and 15 failures of
  // the meantime.
  void CallsBeforeTheRead() {
    for (int i = 0; i < 5; ++i) Call(0, kT0, Outcome::kSuccess);
    Call(1, kT0, Outcome::kFailure);
  }
  void CallsWhileStopped() {
    for (int i = 0; i < 995; ++i) Call(0, kT0, Outcome::kSuccess);
    for (int i = 0; i < 15; ++i) Call(1, kT0, Outcome::kFailure);
  }
  // The read at kT0 finds all 1,016 calls and their 16 failures.
  void ExpectEveryCallRead() {
    const WindowStats w = ReadWindow(*slot_, kT0);
    EXPECT_EQ(w.failures, 16u);
    EXPECT_GE(w.calls, 1'016u);
    EXPECT_FALSE(ShouldTrip(*slot_, w)) << w.calls << " calls, " << w.failures << " failures";
  }
};

// The next period's first success on CPU 0 took the stripe's count and was stopped before it
// added it to the bucket, as the reader read the buckets.
TEST_F(StoppedReaderTest, AHandoverBegunWhileTheReaderWasStoppedIsCounted) {
  CallsBeforeTheRead();
  pauses_.at(WindowReadPause::kStripesRead) = [this] {
    CallsWhileStopped();
    Stripe& st = testing::StripeOfCpu(*slot_, 0);
    const uint64_t taken = st.window.load();
    ASSERT_EQ(StripeWindow::Count(taken), 1'000u);
    st.handing.store(taken);  // BeginHandover, then the take
    st.window.store(StripeWindow::Make((kT1 / kSec + 1) * 1'000, 1));
    st.window_start.store(kT1 / kMs);
  };
  pauses_.Arm();
  ExpectEveryCallRead();
}

// The whole handover, take and add, came after the reader read the buckets and before it read
// the stripes again: neither read holds the count, nor does `handing` any more. Another CPU had
// begun the next period already, so the handover leaves the window's head as it was.
TEST_F(StoppedReaderTest, AHandoverDoneBetweenTheReadersTwoStripeReadsIsCounted) {
  CallsBeforeTheRead();
  Call(2, kT1, Outcome::kSuccess);
  pauses_.at(WindowReadPause::kStripesRead) = [this] { CallsWhileStopped(); };
  pauses_.at(WindowReadPause::kBucketsRead) = [this] { Call(0, kT1, Outcome::kSuccess); };
  pauses_.Arm();
  ExpectEveryCallRead();
  EXPECT_EQ(testing::StripeOfCpu(*slot_, 0).handing.load(), 0u);
}

// Sixteen restarts of the window (reloads that change its shape) while the reader was stopped
// bring the head's epoch back to the value the reader read, and the stripe climbs back past
// its first count: a restart counts as a handover on every stripe, and the read is read again.
TEST_F(StoppedReaderTest, SixteenRestartsWhileTheReaderWasStoppedAreSeen) {
  CallsBeforeTheRead();
  pauses_.at(WindowReadPause::kStripesRead) = [this] { CallsWhileStopped(); };
  pauses_.at(WindowReadPause::kBucketsRead) = [this] {
    for (int i = 0; i < 16; ++i) StartWindowAnew(*slot_);
    CallsBeforeTheRead();  // the new window's first calls, as the old one's were
  };
  pauses_.Arm();
  const WindowStats w = ReadWindow(*slot_, kT0);
  EXPECT_EQ(w.calls, 6u) << "the new window's calls only";
  EXPECT_FALSE(ShouldTrip(*slot_, w)) << w.calls << " calls, " << w.failures << " failures";
}

// A full stripe hands its count over and counts on from 1 in the same period: a reader stopped
// across that sees the same period and a count no lower than before, but a handover began.
TEST_F(StoppedReaderTest, AFullStripesHandoverWhileTheReaderWasStoppedIsSeen) {
  Call(0, kT0, Outcome::kSuccess);
  Call(1, kT0, Outcome::kFailure);
  Stripe& st = testing::StripeOfCpu(*slot_, 0);
  pauses_.at(WindowReadPause::kStripesRead) = [&] {
    st.window.store(
        StripeWindow::Make(StripeWindow::End40(st.window.load()), StripeWindow::kStripeWindowMax));
    for (int i = 0; i < 24; ++i) Call(1, kT0, Outcome::kFailure);
  };
  pauses_.at(WindowReadPause::kBucketsRead) = [this] { Call(0, kT0, Outcome::kSuccess); };
  pauses_.Arm();
  // (Past 65,535 calls the bucket counts in larger units: its 25 failures are a fraction of
  // one unit, as its rates are, not a count.)
  const WindowStats w = ReadWindow(*slot_, kT0);
  EXPECT_GE(w.calls, StripeWindow::kStripeWindowMax);
  EXPECT_FALSE(ShouldTrip(*slot_, w)) << w.calls << " calls, " << w.failures << " failures";
}

// A handover whose process was stopped (or killed) between its take and its add keeps the
// stripe's `handing` word while its period is in the window: a later handover on the same CPU
// may not write over it (the count would then be nowhere while its failures stay), and the
// successes of that CPU go to the shared buckets meanwhile.
TEST_F(StripeFoldTest, ACountOnItsWayIsNotWrittenOverByTheNextHandover) {
  const uint64_t t0 = 8'000 * kSec, t1 = t0 + kSec, t2 = t0 + 2 * kSec;
  for (int i = 0; i < 1'000; ++i) Call(0, t0, Outcome::kSuccess);
  for (int i = 0; i < 30; ++i) Call(1, t0, Outcome::kFailure);
  Stripe& st = testing::StripeOfCpu(*slot_, 0);
  const uint64_t taken = st.window.load();
  // The stopped handover of t1: claimed, taken, not added.
  st.handing.store(taken);
  st.handovers.fetch_add(1);
  st.window.store(StripeWindow::Make((t1 / kSec + 1) * 1'000, 1));
  st.window_start.store(t1 / kMs);
  // The next period's first success on CPU 0, and a failure that reads the window.
  Call(0, t2, Outcome::kSuccess);
  Call(1, t2, Outcome::kFailure);
  EXPECT_EQ(st.handing.load(), taken);
  const WindowStats w = ReadWindow(*slot_, t2);
  EXPECT_EQ(w.failures, 31u);
  EXPECT_GE(w.calls, 1'033u);
  EXPECT_EQ(BreakerWord::Decode(slot_->breaker.load()).state, BreakerState::kClosed);
}

// Two handovers of the same count on one CPU: the one that claims `handing` first takes the
// count; the other, finding the word held, leaves the stripe alone (its success goes to the
// shared buckets), so it can neither take the count twice nor give back the first one's claim.
TEST_F(StripeFoldTest, AHandoverFindingTheWordHeldLeavesTheStripeAlone) {
  const uint64_t t0 = 9'000 * kSec, t1 = t0 + kSec;
  for (int i = 0; i < 1'000; ++i) Call(0, t0, Outcome::kSuccess);
  for (int i = 0; i < 30; ++i) Call(1, t0, Outcome::kFailure);
  Stripe& st = testing::StripeOfCpu(*slot_, 0);
  const uint64_t w = st.window.load();
  st.handing.store(w);  // claimed by a handover stopped before its take
  st.handovers.fetch_add(1);
  Call(0, t1, Outcome::kSuccess);
  EXPECT_EQ(st.window.load(), w) << "the second handover took the count";
  EXPECT_EQ(st.handing.load(), w) << "the second handover gave back the first one's claim";
  Call(1, t1, Outcome::kFailure);
  const WindowStats read = ReadWindow(*slot_, t1);
  EXPECT_EQ(read.failures, 31u);
  EXPECT_EQ(read.calls, 1'032u);
}

// A reset refills the budget and drops what waited in the stripes; a policy stored by the
// daemon folds them under the cap they were made with first.
TEST_F(StripeFoldTest, AResetDropsTheWaitingDepositsAndAReloadCapsThemByTheOldBurst) {
  const uint64_t t0 = 4'000 * kSec;
  Call(0, t0, Outcome::kSuccess, 1);
  Call(0, t0, Outcome::kSuccess, 1);
  for (int i = 0; i < 30; ++i) Call(uint16_t(i % 4), t0, Outcome::kSuccess);  // 3 tokens wait
  Reset(*slot_, t0);
  EXPECT_EQ(PendingDeposits(*slot_), 0u);
  EXPECT_EQ(RetryBudget::Tokens(slot_->budget.load()), 2'000u);

  Call(0, t0, Outcome::kSuccess, 1);
  Call(0, t0, Outcome::kSuccess, 1);
  for (int i = 0; i < 30; ++i) Call(uint16_t(i % 4), t0, Outcome::kSuccess);  // 3 tokens wait
  Policy bigger = policy_;
  bigger.retry_burst = 100;
  testing::AddDependency(*seg_, "orders", bigger);  // the daemon's reload of the same name
  EXPECT_EQ(PendingDeposits(*slot_), 0u);
  EXPECT_EQ(RetryBudget::Tokens(slot_->budget.load()), 2'000u);  // the old burst
}

// Six worker processes on one CPU (one stripe), 1 % failures against a 50 % threshold, 100 ms
// periods (a handover every period), while the test stops a random worker for 0..20 ms again
// and again (SIGSTOP): a worker stopped mid-handover must never make the healthy window trip.
TEST(StripesTest, AHealthyDependencyNeverTripsWhileWorkersSharingACpuAreStopped) {
  testing::NamedSegment seg("rwstress", 4, 64);
  Policy p;
  p.window_ms = 1'000;
  p.window_buckets = 10;
  p.min_calls = 20;
  p.failure_rate_pct = 50;
  p.open_for_ms = 1'000;
  const uint32_t index = testing::AddDependency(*seg.seg, "dep", p);
  DependencySlot& slot = *seg.seg->dependency(index);
  auto* stop = static_cast<std::atomic<int>*>(
      mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  std::vector<pid_t> kids;
  for (int w = 0; w < 6; ++w) {
    const pid_t kid = fork();
    if (kid == 0) {
      PinTo(0);
      Caller c{RegisterProcess(*seg.seg, getpid()), 0, uint32_t(777 + w)};
      for (uint64_t n = 1; !stop->load(std::memory_order_relaxed); ++n) {
        testing::OnCpu(c, CurrentCpu());
        Permit permit;
        Admit(slot, index, 0, CoarseNowNs(), c, &permit);
        Complete(slot, &permit, (n * 7 + w) % 100 == 0 ? Outcome::kFailure : Outcome::kSuccess, 0,
                 CoarseNowNs(), c);
      }
      _exit(0);
    }
    kids.push_back(kid);
  }
  const RaceClock race(StressNs(3 * kSec));
  uint32_t r = 12345;
  uint64_t stops = 0;
  while (race.GoesOn(stops > 50)) {
    r = r * 1103515245u + 12345u;
    const pid_t k = kids[(r >> 8) % kids.size()];
    kill(k, SIGSTOP);
    ++stops;
    usleep((r >> 16) % 20'000);
    kill(k, SIGCONT);
    usleep(500);
  }
  stop->store(1);
  for (const pid_t kid : kids) {
    kill(kid, SIGCONT);
    waitpid(kid, nullptr, 0);
  }
  munmap(stop, 4096);
  EXPECT_GT(stops, 50u);
  EXPECT_EQ(slot.counters[kOpened].load(), 0u) << "1 % failures tripped a 50 % breaker";
}

}  // namespace
}  // namespace retryd::shm
