// tests/cli/cli_test_util.h: running retryctl (and the Python checkers) as real processes
// against a real segment driven into known states.
//
// TestSegment creates a fresh POSIX shm segment named "retryd-test-<pid>-<n>" through the
// daemon's own path (Segment::CreateOrAdopt), registers this process as a worker and removes
// the segment when destroyed. Calls are driven with shm::Admit/Complete at times close to the
// real CLOCK_MONOTONIC now, so that retryctl, which reads the clock itself, sees the states
// the test made.
// Thread safety: not thread-safe; one test thread.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "shm/admission.h"
#include "shm/policy.h"
#include "shm/segment.h"

namespace retryd::cli_test {

// A test's segment beats once, when it is made: an hour of --stale-after keeps its daemon up
// through a test that runs retryctl many times on a loaded machine.
inline constexpr const char* kUpForAnHour = "--stale-after=3600";

struct RunResult {
  int exit_code = -1;  // exit status, or 128 + signal
  std::string out;
  std::string err;
};

struct RunOptions {
  std::vector<std::pair<std::string, std::string>> set_env;  // name, value
  std::vector<std::string> unset_env;                        // applied before set_env
  std::string stdin_text;
  uid_t uid = uid_t(-1);  // drop to this uid (and gid) in the child before exec; -1: keep
  gid_t gid = gid_t(-1);
};

// Run executes argv[0] with argv and waits for it. Aborts the test on a spawn failure.
RunResult Run(const std::vector<std::string>& argv, const RunOptions& opt = {});
// Retryctl runs the built retryctl binary with `args`.
RunResult Retryctl(const std::vector<std::string>& args, const RunOptions& opt = {});
// Python runs the Debian python3 on a checker script in tests/cli with `args`.
RunResult Python(const std::string& script, const std::vector<std::string>& args,
                 const std::string& stdin_text);

// TerminalProcess runs the built retryctl with `args` and its stdout on a pseudo-terminal
// `columns` wide (0: one that does not say its size), in a session of its own, with stdin
// /dev/null and stderr apart. Like Retryctl, it unsets NO_COLOR, RETRYD_SEGMENT and
// RETRYD_SOCKET; it also unsets COLUMNS and sets LC_ALL=C.UTF-8 (set_env applies after). The
// terminal passes bytes as written ('\n' stays '\n'). Kills (SIGKILL) and reaps a child still
// running when destroyed.
class TerminalProcess {
 public:
  TerminalProcess(const std::vector<std::string>& args, uint16_t columns,
                  const RunOptions& opt = {});
  ~TerminalProcess();
  TerminalProcess(const TerminalProcess&) = delete;
  TerminalProcess& operator=(const TerminalProcess&) = delete;

  // ReadUntil reads what the child writes until `done(everything read so far)` holds (true),
  // the child's side closes, or `timeout_ms` passes (false unless `done` holds then).
  bool ReadUntil(const std::function<bool(const std::string&)>& done, int timeout_ms);
  // Resize sets the terminal's width, as a terminal window that is resized does.
  void Resize(uint16_t columns);
  // Finish waits for the child to exit, reading all it writes; with `interrupt`, sends SIGINT
  // first, as Ctrl-C would. Returns its exit code, out (everything read) and err.
  RunResult Finish(bool interrupt);
  const std::string& output() const { return out_; }

 private:
  pid_t pid_ = -1;
  int master_ = -1;
  int err_fd_ = -1;
  bool closed_ = false;  // the child's side of the terminal is closed
  std::string out_;
};

// RetryctlInTerminal runs retryctl in a TerminalProcess to its end.
RunResult RetryctlInTerminal(const std::vector<std::string>& args, uint16_t columns,
                             const RunOptions& opt = {});

// DisplayLines splits `text` into lines, each with its escape sequences (ESC '[' ... final
// byte) taken out; ColumnsOf counts a line's UTF-8 characters (code points), the columns a
// terminal gives it (the text holds no wide character).
std::vector<std::string> DisplayLines(const std::string& text);
size_t ColumnsOf(const std::string& line);

std::string SchemaPath();
std::string UniqueSegmentName(const char* tag);
uint64_t NowNs();  // CLOCK_MONOTONIC, as retryctl reads it

class TestSegment {
 public:
  explicit TestSegment(uint32_t mode = 0600);
  ~TestSegment();
  TestSegment(const TestSegment&) = delete;
  TestSegment& operator=(const TestSegment&) = delete;

  const std::string& name() const { return name_; }
  shm::Segment& segment() { return *seg_; }
  shm::DependencySlot& slot(uint32_t index) { return *seg_->dependency(index); }
  shm::Caller& caller() { return caller_; }

  // AddDependency publishes `name` with `policy`, as the daemon does from its config.
  uint32_t AddDependency(const std::string& name, const shm::Policy& policy);
  // Heartbeat writes the daemon liveness words: `pid` beat `age_ms` ago (pid 0: no daemon).
  // With a pid and an age of 0 the segment goes on beating every 100 ms, as a daemon's tick
  // does, until the next Heartbeat: the seconds a loaded machine may put between two steps of
  // a test never make its daemon look stale (retryctl's --stale-after is 3 s).
  void Heartbeat(uint32_t pid, uint64_t age_ms);

  // Call admits attempt number `attempt` at `now_ns` and, if admitted, completes it at once
  // with `outcome`, reporting `latency_ns`. Returns the decision.
  shm::Decision Call(uint32_t index, uint32_t attempt, shm::Outcome outcome, uint64_t now_ns,
                     uint64_t latency_ns = 1'000'000);
  // Hold admits and keeps the permit (its leases stay taken) until the segment goes away.
  shm::Decision Hold(uint32_t index, uint32_t attempt, uint64_t now_ns);
  // Trip fails `calls` first attempts at `now_ns` (enough to open a breaker with min_calls).
  void Trip(uint32_t index, uint32_t calls, uint64_t now_ns);

 private:
  std::string name_;
  std::unique_ptr<shm::Segment> seg_;
  shm::Caller caller_{};
  std::vector<shm::Permit> held_;
  std::mutex beat_mu_;   // a beat and a Heartbeat never interleave
  bool beating_ = false;  // guarded by beat_mu_
  std::atomic<bool> stop_{false};
  std::thread beater_;
};

// A policy whose breaker trips after `min_calls` failures and stays open for `open_for_ms`
// without jitter, so tests can predict it.
shm::Policy TestPolicy(uint32_t min_calls = 4, uint32_t open_for_ms = 60'000);

}  // namespace retryd::cli_test
