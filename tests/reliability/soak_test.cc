// Soak: processes x threads x dependencies hammering admit/complete through the real client
// library for $RETRYD_SOAK_SECONDS (default 5 in the suite), while the real `retryd` ticks every 2 ms and
// reloads a changing config (SIGHUP) every 250 ms. Then the exact invariants, from the
// segment's counters and the workers' own tallies:
//   - retry budget: retries granted <= burst + ratio x first attempts + floor x seconds;
//   - half-open probes in flight <= the limit, bulkhead calls in flight <= the limit, at every
//     grant (checked live by the workers);
//   - counters consistent: admitted = first attempts + retries granted = completions by
//     outcome; rejections by reason = what the workers were told; probes granted = probes
//     admitted; breaker transitions chain (half-opens = opens, less one if it ends open);
//   - no lease left taken, none reclaimed (no worker died, no lease outlived its timeout).
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "retryd/client.h"
#include "shm/admission.h"
#include "shm/breaker.h"
#include "shm/clock.h"
#include "shm/segment.h"
#include "tests/reliability/reliability_util.h"

namespace retryd::reliability {
namespace {

constexpr int kProcesses = 4;
constexpr int kThreads = 3;
constexpr int kDependencies = 4;
const char* const kNames[kDependencies] = {"storm", "pool", "probe", "flaky"};
enum Dep { kStorm = 0, kPool = 1, kProbe = 2, kFlaky = 3 };
constexpr uint32_t kBurst = 20, kRatioMilli = 100, kFloorPerSec = 5;
constexpr int64_t kPoolLimit = 5, kProbeLimit = 2;

// The config alternates between two versions that differ in what the checks do not depend
// on: the breaker thresholds and windows of "flaky", and a dependency that comes and goes.
std::string SoakConfig(const std::string& segment, int version) {
  std::string c = "[daemon]\nsegment = \"" + segment + "\"\nmode = \"0600\"\n"
                  "max_dependencies = 16\nmax_processes = 64\ntick = \"2ms\"\n"
                  "[defaults]\nprobe_timeout = \"1m\"\nbulkhead_timeout = \"1m\"\n"
                  "[dependency.storm]\nretry_burst = " + std::to_string(kBurst) +
                  "\nretry_ratio = 0.1\nmin_retries_per_sec = " + std::to_string(kFloorPerSec) +
                  "\nmin_calls = 1000000\n"
                  "[dependency.pool]\nbulkhead_limit = " + std::to_string(kPoolLimit) +
                  "\nmin_calls = 1000000\n"
                  "[dependency.probe]\nhalf_open_probes = " + std::to_string(kProbeLimit) +
                  "\nclose_after = 255\nmin_calls = 1000000\n"
                  "[dependency.flaky]\nopen_for = \"20ms\"\nopen_for_max = \"80ms\"\n"
                  "open_jitter = \"10ms\"\nclose_after = 2\nhalf_open_probes = 1\n";
  c += version == 0 ? "min_calls = 20\nfailure_rate_threshold = 50\nwindow = \"1s\"\n"
                    : "min_calls = 30\nfailure_rate_threshold = 60\nwindow = \"2s\"\nwindow_buckets = 8\n";
  if (version == 1) c += "[dependency.extra]\nbulkhead_limit = 1\n";
  return c;
}

// What the workers were told, per dependency and decision, summed over every thread.
struct Tally {
  std::atomic<uint64_t> decisions[kDependencies][6];
  std::atomic<uint64_t> retries_granted[kDependencies];
  std::atomic<uint64_t> completions[kDependencies][3];
  std::atomic<int> stop;
};

void WorkerThread(Client* client, const Dependency* deps, Tally* tally, WorkerBoard* board,
                  WorkerCell* cell, uint32_t seed) {
  std::minstd_rand rng{seed};
  while (!tally->stop.load(std::memory_order_relaxed)) {
    const int d = int(rng() % kDependencies);
    // "storm" and "flaky" retry up to 3 times; the others make single attempts.
    const uint32_t attempts = (d == kStorm || d == kFlaky) ? 4 : 1;
    for (uint32_t attempt = 0; attempt < attempts; ++attempt) {
      Permit permit;
      const bool ok = client->Admit(deps[d], attempt, &permit);
      tally->decisions[d][int(permit.decision())].fetch_add(1, std::memory_order_relaxed);
      cell->operations.fetch_add(1, std::memory_order_relaxed);
      if (!ok) break;
      if (attempt > 0) tally->retries_granted[d].fetch_add(1, std::memory_order_relaxed);
      if (d == kPool) board->Acquired(*cell, WorkerBoard::kBulkhead, kPoolLimit);
      if (d == kProbe && permit.probe()) board->Acquired(*cell, WorkerBoard::kProbe, kProbeLimit);
      if (d == kPool || d == kProbe) {
        Spin(uint32_t(rng() % 500));
      }
      if (d == kPool) board->Released(*cell, WorkerBoard::kBulkhead);
      if (d == kProbe && permit.probe()) board->Released(*cell, WorkerBoard::kProbe);
      Outcome outcome = Outcome::kSuccess;
      if (d == kStorm) outcome = Outcome::kFailure;
      if (d == kProbe) outcome = Outcome::kIgnored;  // stays half-open
      if (d == kFlaky) outcome = rng() % 100 < 55 ? Outcome::kFailure : Outcome::kSuccess;
      if (d == kPool && rng() % 10 == 0) outcome = Outcome::kIgnored;
      client->Complete(&permit, outcome, std::chrono::microseconds(rng() % 1000));
      tally->completions[d][int(outcome)].fetch_add(1, std::memory_order_relaxed);
      if (outcome == Outcome::kSuccess) break;
    }
  }
}

int WorkerProcess(const std::string& name, Tally* tally, WorkerBoard* board, int cell_index) {
  std::unique_ptr<Client> client;
  ClientOptions opt;
  opt.segment = name;
  opt.fallback_to_local = false;
  if (!Client::Open(opt, &client).ok()) return 3;
  Dependency deps[kDependencies];
  for (int d = 0; d < kDependencies; ++d) {
    if (!client->Resolve(kNames[d], &deps[d]).ok()) return 4;
  }
  WorkerCell& cell = board->Join(cell_index);
  cell.started.store(1);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back(WorkerThread, client.get(), deps, tally, board, &cell,
                         uint32_t(getpid() * 31 + t));
  }
  for (auto& t : threads) t.join();
  return 0;
}

TEST(SoakTest, InvariantsHoldUnderLoadTicksAndReloads) {
  const double seconds = EnvSeconds("RETRYD_SOAK_SECONDS", 5);
  const std::string name = UniqueName("soak");
  const std::string path = TempFile(".toml");
  WriteFile(path, SoakConfig(name, 0));
  Daemon daemon({"--config=" + path});
  std::unique_ptr<shm::Segment> seg;
  ASSERT_TRUE(AttachWhenReady(name, &seg, shm::Access::kReadOnly)) << daemon.Log();
  {
    // Hold "probe" half-open: a test-only write through a second, writable mapping.
    std::unique_ptr<shm::Segment> rw;
    ASSERT_TRUE(shm::Segment::Attach(name, shm::Access::kReadWrite, &rw).ok());
    rw->dependency(uint32_t(rw->Find("probe")))
        ->breaker.store(shm::BreakerWord{shm::BreakerState::kHalfOpen, 0, 0, 1,
                                         shm::NsToMs32(shm::CoarseNowNs())}.Encode());
  }
  const shm::DependencySlot* slots[kDependencies];
  for (int d = 0; d < kDependencies; ++d) {
    const int32_t i = seg->Find(kNames[d]);
    ASSERT_GE(i, 0);
    slots[d] = seg->dependency(uint32_t(i));
  }
  auto* tally = static_cast<Tally*>(
      mmap(nullptr, sizeof(Tally), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  new (tally) Tally{};
  WorkerBoard* board = WorkerBoard::Create();
  const uint64_t start_ns = NowNs();
  std::vector<pid_t> pids;
  for (int p = 0; p < kProcesses; ++p) {
    const pid_t pid = fork();
    if (pid == 0) _exit(WorkerProcess(name, tally, board, p));
    pids.push_back(pid);
  }
  uint64_t reloads = 0;
  const uint64_t end = start_ns + uint64_t(seconds * 1e9);
  while (NowNs() < end) {
    usleep(250'000);
    WriteFile(path, SoakConfig(name, int(++reloads % 2)));
    daemon.Signal(SIGHUP);
  }
  tally->stop.store(1);
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }
  const double elapsed_s = double(NowNs() - start_ns) / 1e9 + 0.01;
  ASSERT_EQ(waitpid(daemon.pid(), nullptr, WNOHANG), 0) << "retryd died:\n" << daemon.Log();

  uint64_t checks = 0, operations = 0;
  for (int p = 0; p < kProcesses; ++p) operations += board->cells[p].operations.load();
  for (int d = 0; d < kDependencies; ++d) {
    SCOPED_TRACE(kNames[d]);
    const shm::DependencySlot& s = *slots[d];
    auto counter = [&](shm::Counter c) { return shm::ReadCounter(s, c); };
    auto told = [&](Decision dec) { return tally->decisions[d][int(dec)].load(); };
    const uint64_t admitted = told(Decision::kAdmitted) + told(Decision::kAdmittedProbe);
    const uint64_t completed = tally->completions[d][0] + tally->completions[d][1] + tally->completions[d][2];
    // Counters consistent with what the workers were told, exactly.
    EXPECT_EQ(counter(shm::kFirstAttempts) + counter(shm::kRetriesGranted), admitted);
    EXPECT_EQ(counter(shm::kRetriesGranted), tally->retries_granted[d].load());
    EXPECT_EQ(counter(shm::kSuccesses), tally->completions[d][0].load());
    EXPECT_EQ(counter(shm::kFailures), tally->completions[d][1].load());
    EXPECT_EQ(counter(shm::kIgnored), tally->completions[d][2].load());
    EXPECT_EQ(completed, admitted);
    EXPECT_EQ(counter(shm::kRejectedOpen), told(Decision::kRejectedOpen));
    EXPECT_EQ(counter(shm::kRejectedHalfOpenBusy), told(Decision::kRejectedHalfOpenBusy));
    EXPECT_EQ(counter(shm::kRejectedBulkheadFull), told(Decision::kRejectedBulkheadFull));
    EXPECT_EQ(counter(shm::kRetriesDenied), told(Decision::kRejectedBudgetEmpty));
    EXPECT_EQ(counter(shm::kProbesGranted), told(Decision::kAdmittedProbe));
    EXPECT_EQ(counter(shm::kShadowWouldReject), 0u);
    // Breaker transitions chain: every half-open follows an open.
    const auto state = shm::BreakerWord::Decode(s.breaker.load()).state;
    if (d != kProbe) {
      EXPECT_EQ(counter(shm::kHalfOpened) + (state == shm::BreakerState::kOpen ? 1 : 0),
                counter(shm::kOpened));
      EXPECT_LE(counter(shm::kClosed), counter(shm::kHalfOpened));
    }
    // No lease left behind, none reclaimed.
    for (const auto& l : s.probe_leases) EXPECT_EQ(l.load(), 0u);
    for (const auto& l : s.bulkhead_leases) EXPECT_EQ(l.load(), 0u);
    EXPECT_EQ(counter(shm::kLeasesReclaimedDead) + counter(shm::kLeasesReclaimedExpired), 0u);
    checks += 12;
  }
  // The retry budget bound, host-wide.
  const shm::DependencySlot& storm = *slots[kStorm];
  const double bound = kBurst + kRatioMilli / 1000.0 * double(shm::ReadCounter(storm, shm::kFirstAttempts)) +
                       kFloorPerSec * elapsed_s;
  EXPECT_LE(double(storm.counters[shm::kRetriesGranted].load()), bound);
  EXPECT_GT(storm.counters[shm::kRetriesDenied].load(), 0u) << "the budget never ran out";
  // Probes and bulkhead at every grant.
  EXPECT_EQ(board->violations.load(), 0u);
  EXPECT_LE(board->max_live_held[WorkerBoard::kProbe].load(), kProbeLimit);
  EXPECT_LE(board->max_live_held[WorkerBoard::kBulkhead].load(), kPoolLimit);
  EXPECT_GT(slots[kPool]->counters[shm::kRejectedBulkheadFull].load(), 0u) << "the pool never filled";
  EXPECT_GT(slots[kFlaky]->counters[shm::kOpened].load(), 0u) << "flaky never tripped";
  checks += 4 + board->checks.load();
  // The last file written is the one in force: "extra" is configured after an odd number of
  // reloads. However loaded the machine, the daemon gets to it.
  const bool extra_last = reloads % 2 == 1;
  EXPECT_TRUE(WaitUntil([&] { return (seg->Find("extra") >= 0) == extra_last; }, 10'000))
      << "the last config written was never applied:\n" << daemon.Log();
  const uint64_t generation = seg->header().generation.load();
  daemon.Signal(SIGTERM);
  EXPECT_EQ(daemon.Wait(10'000), 0) << daemon.Log();
  const std::string log = daemon.Log();
  uint64_t applied = 0;
  for (size_t at = log.find("reload: "); at != std::string::npos; at = log.find("reload: ", at + 1)) {
    applied += log.compare(at, 8, "reload: ") == 0 && log.find(" applied", at) < log.find('\n', at);
  }
  // Signals of one kind do not queue: two SIGHUPs that the daemon had no turn to read between
  // arrive as one, and that one reload reads the later file (a loaded run kept its loop off a
  // CPU for 490 ms: 17 signals, 16 reloads, the last file applied). So no more reloads than
  // signals, at least one, each counted in the segment's generation (1 at start), and the last
  // file applied (above).
  EXPECT_LE(applied, reloads) << log;
  EXPECT_GE(applied, 1u) << log;
  EXPECT_EQ(generation, 1 + applied) << log;
  Figure("seconds", elapsed_s);
  Figure("operations", double(operations));
  Figure("operations_per_second", double(operations) / elapsed_s);
  Figure("reloads", double(reloads));
  Figure("invariant_checks", double(checks));
  Figure("retries_granted", double(storm.counters[shm::kRetriesGranted].load()));
  Figure("retry_bound", bound);
  Figure("breaker_opens_flaky", double(slots[kFlaky]->counters[shm::kOpened].load()));
  WorkerBoard::Destroy(board);
  shm::Segment::Remove(name);
  unlink(path.c_str());
}

}  // namespace
}  // namespace retryd::reliability
