// Attaching through the daemon's socket, with the real `retryd` and real worker processes
// (attach_worker): the kernel carries the segment (a sealed memfd), the identity (SO_PEERCRED)
// and the liveness (the connection) of every worker. Tests that need root (namespaces, other
// users, another process's descriptors) skip without it.
#include <fcntl.h>
#include <signal.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <new>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "shm/admission.h"
#include "shm/attach.h"
#include "shm/breaker.h"
#include "shm/clock.h"
#include "shm/leases.h"
#include "shm/registry.h"
#include "daemon/attach_server.h"
#include "tests/daemon/daemon_harness.h"
#include "tests/reachable_copy.h"

namespace retryd::daemon {
namespace {

using testing::DaemonProcess;
using Worker = testing::ChildProcess;
using testing::NotifySocket;
using testing::WaitUntil;
using testing::WriteFile;



std::vector<std::string> Words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> w;
  for (std::string s; in >> s;) w.push_back(s);
  return w;
}

char ProcState(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');
  return paren == std::string::npos || paren + 2 >= stat.size() ? '?' : stat[paren + 2];
}

class AttachTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/retryd-attach-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    chmod(dir_.c_str(), 0755);
    socket_ = dir_ + "/retryd.sock";
    config_ = dir_ + "/retryd.toml";
  }
  void TearDown() override {
    daemon_.reset();
    std::filesystem::remove_all(dir_);
  }

  // StartDaemon starts retryd on socket_ with `daemon_keys` added to [daemon] and `extra`
  // sections after "orders" (a bulkhead of 4 whose leases last an hour).
  void StartDaemon(const std::string& extra = "", const std::string& daemon_keys = "",
                   const std::vector<std::string>& env = {}) {
    WriteFile(config_, "[daemon]\nsocket = \"" + socket_ +
                           "\"\nmode = \"0666\"\ntick = \"10ms\"\nmax_dependencies = 16\n"
                           "max_processes = 64\n" +
                           daemon_keys +
                           "[dependency.orders]\nbulkhead_limit = 4\n"
                           "bulkhead_timeout = \"1h\"\n" +
                           extra);
    daemon_ = std::make_unique<DaemonProcess>(std::vector<std::string>{"--config=" + config_},
                                              notify_.path(), env);
    ASSERT_NE(notify_.WaitFor("READY=1", 10'000), "") << daemon_->Log();
  }

  // Observer attaches read-only, as retryctl does: no process slot, nothing to reclaim.
  shm::Attachment Observer() {
    shm::Attachment a;
    const Status s = shm::AttachThroughSocket(socket_, shm::Access::kReadOnly, 5'000, &a);
    EXPECT_TRUE(s.ok()) << s.ToString() << "\n" << daemon_->Log();
    return a;
  }

  std::vector<std::string> WorkerArgs(const std::string& mode, const std::string& dep = "orders") {
    return {RETRYD_ATTACH_WORKER, socket_, mode, dep};
  }

  static uint32_t LeasesOf(const shm::Segment& seg, uint16_t owner) {
    uint32_t n = 0;
    const shm::DependencySlot& d = *seg.dependency(uint32_t(seg.Find("orders")));
    for (const auto& w : d.bulkhead_leases) {
      n += w.load() != 0 && shm::Lease::Owner(w.load()) == owner;
    }
    return n;
  }
  static shm::ProcessOwner OwnerOf(const shm::Segment& seg, uint16_t owner) {
    return shm::ProcessOwner::Decode(seg.process(owner - 1u)->owner.load());
  }
  // Ticks waits until the daemon has ticked `n` more times (its heartbeat moved on).
  bool Ticks(const shm::Segment& seg, int n) {
    for (int i = 0; i < n; ++i) {
      const uint64_t beat = seg.header().heartbeat_ns.load();
      if (!WaitUntil([&] { return seg.header().heartbeat_ns.load() != beat; }, 10'000)) {
        return false;
      }
    }
    return true;
  }

  // Restart starts retryd again as systemd restarts a unit: with what its fd store holds now
  // (the stand-in drops what hung up meanwhile), and waits until it is ready.
  void Restart() {
    daemon_ = std::make_unique<DaemonProcess>(std::vector<std::string>{"--config=" + config_},
                                              notify_.path(), std::vector<std::string>{},
                                              notify_.Store());
    ASSERT_NE(notify_.WaitFor("READY=1", 10'000), "") << daemon_->Log();
  }
  size_t StoredNamed(const std::string& prefix) {
    size_t n = 0;
    for (const auto& e : notify_.Store()) n += e.name.rfind(prefix, 0) == 0;
    return n;
  }
  // AttachAsWorker attaches this test process read-write, as a worker.
  shm::Attachment AttachAsWorker() {
    shm::Attachment a;
    const Status s = shm::AttachThroughSocket(socket_, shm::Access::kReadWrite, 5'000, &a);
    EXPECT_TRUE(s.ok()) << s.ToString() << "\n" << daemon_->Log();
    return a;
  }
  // Hold takes a lease of "orders" as owner `a.owner`.
  static bool Hold(shm::Attachment& a) {
    shm::DependencySlot& d = *a.segment->dependency(uint32_t(a.segment->Find("orders")));
    shm::Permit p;
    shm::Caller caller{a.owner, 0, 1};
    return shm::IsAdmitted(
        shm::Admit(d, uint32_t(a.segment->Find("orders")), 0, shm::CoarseNowNs(), caller, &p));
  }

  std::string dir_, socket_, config_;
  NotifySocket notify_;
  std::unique_ptr<DaemonProcess> daemon_;
};

// A worker attaches with one connection and holds a lease; SIGKILL closes the connection and
// the daemon frees the lease and the slot at once, without reading /proc.
TEST_F(AttachTest, AWorkersHangUpFreesItsLeasesAndSlotAtOnce) {
  StartDaemon();
  shm::Attachment obs = Observer();
  ASSERT_NE(obs.segment, nullptr);
  Worker w(WorkerArgs("hold"));
  const std::vector<std::string> held = Words(w.Line());
  ASSERT_EQ(held.size(), 3u) << daemon_->Log();
  const uint16_t owner = uint16_t(std::stoi(held[1]));
  EXPECT_EQ(LeasesOf(*obs.segment, owner), 1u);
  EXPECT_TRUE(OwnerOf(*obs.segment, owner).connected());
  EXPECT_EQ(OwnerOf(*obs.segment, owner).pid, w.pid());
  w.Kill();
  EXPECT_TRUE(WaitUntil([&] { return LeasesOf(*obs.segment, owner) == 0; }, 5'000));
  EXPECT_TRUE(
      WaitUntil([&] { return obs.segment->process(owner - 1u)->owner.load() == 0; }, 5'000));
  const shm::DependencySlot& d = *obs.segment->dependency(uint32_t(obs.segment->Find("orders")));
  EXPECT_EQ(d.counters[shm::kLeasesReclaimedDead].load(), 1u);
}

// A worker whose main thread ended (pthread_exit) while another thread runs is a zombie in
// /proc/PID/stat (ProcessAliveByProc looks further, and asks the kernel). Its connection is
// open: it keeps its lease for as long as it lives, and loses it when it is killed.
TEST_F(AttachTest, AWorkerWhoseMainThreadExitedKeepsItsLeases) {
  StartDaemon();
  shm::Attachment obs = Observer();
  ASSERT_NE(obs.segment, nullptr);
  Worker w(WorkerArgs("zombie"));
  const std::vector<std::string> held = Words(w.Line());
  ASSERT_EQ(held.size(), 3u) << daemon_->Log();
  const uint16_t owner = uint16_t(std::stoi(held[1]));
  ASSERT_TRUE(WaitUntil([&] { return ProcState(w.pid()) == 'Z'; }, 5'000));
  EXPECT_TRUE(shm::ProcessAliveByProc(w.pid(), 0)) << "a thread of it runs: the kernel says so";
  ASSERT_TRUE(Ticks(*obs.segment, 50));  // the reaper and the sweep have run many times
  EXPECT_EQ(LeasesOf(*obs.segment, owner), 1u);
  EXPECT_TRUE(OwnerOf(*obs.segment, owner).connected());
  w.Kill();
  EXPECT_TRUE(WaitUntil([&] { return LeasesOf(*obs.segment, owner) == 0; }, 5'000));
}

// The truncation attack: no holder of the segment's descriptor can change its size, neither a
// worker with the descriptor it was sent nor root through the daemon's /proc/PID/fd.
TEST_F(AttachTest, NoHolderCanResizeTheSegment) {
  StartDaemon();
  shm::Attachment a;
  ASSERT_TRUE(shm::AttachThroughSocket(socket_, shm::Access::kReadWrite, 5'000, &a).ok());
  const off_t size = off_t(a.segment->size());
  EXPECT_NE(ftruncate(a.segment->fd(), 0), 0);
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(ftruncate(a.segment->fd(), size * 2), 0);
  EXPECT_EQ(errno, EPERM);
  if (geteuid() == 0) {
    // Root opens the daemon's own descriptor of the segment anew, read-write.
    int tried = 0;
    const std::string fds = "/proc/" + std::to_string(daemon_->pid()) + "/fd";
    for (const auto& e : std::filesystem::directory_iterator(fds)) {
      std::error_code ec;
      const std::string target = std::filesystem::read_symlink(e.path(), ec).string();
      if (target.rfind("/memfd:retryd:", 0) != 0) continue;
      const int fd = open(e.path().c_str(), O_RDWR);
      ASSERT_GE(fd, 0) << std::strerror(errno);
      EXPECT_NE(ftruncate(fd, 0), 0);
      EXPECT_EQ(errno, EPERM);
      EXPECT_NE(ftruncate(fd, size * 2), 0);
      EXPECT_EQ(errno, EPERM);
      close(fd);
      ++tried;
    }
    EXPECT_GE(tried, 1) << "no memfd among the daemon's descriptors";
  }
  // The whole mapping still reads, and the daemon still ticks.
  EXPECT_EQ(reinterpret_cast<volatile char*>(&a.segment->header())[size - 1], 0);
  EXPECT_TRUE(Ticks(*a.segment, 3));
  EXPECT_EQ(kill(daemon_->pid(), 0), 0);
  close(a.connection);
}

// A hostile writer scribbles random bytes over the whole segment while a worker admits and
// completes flat out: nobody crashes (the worker, the daemon), whatever the words say.
TEST_F(AttachTest, AHostileWriterScribblingTheWholeSegmentCrashesNobody) {
  StartDaemon();
  const char* env = std::getenv("RETRYD_FAULT_SECONDS");
  const double seconds = env ? std::atof(env) : 4;
  // Both attach before either starts: a header already scribbled would refuse the attach.
  auto* attached = static_cast<std::atomic<int>*>(
      mmap(nullptr, sizeof(std::atomic<int>), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
           -1, 0));
  new (attached) std::atomic<int>(0);
  auto child = [&](bool scribble) {
    const pid_t pid = fork();
    if (pid != 0) return pid;
    shm::Attachment a;
    if (!shm::AttachThroughSocket(socket_, shm::Access::kReadWrite, 5'000, &a).ok()) _exit(3);
    const int32_t index = a.segment->Find("orders");
    if (index < 0) _exit(4);
    attached->fetch_add(1);
    for (int waited = 0; attached->load() < 2; ++waited) {
      if (waited == 100'000) _exit(5);  // the other never attached: its status says why
      usleep(100);
    }
    const uint64_t end = shm::PreciseNowNs() + uint64_t(seconds * 1e9);
    std::mt19937_64 rng{uint64_t(getpid())};
    auto* words = reinterpret_cast<std::atomic<uint64_t>*>(&a.segment->header());
    const size_t n = a.segment->size() / sizeof(uint64_t);
    shm::DependencySlot& slot = *a.segment->dependency(uint32_t(index));
    shm::Caller caller{a.owner, 0, 7};
    while (shm::PreciseNowNs() < end) {
      if (scribble) {
        for (int k = 0; k < 4096; ++k) words[rng() % n].store(rng(), std::memory_order_relaxed);
      } else {
        shm::Permit p;
        shm::Admit(slot, uint32_t(index), uint32_t(rng() % 3), shm::CoarseNowNs(), caller, &p);
        shm::Complete(slot, &p, shm::Outcome(rng() % 3), rng() % 1'000'000'000,
                      shm::CoarseNowNs(), caller);
      }
    }
    _exit(0);
  };
  const pid_t worker = child(false);
  const pid_t scribbler = child(true);
  for (const pid_t pid : {worker, scribbler}) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << (pid == worker ? "worker" : "scribbler") << " status " << status;
  }
  EXPECT_EQ(kill(daemon_->pid(), 0), 0) << daemon_->Log();
  EXPECT_EQ(daemon_->Wait(200), -1) << "the daemon exited:\n" << daemon_->Log();
}

// A worker in its own pid namespace has a pid the daemon's namespace does not know (it is 1
// there); the kernel translates its credentials, and its connection is its liveness.
TEST_F(AttachTest, AWorkerInItsOwnPidNamespaceIsJudgedByItsConnection) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root for unshare --pid";
  StartDaemon();
  shm::Attachment obs = Observer();
  ASSERT_NE(obs.segment, nullptr);
  std::vector<std::string> args = {"unshare", "--pid", "--fork", "--kill-child", "--mount-proc"};
  for (const std::string& a : WorkerArgs("hold")) args.push_back(a);
  Worker w(args);
  const std::vector<std::string> held = Words(w.Line());
  ASSERT_EQ(held.size(), 3u) << daemon_->Log();
  EXPECT_EQ(held[2], "1") << "the worker is pid 1 in its namespace";
  const uint16_t owner = uint16_t(std::stoi(held[1]));
  const shm::ProcessOwner o = OwnerOf(*obs.segment, owner);
  EXPECT_TRUE(o.connected());
  EXPECT_NE(o.pid, 1) << "the registry holds the pid as the daemon sees it";
  EXPECT_EQ(obs.segment->process(owner - 1u)->own_pid.load(), 1u);
  ASSERT_TRUE(Ticks(*obs.segment, 20));
  EXPECT_EQ(LeasesOf(*obs.segment, owner), 1u);
  kill(o.pid, SIGKILL);  // the worker itself, by the pid the daemon sees
  EXPECT_TRUE(WaitUntil([&] { return LeasesOf(*obs.segment, owner) == 0; }, 5'000));
}

// Workers isolated as pods are (their own pid, IPC and mount namespaces, a private /dev/shm)
// reach the daemon through the socket path alone and share one breaker: when it half-opens,
// exactly half_open_probes probes go out among all of them.
TEST_F(AttachTest, WorkersInSeparateNamespacesShareOneBreakerAndItsProbes) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root for unshare -pimf and mount";
  StartDaemon("[dependency.shared]\nhalf_open_probes = 2\nprobe_timeout = \"1h\"\n");
  shm::Attachment rw;
  ASSERT_TRUE(shm::AttachThroughSocket(socket_, shm::Access::kReadWrite, 5'000, &rw).ok());
  shm::DependencySlot& shared = *rw.segment->dependency(uint32_t(rw.segment->Find("shared")));
  // Open until 300 ms from now; every worker admits from before then until well after.
  shared.breaker.store(shm::BreakerWord{shm::BreakerState::kOpen, 0, 0, 9,
                                        shm::NsToMs32(shm::PreciseNowNs()) + 300}
                           .Encode());
  const std::string pod = "mount -t tmpfs tmpfs /dev/shm && exec \"$0\" \"$@\"";
  std::vector<std::unique_ptr<Worker>> workers;
  for (int i = 0; i < 3; ++i) {
    std::vector<std::string> args = {"unshare", "-pimf", "--kill-child", "--mount-proc",
                                     "sh", "-c", pod, RETRYD_ATTACH_WORKER, socket_,
                                     "probe", "shared", "1500"};
    workers.push_back(std::make_unique<Worker>(args));
  }
  int probes = 0;
  for (auto& w : workers) {
    const std::vector<std::string> line = Words(w->Line());
    ASSERT_EQ(line.size(), 4u) << daemon_->Log();
    EXPECT_EQ(line[3], "1") << "each worker is pid 1 of its own namespace";
    probes += std::stoi(line[1]);
  }
  EXPECT_EQ(probes, 2);
  EXPECT_EQ(shared.counters[shm::kProbesGranted].load(), 2u);
  // And none of them could see the host's /dev/shm.
  Worker look({"unshare", "-pimf", "--kill-child", "--mount-proc", "sh", "-c", pod,
               RETRYD_ATTACH_WORKER, socket_, "shm-name"});
  EXPECT_EQ(look.Line(), "") << "a private /dev/shm is empty";
  close(rw.connection);
}

// With /proc hiding other users' processes (hidepid=2, as ProtectProc=invisible does) a daemon
// that judged workers by /proc would find every one of them dead. Here the daemon runs as
// nobody under such a /proc, and the worker (root) is invisible to it: it keeps its lease for
// as long as it lives, and loses it when it dies.
TEST_F(AttachTest, UnderAHidingProcTheDaemonJudgesWorkersByTheirConnection) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to mount /proc and run retryd as nobody";
  chmod(dir_.c_str(), 0777);  // nobody creates the socket and its lock here
  WriteFile(config_, "[daemon]\nsocket = \"" + socket_ +
                         "\"\nmode = \"0666\"\ntick = \"10ms\"\nmax_processes = 16\n"
                         "[dependency.orders]\nbulkhead_limit = 4\nbulkhead_timeout = \"1h\"\n");
  const std::string log = dir_ + "/retryd.log";
  // The daemon dies with the test's Worker: --kill-child sets its parent-death signal, and
  // setpriv's change of user clears it, so setpriv sets it again (--pdeathsig).
  Worker daemon({"unshare", "--mount", "--propagation", "private", "--kill-child", "sh", "-c",
                 "mount -t proc -o hidepid=2 proc /proc && exec setpriv --reuid=65534 "
                 "--regid=65534 --clear-groups --pdeathsig SIGKILL \"$0\" \"$@\" 2>\"" +
                     log + "\"",
                 ::retryd::testing::ReachableCopy(RETRYD_BINARY), "--config=" + config_});
  shm::Attachment obs;
  ASSERT_TRUE(WaitUntil(
      [&] {
        return shm::AttachThroughSocket(socket_, shm::Access::kReadOnly, 1'000, &obs).ok();
      },
      10'000))
      << testing::ReadFile(log);
  Worker w(WorkerArgs("hold"));
  const std::vector<std::string> held = Words(w.Line());
  ASSERT_EQ(held.size(), 3u) << testing::ReadFile(log);
  const uint16_t owner = uint16_t(std::stoi(held[1]));
  EXPECT_EQ(obs.segment->process(owner - 1u)->start_time.load(), 0u)
      << "the daemon could read the worker's /proc entry: the test hides nothing";
  ASSERT_TRUE(Ticks(*obs.segment, 50)) << testing::ReadFile(log);
  EXPECT_EQ(LeasesOf(*obs.segment, owner), 1u) << testing::ReadFile(log);
  EXPECT_TRUE(OwnerOf(*obs.segment, owner).connected());
  w.Kill();
  EXPECT_TRUE(WaitUntil([&] { return LeasesOf(*obs.segment, owner) == 0; }, 5'000));
  close(obs.connection);
  // Nothing outlives the test: the daemon, run as nobody two execs below the Worker, goes too.
  const pid_t retryd = pid_t(obs.segment->header().daemon_pid.load());
  ASSERT_GT(retryd, 0);
  daemon.Kill();
  // Gone, or dead and not yet reaped (by whatever reaps orphans here).
  EXPECT_TRUE(WaitUntil([&] { return ProcState(retryd) == '?' || ProcState(retryd) == 'Z'; },
                        10'000))
      << "retryd pid " << retryd << " still runs";
}

// A peer the allow rules do not admit is refused with one line naming the setting.
// By name, the daemon judges workers by /proc; where /proc hides them it refuses to start,
// naming the setting that works there, instead of reclaiming every live worker's leases.
TEST_F(AttachTest, ByNameUnderAHidingProcTheDaemonRefusesToStart) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to mount /proc and run retryd as nobody";
  WriteFile(config_, "[daemon]\nsegment = \"" + testing::UniqueName() + "\"\n");
  const std::string log = dir_ + "/retryd.log";
  Worker daemon({"unshare", "--mount", "--propagation", "private", "--kill-child", "sh", "-c",
                 "mount -t proc -o hidepid=2 proc /proc && setpriv --reuid=65534 "
                 "--regid=65534 --clear-groups --pdeathsig SIGKILL \"$0\" \"$@\" 2>\"" +
                     log + "\"; echo exit $?",
                 ::retryd::testing::ReachableCopy(RETRYD_BINARY), "--config=" + config_});
  EXPECT_EQ(daemon.Line(), "exit 1") << testing::ReadFile(log);
  const std::string err = testing::ReadFile(log);
  EXPECT_NE(err.find(config_ + ": [daemon] socket is \"\", so workers are judged alive by /proc"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("ProtectProc=invisible"), std::string::npos) << err;
}

// AttachAsNobody attaches to `socket` read-write from a child running as uid and gid 65534,
// and returns how that ended; *refused says whether it was a refusal (PermissionDenied).
std::string AttachAsNobody(const std::string& socket, bool* refused) {
  int fds[2];
  if (pipe(fds) != 0) return "pipe failed";
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(9);
    shm::Attachment a;
    const Status s = shm::AttachThroughSocket(socket, shm::Access::kReadWrite, 5'000, &a);
    const std::string msg = s.ToString();
    (void)!write(fds[1], msg.data(), msg.size());
    _exit(s.code() == Status::Code::kPermissionDenied ? 0 : 1);
  }
  close(fds[1]);
  char buf[512] = {};
  (void)!read(fds[0], buf, sizeof(buf) - 1);
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  *refused = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  return buf;
}

TEST_F(AttachTest, APeerNotAllowedIsRefusedNamingTheSetting) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a peer as nobody";
  StartDaemon("", "allow_users = [\"root\"]\n");
  bool refused = false;
  const std::string why = AttachAsNobody(socket_, &refused);
  EXPECT_TRUE(refused) << why;
  EXPECT_NE(why.find("allow_users"), std::string::npos) << why;
  EXPECT_NE(why.find("uid 65534"), std::string::npos) << why;
  // Root is admitted.
  shm::Attachment a;
  EXPECT_TRUE(shm::AttachThroughSocket(socket_, shm::Access::kReadWrite, 5'000, &a).ok());
  close(a.connection);
}

// A refusal names the peer from the host's own files, never through NSS: with the lookups of
// nobody hanging (as with an LDAP or sssd server that does not answer), the refusal still comes
// within the peer's 5 s, naming it, and the daemon answers the next peer. Through NSS, neither
// the refused peer nor root after it had an answer within 5 s.
TEST_F(AttachTest, ARefusalNeverWaitsForTheHostsDirectoryService) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a peer as nobody";
  StartDaemon("", "allow_users = [\"root\"]\n", {testing::PreloadWith(RETRYD_NSS_HANG_HOOK)});
  bool refused = false;
  const std::string why = AttachAsNobody(socket_, &refused);
  EXPECT_TRUE(refused) << why << "\n" << daemon_->Log();
  if (testing::ReadFile("/etc/passwd").find("\nnobody:x:65534:") != std::string::npos) {
    EXPECT_NE(why.find("user nobody (uid 65534"), std::string::npos) << why;
  }
  shm::Attachment a;
  EXPECT_TRUE(shm::AttachThroughSocket(socket_, shm::Access::kReadWrite, 5'000, &a).ok());
  close(a.connection);
}

// Every peer tells a running daemon by the daemon lock on the segment, as by name: each holds
// its own open file description, so a peer's probe never touches the daemon's lock, and the
// lock goes when the daemon dies, whatever the segment's words say.
TEST_F(AttachTest, EveryPeerTellsARunningDaemonByItsLock) {
  StartDaemon();
  shm::Attachment obs = Observer();
  shm::Attachment rw;
  ASSERT_TRUE(shm::AttachThroughSocket(socket_, shm::Access::kReadWrite, 5'000, &rw).ok());
  EXPECT_EQ(rw.segment->ProbeDaemonLock(), shm::DaemonLock::kHeld);
  EXPECT_EQ(obs.segment->ProbeDaemonLock(), shm::DaemonLock::kHeld);
  EXPECT_EQ(rw.segment->ProbeDaemonLock(), shm::DaemonLock::kHeld) << "the probes changed it";
  daemon_->Signal(SIGKILL);
  EXPECT_EQ(daemon_->Wait(10'000), 128 + SIGKILL);
  EXPECT_TRUE(WaitUntil(
      [&] { return obs.segment->ProbeDaemonLock() == shm::DaemonLock::kFree; }, 5'000));
  close(obs.connection);
  close(rw.connection);
}

// Peers that connect and never say hello cannot take the daemon's descriptors: past
// kMaxWaitingForHello of them, the oldest silent for a second are closed for more, and a
// worker still attaches.
TEST_F(AttachTest, SilentConnectionsDoNotStopAWorkerAttaching) {
  StartDaemon();
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, socket_.data(), socket_.size());
  std::vector<int> silent;
  for (size_t i = 0; i < 4 * AttachServer::kMaxWaitingForHello; ++i) {
    const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd, 0);
    if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0) {
      silent.push_back(fd);
    } else {
      close(fd);
    }
  }
  Worker w(WorkerArgs("hold"));
  EXPECT_EQ(Words(w.Line()).size(), 3u) << daemon_->Log();
  for (const int fd : silent) close(fd);
}

// CpuTicks: the user + system time `pid` has used, in clock ticks.
uint64_t CpuTicks(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream rest(stat.substr(stat.rfind(')') + 2));
  std::vector<std::string> f;
  for (std::string w; rest >> w;) f.push_back(w);
  return f.size() > 12 ? std::stoull(f[11]) + std::stoull(f[12]) : 0;
}

// Read-only peers that keep their connections open cannot take the daemon's descriptors: it
// lets each go with its welcome.
TEST_F(AttachTest, ReadOnlyPeersDoNotHoldTheDaemonsDescriptors) {
  StartDaemon();
  std::vector<shm::Attachment> peers;
  for (int i = 0; i < 400; ++i) peers.push_back(Observer());  // past max_processes + 256
  for (shm::Attachment& a : peers) {
    ASSERT_GE(a.connection, 0);
    pollfd p{a.connection, POLLIN, 0};
    EXPECT_EQ(poll(&p, 1, 10'000), 1) << "the daemon let the read-only peer go";
    char c;
    EXPECT_EQ(recv(a.connection, &c, 1, MSG_DONTWAIT), 0);
    close(a.connection);
  }
  Worker w(WorkerArgs("hold"));
  EXPECT_EQ(Words(w.Line()).size(), 3u) << daemon_->Log();
}

// A daemon out of descriptors (its limit lowered under it) neither spins on its listening
// socket, which stays readable, nor refuses: it stops accepting, the worker queued meanwhile
// waits in the backlog, and is answered as soon as an attached worker leaves.
TEST_F(AttachTest, ADaemonOutOfDescriptorsNeitherSpinsNorRefuses) {
  StartDaemon();
  const rlimit low{48, 48};
  ASSERT_EQ(prlimit(daemon_->pid(), RLIMIT_NOFILE, &low, nullptr), 0);
  // Read-write peers until the daemon has no descriptor left to answer one.
  std::vector<shm::Attachment> held;
  for (int i = 0; i < 64; ++i) {
    shm::Attachment a;
    bool no_answer = false;
    const Status s =
        shm::AttachThroughSocket(socket_, shm::Access::kReadWrite, 500, &a, {}, &no_answer);
    if (!s.ok()) {
      EXPECT_TRUE(no_answer) << "out of descriptors, the daemon leaves a worker waiting: "
                             << s.ToString();
      break;
    }
    held.push_back(std::move(a));
  }
  ASSERT_LT(held.size(), 48u) << "the daemon never ran out of descriptors";
  // One more worker waits; the daemon, with nothing to do, stays idle.
  int waiting = -1;
  {
    const Status s = shm::StartAttach(socket_, shm::Access::kReadWrite, {}, &waiting);
    ASSERT_TRUE(s.ok()) << s.ToString() << "\n" << daemon_->Log();
  }
  const uint64_t cpu = CpuTicks(daemon_->pid());
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const uint64_t used = CpuTicks(daemon_->pid()) - cpu;
  EXPECT_LT(used, uint64_t(sysconf(_SC_CLK_TCK)) / 5) << "the daemon spun: " << used << " ticks in 1 s";
  // Two attached workers leave: the waiting one gets in.
  for (int i = 0; i < 2; ++i) {
    close(held.back().connection);
    held.pop_back();
  }
  shm::Attachment got;
  bool answered = false;
  const Status s =
      shm::PollAttach(waiting, socket_, shm::Access::kReadWrite, 30'000, &got, &answered);
  EXPECT_TRUE(answered) << daemon_->Log();
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_NE(got.owner, 0);
  if (got.connection >= 0) close(got.connection);
  for (shm::Attachment& a : held) close(a.connection);
  // Room again: attaching is as usual.
  Worker w(WorkerArgs("hold"));
  EXPECT_EQ(Words(w.Line()).size(), 3u) << daemon_->Log();
}

// A second daemon on the same socket is refused by the kernel's lock, naming the socket.
TEST_F(AttachTest, ASecondDaemonOnTheSameSocketIsRefused) {
  StartDaemon();
  const testing::RunResult r = testing::RunToCompletion({"--config=" + config_});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("served by a running retryd"), std::string::npos) << r.err;
  shm::Attachment a;
  EXPECT_TRUE(shm::AttachThroughSocket(socket_, shm::Access::kReadOnly, 5'000, &a).ok())
      << "the first daemon still serves";
  close(a.connection);
}

// Under a service manager the daemon keeps the sealed segment and every worker's connection in
// the manager's fd store. Killed with SIGKILL and started again with what the store holds, it
// adopts the same memory (an open breaker stays open, with its deadline), keeps the owner and
// the lease of a worker that lived through it, and frees those of a worker that died while no
// daemon ran (whose connection the manager dropped when it hung up).
TEST_F(AttachTest, AKilledDaemonRestartedFromItsFdStoreKeepsTheMemoryAndTheLiveWorkers) {
  StartDaemon(
      "[dependency.payments]\nmin_calls = 1\nopen_for = \"1h\"\nopen_for_max = \"1h\"\n"
      "open_jitter = \"0s\"\n");
  shm::Attachment obs = Observer();
  ASSERT_NE(obs.segment, nullptr);
  Worker lives(WorkerArgs("hold"));
  Worker dies(WorkerArgs("hold"));
  const std::vector<std::string> a = Words(lives.Line()), b = Words(dies.Line());
  ASSERT_EQ(a.size(), 3u) << daemon_->Log();
  ASSERT_EQ(b.size(), 3u) << daemon_->Log();
  const uint16_t alive = uint16_t(std::stoi(a[1])), dead = uint16_t(std::stoi(b[1]));

  // Trip "payments" as a worker of our own.
  shm::Attachment me = AttachAsWorker();
  ASSERT_NE(me.segment, nullptr);
  const uint32_t index = uint32_t(me.segment->Find("payments"));
  shm::DependencySlot& payments = *me.segment->dependency(index);
  for (int i = 0; i < 100 && shm::BreakerWord::Decode(payments.breaker.load()).state !=
                                 shm::BreakerState::kOpen;
       ++i) {
    shm::Permit p;
    shm::Caller caller{me.owner, 0, 1};
    if (shm::IsAdmitted(shm::Admit(payments, index, 0, shm::CoarseNowNs(), caller, &p))) {
      shm::Complete(payments, &p, shm::Outcome::kFailure, 0, shm::CoarseNowNs(), caller);
    }
  }
  const uint64_t breaker = payments.breaker.load(), breaker_time = payments.breaker_time.load();
  ASSERT_EQ(shm::BreakerWord::Decode(breaker).state, shm::BreakerState::kOpen);
  // The segment and the three read-write connections are in the store (not the observer's).
  EXPECT_EQ(StoredNamed("segment"), 1u);
  EXPECT_EQ(StoredNamed("conn-"), 3u);

  daemon_->Signal(SIGKILL);
  ASSERT_EQ(daemon_->Wait(10'000), 128 + SIGKILL);
  dies.Kill();
  EXPECT_TRUE(WaitUntil([&] { return StoredNamed("conn-") == 2; }, 5'000))
      << "the stand-in drops the dead worker's connection, as systemd does";
  EXPECT_EQ(LeasesOf(*obs.segment, dead), 1u) << "no daemon ran to free it yet";

  Restart();
  EXPECT_TRUE(WaitUntil(
      [&] { return obs.segment->header().daemon_pid.load() == uint32_t(daemon_->pid()); }, 10'000))
      << "the new daemon runs on the same memory\n"
      << daemon_->Log();
  EXPECT_EQ(payments.breaker.load(), breaker) << "still open";
  EXPECT_EQ(payments.breaker_time.load(), breaker_time) << "with the same deadline";
  EXPECT_EQ(LeasesOf(*obs.segment, alive), 1u);
  EXPECT_TRUE(OwnerOf(*obs.segment, alive).connected());
  EXPECT_EQ(OwnerOf(*obs.segment, alive).pid, lives.pid());
  EXPECT_EQ(LeasesOf(*obs.segment, dead), 0u);
  EXPECT_EQ(obs.segment->process(dead - 1u)->owner.load(), 0u);
  EXPECT_NE(daemon_->Log().find("1 freed that ended while no daemon ran"), std::string::npos)
      << daemon_->Log();
  EXPECT_TRUE(Hold(me)) << "the test's own owner still admits";

  // The adopted connection is watched like any other: a hang-up frees at once.
  lives.Kill();
  EXPECT_TRUE(WaitUntil([&] { return LeasesOf(*obs.segment, alive) == 0; }, 5'000));
  EXPECT_TRUE(WaitUntil([&] { return StoredNamed("conn-") == 1; }, 5'000));
}

// A connection that hangs up while the fd store still holds its descriptor (the manager has not
// read FDSTOREREMOVE yet) is gone for the daemon: the next connection it accepts, under the same
// descriptor number, keeps its owner and its lease. The test holds a descriptor of the first
// connection, as a slow manager would; before, the hang-up went on being reported under the
// reused number and the new worker was freed as if it had hung up.
TEST_F(AttachTest, AHangUpTheStoreStillHoldsIsNotTakenForTheNextConnection) {
  StartDaemon();
  shm::Attachment obs = Observer();
  ASSERT_NE(obs.segment, nullptr);
  Worker first(WorkerArgs("hold"));
  const std::vector<std::string> line = Words(first.Line());
  ASSERT_EQ(line.size(), 3u) << daemon_->Log();
  const uint16_t first_owner = uint16_t(std::stoi(line[1]));
  ASSERT_TRUE(WaitUntil([&] { return StoredNamed("conn-") == 1; }, 5'000));
  int held = -1;
  for (const auto& e : notify_.Store()) {
    if (e.name.rfind("conn-", 0) == 0) held = fcntl(e.fd, F_DUPFD_CLOEXEC, 0);
  }
  ASSERT_GE(held, 0);
  first.Kill();
  ASSERT_TRUE(WaitUntil([&] { return LeasesOf(*obs.segment, first_owner) == 0; }, 5'000));

  shm::Attachment me = AttachAsWorker();
  ASSERT_NE(me.segment, nullptr) << daemon_->Log();
  ASSERT_TRUE(Hold(me));
  ASSERT_TRUE(Ticks(*obs.segment, 5));
  EXPECT_EQ(LeasesOf(*obs.segment, me.owner), 1u) << daemon_->Log();
  EXPECT_EQ(obs.segment->process(me.owner - 1u)->owner.load(), me.owner_word);
  char probe;
  EXPECT_EQ(recv(me.connection, &probe, 1, MSG_DONTWAIT | MSG_PEEK), -1)
      << "the daemon closed the new worker's connection";
  EXPECT_EQ(errno, EAGAIN);
  close(held);
  close(me.connection);
  EXPECT_TRUE(WaitUntil([&] { return LeasesOf(*obs.segment, me.owner) == 0; }, 5'000));
}

// A clean stop retires the sealed segment; the next daemon adopts it from the store and takes
// it back into service. A process that attaches again while holding its connection names the
// owner it holds and keeps it, with its leases; another process naming that owner gets its own.
TEST_F(AttachTest, AProcessAttachingAgainKeepsItsOwnerAndAnotherCannotTakeIt) {
  StartDaemon();
  shm::Attachment me = AttachAsWorker();
  ASSERT_NE(me.segment, nullptr);
  ASSERT_TRUE(Hold(me));
  daemon_->Signal(SIGTERM);
  ASSERT_EQ(daemon_->Wait(10'000), 0) << daemon_->Log();
  EXPECT_EQ(me.segment->header().retired.load(), 1u);
  Restart();
  EXPECT_TRUE(WaitUntil([&] { return me.segment->header().retired.load() == 0; }, 10'000))
      << daemon_->Log();

  const shm::AttachResume resume{me.owner, me.owner_word};
  pid_t child = fork();
  if (child == 0) {
    shm::Attachment other;
    const Status s =
        shm::AttachThroughSocket(socket_, shm::Access::kReadWrite, 5'000, &other, resume);
    _exit(!s.ok() ? 3 : other.owner == resume.owner ? 1 : 0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "a forked child took its parent's owner";

  shm::Attachment again;
  const Status s =
      shm::AttachThroughSocket(socket_, shm::Access::kReadWrite, 5'000, &again, resume);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(again.owner, me.owner);
  EXPECT_EQ(again.owner_word, me.owner_word);
  close(me.connection);  // no longer counts: the daemon closed its end when it moved the owner
  ASSERT_TRUE(Ticks(*again.segment, 3));
  EXPECT_EQ(LeasesOf(*again.segment, me.owner), 1u);
  EXPECT_EQ(again.segment->process(me.owner - 1u)->owner.load(), me.owner_word);
  close(again.connection);
  EXPECT_TRUE(WaitUntil([&] { return LeasesOf(*again.segment, me.owner) == 0; }, 5'000));
}

}  // namespace
}  // namespace retryd::daemon
