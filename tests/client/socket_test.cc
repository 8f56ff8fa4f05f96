// The client library attached through the daemon's socket, with the real `retryd` and real
// worker processes: admits on the daemon's segment, a forked child's own attach, a refusal that
// is never silent, and a worker that starts before its daemon. Tests that need root (another
// user) skip without it. Every wait is for a condition; the bounds only end a hung test.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "retryd/client.h"
#include "retryd/retryd.h"
#include "shm/attach.h"
#include "shm/clock.h"
#include "shm/counters.h"
#include "shm/leases.h"
#include "shm/registry.h"
#include "shm/stripes.h"
#include "tests/daemon/daemon_harness.h"

namespace retryd {
namespace {

using daemon::testing::DaemonProcess;
using daemon::testing::NotifySocket;
using daemon::testing::WriteFile;
using std::chrono::milliseconds;

// Long enough for a loaded machine; a condition that holds ends the wait at once.
constexpr int kWaitMs = 60'000;

bool WaitUntil(const std::function<bool()>& cond, int timeout_ms = kWaitMs) {
  const uint64_t deadline = shm::PreciseNowNs() + uint64_t(timeout_ms) * 1'000'000;
  while (!cond()) {
    if (shm::PreciseNowNs() >= deadline) return false;
    std::this_thread::sleep_for(milliseconds(2));
  }
  return true;
}

void WriteLine(int fd, const std::string& line) {
  const std::string text = line + "\n";
  (void)!write(fd, text.data(), text.size());
}

// Child forks a process that runs `body(report_fd)` and _exits with its result. The child
// writes lines to report_fd; it and every process it forks see end-of-file on `hold_fd` (which
// they may block on) once the test lets go of them or dies.
class Child {
 public:
  explicit Child(const std::function<int(int report_fd, int hold_fd)>& body) {
    int report[2], hold[2];
    if (pipe2(report, O_CLOEXEC) != 0 || pipe2(hold, O_CLOEXEC) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      close(report[0]);
      close(hold[1]);
      _exit(body(report[1], hold[0]));
    }
    close(report[1]);
    close(hold[0]);
    report_ = fdopen(report[0], "r");
    hold_ = hold[1];
  }
  ~Child() {
    Release();
    Kill();
    if (report_) fclose(report_);
  }
  // Line reads the next line any of the child's processes reports ("" when all have ended).
  std::string Line() {
    char buf[512];
    if (!report_ || !fgets(buf, sizeof(buf), report_)) return "";
    std::string s(buf);
    if (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
  }
  // Release lets processes blocked on hold_fd go on.
  void Release() {
    if (hold_ >= 0) close(hold_);
    hold_ = -1;
  }
  // Wait reaps the child: its exit code, or 128 + signal.
  int Wait() {
    if (pid_ <= 0) return -1;
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    Wait();
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  FILE* report_ = nullptr;
  int hold_ = -1;
};

// BlockUntilReleased waits for end-of-file on `hold_fd`.
void BlockUntilReleased(int hold_fd) {
  char c;
  while (read(hold_fd, &c, 1) > 0 || errno == EINTR) {
  }
}

std::vector<std::string> Words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> w;
  for (std::string s; in >> s;) w.push_back(s);
  return w;
}

class ClientSocketTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/retryd-client-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    chmod(dir_.c_str(), 0755);  // a peer run as another user reaches the socket
    socket_ = dir_ + "/retryd.sock";
    config_ = dir_ + "/retryd.toml";
    SetLogCallback([this](int, std::string_view line) { log_.emplace_back(line); });
  }
  void TearDown() override {
    SetLogCallback(nullptr);
    daemon_.reset();
    std::filesystem::remove_all(dir_);
  }

  // StartDaemon starts retryd serving its segment on socket_, with `daemon_keys` added to
  // [daemon] and "orders": a bulkhead of 4 whose leases last an hour (never expire here).
  // With `from_store`, it starts as systemd restarts a unit: with what its fd store holds.
  void StartDaemon(const std::string& daemon_keys = "", bool from_store = false) {
    WriteFile(config_, "[daemon]\nsocket = \"" + socket_ +
                           "\"\nmode = \"0666\"\ntick = \"10ms\"\nmax_dependencies = 16\n"
                           "max_processes = 64\n" + daemon_keys +
                           "[dependency.orders]\nbulkhead_limit = 4\n"
                           "bulkhead_timeout = \"1h\"\n");
    daemon_ = std::make_unique<DaemonProcess>(
        std::vector<std::string>{"--config=" + config_}, notify_.path(), std::vector<std::string>{},
        from_store ? notify_.Store() : std::vector<daemon::testing::StoredFd>{});
    ASSERT_NE(notify_.WaitFor("READY=1", kWaitMs), "") << daemon_->Log();
  }

  // Observer attaches read-only, as retryctl does: no process slot.
  void Observe() {
    const Status s = shm::AttachThroughSocket(socket_, shm::Access::kReadOnly, kWaitMs, &obs_);
    ASSERT_TRUE(s.ok()) << s.ToString() << "\n" << (daemon_ ? daemon_->Log() : "");
    close(obs_.connection);  // a read-only mapping needs no connection
    obs_.connection = -1;
  }
  const shm::Segment& seg() const { return *obs_.segment; }

  ClientOptions Options(bool fallback) const {
    ClientOptions o;
    o.socket = socket_;
    o.fallback_to_local = fallback;
    return o;
  }

  const shm::DependencySlot& Orders() const {
    return *seg().dependency(uint32_t(seg().Find("orders")));
  }
  // OwnerOf: the owner id of the connected slot of `pid` (as the daemon sees it), or 0.
  uint16_t OwnerOf(pid_t pid) const {
    for (uint32_t i = 0; i < seg().process_high_water(); ++i) {
      const shm::ProcessOwner o = shm::ProcessOwner::Decode(seg().process(i)->owner.load());
      if (o.connected() && o.pid == pid) return uint16_t(i + 1);
    }
    return 0;
  }
  uint32_t LeasesOf(uint16_t owner) const {
    uint32_t n = 0;
    for (const auto& w : Orders().bulkhead_leases) {
      const uint64_t word = w.load();
      n += word != 0 && shm::Lease::Owner(word) == owner;
    }
    return n;
  }
  // CallsUntilAttached makes calls through `c` until one holds its lease in the observed
  // segment as the owner the daemon gave this process: the client has read the daemon's answer
  // (it looks for the daemon on its calls, about once a second, and for an answer every few
  // milliseconds, never waiting for it).
  bool CallsUntilAttached(Client& c, Dependency dep) const {
    return WaitUntil([&] {
      Permit q;
      c.Admit(dep, 0, &q);
      const uint16_t owner = OwnerOf(getpid());
      const bool attached = owner != 0 && LeasesOf(owner) == 1;
      c.Complete(&q, Outcome::kSuccess, milliseconds(1));
      return attached;
    });
  }
  uint64_t Successes() const { return shm::ReadCounter(Orders(), shm::kSuccesses); }

  std::string dir_, socket_, config_;
  NotifySocket notify_;
  std::unique_ptr<DaemonProcess> daemon_;
  shm::Attachment obs_;
  std::vector<std::string> log_;
};

// A worker opened with a socket admits and completes on the daemon's segment, under the owner
// id the daemon gave it; its slot is a connected one, freed when the client closes.
TEST_F(ClientSocketTest, AWorkerAdmitsOnTheDaemonsSegmentAsAConnectedOwner) {
  StartDaemon();
  Observe();
  std::unique_ptr<Client> c;
  ASSERT_TRUE(Client::Open(Options(false), &c).ok()) << daemon_->Log();
  EXPECT_FALSE(c->local());
  EXPECT_EQ(c->segment_name(), socket_);
  const uint16_t owner = OwnerOf(getpid());
  ASSERT_NE(owner, 0) << "no connected slot for this process";
  EXPECT_EQ(seg().process(owner - 1u)->own_pid.load(), uint64_t(getpid()));

  Dependency orders;
  ASSERT_TRUE(c->Resolve("orders", &orders).ok());
  const uint64_t before = Successes();
  for (int i = 0; i < 5; ++i) {
    Permit p;
    ASSERT_TRUE(c->Admit(orders, 0, &p));
    c->Complete(&p, Outcome::kSuccess, milliseconds(1));
  }
  EXPECT_EQ(Successes() - before, 5u);

  Permit held;
  ASSERT_TRUE(c->Admit(orders, 0, &held));
  EXPECT_EQ(LeasesOf(owner), 1u) << "the lease carries the daemon's owner id";
  c->Complete(&held, Outcome::kSuccess, milliseconds(1));
  EXPECT_EQ(LeasesOf(owner), 0u);

  c.reset();  // closes the connection: the daemon frees the slot
  EXPECT_TRUE(WaitUntil([&] { return seg().process(owner - 1u)->owner.load() == 0; }));
}

// The C ABI attaches through the socket named by $RETRYD_SOCKET, or passed to
// retryd_open_socket.
TEST_F(ClientSocketTest, TheCApiAttachesThroughTheSocket) {
  StartDaemon();
  Observe();
  setenv("RETRYD_SOCKET", socket_.c_str(), 1);
  retryd_options_t opt = {nullptr, 0};
  retryd_client_t* c = nullptr;
  const int rc = retryd_open(&opt, &c);
  unsetenv("RETRYD_SOCKET");
  ASSERT_EQ(rc, RETRYD_OK) << retryd_last_error();
  EXPECT_EQ(retryd_is_local(c), 0);
  EXPECT_NE(OwnerOf(getpid()), 0);
  retryd_dependency_t dep = -1;
  ASSERT_EQ(retryd_resolve(c, "orders", &dep), RETRYD_OK);
  const uint64_t before = Successes();
  retryd_permit_t permit;
  EXPECT_EQ(retryd_admit(c, dep, 0, &permit), RETRYD_ADMITTED);
  retryd_complete(c, &permit, RETRYD_SUCCESS, 1000);
  EXPECT_EQ(Successes() - before, 1u);
  retryd_close(c);
  EXPECT_TRUE(WaitUntil([&] { return OwnerOf(getpid()) == 0; }));

  ASSERT_EQ(retryd_open_socket(socket_.c_str(), &opt, &c), RETRYD_OK) << retryd_last_error();
  EXPECT_EQ(retryd_is_local(c), 0);
  EXPECT_NE(OwnerOf(getpid()), 0);
  retryd_close(c);
}

// A forked child closes its copy of its parent's connection and attaches with its own, started
// on its first call and answered without the child waiting: its lease carries its own owner id, and its parent's SIGKILL frees the
// parent's lease and slot while the child, alive, keeps its own.
TEST_F(ClientSocketTest, AForkedChildAttachesOnItsOwnAndOutlivesItsParentsLeases) {
  StartDaemon();
  Observe();
  // The worker's child is reparented to this process when the worker dies, to be reaped here.
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  Child worker([&](int report, int hold) {
    static int report_fd = report;
    SetLogCallback([](int, std::string_view line) { WriteLine(report_fd, "log " + std::string(line)); });
    std::unique_ptr<Client> c;
    if (Status s = Client::Open(Options(false), &c); !s.ok()) {
      WriteLine(report, "error " + s.ToString());
      return 1;
    }
    Dependency orders;
    if (!c->Resolve("orders", &orders).ok()) return 2;
    Permit parents;
    if (!c->Admit(orders, 0, &parents)) return 3;
    const pid_t child = fork();
    if (child == 0) {
      // The child's own attach starts on its first call and is never waited for: it calls
      // until the daemon's answer has come, then takes a lease as itself.
      if (!CallsUntilAttached(*c, orders)) return 4;
      Permit own;
      WriteLine(report, std::string("child ") + std::to_string(getpid()) + " " +
                            (c->Admit(orders, 0, &own) ? "admitted" : "rejected"));
      BlockUntilReleased(hold);
      c->Complete(&own, Outcome::kSuccess, milliseconds(1));
      return 0;
    }
    WriteLine(report, "parent " + std::to_string(getpid()) + " " + std::to_string(child));
    BlockUntilReleased(hold);
    return 0;
  });
  pid_t parent = 0, child = 0;
  std::vector<std::string> logs;
  for (bool seen_child = false; parent == 0 || !seen_child;) {
    const std::string line = worker.Line();
    ASSERT_NE(line, "") << "the worker ended early\n" << daemon_->Log();
    const std::vector<std::string> w = Words(line);
    ASSERT_FALSE(w.empty());
    if (w[0] == "log") {
      logs.push_back(line);
    } else if (w[0] == "parent") {
      parent = pid_t(std::stoi(w[1]));
      child = pid_t(std::stoi(w[2]));
    } else if (w[0] == "child") {
      EXPECT_EQ(w[2], "admitted") << line;
      seen_child = true;
    } else {
      FAIL() << line;
    }
  }
  ASSERT_EQ(parent, worker.pid());
  const uint16_t parent_owner = OwnerOf(parent);
  const uint16_t child_owner = OwnerOf(child);
  ASSERT_NE(parent_owner, 0);
  ASSERT_NE(child_owner, 0) << "the child attached with its own connection";
  EXPECT_NE(parent_owner, child_owner);
  EXPECT_EQ(LeasesOf(parent_owner), 1u);
  EXPECT_EQ(LeasesOf(child_owner), 1u) << "the child took its lease as itself";
  for (const std::string& l : logs) {
    EXPECT_EQ(l.find("new segment"), std::string::npos)
        << "the child keeps the mapping it inherited: " << l;
  }

  worker.Kill();  // SIGKILL; its child lives on
  EXPECT_TRUE(WaitUntil([&] { return LeasesOf(parent_owner) == 0; }))
      << "the parent's connection closed with it: no copy stayed open in the child";
  EXPECT_TRUE(WaitUntil([&] { return seg().process(parent_owner - 1u)->owner.load() == 0; }));
  EXPECT_EQ(kill(child, 0), 0) << "the child still runs";
  EXPECT_EQ(OwnerOf(child), child_owner);
  EXPECT_EQ(LeasesOf(child_owner), 1u);

  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_TRUE(WaitUntil([&] { return LeasesOf(child_owner) == 0; }));
  EXPECT_TRUE(WaitUntil([&] { return OwnerOf(child) == 0; }));
  prctl(PR_SET_CHILD_SUBREAPER, 0);
}

// A peer the daemon's allow rules refuse gets kPermissionDenied naming the setting, with
// fallback_to_local set too: a refused worker never runs quietly on per-process limits.
TEST_F(ClientSocketTest, ARefusedPeerIsAnErrorEvenWithFallbackToLocal) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a peer as nobody";
  StartDaemon("allow_users = [\"root\"]\n");
  Child nobody([&](int report, int) {
    if (setgid(65534) != 0 || setuid(65534) != 0) return 9;
    std::unique_ptr<Client> c;
    const Status s = Client::Open(Options(true), &c);
    WriteLine(report, std::to_string(int(s.code())) + " " + (c ? "client" : "null") + " " +
                          s.message());
    retryd_options_t opt = {nullptr, 1};
    retryd_client_t* raw = nullptr;
    const int rc = retryd_open_socket(socket_.c_str(), &opt, &raw);
    WriteLine(report, std::to_string(rc) + " " + (raw ? "client" : "null") + " " +
                          retryd_last_error());
    return 0;
  });
  const std::string cpp = nobody.Line();
  const std::string c_abi = nobody.Line();
  EXPECT_EQ(nobody.Wait(), 0);
  const std::vector<std::string> w = Words(cpp);
  ASSERT_GE(w.size(), 2u) << cpp;
  EXPECT_EQ(w[0], std::to_string(int(Status::Code::kPermissionDenied))) << cpp;
  EXPECT_EQ(w[1], "null") << cpp;
  EXPECT_NE(cpp.find("allow_users"), std::string::npos) << cpp;
  const std::vector<std::string> v = Words(c_abi);
  ASSERT_GE(v.size(), 2u) << c_abi;
  EXPECT_EQ(v[0], std::to_string(RETRYD_EPERM)) << c_abi;
  EXPECT_EQ(v[1], "null") << c_abi;
  EXPECT_NE(c_abi.find("allow_users"), std::string::npos) << c_abi;
}

// With no daemon at the socket and fallback_to_local, the worker runs on per-process limits
// (said once), and attaches when the daemon starts: its slot appears in the daemon's registry
// and its calls count in the daemon's segment.
TEST_F(ClientSocketTest, AWorkerStartedBeforeItsDaemonAttachesWhenItStarts) {
  std::unique_ptr<Client> c;
  ASSERT_TRUE(Client::Open(Options(true), &c).ok());
  EXPECT_TRUE(c->local());
  Dependency orders;
  ASSERT_TRUE(c->Resolve("orders", &orders).ok());
  Permit p;
  ASSERT_TRUE(c->Admit(orders, 0, &p));
  c->Complete(&p, Outcome::kSuccess, milliseconds(1));

  StartDaemon();
  Observe();
  // Calls go on as usual; the client looks for the daemon on them, about once a second.
  EXPECT_TRUE(CallsUntilAttached(*c, orders)) << daemon_->Log();
  EXPECT_FALSE(c->local());
  const uint64_t before = Successes();
  Permit r;
  ASSERT_TRUE(c->Admit(orders, 0, &r));
  EXPECT_EQ(LeasesOf(OwnerOf(getpid())), 1u);
  c->Complete(&r, Outcome::kSuccess, milliseconds(1));
  EXPECT_EQ(Successes() - before, 1u);
  int per_process = 0;
  for (const std::string& l : log_) per_process += l.find("per-process") != std::string::npos;
  EXPECT_EQ(per_process, 1) << "said once, however many attempts found no daemon";
}

// A daemon that stops cleanly retires its sealed segment. Without a service manager to keep it
// (the store flushed, as on a full stop), the next daemon starts a new one: a worker moves to it
// on its paced check, and admits there under a new owner id.
TEST_F(ClientSocketTest, AWorkerMovesToTheNextDaemonAfterACleanStop) {
  StartDaemon();
  std::unique_ptr<Client> c;
  ASSERT_TRUE(Client::Open(Options(true), &c).ok());
  Dependency orders;
  ASSERT_TRUE(c->Resolve("orders", &orders).ok());
  daemon_->Signal(SIGTERM);
  ASSERT_EQ(daemon_->Wait(kWaitMs), 0) << daemon_->Log();
  notify_.Flush();
  StartDaemon();
  Observe();
  EXPECT_TRUE(CallsUntilAttached(*c, orders)) << daemon_->Log();
  const uint64_t before = Successes();
  Permit r;
  ASSERT_TRUE(c->Admit(orders, 0, &r));
  c->Complete(&r, Outcome::kSuccess, milliseconds(1));
  EXPECT_EQ(Successes() - before, 1u) << "the call counted in the new daemon's segment";
}

// A worker in the middle of a long call when the daemon restarts (a clean stop, then a start
// with what the service manager's fd store kept) keeps its owner and its lease: the new daemon
// adopts the segment and the worker's connection, and takes the segment back into service. The
// worker, which saw it retired while no daemon ran, stays on it.
TEST_F(ClientSocketTest, AWorkerMidCallKeepsItsOwnerAndLeaseAcrossARestart) {
  StartDaemon();
  Observe();
  std::unique_ptr<Client> c;
  ASSERT_TRUE(Client::Open(Options(true), &c).ok());
  Dependency orders;
  ASSERT_TRUE(c->Resolve("orders", &orders).ok());
  Permit call;
  ASSERT_TRUE(c->Admit(orders, 0, &call));  // the long call
  const uint16_t owner = OwnerOf(getpid());
  ASSERT_NE(owner, 0);
  ASSERT_EQ(LeasesOf(owner), 1u);

  daemon_->Signal(SIGTERM);
  ASSERT_EQ(daemon_->Wait(kWaitMs), 0) << daemon_->Log();
  ASSERT_EQ(seg().header().retired.load(), 1u);
  // Calls while no daemon runs: the worker looks for one, finds none, and stays.
  const uint64_t look_from = shm::CoarseNowNs();
  ASSERT_TRUE(WaitUntil([&] {
    Permit q;
    if (c->Admit(orders, 0, &q)) c->Complete(&q, Outcome::kSuccess, milliseconds(1));
    return shm::CoarseNowNs() - look_from > 2'500'000'000ull;  // past two paced looks
  }));

  StartDaemon("", /*from_store=*/true);
  EXPECT_EQ(seg().header().retired.load(), 0u) << "the same segment, back in service";
  ASSERT_TRUE(
      WaitUntil([&] { return seg().header().daemon_pid.load() == uint32_t(daemon_->pid()); }));
  EXPECT_EQ(OwnerOf(getpid()), owner);
  EXPECT_EQ(LeasesOf(owner), 1u) << "the call in flight still holds its lease";
  const uint64_t successes = Successes();
  c->Complete(&call, Outcome::kSuccess, milliseconds(1));
  EXPECT_EQ(Successes() - successes, 1u);
  EXPECT_EQ(LeasesOf(owner), 0u);
  EXPECT_EQ(Orders().counters[shm::kLeasesReclaimedDead].load(), 0u);
}

}  // namespace
}  // namespace retryd
