#include "tests/cli/cli_test_util.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <gtest/gtest.h>

#include "shm/clock.h"
#include "shm/registry.h"
#include "tests/reachable_copy.h"

#ifndef RETRYCTL_PATH
#error "RETRYCTL_PATH must name the retryctl binary"
#endif
#ifndef RETRYD_SOURCE_DIR
#error "RETRYD_SOURCE_DIR must name the source tree"
#endif
#ifndef RETRYD_TEST_PYTHON
#define RETRYD_TEST_PYTHON "/usr/bin/python3"
#endif

namespace retryd::cli_test {
namespace {

std::string ReadAll(int fd) {
  std::string s;
  lseek(fd, 0, SEEK_SET);
  char buf[65536];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) break;
    s.append(buf, size_t(n));
  }
  return s;
}

int TempFile() {
  char path[] = "/tmp/retryctl-test-XXXXXX";
  const int fd = mkstemp(path);
  if (fd >= 0) unlink(path);
  return fd;
}

}  // namespace

RunResult Run(const std::vector<std::string>& argv, const RunOptions& opt) {
  RunResult r;
  const int out_fd = TempFile(), err_fd = TempFile(), in_fd = TempFile();
  if (out_fd < 0 || err_fd < 0 || in_fd < 0) {
    ADD_FAILURE() << "mkstemp: " << std::strerror(errno);
    return r;
  }
  if (!opt.stdin_text.empty() && write(in_fd, opt.stdin_text.data(), opt.stdin_text.size()) !=
                                     ssize_t(opt.stdin_text.size())) {
    ADD_FAILURE() << "write stdin: " << std::strerror(errno);
  }
  lseek(in_fd, 0, SEEK_SET);
  // Another user runs a copy it can reach, wherever the build tree is.
  const std::string program =
      opt.uid != uid_t(-1) && !argv.empty() ? ::retryd::testing::ReachableCopy(argv[0]) : "";
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  if (!program.empty()) args[0] = const_cast<char*>(program.c_str());
  args.push_back(nullptr);
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) {
    ADD_FAILURE() << "fork: " << std::strerror(errno);
    return r;
  }
  if (pid == 0) {
    dup2(in_fd, 0);
    dup2(out_fd, 1);
    dup2(err_fd, 2);
    for (const std::string& k : opt.unset_env) unsetenv(k.c_str());
    for (const auto& [k, v] : opt.set_env) setenv(k.c_str(), v.c_str(), 1);
    if (opt.uid != uid_t(-1)) {
      if (setgroups(0, nullptr) != 0 || setgid(opt.gid) != 0 || setuid(opt.uid) != 0) {
        std::fprintf(stderr, "test child: cannot drop privileges: %s\n", std::strerror(errno));
        _exit(99);
      }
    }
    execv(args[0], args.data());
    std::fprintf(stderr, "test child: exec %s: %s\n", args[0], std::strerror(errno));
    _exit(98);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = ReadAll(out_fd);
  r.err = ReadAll(err_fd);
  close(out_fd);
  close(err_fd);
  close(in_fd);
  return r;
}

// RetryctlFor returns a path to retryctl that user `uid` can execute: the built binary, or
// for another user a copy in a world-readable temporary directory (the build tree may not be
// reachable for `nobody`).
std::string RetryctlFor(uid_t uid) {
  if (uid == uid_t(-1)) return RETRYCTL_PATH;
  struct Copy {
    std::string dir, path;
    Copy() {
      char tmpl[] = "/tmp/retryctl-bin-XXXXXX";
      if (mkdtemp(tmpl) == nullptr) return;
      dir = tmpl;
      const std::string target = dir + "/retryctl";
      const std::string cmd = "cp '" RETRYCTL_PATH "' '" + target + "'";
      if (chmod(tmpl, 0755) == 0 && std::system(cmd.c_str()) == 0 &&
          chmod(target.c_str(), 0755) == 0) {
        path = target;
      }
    }
    ~Copy() {
      unlink((dir + "/retryctl").c_str());
      if (!dir.empty()) rmdir(dir.c_str());
    }
  };
  static const Copy copy;
  return copy.path.empty() ? std::string(RETRYCTL_PATH) : copy.path;
}

RunResult Retryctl(const std::vector<std::string>& args, const RunOptions& opt) {
  std::vector<std::string> argv = {RetryctlFor(opt.uid)};
  argv.insert(argv.end(), args.begin(), args.end());
  RunOptions o = opt;
  // The tests decide about colour, the segment and the socket themselves (set_env applies
  // after this).
  o.unset_env.push_back("NO_COLOR");
  o.unset_env.push_back("RETRYD_SEGMENT");
  o.unset_env.push_back("RETRYD_SOCKET");
  return Run(argv, o);
}

RunResult Python(const std::string& script, const std::vector<std::string>& args,
                 const std::string& stdin_text) {
  std::vector<std::string> argv = {RETRYD_TEST_PYTHON,
                                   std::string(RETRYD_SOURCE_DIR) + "/tests/cli/" + script};
  argv.insert(argv.end(), args.begin(), args.end());
  RunOptions o;
  o.stdin_text = stdin_text;
  // Debian's python3 with Debian's modules only: no user site, no virtualenv paths.
  o.unset_env = {"PYTHONPATH", "PYTHONHOME"};
  o.set_env = {{"PYTHONNOUSERSITE", "1"}};
  return Run(argv, o);
}

TerminalProcess::TerminalProcess(const std::vector<std::string>& args, uint16_t columns,
                                 const RunOptions& opt) {
  winsize size{};
  size.ws_col = columns;
  size.ws_row = columns == 0 ? 0 : 50;
  int slave = -1;
  if (openpty(&master_, &slave, nullptr, nullptr, &size) != 0) {
    ADD_FAILURE() << "openpty: " << std::strerror(errno);
    return;
  }
  termios mode;
  if (tcgetattr(slave, &mode) == 0) {
    mode.c_oflag &= ~tcflag_t(ONLCR);  // '\n' as written, not "\r\n"
    tcsetattr(slave, TCSANOW, &mode);
  }
  err_fd_ = TempFile();
  std::vector<std::string> argv = {RETRYCTL_PATH};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> c_argv;
  for (const std::string& a : argv) c_argv.push_back(const_cast<char*>(a.c_str()));
  c_argv.push_back(nullptr);
  std::fflush(nullptr);
  pid_ = fork();
  if (pid_ < 0) {
    ADD_FAILURE() << "fork: " << std::strerror(errno);
    return;
  }
  if (pid_ == 0) {
    setsid();
    ioctl(slave, TIOCSCTTY, 0);
    const int null = open("/dev/null", O_RDONLY);
    dup2(null, 0);
    dup2(slave, 1);
    dup2(err_fd_, 2);
    for (const char* k : {"NO_COLOR", "RETRYD_SEGMENT", "RETRYD_SOCKET", "COLUMNS"}) unsetenv(k);
    setenv("LC_ALL", "C.UTF-8", 1);
    for (const std::string& k : opt.unset_env) unsetenv(k.c_str());
    for (const auto& [k, v] : opt.set_env) setenv(k.c_str(), v.c_str(), 1);
    execv(c_argv[0], c_argv.data());
    std::fprintf(stderr, "test child: exec %s: %s\n", c_argv[0], std::strerror(errno));
    _exit(98);
  }
  close(slave);
}

TerminalProcess::~TerminalProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (master_ >= 0) close(master_);
  if (err_fd_ >= 0) close(err_fd_);
}

bool TerminalProcess::ReadUntil(const std::function<bool(const std::string&)>& done,
                                int timeout_ms) {
  const uint64_t deadline = NowNs() + uint64_t(timeout_ms) * 1'000'000;
  while (!done(out_)) {
    const uint64_t now = NowNs();
    if (closed_ || master_ < 0 || now >= deadline) return false;
    pollfd p{master_, POLLIN, 0};
    const int ready = poll(&p, 1, int((deadline - now) / 1'000'000) + 1);
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;
    char buf[65536];
    const ssize_t n = read(master_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      closed_ = true;  // EIO: every descriptor of the child's side is closed
    } else {
      out_.append(buf, size_t(n));
    }
  }
  return true;
}

void TerminalProcess::Resize(uint16_t columns) {
  winsize size{};
  size.ws_col = columns;
  size.ws_row = 50;
  if (ioctl(master_, TIOCSWINSZ, &size) != 0) {
    ADD_FAILURE() << "TIOCSWINSZ: " << std::strerror(errno);
  }
}

RunResult TerminalProcess::Finish(bool interrupt) {
  RunResult r;
  if (pid_ <= 0) return r;
  if (interrupt) kill(pid_, SIGINT);
  // Bounded only so that a hung child fails the test instead of hanging it.
  EXPECT_TRUE(ReadUntil([&](const std::string&) { return closed_; }, 60'000))
      << "retryctl did not end; it wrote:\n" << out_;
  if (!closed_) kill(pid_, SIGKILL);
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = out_;
  r.err = ReadAll(err_fd_);
  return r;
}

RunResult RetryctlInTerminal(const std::vector<std::string>& args, uint16_t columns,
                             const RunOptions& opt) {
  TerminalProcess p(args, columns, opt);
  return p.Finish(/*interrupt=*/false);
}

std::vector<std::string> DisplayLines(const std::string& text) {
  std::vector<std::string> lines;
  std::string line;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\033' && i + 1 < text.size() && text[i + 1] == '[') {
      for (i += 2; i < text.size() && !(text[i] >= 0x40 && text[i] <= 0x7e); ++i) {
      }
    } else if (text[i] == '\n') {
      lines.push_back(line);
      line.clear();
    } else {
      line += text[i];
    }
  }
  if (!line.empty()) lines.push_back(line);
  return lines;
}

size_t ColumnsOf(const std::string& line) {
  size_t n = 0;
  for (const char c : line) n += (static_cast<unsigned char>(c) & 0xc0) != 0x80;
  return n;
}

std::string SchemaPath() {
  return std::string(RETRYD_SOURCE_DIR) + "/docs/retryctl-json-schema.json";
}

std::string UniqueSegmentName(const char* tag) {
  static std::atomic<int> n{0};
  return "retryd-test-" + std::to_string(getpid()) + "-" + tag + "-" + std::to_string(n++);
}

uint64_t NowNs() { return shm::PreciseNowNs(); }

shm::Policy TestPolicy(uint32_t min_calls, uint32_t open_for_ms) {
  shm::Policy p;
  p.min_calls = min_calls;
  p.failure_rate_pct = 50;
  p.open_for_ms = open_for_ms;
  p.open_for_max_ms = std::max(open_for_ms, p.open_for_max_ms);
  p.open_jitter_ms = 0;
  p.probe_timeout_ms = 60'000;
  p.bulkhead_timeout_ms = 60'000;
  return p;
}

TestSegment::TestSegment(uint32_t mode) : name_(UniqueSegmentName("seg")) {
  shm::CreateOptions opt;
  opt.name = name_;
  opt.max_dependencies = 16;
  opt.max_processes = 32;
  opt.mode = mode;
  bool adopted = false;
  std::string note;
  const Status s = shm::Segment::CreateOrAdopt(opt, &seg_, &adopted, &note);
  if (!s.ok()) {
    ADD_FAILURE() << "CreateOrAdopt " << name_ << ": " << s.ToString();
    std::abort();
  }
  caller_.owner = shm::RegisterProcess(*seg_, getpid());
  caller_.lease_tag = 0;
  caller_.rng = 12345;
  Heartbeat(uint32_t(getpid()), 0);
  beater_ = std::thread([this] {
    while (!stop_.load()) {
      usleep(100'000);
      const std::lock_guard<std::mutex> lock(beat_mu_);
      if (beating_) seg_->header().heartbeat_ns.store(NowNs());
    }
  });
}

TestSegment::~TestSegment() {
  stop_.store(true);
  beater_.join();
  for (shm::Permit& p : held_) {
    shm::Complete(*seg_->dependency(p.dependency), &p, shm::Outcome::kIgnored, 0, NowNs(), caller_);
  }
  shm::Segment::Remove(name_);
}

uint32_t TestSegment::AddDependency(const std::string& name, const shm::Policy& policy) {
  uint32_t index = 0;
  const Status s = seg_->PutDependency(name, policy, &index);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return index;
}

void TestSegment::Heartbeat(uint32_t pid, uint64_t age_ms) {
  const std::lock_guard<std::mutex> lock(beat_mu_);
  beating_ = pid != 0 && age_ms == 0;
  shm::SegmentHeader& h = seg_->header();
  h.daemon_pid.store(pid);
  h.heartbeat_ns.store(pid == 0 && age_ms == 0 ? 0 : NowNs() - age_ms * 1'000'000);
}

shm::Decision TestSegment::Call(uint32_t index, uint32_t attempt, shm::Outcome outcome,
                                uint64_t now_ns, uint64_t latency_ns) {
  shm::Permit p;
  const shm::Decision d = shm::Admit(slot(index), index, attempt, now_ns, caller_, &p);
  shm::Complete(slot(index), &p, outcome, latency_ns, now_ns, caller_);
  return d;
}

shm::Decision TestSegment::Hold(uint32_t index, uint32_t attempt, uint64_t now_ns) {
  shm::Permit p;
  const shm::Decision d = shm::Admit(slot(index), index, attempt, now_ns, caller_, &p);
  if (shm::IsAdmitted(d)) {
    held_.push_back(p);
  } else {
    shm::Complete(slot(index), &p, shm::Outcome::kIgnored, 0, now_ns, caller_);
  }
  return d;
}

void TestSegment::Trip(uint32_t index, uint32_t calls, uint64_t now_ns) {
  for (uint32_t i = 0; i < calls; ++i) Call(index, 0, shm::Outcome::kFailure, now_ns);
}

}  // namespace retryd::cli_test
