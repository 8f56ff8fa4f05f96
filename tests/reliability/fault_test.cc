// Faults with real processes and real signals, repeated with random timing:
//   - workers SIGKILLed at random instants inside admit/complete while they hold half-open probe
//     and bulkhead leases, with leases reclaimed by expiry (no daemon), by the daemon's reaper
//     in process, and by the real `retryd`: no lease lost for good, no limit ever exceeded
//     among live workers, every reclaim counted;
//   - the `retryd` daemon SIGKILLed and restarted while workers run at full speed: the workers
//     never block or fail, limits hold, the segment and its state are adopted;
//   - an incompatible segment (newer layout, other capacity): the new daemon retires it and the
//     running clients move to the new one on their next admit;
//   - pid reuse: a dead worker's pid given to a new process does not keep its leases alive.
// The length of each kill campaign is $RETRYD_FAULT_SECONDS (default 2 s per variant in the suite; any length on demand).
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "retryd/client.h"
#include "shm/admission.h"
#include "shm/breaker.h"
#include "shm/clock.h"
#include "shm/dependency_table.h"
#include "shm/registry.h"
#include "shm/segment.h"
#include "tests/reliability/reliability_util.h"

namespace retryd::reliability {
namespace {

using shm::DependencySlot;

constexpr int kWorkers = 6;
constexpr int64_t kProbeLimit = 2;
constexpr int64_t kBulkheadLimit = 3;

// The config of the killed workers' segment: "probed" is held half-open (every probe is
// ignored, so it never closes; an expired probe reopens it for 1 ms only), "bulk" is closed
// with a bulkhead. `lease_ms` is both lease timeouts.
std::string KillConfig(const std::string& segment, int lease_ms) {
  const std::string lease = "\"" + std::to_string(lease_ms) + "ms\"";
  return "[daemon]\nsegment = \"" + segment + "\"\nmode = \"0600\"\nmax_dependencies = 8\n"
         "max_processes = 256\ntick = \"5ms\"\n"
         "[defaults]\nmin_calls = 1000000\nopen_for = \"1ms\"\nopen_for_max = \"1ms\"\n"
         "open_jitter = \"0ms\"\nclose_after = 255\n"
         "probe_timeout = " + lease + "\nbulkhead_timeout = " + lease + "\n"
         "[dependency.probed]\nhalf_open_probes = " + std::to_string(kProbeLimit) +
         "\nbulkhead_limit = " + std::to_string(kBulkheadLimit) + "\n"
         "[dependency.bulk]\nbulkhead_limit = " + std::to_string(kBulkheadLimit) + "\n";
}

shm::Policy KillPolicy(int lease_ms, bool probed) {
  shm::Policy p;
  p.min_calls = 1'000'000;
  p.open_for_ms = 1;
  p.open_for_max_ms = 1;
  p.open_jitter_ms = 0;
  p.close_after = 255;
  p.probe_timeout_ms = uint32_t(lease_ms);
  p.bulkhead_timeout_ms = uint32_t(lease_ms);
  p.half_open_probes = probed ? uint32_t(kProbeLimit) : 1;
  p.bulkhead_limit = uint32_t(kBulkheadLimit);
  return p;
}

void HoldHalfOpen(DependencySlot& slot) {
  const shm::BreakerWord b = shm::BreakerWord::Decode(slot.breaker.load());
  slot.breaker.store(shm::BreakerWord{shm::BreakerState::kHalfOpen, 0, 0, uint16_t(b.seq + 1),
                                      shm::NsToMs32(shm::CoarseNowNs())}
                         .Encode());
}

int TakenLeases(const DependencySlot& slot) {
  int n = 0;
  for (const auto& l : slot.probe_leases) n += l.load() != 0;
  for (const auto& l : slot.bulkhead_leases) n += l.load() != 0;
  return n;
}

uint64_t Reclaimed(const DependencySlot& slot) {
  return slot.counters[shm::kLeasesReclaimedDead].load() +
         slot.counters[shm::kLeasesReclaimedExpired].load();
}

// KillableWorker hammers "probed" and "bulk" together, holding both leases across a short
// random pause, until it is killed. Runs in a forked child.
[[noreturn]] void KillableWorker(const std::string& name, uint32_t probed, uint32_t bulk,
                                 WorkerBoard* board, int cell_index) {
  std::unique_ptr<shm::Segment> seg;
  if (!shm::Segment::Attach(name, shm::Access::kReadWrite, &seg).ok()) {
    board->errors.fetch_add(1);
    _exit(3);
  }
  WorkerCell& cell = board->Join(cell_index);
  shm::Caller caller{shm::RegisterProcess(*seg, getpid()), 0, uint32_t(getpid()) | 1u};
  DependencySlot& p = *seg->dependency(probed);
  DependencySlot& b = *seg->dependency(bulk);
  std::minstd_rand rng{uint32_t(getpid())};
  for (uint64_t n = 0;; ++n) {
    shm::Permit pp, bp;
    shm::Admit(p, probed, 0, shm::CoarseNowNs(), caller, &pp);
    const bool probe = pp.flags & shm::kPermitProbe;
    const bool probe_bulk = pp.flags & shm::kPermitBulkhead;
    if (probe) board->Acquired(cell, WorkerBoard::kProbe, kProbeLimit);
    shm::Admit(b, bulk, 0, shm::CoarseNowNs(), caller, &bp);
    const bool bulk_lease = bp.flags & shm::kPermitBulkhead;
    if (bulk_lease) board->Acquired(cell, WorkerBoard::kBulkhead, kBulkheadLimit);
    cell.operations.fetch_add(2, std::memory_order_relaxed);
    if (n == 0) cell.started.store(1);
    Spin(uint32_t(rng() % 2000));
    // A lease taken back while its live holder still runs would be a double grant.
    if ((probe && p.probe_leases[pp.probe_index].load() != pp.probe_lease) ||
        (probe_bulk && p.bulkhead_leases[pp.bulkhead_index].load() != pp.bulkhead_lease) ||
        (bulk_lease && b.bulkhead_leases[bp.bulkhead_index].load() != bp.bulkhead_lease)) {
      board->lost_while_held.fetch_add(1);
    }
    if (bulk_lease) board->Released(cell, WorkerBoard::kBulkhead);
    shm::Complete(b, &bp, shm::Outcome::kSuccess, 1000, shm::CoarseNowNs(), caller);
    if (probe) board->Released(cell, WorkerBoard::kProbe);
    shm::Complete(p, &pp, shm::Outcome::kIgnored, 1000, shm::CoarseNowNs(), caller);
  }
}

enum class Reclaimer { kExpiry, kReaper, kDaemon };

class WorkerKillTest : public ::testing::TestWithParam<Reclaimer> {};

// Rounds of kWorkers workers, each SIGKILLed after a random 0-3 ms, one after the other, so
// that survivors keep admitting while the dead ones' leases come back.
TEST_P(WorkerKillTest, LeasesComeBackAndLimitsHold) {
  const Reclaimer how = GetParam();
  const double seconds = EnvSeconds("RETRYD_FAULT_SECONDS", 2);
  // By expiry the leases must come back soon; otherwise long timeouts prove that the reclaim
  // came from the death, not from the clock.
  const int lease_ms = how == Reclaimer::kExpiry ? 400 : 60'000;
  const std::string name = UniqueName("kill");
  std::unique_ptr<Daemon> daemon;
  std::unique_ptr<shm::Segment> seg;
  uint32_t probed = 0, bulk = 0;
  if (how == Reclaimer::kDaemon) {
    const std::string config = TempFile(".toml");
    WriteFile(config, KillConfig(name, lease_ms));
    daemon = std::make_unique<Daemon>(std::vector<std::string>{"--config=" + config});
    ASSERT_TRUE(AttachWhenReady(name, &seg)) << daemon->Log();
    probed = uint32_t(seg->Find("probed"));
    bulk = uint32_t(seg->Find("bulk"));
  } else {
    ASSERT_TRUE(CreateSegment(name, 256, &seg).ok());
    ASSERT_TRUE(seg->PutDependency("probed", KillPolicy(lease_ms, true), &probed).ok());
    ASSERT_TRUE(seg->PutDependency("bulk", KillPolicy(lease_ms, false), &bulk).ok());
  }
  DependencySlot& p = *seg->dependency(probed);
  DependencySlot& b = *seg->dependency(bulk);
  WorkerBoard* board = WorkerBoard::Create();
  shm::DeadOwnerReaper reaper;
  shm::Caller janitor{0, 0, 99};
  std::mt19937 rng{uint32_t(getpid())};
  uint64_t kills = 0, kills_holding = 0, rounds = 0, operations = 0, left_taken = 0,
           reaper_freed = 0;
  const uint64_t reclaimed_before = Reclaimed(p) + Reclaimed(b);
  const uint64_t end = NowNs() + uint64_t(seconds * 1e9);
  while (NowNs() < end && !HasFailure()) {
    board->Reset();
    HoldHalfOpen(p);
    std::vector<std::pair<pid_t, int>> pids;  // and their cells
    for (int w = 0; w < kWorkers; ++w) {
      const pid_t pid = fork();
      if (pid == 0) KillableWorker(name, probed, bulk, board, w);
      pids.push_back({pid, w});
    }
    ASSERT_TRUE(WaitUntil([&] {
      for (int w = 0; w < kWorkers; ++w) {
        if (!board->cells[w].started.load()) return false;
      }
      return true;
    }, 10'000)) << "workers did not start";
    std::shuffle(pids.begin(), pids.end(), rng);
    for (const auto& [pid, w] : pids) {
      usleep(useconds_t(rng() % 3000));
      kill(pid, SIGKILL);
      int status = 0;
      waitpid(pid, &status, 0);
      EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
      ++kills;
      // Killed with leases in hand (a lower bound: counts trail the lease by a few instructions).
      kills_holding += board->cells[w].held[0].load() + board->cells[w].held[1].load() > 0;
      if (how == Reclaimer::kReaper) reaper_freed += reaper.Tick(*seg);
    }
    ++rounds;
    for (int w = 0; w < kWorkers; ++w) operations += board->cells[w].operations.exchange(0);
    // Every worker is dead; whatever is still taken belongs to the dead.
    left_taken += uint64_t(TakenLeases(p) + TakenLeases(b));
    switch (how) {
      case Reclaimer::kExpiry:
        usleep(useconds_t(lease_ms) * 1000 + 20'000);
        shm::ReclaimExpired(p, shm::CoarseNowNs(), janitor, shm::Sweep::kAllWords);
        shm::ReclaimExpired(b, shm::CoarseNowNs(), janitor, shm::Sweep::kAllWords);
        shm::ReclaimDeadProcesses(*seg);  // frees the dead workers' registry slots
        break;
      case Reclaimer::kReaper:
        reaper_freed += reaper.Tick(*seg);
        break;
      case Reclaimer::kDaemon:
        break;
    }
    // No lease is lost for good: all come back (the daemon within a few ticks).
    EXPECT_TRUE(WaitUntil([&] { return TakenLeases(p) + TakenLeases(b) == 0; }, 5'000))
        << "round " << rounds << ": " << TakenLeases(p) + TakenLeases(b) << " leases still taken";
  }
  const uint64_t reclaimed = Reclaimed(p) + Reclaimed(b) - reclaimed_before;
  EXPECT_EQ(board->violations.load(), 0u) << "a limit was exceeded among live workers";
  EXPECT_EQ(board->lost_while_held.load(), 0u) << "a live worker's lease was taken back";
  EXPECT_EQ(board->errors.load(), 0u);
  EXPECT_LE(board->max_live_held[WorkerBoard::kProbe].load(), kProbeLimit);
  EXPECT_LE(board->max_live_held[WorkerBoard::kBulkhead].load(), kBulkheadLimit);
  EXPECT_GE(board->max_live_held[WorkerBoard::kProbe].load(), 1);
  // Every lease still taken when a round ended came back, and was counted.
  EXPECT_GE(reclaimed, left_taken);
  EXPECT_GT(reclaimed, 0u);
  if (how == Reclaimer::kReaper) {
    EXPECT_EQ(p.counters[shm::kLeasesReclaimedDead].load() + b.counters[shm::kLeasesReclaimedDead].load(),
              reaper_freed);
  }
  if (how != Reclaimer::kExpiry) {
    // With minute-long timeouts, every reclaim came from a death being noticed.
    EXPECT_EQ(p.counters[shm::kLeasesReclaimedExpired].load() +
                  b.counters[shm::kLeasesReclaimedExpired].load(), 0u);
  }
  if (daemon) {
    daemon->Signal(SIGTERM);
    EXPECT_EQ(daemon->Wait(5'000), 0) << daemon->Log();
  }
  Figure("rounds", double(rounds));
  Figure("kills", double(kills));
  Figure("kills_holding_leases", double(kills_holding));
  Figure("operations", double(operations));
  Figure("leases_reclaimed", double(reclaimed));
  Figure("leases_held_by_the_dead_at_round_end", double(left_taken));
  Figure("limit_checks", double(board->checks.load()));
  Figure("max_live_probes", double(board->max_live_held[WorkerBoard::kProbe].load()));
  Figure("max_live_bulkhead", double(board->max_live_held[WorkerBoard::kBulkhead].load()));
  WorkerBoard::Destroy(board);
  shm::Segment::Remove(name);
}

INSTANTIATE_TEST_SUITE_P(Reclaimers, WorkerKillTest,
                         ::testing::Values(Reclaimer::kExpiry, Reclaimer::kReaper, Reclaimer::kDaemon),
                         [](const auto& info) {
                           switch (info.param) {
                             case Reclaimer::kExpiry: return "ExpiryOnly";
                             case Reclaimer::kReaper: return "InProcessReaper";
                             case Reclaimer::kDaemon: return "RetrydDaemon";
                           }
                           return "unknown";
                         });

// --- Client workers on the real library ------------------------------------------------------

// ClientWorker runs the real client library against "orders" (bulkhead) and "frozen" (held
// open) until `stop` is set; it counts ops, admit latency and anything unexpected.
struct ClientFlags {
  std::atomic<int> stop;
};

int ClientWorker(const std::string& name, WorkerBoard* board, int cell_index, ClientFlags* flags,
                 int64_t bulkhead_limit, bool expect_frozen_open) {
  std::unique_ptr<Client> client;
  ClientOptions opt;
  opt.segment = name;
  opt.fallback_to_local = false;
  if (!Client::Open(opt, &client).ok()) return 3;
  Dependency orders, frozen;
  if (!client->Resolve("orders", &orders).ok() || !client->Resolve("frozen", &frozen).ok()) return 4;
  WorkerCell& cell = board->Join(cell_index);
  cell.started.store(1);
  while (!flags->stop.load(std::memory_order_relaxed)) {
    Permit permit;
    const uint64_t t0 = NowNs();
    const BlockWatch watch;
    const bool ok = client->Admit(orders, 0, &permit);
    if (watch.Slept()) board->blocked.fetch_add(1);
    const uint64_t took = NowNs() - t0;
    uint64_t seen = board->max_admit_ns.load(std::memory_order_relaxed);
    while (took > seen && !board->max_admit_ns.compare_exchange_weak(seen, took)) {
    }
    if (ok) {
      board->Acquired(cell, WorkerBoard::kBulkhead, bulkhead_limit);
      cell.admitted.fetch_add(1, std::memory_order_relaxed);
      board->Released(cell, WorkerBoard::kBulkhead);
    } else if (permit.decision() != Decision::kRejectedBulkheadFull) {
      board->errors.fetch_add(1);
    }
    client->Complete(&permit, Outcome::kSuccess, std::chrono::microseconds(50));
    Permit f;
    if (client->Admit(frozen, 0, &f) == expect_frozen_open) board->errors.fetch_add(1);
    client->Complete(&f, Outcome::kSuccess, std::chrono::microseconds(50));
    cell.operations.fetch_add(2, std::memory_order_relaxed);
  }
  return 0;
}

std::string ClientConfig(const std::string& segment, uint32_t max_processes) {
  return "[daemon]\nsegment = \"" + segment + "\"\nmode = \"0600\"\nmax_dependencies = 8\n"
         "max_processes = " + std::to_string(max_processes) + "\ntick = \"5ms\"\n"
         "[defaults]\nmin_calls = 1000000\n"
         "[dependency.orders]\nbulkhead_limit = 4\n"
         "[dependency.frozen]\nopen_for = \"10m\"\nopen_for_max = \"10m\"\n";
}

std::vector<pid_t> StartClientWorkers(int n, const std::string& name, WorkerBoard* board,
                                      ClientFlags* flags, bool expect_frozen_open) {
  std::vector<pid_t> pids;
  const pid_t parent = getpid();
  for (int w = 0; w < n; ++w) {
    const pid_t pid = fork();
    if (pid == 0) {
      // A test killed by ctest's timeout never stops its workers: they die with it instead of
      // running flat out through the rest of the suite.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);
      _exit(ClientWorker(name, board, w, flags, 4, expect_frozen_open));
    }
    pids.push_back(pid);
  }
  return pids;
}

void StopClientWorkers(const std::vector<pid_t>& pids, ClientFlags* flags) {
  flags->stop.store(1);
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "worker status " << status;
  }
}

template <typename T>
T* SharedPage() {
  void* p = mmap(nullptr, sizeof(T), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  return new (p) T{};
}

// The daemon SIGKILLed at random instants and restarted, while client workers run flat out.
TEST(DaemonKillTest, WorkersNeverNoticeAndStateIsAdopted) {
  const double seconds = EnvSeconds("RETRYD_FAULT_SECONDS", 2);
  const std::string name = UniqueName("dkill");
  const std::string config = TempFile(".toml");
  WriteFile(config, ClientConfig(name, 64));
  const std::vector<std::string> args{"--config=" + config};
  auto daemon = std::make_unique<Daemon>(args);
  std::unique_ptr<shm::Segment> seg;
  ASSERT_TRUE(AttachWhenReady(name, &seg)) << daemon->Log();
  const uint64_t created = seg->header().created_unix_ms.load();
  // "frozen" tripped open for ten minutes: every restart must keep it open.
  DependencySlot& frozen = *seg->dependency(uint32_t(seg->Find("frozen")));
  const uint32_t until = shm::NsToMs32(shm::CoarseNowNs()) + 600'000;
  frozen.breaker.store(shm::BreakerWord{shm::BreakerState::kOpen, 0, 0, 7, until}.Encode());

  WorkerBoard* board = WorkerBoard::Create();
  auto* flags = SharedPage<ClientFlags>();
  const std::vector<pid_t> pids = StartClientWorkers(4, name, board, flags, true);
  ASSERT_TRUE(WaitUntil([&] {
    for (int w = 0; w < 4; ++w) {
      if (!board->cells[w].started.load()) return false;
    }
    return true;
  }, 10'000));
  std::mt19937 rng{uint32_t(getpid())};
  uint64_t kills = 0, adoptions = 0;
  const uint64_t end = NowNs() + uint64_t(seconds * 1e9);
  while (NowNs() < end) {
    usleep(useconds_t(20'000 + rng() % 200'000));
    daemon->KillHard();  // wherever it was: mid-tick, mid-sweep, mid-reclaim
    ++kills;
    usleep(useconds_t(rng() % 100'000));  // down for a while
    daemon = std::make_unique<Daemon>(args);
    const pid_t pid = daemon->pid();
    ASSERT_TRUE(WaitUntil([&] { return seg->header().daemon_pid.load() == uint32_t(pid); }, 10'000))
        << daemon->Log();
    adoptions += daemon->Log().find("adopted") != std::string::npos;
  }
  uint64_t operations = 0;
  for (int w = 0; w < 4; ++w) operations += board->cells[w].operations.load();
  StopClientWorkers(pids, flags);
  EXPECT_EQ(board->errors.load(), 0u) << "an admit was refused for another reason than the limit";
  EXPECT_EQ(board->violations.load(), 0u);
  EXPECT_LE(board->max_live_held[WorkerBoard::kBulkhead].load(), 4);
  EXPECT_EQ(board->blocked.load(), 0u) << "an admit slept (waited in the kernel)";
  EXPECT_EQ(adoptions, kills) << daemon->Log();
  // The same segment throughout, and the open breaker is still the one set above.
  EXPECT_EQ(seg->header().retired.load(), 0u);
  EXPECT_EQ(seg->header().created_unix_ms.load(), created);
  const shm::BreakerWord b = shm::BreakerWord::Decode(frozen.breaker.load());
  EXPECT_EQ(b.state, shm::BreakerState::kOpen);
  EXPECT_EQ(b.time_ms, until);
  EXPECT_GT(frozen.counters[shm::kRejectedOpen].load(), 0u);
  daemon->Signal(SIGTERM);
  EXPECT_EQ(daemon->Wait(5'000), 0);
  Figure("daemon_kills", double(kills));
  Figure("operations", double(operations));
  Figure("limit_checks", double(board->checks.load()));
  Figure("max_admit_ms", double(board->max_admit_ns.load()) / 1e6);
  WorkerBoard::Destroy(board);
  shm::Segment::Remove(name);
  unlink(config.c_str());
}

// An incompatible segment at the name: the new daemon retires it and replaces it, and the
// clients still on it move to the new one on their next admit. Older layout is the upgrade
// path: a segment of layout 3 (its slots without the per-CPU stripes) left by the retryd before,
// whose header keeps `retired` where layout 4 has it.
enum class Incompatibility { kOtherCapacity, kNewerLayout, kOlderLayout, kLayout7 };
class IncompatibleSegmentTest : public ::testing::TestWithParam<Incompatibility> {};

TEST_P(IncompatibleSegmentTest, DaemonRetiresItAndClientsMoveOver) {
  const Incompatibility kind = GetParam();
  const bool same_capacity = kind != Incompatibility::kOtherCapacity;
  const std::string name = UniqueName("retire");
  const std::string config = TempFile(".toml");
  WriteFile(config, ClientConfig(name, 64));
  auto daemon = std::make_unique<Daemon>(std::vector<std::string>{"--config=" + config});
  std::unique_ptr<shm::Segment> old_seg;
  ASSERT_TRUE(AttachWhenReady(name, &old_seg)) << daemon->Log();
  WorkerBoard* board = WorkerBoard::Create();
  auto* flags = SharedPage<ClientFlags>();
  const std::vector<pid_t> pids = StartClientWorkers(3, name, board, flags, false);
  ASSERT_TRUE(WaitUntil([&] {
    return board->cells[0].started && board->cells[1].started && board->cells[2].started;
  }, 10'000));
  daemon->KillHard();
  static_assert(shm::kLayoutVersion > 3, "the older layout below is layout 3, with smaller slots");
  static_assert(offsetof(shm::SegmentHeader, retired) == 64, "where layout 3 has it");
  switch (kind) {
    case Incompatibility::kNewerLayout:
      old_seg->header().layout_version.store(shm::kLayoutVersion + 1);  // as a newer retryd left it
      break;
    case Incompatibility::kOlderLayout:
      old_seg->header().layout_version.store(3);  // as the retryd of layout 3 left it
      old_seg->header().dependency_slot_size.store(26 * 64);
      break;
    case Incompatibility::kLayout7:
      // As the retryd of layout 7 left it: 32 stripes inside every 8,000-byte slot, and no
      // stripe count in the header.
      old_seg->header().layout_version.store(7);
      old_seg->header().dependency_slot_size.store(8000);
      old_seg->header().stripes_per_slot.store(0);
      break;
    case Incompatibility::kOtherCapacity:
      WriteFile(config, ClientConfig(name, 128));  // restarted with another capacity
      break;
  }
  daemon = std::make_unique<Daemon>(std::vector<std::string>{"--config=" + config});
  ASSERT_TRUE(daemon->WaitForLog("created a new one", 10'000)) << daemon->Log();
  EXPECT_EQ(old_seg->header().retired.load(), 1u);
  std::unique_ptr<shm::Segment> fresh;
  ASSERT_TRUE(WaitUntil([&] { return shm::Segment::Attach(name, shm::Access::kReadOnly, &fresh).ok(); },
                        5'000));
  EXPECT_EQ(fresh->header().layout_version.load(), shm::kLayoutVersion);
  EXPECT_EQ(fresh->max_processes(), same_capacity ? 64u : 128u);
  // Every worker registers in the new segment and admits there.
  auto registered = [&] {
    int n = 0;
    for (uint32_t i = 0; i < fresh->max_processes(); ++i) {
      const pid_t pid = pid_t(uint32_t(fresh->process(i)->owner.load()));
      n += std::count(pids.begin(), pids.end(), pid) > 0;
    }
    return n;
  };
  EXPECT_TRUE(WaitUntil([&] { return registered() == 3; }, 5'000)) << registered();
  // The new daemon puts its dependencies after it says it created the segment: until then,
  // Find says -1 (which, read as a slot index, took the test to a wild pointer and a crash).
  int32_t orders_index = -1;
  ASSERT_TRUE(WaitUntil([&] { return (orders_index = fresh->Find("orders")) >= 0; }, 10'000))
      << daemon->Log();
  const DependencySlot& orders = *fresh->dependency(uint32_t(orders_index));
  const uint64_t before = shm::ReadCounter(orders, shm::kFirstAttempts);
  EXPECT_TRUE(WaitUntil([&] { return shm::ReadCounter(orders, shm::kFirstAttempts) > before + 1000; }, 5'000));
  StopClientWorkers(pids, flags);
  // The admit that moves a worker takes the cold path: it maps the new segment and registers
  // (files, /proc), and may sleep in the kernel doing so. What must hold is that none failed.
  EXPECT_EQ(board->errors.load(), 0u) << "an admit failed during the move";
  daemon->Signal(SIGTERM);
  EXPECT_EQ(daemon->Wait(5'000), 0);
  WorkerBoard::Destroy(board);
  shm::Segment::Remove(name);
  unlink(config.c_str());
}

INSTANTIATE_TEST_SUITE_P(Incompatibilities, IncompatibleSegmentTest,
                         ::testing::Values(Incompatibility::kOtherCapacity,
                                           Incompatibility::kNewerLayout,
                                           Incompatibility::kOlderLayout,
                                           Incompatibility::kLayout7),
                         [](const auto& info) {
                           switch (info.param) {
                             case Incompatibility::kNewerLayout: return "NewerLayout";
                             case Incompatibility::kOlderLayout: return "OlderLayout";
                             case Incompatibility::kLayout7: return "Layout7";
                             default: return "OtherCapacity";
                           }
                         });

// --- Pid reuse --------------------------------------------------------------------------------

// HoldingWorker registers, takes a bulkhead lease on "orders", reports, and sleeps.
int HoldingWorker(const std::string& name, std::atomic<int>* ready) {
  std::unique_ptr<shm::Segment> seg;
  if (!shm::Segment::Attach(name, shm::Access::kReadWrite, &seg).ok()) return 3;
  const uint32_t index = uint32_t(seg->Find("orders"));
  shm::Caller caller{shm::RegisterProcess(*seg, getpid()), 0, 5};
  shm::Permit permit;
  if (shm::Admit(*seg->dependency(index), index, 0, shm::CoarseNowNs(), caller, &permit) !=
      shm::Decision::kAdmitted) {
    return 4;
  }
  ready->store(1);
  for (;;) pause();
}

class PidReuseTest : public ::testing::TestWithParam<bool> {};

// A worker dies holding a lease and its pid goes to a new, live process. With the daemon down
// at the time (restarted after), it must judge the slot by start time; stopped (SIGSTOP) with
// a pidfd already open on the dead worker, by that pidfd. Either way the lease comes back
// while the new process with the same pid lives on.
TEST_P(PidReuseTest, RecycledPidDoesNotKeepLeasesAlive) {
  if (!CanChoosePids()) GTEST_SKIP() << "needs a writable /proc/sys/kernel/ns_last_pid (root)";
  const bool daemon_down = GetParam();
  const std::string name = UniqueName("pidreuse");
  const std::string config = TempFile(".toml");
  WriteFile(config, ClientConfig(name, 64));
  const std::vector<std::string> args{"--config=" + config};
  auto daemon = std::make_unique<Daemon>(args);
  std::unique_ptr<shm::Segment> seg;
  ASSERT_TRUE(AttachWhenReady(name, &seg)) << daemon->Log();
  const DependencySlot& orders = *seg->dependency(uint32_t(seg->Find("orders")));
  auto* ready = SharedPage<std::atomic<int>>();
  const pid_t worker = fork();
  if (worker == 0) _exit(HoldingWorker(name, ready));
  ASSERT_TRUE(WaitUntil([&] { return ready->load() == 1; }, 5'000));
  ASSERT_EQ(TakenLeases(orders), 1);
  // Let the daemon see the worker (and open its pidfd) before it goes away.
  const uint64_t beat = seg->header().heartbeat_ns.load();
  ASSERT_TRUE(WaitUntil([&] { return seg->header().heartbeat_ns.load() > beat + 20'000'000; }, 5'000));
  if (daemon_down) {
    daemon->KillHard();
  } else {
    daemon->Signal(SIGSTOP);
  }
  kill(worker, SIGKILL);
  waitpid(worker, nullptr, 0);
  const pid_t heir = ForkAt(worker, [] {
    for (;;) pause();
    return 0;
  });
  if (heir != worker && !daemon_down) daemon->Signal(SIGCONT);  // else it stays stopped
  ASSERT_EQ(heir, worker) << "could not recycle the pid";
  ASSERT_EQ(TakenLeases(orders), 1) << "nobody reclaimed yet";
  const uint64_t dead_before = orders.counters[shm::kLeasesReclaimedDead].load();
  if (daemon_down) {
    daemon = std::make_unique<Daemon>(args);
  } else {
    daemon->Signal(SIGCONT);
  }
  EXPECT_TRUE(WaitUntil([&] { return TakenLeases(orders) == 0; }, 5'000))
      << "slot start time " << seg->process(0)->start_time.load() << ", heir's "
      << shm::ProcessStartTime(heir).value_or(0) << "\n" << daemon->Log();
  EXPECT_EQ(orders.counters[shm::kLeasesReclaimedDead].load(), dead_before + 1);
  EXPECT_EQ(kill(heir, 0), 0) << "the heir lives on with the same pid";
  kill(heir, SIGKILL);
  waitpid(heir, nullptr, 0);
  daemon->Signal(SIGTERM);
  EXPECT_EQ(daemon->Wait(5'000), 0);
  shm::Segment::Remove(name);
  unlink(config.c_str());
}

INSTANTIATE_TEST_SUITE_P(DaemonState, PidReuseTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "DaemonRestarted" : "DaemonStopped"; });

// Exactly one daemon per segment, whatever a writer of the segment puts in `daemon_pid`: the
// kernel's lock on the shm object decides, and retryctl asks it too.
TEST(DaemonLockTest, OneDaemonPerSegmentWhateverThePidWordSays) {
  const std::string name = UniqueName("onedaemon");
  const std::string config = TempFile(".toml");
  WriteFile(config, ClientConfig(name, 64));
  const std::vector<std::string> args{"--config=" + config};
  auto first = std::make_unique<Daemon>(args);
  std::unique_ptr<shm::Segment> seg;
  ASSERT_TRUE(AttachWhenReady(name, &seg)) << first->Log();
  std::atomic<uint32_t>& pid_word = seg->header().daemon_pid;
  std::atomic<uint64_t>& beat = seg->header().heartbeat_ns;

  // 0, and a live process that is not a retryd (this test).
  for (const uint32_t scribble : {0u, uint32_t(getpid())}) {
    pid_word.store(scribble);
    Daemon second(args);
    EXPECT_EQ(second.Wait(20'000), 1) << second.Log();
    EXPECT_NE(second.Log().find("segment '" + name + "' is owned by a running retryd (pid " +
                                std::to_string(first->pid()) + ")"),
              std::string::npos)
        << second.Log();
    const uint64_t before = beat.load();
    EXPECT_TRUE(WaitUntil([&] { return beat.load() > before; }, 10'000)) << "the first stopped";
    EXPECT_TRUE(WaitUntil([&] { return pid_word.load() == uint32_t(first->pid()); }, 10'000))
        << "the first puts its pid back";
  }

#ifdef RETRYCTL_BINARY
  // The first, stopped where it cannot put its pid back, with the word scribbled: retryctl
  // says stale (the kernel's lock is held), never down.
  first->Signal(SIGSTOP);
  pid_word.store(0);
  ASSERT_TRUE(WaitUntil([&] { return NowNs() - beat.load() > 4'000'000'000u; }, 20'000));
  const RunResult status = RunBinary(RETRYCTL_BINARY, {"--segment", name, "status"});
  first->Signal(SIGCONT);
  EXPECT_EQ(status.out.find("DAEMON DOWN"), std::string::npos) << status.out << status.err;
  EXPECT_NE(status.out.find("DAEMON STALE"), std::string::npos) << status.out << status.err;
#endif

  // Gone for good: the kernel drops its lock, and the next daemon adopts the segment.
  first->KillHard();
  Daemon next(args);
  EXPECT_TRUE(WaitUntil([&] { return pid_word.load() == uint32_t(next.pid()); }, 10'000))
      << next.Log();
  EXPECT_TRUE(next.WaitForLog("segment: adopted '" + name + "'", 10'000)) << next.Log();
  next.KillHard();
  shm::Segment::Remove(name);
  unlink(config.c_str());
}

// The create lock's holder is judged by whether it runs, not by the age of its stamp alone.
TEST(CreateLockTest, StoppedHolderKeepsTheCreateLockAndADeadOneLosesItAtOnce) {
  const std::string name = UniqueName("holder");
  std::unique_ptr<shm::Segment> seg;
  ASSERT_TRUE(CreateSegment(name, 8, &seg).ok());
  std::atomic<uint64_t>& lock = seg->header().create_lock;
  // A child takes the lock as a creator does, then stops (SIGSTOP, or a throttled cgroup)
  // or dies before releasing it.
  const auto holder = [&](bool stop) {
    const pid_t pid = fork();
    if (pid == 0) {
      uint64_t free = 0;
      while (!lock.compare_exchange_strong(
          free, shm::CreateLockStamp(shm::NsToMs32(shm::PreciseNowNs())))) {
        free = 0;
      }
      if (stop) raise(SIGSTOP);
      _exit(0);
    }
    return pid;
  };
  uint32_t index = 0;

  const pid_t stopped = holder(true);
  int status = 0;
  ASSERT_EQ(waitpid(stopped, &status, WUNTRACED), stopped);
  ASSERT_TRUE(WIFSTOPPED(status));
  const uint64_t taken = lock.load();
  ASSERT_EQ(taken & shm::kCreateLockPidMask, uint64_t(stopped));
  // Older than any age rule: the stamp is over 1.5 s old.
  ASSERT_TRUE(WaitUntil([&] {
    return int32_t(shm::NsToMs32(shm::PreciseNowNs()) - uint32_t(taken >> 32)) > 1'500;
  }, 10'000));
  const Status refused = seg->PutDependency("orders", shm::Policy{}, &index, 100);
  EXPECT_EQ(refused.code(), Status::Code::kIoError) << refused.ToString();
  EXPECT_EQ(lock.load(), taken) << "a live, stopped holder lost the create lock";
  EXPECT_EQ(seg->Find("orders"), -1);

  // Killed while stopped, or dead right after taking it: no wait at all (a single try).
  kill(stopped, SIGKILL);
  ASSERT_EQ(waitpid(stopped, &status, 0), stopped);
  Status s = seg->PutDependency("orders", shm::Policy{}, &index, 0);
  EXPECT_TRUE(s.ok()) << s.ToString();
  const pid_t died = holder(false);
  ASSERT_EQ(waitpid(died, &status, 0), died);
  ASSERT_EQ(lock.load() & shm::kCreateLockPidMask, uint64_t(died));
  s = seg->PutDependency("payments", shm::Policy{}, &index, 0);
  EXPECT_TRUE(s.ok()) << s.ToString() << ": a fresh stamp of a dead holder held the lock";
  EXPECT_EQ(lock.load(), 0u);
  shm::Segment::Remove(name);
}

}  // namespace
}  // namespace retryd::reliability
