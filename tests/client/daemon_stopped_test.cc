// A daemon that is stopped (SIGSTOP), hung or killed is never on a worker's request path
// (DESIGN.md, invariant 7), through the socket and by name, from the C++ API and the C ABI:
// construction returns at once on per-process limits, a forked child admits without waiting
// for its own attach, and once the daemon resumes every worker moves to the host's segment and
// shares its limits. Real processes (fork, SIGSTOP/SIGCONT, SIGKILL) against the real
// `retryd`. The time bounds are generous (the waits they replace took 1 s each); every other
// wait is for a condition, bounded only to end a hung test.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
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
#include "shm/dependency_table.h"
#include "shm/registry.h"
#include "shm/stripes.h"
#include "tests/daemon/daemon_harness.h"
#include "tests/sanitized.h"
#include "tests/shm/test_util.h"

namespace retryd {
namespace {

using daemon::testing::DaemonProcess;
using daemon::testing::NotifySocket;
using daemon::testing::UniqueName;
using daemon::testing::WaitUntil;
using daemon::testing::WriteFile;
using std::chrono::milliseconds;

constexpr int kWaitMs = 60'000;
// What "does not wait for the daemon" means here: far below the 1 s each such call took. Under
// a sanitizer, on a loaded 2-core machine, an Open (attach, map, register) has taken 257 ms,
// with no wait for the daemon in it: there, half of that second.
constexpr uint64_t kNoWaitNs = retryd::kSanitizedBuild ? 500'000'000 : 200'000'000;

enum class Mode { kSocket, kByName };

std::string ModeName(const ::testing::TestParamInfo<Mode>& p) {
  return p.param == Mode::kSocket ? "Socket" : "ByName";
}

// AwaitGo blocks until the test says go (Worker::Go).
int g_go_fd = -1;
void AwaitGo() {
  char c;
  while (read(g_go_fd, &c, 1) < 0 && errno == EINTR) {
  }
}

// Worker runs `body(report_fd)` in a forked process and reads the lines it reports.
class Worker {
 public:
  explicit Worker(const std::function<int(int report_fd)>& body) {
    int report[2], go[2];
    if (pipe2(report, O_CLOEXEC) != 0 || pipe2(go, O_CLOEXEC) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      close(report[0]);
      close(go[1]);
      g_go_fd = go[0];
      _exit(body(report[1]));
    }
    close(report[1]);
    close(go[0]);
    go_ = go[1];
    report_ = fdopen(report[0], "r");
  }
  // Go lets the worker past its next AwaitGo.
  void Go() { (void)!write(go_, "g", 1); }
  ~Worker() {
    if (go_ >= 0) close(go_);
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (report_) fclose(report_);
  }
  std::string Line() {
    char buf[512];
    if (!report_ || !fgets(buf, sizeof(buf), report_)) return "";
    std::string s(buf);
    if (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
  }
  int Wait() {
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int go_ = -1;
  FILE* report_ = nullptr;
};

void Report(int fd, const std::string& line) {
  const std::string text = line + "\n";
  (void)!write(fd, text.data(), text.size());
}

std::vector<std::string> Words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> w;
  for (std::string s; in >> s;) w.push_back(s);
  return w;
}

// A start for Elapsed: the time, and how long the calling thread had waited for a CPU.
struct Start {
  uint64_t wall_ns;
  uint64_t queued_ns;
};
Start Now() { return {shm::PreciseNowNs(), testing::ThreadRunQueueWaitNs()}; }
// Elapsed: the time since `since`, less what the calling thread waited for a CPU meanwhile. A
// call that waits for the daemon (it sleeps, or spins on a lock) takes that time whatever the
// machine's load; a call preempted on a loaded machine does not.
uint64_t Elapsed(const Start& since) {
  const uint64_t wall = shm::PreciseNowNs() - since.wall_ns;
  const uint64_t queued = testing::ThreadRunQueueWaitNs() - since.queued_ns;
  return wall > queued ? wall - queued : 0;
}

class DaemonStoppedTest : public ::testing::TestWithParam<Mode> {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/retryd-stopped-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    socket_ = dir_ + "/retryd.sock";
    config_ = dir_ + "/retryd.toml";
    segment_ = UniqueName();
    SetLogCallback([](int, std::string_view) {});
  }
  void TearDown() override {
    if (daemon_) daemon_->Signal(SIGCONT);
    daemon_.reset();
    SetLogCallback(nullptr);
    if (GetParam() == Mode::kByName) shm_unlink(("/" + segment_).c_str());
    std::filesystem::remove_all(dir_);
  }
  bool by_socket() const { return GetParam() == Mode::kSocket; }

  // Config writes the daemon's config: `orders` (unless told otherwise) and `extra`.
  void Config(const std::string& extra = "", bool orders = true) {
    WriteFile(config_, "[daemon]\n" +
                           (by_socket() ? "socket = \"" + socket_ + "\"\n"
                                        : "segment = \"" + segment_ + "\"\n") +
                           "mode = \"0666\"\ntick = \"10ms\"\nmax_dependencies = 4096\n"
                           "max_processes = 64\n" +
                           (orders ? "[dependency.orders]\nbulkhead_limit = 4\n"
                                     "bulkhead_timeout = \"1h\"\n"
                                   : "") +
                           extra);
  }

  void StartDaemon() {
    Config();
    daemon_ = std::make_unique<DaemonProcess>(std::vector<std::string>{"--config=" + config_},
                                              notify_.path());
    ASSERT_NE(notify_.WaitFor("READY=1", kWaitMs), "") << daemon_->Log();
    // The observer's mapping outlives the daemon's answers (read-only, no slot).
    if (by_socket()) {
      shm::Attachment a;
      const Status s = shm::AttachThroughSocket(socket_, shm::Access::kReadOnly, kWaitMs, &a);
      ASSERT_TRUE(s.ok()) << s.ToString();
      close(a.connection);
      obs_ = std::move(a.segment);
    } else {
      ASSERT_TRUE(shm::Segment::Attach(segment_, shm::Access::kReadOnly, &obs_).ok());
    }
  }

  ClientOptions Options() const {
    ClientOptions o;
    if (by_socket()) {
      o.socket = socket_;
    } else {
      o.segment = segment_;
    }
    return o;
  }

  // Attached: does `pid` hold a slot of the daemon's segment (connected through the socket,
  // registered by name)?
  bool Attached(pid_t pid) const {
    for (uint32_t i = 0; i < obs_->process_high_water(); ++i) {
      const shm::ProcessOwner o = shm::ProcessOwner::Decode(obs_->process(i)->owner.load());
      if (o.attached() && o.pid == pid) return true;
    }
    return false;
  }
  uint64_t Successes() const {
    return shm::ReadCounter(*obs_->dependency(uint32_t(obs_->Find("orders"))), shm::kSuccesses);
  }

  std::string dir_, socket_, config_, segment_;
  NotifySocket notify_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<shm::Segment> obs_;
};

struct Timings {
  uint64_t open_ns = 0;
  uint64_t slowest_call_ns = 0;
};

// Calls admits and completes `n` times on `admit`, returning the slowest.
uint64_t SlowestOf(int n, const std::function<void()>& call) {
  uint64_t slowest = 0;
  for (int i = 0; i < n; ++i) {
    const Start t = Now();
    call();
    slowest = std::max(slowest, Elapsed(t));
  }
  return slowest;
}

// A worker started while the daemon is stopped: Open returns at once (on per-process limits
// through the socket; by name the segment needs no daemon), and no call waits. Resumed, the
// daemon answers the hello the worker sent, and the worker's next calls move it to the host's
// segment, where they count.
TEST_P(DaemonStoppedTest, AWorkerOpenedWhileTheDaemonIsStoppedNeverWaitsAndAttachesOnResume) {
  StartDaemon();
  daemon_->Signal(SIGSTOP);
  for (const bool c_abi : {false, true}) {
    SCOPED_TRACE(c_abi ? "C ABI" : "C++");
    Worker w([&](int report) {
      Timings t;
      Start start = Now();
      std::unique_ptr<Client> cpp;
      retryd_client_t* c = nullptr;
      retryd_dependency_t dep = -1;
      Dependency orders;
      if (c_abi) {
        retryd_options_t opt = {by_socket() ? nullptr : segment_.c_str(), 1};
        const int rc = by_socket() ? retryd_open_socket(socket_.c_str(), &opt, &c)
                                   : retryd_open(&opt, &c);
        t.open_ns = Elapsed(start);
        if (rc != RETRYD_OK || retryd_resolve(c, "orders", &dep) != RETRYD_OK) {
          Report(report, std::string("error ") + retryd_last_error());
          return 1;
        }
      } else {
        const Status s = Client::Open(Options(), &cpp);
        t.open_ns = Elapsed(start);
        if (!s.ok() || !cpp->Resolve("orders", &orders).ok()) {
          Report(report, "error " + s.ToString());
          return 1;
        }
      }
      auto call = [&] {
        if (c_abi) {
          retryd_permit_t p;
          retryd_admit(c, dep, 0, &p);
          retryd_complete(c, &p, RETRYD_SUCCESS, 1000);
        } else {
          Permit p;
          cpp->Admit(orders, 0, &p);
          cpp->Complete(&p, Outcome::kSuccess, milliseconds(1));
        }
      };
      // 20 calls, spread over 2 s: each would have waited 1 s for the daemon before.
      t.slowest_call_ns = SlowestOf(20, [&] {
        call();
        std::this_thread::sleep_for(milliseconds(100));
      });
      const bool local = c_abi ? retryd_is_local(c) != 0 : cpp->local();
      Report(report, "timings " + std::to_string(t.open_ns) + " " +
                         std::to_string(t.slowest_call_ns) + " " + (local ? "local" : "shared"));
      // The test resumes the daemon now; calls until attached, then 5 that count there.
      uint64_t slowest = 0;
      for (bool attached = false; !attached;) {
        slowest = std::max(slowest, SlowestOf(1, call));
        attached = !(c_abi ? retryd_is_local(c) != 0 : cpp->local()) && Attached(getpid());
        std::this_thread::sleep_for(milliseconds(2));
      }
      Report(report, "attached " + std::to_string(slowest));
      AwaitGo();
      for (int i = 0; i < 5; ++i) call();
      Report(report, "done");
      AwaitGo();
      if (c) retryd_close(c);
      return 0;
    });
    const std::vector<std::string> t = Words(w.Line());
    ASSERT_EQ(t.size(), 4u) << "the worker failed to start while the daemon was stopped";
    ASSERT_EQ(t[0], "timings");
    EXPECT_LT(std::stoull(t[1]), kNoWaitNs) << "Open waited for the stopped daemon";
    EXPECT_LT(std::stoull(t[2]), kNoWaitNs) << "a call waited for the stopped daemon";
    EXPECT_EQ(t[3], by_socket() ? "local" : "shared");

    daemon_->Signal(SIGCONT);
    const Start resumed = Now();
    const std::vector<std::string> a = Words(w.Line());
    ASSERT_EQ(a.size(), 2u) << "the worker never attached\n" << daemon_->Log();
    const uint64_t attach_ns = Elapsed(resumed);
    EXPECT_LT(std::stoull(a[1]), kNoWaitNs);
    EXPECT_TRUE(Attached(w.pid())) << "its slot is in the daemon's segment";
    const uint64_t before = Successes();
    w.Go();
    ASSERT_EQ(w.Line(), "done");
    EXPECT_EQ(Successes() - before, 5u) << "its calls count in the host's segment";
    w.Go();
    EXPECT_EQ(w.Wait(), 0);
    RecordProperty(c_abi ? "c_attach_after_resume_ms" : "cpp_attach_after_resume_ms",
                   std::to_string(attach_ns / 1'000'000));
    daemon_->Signal(SIGSTOP);
  }
}

// A worker attached before the daemon stopped forks: the child admits at once, never waiting
// for its own attach, and attaches as itself once the daemon resumes.
TEST_P(DaemonStoppedTest, AForkedChildOfAnAttachedWorkerNeverWaitsForAStoppedDaemon) {
  StartDaemon();
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  Worker w([&](int report) {
    std::unique_ptr<Client> c;
    Dependency orders;
    if (!Client::Open(Options(), &c).ok() || !c->Resolve("orders", &orders).ok()) return 1;
    if (c->local()) return 2;
    // The test stops the daemon, then says so with SIGUSR1.
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    sigprocmask(SIG_BLOCK, &set, nullptr);
    Report(report, "attached");
    int sig;
    sigwait(&set, &sig);
    const pid_t child = fork();
    if (child == 0) {
      auto call = [&] {
        Permit p;
        c->Admit(orders, 0, &p);
        c->Complete(&p, Outcome::kSuccess, milliseconds(1));
      };
      const uint64_t slowest = SlowestOf(20, [&] {
        call();
        std::this_thread::sleep_for(milliseconds(50));
      });
      Report(report, "child " + std::to_string(getpid()) + " " + std::to_string(slowest));
      uint64_t slowest_after = 0;
      while (!Attached(getpid())) {
        slowest_after = std::max(slowest_after, SlowestOf(1, call));
        std::this_thread::sleep_for(milliseconds(2));
      }
      Report(report, "child-attached " + std::to_string(slowest_after));
      AwaitGo();
      for (int i = 0; i < 5; ++i) call();
      Report(report, "child-done");
      _exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 100;
  });
  ASSERT_EQ(w.Line(), "attached") << daemon_->Log();
  daemon_->Signal(SIGSTOP);
  kill(w.pid(), SIGUSR1);
  const std::vector<std::string> c = Words(w.Line());
  ASSERT_EQ(c.size(), 3u);
  ASSERT_EQ(c[0], "child");
  EXPECT_LT(std::stoull(c[2]), kNoWaitNs) << "the child's admits waited for the stopped daemon";
  const pid_t child = pid_t(std::stoi(c[1]));
  if (by_socket()) {
    EXPECT_FALSE(Attached(child)) << "no daemon ran to attach it";
  }
  daemon_->Signal(SIGCONT);
  const std::vector<std::string> a = Words(w.Line());
  ASSERT_EQ(a.size(), 2u) << daemon_->Log();
  EXPECT_EQ(a[0], "child-attached");
  EXPECT_LT(std::stoull(a[1]), kNoWaitNs);
  EXPECT_TRUE(Attached(child));
  const uint64_t before = Successes();
  w.Go();
  ASSERT_EQ(w.Line(), "child-done");
  EXPECT_EQ(Successes() - before, 5u) << "the child's calls count in the host's segment";
  EXPECT_EQ(w.Wait(), 0);
  prctl(PR_SET_CHILD_SUBREAPER, 0);
}

// Holds: does the create lock word name `pid` as its holder?
bool Holds(const shm::Segment& seg, pid_t pid) {
  const uint64_t lock = seg.header().create_lock.load(std::memory_order_acquire);
  return lock != 0 && pid_t(lock & shm::kCreateLockPidMask) == pid;
}

// Stopped: has `pid` stopped (SIGSTOP delivered, every thread stopped)?
bool Stopped(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');
  return paren != std::string::npos && paren + 2 < text.size() &&
         (text[paren + 2] == 'T' || text[paren + 2] == 't');
}

// A daemon stopped in the middle of a reload, holding the segment's create lock: a worker that
// resolves a new name, or admits on a dependency an earlier reload retired, does not wait for
// it (the lock's holder is alive, so the lock is never taken from it): the name runs on
// per-process limits, and moves to the host's segment once the daemon resumes.
TEST_P(DaemonStoppedTest, ADaemonStoppedInTheMiddleOfAReloadNeverHoldsAWorker) {
  StartDaemon();
  std::unique_ptr<Client> c;
  ASSERT_TRUE(Client::Open(Options(), &c).ok());
  ASSERT_FALSE(c->local());
  Dependency orders;
  ASSERT_TRUE(c->Resolve("orders", &orders).ok());
  // The first reload retires `orders`; the worker has not called it since.
  Config("", /*orders=*/false);
  daemon_->Signal(SIGHUP);
  ASSERT_TRUE(WaitUntil([&] { return obs_->Find("orders") < 0; }, kWaitMs)) << daemon_->Log();
  // Reloads that rewrite 2,000 dependencies, until one is stopped while it holds the lock.
  bool caught = false;
  for (int attempt = 0; attempt < 100 && !caught; ++attempt) {
    std::string deps;
    for (int i = 0; i < 2000; ++i) {
      deps += "[dependency.d" + std::to_string(i) + "]\nmin_calls = " +
              std::to_string(10 + attempt) + "\n";
    }
    Config(deps, /*orders=*/false);
    const uint64_t generation = obs_->header().generation.load();
    daemon_->Signal(SIGHUP);
    const uint64_t give_up = shm::PreciseNowNs() + 10'000'000'000;
    while (!Holds(*obs_, daemon_->pid()) && obs_->header().generation.load() == generation &&
           shm::PreciseNowNs() < give_up) {
    }
    if (Holds(*obs_, daemon_->pid())) {
      daemon_->Signal(SIGSTOP);
      ASSERT_TRUE(WaitUntil([&] { return Stopped(daemon_->pid()); }, kWaitMs));
      caught = Holds(*obs_, daemon_->pid());
      if (caught) break;
      daemon_->Signal(SIGCONT);
    }
    ASSERT_TRUE(WaitUntil([&] { return obs_->header().generation.load() != generation; },
                          kWaitMs))
        << daemon_->Log();
  }
  ASSERT_TRUE(caught) << "no reload was stopped while it held the create lock";
  uint64_t slowest = 0;
  Dependency payments;
  slowest = SlowestOf(1, [&] { ASSERT_TRUE(c->Resolve("payments", &payments).ok()); });
  slowest = std::max(slowest, SlowestOf(100, [&] {
                       for (Dependency d : {orders, payments}) {
                         Permit p;
                         EXPECT_TRUE(c->Admit(d, 0, &p));
                         c->Complete(&p, Outcome::kSuccess, milliseconds(1));
                       }
                       std::this_thread::sleep_for(milliseconds(10));
                     }));
  EXPECT_LT(slowest, kNoWaitNs) << "a call waited for the stopped daemon's create lock";
  EXPECT_TRUE(Holds(*obs_, daemon_->pid())) << "the lock stayed with its stopped holder";
  EXPECT_LT(obs_->Find("payments"), 0);
  EXPECT_LT(obs_->Find("orders"), 0);
  // Resumed, the daemon ends its reload; the worker's next calls move both names.
  daemon_->Signal(SIGCONT);
  EXPECT_TRUE(WaitUntil(
      [&] {
        for (Dependency d : {orders, payments}) {
          Permit p;
          if (c->Admit(d, 0, &p)) c->Complete(&p, Outcome::kSuccess, milliseconds(1));
        }
        return obs_->Find("payments") >= 0 && obs_->Find("orders") >= 0;
      },
      kWaitMs))
      << daemon_->Log();
  const uint64_t before = Successes();
  for (int i = 0; i < 5; ++i) {
    Permit p;
    ASSERT_TRUE(c->Admit(orders, 0, &p));
    c->Complete(&p, Outcome::kSuccess, milliseconds(1));
  }
  EXPECT_EQ(Successes() - before, 5u) << "its calls count in the host's segment";
}

// A daemon killed (SIGKILL) while hellos wait in its backlog: the workers that sent them are
// on per-process limits at once, and attach to the next daemon as it starts.
TEST_P(DaemonStoppedTest, WorkersWhoseHelloADaemonNeverAnsweredAttachToTheNextOne) {
  if (!by_socket()) GTEST_SKIP() << "by name, attaching needs no daemon";
  StartDaemon();
  daemon_->Signal(SIGSTOP);
  std::unique_ptr<Client> c;
  const Start start = Now();
  ASSERT_TRUE(Client::Open(Options(), &c).ok());
  EXPECT_LT(Elapsed(start), kNoWaitNs);
  EXPECT_TRUE(c->local());
  Dependency orders;
  ASSERT_TRUE(c->Resolve("orders", &orders).ok());
  daemon_->Signal(SIGKILL);
  EXPECT_EQ(daemon_->Wait(kWaitMs), 128 + SIGKILL);
  notify_.Flush();
  StartDaemon();
  uint64_t slowest = 0;
  EXPECT_TRUE(WaitUntil(
      [&] {
        slowest = std::max(slowest, SlowestOf(1, [&] {
                             Permit p;
                             c->Admit(orders, 0, &p);
                             c->Complete(&p, Outcome::kSuccess, milliseconds(1));
                           }));
        return !c->local() && Attached(getpid());
      },
      kWaitMs))
      << daemon_->Log();
  EXPECT_LT(slowest, kNoWaitNs);
}

// A listener that stands for a hung daemon: its backlog full (nothing is ever accepted), or
// accepting and never answering. Open returns as fast as with no daemon at all, in either case,
// on per-process limits; without fallback it is an error, bounded.
class HungListener {
 public:
  explicit HungListener(bool backlog_full) {
    path_ = "/tmp/retryd-hung-" + std::to_string(getpid()) + ".sock";
    unlink(path_.c_str());
    fd_ = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path_.data(), path_.size());
    EXPECT_EQ(bind(fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(listen(fd_, backlog_full ? 0 : 16), 0);
    for (int i = 0; backlog_full && i < 64; ++i) {
      const int c = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      if (connect(c, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
        close(c);
        break;
      }
      queued_.push_back(c);
    }
  }
  ~HungListener() {
    for (const int c : queued_) close(c);
    close(fd_);
    unlink(path_.c_str());
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  std::vector<int> queued_;
};

TEST(HungDaemonTest, OpenIsAsFastAsWithNoDaemonAndFallsBack) {
  SetLogCallback([](int, std::string_view) {});
  for (const bool backlog_full : {true, false}) {
    SCOPED_TRACE(backlog_full ? "backlog full" : "never answers");
    HungListener l(backlog_full);
    ClientOptions o;
    o.socket = l.path();
    std::unique_ptr<Client> c;
    Start start = Now();
    ASSERT_TRUE(Client::Open(o, &c).ok());
    EXPECT_LT(Elapsed(start), kNoWaitNs);
    EXPECT_TRUE(c->local());
    Dependency orders;
    ASSERT_TRUE(c->Resolve("orders", &orders).ok());
    uint64_t slowest = SlowestOf(200, [&] {
      Permit p;
      c->Admit(orders, 0, &p);
      c->Complete(&p, Outcome::kSuccess, milliseconds(1));
    });
    EXPECT_LT(slowest, kNoWaitNs);
    retryd_options_t opt = {nullptr, 1};
    retryd_client_t* raw = nullptr;
    start = Now();
    ASSERT_EQ(retryd_open_socket(l.path().c_str(), &opt, &raw), RETRYD_OK) << retryd_last_error();
    EXPECT_LT(Elapsed(start), kNoWaitNs);
    EXPECT_EQ(retryd_is_local(raw), 1);
    retryd_close(raw);
    // Without fallback: an error, after at most about a second.
    o.fallback_to_local = false;
    start = Now();
    EXPECT_FALSE(Client::Open(o, &c).ok());
    EXPECT_LT(Elapsed(start), 5'000'000'000u);
  }
  SetLogCallback(nullptr);
}

INSTANTIATE_TEST_SUITE_P(BothModes, DaemonStoppedTest,
                         ::testing::Values(Mode::kSocket, Mode::kByName), ModeName);

}  // namespace
}  // namespace retryd
