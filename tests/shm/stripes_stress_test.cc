// The stripes at their limits: a healthy dependency (1 % failures, a 50 % threshold) under a
// storm of reloads that change the window's shape and operator resets, with workers spread over
// every stripe, never trips; scribbled stripe counts never reach past the mapping; the largest
// segments work; Validate accepts only headers whose tables fit.
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "shm/admission.h"
#include "shm/breaker.h"
#include "shm/clock.h"
#include "shm/counters.h"
#include "shm/registry.h"
#include "shm/segment.h"
#include "shm/stripes.h"
#include "tests/shm/test_util.h"

namespace retryd::shm {
namespace {

using testing::kMs;
using testing::kSec;

uint64_t Env(const char* n, uint64_t d) {
  const char* v = std::getenv(n);
  return v ? std::strtoull(v, nullptr, 10) : d;
}

struct Storm {
  uint64_t virtual_workers;  // processes writing virtual CPUs' stripes (atomic mode)
  uint64_t cpu_workers;      // processes writing their CPU's stripe (restartable sequences)
  uint64_t reload_us;        // between reloads
  uint64_t reset_every;      // a reset every this many reloads (0: none)
  uint64_t seconds;
};

void RunStorm(const Storm& storm) {
  const std::string name = testing::UniqueSegmentName("storm");
  CreateOptions opt;
  opt.name = name;
  opt.max_dependencies = 4;
  opt.max_processes = 64;
  opt.stripes = kMaxStripes;
  opt.mode = 0600;
  std::unique_ptr<Segment> seg;
  bool adopted = false;
  std::string note;
  ASSERT_TRUE(Segment::CreateOrAdopt(opt, &seg, &adopted, &note).ok());
  Policy p;
  p.min_calls = 20;
  p.failure_rate_pct = 50;
  p.open_for_ms = 1'000;
  const uint32_t index = testing::AddDependency(*seg, "dep", p);
  DependencySlot& slot = *seg->dependency(index);
  auto* stop = static_cast<std::atomic<int>*>(
      mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  std::vector<pid_t> kids;
  const uint64_t vw = storm.virtual_workers;
  for (uint64_t w = 0; w < vw + storm.cpu_workers; ++w) {
    const pid_t kid = fork();
    if (kid == 0) {
      Caller c{RegisterProcess(*seg, getpid()), 0, uint32_t(777 + w)};
      const bool atomic = w < vw;
      if (atomic) c.stripe_mode = StripeMode::kAtomic;
      uint32_t rng = uint32_t(31 + w);
      for (uint64_t n = 1; !stop->load(std::memory_order_relaxed); ++n) {
        if (atomic) {
          // This worker's own virtual CPUs: w, w + vw, w + 2 vw, ... below 1,024.
          const uint32_t k = NextRandom(rng) % ((kMaxStripes - 1 - uint32_t(w)) / uint32_t(vw) + 1);
          c.OnCpu(uint16_t(w + k * vw));
        } else {
          testing::OnCpu(c, CurrentCpu());
        }
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
  } shapes[] = {{10'000, 10}, {1'000, 5}, {600, 3}, {2'000, 10}, {100, 2}, {1'000, 1},
                {700, 7},     {3'000, 4}, {60'000, 1}};
  const uint64_t end = PreciseNowNs() + storm.seconds * kSec;
  uint64_t reloads = 0, resets = 0;
  uint32_t rng = 5;
  for (uint64_t k = 0; PreciseNowNs() < end; ++k) {
    usleep(useconds_t(storm.reload_us));
    Policy q = p;
    const auto& s = shapes[NextRandom(rng) % std::size(shapes)];
    q.window_ms = s.window_ms;
    q.window_buckets = s.buckets;
    StorePolicyOf(slot, q);
    ++reloads;
    if (storm.reset_every != 0 && k % storm.reset_every == 0) {
      Reset(slot, PreciseNowNs());
      ++resets;
    }
  }
  stop->store(1);
  for (const pid_t kid : kids) waitpid(kid, nullptr, 0);
  munmap(stop, 4096);
  std::printf("reloads %llu, resets %llu, calls %llu, stripes used %u, opened %llu\n",
              (unsigned long long)reloads, (unsigned long long)resets,
              (unsigned long long)ReadCounter(slot, kFirstAttempts), WrittenStripes(slot).Count(),
              (unsigned long long)slot.counters[kOpened].load());
  EXPECT_GT(ReadCounter(slot, kFirstAttempts), 10'000u);
  EXPECT_EQ(slot.counters[kOpened].load(), 0u) << "1 % failures tripped a 50 % breaker";
  Segment::Remove(name);
}

TEST(ReloadStormTest, AHealthyDependencyOnAThousandStripesNeverTrips) {
  RunStorm({Env("STORM_VIRTUAL", 3), Env("STORM_CPU", 2), Env("STORM_RELOAD_US", 2'000),
            Env("STORM_RESET_EVERY", 0), Env("STORM_SECONDS", 2)});
}

TEST(ReloadStormTest, AHealthyDependencyNeverTripsThroughResets) {
  RunStorm({Env("STORM_VIRTUAL", 3), Env("STORM_CPU", 2), Env("STORM_RELOAD_US", 2'000),
            Env("STORM_RESET_EVERY", 3), Env("STORM_SECONDS", 2)});
}

}  // namespace
}  // namespace retryd::shm

namespace retryd::shm {
namespace {

// Any stripe count and any count of stripes used, written over the last slot of a segment of
// two stripes a slot, while callers of every stripe number call it and every reader reads it:
// nothing reaches past the mapping (a page that may not be touched follows it).
TEST(ScribbledStripesTest, NothingReachesPastTheMapping) {
  Policy p;
  p.min_calls = 5;
  p.retry_ratio_milli = 100;
  p.retry_burst = 10;
  CreateOptions opt;
  opt.name = "scribbled";
  opt.max_dependencies = 4;
  opt.max_processes = 1;
  opt.stripes = 2;
  std::unique_ptr<Segment> seg;
  ASSERT_TRUE(Segment::CreateSealed(opt, &seg).ok());
  uint32_t index = 0;
  for (int d = 0; d < 4; ++d) ASSERT_TRUE(seg->PutDependency("d" + std::to_string(d), p, &index).ok());
  ASSERT_EQ(index, 3u);
  // The same object mapped again, followed by a page that may not be touched.
  const long page = sysconf(_SC_PAGESIZE);
  const size_t mapped = ((seg->size() + size_t(page) - 1) / size_t(page)) * size_t(page);
  char* base = static_cast<char*>(
      mmap(nullptr, mapped + size_t(page), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(base, MAP_FAILED);
  const int fd = seg->PeerDescriptor(Access::kReadWrite);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(mmap(base, mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0), base);
  close(fd);
  auto& slot = *reinterpret_cast<DependencySlot*>(base + sizeof(SegmentHeader) +
                                                  3 * SlotStride(2));
  ASSERT_EQ(slot.generation.load(), seg->dependency(index)->generation.load());
  const uint32_t values[] = {0, 1, 2, 3, 1000, 1023, 1024, 1025, 4096, 0xFFFF, 0x10000,
                             0x7FFFFFFF, 0xFFFFFFFF};
  uint32_t rng = 3;
  uint64_t now = 10 * kSec;
  for (int i = 0; i < 20'000; ++i, now += kMs) {
    const uint32_t r = NextRandom(rng);
    const uint32_t a = r % 3 == 0 ? NextRandom(rng) : values[r % std::size(values)];
    const uint32_t b = r % 5 == 0 ? NextRandom(rng) : values[(r / 7) % std::size(values)];
    slot.stripe_count.store(a);
    for (auto& word : slot.stripes_written) word.store(uint64_t{b} << 32 | r);
    Caller c{2, 0, r | 1};
    c.stripe_mode = (r / 11) % 2 ? StripeMode::kAtomic : StripeMode::kPerCpu;
    if (c.stripe_mode == StripeMode::kAtomic) c.OnCpu(uint16_t(NextRandom(rng) % 1100));
    else c.OnCpu(CurrentCpu());
    Permit permit;
    Admit(slot, index, (r / 13) % 4 == 0 ? 1 : 0, now, c, &permit);
    Complete(slot, &permit, (r / 17) % 3 == 0 ? Outcome::kFailure : Outcome::kSuccess, kMs, now, c);
    ReadCounter(slot, kSuccesses);
    ReadCounter(slot, kFirstAttempts);
    ReadLatency(slot);
    ReadWindow(slot, now);
    PendingDeposits(slot);
    switch ((r / 19) % 8) {
      case 0: FoldDeposits(slot); break;
      case 1: DropStripeDeposits(slot); break;
      case 2: StartWindowAnew(slot); break;
      case 3: Reset(slot, now); break;
      case 4: {
        Policy q = p;
        q.window_ms = 1'000 * (1 + (r >> 24) % 10);
        StorePolicyOf(slot, q);
        break;
      }
      case 5: {
        seg->Retire(index);
        uint32_t again = 0;
        (void)seg->PutDependency("n" + std::to_string(i), p, &again);
        break;
      }
      default: break;
    }
  }
  munmap(base, mapped + size_t(page));
}

// A scribbled map of the stripes written (every bit set) read by a failure's trip check on a
// thread with a small stack (32 KiB, a guard page below it, as a runtime's threads may have):
// the check reads the window on that thread's stack only, and the thread lives.
TEST(ScribbledStripesTest, AFailureOnASmallStackStaysOnItsStack) {
  CreateOptions opt;
  opt.name = "scribbled-map";
  opt.max_dependencies = 2;
  opt.max_processes = 1;
  opt.stripes = 2;
  std::unique_ptr<Segment> seg;
  ASSERT_TRUE(Segment::CreateSealed(opt, &seg).ok());
  Policy p;
  p.min_calls = 1000;
  uint32_t index = 0;
  ASSERT_TRUE(seg->PutDependency("dep", p, &index).ok());
  DependencySlot& slot = *seg->dependency(index);
  for (auto& word : slot.stripes_written) word.store(~uint64_t{0});
  const int status = testing::RunChild([&] {
    // Below the guard page: bytes no call on the thread may write.
    const size_t below = 64 << 10, guard = 4096, stack = 32 << 10;
    char* m = static_cast<char*>(mmap(nullptr, below + guard + stack, PROT_READ | PROT_WRITE,
                                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (m == MAP_FAILED || mprotect(m + below, guard, PROT_NONE) != 0) return 2;
    std::memset(m, 0xAB, below);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstack(&attr, m + below + guard, stack);
    pthread_t t;
    if (pthread_create(&t, &attr, [](void* arg) -> void* {
          auto& s = *static_cast<DependencySlot*>(arg);
          Caller c{2, 0, 7};
          c.stripe_mode = StripeMode::kAtomic;
          c.OnCpu(0);
          Permit permit;
          Admit(s, 0, 0, 5 * kSec, c, &permit);
          Complete(s, &permit, Outcome::kFailure, kMs, 5 * kSec, c);
          return nullptr;
        }, &slot) != 0) {
      return 2;
    }
    pthread_join(t, nullptr);
    for (size_t i = 0; i < below; ++i) {
      if (static_cast<unsigned char>(m[i]) != 0xAB) return 1;
    }
    return 0;
  });
  ASSERT_TRUE(WIFEXITED(status)) << "the failing call's thread died of signal "
                                 << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the call wrote below its stack's guard page";
}

}  // namespace
}  // namespace retryd::shm

namespace retryd::shm {
namespace {

// The largest segments: 1,024 stripes a slot, thousands of dependencies. They are created,
// attached by name, and work in their last slot's last stripe.
void BigSegment(uint32_t deps, uint32_t procs, bool fill) {
  CreateOptions opt;
  opt.name = testing::UniqueSegmentName("big");
  opt.max_dependencies = deps;
  opt.max_processes = procs;
  opt.stripes = kMaxStripes;
  opt.mode = 0600;
  std::unique_ptr<Segment> seg;
  bool adopted = false;
  std::string note;
  Status s = Segment::CreateOrAdopt(opt, &seg, &adopted, &note);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(seg->size(), SegmentSize(deps, procs, kMaxStripes));
  std::unique_ptr<Segment> other;
  s = Segment::Attach(opt.name, Access::kReadWrite, &other);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(other->header().dependency_slot_size.load(), SlotStride(kMaxStripes));
  uint32_t index = 0;
  const uint32_t n = fill ? deps : 1;
  for (uint32_t d = 0; d < n; ++d) {
    ASSERT_TRUE(other->PutDependency("d" + std::to_string(d), Policy{}, &index).ok()) << d;
  }
  if (!fill) {
    // The last slot, named directly.
    for (uint32_t d = 1; d < deps - 1; ++d) seg->dependency(d)->state.store(1);
    ASSERT_TRUE(other->PutDependency("last", Policy{}, &index).ok());
  }
  ASSERT_EQ(index, deps - 1);
  DependencySlot& slot = *seg->dependency(index);
  Caller c{2, 0, 7};
  for (uint16_t cpu : {uint16_t(1023), uint16_t(0), CurrentCpu()}) {
    c.stripe_mode = cpu == CurrentCpu() ? StripeMode::kPerCpu : StripeMode::kAtomic;
    c.OnCpu(cpu);
    Permit p;
    ASSERT_TRUE(IsAdmitted(Admit(slot, index, 0, CoarseNowNs(), c, &p)));
    Complete(slot, &p, Outcome::kSuccess, kMs, CoarseNowNs(), c);
  }
  const DependencySlot& seen = *other->dependency(index);
  EXPECT_EQ(ReadCounter(seen, kFirstAttempts), 3u);
  EXPECT_EQ(ReadCounter(seen, kSuccesses), 3u);
  EXPECT_EQ(ReadWindow(seen, CoarseNowNs()).calls, 3u);
  EXPECT_EQ(StripeAt(seen, 1023).first_attempts.load(), 1u);
  Segment::Remove(opt.name);
}

TEST(BigSegmentTest, FourThousandDependenciesOfAThousandStripes) { BigSegment(4096, 1024, true); }
TEST(BigSegmentTest, EveryDependencyOfAThousandStripes) {
  // 13 GB of address space, and a page of each of its 65,535 slots in memory: half a minute, on
  // demand (STORM_BIG=1).
  if (Env("STORM_BIG", 0) == 0) GTEST_SKIP() << "on demand: 13 GB of /dev/shm address space and half a minute; run "
                    "with STORM_BIG=1";
  struct statvfs fs;
  if (statvfs("/dev/shm", &fs) != 0 || uint64_t(fs.f_bavail) * fs.f_frsize < (uint64_t{1} << 30)) {
    GTEST_SKIP() << "less than 1 GiB free in /dev/shm, where this named segment lives";
  }
  BigSegment(kMaxDependencies, kMaxProcesses, false);
}

}  // namespace
}  // namespace retryd::shm

namespace retryd::shm {
namespace {

// Headers with random sizes, capacities and stripe counts: whatever Validate accepts lays its
// tables out inside the bytes it was given.
TEST(RandomHeaderTest, ValidateAcceptsOnlyHeadersWhoseTablesFit) {
  std::unique_ptr<Segment> seg = Segment::CreatePrivate(3, 2, Policy{}, 5);
  const SegmentHeader& good = seg->header();
  alignas(64) static unsigned char buf[sizeof(SegmentHeader)];
  uint32_t rng = 11;
  uint64_t accepted = 0;
  for (uint64_t i = 0, n = Env("STORM_HEADERS", 200'000); i < n; ++i) {
    std::memcpy(buf, &good, sizeof(buf));
    auto* h = reinterpret_cast<SegmentHeader*>(buf);
    const uint32_t r = NextRandom(rng);
    auto pick = [&](uint32_t v) -> uint32_t {
      switch (NextRandom(rng) % 6) {
        case 0: return NextRandom(rng);
        case 1: return v + 1;
        case 2: return v - 1;
        case 3: return NextRandom(rng) % 2048;
        case 4: return v * 2;
        default: return v;
      }
    };
    const uint32_t deps = pick(3), procs = pick(2), stripes = pick(5);
    if (r & 1) h->max_dependencies.store(deps);
    if (r & 2) h->max_processes.store(procs);
    if (r & 4) h->stripes_per_slot.store(stripes);
    if (r & 8) h->dependency_slot_size.store(uint32_t(SlotStride(h->stripes_per_slot.load())));
    if (r & 16) h->dependency_slot_size.store(pick(h->dependency_slot_size.load()));
    if (r & 32) {
      h->total_size.store(SegmentSize(h->max_dependencies.load(), h->max_processes.load(),
                                      h->stripes_per_slot.load()));
    }
    if (r & 64) h->total_size.store(pick(uint32_t(h->total_size.load())));
    if (r & 128) h->header_size.store(pick(sizeof(SegmentHeader)));
    const uint64_t size = (r & 256) ? seg->size() : (r & 512) ? NextRandom(rng) : h->total_size.load();
    if (!Segment::Validate(buf, size).ok()) continue;
    ++accepted;
    const uint32_t s = h->stripes_per_slot.load();
    ASSERT_GE(s, 1u);
    ASSERT_LE(s, kMaxStripes);
    ASSERT_EQ(h->dependency_slot_size.load(), SlotStride(s));
    const uint64_t need = sizeof(SegmentHeader) + uint64_t{h->max_dependencies.load()} * SlotStride(s) +
                          uint64_t{h->max_processes.load()} * sizeof(ProcessSlot);
    ASSERT_LE(need, size);
    // The last slot's farthest stripe, and the process table, inside.
    ASSERT_LE(sizeof(SegmentHeader) + uint64_t{h->max_dependencies.load() - 1} * SlotStride(s) +
                  SlotStride(kMaxStripes),
              size);
  }
  std::printf("accepted %llu\n", (unsigned long long)accepted);
  EXPECT_GT(accepted, 0u);
}

}  // namespace
}  // namespace retryd::shm
