// The headline promise under a storm: never more probes in a half-open episode than the policy
// allows, whatever 50 processes racing through thousands of trip -> half-open -> probe ->
// close or reopen cycles do.
//
// The processes share one real segment and one virtual clock (a word every admit advances), so
// that an open period lasts a number of admits, not of seconds: tens of thousands of episodes in
// seconds, with every probe outcome, success or failure, racing the admits of 49 other processes.
// Each process tallies, per half-open episode (the breaker seq its probe was granted under), the
// probes it was granted and the successes it reported; the sums must satisfy, per episode,
//   probes granted <= half_open_probes + min(successes reported, close_after - 1)
// since a probe place comes back only after a success that did not close the breaker: after a
// failure, or after the success that closes it, not one more probe may go out in that episode.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <vector>

#include <gtest/gtest.h>

#include "shm/admission.h"
#include "shm/breaker.h"
#include "shm/registry.h"
#include "shm/stripes.h"
#include "tests/sanitized.h"
#include "tests/shm/test_util.h"

namespace retryd::shm {
namespace {

constexpr int kProcesses = 50;
constexpr uint64_t kEpisodes = 10'000;
// Virtual ns each admit moves the shared clock: an open period of 1 ms is 1,000 admits.
constexpr uint64_t kStepNs = 1'000;
// A bound on each process's admits, so that a breaker that stops cycling fails the test rather
// than hanging it.
constexpr uint64_t kMaxAdmitsPerProcess = 20'000'000;

struct Tally {
  std::atomic<uint32_t> granted;
  std::atomic<uint32_t> succeeded;
};

// Shared across the forks: the clock, and one tally per breaker seq (an episode's seq is unique
// while fewer than 65,536 transitions happen: checked below).
struct Shared {
  std::atomic<uint64_t> clock_ns;
  std::atomic<bool> stop;
  Tally tally[65536];
};

Shared* MapShared() {
  void* p = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::runtime_error("mmap");
  return new (p) Shared{};
}

struct Shape {
  uint32_t half_open_probes;
  uint32_t close_after;
  // Probes time out: a fifth of them are held past their 1 ms timeout, and two processes sweep
  // expired leases as the daemon does, so expiries race the workers' admits and completions.
  bool expiring = false;
};

// RunStorm runs one storm of kEpisodes half-open episodes on a fresh segment and checks every
// episode's tally.
void RunStorm(const Shape& shape) {
  testing::NamedSegment seg("probe-stress", 4, 64);
  Policy p;
  p.half_open_probes = shape.half_open_probes;
  p.close_after = shape.close_after;
  p.min_calls = 4;
  p.failure_rate_pct = 50;
  p.open_for_ms = 1;
  p.open_for_max_ms = 1;
  p.open_jitter_ms = 0;
  // Without expiry every outcome is a worker's own.
  p.probe_timeout_ms = shape.expiring ? 1 : 86'400'000;
  p.retry_burst = 1'000'000;
  const uint32_t index = testing::AddDependency(*seg.seg, "orders", p);
  DependencySlot& slot = *seg.seg->dependency(index);
  Shared* shared = MapShared();
  shared->clock_ns.store(uint64_t{1} << 40);

  std::vector<pid_t> pids;
  for (int w = 0; w < kProcesses; ++w) {
    const pid_t pid = fork();
    if (pid == 0) {
      std::unique_ptr<Segment> mine;
      if (!Segment::Attach(seg.name, Access::kReadWrite, &mine).ok()) _exit(3);
      DependencySlot& s = *mine->dependency(index);
      // Every process writes the shared words (no stripe): the probe path is the one under test.
      Caller caller{RegisterProcess(*mine, getpid()), 0, uint32_t(w * 7919 + 1)};
      uint32_t rng = uint32_t(w + 1) * 2654435761u;
      for (uint64_t i = 0; i < kMaxAdmitsPerProcess; ++i) {
        if ((i & 255) == 0 && shared->stop.load(std::memory_order_relaxed)) break;
        const uint64_t now = shared->clock_ns.fetch_add(kStepNs) + kStepNs;
        if (shape.expiring && w < 2) {  // a sweeper, as the daemon's tick
          ReclaimExpired(s, now, caller, Sweep::kAllWords);
          continue;
        }
        Permit permit;
        const Decision d = Admit(s, index, 0, now, caller, &permit);
        // Half the probes fail, half succeed; three closed calls in four fail, so the breaker
        // trips again soon after every close.
        const bool fail = d == Decision::kAdmittedProbe ? (NextRandom(rng) & 1) != 0
                                                        : (NextRandom(rng) & 3) != 0;
        if (d == Decision::kAdmittedProbe) {
          Tally& t = shared->tally[permit.breaker_seq];
          t.granted.fetch_add(1);
          if (shape.expiring && (NextRandom(rng) % 5) == 0) {
            shared->clock_ns.fetch_add(2'000'000);  // held past its timeout
          }
          // A success counts only while the probe holds its place (not expired and swept).
          if (!fail && s.probe_leases[permit.probe_index].load() == permit.probe_lease) {
            t.succeeded.fetch_add(1);
          }
        }
        Complete(s, &permit, fail ? Outcome::kFailure : Outcome::kSuccess, 0,
                 shared->clock_ns.load(), caller);
        // With expiry, the storm goes on until a sweeper has timed a probe out: a loaded
        // machine can leave the two sweepers unscheduled for all of kEpisodes.
        if (s.counters[kHalfOpened].load(std::memory_order_relaxed) >= kEpisodes &&
            (!shape.expiring || ReadCounter(s, kProbeTimeouts) > 0)) {
          shared->stop.store(true);
        }
      }
      _exit(0);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }

  const uint64_t episodes = slot.counters[kHalfOpened].load();
  EXPECT_GE(episodes, kEpisodes) << "the breaker stopped cycling";
  // Each episode is at most three transitions (half-open, close, trip): seqs did not wrap.
  EXPECT_LT(slot.counters[kHalfOpened].load() + slot.counters[kOpened].load() +
                slot.counters[kClosed].load(),
            65536u);
  uint64_t granted = 0, violations = 0, with_extra_success = 0;
  std::string first;
  for (uint32_t seq = 0; seq < 65536; ++seq) {
    const uint32_t g = shared->tally[seq].granted.load();
    const uint32_t ok = shared->tally[seq].succeeded.load();
    granted += g;
    const uint32_t allowed = shape.half_open_probes + std::min(ok, shape.close_after - 1);
    if (g > shape.half_open_probes) ++with_extra_success;
    if (g > allowed) {
      if (++violations == 1) {
        first = "episode seq " + std::to_string(seq) + ": " + std::to_string(g) +
                " probes granted, " + std::to_string(ok) + " successes reported, allowed " +
                std::to_string(allowed);
      }
    }
  }
  EXPECT_EQ(violations, 0u) << first;
  // The workers' tallies and the segment's own count agree; probes expired only if they could.
  EXPECT_EQ(granted, ReadCounter(slot, kProbesGranted));
  if (shape.expiring) {
    EXPECT_GT(ReadCounter(slot, kProbeTimeouts), 0u);
  } else {
    EXPECT_EQ(ReadCounter(slot, kProbeTimeouts), 0u);
  }
  // The storm was real: many episodes, and (close_after > 1) probes granted after successes.
  EXPECT_GE(granted * 10, episodes * 9);
  if (shape.close_after > 1) {
    EXPECT_GT(with_extra_success, 0u);
  }
  ::testing::Test::RecordProperty("episodes", std::to_string(episodes));
  ::testing::Test::RecordProperty("probes_granted", std::to_string(granted));
  munmap(shared, sizeof(Shared));
}

class ProbeStressTest : public ::testing::TestWithParam<Shape> {};

// Three storms in a row: a race that shows once in a few storms shows here. One under a sanitizer,
// which sees every access of the storm it runs (Rounds, tests/sanitized.h).
TEST_P(ProbeStressTest, NoEpisodeGrantsMoreProbesThanThePolicyAllows) {
  for (int storm = 0; storm < Rounds(3) && !HasFailure(); ++storm) {
    SCOPED_TRACE("storm " + std::to_string(storm));
    RunStorm(GetParam());
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, ProbeStressTest,
                         ::testing::Values(Shape{1, 1}, Shape{2, 3}, Shape{1, 1, true}),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           return "Probes" + std::to_string(info.param.half_open_probes) +
                                  "CloseAfter" + std::to_string(info.param.close_after) +
                                  (info.param.expiring ? "Expiring" : "");
                         });

}  // namespace
}  // namespace retryd::shm
