// shm/view.h: a read-only view of a segment, as plain values: the one read model that
// `retryctl status`, `retryctl workers`, their JSON, the Prometheus metrics and the daemon's
// systemd STATUS line all render from.
//
// BuildStatus and BuildWorkers read the shared words once (relaxed and acquire loads, never a
// write) and turn them into numbers an operator can read: breaker state with the time until
// it goes half-open, window failure rate, retry tokens available now, leases in use. Counters
// are the segment's cumulative ones; `Delta` turns two snapshots into per-interval figures.
// Reading is not atomic across words: a snapshot taken while workers run may mix values a few
// microseconds apart, each valid on its own. Nothing read is trusted: indices, modes and
// capacities are clamped as the hot path clamps them.
//
// The view links nothing beyond retryd_shm (no glog, gflags or systemd), so the daemon,
// retryctl and the tests share it.
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
#include "shm/latency.h"
#include "shm/layout.h"
#include "shm/policy.h"
#include "shm/registry.h"
#include "shm/segment.h"

namespace retryd::shm {

// Liveness of the daemon. The kernel's word comes first: while a daemon holds the segment's
// daemon lock (Segment::ProbeDaemonLock) it runs, whatever pid the header carries, and the
// heartbeat says whether it is up or stale. Only where the lock tells nothing (free: no daemon
// of this build, e.g. one of an earlier build that takes no lock; or no probe possible) does
// the header's pid decide as below.
enum class DaemonState {
  kUp,     // the lock is held, or the pid runs; and the heartbeat is fresh
  kStale,  // the lock is held, or the pid runs; but the heartbeat is older than the threshold
  kDown,   // the lock is not held, and no daemon pid is recorded or that pid does not run
};
const char* DaemonStateName(DaemonState s);

struct DaemonStatus {
  uint32_t pid = 0;  // 0: none recorded
  bool pid_alive = false;
  uint64_t heartbeat_ns = 0;                 // CLOCK_MONOTONIC of the last tick; 0: never beat
  std::optional<uint64_t> heartbeat_age_ms;  // nullopt: never beat
  uint64_t heartbeat_unix_ms = 0;
  DaemonLock lock = DaemonLock::kUnknown;  // the daemon lock as probed (BuildOptions::probe_lock)
  DaemonState state = DaemonState::kDown;
};

struct DependencyStatus {
  uint32_t index = 0;
  uint32_t generation = 0;
  std::string name;
  Mode mode = Mode::kEnforce;  // an out-of-range mode word reads as enforce,
  uint32_t mode_word = 0;                // as the hot path does; the word as read
  Policy policy;
  // Breaker.
  BreakerState breaker = BreakerState::kClosed;
  uint32_t reopens = 0;
  uint32_t probe_successes = 0;   // half-open successes so far
  int64_t half_open_in_ms = 0;    // open: time until half-open (<= 0: due now)
  uint32_t probes_in_flight = 0;  // probe leases taken
  // How long the breaker has been in its state; nullopt when the slot does not say (a writer
  // that predates DependencySlot::state_since, or the instant between a transition's two
  // stores).
  std::optional<uint64_t> state_age_ms;
  // The last probe's outcome and how long ago it reported (kNone: no probe since the slot was
  // created). A worker whose library predates DependencySlot::last_probe does not report its
  // probes here: while one runs, the probe shown may be an earlier one.
  ProbeOutcome last_probe = ProbeOutcome::kNone;
  uint64_t last_probe_age_ms = 0;
  // Who last set the mode (DependencySlot::mode_setter); nullopt: nobody said.
  std::optional<uint32_t> mode_set_by_uid, mode_set_by_pid;
  // Window (ReadWindow): approximate at bucket edges.
  WindowStats window;
  // Retry budget.
  uint64_t tokens_available_milli = 0;  // thousandths of a token, RetryBudget::Available
  // Bulkhead.
  uint32_t bulkhead_in_use = 0;  // bulkhead lease words taken
  // The fleet (DependencySlot::fleet): kNone unless a fleet daemon follows this dependency.
  FleetRole fleet_role = FleetRole::kNone;
  uint32_t fleet_hosts = 0;  // hosts live in the fleet for it at the daemon's last sync
  // Cumulative counters, indexed by Counter.
  std::array<uint64_t, kCounterCount> counters{};
  // The calls' latencies (latency.h), cumulative as the counters; `latency_whole` when Delta
  // found a bucket lower than before (the slot given to another dependency in between) and
  // left the histogram whole.
  LatencyHistogram latency;
  bool latency_whole = false;

  uint64_t counter(Counter c) const { return counters[c]; }
  // IsOpen: the dependency does not pass all traffic: breaker open or half-open (enforce or
  // shadow mode), or mode forced-open. Drives status's exit code 1 and the daemon's "N open".
  bool IsOpen() const;
  // FailureRate of the window in [0, 1], nullopt when it holds no call.
  std::optional<double> FailureRate() const;
  // RetryRatio: retries granted / first attempts, nullopt with no first attempt.
  std::optional<double> RetryRatio() const;
};

// The daemon's fleet (SegmentHeader::fleet_*, daemon/fleet.h).
struct FleetStatus {
  FleetState state = FleetState::kOff;
  uint32_t hosts = 0;
  uint64_t synced_unix_ms = 0;  // 0: never synced
  uint64_t fallbacks = 0;
  uint64_t trips = 0;
  uint64_t leases = 0;
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
  FleetStatus fleet;
  // Process slots below the high-water mark whose owner word is live: what the segment says,
  // with no check that the processes still run (cheap enough for every daemon tick).
  uint32_t processes_attached = 0;
  // With BuildOptions::check_processes (else 0): registered processes checked one by one.
  uint32_t processes_live = 0;  // registered and running
  uint32_t processes_dead = 0;  // registered, no longer running (leases pending reclaim)
  uint64_t now_ns = 0;          // CLOCK_MONOTONIC the snapshot was taken at
  std::vector<DependencyStatus> dependencies;  // active ones, by name (or as BuildOptions::only)
  // Every active dependency, and those of them open (DependencyStatus::IsOpen), whatever
  // BuildOptions::only and summary_only say.
  uint32_t dependencies_active = 0;
  uint32_t dependencies_open = 0;

  bool AnyOpen() const;
};

// PidAliveFn: does `pid` exist? PidAliveByKill asks kill(pid, 0).
using PidAliveFn = std::function<bool(pid_t pid)>;
bool PidAliveByKill(pid_t pid);

struct BuildOptions {
  uint64_t now_ns = 0;  // CLOCK_MONOTONIC (PreciseNowNs)
  uint64_t stale_after_ms = 3000;
  std::vector<std::string> only;  // dependency names to show; empty: all active
  PidAliveFn pid_alive = PidAliveByKill;
  // probe_lock: ask the kernel whether a daemon holds the segment (Segment::ProbeDaemonLock:
  // two flock calls; none on the daemon's own segment). Off, the header's pid decides.
  bool probe_lock = true;
  // check_processes: fill processes_live and processes_dead by testing every registered
  // process with `process_alive` (default ProcessAliveByProc: one /proc read each).
  // Off, the view reads no file at all.
  bool check_processes = true;
  AliveFn process_alive;
  // summary_only: count the dependencies (dependencies_active, dependencies_open) from their
  // mode and breaker words, and list none: the daemon's status line.
  bool summary_only = false;
};

// BuildStatus snapshots `seg` into *out. Returns kNotFound naming the first name in
// `opt.only` that is not an active dependency (and lists the known ones); *out is then
// unchanged.
Status BuildStatus(const Segment& seg, const BuildOptions& opt, SegmentStatus* out);

// Delta returns `now` with every counter (and the latency histogram) replaced by its increase
// since `before`, matching dependencies by slot index and generation (a dependency new since
// `before` keeps its cumulative counters). Gauges (breaker, window, tokens, bulkhead) are
// `now`'s.
SegmentStatus Delta(const SegmentStatus& now, const SegmentStatus& before);

// kUnknown: an owner word whose state no retryd writes (scribbled): neither claiming nor
// attached, shown without a start time or a name.
enum class WorkerState { kLive, kDead, kClaiming, kUnknown };
const char* WorkerStateName(WorkerState s);

struct WorkerStatus {
  uint32_t slot = 0;  // process slot index; lease owner id is slot + 1
  uint32_t pid = 0;
  std::string comm;
  uint32_t own_pid = 0;     // attached through the socket: the pid as the process sees itself
                            // (another pid namespace), 0 if the same or unknown
  bool connected = false;   // attached through the daemon's socket: alive while connected
  uint64_t start_time = 0;  // clock ticks since boot (/proc/PID/stat)
  uint64_t attach_unix_ms = 0;
  uint32_t probe_leases = 0;  // leases held over every dependency
  uint32_t bulkhead_leases = 0;
  WorkerState state = WorkerState::kLive;
};

// BuildWorkers lists every registered process slot, in slot order, judging each live one
// with `alive` (nullptr: ProcessAliveByProc).
std::vector<WorkerStatus> BuildWorkers(const Segment& seg, const AliveFn& alive = nullptr);

}  // namespace retryd::shm
