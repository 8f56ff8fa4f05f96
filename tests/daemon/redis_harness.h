// tests/daemon/redis_harness.h: what the fleet's real-process tests share (fleet_test.cc,
// fleet_chaos_test.cc): a real `redis-server` (or Sentinel) on a port of its own, a downstream
// in a page shared with forked workers that counts what reaches it, and a fixture that starts
// one real `retryd` per host, each with its own segment, and workers that call through it.
// Each test stands in for a fleet of hosts on one machine.
//
// The including target defines RETRYD_BINARY and RETRYD_REDIS_SERVER and links
// daemon_harness.cc.
#pragma once

#include <netinet/in.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "daemon/config.h"
#include "daemon/fleet_store.h"
#include "shm/admission.h"
#include "shm/breaker.h"
#include "shm/clock.h"
#include "shm/registry.h"
#include "shm/segment.h"
#include "shm/stripes.h"
#include "tests/daemon/daemon_harness.h"
#include "tests/shm/test_util.h"

// Without redis-server the fleet cannot be tested: skipped, except where RETRYD_REQUIRE_REDIS is
// set (scripts/test sets it, having installed redis-server), so that CI cannot pass by skipping.
#define SKIP_WITHOUT_REDIS()                                                            \
  if (access(RETRYD_REDIS_SERVER, X_OK) != 0) {                                         \
    if (getenv("RETRYD_REQUIRE_REDIS") != nullptr) {                                    \
      FAIL() << "no redis-server at " RETRYD_REDIS_SERVER ", and RETRYD_REQUIRE_REDIS is set"; \
    }                                                                                   \
    GTEST_SKIP() << "no redis-server (Debian: redis-server) at " RETRYD_REDIS_SERVER;   \
  }

namespace retryd::daemon::testing {

inline constexpr uint32_t kSyncMs = 300;
inline constexpr int kMaxHosts = 8;

inline int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

// A redis-server (or, with `sentinel_of`, a redis-sentinel watching it) on a port of its own.
class Redis {
 public:
  // `extra`: more lines of its config (a password, a Unix socket).
  explicit Redis(int port, const std::string& replica_of = "", int sentinel_of = 0,
                 const std::string& extra = "")
      : port_(port) {
    conf_ = TempPath(".conf");
    log_ = TempPath(".log");
    // Its files (a replica's sync writes one) go to the temp dir, not the test's directory.
    std::string text = "port " + std::to_string(port) + "\nbind 127.0.0.1\nsave \"\"\n" +
                       "appendonly no\nlogfile \"" + log_ + "\"\ndir \"" +
                       ::testing::TempDir() + "\"\ndbfilename \"redis-" + std::to_string(port) +
                       ".rdb\"\n";
    if (!replica_of.empty()) {
      text += "replicaof " + replica_of.substr(0, replica_of.rfind(':')) + " " +
              replica_of.substr(replica_of.rfind(':') + 1) + "\n";
    }
    if (sentinel_of != 0) {
      text += "sentinel monitor fleet 127.0.0.1 " + std::to_string(sentinel_of) + " 1\n" +
              "sentinel down-after-milliseconds fleet 500\nsentinel failover-timeout fleet 3000\n";
    }
    WriteFile(conf_, text + extra);
    Start(sentinel_of != 0);
  }
  ~Redis() {
    Kill();
    unlink((::testing::TempDir() + "/redis-" + std::to_string(port_) + ".rdb").c_str());
    unlink(conf_.c_str());
    unlink(log_.c_str());
  }

  void Start(bool sentinel = false) {
    pid_ = fork();
    if (pid_ == 0) {
      if (sentinel) {
        execl(RETRYD_REDIS_SERVER, RETRYD_REDIS_SERVER, conf_.c_str(), "--sentinel", nullptr);
      } else {
        execl(RETRYD_REDIS_SERVER, RETRYD_REDIS_SERVER, conf_.c_str(), nullptr);
      }
      _exit(127);
    }
    EXPECT_TRUE(WaitUntil([&] { return Ping(); }, 10'000)) << "redis on " << port_;
  }
  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  // Freeze and Thaw stop and continue the server: it keeps its connections and answers
  // nothing, as a store behind a partition or stuck in a long command does.
  pid_t pid() const { return pid_; }
  void Freeze() { kill(pid_, SIGSTOP); }
  void Thaw() { kill(pid_, SIGCONT); }
  bool Ping() {
    FleetSettings s;
    s.redis = address();
    s.timeout_ms = 200;
    FleetStore store(s);
    StoreReply r;
    const Status st = store.Connect();
    // A server that wants a password is up.
    return st.ok() || st.message().find("NOAUTH") != std::string::npos;
  }
  // Command runs one command on this server. A server busy for a moment (a replica taking its
  // first copy, a loaded machine) is what no caller checks: it is asked again, on a new
  // connection, for up to 5 s before the command fails the test.
  StoreReply Command(const std::vector<std::string>& argv) {
    FleetSettings s;
    s.redis = address();
    s.timeout_ms = 1'000;
    StoreReply r;
    Status st;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    do {
      FleetStore store(s);
      r = StoreReply();
      st = store.Connect();
      if (st.ok()) st = store.Command(argv, &r);
      if (st.ok()) return r;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    } while (std::chrono::steady_clock::now() < deadline);
    ADD_FAILURE() << "redis on " << port_ << ": " << argv[0] << ": " << st.ToString();
    return r;
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  int port() const { return port_; }

 private:
  int port_;
  pid_t pid_ = -1;
  std::string conf_;
  std::string log_;
};

// The downstream every host's workers call, in a page shared with them: it fails while
// `failing` (every host) or `failing_at[i]` (host i alone: its own bad network), and counts
// what reaches it.
struct Downstream {
  std::atomic<uint32_t> failing;
  std::atomic<uint32_t> hang_ms;  // while failing, each call takes this long before it fails
  // Set: only the fleet's probe hangs; a probe on the host's own rules (its hold lapsed while
  // its daemon was kept off a CPU) fails at once, as a test of the fleet's lease needs.
  std::atomic<uint32_t> hang_only_the_fleets_probe;
  std::atomic<uint32_t> stop;
  std::atomic<uint64_t> calls;
  std::atomic<uint64_t> failed;                 // calls answered while failing
  std::atomic<uint64_t> probes[kMaxHosts];      // admitted as probes, per host
  // Of those, admitted while the host held no fleet lease (its role not kProbing): probes on
  // the host's own rules, as after a hold that lapsed.
  std::atomic<uint64_t> own_probes[kMaxHosts];
  std::atomic<uint64_t> calls_from[kMaxHosts];  // calls that reached it, per host
  std::atomic<uint64_t> slowest_admit_ns[kMaxHosts];
  std::atomic<uint64_t> retries_granted[kMaxHosts];
  std::atomic<uint32_t> failing_at[kMaxHosts];
  std::atomic<uint64_t> admits[kMaxHosts];      // admit calls made (admitted or not), per host
  std::atomic<uint32_t> probes_in_flight;       // admitted as probes and not yet complete
  std::atomic<uint32_t> most_probes_in_flight;  // the most at once (the test may reset it)
  // An admit that waited on anything (a socket, a lock) blocks: a voluntary context switch
  // during it. One the scheduler preempted (an involuntary switch) took longer for the loaded
  // machine's sake alone; the slowest of the others is what the admit itself costs.
  std::atomic<uint64_t> blocked_admits[kMaxHosts];
  // An admit that slept while it took a major page fault waited for the machine to read code or
  // data back from disk (this machine's memory manager evicts cold pages of running programs),
  // not for anything the admit asked: counted apart from the blocked ones.
  std::atomic<uint64_t> paged_in_admits[kMaxHosts];
  std::atomic<uint64_t> preempted_admits[kMaxHosts];
  std::atomic<uint64_t> slowest_unpreempted_admit_ns[kMaxHosts];
};

struct Host {
  std::string segment;
  std::string config;
  std::unique_ptr<NotifySocket> notify;
  std::unique_ptr<DaemonProcess> daemon;
  std::unique_ptr<shm::Segment> seg;
  std::vector<pid_t> workers;
};

// What a worker does: calls per second of first attempts, or retries only (the floor test).
struct WorkerPlan {
  int calls_per_sec = 20;
  bool retries_only = false;
  int period_ms = 0;       // set: one call every period_ms instead (a poller, a cron job)
  int start_delay_ms = 0;  // before the first period
};

class FleetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    prefix_ = UniqueName();
    void* p = mmap(nullptr, sizeof(Downstream), PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ds_ = new (p) Downstream();
  }
  void TearDown() override {
    ds_->stop = 1;
    for (Host& h : hosts_) {
      for (pid_t w : h.workers) waitpid(w, nullptr, 0);
      if (h.daemon) {
        h.daemon->Signal(SIGCONT);  // a test that stopped it and failed before continuing it
        h.daemon->Signal(SIGTERM);
        h.daemon->Wait(10'000);
      }
      h.seg.reset();
      shm::Segment::Remove(h.segment);
      unlink(h.config.c_str());
    }
    munmap(ds_, sizeof(Downstream));
  }

  // StartHosts starts `n` daemons, each with `fleet` as its [fleet] store lines and
  // `dependency` as the keys of [dependency.orders].
  void StartHosts(int n, const std::string& store, const std::string& dependency) {
    for (int k = 0; k < n; ++k) {
      const size_t i = hosts_.size();
      Host& h = hosts_.emplace_back();
      h.segment = UniqueName();
      h.config = TempPath(".toml");
      WriteFile(h.config, "[daemon]\nsegment = \"" + h.segment +
                              "\"\nmax_dependencies = 8\nmax_processes = 16\ntick = \"50ms\"\n" +
                              "[fleet]\n" + store + "host_id = \"host-" + std::to_string(i) +
                              "\"\nsync = \"" + std::to_string(kSyncMs) + "ms\"\n" +
                              "key_prefix = \"" + prefix_ + "\"\n" +
                              "[dependency.orders]\n" + dependency);
      h.notify = std::make_unique<NotifySocket>();
      h.daemon = std::make_unique<DaemonProcess>(
          std::vector<std::string>{"--config=" + h.config}, h.notify->path());
      ASSERT_NE(h.notify->WaitFor("READY=1", 10'000), "") << h.daemon->Log();
      ASSERT_TRUE(shm::Segment::Attach(h.segment, shm::Access::kReadWrite, &h.seg).ok());
    }
  }

  // StartWorker forks a worker of host `i` calling `orders` as `plan` says until stop.
  // KillWorkers kills host i's workers (SIGKILL) and reaps them: its calls stop for good.
  void KillWorkers(int i) {
    for (pid_t w : hosts_[size_t(i)].workers) {
      kill(w, SIGKILL);
      waitpid(w, nullptr, 0);
    }
    hosts_[size_t(i)].workers.clear();
  }
  void StartWorker(int i, WorkerPlan plan) {
    Host& h = hosts_[size_t(i)];
    const pid_t pid = fork();
    if (pid == 0) {
      std::unique_ptr<shm::Segment> seg;
      if (!shm::Segment::Attach(h.segment, shm::Access::kReadWrite, &seg).ok()) _exit(2);
      const int32_t index = seg->Find("orders");
      if (index < 0) _exit(3);
      shm::DependencySlot& slot = *seg->dependency(uint32_t(index));
      shm::Caller caller{shm::RegisterProcess(*seg, getpid()), 0, uint32_t(getpid()) | 1};
      const auto period = plan.period_ms > 0
                              ? std::chrono::microseconds(int64_t{plan.period_ms} * 1000)
                              : std::chrono::microseconds(1'000'000 / plan.calls_per_sec);
      auto next = std::chrono::steady_clock::now() + std::chrono::milliseconds(plan.start_delay_ms);
      while (!ds_->stop.load()) {
        next += period;
        std::this_thread::sleep_until(next);
        shm::Permit permit;
        rusage before{}, after{};
        getrusage(RUSAGE_THREAD, &before);
        // The times given to retryd are the clients' clock (shm/clock.h), as the library's;
        // the admit's duration is measured on the precise one.
        const uint64_t t0 = shm::PreciseNowNs();
        const shm::Decision d = shm::Admit(slot, uint32_t(index), plan.retries_only ? 1 : 0,
                                           shm::CoarseNowNs(), caller, &permit);
        const uint64_t took = shm::PreciseNowNs() - t0;
        getrusage(RUSAGE_THREAD, &after);
        auto raise = [](std::atomic<uint64_t>& slowest, uint64_t t) {
          uint64_t was = slowest.load();
          while (t > was && !slowest.compare_exchange_weak(was, t)) {
          }
        };
        raise(ds_->slowest_admit_ns[i], took);
        if (after.ru_nvcsw != before.ru_nvcsw) {
          (after.ru_majflt != before.ru_majflt ? ds_->paged_in_admits : ds_->blocked_admits)[i]
              .fetch_add(1);
        }
        if (after.ru_nivcsw != before.ru_nivcsw) {
          ds_->preempted_admits[i].fetch_add(1);
        } else {
          raise(ds_->slowest_unpreempted_admit_ns[i], took);
        }
        ds_->admits[i].fetch_add(1);
        if (!shm::IsAdmitted(d)) continue;
        if (plan.retries_only) ds_->retries_granted[i].fetch_add(1);
        const bool probe = d == shm::Decision::kAdmittedProbe;
        bool fleets_probe = false;
        if (probe) {
          ds_->probes[i].fetch_add(1);
          fleets_probe = shm::FleetWord::Role(slot.fleet.load()) == shm::FleetRole::kProbing;
          if (!fleets_probe) ds_->own_probes[i].fetch_add(1);
          const uint32_t now = ds_->probes_in_flight.fetch_add(1) + 1;
          uint32_t most = ds_->most_probes_in_flight.load();
          while (now > most && !ds_->most_probes_in_flight.compare_exchange_weak(most, now)) {
          }
        }
        ds_->calls.fetch_add(1);
        ds_->calls_from[i].fetch_add(1);
        const bool fail = ds_->failing.load() != 0 || ds_->failing_at[i].load() != 0;
        if (fail) ds_->failed.fetch_add(1);
        // A hanging call ends early when the test stops or lifts the hang.
        const bool hangs = fleets_probe || ds_->hang_only_the_fleets_probe.load() == 0;
        for (const uint64_t t = shm::PreciseNowNs(); fail && hangs && ds_->hang_ms.load() > 0 &&
                                                     !ds_->stop.load() &&
                                                     shm::PreciseNowNs() - t < ds_->hang_ms.load() * 1'000'000ull;) {
          usleep(10'000);
        }
        shm::Complete(slot, &permit, fail ? shm::Outcome::kFailure : shm::Outcome::kSuccess,
                      1'000'000, shm::CoarseNowNs(), caller);
        if (probe) ds_->probes_in_flight.fetch_sub(1);
      }
      _exit(0);
    }
    h.workers.push_back(pid);
  }

  // WaitJoined waits for every host to say it joined; on failure, the first one's log.
  ::testing::AssertionResult WaitJoined() {
    if (WaitUntil([&] { return All([&](int i) { return FleetStateOf(i) == shm::FleetState::kJoined; }); }, 10'000)) {
      return ::testing::AssertionSuccess();
    }
    for (int i = 0; i < int(hosts_.size()); ++i) {
      if (FleetStateOf(i) != shm::FleetState::kJoined) {
        return ::testing::AssertionFailure() << "host " << i << " did not join; its log:\n"
                                             << hosts_[size_t(i)].daemon->Log();
      }
    }
    return ::testing::AssertionFailure();
  }

  // WaitAllOpen / WaitAllClosed: every host's breaker not closed / closed within `ms`.
  bool WaitAllOpen(uint64_t ms) {
    return WaitUntil([&] { return All([&](int i) { return State(i) != shm::BreakerState::kClosed; }); }, ms);
  }
  bool WaitAllClosed(uint64_t ms) {
    return WaitUntil([&] { return All([&](int i) { return State(i) == shm::BreakerState::kClosed; }); }, ms);
  }

  // HangTheFleetsProbe starts 3 hosts with `store` as their [fleet] store lines whose `orders`
  // has `dependency` as its extra keys, opens every breaker with failing calls, makes every
  // probe from then on hang for `hang_ms`, and returns the host that probes for the fleet
  // (half-open, holding a lease), or -1 if none does within 20 s.
  int HangTheFleetsProbe(const std::string& store, const std::string& dependency,
                         uint32_t hang_ms) {
    StartHosts(3, store,
               "min_calls = 30\nfailure_rate_threshold = 50\nwindow = \"60s\"\n"
               "open_for = \"1s\"\nopen_jitter = \"0s\"\nfleet = true\nfleet_min_hosts = 2\n" +
                   dependency);
    if (!WaitJoined()) return -1;
    for (int i = 0; i < 3; ++i) StartWorker(i, {20, false});
    ds_->failing = 1;
    if (!WaitAllOpen(20'000)) {
      return -1;
    }
    ds_->hang_ms = hang_ms;
    int prober = -1;
    WaitUntil([&] {
      for (int i = 0; i < 3; ++i) {
        if (Role(i) == shm::FleetRole::kProbing && State(i) == shm::BreakerState::kHalfOpen) {
          prober = i;
        }
      }
      return prober >= 0;
    }, 20'000);
    return prober;
  }
  int HangTheFleetsProbe(const Redis& redis, const std::string& dependency, uint32_t hang_ms) {
    return HangTheFleetsProbe("redis = \"" + redis.address() + "\"\n", dependency, hang_ms);
  }

  // CpuWaits: how long each process of the fleet (every host's daemon and workers, and the
  // `others`: the store, a proxy) has waited for a CPU while ready to run, by pid.
  // WaitedMsSince: what those still running have waited since `before`, summed. A bound on how
  // long the fleet takes to act allows this on top: a chain of them (a call, a sync, the
  // store's answer, another host's sync) acts in turn, and on a loaded machine each step is
  // late by what its process waited, which nothing in retryd decides.
  std::map<pid_t, uint64_t> CpuWaits(const std::vector<pid_t>& others = {}) {
    std::map<pid_t, uint64_t> waits;
    auto add = [&](pid_t pid) { waits[pid] = retryd::testing::RunQueueWaitNs(pid); };
    for (const Host& h : hosts_) {
      if (h.daemon) add(h.daemon->pid());
      for (pid_t w : h.workers) add(w);
    }
    for (pid_t pid : others) {
      if (pid > 0) add(pid);
    }
    return waits;
  }
  double WaitedMsSince(const std::map<pid_t, uint64_t>& before,
                       const std::vector<pid_t>& others = {}) {
    uint64_t waited = 0;
    for (const auto& [pid, now] : CpuWaits(others)) {
      const auto was = before.find(pid);
      const uint64_t from = was == before.end() ? 0 : was->second;
      if (now > from) waited += now - from;  // a process gone since reads as 0
    }
    return double(waited) / 1e6;
  }

  shm::FleetRole Role(int i) { return shm::FleetWord::Role(Orders(i).fleet.load()); }

  shm::DependencySlot& Orders(int i) {
    shm::Segment& seg = *hosts_[size_t(i)].seg;
    return *seg.dependency(uint32_t(seg.Find("orders")));
  }
  shm::BreakerState State(int i) {
    return shm::BreakerWord::Decode(Orders(i).breaker.load()).state;
  }
  shm::FleetState FleetStateOf(int i) {
    return shm::FleetState(hosts_[size_t(i)].seg->header().fleet_state.load());
  }
  uint64_t ProbesSoFar() {
    uint64_t n = 0;
    for (auto& p : ds_->probes) n += p.load();
    return n;
  }
  uint64_t OwnProbesSoFar() {
    uint64_t n = 0;
    for (auto& p : ds_->own_probes) n += p.load();
    return n;
  }
  bool All(const std::function<bool(int)>& f) {
    for (int i = 0; i < int(hosts_.size()); ++i) {
      if (!f(i)) return false;
    }
    return true;
  }

  std::string prefix_;
  Downstream* ds_ = nullptr;
  std::vector<Host> hosts_;
};

}  // namespace retryd::daemon::testing
