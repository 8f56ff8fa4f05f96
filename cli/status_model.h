// cli/status_model.h: a snapshot of a segment as plain values, for retryctl to render.
//
// BuildStatus and BuildWorkers read the shared words once (relaxed and acquire loads, no
// writes) and turn them into numbers an operator can read: breaker state with the time until
// it goes half-open, window failure rate, retry tokens available now, leases in use. Counters
// are the segment's cumulative ones; `Delta` turns two snapshots into per-interval figures.
// Reading is not atomic across words: a snapshot taken while workers run may mix values a few
// microseconds apart, each valid on its own.
// Thread safety: value types; the Build functions only read the segment and are thread-safe.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "retryd/status.h"
#include "shm/breaker.h"
#include "shm/layout.h"
#include "shm/segment.h"

namespace retryd::cli {

// Liveness of the daemon as the header tells it.
enum class DaemonState {
  kUp,     // pid runs and the heartbeat is fresh
  kStale,  // pid runs (or is unknown) but the heartbeat is older than the threshold
  kDown,   // no daemon pid recorded, or that pid does not run
};
const char* DaemonStateName(DaemonState s);

struct DaemonStatus {
  uint32_t pid = 0;  // 0: none recorded
  bool pid_alive = false;
  std::optional<uint64_t> heartbeat_age_ms;  // nullopt: never beat
  uint64_t heartbeat_unix_ms = 0;
  DaemonState state = DaemonState::kDown;
};

struct DependencyStatus {
  uint32_t index = 0;
  uint32_t generation = 0;
  std::string name;
  shm::Mode mode = shm::Mode::kEnforce;
  shm::Policy policy;
  // Breaker.
  shm::BreakerState breaker = shm::BreakerState::kClosed;
  uint32_t reopens = 0;
  uint32_t probe_successes = 0;   // half-open successes so far
  int64_t half_open_in_ms = 0;    // open: time until half-open (<= 0: due now)
  uint32_t probes_in_flight = 0;  // probe leases taken
  // Window (ReadWindow): approximate at bucket edges.
  shm::WindowStats window;
  // Retry budget.
  uint64_t tokens_available_milli = 0;  // thousandths of a token, RetryBudget::Available
  // Bulkhead.
  uint32_t bulkhead_in_use = 0;  // bulkhead lease words taken
  // Cumulative counters, indexed by shm::Counter.
  std::array<uint64_t, shm::kCounterCount> counters{};

  uint64_t counter(shm::Counter c) const { return counters[c]; }
  // IsOpen: the dependency does not pass all traffic: breaker open or half-open (enforce or
  // shadow mode), or mode forced-open. Drives status's exit code 1.
  bool IsOpen() const;
  // FailureRate of the window in [0, 1], nullopt when it holds no call.
  std::optional<double> FailureRate() const;
  // RetryRatio: retries granted / first attempts, nullopt with no first attempt.
  std::optional<double> RetryRatio() const;
};

struct SegmentStatus {
  std::string name;
  uint32_t layout_version = 0;
  uint64_t generation = 0;
  uint64_t created_unix_ms = 0;
  uint32_t max_dependencies = 0;
  uint32_t max_processes = 0;
  bool auto_create = false;
  uint64_t table_full_events = 0;
  uint64_t registry_full_events = 0;
  uint64_t unknown_dependency_events = 0;
  DaemonStatus daemon;
  uint32_t processes_live = 0;  // registered and running
  uint32_t processes_dead = 0;  // registered, no longer running (leases pending reclaim)
  uint64_t now_ns = 0;          // CLOCK_MONOTONIC the snapshot was taken at
  std::vector<DependencyStatus> dependencies;

  bool AnyOpen() const;
};

// Liveness tests, swappable in tests. PidAliveFn: does `pid` exist (kill(pid, 0))?
using PidAliveFn = std::function<bool(pid_t pid)>;
using ProcessAliveFn = std::function<bool(pid_t pid, uint64_t start_time)>;
bool PidAliveByKill(pid_t pid);

struct BuildOptions {
  uint64_t now_ns = 0;  // CLOCK_MONOTONIC (shm::PreciseNowNs)
  uint64_t stale_after_ms = 3000;
  std::vector<std::string> only;  // dependency names to show; empty: all active
  PidAliveFn pid_alive = PidAliveByKill;
  ProcessAliveFn process_alive;  // default: shm::ProcessAliveByProc
};

// BuildStatus snapshots `seg` into *out. Returns kNotFound naming the first name in
// `opt.only` that is not an active dependency (and lists the known ones).
Status BuildStatus(const shm::Segment& seg, const BuildOptions& opt, SegmentStatus* out);

// Delta returns `now` with every counter replaced by its increase since `before`, matching
// dependencies by slot index and generation (a dependency new since `before` keeps its
// cumulative counters). Gauges (breaker, window, tokens, bulkhead) are `now`'s.
SegmentStatus Delta(const SegmentStatus& now, const SegmentStatus& before);

enum class WorkerState { kLive, kDead, kClaiming };
const char* WorkerStateName(WorkerState s);

struct WorkerStatus {
  uint32_t slot = 0;  // process slot index; lease owner id is slot + 1
  uint32_t pid = 0;
  std::string comm;
  uint64_t start_time = 0;  // clock ticks since boot (/proc/PID/stat)
  uint64_t attach_unix_ms = 0;
  uint32_t probe_leases = 0;  // leases held over every dependency
  uint32_t bulkhead_leases = 0;
  WorkerState state = WorkerState::kLive;
};

// BuildWorkers lists every registered process slot, in slot order.
std::vector<WorkerStatus> BuildWorkers(const shm::Segment& seg,
                                       const ProcessAliveFn& alive = nullptr);

}  // namespace retryd::cli
