// The fleet (daemon/fleet.h) while its store fails in the middle of its work, on real processes
// (tests/daemon/redis_harness.h): a Sentinel failover while a host's fleet probe is in flight,
// the prober's daemon stopped (SIGSTOP) for longer than its lease, one host cut from the store
// while the others are not, and a store that answers one host too slowly. The last two go
// through a TCP proxy the test controls (TcpProxy, below), between one daemon and the store.
//
// Every test checks what each host does, and that no admit ever waits: workers decide from
// their host's segment alone, so no admit blocks (a voluntary context switch during it), and the
// slowest stays under kAdmitBoundNs (kPreemptedAdmitBoundNs for one the scheduler preempted on a
// loaded machine), far below any network wait (every store timeout here is 250 ms). Bounds are
// those the design guarantees, plus what the processes that act in turn waited for a CPU
// (measured, CpuWaits) and kTimerSlackMs, and each measured figure is printed.
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <deque>
#include <memory>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "shm/breaker.h"
#include "shm/clock.h"
#include "shm/policy.h"
#include "shm/segment.h"
#include "shm/stripes.h"
#include "tests/daemon/daemon_harness.h"
#include "tests/daemon/redis_harness.h"
#include "tests/shm/test_util.h"

namespace retryd::daemon {
namespace {

using testing::FleetTest;
using testing::FreePort;
using testing::kMaxHosts;
using testing::kSyncMs;
using testing::Redis;
using testing::WaitUntil;

constexpr uint32_t kTimeoutMs = 250;         // [fleet] timeout, every test
constexpr uint32_t kStepMs = kSyncMs / 4;    // the fleet thread's step at this sync (fleet.cc)
constexpr uint64_t kAdmitBoundNs = 5'000'000;  // an admit that waited on anything would exceed it
// An admit the scheduler preempted waits for a CPU, a few time slices on a loaded machine: a
// fifth of the store's timeout still tells it from a network wait.
constexpr uint64_t kPreemptedAdmitBoundNs = 50'000'000;
// A bound the design guarantees is allowed what the machine kept the processes in the chain from
// running (the fleet's CpuWaits: daemons, workers, store, proxy), and this for the timers' and
// the test's polls' own lateness: no margin for a loaded machine.
constexpr uint32_t kTimerSlackMs = 50;

double MsSince(uint64_t t_ns) { return double(shm::PreciseNowNs() - t_ns) / 1e6; }

// TcpProxy relays 127.0.0.1:port() to a store on 127.0.0.1:`upstream_port`, in a forked
// process of its own: the test's workers are forked too, and a copy of a relayed socket in a
// worker would keep a connection the proxy cuts open. The test steers it through a shared page:
//   Relay   relays both ways; each reply (store to daemon) is held DelayReplies ms first
//   Freeze  relays nothing and keeps every connection open; new ones are accepted and get
//           nothing (a partition that drops packets: the daemon's commands time out)
//   Cut     closes every connection, and each new one at once (a partition that refuses)
// Every connection accepted is logged with its time (Accepts): the daemon's connection attempts.
class TcpProxy {
 public:
  enum class Mode : uint32_t { kRelay, kFreeze, kCut };

  explicit TcpProxy(int upstream_port) {
    void* p = mmap(nullptr, sizeof(Control), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                   -1, 0);
    ctl_ = new (p) Control();
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(listen(fd, 64), 0);
    socklen_t len = sizeof(a);
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    pid_ = fork();
    if (pid_ == 0) {
      Run(fd, upstream_port);
      _exit(0);
    }
    close(fd);
  }
  pid_t pid() const { return pid_; }
  ~TcpProxy() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    munmap(ctl_, sizeof(Control));
  }
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;

  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  void Relay() { ctl_->mode = uint32_t(Mode::kRelay); }
  void Freeze() { ctl_->mode = uint32_t(Mode::kFreeze); }
  void Cut() { ctl_->mode = uint32_t(Mode::kCut); }
  void DelayReplies(uint32_t ms) { ctl_->delay_ms = ms; }
  // Accepts: when each connection was accepted (shm::PreciseNowNs), oldest first.
  std::vector<uint64_t> Accepts() const {
    std::vector<uint64_t> out;
    const uint32_t n = std::min<uint32_t>(ctl_->accepts.load(), kMaxAccepts);
    for (uint32_t i = 0; i < n; ++i) out.push_back(ctl_->accepted_ns[i].load());
    return out;
  }

 private:
  static constexpr uint32_t kMaxAccepts = 4096;
  struct Control {
    std::atomic<uint32_t> mode;
    std::atomic<uint32_t> delay_ms;
    std::atomic<uint32_t> accepts;
    std::atomic<uint64_t> accepted_ns[kMaxAccepts];
  };
  struct Reply {
    uint64_t due_ns;
    std::string bytes;
  };
  struct Pair {
    int client;
    int upstream;
    std::string requests;       // read from the daemon, not yet written to the store
    std::deque<Reply> replies;  // read from the store, held until due
    bool dead = false;
  };

  static int ConnectUpstream(int port) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(uint16_t(port));
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      close(fd);
      return -1;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    return fd;
  }

  // Run is the proxy process: a poll loop that looks at the control page at least every 2 ms.
  void Run(int listen_fd, int upstream_port) {
    std::vector<Pair> pairs;
    std::vector<char> buf(1 << 16);
    auto gone = [](ssize_t n) { return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK); };
    for (;;) {
      const Mode mode = Mode(ctl_->mode.load());
      if (mode == Mode::kCut) {
        for (Pair& p : pairs) p.dead = true;
      }
      std::vector<pollfd> fds{{listen_fd, POLLIN, 0}};
      if (mode == Mode::kRelay) {
        for (const Pair& p : pairs) {
          fds.push_back({p.client, POLLIN, 0});
          fds.push_back({p.upstream, POLLIN, 0});
        }
      }
      poll(fds.data(), fds.size(), 2);
      for (int c; (c = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK)) >= 0;) {
        const uint32_t k = ctl_->accepts.load();
        if (k < kMaxAccepts) ctl_->accepted_ns[k] = shm::PreciseNowNs();
        ctl_->accepts = k + 1;
        const int u = mode == Mode::kCut ? -1 : ConnectUpstream(upstream_port);
        if (u < 0) {
          close(c);
          continue;
        }
        pairs.push_back({c, u, {}, {}, false});
      }
      const uint64_t now = shm::PreciseNowNs();
      const uint64_t delay_ns = uint64_t{ctl_->delay_ms.load()} * 1'000'000;
      for (Pair& p : pairs) {
        if (mode != Mode::kRelay || p.dead) continue;
        ssize_t n = recv(p.client, buf.data(), buf.size(), MSG_DONTWAIT);
        if (n > 0) p.requests.append(buf.data(), size_t(n));
        if (gone(n)) p.dead = true;
        if (!p.requests.empty()) {
          n = send(p.upstream, p.requests.data(), p.requests.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
          if (n > 0) p.requests.erase(0, size_t(n));
          if (n < 0 && gone(n)) p.dead = true;
        }
        n = recv(p.upstream, buf.data(), buf.size(), MSG_DONTWAIT);
        if (n > 0) p.replies.push_back({now + delay_ns, std::string(buf.data(), size_t(n))});
        if (gone(n)) p.dead = true;
        while (!p.replies.empty() && p.replies.front().due_ns <= now) {
          Reply& r = p.replies.front();
          n = send(p.client, r.bytes.data(), r.bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
          if (n < 0) {
            if (gone(n)) p.dead = true;
            break;
          }
          r.bytes.erase(0, size_t(n));
          if (!r.bytes.empty()) break;
          p.replies.pop_front();
        }
      }
      for (auto it = pairs.begin(); it != pairs.end();) {
        if (it->dead) {
          close(it->client);
          close(it->upstream);
          it = pairs.erase(it);
        } else {
          ++it;
        }
      }
    }
  }

  Control* ctl_ = nullptr;
  int port_ = 0;
  pid_t pid_ = -1;
};

void PrintTo(TcpProxy::Mode m, std::ostream* os) {
  *os << (m == TcpProxy::Mode::kFreeze ? "freeze" : m == TcpProxy::Mode::kCut ? "cut" : "relay");
}

class FleetChaosTest : public FleetTest {
 protected:
  shm::SegmentHeader& Header(int i) { return hosts_[size_t(i)].seg->header(); }
  // The live hosts host i counted at its last sync (0 while it decides alone).
  uint32_t LiveHosts(int i) { return shm::FleetWord::Hosts(Orders(i).fleet.load()); }
  uint32_t Floor(int i) { return Orders(i).policy.min_retries_per_sec.load(); }
  // What the workers' admits cost, on hosts [first, last].
  struct AdmitStats {
    uint64_t admits = 0, blocked = 0, paged_in = 0, preempted = 0, slowest_ns = 0,
             slowest_unpreempted_ns = 0;
  };
  AdmitStats AdmitsOf(int first, int last) {
    AdmitStats a;
    for (int i = first; i <= last; ++i) {
      a.admits += ds_->admits[i].load();
      a.blocked += ds_->blocked_admits[i].load();
      a.paged_in += ds_->paged_in_admits[i].load();
      a.preempted += ds_->preempted_admits[i].load();
      a.slowest_ns = std::max(a.slowest_ns, ds_->slowest_admit_ns[i].load());
      a.slowest_unpreempted_ns =
          std::max(a.slowest_unpreempted_ns, ds_->slowest_unpreempted_admit_ns[i].load());
    }
    return a;
  }
  AdmitStats AllAdmits() { return AdmitsOf(0, int(hosts_.size()) - 1); }
  // ResetAdmits starts host i's admit figures anew.
  void ResetAdmits(int i) {
    ds_->admits[i] = 0;
    ds_->blocked_admits[i] = 0;
    ds_->paged_in_admits[i] = 0;
    ds_->preempted_admits[i] = 0;
    ds_->slowest_admit_ns[i] = 0;
    ds_->slowest_unpreempted_admit_ns[i] = 0;
  }
  // ExpectAdmitsNeverWaited: `a` printed and bounded.
  void ExpectAdmitsNeverWaited(const AdmitStats& a, const std::string& during) {
    std::printf("%llu admits %s: none blocked: %s (%llu slept in a major page fault); the "
                "slowest %.3f ms (%.3f ms of the %llu the scheduler did not preempt)\n",
                static_cast<unsigned long long>(a.admits), during.c_str(),
                a.blocked == 0 ? "yes" : "NO", static_cast<unsigned long long>(a.paged_in),
                double(a.slowest_ns) / 1e6,
                double(a.slowest_unpreempted_ns) / 1e6,
                static_cast<unsigned long long>(a.admits - a.preempted));
    EXPECT_GT(a.admits, 0u);
    EXPECT_EQ(a.blocked, 0u) << "an admit blocked " << during;
    EXPECT_LT(a.slowest_unpreempted_ns, kAdmitBoundNs) << "an admit took long " << during;
    EXPECT_LT(a.slowest_ns, kPreemptedAdmitBoundNs) << "an admit waited " << during;
  }
  std::string Outcome(Redis& redis, const char* field) {
    const StoreReply r = redis.Command({"HGET", prefix_ + ":dep:orders:outcome", field});
    return r.str;
  }
  // ReportedOpenedAt: the opened_at of host i's report in the store's windows (-1: closed, or
  // not following its open period yet; -2: a period begun before this store), or kNoReport.
  static constexpr int64_t kNoReport = -100;
  int64_t ReportedOpenedAt(Redis& redis, int i) {
    const StoreReply r =
        redis.Command({"HGET", prefix_ + ":dep:orders:window", "host-" + std::to_string(i)});
    std::istringstream in(r.str);
    uint64_t calls = 0, failures = 0, slow = 0;
    int64_t opened_at = kNoReport;
    return in >> calls >> failures >> slow >> opened_at ? opened_at : kNoReport;
  }
  // StartFailingHosts: `n` hosts of one policy, their downstream failing, each calling 20 times
  // a second, until every one is open and reports the open period it follows.
  void StartFailingHosts(Redis& redis, int n, const std::string& orders) {
    StartHosts(n, "redis = \"" + redis.address() + "\"\n", orders);
    ASSERT_TRUE(WaitJoined());
    ds_->failing = 1;
    for (int i = 0; i < n; ++i) StartWorker(i, {20, false});
    ASSERT_TRUE(WaitAllOpen(20'000)) << hosts_[0].daemon->Log();
    ASSERT_TRUE(WaitUntil(
        [&] { return All([&](int i) { return ReportedOpenedAt(redis, i) >= 0; }); }, 10'000));
  }
};

// 1. A Sentinel failover while the fleet's probe is in flight: the master is killed while one
// host holds the fleet probe lease and its probe hangs (half-open), the two others held.
//
// What must happen, and does: every host goes local at its next command (the old master's
// connections are closed), which gives every hold back and makes the prober forget its lease:
// no host is held through the failover, and the prober's probe, still in flight, speaks for
// that host alone. Until the hosts rejoin, the fleet is a set of host-local breakers: each held
// host probes on its own, one probe each (half_open_probes = 1), so the probes in flight at
// once are at most hosts x half_open_probes (here 3: fleet_half_open_probes = 1, plus one per
// host that lost the store once its open period was over), never more than without the fleet.
// The lease key cannot outlive the failover for long: its expiry (three syncs) replicates with
// it, so if the replica had it, it expires on the new master at the same moment, and if the
// replica lagged and lacks it, a host may take a new lease at once; either way the old prober
// holds none. Once every host has rejoined, the probes in flight (all hung) fail when the hang
// ends; each host reopens on its own probe (nothing is published: no host holds a lease) and
// the fleet starts a new round: exactly fleet_half_open_probes probe, one success published,
// and every host closes, within open_for_max (the backed-off period its probe's failure drew)
// plus two syncs of the downstream being healthy.
TEST_F(FleetChaosTest, ASentinelFailoverWhileTheFleetsProbeIsInFlight) {
  SKIP_WITHOUT_REDIS();
  auto master = std::make_unique<Redis>(FreePort());
  Redis replica(FreePort(), master->address());
  Redis sentinel(FreePort(), "", master->port());
  // The replica follows the master before the fleet starts: a replica still making its first
  // connection (it tries once a second) or its first full copy on a loaded machine would miss
  // the lease below.
  ASSERT_TRUE(WaitUntil([&] {
    return replica.Command({"INFO", "replication"}).str.find("master_link_status:up") !=
           std::string::npos;
  }, 30'000)) << replica.Command({"INFO", "replication"}).str;
  constexpr int kHosts = 3;
  constexpr uint32_t kOpenForMaxMs = 2'000;
  // Each probe hangs until the test lifts the hang (60 s at most, and no probe_timeout before).
  const int prober = HangTheFleetsProbe(
      "sentinels = [\"127.0.0.1:" + std::to_string(sentinel.port()) +
          "\"]\nmaster_name = \"fleet\"\ntimeout = \"" + std::to_string(kTimeoutMs) + "ms\"\n",
      "open_for_max = \"2s\"\nhalf_open_probes = 1\nclose_after = 1\nprobe_timeout = \"60s\"\n"
      "fleet_half_open_probes = 1\n",
      60'000);
  ASSERT_GE(prober, 0) << hosts_[0].daemon->Log();
  ASSERT_TRUE(WaitUntil([&] {
    return Role((prober + 1) % kHosts) == shm::FleetRole::kHolding &&
           Role((prober + 2) % kHosts) == shm::FleetRole::kHolding;
  }, 10'000)) << hosts_[size_t(prober)].daemon->Log();
  // A second worker per host: it keeps admitting while the first hangs in a probe.
  for (int i = 0; i < kHosts; ++i) StartWorker(i, {20, false});
  const std::string lease_key = prefix_ + ":dep:orders:lease:0";
  // The replica has the lease (replication is asynchronous: this is the case where it did not
  // lag), and the fleet's outcome count so far.
  ASSERT_TRUE(WaitUntil([&] { return replica.Command({"GET", lease_key}).type == StoreReply::Type::kString; }, 10'000))
      << "master: " << master->Command({"GET", lease_key}).str << "\n"
      << replica.Command({"INFO", "replication"}).str << hosts_[size_t(prober)].daemon->Log();
  const std::string n_before = Outcome(*master, "n");
  uint64_t probes_before[kMaxHosts];
  for (int i = 0; i < kHosts; ++i) probes_before[i] = ds_->probes[i].load();
  ASSERT_EQ(ds_->probes_in_flight.load(), 1u);

  master->Kill();
  const uint64_t killed_ns = shm::PreciseNowNs();
  const uint64_t killed_unix_ms = shm::UnixNowMs();
  const std::vector<pid_t> stores = {replica.pid(), sentinel.pid()};
  const auto killed_waits = CpuWaits(stores);
  // Every host local at its next command; none held (a held host's role is gone with its hold).
  uint64_t local_ns[kMaxHosts] = {};
  ASSERT_TRUE(WaitUntil([&] {
    for (int i = 0; i < kHosts; ++i) {
      if (local_ns[i] == 0 && FleetStateOf(i) == shm::FleetState::kLocal) {
        local_ns[i] = shm::PreciseNowNs();
        EXPECT_EQ(Role(i), shm::FleetRole::kNone) << "host " << i;
      }
    }
    return All([&](int i) { return local_ns[i] != 0; });
  }, 10'000));
  double slowest_local_ms = 0;
  for (int i = 0; i < kHosts; ++i) {
    slowest_local_ms = std::max(slowest_local_ms, double(local_ns[i] - killed_ns) / 1e6);
  }
  const double local_waited_ms = WaitedMsSince(killed_waits, stores);
  std::printf("every host local %.0f ms after the master died (the prober's next command is at "
              "its next sync, %u ms; the processes waited %.0f ms for a CPU)\n",
              slowest_local_ms, kSyncMs, local_waited_ms);
  EXPECT_LE(slowest_local_ms, kSyncMs + kStepMs + kTimerSlackMs + local_waited_ms);

  // Through the failover each held host probes on its own, once: its breaker's own
  // half_open_probes, as a host-local retryd would.
  ASSERT_TRUE(WaitUntil([&] {
    return All([&](int i) { return i == prober || ds_->probes[i].load() > probes_before[i]; });
  }, 10'000));
  const double own_probe_ms = MsSince(killed_ns);
  std::printf("each held host sent its own probe %.0f ms after the master died\n", own_probe_ms);

  // Every host back, on the promoted replica.
  ASSERT_TRUE(WaitUntil([&] {
    return All([&](int i) {
      return FleetStateOf(i) == shm::FleetState::kJoined &&
             Header(i).fleet_synced_unix_ms.load() > killed_unix_ms;
    });
  }, 30'000)) << hosts_[0].daemon->Log();
  const double rejoined_ms = MsSince(killed_ns);
  const StoreReply pttl = replica.Command({"PTTL", lease_key});
  std::printf("every host synced with the new master %.0f ms after the old one died; the old "
              "lease there: %s\n", rejoined_ms,
              pttl.integer == -2 ? "gone (expired: three syncs after its last renewal)"
                                 : ("still there, PTTL " + std::to_string(pttl.integer)).c_str());
  EXPECT_NE(hosts_[0].daemon->Log().find("127.0.0.1:" + std::to_string(replica.port())),
            std::string::npos);
  for (int i = 0; i < kHosts; ++i) {
    EXPECT_EQ(ds_->probes[i].load(), probes_before[i] + (i == prober ? 0 : 1))
        << "host " << i << ": one probe of its own, still in flight";
    EXPECT_NE(Role(i), shm::FleetRole::kHolding) << "host " << i << " held while its own probe hangs";
  }
  const uint32_t most_in_flight = ds_->most_probes_in_flight.load();
  std::printf("probes in flight at once across the failover: %u (hosts x half_open_probes = %d)\n",
              most_in_flight, kHosts);
  EXPECT_LE(most_in_flight, uint32_t(kHosts));
  // The prober's round was never published, by it or by anyone.
  EXPECT_EQ(Outcome(replica, "n"), n_before);

  // The downstream heals: the hung probes end (as failures: they were sent into the outage).
  const uint64_t probes_at_heal = ProbesSoFar();
  ds_->failing = 0;
  ds_->hang_ms = 0;
  const uint64_t healed_ns = shm::PreciseNowNs();
  const auto healed_waits = CpuWaits(stores);
  ASSERT_TRUE(WaitAllClosed(20'000)) << hosts_[size_t(prober)].daemon->Log();
  const double closed_ms = MsSince(healed_ns);
  const double closed_waited_ms = WaitedMsSince(healed_waits, stores);
  const uint64_t round_probes = ProbesSoFar() - probes_at_heal;
  std::printf("every host closed %.0f ms after the downstream healed, on %llu probe(s) "
              "(open_for_max %u ms, sync %u ms; the processes waited %.0f ms for a CPU)\n",
              closed_ms, static_cast<unsigned long long>(round_probes), kOpenForMaxMs, kSyncMs,
              closed_waited_ms);
  EXPECT_LE(closed_ms, kOpenForMaxMs + 2 * kSyncMs + kTimerSlackMs + closed_waited_ms);
  EXPECT_EQ(round_probes, 1u) << "the new round sent more than fleet_half_open_probes";
  // One outcome for the new round: a success.
  EXPECT_EQ(Outcome(replica, "result"), "success");
  EXPECT_EQ(std::stoll(Outcome(replica, "n")), (n_before.empty() ? 0 : std::stoll(n_before)) + 1);
  ExpectAdmitsNeverWaited(AllAdmits(), "across the failover");
}

// 2. The prober's daemon stopped (SIGSTOP) for longer than its lease, while its probe hangs.
// Its workers go on (they touch only the segment) and never wait. Its lease expires three syncs
// after its last renewal, and a held host takes it and probes; the downstream answers new calls
// again, so that probe's success is the fleet's outcome and the others close. The stopped host's
// own probe, sent into the outage, then fails, and its workers reopen its breaker while its
// daemon is still stopped. Continued, the daemon must not publish that stale failure over the
// fleet's success (kPublishOutcome checks the lease is still its own), and its breaker must
// close on the fleet's success, which came in the round its lost lease began, at its first step:
// not wait out its backed-off open period and send a probe of its own.
TEST_F(FleetChaosTest, AProberStoppedPastItsLeaseNeitherHoldsTheFleetNorOverridesItsOutcome) {
  SKIP_WITHOUT_REDIS();
  Redis redis(FreePort());
  constexpr int kHosts = 3;
  const int prober = HangTheFleetsProbe(
      "redis = \"" + redis.address() + "\"\ntimeout = \"" + std::to_string(kTimeoutMs) + "ms\"\n",
      "open_for_max = \"2s\"\nhalf_open_probes = 1\nclose_after = 1\nprobe_timeout = \"60s\"\n",
      60'000);
  ASSERT_GE(prober, 0) << hosts_[0].daemon->Log();
  ASSERT_TRUE(WaitUntil([&] {
    return Role((prober + 1) % kHosts) == shm::FleetRole::kHolding &&
           Role((prober + 2) % kHosts) == shm::FleetRole::kHolding;
  }, 10'000)) << hosts_[size_t(prober)].daemon->Log();
  for (int i = 0; i < kHosts; ++i) StartWorker(i, {20, false});
  uint64_t leases_before[kMaxHosts];
  for (int i = 0; i < kHosts; ++i) leases_before[i] = Header(i).fleet_leases.load();

  uint64_t own_probes_before[kMaxHosts];
  for (int i = 0; i < kHosts; ++i) own_probes_before[i] = ds_->own_probes[i].load();

  // New calls succeed from now on; the hung probe, sent into the outage, still hangs.
  ds_->failing = 0;
  hosts_[size_t(prober)].daemon->Signal(SIGSTOP);
  const uint64_t stopped_ns = shm::PreciseNowNs();
  const auto stopped_waits = CpuWaits({redis.pid()});
  ResetAdmits(prober);  // its workers' admits while its daemon is stopped

  // A held host whose daemon is kept off a CPU past a sync lets its hold lapse (its workers must
  // never wait for it), and its workers then probe on its own rules: the new calls succeed, and
  // it closes alone, needing no lease. Only the hosts still held can inherit the lease.
  auto probed_alone = [&](int i) { return ds_->own_probes[i].load() > own_probes_before[i]; };
  int heir = -1;
  const bool inherited = WaitUntil(
      [&] {
        bool held_left = false;
        for (int i = 0; i < kHosts; ++i) {
          if (i == prober) continue;
          if (Header(i).fleet_leases.load() > leases_before[i]) heir = i;
          held_left = held_left || !probed_alone(i);
        }
        return heir >= 0 || !held_left;
      },
      10'000);
  if (heir < 0 && inherited) {
    GTEST_SKIP() << "every held host's daemon was kept off a CPU past its hold, and its workers "
                    "probed alone: no host was left to inherit the lease";
  }
  ASSERT_GE(heir, 0) << "no host took the lease; their logs:\n"
                     << hosts_[(prober + 1) % kHosts].daemon->Log() << "\n"
                     << hosts_[(prober + 2) % kHosts].daemon->Log();
  const double lease_ms = MsSince(stopped_ns);
  const double lease_waited_ms = WaitedMsSince(stopped_waits, {redis.pid()});
  std::printf(
      "host %d took the fleet probe lease %.0f ms after the prober's daemon stopped "
      "(its lease lives %u ms past its last renewal; the processes waited %.0f ms for a "
      "CPU)\n",
      heir, lease_ms, 3 * kSyncMs, lease_waited_ms);
  EXPECT_LE(lease_ms, 3 * kSyncMs + kStepMs + kTimerSlackMs + lease_waited_ms);
  ASSERT_TRUE(WaitUntil(
      [&] {
        return All([&](int i) { return i == prober || State(i) == shm::BreakerState::kClosed; });
      },
      10'000))
      << hosts_[size_t(heir)].daemon->Log();
  std::printf("the other hosts closed %.0f ms after the prober's daemon stopped\n",
              MsSince(stopped_ns));
  // The heir publishes its success at its next step after its close (the others close on it,
  // unless they closed alone).
  ASSERT_TRUE(WaitUntil([&] { return Outcome(redis, "result") == "success"; }, 5'000))
      << hosts_[size_t(heir)].daemon->Log();
  const std::string n_success = Outcome(redis, "n");
  ASSERT_EQ(Outcome(redis, "host"), "host-" + std::to_string(heir));

  // The stale probe fails; the stopped host's workers reopen its breaker on their own.
  ds_->hang_ms = 0;
  ASSERT_TRUE(WaitUntil([&] { return State(prober) == shm::BreakerState::kOpen; }, 5'000));
  const AdmitStats stopped = AdmitsOf(prober, prober);
  ExpectAdmitsNeverWaited(stopped, "on the stopped host, its daemon stopped for " +
                                       std::to_string(int(MsSince(stopped_ns))) + " ms");
  EXPECT_GE(stopped.admits, 10u);

  const uint64_t own_probes = ds_->probes[prober].load();
  hosts_[size_t(prober)].daemon->Signal(SIGCONT);
  const uint64_t continued_ns = shm::PreciseNowNs();
  const auto continued_waits = CpuWaits({redis.pid()});
  ASSERT_TRUE(WaitUntil([&] { return State(prober) == shm::BreakerState::kClosed; }, 10'000))
      << hosts_[size_t(prober)].daemon->Log();
  const double closed_ms = MsSince(continued_ns);
  const double closed_waited_ms = WaitedMsSince(continued_waits, {redis.pid()});
  std::printf("the continued host closed %.0f ms after its daemon ran again, on the fleet's "
              "success (its own open period: %u ms; the processes waited %.0f ms for a CPU)\n",
              closed_ms, 2'000u, closed_waited_ms);
  // Its first step after it runs again, and what the processes waited for a CPU.
  EXPECT_LE(closed_ms, kStepMs + kTimerSlackMs + closed_waited_ms);
  EXPECT_EQ(ds_->probes[prober].load(), own_probes) << "it probed on its own";
  const std::string log = hosts_[size_t(prober)].daemon->Log();
  EXPECT_NE(log.find("this host's fleet probe: failure (its lease had expired: not published)"),
            std::string::npos) << log;
  // The fleet's outcome is still the heir's success, and stays so.
  const uint64_t synced = Header(prober).fleet_synced_unix_ms.load();
  ASSERT_TRUE(WaitUntil([&] { return Header(prober).fleet_synced_unix_ms.load() > synced + 2 * kSyncMs; }, 10'000));
  EXPECT_EQ(Outcome(redis, "n"), n_success);
  EXPECT_EQ(Outcome(redis, "result"), "success");
  EXPECT_EQ(Outcome(redis, "host"), "host-" + std::to_string(heir));
  for (int i = 0; i < kHosts; ++i) EXPECT_EQ(State(i), shm::BreakerState::kClosed) << "host " << i;
  ExpectAdmitsNeverWaited(AllAdmits(), "on every host (the stopped one's since its stop)");
}

// 3. One host cut from the store (through the proxy) while the others reach it. A partition
// that drops packets (Freeze) is the slowest to notice: the cut host's next command, at its next
// sync, waits out the timeout, so it is local within sync + timeout (a sync is due every
// `sync`, and the fleet thread looks at the time every step: a step more at most); one that
// refuses (Cut) within a sync and a step. It then decides alone: its own floor, its breaker trips on its own window (its
// calls fail too: its own network), and goes half-open on its own open period with no lease.
// The others keep the fleet: the cut host's report goes stale three syncs after its last, and
// at their next sync they count one host less (and share the fleet's floor among two) and never
// trip on its failures. Through the proxy again, it rejoins within its reconnect backoff (which
// doubles from 250 ms: at most twice the time it has been local, plus 250 ms, plus a timeout),
// and every host counts three again.
class FleetPartitionTest : public FleetChaosTest,
                           public ::testing::WithParamInterface<TcpProxy::Mode> {};

TEST_P(FleetPartitionTest, OneHostCutFromTheStoreDecidesAloneAndRejoins) {
  SKIP_WITHOUT_REDIS();
  const bool freeze = GetParam() == TcpProxy::Mode::kFreeze;
  Redis redis(FreePort());
  TcpProxy proxy(redis.port());
  constexpr int kHosts = 3;
  const std::string orders =
      "min_calls = 20\nfailure_rate_threshold = 50\nwindow = \"60s\"\nopen_for = \"1s\"\n"
      "open_for_max = \"2s\"\nopen_jitter = \"0s\"\nhalf_open_probes = 1\nclose_after = 1\n"
      "fleet = true\nfleet_min_hosts = 2\nfleet_min_retries_per_sec = 30\n"
      "fleet_retry_burst = 30\n";
  const std::string timeout = "timeout = \"" + std::to_string(kTimeoutMs) + "ms\"\n";
  StartHosts(1, "redis = \"" + proxy.address() + "\"\n" + timeout, orders);
  StartHosts(kHosts - 1, "redis = \"" + redis.address() + "\"\n" + timeout, orders);
  ASSERT_TRUE(WaitJoined());
  ASSERT_TRUE(WaitUntil([&] {
    return All([&](int i) { return LiveHosts(i) == 3 && Floor(i) == 10; });
  }, 10'000));
  for (int i = 1; i < kHosts; ++i) StartWorker(i, {20, false});

  ds_->failing_at[0] = 1;  // the cut host's own calls fail too
  if (freeze) {
    proxy.Freeze();
  } else {
    proxy.Cut();
  }
  const uint64_t cut_ns = shm::PreciseNowNs();
  const std::vector<pid_t> stores = {redis.pid(), proxy.pid()};
  const auto cut_waits = CpuWaits(stores);
  StartWorker(0, {20, false});
  ASSERT_TRUE(WaitUntil([&] { return FleetStateOf(0) == shm::FleetState::kLocal; }, 10'000));
  const uint64_t local_ns = shm::PreciseNowNs();
  const double local_ms = double(local_ns - cut_ns) / 1e6;
  const double local_waited_ms = WaitedMsSince(cut_waits, stores);
  std::printf("%s: the cut host local %.0f ms after the cut (sync %u ms, timeout %u ms; the "
              "processes waited %.0f ms for a CPU)\n", freeze ? "freeze" : "cut", local_ms,
              kSyncMs, kTimeoutMs, local_waited_ms);
  EXPECT_LE(local_ms,
            kSyncMs + kStepMs + (freeze ? kTimeoutMs : 0) + kTimerSlackMs + local_waited_ms);
  EXPECT_EQ(Floor(0), shm::Policy().min_retries_per_sec) << "its own floor";

  // The others count two hosts and share the floor between them.
  ASSERT_TRUE(WaitUntil([&] {
    return LiveHosts(1) == 2 && LiveHosts(2) == 2 && Floor(1) == 15 && Floor(2) == 15;
  }, 10'000));
  const double dropped_ms = MsSince(cut_ns);
  const double dropped_waited_ms = WaitedMsSince(cut_waits, stores);
  std::printf("the others counted 2 hosts %.0f ms after the cut (3 syncs of freshness, then "
              "their next sync; the processes waited %.0f ms for a CPU)\n", dropped_ms,
              dropped_waited_ms);
  EXPECT_LE(dropped_ms, 4 * kSyncMs + kStepMs + kTimerSlackMs + dropped_waited_ms);

  // Alone: it trips on its own window, and probes on its own open period, with no lease.
  ASSERT_TRUE(WaitUntil([&] { return ds_->probes[0].load() >= 1; }, 10'000))
      << hosts_[0].daemon->Log();
  std::printf("the cut host tripped on its own window and sent its own probe %.0f ms after the "
              "cut\n", MsSince(cut_ns));
  EXPECT_EQ(FleetStateOf(0), shm::FleetState::kLocal);
  EXPECT_GE(shm::ReadCounter(Orders(0), shm::kOpened), 1u);
  EXPECT_EQ(Header(0).fleet_trips.load(), 0u);
  EXPECT_EQ(Header(0).fleet_leases.load(), 0u);
  for (int i = 1; i < kHosts; ++i) {
    EXPECT_EQ(State(i), shm::BreakerState::kClosed) << "host " << i;
    EXPECT_EQ(Header(i).fleet_trips.load(), 0u) << "host " << i;
    EXPECT_EQ(FleetStateOf(i), shm::FleetState::kJoined) << "host " << i;
  }

  // Its network heals and the proxy relays again.
  ds_->failing_at[0] = 0;
  proxy.Relay();
  const uint64_t healed_ns = shm::PreciseNowNs();
  const auto healed_waits = CpuWaits(stores);
  const double outage_ms = double(healed_ns - local_ns) / 1e6;
  // Its reconnect backoff doubles from 250 ms, each wait uniform in [half, all] of it: the waits
  // before attempt k add up to at least half its backoff less 125 ms, so the wait under way
  // when the proxy heals is at most twice the time local (an attempt under way then may first
  // wait out its timeout), plus 250 ms, then the step it is looked at on.
  ASSERT_TRUE(WaitUntil([&] { return FleetStateOf(0) == shm::FleetState::kJoined; }, 40'000))
      << hosts_[0].daemon->Log();
  const double rejoin_ms = MsSince(healed_ns);
  const double rejoin_waited_ms = WaitedMsSince(healed_waits, stores);
  std::printf("the cut host rejoined %.0f ms after the proxy relayed again (local for %.0f ms; "
              "the processes waited %.0f ms for a CPU)\n", rejoin_ms, outage_ms,
              rejoin_waited_ms);
  EXPECT_LE(rejoin_ms, kTimeoutMs + 2 * (outage_ms + kTimeoutMs) + 250 + kStepMs +
                           kTimerSlackMs + rejoin_waited_ms);
  ASSERT_TRUE(WaitUntil([&] {
    return All([&](int i) { return LiveHosts(i) == 3 && Floor(i) == 10; });
  }, 10'000));
  std::printf("every host counted 3 again %.0f ms after the proxy relayed again\n",
              MsSince(healed_ns));
  ASSERT_TRUE(WaitAllClosed(20'000)) << hosts_[0].daemon->Log();
  for (int i = 1; i < kHosts; ++i) {
    EXPECT_EQ(Header(i).fleet_trips.load(), 0u) << "host " << i;
  }
  ExpectAdmitsNeverWaited(AllAdmits(), freeze ? "across the partition" : "across the cut");
}

INSTANTIATE_TEST_SUITE_P(Partitions, FleetPartitionTest,
                         ::testing::Values(TcpProxy::Mode::kFreeze, TcpProxy::Mode::kCut),
                         [](const ::testing::TestParamInfo<TcpProxy::Mode>& p) {
                           return p.param == TcpProxy::Mode::kFreeze ? "Freeze" : "Cut";
                         });

// 4. A store that answers one host slowly (the proxy holds every reply). Under the timeout
// (150 ms of 250: the rest is for a loaded machine's scheduling) the host stays joined: every
// sync takes longer (two round trips), none fails, and the other host keeps counting it. Past
// the timeout (400 ms) it is local within its next command's timeout, never blocking its
// workers, and its reconnects back off: the wait before the next attempt doubles from 250 ms
// (uniform in [half, all] of it) and counts from the start of the attempt that failed, which
// itself lasts a timeout; attempts are made on the fleet thread's step. Once the replies are
// prompt again it rejoins at its next attempt.
TEST_F(FleetChaosTest, AStoreThatAnswersOneHostSlowly) {
  SKIP_WITHOUT_REDIS();
  Redis redis(FreePort());
  TcpProxy proxy(redis.port());
  const std::string orders = "fleet = true\nfleet_min_retries_per_sec = 20\nfleet_retry_burst = 20\n";
  const std::string timeout = "timeout = \"" + std::to_string(kTimeoutMs) + "ms\"\n";
  StartHosts(1, "redis = \"" + proxy.address() + "\"\n" + timeout, orders);
  StartHosts(1, "redis = \"" + redis.address() + "\"\n" + timeout, orders);
  ASSERT_TRUE(WaitJoined());
  ASSERT_TRUE(WaitUntil([&] { return All([&](int i) { return LiveHosts(i) == 2 && Floor(i) == 10; }); }, 10'000));
  for (int i = 0; i < 2; ++i) StartWorker(i, {100, false});

  // Under the timeout: five syncs through it, joined all along.
  constexpr uint32_t kUnderMs = 150, kOverMs = 400;
  proxy.DelayReplies(kUnderMs);
  const uint64_t fallbacks = Header(0).fleet_fallbacks.load();
  const uint64_t slow_from_ns = shm::PreciseNowNs();
  uint64_t synced = Header(0).fleet_synced_unix_ms.load();
  int syncs = -1;  // the first change may be a sync already under way
  bool stayed_joined = true, counted = true;
  ASSERT_TRUE(WaitUntil([&] {
    stayed_joined = stayed_joined && FleetStateOf(0) == shm::FleetState::kJoined;
    counted = counted && LiveHosts(1) == 2;
    if (const uint64_t s = Header(0).fleet_synced_unix_ms.load(); s != synced) {
      synced = s;
      ++syncs;
    }
    return syncs == 5;
  }, 20'000)) << hosts_[0].daemon->Log();
  std::printf("replies %u ms late (timeout %u ms): 5 syncs in %.0f ms, joined throughout: %s\n",
              kUnderMs, kTimeoutMs, MsSince(slow_from_ns), stayed_joined ? "yes" : "no");
  EXPECT_TRUE(stayed_joined);
  EXPECT_TRUE(counted) << "the other host lost count of the slow one";
  EXPECT_EQ(Header(0).fleet_fallbacks.load(), fallbacks);
  EXPECT_EQ(Floor(0), 10u);

  // Each bound below on how late the daemon acts allows the time it and the proxy, which times
  // its connections, waited for a CPU meanwhile: at a load of 30 one reconnect came 1,025 ms
  // after the one before, 200 ms past the design's bound and a fixed margin.
  auto waited_ms = [&, from = uint64_t{0}]() mutable {
    const uint64_t now = retryd::testing::RunQueueWaitNs(hosts_[0].daemon->pid()) +
                         retryd::testing::RunQueueWaitNs(proxy.pid());
    const double ms = double(now - std::min(from, now)) / 1e6;
    from = now;
    return ms;
  };

  // Past the timeout.
  proxy.DelayReplies(kOverMs);
  const uint64_t over_ns = shm::PreciseNowNs();
  waited_ms();
  ASSERT_TRUE(WaitUntil([&] { return FleetStateOf(0) == shm::FleetState::kLocal; }, 10'000));
  const uint64_t local_ns = shm::PreciseNowNs();
  const double local_ms = double(local_ns - over_ns) / 1e6;
  const double local_waited_ms = waited_ms();
  std::printf("replies %u ms late: local %.0f ms after (a command under way when the delay grew, "
              "then the next one's timeout; %.0f ms of it waiting for a CPU)\n", kOverMs,
              local_ms, local_waited_ms);
  // A command sent just before the change is answered at the old delay; the next, at most a
  // sync later, times out.
  EXPECT_LE(local_ms, kUnderMs + kSyncMs + kTimeoutMs + kTimerSlackMs + local_waited_ms);
  EXPECT_EQ(Floor(0), shm::Policy().min_retries_per_sec) << "its own floor";

  // The reconnects back off: between the starts of attempts k and k + 1, the larger of the
  // wait (250 ms x 2^(k-1), uniform in [half, all] of it) and the attempt's own timeout, then up
  // to a step.
  auto attempts = [&] {
    std::vector<uint64_t> out;
    for (uint64_t t : proxy.Accepts()) {
      if (t >= local_ns - uint64_t{kStepMs} * 1'000'000) out.push_back(t);
    }
    return out;
  };
  ASSERT_TRUE(WaitUntil([&] { return attempts().size() >= 4; }, 20'000)) << hosts_[0].daemon->Log();
  const std::vector<uint64_t> a = attempts();
  proxy.DelayReplies(0);
  const uint64_t prompt_ns = shm::PreciseNowNs();
  // Over every gap at once: a bound on each, never tighter than the truth.
  const double gaps_waited_ms = waited_ms();
  std::string gaps;
  double backoff_ms = 0;
  for (size_t k = 1; k < 4; ++k) {
    const double gap_ms = double(a[k] - a[k - 1]) / 1e6;
    backoff_ms = 250.0 * double(1u << (k - 1));
    gaps += (k > 1 ? ", " : "") + std::to_string(int(gap_ms)) + " ms";
    EXPECT_GE(gap_ms, std::max<double>(backoff_ms / 2, kTimeoutMs) - 5) << "attempt " << k + 1;
    EXPECT_LE(gap_ms,
              std::max<double>(backoff_ms, kTimeoutMs) + kStepMs + kTimerSlackMs + gaps_waited_ms)
        << "attempt " << k + 1;
  }
  std::printf("reconnect attempts %s apart (waits of 125-250, 250-500, 500-1000 ms from each "
              "attempt's start, which lasts its %u ms timeout; %.0f ms waiting for a CPU over "
              "the three)\n", gaps.c_str(), kTimeoutMs, gaps_waited_ms);

  // Prompt again: it rejoins at its next attempt, at most the next backoff (2 s) after the last.
  ASSERT_TRUE(WaitUntil([&] { return FleetStateOf(0) == shm::FleetState::kJoined; }, 20'000))
      << hosts_[0].daemon->Log();
  const double rejoin_ms = MsSince(prompt_ns);
  const double rejoin_waited_ms = waited_ms();
  std::printf("rejoined %.0f ms after the replies were prompt again (%.0f ms waiting for a CPU)\n",
              rejoin_ms, rejoin_waited_ms);
  EXPECT_LE(rejoin_ms, 2 * backoff_ms + kStepMs + kTimerSlackMs + rejoin_waited_ms);
  std::printf("%zu connection attempts in the %.0f ms it was local\n", attempts().size(),
              double(prompt_ns - local_ns) / 1e6 + rejoin_ms);
  EXPECT_LE(attempts().size(), 5u) << "more attempts than the backoff allows";
  ASSERT_TRUE(WaitUntil([&] { return All([&](int i) { return LiveHosts(i) == 2 && Floor(i) == 10; }); }, 10'000));
  ExpectAdmitsNeverWaited(AllAdmits(), "with a slow store");
}

// 5. A host away from the store (cut off, its breaker open and held, no calls of its own) while
// the fleet's probe succeeds, the other hosts close, and the downstream fails again, so that
// they trip again: a new open period of the fleet, which the away host's breaker, unmoved, does
// not tell from the old one. Rejoining, it must follow the new period, not close on the old
// success (it did, for a moment, until its next sync tripped it again: its workers called a
// failing downstream meanwhile). The fleet's reports tell: hosts opened since that success.
// Open periods of 10 s, so that the away host's reconnect, backed off while it was cut, comes
// before the new period's probe reports (else there is nothing to judge, and the test skips).
TEST_F(FleetChaosTest, AHostAwayWhileTheFleetClosesAndTripsAgainDoesNotCloseOnTheOldSuccess) {
  SKIP_WITHOUT_REDIS();
  Redis redis(FreePort());
  TcpProxy proxy(redis.port());
  const std::string orders =
      "min_calls = 20\nfailure_rate_threshold = 50\nwindow = \"60s\"\nopen_for = \"10s\"\n"
      "open_for_max = \"10s\"\nopen_jitter = \"0s\"\nhalf_open_probes = 1\nclose_after = 1\n"
      "fleet = true\nfleet_min_hosts = 2\n";
  const std::string timeout = "timeout = \"" + std::to_string(kTimeoutMs) + "ms\"\n";
  StartHosts(1, "redis = \"" + proxy.address() + "\"\n" + timeout, orders);
  StartHosts(2, "redis = \"" + redis.address() + "\"\n" + timeout, orders);
  ASSERT_TRUE(WaitJoined());
  ds_->failing = 1;
  StartWorker(1, {20, false});
  StartWorker(2, {20, false});
  ASSERT_TRUE(WaitAllOpen(20'000)) << hosts_[0].daemon->Log();
  ASSERT_TRUE(WaitUntil([&] { return Role(0) == shm::FleetRole::kHolding; }, 10'000));
  auto seq = [&](int i) { return shm::BreakerWord::Decode(Orders(i).breaker.load()).seq; };
  const uint16_t seq0 = seq(0);
  proxy.Cut();
  ASSERT_TRUE(WaitUntil([&] { return FleetStateOf(0) == shm::FleetState::kLocal; }, 10'000));
  ds_->failing = 0;
  ASSERT_TRUE(WaitUntil(
      [&] {
        return State(1) == shm::BreakerState::kClosed && State(2) == shm::BreakerState::kClosed;
      },
      30'000))
      << hosts_[1].daemon->Log();
  ASSERT_EQ(Outcome(redis, "result"), "success");
  const std::string success_n = Outcome(redis, "n");
  ds_->failing = 1;  // the fleet trips again
  ASSERT_TRUE(WaitUntil(
      [&] {
        return State(1) != shm::BreakerState::kClosed && State(2) != shm::BreakerState::kClosed;
      },
      30'000))
      << hosts_[1].daemon->Log();
  ASSERT_EQ(State(0), shm::BreakerState::kOpen);
  ASSERT_EQ(seq(0), seq0) << "host 0's breaker moved while it was away";
  proxy.Relay();
  ASSERT_TRUE(WaitUntil([&] { return FleetStateOf(0) == shm::FleetState::kJoined; }, 40'000));
  // Only while the old success is still the fleet's last outcome is there anything to judge
  // (a failed probe of the new period, published first, reopens host 0 whatever it read).
  if (Outcome(redis, "result") != "success" || Outcome(redis, "n") != success_n) {
    GTEST_SKIP() << "the new open period's probe reported before host 0 rejoined";
  }
  bool closed = false;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(4 * kSyncMs);
  while (std::chrono::steady_clock::now() < until && !closed) {
    closed = State(0) == shm::BreakerState::kClosed;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_FALSE(closed) << "host 0 closed on the old success in the fleet's new open period\n"
                       << hosts_[0].daemon->Log();
}

// 6. The store emptied while every host is open after a failed round (outcome count 1 or more):
// restarted without its data (every connection lost, so each host follows its open period
// again) or flushed (FLUSHALL: no host notices a disconnect). Its counts begin again at 0; a
// host that kept the round its open period began in (1 or more) would report its outage's
// failures past the new store's first success (success_n 1), and the hosts that had closed on
// it would trip again. The store's epoch (kReadOutcome) tells a new store from the old one.
// The store-emptied tests' policy: open 3 s, hosts closing within 3 s of the fleet's success.
const char* const kJitteredCloseOrders =
    "min_calls = 20\nfailure_rate_threshold = 10\nwindow = \"60s\"\nopen_for = \"3s\"\n"
    "open_for_max = \"3s\"\nopen_jitter = \"3s\"\nhalf_open_probes = 1\nclose_after = 1\n"
    "fleet = true\nfleet_min_hosts = 2\n";

class FleetStoreEmptiedTest : public FleetChaosTest,
                              public ::testing::WithParamInterface<const char*> {};

TEST_P(FleetStoreEmptiedTest, NoHostTripsAgainAfterTheRecovery) {
  SKIP_WITHOUT_REDIS();
  Redis redis(FreePort());
  constexpr int kHosts = 4;
  StartFailingHosts(redis, kHosts, kJitteredCloseOrders);
  auto opened = [&](int i) { return shm::ReadCounter(Orders(i), shm::kOpened); };
  // A failed round: the outcome count is 1 or more, and every host reopened on it.
  ASSERT_TRUE(WaitUntil(
      [&] {
        if (Outcome(redis, "result") != "failure") return false;
        return All([&](int i) { return opened(i) >= 2 && State(i) == shm::BreakerState::kOpen; });
      },
      30'000))
      << hosts_[0].daemon->Log();
  // Every host follows the open period begun in that round.
  ASSERT_TRUE(WaitUntil([&] { return All([&](int i) { return ReportedOpenedAt(redis, i) >= 1; }); },
                        10'000));
  ds_->failing = 0;
  if (std::string(GetParam()) == "Flushed") {
    redis.Command({"FLUSHALL"});
  } else {
    redis.Kill();
    redis.Start();
  }
  std::vector<uint64_t> own_probes;
  for (int i = 0; i < kHosts; ++i) own_probes.push_back(ds_->own_probes[i].load());
  ASSERT_TRUE(WaitJoined());
  // From the first close on (the new store's first success), no host that probed only for the
  // fleet opens again.
  ASSERT_TRUE(WaitUntil(
      [&] {
        for (int i = 0; i < kHosts; ++i) {
          if (State(i) == shm::BreakerState::kClosed) return true;
        }
        return false;
      },
      30'000))
      << hosts_[0].daemon->Log();
  std::vector<uint64_t> before;
  for (int i = 0; i < kHosts; ++i) before.push_back(opened(i));
  ASSERT_TRUE(WaitAllClosed(30'000)) << hosts_[0].daemon->Log();
  std::this_thread::sleep_for(std::chrono::milliseconds(5 * kSyncMs));  // nothing may happen
  for (int i = 0; i < kHosts; ++i) {
    if (ds_->own_probes[i].load() != own_probes[size_t(i)]) continue;  // probed alone: excused
    EXPECT_EQ(opened(i), before[size_t(i)])
        << "host " << i << " opened again after the recovery; its log:\n"
        << hosts_[size_t(i)].daemon->Log();
  }
}

INSTANTIATE_TEST_SUITE_P(Stores, FleetStoreEmptiedTest, ::testing::Values("Restarted", "Flushed"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param);
                         });

// 7. The store emptied (flushed, or restarted without its data) just as the fleet's success is
// published, while hosts wait for their jittered close: the store has lost the success, but the
// waiting hosts have heard it. Their reports must not count as failing (they did, the emptied
// store's success count reading 0), or the hosts that closed trip again.
class FleetStoreEmptiedAsHostsCloseTest : public FleetChaosTest,
                                          public ::testing::WithParamInterface<const char*> {};

TEST_P(FleetStoreEmptiedAsHostsCloseTest, NoClosedHostTripsAgain) {
  SKIP_WITHOUT_REDIS();
  Redis redis(FreePort());
  constexpr int kHosts = 4;
  StartFailingHosts(redis, kHosts, kJitteredCloseOrders);
  auto opened = [&](int i) { return shm::ReadCounter(Orders(i), shm::kOpened); };
  std::vector<uint64_t> own_probes;
  for (int i = 0; i < kHosts; ++i) own_probes.push_back(ds_->own_probes[i].load());
  ds_->failing = 0;
  // Daemons kept off a CPU past their hold let their workers probe alone (the new calls
  // succeed), and a host that closed so needs no fleet success.
  auto closed_alone = [&](int i) {
    return ds_->own_probes[i].load() != own_probes[size_t(i)] &&
           State(i) == shm::BreakerState::kClosed;
  };
  if (!WaitUntil([&] { return Outcome(redis, "result") == "success" || All(closed_alone); },
                 30'000)) {
    std::string logs;
    for (int i = 0; i < kHosts; ++i) logs += hosts_[size_t(i)].daemon->Log() + "\n";
    FAIL() << "no fleet success, and not every host closed on its own probe; their logs:\n"
           << logs;
  }
  if (Outcome(redis, "result") != "success") {
    GTEST_SKIP() << "every host's daemon was kept off a CPU past its hold, and each closed on "
                    "its own probe: no fleet success to lose";
  }
  std::vector<uint64_t> before;
  for (int i = 0; i < kHosts; ++i) before.push_back(opened(i));
  if (std::string(GetParam()) == "Flushed") {
    redis.Command({"FLUSHALL"});
  } else {
    redis.Kill();
    redis.Start();
  }
  int waiting = 0;
  for (int i = 0; i < kHosts; ++i) waiting += State(i) == shm::BreakerState::kOpen;
  if (waiting < 2) GTEST_SKIP() << "fewer than 2 hosts were still waiting for their close";
  ASSERT_TRUE(WaitAllClosed(30'000)) << hosts_[0].daemon->Log();
  std::this_thread::sleep_for(std::chrono::milliseconds(5 * kSyncMs));  // nothing may happen
  for (int i = 0; i < kHosts; ++i) {
    if (ds_->own_probes[i].load() != own_probes[size_t(i)]) continue;  // probed alone: excused
    EXPECT_EQ(opened(i), before[size_t(i)])
        << "host " << i << " opened again after the recovery; its log:\n"
        << hosts_[size_t(i)].daemon->Log();
  }
}

INSTANTIATE_TEST_SUITE_P(Stores, FleetStoreEmptiedAsHostsCloseTest,
                         ::testing::Values("Restarted", "Flushed"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param);
                         });

// 8. One host tripping alone (its own window; fleet_min_hosts is 2) after the fleet's success is
// no new open period of the fleet: a host away from the store meanwhile, rejoining, still
// closes on that success (it took the lone host's report for the fleet's, dropped its round,
// never closed, and its report of the outage then tripped the closed hosts again).
TEST_F(FleetChaosTest, AHostTrippingAloneKeepsNoRejoiningHostFromClosingWithTheFleet) {
  SKIP_WITHOUT_REDIS();
  Redis redis(FreePort());
  TcpProxy proxy(redis.port());
  const std::string common =
      "min_calls = 20\nfailure_rate_threshold = 10\nwindow = \"60s\"\nopen_jitter = \"0s\"\n"
      "half_open_probes = 1\nclose_after = 1\nfleet = true\nfleet_min_hosts = 2\n";
  const std::string timeout = "timeout = \"" + std::to_string(kTimeoutMs) + "ms\"\n";
  StartHosts(1, "redis = \"" + proxy.address() + "\"\n" + timeout,
             common + "open_for = \"3s\"\nopen_for_max = \"3s\"\n");
  StartHosts(2, "redis = \"" + redis.address() + "\"\n" + timeout,
             common + "open_for = \"3s\"\nopen_for_max = \"3s\"\n");
  // The lone tripper stays open a minute: its own open period outlasts the test.
  StartHosts(1, "redis = \"" + redis.address() + "\"\n" + timeout,
             common + "open_for = \"60s\"\nopen_for_max = \"60s\"\n");
  ASSERT_TRUE(WaitJoined());
  ds_->failing = 1;
  for (int i = 0; i < 4; ++i) StartWorker(i, {20, false});
  ASSERT_TRUE(WaitAllOpen(20'000)) << hosts_[0].daemon->Log();
  KillWorkers(0);  // host 0 calls no more: held, it cannot probe on its own
  ASSERT_TRUE(WaitUntil(
      [&] { return Role(0) == shm::FleetRole::kHolding && State(0) == shm::BreakerState::kOpen; },
      10'000));
  auto seq = [&](int i) { return shm::BreakerWord::Decode(Orders(i).breaker.load()).seq; };
  auto opened = [&](int i) { return shm::ReadCounter(Orders(i), shm::kOpened); };
  proxy.Cut();
  ASSERT_TRUE(WaitUntil([&] { return FleetStateOf(0) == shm::FleetState::kLocal; }, 10'000));
  const uint16_t seq0 = seq(0);
  ds_->failing = 0;
  ASSERT_TRUE(WaitUntil(
      [&] {
        return State(1) == shm::BreakerState::kClosed && State(2) == shm::BreakerState::kClosed &&
               State(3) == shm::BreakerState::kClosed;
      },
      30'000))
      << hosts_[1].daemon->Log();
  ASSERT_EQ(Outcome(redis, "result"), "success");
  const std::string success_n = Outcome(redis, "n");
  ds_->failing_at[3] = 1;  // host 3 alone fails: not the fleet
  ASSERT_TRUE(WaitUntil([&] { return State(3) != shm::BreakerState::kClosed; }, 20'000))
      << hosts_[3].daemon->Log();
  ASSERT_TRUE(WaitUntil([&] { return ReportedOpenedAt(redis, 3) >= std::stoll(success_n); },
                        10'000));  // its report is in
  ASSERT_EQ(State(1), shm::BreakerState::kClosed);
  ASSERT_EQ(State(2), shm::BreakerState::kClosed);
  ASSERT_EQ(State(0), shm::BreakerState::kOpen);
  ASSERT_EQ(seq(0), seq0) << "host 0's breaker moved while it was away";
  const uint64_t opened1 = opened(1), opened2 = opened(2);
  proxy.Relay();
  ASSERT_TRUE(WaitUntil([&] { return FleetStateOf(0) == shm::FleetState::kJoined; }, 40'000));
  if (Outcome(redis, "result") != "success" || Outcome(redis, "n") != success_n) {
    GTEST_SKIP() << "an outcome came before host 0 rejoined";
  }
  EXPECT_TRUE(WaitUntil([&] { return State(0) == shm::BreakerState::kClosed; }, 8 * kSyncMs))
      << "host 0 did not close on the fleet's success\n"
      << hosts_[0].daemon->Log();
  std::this_thread::sleep_for(std::chrono::milliseconds(3 * kSyncMs));  // nothing may happen
  EXPECT_EQ(opened(1), opened1) << "closed host 1 tripped again\n" << hosts_[1].daemon->Log();
  EXPECT_EQ(opened(2), opened2) << "closed host 2 tripped again\n" << hosts_[2].daemon->Log();
}

// 9. The store emptied while the downstream still fails: the open hosts' periods began before
// it, and their reports, which may be of an outage whose end the store lost, do not trip a
// closed host alone; beside its own failure they do. A closed host joining then opens with the
// fleet after its first failed call, where without the store loss it opens before any (it
// stayed closed, calling the failing downstream, until the next probe round, when such reports
// were left out altogether).
class FleetStoreEmptiedWhileFailingTest : public FleetChaosTest,
                                          public ::testing::WithParamInterface<const char*> {};

TEST_P(FleetStoreEmptiedWhileFailingTest, AClosedHostJoiningLaterOpensWithTheFleet) {
  SKIP_WITHOUT_REDIS();
  Redis redis(FreePort());
  const std::string store = "redis = \"" + redis.address() + "\"\n";
  const std::string orders =
      "min_calls = 20\nfailure_rate_threshold = 10\nwindow = \"60s\"\nopen_for = \"60s\"\n"
      "open_for_max = \"60s\"\nopen_jitter = \"0s\"\nhalf_open_probes = 1\nclose_after = 1\n"
      "fleet = true\nfleet_min_hosts = 2\n";
  StartFailingHosts(redis, 2, orders);  // and failing for the whole test
  if (std::string(GetParam()) == "Flushed") {
    redis.Command({"FLUSHALL"});
  } else {
    redis.Kill();
    redis.Start();
  }
  ASSERT_TRUE(WaitJoined());
  // Both report their periods as begun before this store.
  ASSERT_TRUE(WaitUntil(
      [&] { return ReportedOpenedAt(redis, 0) == -2 && ReportedOpenedAt(redis, 1) == -2; },
      10'000));
  StartHosts(1, store, orders);  // host 2, closed, calling once a second
  ASSERT_TRUE(WaitJoined());
  StartWorker(2, {0, false, 1000});
  EXPECT_TRUE(WaitUntil([&] { return State(2) != shm::BreakerState::kClosed; }, 10'000))
      << "host 2 did not open with the fleet while the downstream fails ("
      << ds_->calls_from[2].load() << " calls)\n"
      << hosts_[2].daemon->Log();
}

INSTANTIATE_TEST_SUITE_P(Stores, FleetStoreEmptiedWhileFailingTest,
                         ::testing::Values("Restarted", "Flushed"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param);
                         });

}  // namespace
}  // namespace retryd::daemon
