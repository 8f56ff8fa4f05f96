// The invariants of DESIGN.md, checked across real processes on one real segment: N forked
// workers hammer admit/complete, then the counters must satisfy the bounds exactly.
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "shm/admission.h"
#include "shm/breaker.h"
#include "shm/clock.h"
#include "shm/registry.h"
#include "shm/retry_budget.h"
#include "tests/sanitized.h"
#include "tests/shm/test_util.h"

namespace retryd::shm {
namespace {

constexpr int kProcesses = 6;

// Shared scratch memory for the test's own bookkeeping across forks.
struct Scratch {
  std::atomic<int64_t> in_flight;
  std::atomic<int64_t> max_in_flight;
  std::atomic<uint64_t> granted;
};

Scratch* MapScratch() {
  void* p = mmap(nullptr, sizeof(Scratch), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  return new (p) Scratch{};
}

void NoteInFlight(Scratch* s, int64_t delta) {
  const int64_t now = s->in_flight.fetch_add(delta) + delta;
  int64_t seen = s->max_in_flight.load();
  while (now > seen && !s->max_in_flight.compare_exchange_weak(seen, now)) {
  }
}

// Forks `n` workers running body(worker index), waits for all, expects clean exits.
void ForkWorkers(int n, const std::function<void(int)>& body) {
  std::vector<pid_t> pids;
  for (int i = 0; i < n; ++i) {
    const pid_t pid = fork();
    if (pid == 0) {
      body(i);
      _exit(0);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }
}

TEST(MultiProcessTest, RetryBudgetBoundHoldsHostWide) {
  testing::NamedSegment seg("budget");
  Policy p;
  p.retry_ratio_milli = 200;
  p.min_retries_per_sec = 10;
  p.retry_burst = 50;
  p.min_calls = 1'000'000;  // keep the breaker out of it
  const uint32_t index = testing::AddDependency(*seg.seg, "orders", p);
  Scratch* scratch = MapScratch();
  const uint64_t start_ns = CoarseNowNs();
  ForkWorkers(kProcesses, [&](int w) {
    std::unique_ptr<Segment> mine;
    if (!Segment::Attach(seg.name, Access::kReadWrite, &mine).ok()) _exit(3);
    DependencySlot& slot = *mine->dependency(index);
    Caller caller{RegisterProcess(*mine, getpid()), 0, uint32_t(w + 1)};
    uint64_t granted = 0;
    for (int i = 0; i < 100'000; ++i) {
      Permit permit;
      // Every call fails and retries up to three times: a retry storm.
      for (uint32_t attempt = 0; attempt < 4; ++attempt) {
        const Decision d = Admit(slot, index, attempt, CoarseNowNs(), caller, &permit);
        Complete(slot, &permit, Outcome::kFailure, 1000, CoarseNowNs(), caller);
        if (!IsAdmitted(d)) break;
        if (attempt > 0) ++granted;
      }
    }
    scratch->granted.fetch_add(granted);
  });
  const double elapsed_s = double(CoarseNowNs() - start_ns) / 1e9 + 0.01;
  DependencySlot& slot = *seg.seg->dependency(index);
  const uint64_t first = ReadCounter(slot, kFirstAttempts);
  const uint64_t granted = ReadCounter(slot, kRetriesGranted);
  EXPECT_EQ(first, uint64_t(kProcesses) * 100'000);
  EXPECT_EQ(granted, scratch->granted.load());  // the counter is exact
  const double bound = p.retry_burst + 0.2 * double(first) + p.min_retries_per_sec * elapsed_s;
  EXPECT_LE(double(granted), bound) << "first " << first << " elapsed " << elapsed_s;
  // And the budget really was the limit: most retries were denied.
  EXPECT_GT(ReadCounter(slot, kRetriesDenied), granted);
  RecordProperty("retries_granted", std::to_string(granted));
  RecordProperty("bound", std::to_string(bound));
}

// Drives the breaker of `slot` open with open_for long enough that it stays open until the
// workers start, then lets them find it half-open.
TEST(MultiProcessTest, HalfOpenProbesNeverExceedTheLimit) {
  testing::NamedSegment seg("probes");
  Policy p;
  p.half_open_probes = 2;
  p.close_after = 255;          // stay half-open: every probe succeeds but never closes it
  p.probe_timeout_ms = 60'000;
  const uint32_t index = testing::AddDependency(*seg.seg, "orders", p);
  DependencySlot& slot = *seg.seg->dependency(index);
  BreakerWord half{BreakerState::kHalfOpen, 0, 0, 1, NsToMs32(CoarseNowNs())};
  slot.breaker.store(half.Encode());
  Scratch* scratch = MapScratch();
  ForkWorkers(kProcesses, [&](int w) {
    std::unique_ptr<Segment> mine;
    if (!Segment::Attach(seg.name, Access::kReadWrite, &mine).ok()) _exit(3);
    DependencySlot& s = *mine->dependency(index);
    Caller caller{RegisterProcess(*mine, getpid()), 0, uint32_t(w + 1)};
    for (int i = 0; i < 200'000; ++i) {
      Permit permit;
      const Decision d = Admit(s, index, 0, CoarseNowNs(), caller, &permit);
      if (d == Decision::kAdmittedProbe) {
        NoteInFlight(scratch, +1);
        NoteInFlight(scratch, -1);
      }
      // Ignored: the lease is released, the half-open state untouched.
      Complete(s, &permit, Outcome::kIgnored, 1000, CoarseNowNs(), caller);
    }
  });
  EXPECT_LE(scratch->max_in_flight.load(), 2);
  EXPECT_GE(scratch->max_in_flight.load(), 1);
  EXPECT_GT(ReadCounter(slot, kProbesGranted), 0u);
  EXPECT_GT(ReadCounter(slot, kRejectedHalfOpenBusy), 0u);
  EXPECT_EQ(slot.probe_leases[0].load() | slot.probe_leases[1].load(), 0u);
}

TEST(MultiProcessTest, BulkheadNeverExceedsTheLimit) {
  testing::NamedSegment seg("bulkhead");
  Policy p;
  p.bulkhead_limit = 5;
  p.min_calls = 1'000'000;
  const uint32_t index = testing::AddDependency(*seg.seg, "orders", p);
  Scratch* scratch = MapScratch();
  ForkWorkers(kProcesses, [&](int w) {
    std::unique_ptr<Segment> mine;
    if (!Segment::Attach(seg.name, Access::kReadWrite, &mine).ok()) _exit(3);
    DependencySlot& s = *mine->dependency(index);
    Caller caller{RegisterProcess(*mine, getpid()), 0, uint32_t(w + 1)};
    for (int i = 0; i < 100'000; ++i) {
      Permit a, b;  // two calls in flight per worker at times
      const bool got_a = IsAdmitted(Admit(s, index, 0, CoarseNowNs(), caller, &a));
      if (got_a) NoteInFlight(scratch, +1);
      const bool got_b = IsAdmitted(Admit(s, index, 0, CoarseNowNs(), caller, &b));
      if (got_b) NoteInFlight(scratch, +1);
      if (got_a) NoteInFlight(scratch, -1);
      Complete(s, &a, Outcome::kSuccess, 1000, CoarseNowNs(), caller);
      if (got_b) NoteInFlight(scratch, -1);
      Complete(s, &b, Outcome::kSuccess, 1000, CoarseNowNs(), caller);
    }
  });
  EXPECT_LE(scratch->max_in_flight.load(), 5);
  // And the limit was reached: admits found all five leases taken.
  EXPECT_GT(seg.seg->dependency(index)->counters[kRejectedBulkheadFull].load(), 0u);
  for (uint32_t i = 0; i < kMaxBulkhead; ++i) EXPECT_EQ(seg.seg->dependency(index)->bulkhead_leases[i].load(), 0u);
}

// Workers SIGKILLed while they hold probe and bulkhead leases: without a daemon, the leases
// come back by expiry; with the daemon's reaper, as soon as the owners are seen dead.
class CrashTest : public ::testing::TestWithParam<bool> {};

// Worker processes create a name on the fly while the daemon's reload puts it with its
// configured policy: whoever comes first, the configured policy stands. A creator whose Find
// missed the name used to store the header's defaults over it under the lock (an unlimited
// bulkhead where 2 were configured), until the next reload.
TEST(MultiProcessTest, ACreatorRacingTheDaemonsPutNeverReplacesItsPolicy) {
  testing::NamedSegment seg("createrace", 512, 64);
  auto* go = static_cast<std::atomic<int>*>(
      mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  Policy configured;
  configured.bulkhead_limit = 2;
  configured.bulkhead_timeout_ms = 60'000;
  int replaced = 0;
  for (int trial = 0; trial < Rounds(200); ++trial) {
    const std::string name = "dep-" + std::to_string(trial);
    go->store(0);
    std::vector<pid_t> kids;
    for (int w = 0; w < 4; ++w) {
      const pid_t kid = fork();
      if (kid == 0) {
        while (go->load() == 0) {
        }
        uint32_t index;
        _exit(seg.seg->CreateOnTheFly(name, &index).ok() ? 0 : 3);
      }
      kids.push_back(kid);
    }
    for (int spin = 0; spin < 20'000; ++spin) asm volatile("" ::: "memory");
    go->store(1);
    for (int spin = 0; spin < (trial % 40) * 200; ++spin) asm volatile("" ::: "memory");
    uint32_t index;
    ASSERT_TRUE(seg.seg->PutDependency(name, configured, &index).ok());
    for (const pid_t kid : kids) {
      int status = 0;
      waitpid(kid, &status, 0);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    replaced += LoadKnob<Knob::bulkhead_limit>(seg.seg->dependency(index)->policy) != 2;
  }
  munmap(go, 4096);
  EXPECT_EQ(replaced, 0) << "trials of 200 where the defaults replaced the configured policy";
}

// A probe's holder SIGKILLed while its probe is out: its call never reported, so, as for an
// ignored outcome, the reaper hands its place to the next caller, which probes in the same
// half-open; the breaker is not reopened, which would void the live probes of that half-open
// while their calls are still out. At most `half_open_probes` probes are out at once.
TEST(MultiProcessTest, AProbeWhoseProcessDiedHandsItsPlaceOn) {
  testing::NamedSegment seg("deadprobe", 4, 64);
  Policy p;
  p.half_open_probes = 1;
  p.close_after = 1;
  p.min_calls = 1;
  p.open_for_ms = 20;
  p.open_for_max_ms = 20;
  p.open_jitter_ms = 0;
  p.probe_timeout_ms = 60'000;
  const uint32_t index = testing::AddDependency(*seg.seg, "dep", p);
  DependencySlot& slot = *seg.seg->dependency(index);
  Caller me{RegisterProcess(*seg.seg, getpid()), 0, 12345};
  DeadOwnerReaper reaper;
  for (int round = 0; round < 10; ++round) {
    SCOPED_TRACE(round);
    for (int i = 0; i < 5 && BreakerWord::Decode(slot.breaker.load()).state ==
                                 BreakerState::kClosed; ++i) {
      Permit permit;
      Admit(slot, index, 0, PreciseNowNs(), me, &permit);
      Complete(slot, &permit, Outcome::kFailure, 0, PreciseNowNs(), me);
    }
    usleep(30'000);  // the open period passes
    int fd[2];
    ASSERT_EQ(pipe(fd), 0);
    const pid_t kid = fork();
    if (kid == 0) {
      Caller k{RegisterProcess(*seg.seg, getpid()), 0, 777};
      Permit permit;
      const uint16_t msg[2] = {uint16_t(Admit(slot, index, 0, PreciseNowNs(), k, &permit)),
                               permit.breaker_seq};
      if (write(fd[1], msg, sizeof msg) != sizeof msg) _exit(3);
      pause();  // the probe is out ...
      _exit(0);
    }
    uint16_t msg[2];
    ASSERT_EQ(read(fd[0], msg, sizeof msg), ssize_t(sizeof msg));
    close(fd[0]);
    close(fd[1]);
    reaper.Tick(*seg.seg);  // the daemon's tick verifies the new worker
    ASSERT_EQ(Decision(msg[0]), Decision::kAdmittedProbe);
    Permit busy;
    EXPECT_EQ(Admit(slot, index, 0, PreciseNowNs(), me, &busy), Decision::kRejectedHalfOpenBusy);
    Complete(slot, &busy, Outcome::kSuccess, 0, PreciseNowNs(), me);
    kill(kid, SIGKILL);  // ... and its holder dies
    waitpid(kid, nullptr, 0);
    EXPECT_EQ(reaper.Tick(*seg.seg), 1u);
    EXPECT_EQ(BreakerWord::Decode(slot.breaker.load()).state, BreakerState::kHalfOpen);
    Permit next;
    EXPECT_EQ(Admit(slot, index, 0, PreciseNowNs(), me, &next), Decision::kAdmittedProbe);
    EXPECT_EQ(next.breaker_seq, msg[1]) << "the place is handed on in the same half-open";
    Complete(slot, &next, Outcome::kFailure, 0, PreciseNowNs(), me);
  }
}

TEST_P(CrashTest, LeasesOfKilledWorkersComeBack) {
  const bool with_reaper = GetParam();
  testing::NamedSegment seg(with_reaper ? "crash-reaper" : "crash-expiry");
  Policy p;
  // With the reaper, leases must come back long before they could expire; without it, by
  // expiry, judged at a time past the timeouts. No lease expires while the workers run: the
  // probe a worker holds would expire and reopen the breaker, after which nobody holds a lease
  // (a loaded machine took 1.5 s to start and kill the eight workers under AddressSanitizer).
  const uint32_t lease_timeout_ms = 60'000;
  p.bulkhead_limit = 4;
  p.bulkhead_timeout_ms = lease_timeout_ms;
  p.half_open_probes = 1;
  p.probe_timeout_ms = lease_timeout_ms;
  p.close_after = 255;
  p.min_calls = 1'000'000;
  const uint32_t index = testing::AddDependency(*seg.seg, "orders", p);
  DependencySlot& slot = *seg.seg->dependency(index);
  slot.breaker.store(BreakerWord{BreakerState::kHalfOpen, 0, 0, 1, NsToMs32(CoarseNowNs())}.Encode());

  std::mt19937 rng(42);
  Scratch* started = MapScratch();
  std::vector<pid_t> pids;
  for (int i = 0; i < 8; ++i) {
    const pid_t pid = fork();
    if (pid == 0) {
      std::unique_ptr<Segment> mine;
      if (!Segment::Attach(seg.name, Access::kReadWrite, &mine).ok()) _exit(3);
      DependencySlot& s = *mine->dependency(index);
      Caller caller{RegisterProcess(*mine, getpid()), 0, uint32_t(i + 1)};
      bool announced = false;
      for (;;) {  // hammer until killed: admit, complete, and admit one more to hold
        Permit permit;
        Admit(s, index, 0, CoarseNowNs(), caller, &permit);
        Complete(s, &permit, Outcome::kIgnored, 1000, CoarseNowNs(), caller);
        Permit held;
        Admit(s, index, 0, CoarseNowNs(), caller, &held);  // held until the kill
        if (!announced) {
          started->granted.fetch_add(1);
          announced = true;
        }
      }
    }
    pids.push_back(pid);
  }
  // Every worker has been through its loop once (and so holds leases) before the kills.
  while (started->granted.load() < pids.size()) usleep(1000);
  for (pid_t pid : pids) {
    usleep(1000 + rng() % 20'000);
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  // Leases are still taken now: their owners died holding them.
  auto taken = [&] {
    int n = 0;
    for (auto& l : slot.bulkhead_leases) n += l.load() != 0;
    for (auto& l : slot.probe_leases) n += l.load() != 0;
    return n;
  };
  ASSERT_GT(taken(), 0);
  Caller janitor{0, 0, 7};
  if (with_reaper) {
    DeadOwnerReaper reaper;
    uint32_t dead = 0;
    const uint64_t freed = reaper.Tick(*seg.seg, &dead);
    EXPECT_GT(freed, 0u);
    EXPECT_EQ(dead, 8u);
    EXPECT_EQ(taken(), 0);
    EXPECT_EQ(ReadCounter(slot, kLeasesReclaimedDead), freed);
  } else {
    const uint64_t past_timeouts = CoarseNowNs() + (lease_timeout_ms + 50) * testing::kMs;
    const uint32_t freed = ReclaimExpired(slot, past_timeouts, janitor, Sweep::kAllWords);
    EXPECT_GT(freed, 0u);
    EXPECT_EQ(taken(), 0);
    EXPECT_GE(ReadCounter(slot, kLeasesReclaimedExpired), freed);
  }
  // And the dependency works again: a bulkhead lease and a probe can be had.
  Permit permit;
  slot.breaker.store(BreakerWord{BreakerState::kHalfOpen, 0, 0, 9, NsToMs32(CoarseNowNs())}.Encode());
  EXPECT_EQ(Admit(slot, index, 0, CoarseNowNs(), janitor, &permit), Decision::kAdmittedProbe);
}

INSTANTIATE_TEST_SUITE_P(WithAndWithoutDaemon, CrashTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Reaper" : "Expiry"; });

TEST(RegistryTest, RecycledPidDoesNotKeepLeasesAlive) {
  testing::NamedSegment seg("pidreuse");
  Policy p;
  p.bulkhead_limit = 2;
  const uint32_t index = testing::AddDependency(*seg.seg, "orders", p);
  // A live process (this one) registered with another process's start time: exactly what a
  // recycled pid looks like to the daemon.
  const uint16_t owner = RegisterProcess(*seg.seg, getpid());
  ASSERT_NE(owner, kUnknownOwner);
  seg.seg->process(owner - 1u)->start_time.fetch_add(12345);
  Caller caller{owner, 0, 3};
  Permit permit;
  ASSERT_EQ(Admit(*seg.seg->dependency(index), index, 0, CoarseNowNs(), caller, &permit), Decision::kAdmitted);
  EXPECT_EQ(ReclaimDeadProcesses(*seg.seg), 1u);
  EXPECT_EQ(seg.seg->process(owner - 1u)->owner.load(), 0u);
  // The same through the daemon's reaper.
  const uint16_t again = RegisterProcess(*seg.seg, getpid());
  seg.seg->process(again - 1u)->start_time.fetch_add(1);
  caller.owner = again;
  ASSERT_EQ(Admit(*seg.seg->dependency(index), index, 0, CoarseNowNs(), caller, &permit), Decision::kAdmitted);
  DeadOwnerReaper reaper;
  EXPECT_EQ(reaper.Tick(*seg.seg), 1u);
}

TEST(RegistryTest, LiveProcessesKeepTheirLeases) {
  testing::NamedSegment seg("live");
  const uint16_t owner = RegisterProcess(*seg.seg, getpid());
  ASSERT_NE(owner, kUnknownOwner);
  DeadOwnerReaper reaper;
  EXPECT_EQ(reaper.Tick(*seg.seg), 0u);
  EXPECT_EQ(reaper.Tick(*seg.seg), 0u);
  EXPECT_NE(seg.seg->process(owner - 1u)->owner.load(), 0u);
  UnregisterProcess(*seg.seg, owner, getpid());
  EXPECT_EQ(seg.seg->process(owner - 1u)->owner.load(), 0u);
}

TEST(RegistryTest, ANewOwnerWithTheSameOwnerWordIsVerifiedAgain) {
  // A pid recycled between two ticks can land in the same slot with the same owner word; only
  // the start time tells the processes apart.
  testing::NamedSegment seg("sameword");
  Policy p;
  p.bulkhead_limit = 2;
  const uint32_t index = testing::AddDependency(*seg.seg, "orders", p);
  const uint16_t owner = RegisterProcess(*seg.seg, getpid());
  DeadOwnerReaper reaper;
  EXPECT_EQ(reaper.Tick(*seg.seg), 0u);  // verified and watched: alive
  Caller caller{owner, 0, 3};
  Permit permit;
  ASSERT_EQ(Admit(*seg.seg->dependency(index), index, 0, CoarseNowNs(), caller, &permit),
            Decision::kAdmitted);
  // Same pid, same slot, same owner word, another process's start time.
  seg.seg->process(owner - 1u)->start_time.fetch_add(7);
  EXPECT_EQ(reaper.Tick(*seg.seg), 1u);
  EXPECT_EQ(seg.seg->process(owner - 1u)->owner.load(), 0u);
}

TEST(RegistryTest, AnUnreapedZombieIsDead) {
  const pid_t pid = fork();
  if (pid == 0) _exit(0);
  // Not reaped yet: the pid exists as a zombie until waitpid below.
  for (int i = 0; i < 1000 && ProcessAliveByProc(pid, 0); ++i) usleep(1000);
  EXPECT_FALSE(ProcessAliveByProc(pid, 0));
  EXPECT_FALSE(ProcessStartTime(pid).has_value());
  waitpid(pid, nullptr, 0);
  EXPECT_TRUE(ProcessAliveByProc(getpid(), 0));
  EXPECT_EQ(ProcessAliveByProc(getpid(), *ProcessStartTime(getpid())), true);
}

TEST(RegistryTest, FullRegistryIsCounted) {
  testing::NamedSegment seg("fullreg", 4, /*procs=*/2);
  EXPECT_NE(RegisterProcess(*seg.seg, getpid()), kUnknownOwner);
  EXPECT_NE(RegisterProcess(*seg.seg, getpid()), kUnknownOwner);
  EXPECT_EQ(RegisterProcess(*seg.seg, getpid()), kUnknownOwner);
  EXPECT_EQ(seg.seg->header().registry_full_events.load(), 1u);
}

}  // namespace
}  // namespace retryd::shm
