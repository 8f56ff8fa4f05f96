// tests/reliability/reliability_util.h: what the fault, bad-input, security and soak tests
// share: the real `retryd` and `retryctl` binaries run as child processes, forked workers
// whose death is visible to the others at the instant it happens, forcing a chosen pid, and
// the figures each test reports.
//
// Thread safety: helpers are for the test's main thread; `WorkerBoard` is process-shared and
// lock-free (workers on many processes update it concurrently).
#pragma once

#include <pthread.h>
#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "shm/segment.h"

namespace retryd::reliability {

// --- Child processes ------------------------------------------------------------------------

struct RunResult {
  int exit_code = -1;  // 128 + signal if killed; -1 on timeout (the child is then killed)
  std::string out;
  std::string err;
};
// RunBinary runs `binary` with `args` to completion (at most `timeout_ms`), capturing its output.
// `before_exec` runs in the child first (e.g. to drop privileges).
RunResult RunBinary(const std::string& binary, const std::vector<std::string>& args,
              int timeout_ms = 30'000, const std::function<void()>& before_exec = nullptr);

// Daemon runs the real retryd binary in the background, its log (stderr) in a file.
class Daemon {
 public:
  explicit Daemon(const std::vector<std::string>& args);
  ~Daemon();  // SIGKILLs and reaps it if it still runs
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  pid_t pid() const { return pid_; }
  void Signal(int sig) const;
  // Wait reaps it within `timeout_ms`: its exit code, 128 + signal, or -1 on timeout.
  int Wait(int timeout_ms);
  // KillHard sends SIGKILL and reaps it.
  void KillHard();
  std::string Log() const;
  // WaitForLog waits until the log holds `text`; false after `timeout_ms`.
  bool WaitForLog(const std::string& text, int timeout_ms) const;

 private:
  pid_t pid_ = -1;
  std::string log_path_;
};

// WaitUntil polls `cond` every millisecond; false if it did not hold within `timeout_ms`.
bool WaitUntil(const std::function<bool()>& cond, int timeout_ms);

// AttachWhenReady waits up to `timeout_ms` for segment `name` to exist with a daemon pid
// published, and attaches it into *seg. False if it did not happen in time.
bool AttachWhenReady(const std::string& name, std::unique_ptr<shm::Segment>* seg,
                     shm::Access access = shm::Access::kReadWrite, int timeout_ms = 10'000);

// CreateSegment creates (or adopts) the named segment `name` with room for `max_processes`
// processes and 8 dependencies, mode 0600, as a daemon would but without one. Stores nullptr
// in *seg and returns the error on failure.
Status CreateSegment(const std::string& name, uint32_t max_processes,
                     std::unique_ptr<shm::Segment>* seg);

// ForkAt forks a child that runs `body` and _exits with its result, and tries to give the
// child exactly pid `pid` (through /proc/sys/kernel/ns_last_pid, which needs root). Returns
// the child's pid, which differs from `pid` when that could not be arranged.
pid_t ForkAt(pid_t pid, const std::function<int()>& body);
// CanChoosePids: is /proc/sys/kernel/ns_last_pid writable here?
bool CanChoosePids();

// --- Shared bookkeeping across forked workers -----------------------------------------------

// WorkerBoard is a process-shared page where forked workers keep count of the leases they
// hold, so that any worker can check a host-wide limit at the instant it takes a lease.
//
// A worker killed with SIGKILL cannot take its counts back, so its counts must stop counting
// the instant it dies, before anything can reclaim its leases (the daemon sees the death
// through a pidfd, Admit through lease expiry). Each worker holds a robust process-shared
// mutex for its whole life; the kernel marks it owner-dead while tearing the process down,
// before the pidfd becomes readable and before the process is a zombie. `Live` reads that
// mark. (The mutex word is glibc's `__data.__lock`: the owner's tid, or FUTEX_OWNER_DIED.)
struct WorkerCell {
  pthread_mutex_t life;
  std::atomic<int32_t> pid;
  std::atomic<int32_t> started;
  std::atomic<int64_t> held[2];        // leases held now, by kind (see WorkerBoard::Kind)
  std::atomic<uint64_t> operations;    // admits
  std::atomic<uint64_t> admitted;
};

struct WorkerBoard {
  enum Kind { kProbe = 0, kBulkhead = 1 };
  static constexpr int kCells = 64;

  std::atomic<int64_t> total_held[2];     // sum of every cell's `held`, dead ones included
  std::atomic<int64_t> max_live_held[2];  // the most live holders seen at one check
  std::atomic<uint64_t> checks;           // limit checks made
  std::atomic<uint64_t> violations;       // checks that found a limit exceeded
  std::atomic<uint64_t> lost_while_held;  // a live worker's lease taken back before release
  std::atomic<uint64_t> blocked;          // admits during which the worker slept (BlockWatch)
  std::atomic<uint64_t> max_admit_ns;     // the slowest admit seen
  std::atomic<uint64_t> errors;           // anything a worker could not do
  WorkerCell cells[kCells];

  // Create maps a fresh board shared with every process forked afterwards.
  static WorkerBoard* Create();
  static void Destroy(WorkerBoard* b);

  // Join (in the worker) takes cell `i` for the calling process; its counts start at 0.
  WorkerCell& Join(int i);
  // Reset (parent, no worker running) clears the cells for a new round; dead holders'
  // counts leave `total_held`.
  void Reset();
  // Live: does the worker of cell `i` run? False once the kernel tears it down.
  bool Live(int i) const;

  // Acquired / Released (worker): one lease of `kind` taken / about to be given back.
  // Acquired checks `limit` against the live holders and counts a violation.
  void Acquired(WorkerCell& c, Kind kind, int64_t limit);
  void Released(WorkerCell& c, Kind kind);
  // LiveHeld: holders of `kind` among live workers, a lower bound read at one instant.
  int64_t LiveHeld(Kind kind) const;
};

// --- Figures --------------------------------------------------------------------------------

// Figure prints "FIGURE test.name = value" (collected into docs/RELIABILITY.md) and records
// it as a gtest property.
void Figure(const std::string& name, double value);

// EnvSeconds reads a duration in seconds from the environment, or `fallback`.
double EnvSeconds(const char* name, double fallback);

// Spin burns about `n` loop iterations (a lease held for a moment) without a syscall.
inline void Spin(uint32_t n) {
  for (uint32_t i = 0; i < n; ++i) asm volatile("" ::: "memory");
}

// Monotonic time in ns.
uint64_t NowNs();

// BlockWatch tells whether the calling thread slept (blocked in the kernel: a lock, a wait, a
// read) since it was made: its count of voluntary context switches moved. Being preempted by a
// busy machine is not sleeping, so this holds on a loaded machine where a time bound would not.
class BlockWatch {
 public:
  BlockWatch() : before_(VoluntarySwitches()) {}
  bool Slept() const { return VoluntarySwitches() != before_; }
  static long VoluntarySwitches();

 private:
  long before_;
};

// UniqueName returns "retryd-rel-<tag>-<pid>-<n>".
std::string UniqueName(const std::string& tag);
// TempFile returns a path under the test temp dir; WriteFile writes it atomically.
std::string TempFile(const std::string& suffix);
void WriteFile(const std::string& path, const std::string& text);
std::string ReadFile(const std::string& path);

}  // namespace retryd::reliability
