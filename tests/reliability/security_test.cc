// Security: who may map the segment, and what a process that may write it can and cannot do.
//   - retryd creates the segment with the configured owner, group and mode (default 0660).
//   - A process outside the group is refused with a clear permission error (library, client
//     and retryctl); read permission suffices for a read-only attach.
//   - A hostile process with write access scribbles random values into the segment while
//     honest workers run: the daemon neither crashes nor stalls, and the honest workers'
//     limits hold exactly as long as it leaves their own dependency and process slots alone
//     (the trust model of docs/RELIABILITY.md: write access is trusted not to deny service).
#include <grp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "retryd/client.h"
#include "shm/admission.h"
#include "shm/breaker.h"
#include "shm/clock.h"
#include "shm/registry.h"
#include "shm/segment.h"
#include "tests/reachable_copy.h"
#include "tests/reliability/reliability_util.h"

namespace retryd::reliability {
namespace {

constexpr uid_t kNobody = 65534;
constexpr gid_t kNogroup = 65534;

std::string Config(const std::string& segment, const std::string& daemon_extra) {
  return "[daemon]\nsegment = \"" + segment + "\"\nmax_dependencies = 8\nmax_processes = 64\n"
         "tick = \"5ms\"\n" + daemon_extra +
         "[defaults]\nmin_calls = 1000000\nclose_after = 255\nprobe_timeout = \"1m\"\n"
         "bulkhead_timeout = \"1m\"\n"
         "[dependency.honest-probe]\nhalf_open_probes = 2\n"
         "[dependency.honest-bulk]\nbulkhead_limit = 4\n"
         "[dependency.victim]\nbulkhead_limit = 2\n";
}

struct Started {
  std::unique_ptr<Daemon> daemon;
  std::unique_ptr<shm::Segment> seg;
};

Started StartDaemon(const std::string& name, const std::string& config_text) {
  Started s;
  const std::string path = TempFile(".toml");
  WriteFile(path, config_text);
  s.daemon = std::make_unique<Daemon>(std::vector<std::string>{"--config=" + path});
  AttachWhenReady(name, &s.seg, shm::Access::kReadOnly);
  return s;
}

// AsNobody runs `body` in a child as uid/gid 65534 with only the supplementary groups
// `groups`; returns the child's exit code. `message` (a shared page) carries text back.
int AsNobody(const std::vector<gid_t>& groups, const std::function<int(char* message)>& body,
             std::string* message) {
  char* page = static_cast<char*>(
      mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  page[0] = '\0';
  const pid_t pid = fork();
  if (pid == 0) {
    if (setgroups(groups.size(), groups.data()) != 0 || setgid(kNogroup) != 0 || setuid(kNobody) != 0) {
      _exit(100);
    }
    _exit(body(page));
  }
  int status = 0;
  waitpid(pid, &status, 0);
  *message = std::string(page, strnlen(page, 4095));
  munmap(page, 4096);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

void Say(char* page, const std::string& text) {
  const size_t used = strnlen(page, 4095);
  std::snprintf(page + used, 4096 - used, "%s\n", text.c_str());
}

TEST(PermissionTest, SegmentGetsConfiguredOwnerGroupAndMode) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to chown";
  {
    const std::string name = UniqueName("perm-default");
    Started s = StartDaemon(name, Config(name, ""));
    ASSERT_NE(s.seg, nullptr) << s.daemon->Log();
    struct stat st {};
    ASSERT_EQ(stat(("/dev/shm/" + name).c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0660u);  // the default, whatever the umask
    EXPECT_EQ(st.st_uid, geteuid());
    shm::Segment::Remove(name);
  }
  {
    const std::string name = UniqueName("perm-config");
    const mode_t old_umask = umask(0077);  // the configured mode wins over the umask
    Started s = StartDaemon(name, Config(name, "owner = \"nobody\"\ngroup = \"nogroup\"\nmode = \"0640\"\n"));
    umask(old_umask);
    ASSERT_NE(s.seg, nullptr) << s.daemon->Log();
    struct stat st {};
    ASSERT_EQ(stat(("/dev/shm/" + name).c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0640u);
    EXPECT_EQ(st.st_uid, kNobody);
    EXPECT_EQ(st.st_gid, kNogroup);
    // An adopted segment is given the configured ownership again at every start.
    ASSERT_EQ(chmod(("/dev/shm/" + name).c_str(), 0666), 0);
    s.daemon->KillHard();
    const std::string path = TempFile(".toml");
    WriteFile(path, Config(name, "owner = \"nobody\"\ngroup = \"nogroup\"\nmode = \"0640\"\n"));
    Daemon again({"--config=" + path});
    ASSERT_TRUE(again.WaitForLog("adopted", 10'000)) << again.Log();
    ASSERT_EQ(stat(("/dev/shm/" + name).c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0640u);
    shm::Segment::Remove(name);
  }
}

TEST(PermissionTest, OutsiderIsRefusedWithAClearError) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to become nobody";
  const std::string name = UniqueName("perm-outsider");
  Started s = StartDaemon(name, Config(name, "mode = \"0660\"\n"));  // root:root 0660
  ASSERT_NE(s.seg, nullptr) << s.daemon->Log();
  std::string message;
  const int code = AsNobody({}, [&](char* page) {
    int failures = 0;
    for (shm::Access access : {shm::Access::kReadWrite, shm::Access::kReadOnly}) {
      std::unique_ptr<shm::Segment> seg;
      const Status st = shm::Segment::Attach(name, access, &seg);
      Say(page, st.ToString());
      failures += st.code() != Status::Code::kPermissionDenied || seg != nullptr;
      failures += st.message().find("segment '" + name + "'") == std::string::npos;
      failures += st.message().find("Permission denied") == std::string::npos;
      failures += st.message().find("group") == std::string::npos;
    }
    // The client says so too, and does not quietly fall back to private state.
    std::unique_ptr<Client> client;
    ClientOptions opt;
    opt.segment = name;
    const Status st = Client::Open(opt, &client);
    Say(page, st.ToString());
    failures += st.code() != Status::Code::kPermissionDenied || client != nullptr;
    return failures;
  }, &message);
  EXPECT_EQ(code, 0) << message;
  std::printf("outsider sees:\n%s", message.c_str());
#ifdef RETRYCTL_BINARY
  const std::string retryctl = ::retryd::testing::ReachableCopy(RETRYCTL_BINARY);
  const RunResult r = RunBinary(retryctl, {"--segment", name, "status"}, 10'000, [] {
    if (setgroups(0, nullptr) != 0 || setgid(kNogroup) != 0 || setuid(kNobody) != 0) _exit(100);
  });
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("permission denied"), std::string::npos) << r.err;
  std::printf("retryctl as nobody: %s", r.err.c_str());
#endif
  shm::Segment::Remove(name);
}

TEST(PermissionTest, ReadAccessSufficesForReadOnly) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to become nobody";
  const std::string name = UniqueName("perm-reader");
  Started s = StartDaemon(name, Config(name, "group = \"nogroup\"\nmode = \"0640\"\n"));
  ASSERT_NE(s.seg, nullptr) << s.daemon->Log();
  std::string message;
  const int code = AsNobody({kNogroup}, [&](char* page) {
    int failures = 0;
    std::unique_ptr<shm::Segment> ro, rw;
    const Status r = shm::Segment::Attach(name, shm::Access::kReadOnly, &ro);
    Say(page, "read-only: " + r.ToString());
    failures += !r.ok();
    if (ro) failures += ro->Find("honest-bulk") < 0;
    const Status w = shm::Segment::Attach(name, shm::Access::kReadWrite, &rw);
    Say(page, "read-write: " + w.ToString());
    failures += w.code() != Status::Code::kPermissionDenied;
    return failures;
  }, &message);
  EXPECT_EQ(code, 0) << message;
#ifdef RETRYCTL_BINARY
  auto drop = [] {
    const gid_t g = kNogroup;
    if (setgroups(1, &g) != 0 || setgid(kNogroup) != 0 || setuid(kNobody) != 0) _exit(100);
  };
  const std::string retryctl = ::retryd::testing::ReachableCopy(RETRYCTL_BINARY);
  const RunResult status = RunBinary(retryctl, {"--segment", name, "status"}, 10'000, drop);
  EXPECT_NE(status.exit_code, 2) << status.err;
  EXPECT_NE(status.out.find("honest-bulk"), std::string::npos) << status.out;
  const RunResult set =
      RunBinary(retryctl, {"--segment", name, "set-mode", "victim", "shadow"}, 10'000, drop);
  EXPECT_EQ(set.exit_code, 2) << set.out << set.err;
  EXPECT_NE(set.err.find("permission denied"), std::string::npos) << set.err;
#endif
  shm::Segment::Remove(name);
}

// --- A hostile client --------------------------------------------------------------------------

// HonestWorker admits on honest-probe (held half-open) and honest-bulk until `stop`, holding
// each lease a moment, and checks the limits at every grant.
int HonestWorker(const std::string& name, WorkerBoard* board, int cell_index, std::atomic<int>* stop,
                 bool check_limits) {
  std::unique_ptr<shm::Segment> seg;
  if (!shm::Segment::Attach(name, shm::Access::kReadWrite, &seg).ok()) return 3;
  const uint32_t probe_index = uint32_t(seg->Find("honest-probe"));
  const uint32_t bulk_index = uint32_t(seg->Find("honest-bulk"));
  shm::DependencySlot& probe = *seg->dependency(probe_index);
  shm::DependencySlot& bulk = *seg->dependency(bulk_index);
  shm::Caller caller{shm::RegisterProcess(*seg, getpid()), 0, uint32_t(getpid()) | 1u};
  WorkerCell& cell = board->Join(cell_index);
  cell.started.store(1);
  while (!stop->load(std::memory_order_relaxed)) {
    shm::Permit pp, bp;
    const uint64_t t0 = NowNs();
    shm::Admit(probe, probe_index, 0, shm::CoarseNowNs(), caller, &pp);
    shm::Admit(bulk, bulk_index, uint32_t(cell.operations.load() % 2), shm::CoarseNowNs(), caller, &bp);
    const uint64_t took = NowNs() - t0;
    uint64_t seen = board->max_admit_ns.load();
    while (took > seen && !board->max_admit_ns.compare_exchange_weak(seen, took)) {
    }
    const bool p = pp.flags & shm::kPermitProbe, b = bp.flags & shm::kPermitBulkhead;
    if (check_limits && p) board->Acquired(cell, WorkerBoard::kProbe, 2);
    if (check_limits && b) board->Acquired(cell, WorkerBoard::kBulkhead, 4);
    Spin(300);
    if (check_limits && b) board->Released(cell, WorkerBoard::kBulkhead);
    if (check_limits && p) board->Released(cell, WorkerBoard::kProbe);
    shm::Complete(bulk, &bp, shm::Outcome::kSuccess, 1000, shm::CoarseNowNs(), caller);
    shm::Complete(probe, &pp, shm::Outcome::kIgnored, 1000, shm::CoarseNowNs(), caller);
    cell.operations.fetch_add(2, std::memory_order_relaxed);
  }
  return 0;
}

// Scribbler writes random and extreme values into random words of the segment, except the
// byte ranges in `spared`, until `stop`. Returns through `writes` how many it made.
int Scribbler(const std::string& name, const std::vector<std::pair<size_t, size_t>>& spared,
              std::atomic<int>* stop, std::atomic<uint64_t>* writes) {
  std::unique_ptr<shm::Segment> seg;
  if (!shm::Segment::Attach(name, shm::Access::kReadWrite, &seg).ok()) return 3;
  auto* words = reinterpret_cast<std::atomic<uint64_t>*>(&seg->header());
  const size_t count = seg->size() / 8;
  std::mt19937_64 rng{uint64_t(getpid())};
  const uint64_t extremes[] = {0, 1, ~0ull, 0xFFFFFFFFull, 0x8000000000000000ull, 0x7FFFFFFFull,
                               uint64_t(getpid()), 2ull << 32 | uint64_t(getpid()), 1ull << 32};
  uint64_t n = 0;
  while (!stop->load(std::memory_order_relaxed)) {
    const size_t i = rng() % count;
    const size_t offset = i * 8;
    bool skip = false;
    for (const auto& [lo, hi] : spared) skip = skip || (offset >= lo && offset < hi);
    if (skip) continue;
    const uint64_t v = (rng() & 3) == 0 ? extremes[rng() % std::size(extremes)] : rng();
    words[i].store(v, std::memory_order_relaxed);
    if ((++n & 1023) == 0) writes->store(n);
  }
  writes->store(n);
  return 0;
}

struct HostilePage {
  std::atomic<int> stop_scribbler;
  std::atomic<int> stop_workers;
  std::atomic<uint64_t> writes;
};

class HostileClientTest : public ::testing::TestWithParam<bool> {};

// Phase "SparesHonestSlots": the hostile process writes anywhere but the honest workers'
// dependency slots and process slots: their limits hold exactly. Phase "WritesEverything":
// it writes their slots too: nothing bounds their limits any more (it can free their leases
// itself), but nobody crashes or hangs, and the daemon keeps ticking, reloading and stops
// cleanly.
TEST_P(HostileClientTest, DaemonSurvivesAndHonestWorkersAreSafe) {
  const bool spare_honest = GetParam();
  const double seconds = EnvSeconds("RETRYD_FAULT_SECONDS", 2);
  const std::string name = UniqueName("hostile");
  const std::string path = TempFile(".toml");
  WriteFile(path, Config(name, "mode = \"0600\"\n"));
  Daemon daemon({"--config=" + path});
  std::unique_ptr<shm::Segment> seg;
  ASSERT_TRUE(AttachWhenReady(name, &seg)) << daemon.Log();
  const uint32_t probe_index = uint32_t(seg->Find("honest-probe"));
  const uint32_t bulk_index = uint32_t(seg->Find("honest-bulk"));
  shm::DependencySlot& probe = *seg->dependency(probe_index);
  probe.breaker.store(shm::BreakerWord{shm::BreakerState::kHalfOpen, 0, 0, 3,
                                       shm::NsToMs32(shm::CoarseNowNs())}.Encode());
  WorkerBoard* board = WorkerBoard::Create();
  auto* page = static_cast<HostilePage*>(
      mmap(nullptr, sizeof(HostilePage), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  new (page) HostilePage{};
  constexpr int kHonest = 4;
  std::vector<pid_t> honest;
  for (int w = 0; w < kHonest; ++w) {
    const pid_t pid = fork();
    if (pid == 0) _exit(HonestWorker(name, board, w, &page->stop_workers, spare_honest));
    honest.push_back(pid);
  }
  ASSERT_TRUE(WaitUntil([&] {
    for (int w = 0; w < kHonest; ++w) {
      if (!board->cells[w].started.load()) return false;
    }
    return true;
  }, 10'000));
  // What the hostile process leaves alone in the first phase.
  std::vector<std::pair<size_t, size_t>> spared;
  const auto* base = reinterpret_cast<const char*>(&seg->header());
  if (spare_honest) {
    for (uint32_t index : {probe_index, bulk_index}) {
      const size_t at = size_t(reinterpret_cast<const char*>(seg->dependency(index)) - base);
      spared.push_back({at, at + sizeof(shm::DependencySlot)});
    }
    for (uint32_t i = 0; i < seg->max_processes(); ++i) {
      const pid_t pid = pid_t(uint32_t(seg->process(i)->owner.load()));
      if (std::count(honest.begin(), honest.end(), pid) > 0) {
        const size_t at = size_t(reinterpret_cast<const char*>(seg->process(i)) - base);
        spared.push_back({at, at + sizeof(shm::ProcessSlot)});
      }
    }
    ASSERT_EQ(spared.size(), 2u + kHonest);
  }
  const pid_t hostile = fork();
  if (hostile == 0) _exit(Scribbler(name, spared, &page->stop_scribbler, &page->writes));
  // Reloads under fire: the victim's policy alternates.
  uint64_t reloads = 0;
  const uint64_t end = NowNs() + uint64_t(seconds * 1e9);
  while (NowNs() < end) {
    usleep(200'000);
    WriteFile(path, Config(name, "mode = \"0600\"\n") + "retry_burst = " + std::to_string(10 + reloads % 2) + "\n");
    daemon.Signal(SIGHUP);
    ++reloads;
    ASSERT_EQ(waitpid(daemon.pid(), nullptr, WNOHANG), 0) << "retryd died:\n" << daemon.Log();
  }
  page->stop_scribbler.store(1);
  int status = 0;
  waitpid(hostile, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  page->stop_workers.store(1);
  for (pid_t pid : honest) {
    EXPECT_TRUE(WaitUntil([&] { return waitpid(pid, &status, WNOHANG) == pid; }, 10'000))
        << "an honest worker hangs";
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }
  uint64_t operations = 0;
  for (int w = 0; w < kHonest; ++w) operations += board->cells[w].operations.load();
  if (spare_honest) {
    EXPECT_EQ(board->violations.load(), 0u);
    EXPECT_LE(board->max_live_held[WorkerBoard::kProbe].load(), 2);
    EXPECT_LE(board->max_live_held[WorkerBoard::kBulkhead].load(), 4);
    // No honest lease is left behind, and none was reclaimed from a live honest worker.
    for (uint32_t index : {probe_index, bulk_index}) {
      const shm::DependencySlot& d = *seg->dependency(index);
      EXPECT_EQ(d.counters[shm::kLeasesReclaimedDead].load(), 0u);
      for (const auto& l : d.bulkhead_leases) EXPECT_EQ(l.load(), 0u);
      for (const auto& l : d.probe_leases) EXPECT_EQ(l.load(), 0u);
    }
  }
  // The daemon lived through it: still ticking, still stops cleanly. A create lock the
  // hostile process left stamped in the future may hold a pending reload for 2 s per
  // dependency (see FutureCreateLockDoesNotStallCreators): a bounded stall, not a hang.
  const uint64_t beat = seg->header().heartbeat_ns.load();
  const uint64_t wait_start = NowNs();
  EXPECT_TRUE(WaitUntil([&] { return seg->header().heartbeat_ns.load() != beat; }, 30'000)) << daemon.Log();
  Figure("tick_stall_after_attack_ms", double(NowNs() - wait_start) / 1e6);
  daemon.Signal(SIGTERM);
  EXPECT_EQ(daemon.Wait(10'000), 0) << daemon.Log();
  Figure("hostile_writes", double(page->writes.load()));
  Figure("honest_operations", double(operations));
  Figure("reloads", double(reloads));
  Figure("limit_checks", double(board->checks.load()));
  Figure("max_admit_ms", double(board->max_admit_ns.load()) / 1e6);
  WorkerBoard::Destroy(board);
  shm::Segment::Remove(name);
  unlink(path.c_str());
}

INSTANTIATE_TEST_SUITE_P(Phases, HostileClientTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "SparesHonestSlots" : "WritesEverything"; });

// A client that lowers the header's `dependency_high_water` (or a stale value after a crash)
// must not make the daemon hand a live dependency's slot to another name, or reinitialize it
// under the workers holding its leases.
TEST(HostileClientTest, LoweredHighWaterDoesNotReassignLiveSlots) {
  const std::string name = UniqueName("highwater");
  const std::string path = TempFile(".toml");
  WriteFile(path, Config(name, "mode = \"0600\"\n"));
  Daemon daemon({"--config=" + path});
  std::unique_ptr<shm::Segment> seg;
  ASSERT_TRUE(AttachWhenReady(name, &seg)) << daemon.Log();
  const uint32_t bulk_index = uint32_t(seg->Find("honest-bulk"));
  shm::DependencySlot& bulk = *seg->dependency(bulk_index);
  shm::Caller caller{shm::RegisterProcess(*seg, getpid()), 0, 77};
  shm::Permit held;
  ASSERT_EQ(shm::Admit(bulk, bulk_index, 0, shm::CoarseNowNs(), caller, &held), shm::Decision::kAdmitted);
  const uint64_t first_attempts = shm::ReadCounter(bulk, shm::kFirstAttempts);
  const uint32_t generation = bulk.generation.load();
  seg->header().dependency_high_water.store(0);
  daemon.Signal(SIGHUP);  // an unchanged config: nothing should move
  ASSERT_TRUE(daemon.WaitForLog("reload: ", 5'000));
  usleep(100'000);
  EXPECT_EQ(shm::ReadName(bulk), "honest-bulk");
  EXPECT_EQ(bulk.generation.load(), generation) << "the slot was reassigned";
  EXPECT_EQ(bulk.bulkhead_leases[held.bulkhead_index].load(), held.bulkhead_lease)
      << "a live lease was wiped";
  EXPECT_EQ(shm::ReadCounter(bulk, shm::kFirstAttempts), first_attempts) << "counters were reset";
  // And a client creating a new dependency takes a free slot, not a live one.
  uint32_t created = 0;
  seg->header().dependency_high_water.store(0);
  ASSERT_TRUE(seg->CreateOnTheFly("newcomer", &created).ok());
  EXPECT_NE(created, bulk_index);
  EXPECT_EQ(shm::ReadName(bulk), "honest-bulk");
  shm::Complete(bulk, &held, shm::Outcome::kSuccess, 1000, shm::CoarseNowNs(), caller);
  daemon.Signal(SIGTERM);
  EXPECT_EQ(daemon.Wait(5'000), 0);
  shm::Segment::Remove(name);
  unlink(path.c_str());
}

// A create lock stamped in the future by a client must not stall every creator (the daemon's
// reload, a worker's first Resolve) for the lock's 2 s give-up each time.
TEST(HostileClientTest, FutureCreateLockDoesNotStallCreators) {
  const std::string name = UniqueName("createlock");
  std::unique_ptr<shm::Segment> seg;
  ASSERT_TRUE(CreateSegment(name, 8, &seg).ok());
  const uint64_t future_ms = shm::PreciseNowNs() / 1'000'000u + 3'600'000;
  seg->header().create_lock.store(uint64_t(12345) | (future_ms << 32));
  const uint64_t t0 = NowNs();
  const long waits = BlockWatch::VoluntarySwitches();
  uint32_t index = 0;
  ASSERT_TRUE(seg->PutDependency("orders", shm::Policy{}, &index).ok());
  const double took_ms = double(NowNs() - t0) / 1e6;
  // Waiting out the lock would sleep a millisecond at a time, for its 2 s give-up.
  EXPECT_LE(BlockWatch::VoluntarySwitches() - waits, 1)
      << "PutDependency waited out a lock stamped an hour ahead";
  Figure("put_dependency_ms", took_ms);
  shm::Segment::Remove(name);
}

}  // namespace
}  // namespace retryd::reliability
