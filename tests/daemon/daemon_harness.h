// tests/daemon/daemon_harness.h: run the real `retryd` binary as a child process and listen to
// what it tells systemd, for the daemon's process tests.
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace retryd::daemon::testing {

// A descriptor kept in the service manager's fd store, with its name.
struct StoredFd {
  std::string name;
  int fd = -1;
};

// NotifySocket binds a unix datagram socket like systemd's NOTIFY_SOCKET and collects the
// messages sent to it. It also keeps an fd store as systemd does for a unit with
// FileDescriptorStoreMax=: "FDSTORE=1" with "FDNAME=" keeps the descriptors sent along (a
// descriptor of a file it holds already is not kept twice), "FDSTOREREMOVE=1" with "FDNAME="
// closes those of that name, and one that hangs up (POLLHUP or POLLERR) is dropped. The store
// lives on across the daemon's restarts, as systemd's does until the unit is fully stopped.
// Like systemd, it reads all the time (a thread of its own): the daemon's sd_notify blocks
// once 10 datagrams wait unread (net.unix.max_dgram_qlen). Thread-safe.
class NotifySocket {
 public:
  NotifySocket();
  ~NotifySocket();  // stops reading, closes the store
  NotifySocket(const NotifySocket&) = delete;
  NotifySocket& operator=(const NotifySocket&) = delete;

  const std::string& path() const { return path_; }
  // WaitFor waits until a message not yet returned by WaitFor holds the line `line` (e.g.
  // "READY=1") and returns it, or returns "" after `timeout_ms`. The messages before the one
  // returned are not looked at again.
  std::string WaitFor(const std::string& line, int timeout_ms);
  // SentAtNs: when each message received so far that holds the line `line` was sent, in
  // CLOCK_REALTIME nanoseconds, by the kernel's stamp (SO_TIMESTAMPNS): the daemon's own pace,
  // which a late reader here does not change.
  std::vector<uint64_t> SentAtNs(const std::string& line);
  // Store is what the fd store holds now (every message sent so far applied, and what hung up
  // dropped); the descriptors stay the store's.
  std::vector<StoredFd> Store();
  // Flush closes everything in the store, as systemd does when the unit stops for good.
  void Flush();

 private:
  void Read();                    // the reader thread
  void DrainLocked();             // receives every message already sent; mu_ held
  void ReceiveLocked(int flags);  // receives one message; mu_ held
  int fd_ = -1;
  int stop_[2] = {-1, -1};  // a pipe: the destructor writes to stop the reader
  std::string path_;
  std::mutex mu_;
  std::condition_variable received_;
  std::vector<std::string> messages_;  // guarded by mu_
  std::vector<uint64_t> sent_at_ns_;   // each message's kernel stamp; guarded by mu_
  size_t looked_at_ = 0;               // messages_ WaitFor is done with; guarded by mu_
  std::vector<StoredFd> store_;        // guarded by mu_
  std::thread reader_;
};

// DaemonProcess forks and execs the retryd binary with `args`, NOTIFY_SOCKET set to
// `notify_path` (if not empty), the "NAME=VALUE" strings of `env` added to its environment, and
// stderr (the glog output) captured in a file.
// `passed` are handed to it as systemd hands a unit its stored descriptors: at 3, 4, ... with
// LISTEN_FDS, LISTEN_PID and LISTEN_FDNAMES set.
class DaemonProcess {
 public:
  // `in_child`, if set, runs in the child just before the exec: async-signal-safe calls only
  // (setrlimit, prctl), as between fork and exec in a threaded test.
  DaemonProcess(const std::vector<std::string>& args, const std::string& notify_path,
                const std::vector<std::string>& env = {}, const std::vector<StoredFd>& passed = {},
                void (*in_child)() = nullptr);
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

// PreloadWith: the LD_PRELOAD ("LD_PRELOAD=...", for DaemonProcess's `env`) that puts
// `library` into a program of this build, after the sanitizer runtimes this process has
// loaded (a shared runtime must come first).
std::string PreloadWith(const std::string& library);

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

// RefusedPort binds a loopback TCP port and never listens on it, so that a connection to it is
// refused: the fd that holds it (close-on-exec, so that no child keeps the port; -1 on
// failure) and, in *port, its number. Closing the fd frees the port for a server to take.
int RefusedPort(uint16_t* port);

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
