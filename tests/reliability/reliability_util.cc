#include "tests/reliability/reliability_util.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <sstream>
#include <vector>

#include <gtest/gtest.h>

namespace retryd::reliability {
namespace {

std::atomic<int> g_counter{0};
constexpr int32_t kFutexTidMask = 0x3fffffff;

[[noreturn]] void Exec(const std::string& binary, const std::vector<std::string>& args) {
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(binary.c_str()));
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  execv(binary.c_str(), argv.data());
  _exit(127);
}

int ExitCode(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

// ReapWithin waits for `pid` at most `timeout_ms`; the exit code, or -1 on timeout.
int ReapWithin(pid_t pid, int timeout_ms) {
  const uint64_t deadline = NowNs() + uint64_t(timeout_ms) * 1'000'000u;
  for (;;) {
    int status = 0;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return ExitCode(status);
    if (r < 0 && errno != EINTR) return -1;
    if (NowNs() >= deadline) return -1;
    usleep(1000);
  }
}

}  // namespace

uint64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000u + uint64_t(ts.tv_nsec);
}

long BlockWatch::VoluntarySwitches() {
  rusage usage{};
  getrusage(RUSAGE_THREAD, &usage);
  return usage.ru_nvcsw;
}

std::string UniqueName(const std::string& tag) {
  return "retryd-rel-" + tag + "-" + std::to_string(getpid()) + "-" + std::to_string(g_counter++);
}

namespace {
// The paths TempFile handed out, removed when the process that asked for them exits (not a
// forked child that exits through exit()).
std::vector<std::string>& TempFiles() {
  static auto* paths = new std::vector<std::string>;
  return *paths;
}
}  // namespace

std::string TempFile(const std::string& suffix) {
  static const pid_t owner = [] {
    std::atexit([] {
      if (getpid() != owner) return;
      for (const std::string& p : TempFiles()) unlink(p.c_str());
    });
    return getpid();
  }();
  (void)owner;
  std::string path = ::testing::TempDir() + "/" + UniqueName("tmp") + suffix;
  TempFiles().push_back(path);
  return path;
}

void WriteFile(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".writing";
  {
    std::ofstream out(tmp, std::ios::trunc | std::ios::binary);
    out << text;
  }
  std::rename(tmp.c_str(), path.c_str());
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

RunResult RunBinary(const std::string& binary, const std::vector<std::string>& args, int timeout_ms,
              const std::function<void()>& before_exec) {
  const std::string out_path = TempFile(".out"), err_path = TempFile(".err");
  const pid_t pid = fork();
  if (pid == 0) {
    const int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0666);
    const int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0666);
    if (out < 0 || err < 0) _exit(126);
    dup2(out, STDOUT_FILENO);
    dup2(err, STDERR_FILENO);
    if (before_exec) before_exec();
    Exec(binary, args);
  }
  RunResult r;
  r.exit_code = ReapWithin(pid, timeout_ms);
  if (r.exit_code == -1) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  r.out = ReadFile(out_path);
  r.err = ReadFile(err_path);
  unlink(out_path.c_str());
  unlink(err_path.c_str());
  return r;
}

Daemon::Daemon(const std::vector<std::string>& args) {
  log_path_ = TempFile(".log");
  pid_ = fork();
  if (pid_ == 0) {
    const int log = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (log >= 0) dup2(log, STDERR_FILENO);
    unsetenv("NOTIFY_SOCKET");
    unsetenv("WATCHDOG_USEC");
    Exec(RETRYD_BINARY, args);
  }
}

Daemon::~Daemon() {
  KillHard();
  unlink(log_path_.c_str());
}

void Daemon::Signal(int sig) const {
  if (pid_ > 0) kill(pid_, sig);
}

int Daemon::Wait(int timeout_ms) {
  if (pid_ <= 0) return -1;
  const int code = ReapWithin(pid_, timeout_ms);
  if (code != -1) pid_ = -1;
  return code;
}

void Daemon::KillHard() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

std::string Daemon::Log() const { return ReadFile(log_path_); }

bool Daemon::WaitForLog(const std::string& text, int timeout_ms) const {
  return WaitUntil([&] { return Log().find(text) != std::string::npos; }, timeout_ms);
}

bool WaitUntil(const std::function<bool()>& cond, int timeout_ms) {
  const uint64_t deadline = NowNs() + uint64_t(timeout_ms) * 1'000'000u;
  for (;;) {
    if (cond()) return true;
    if (NowNs() >= deadline) return false;
    usleep(1000);
  }
}

Status CreateSegment(const std::string& name, uint32_t max_processes,
                     std::unique_ptr<shm::Segment>* seg) {
  shm::CreateOptions opt;
  opt.name = name;
  opt.max_dependencies = 8;
  opt.max_processes = max_processes;
  opt.mode = 0600;
  bool adopted = false;
  std::string note;
  return shm::Segment::CreateOrAdopt(opt, seg, &adopted, &note);
}

bool AttachWhenReady(const std::string& name, std::unique_ptr<shm::Segment>* seg,
                     shm::Access access, int timeout_ms) {
  return WaitUntil([&] {
    return shm::Segment::Attach(name, access, seg).ok() &&
           (*seg)->header().daemon_pid.load() != 0;
  }, timeout_ms);
}

bool CanChoosePids() { return access("/proc/sys/kernel/ns_last_pid", W_OK) == 0; }

pid_t ForkAt(pid_t pid, const std::function<int()>& body) {
  // The next fork gets ns_last_pid + 1 if that pid is free. Other processes forking in
  // between can take it (tests run in parallel): while one holds it, wait for it to exit, up to
  // 10 s; the caller checks the pid it got.
  for (int attempt = 0, waits = 0; attempt < 20 && waits < 1'000;) {
    if (kill(pid, 0) == 0 || errno != ESRCH) {
      ++waits;
      usleep(10'000);
      continue;
    }
    ++attempt;
    if (FILE* f = std::fopen("/proc/sys/kernel/ns_last_pid", "w")) {
      std::fprintf(f, "%d", int(pid) - 1);
      std::fclose(f);
    }
    const pid_t child = fork();
    if (child == 0) _exit(body());
    if (child == pid || !CanChoosePids()) return child;
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
  }
  const pid_t child = fork();
  if (child == 0) _exit(body());
  return child;
}

WorkerBoard* WorkerBoard::Create() {
  void* p = mmap(nullptr, sizeof(WorkerBoard), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                 -1, 0);
  if (p == MAP_FAILED) return nullptr;
  auto* b = new (p) WorkerBoard{};
  b->Reset();
  return b;
}

void WorkerBoard::Destroy(WorkerBoard* b) { munmap(b, sizeof(WorkerBoard)); }

void WorkerBoard::Reset() {
  for (WorkerCell& c : cells) {
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&c.life, &attr);
    pthread_mutexattr_destroy(&attr);
    c.pid.store(0);
    c.started.store(0);
    c.held[0].store(0);
    c.held[1].store(0);
  }
  // No worker runs now: what dead workers held leaves the totals.
  total_held[0].store(0);
  total_held[1].store(0);
}

WorkerCell& WorkerBoard::Join(int i) {
  WorkerCell& c = cells[i];
  pthread_mutex_lock(&c.life);
  c.pid.store(int32_t(getpid()));
  return c;
}

bool WorkerBoard::Live(int i) const {
  const WorkerCell& c = cells[i];
  const int32_t pid = c.pid.load(std::memory_order_acquire);
  if (pid == 0) return false;
  const int32_t word = __atomic_load_n(&c.life.__data.__lock, __ATOMIC_ACQUIRE);
  return (word & kFutexTidMask) == pid;
}

int64_t WorkerBoard::LiveHeld(Kind kind) const {
  // Total first, then the dead: a worker that dies in between is subtracted although it was
  // counted live, which errs towards passing, never towards a false alarm.
  int64_t live = total_held[kind].load(std::memory_order_seq_cst);
  for (int i = 0; i < kCells; ++i) {
    if (cells[i].pid.load(std::memory_order_relaxed) != 0 && !Live(i)) {
      live -= cells[i].held[kind].load(std::memory_order_seq_cst);
    }
  }
  return live;
}

void WorkerBoard::Acquired(WorkerCell& c, Kind kind, int64_t limit) {
  // The cell first: killed in between, the cell over-states and the check errs lenient.
  c.held[kind].fetch_add(1, std::memory_order_seq_cst);
  total_held[kind].fetch_add(1, std::memory_order_seq_cst);
  const int64_t live = LiveHeld(kind);
  checks.fetch_add(1, std::memory_order_relaxed);
  if (live > limit) violations.fetch_add(1, std::memory_order_relaxed);
  int64_t seen = max_live_held[kind].load(std::memory_order_relaxed);
  while (live > seen && !max_live_held[kind].compare_exchange_weak(seen, live)) {
  }
}

void WorkerBoard::Released(WorkerCell& c, Kind kind) {
  total_held[kind].fetch_sub(1, std::memory_order_seq_cst);
  c.held[kind].fetch_sub(1, std::memory_order_seq_cst);
}

void Figure(const std::string& name, double value) {
  const ::testing::TestInfo* t = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string full = t ? std::string(t->test_suite_name()) + "." + t->name() + "." + name : name;
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.10g", value);
  std::printf("FIGURE %s = %s\n", full.c_str(), buf);
  std::fflush(stdout);
  ::testing::Test::RecordProperty(name, buf);
}

double EnvSeconds(const char* name, double fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const double d = std::strtod(v, &end);
  return end && *end == '\0' && d > 0 ? d : fallback;
}

}  // namespace retryd::reliability
