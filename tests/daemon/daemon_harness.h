// tests/daemon/daemon_harness.h: run the real `retryd` binary as a child process and listen to
// what it tells systemd, for the daemon's process tests.
#pragma once

#include <sys/types.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace retryd::daemon::testing {

// NotifySocket binds a unix datagram socket like systemd's NOTIFY_SOCKET and collects the
// messages sent to it. Not thread-safe.
class NotifySocket {
 public:
  NotifySocket();
  ~NotifySocket();
  NotifySocket(const NotifySocket&) = delete;
  NotifySocket& operator=(const NotifySocket&) = delete;

  const std::string& path() const { return path_; }
  // WaitFor receives messages until one holds the line `line` (e.g. "READY=1") and returns it,
  // or returns "" after `timeout_ms`. Every message received is kept in messages().
  std::string WaitFor(const std::string& line, int timeout_ms);
  const std::vector<std::string>& messages() const { return messages_; }

 private:
  int fd_ = -1;
  std::string path_;
  std::vector<std::string> messages_;
};

// DaemonProcess forks and execs the retryd binary with `args`, NOTIFY_SOCKET set to
// `notify_path` (if not empty), the "NAME=VALUE" strings of `env` added to its environment, and
// stderr (the glog output) captured in a file.
class DaemonProcess {
 public:
  DaemonProcess(const std::vector<std::string>& args, const std::string& notify_path,
                const std::vector<std::string>& env = {});
  ~DaemonProcess();  // kills (SIGKILL) and reaps a child still running
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  pid_t pid() const { return pid_; }
  void Signal(int sig) const;
  // Wait reaps the child within `timeout_ms`: its exit code, 128 + signal if killed, or -1 on
  // timeout.
  int Wait(int timeout_ms);
  bool running() const { return pid_ > 0; }
  std::string Log() const;

 private:
  pid_t pid_ = -1;
  std::string log_path_;
};

struct RunResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};
// RunToCompletion runs the retryd binary with `args` and captures its output.
RunResult RunToCompletion(const std::vector<std::string>& args);

// ChildProcess runs `argv` (searched in PATH) with its stdout on a pipe, and kills (SIGKILL)
// and reaps it when destroyed or killed. Not thread-safe.
class ChildProcess {
 public:
  explicit ChildProcess(const std::vector<std::string>& argv);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  // Line reads the next line the child prints ("" at its end).
  std::string Line();
  void Kill();
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  FILE* out_ = nullptr;
};

// WaitUntil polls `cond` every millisecond; false if it did not hold within `timeout_ms` (a
// bound that only ends a failing test: tests wait for conditions, never for margins).
bool WaitUntil(const std::function<bool()>& cond, int timeout_ms);

// UniqueName returns "retryd-test-<pid>-<n>", unique within the test run.
std::string UniqueName();
// TempPath returns a fresh path in the test temp dir ending in `suffix`.
std::string TempPath(const std::string& suffix);
void WriteFile(const std::string& path, const std::string& text);
std::string ReadFile(const std::string& path);

}  // namespace retryd::daemon::testing
