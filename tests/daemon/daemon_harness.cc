#include "tests/daemon/daemon_harness.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

namespace retryd::daemon::testing {
namespace {

std::atomic<int> g_counter{0};

uint64_t NowMs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000 + uint64_t(ts.tv_nsec) / 1'000'000;
}

[[noreturn]] void ExecRetryd(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(RETRYD_BINARY));
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  execv(RETRYD_BINARY, argv.data());
  _exit(127);
}

}  // namespace

std::string UniqueName() {
  return "retryd-test-" + std::to_string(getpid()) + "-" + std::to_string(g_counter++);
}

std::string TempPath(const std::string& suffix) {
  return ::testing::TempDir() + "/" + UniqueName() + suffix;
}

void WriteFile(const std::string& path, const std::string& text) {
  // Write then rename, so a reload never sees half a file.
  const std::string tmp = path + ".writing";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
  }
  std::rename(tmp.c_str(), path.c_str());
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

NotifySocket::NotifySocket() {
  path_ = "/tmp/" + UniqueName() + ".notify";
  fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path_.c_str(), sizeof(addr.sun_path) - 1);
  unlink(path_.c_str());
  if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ADD_FAILURE() << "cannot bind notify socket " << path_ << ": " << std::strerror(errno);
  }
}

NotifySocket::~NotifySocket() {
  if (fd_ >= 0) close(fd_);
  unlink(path_.c_str());
}

std::string NotifySocket::WaitFor(const std::string& line, int timeout_ms) {
  const uint64_t deadline = NowMs() + uint64_t(timeout_ms);
  for (;;) {
    const uint64_t now = NowMs();
    if (now >= deadline) return "";
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, int(deadline - now)) <= 0) continue;
    char buf[4096];
    const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
    if (n <= 0) continue;
    std::string msg(buf, size_t(n));
    messages_.push_back(msg);
    std::istringstream lines(msg);
    for (std::string l; std::getline(lines, l);) {
      if (l == line) return msg;
    }
  }
}

DaemonProcess::DaemonProcess(const std::vector<std::string>& args, const std::string& notify_path,
                             const std::vector<std::string>& env) {
  log_path_ = TempPath(".log");
  pid_ = fork();
  if (pid_ == 0) {
    const int log = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (log >= 0) dup2(log, STDERR_FILENO);
    if (notify_path.empty()) {
      unsetenv("NOTIFY_SOCKET");
    } else {
      setenv("NOTIFY_SOCKET", notify_path.c_str(), 1);
    }
    unsetenv("WATCHDOG_USEC");
    unsetenv("WATCHDOG_PID");
    for (const std::string& e : env) putenv(const_cast<char*>(e.c_str()));
    ExecRetryd(args);
  }
}

DaemonProcess::~DaemonProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  unlink(log_path_.c_str());
}

void DaemonProcess::Signal(int sig) const {
  if (pid_ > 0) kill(pid_, sig);
}

int DaemonProcess::Wait(int timeout_ms) {
  const uint64_t deadline = NowMs() + uint64_t(timeout_ms);
  while (pid_ > 0) {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      pid_ = -1;
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
      return -1;
    }
    if (NowMs() >= deadline) return -1;
    usleep(2000);
  }
  return -1;
}

std::string DaemonProcess::Log() const { return ReadFile(log_path_); }

RunResult RunToCompletion(const std::vector<std::string>& args) {
  const std::string out_path = TempPath(".out"), err_path = TempPath(".err");
  RunResult r;
  const pid_t pid = fork();
  if (pid == 0) {
    const int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(out, STDOUT_FILENO);
    dup2(err, STDERR_FILENO);
    ExecRetryd(args);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = ReadFile(out_path);
  r.err = ReadFile(err_path);
  unlink(out_path.c_str());
  unlink(err_path.c_str());
  return r;
}

bool WaitUntil(const std::function<bool()>& cond, int timeout_ms) {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  const int64_t deadline_ms = int64_t(ts.tv_sec) * 1000 + ts.tv_nsec / 1'000'000 + timeout_ms;
  while (!cond()) {
    clock_gettime(CLOCK_MONOTONIC, &ts);
    if (int64_t(ts.tv_sec) * 1000 + ts.tv_nsec / 1'000'000 >= deadline_ms) return false;
    usleep(1'000);
  }
  return true;
}

ChildProcess::ChildProcess(const std::vector<std::string>& argv) {
  int fds[2];
  if (pipe(fds) != 0) return;
  pid_ = fork();
  if (pid_ == 0) {
    dup2(fds[1], 1);
    close(fds[0]);
    close(fds[1]);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  close(fds[1]);
  out_ = fdopen(fds[0], "r");
}

ChildProcess::~ChildProcess() {
  Kill();
  if (out_) fclose(out_);
}

std::string ChildProcess::Line() {
  char buf[256];
  if (!out_ || !fgets(buf, sizeof(buf), out_)) return "";
  std::string s(buf);
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

void ChildProcess::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

}  // namespace retryd::daemon::testing
