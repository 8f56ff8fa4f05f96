#include "tests/daemon/daemon_harness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace retryd::daemon::testing {
namespace {

std::atomic<int> g_counter{0};

uint64_t NowMs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000 + uint64_t(ts.tv_nsec) / 1'000'000;
}

// Exec is what a forked child of the test runs: everything it needs is built before the fork,
// since between fork and exec the child of a threaded test may call only async-signal-safe
// functions. A lock another thread held at the fork (the sanitizer's allocator's, for one)
// is never released in the child, which then hangs before the daemon ever starts.
class Exec {
 public:
  // `env`: changes to the test's own environment, in order: "NAME=VALUE" sets NAME, a bare
  // "NAME" removes it.
  Exec(const std::vector<std::string>& args, const std::vector<std::string>& env) {
    auto name_of = [](const std::string& e) { return e.substr(0, e.find('=')); };
    std::vector<std::string> vars;
    for (char** e = environ; *e != nullptr; ++e) vars.push_back(*e);
    for (const std::string& change : env) {
      const std::string name = name_of(change);
      std::erase_if(vars, [&](const std::string& v) { return name_of(v) == name; });
      if (change.find('=') != std::string::npos) vars.push_back(change);
    }
    strings_.push_back(RETRYD_BINARY);
    for (const std::string& a : args) strings_.push_back(a);
    const size_t n_args = strings_.size();
    for (std::string& v : vars) strings_.push_back(std::move(v));
    for (size_t i = 0; i < strings_.size(); ++i) {
      (i < n_args ? argv_ : envp_).push_back(strings_[i].data());
    }
    argv_.push_back(nullptr);
    envp_.push_back(nullptr);
  }

  char** envp() { return envp_.data(); }

  // Run (in the child): execs the daemon; exit code 127 if it could not.
  [[noreturn]] void Run() {
    execve(RETRYD_BINARY, argv_.data(), envp_.data());
    _exit(127);
  }

 private:
  std::vector<std::string> strings_;
  std::vector<char*> argv_, envp_;
};

// FormatPid writes `pid` in decimal at `out` (room for 10 digits and the NUL), as a forked
// child may: no allocation, no locale.
void FormatPid(pid_t pid, char* out) {
  char digits[12];
  int n = 0;
  uint32_t v = uint32_t(pid);
  do {
    digits[n++] = char('0' + v % 10);
    v /= 10;
  } while (v != 0);
  while (n > 0) *out++ = digits[--n];
  *out = '\0';
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
  const int on = 1;
  if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      setsockopt(fd_, SOL_SOCKET, SO_TIMESTAMPNS, &on, sizeof(on)) != 0 ||
      pipe2(stop_, O_CLOEXEC) != 0) {
    ADD_FAILURE() << "cannot bind notify socket " << path_ << ": " << std::strerror(errno);
    return;
  }
  reader_ = std::thread([this] { Read(); });
}

NotifySocket::~NotifySocket() {
  if (reader_.joinable()) {
    (void)!write(stop_[1], "x", 1);
    reader_.join();
  }
  Flush();
  for (const int fd : {fd_, stop_[0], stop_[1]}) {
    if (fd >= 0) close(fd);
  }
  unlink(path_.c_str());
}

void NotifySocket::Read() {
  for (;;) {
    pollfd p[2] = {{fd_, POLLIN, 0}, {stop_[0], POLLIN, 0}};
    if (poll(p, 2, -1) < 0) continue;
    if (p[1].revents != 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    DrainLocked();
    received_.notify_all();
  }
}

void NotifySocket::DrainLocked() {
  for (;;) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, 0) <= 0) return;
    ReceiveLocked(MSG_DONTWAIT);
  }
}

void NotifySocket::ReceiveLocked(int flags) {
  char buf[4096];
  iovec iov{buf, sizeof(buf)};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 64) + CMSG_SPACE(sizeof(timespec))];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t n = recvmsg(fd_, &msg, flags | MSG_CMSG_CLOEXEC);
  if (n < 0) return;
  std::vector<int> fds;
  uint64_t sent_at_ns = 0;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS) {
      timespec ts;
      std::memcpy(&ts, CMSG_DATA(c), sizeof(ts));
      sent_at_ns = uint64_t(ts.tv_sec) * 1'000'000'000u + uint64_t(ts.tv_nsec);
    }
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      fds.push_back(fd);
    }
  }
  const std::string text(buf, size_t(n));
  messages_.push_back(text);
  sent_at_ns_.push_back(sent_at_ns);
  std::string name = "stored";
  bool store = false, remove = false;
  std::istringstream lines(text);
  for (std::string l; std::getline(lines, l);) {
    if (l == "FDSTORE=1") store = true;
    if (l == "FDSTOREREMOVE=1") remove = true;
    if (l.rfind("FDNAME=", 0) == 0) name = l.substr(7);
  }
  if (remove) {
    for (auto it = store_.begin(); it != store_.end();) {
      if (it->name == name) {
        close(it->fd);
        it = store_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const int fd : fds) {
    struct stat st, other;
    const bool known =
        store && fstat(fd, &st) == 0 &&
        std::any_of(store_.begin(), store_.end(), [&](const StoredFd& e) {
          return fstat(e.fd, &other) == 0 && other.st_dev == st.st_dev && other.st_ino == st.st_ino;
        });
    if (store && !known) {
      store_.push_back({name, fd});
    } else {
      close(fd);
    }
  }
}

std::string NotifySocket::WaitFor(const std::string& line, int timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    for (; looked_at_ < messages_.size(); ++looked_at_) {
      std::istringstream lines(messages_[looked_at_]);
      for (std::string l; std::getline(lines, l);) {
        if (l == line) return messages_[looked_at_++];
      }
    }
    if (received_.wait_until(lock, deadline) == std::cv_status::timeout &&
        looked_at_ == messages_.size()) {
      return "";
    }
  }
}

std::vector<uint64_t> NotifySocket::SentAtNs(const std::string& line) {
  std::lock_guard<std::mutex> lock(mu_);
  DrainLocked();
  std::vector<uint64_t> at;
  for (size_t i = 0; i < messages_.size(); ++i) {
    std::istringstream lines(messages_[i]);
    for (std::string l; std::getline(lines, l);) {
      if (l == line) {
        at.push_back(sent_at_ns_[i]);
        break;
      }
    }
  }
  return at;
}

std::vector<StoredFd> NotifySocket::Store() {
  std::lock_guard<std::mutex> lock(mu_);
  DrainLocked();
  for (auto it = store_.begin(); it != store_.end();) {
    pollfd p{it->fd, 0, 0};
    if (poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLERR))) {
      close(it->fd);
      it = store_.erase(it);
    } else {
      ++it;
    }
  }
  return store_;
}

void NotifySocket::Flush() {
  std::lock_guard<std::mutex> lock(mu_);
  for (const StoredFd& e : store_) close(e.fd);
  store_.clear();
}

DaemonProcess::DaemonProcess(const std::vector<std::string>& args, const std::string& notify_path,
                             const std::vector<std::string>& env,
                             const std::vector<StoredFd>& passed, void (*in_child)()) {
  log_path_ = TempPath(".log");
  const int log = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  std::vector<std::string> daemon_env = {"WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS",
                                         "LISTEN_PID", "LISTEN_FDNAMES"};
  daemon_env.push_back(notify_path.empty() ? "NOTIFY_SOCKET" : "NOTIFY_SOCKET=" + notify_path);
  // LISTEN_PID names the child, known only once forked: its digits are written in place.
  constexpr char kListenPid[] = "LISTEN_PID=";
  constexpr size_t kPidAt = sizeof(kListenPid) - 1;
  if (!passed.empty()) {
    std::string names;
    for (const StoredFd& e : passed) names += (names.empty() ? "" : ":") + e.name;
    daemon_env.push_back("LISTEN_FDS=" + std::to_string(passed.size()));
    daemon_env.push_back("LISTEN_FDNAMES=" + names);
    daemon_env.push_back(kListenPid + std::string(11, '0'));
  }
  for (const std::string& e : env) daemon_env.push_back(e);
  Exec exec(args, daemon_env);
  char* listen_pid = nullptr;
  for (char** e = exec.envp(); *e != nullptr; ++e) {
    if (!passed.empty() && strncmp(*e, kListenPid, kPidAt) == 0) listen_pid = *e + kPidAt;
  }
  std::vector<int> fds;
  for (const StoredFd& e : passed) fds.push_back(e.fd);
  pid_ = fork();
  if (pid_ == 0) {
    // Out of the way first, then down to 3, 4, ... (dup2 leaves them open across exec).
    int high[64];
    const size_t n = std::min(fds.size(), sizeof(high) / sizeof(high[0]));
    for (size_t i = 0; i < n; ++i) high[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 64 + int(n));
    for (size_t i = 0; i < n; ++i) dup2(high[i], 3 + int(i));
    if (listen_pid != nullptr) FormatPid(getpid(), listen_pid);
    if (log >= 0) dup2(log, STDERR_FILENO);
    if (in_child != nullptr) in_child();
    exec.Run();
  }
  if (log >= 0) close(log);
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

std::string PreloadWith(const std::string& library) {
  std::string preload;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    const size_t slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash);
    const std::string name = path.substr(path.rfind('/') + 1);
    const bool runtime = name.rfind("libclang_rt.", 0) == 0 || name.rfind("libasan.so", 0) == 0 ||
                         name.rfind("libubsan.so", 0) == 0;
    if (runtime && preload.find(path + " ") == std::string::npos) preload += path + " ";
  }
  return "LD_PRELOAD=" + preload + library;
}

RunResult RunToCompletion(const std::vector<std::string>& args) {
  const std::string out_path = TempPath(".out"), err_path = TempPath(".err");
  RunResult r;
  const int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  Exec exec(args, {});
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(out, STDOUT_FILENO);
    dup2(err, STDERR_FILENO);
    exec.Run();
  }
  close(out);
  close(err);
  int status = 0;
  waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = ReadFile(out_path);
  r.err = ReadFile(err_path);
  unlink(out_path.c_str());
  unlink(err_path.c_str());
  return r;
}

int RefusedPort(uint16_t* port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    return -1;
  }
  *port = ntohs(addr.sin_port);
  return fd;
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
  std::vector<char*> args;  // built before the fork, as Exec's are
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_ = fork();
  if (pid_ == 0) {
    dup2(fds[1], 1);
    close(fds[0]);
    close(fds[1]);
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
