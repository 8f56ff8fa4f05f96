// daemon/daemon.h: retryd, the control plane and janitor of one host's segment.
//
// The daemon creates or adopts the segment, publishes the configured dependencies and
// defaults into it, and then ticks: it writes a heartbeat, takes back the leases of dead
// workers and expired leases, watches for conditions that must never be silent (a full
// table, a full registry, changes made by retryctl), tells systemd how it is doing, and
// rewrites the metrics textfile. It is never on the data path: workers keep deciding from
// the segment while it is stopped or restarting.
//
// Lifecycle:
//   start    take the segment's daemon lock (a kernel lock: one daemon per segment; a second
//            is refused), create, adopt (state kept: open breakers stay open) or
//            retire-and-replace the segment; apply owner, group and mode; publish the config;
//            READY=1
//   tick     every `tick_ms` (see Tick; more often if systemd's watchdog asks for pings
//            sooner); never waits for the create lock more than kLockWaitPerPassNs (10 ms)
//   wake     a worker's exit, between ticks: the pidfd of every worker the reaper watches,
//            and the connection of every socket-attached one, are in Run's poll set
//   SIGHUP   reload the config file; a bad file is logged and the running config stays
//   SIGTERM  exit 0, leaving the segment in place for workers and the next daemon (a sealed
//            one is marked retired: its workers attach again, see Run)
//   restart  with a socket and a service manager, the sealed segment and every worker's
//            connection wait in the manager's fd store (fd_store.h): the next daemon adopts
//            both, so the memory, its state and each live worker's leases carry over
//
// Runtime changes by an operator (retryctl set-mode) last until the daemon restarts or the
// dependency's section of the config changes; a reload does not undo them otherwise.
//
// The class's member functions live by job: start.cc (create or adopt the segment), reload.cc
// (publish a config, reload), watch.cc (log what others changed, and full tables),
// metrics_file.cc (the textfile), daemon.cc (the loop and the tick). A new subsystem that talks
// to the outside gets its own file, and its fd in Run's poll set or, if it blocks, a thread of
// its own (the fleet, fleet.h; the textfile's writer, metrics_file.h: docs/ARCHITECTURE.md).
//
// Thread safety: not thread-safe. One thread owns a Daemon; signals arrive through a
// signalfd that `Run` reads, never in a handler. The fleet's thread, if any, shares only the
// segment's atomic words and Fleet's own locked hand-over of the fleet dependencies; the
// textfile's writer only the rendered text it is handed.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "daemon/attach_server.h"
#include "daemon/config.h"
#include "daemon/fleet.h"
#include "daemon/metrics_file.h"
#include "retryd/status.h"
#include "shm/admission.h"
#include "shm/registry.h"
#include "shm/segment.h"

namespace retryd::daemon {

struct DaemonOptions {
  std::string config_path;  // "" runs BuiltinConfig(); SIGHUP then reloads nothing
  std::string segment;      // overrides [daemon] segment when not empty
  uint32_t tick_ms = 0;     // overrides [daemon] tick when not 0
};

// ApplyOverrides puts the command line's --segment and --tick_ms over `cfg`.
void ApplyOverrides(const DaemonOptions& o, Config* cfg);

// ResolveOwnership looks up `d.owner` and `d.group` (getpwnam, getgrnam); an empty name gives
// -1 (leave as is). Errors name `source`, the key and the unknown name. Thread-compatible.
Status ResolveOwnership(const DaemonSettings& d, const std::string& source, uid_t* uid,
                        gid_t* gid);
// CheckPermissions refuses settings the kernel would refuse this process once it runs, naming
// the key, the user it runs as and what would make it work: an owner other than itself, or a
// group it is not in, without CAP_CHOWN (`uid`, `gid` from ResolveOwnership); a
// socket or metrics_textfile in a directory it cannot write. --check_config runs it as the
// unit's user.
Status CheckPermissions(const DaemonSettings& d, const std::string& source, uid_t uid, gid_t gid);
// MissingSocketDirectoryNote: "" when the socket's directory exists (or there is no socket);
// else a sentence naming the key and the directory, which the daemon needs at start.
std::string MissingSocketDirectoryNote(const DaemonSettings& d);
// CheckFleetFiles refuses a [fleet] password_file this process cannot read, naming the key,
// the file and the system's error. --check_config runs it as the unit's user.
Status CheckFleetFiles(const FleetSettings& f, const std::string& source);
// ResolveAllowed looks up `d.allow_users` and `d.allow_groups`; errors name the unknown one.
Status ResolveAllowed(const DaemonSettings& d, const std::string& source,
                      std::vector<uid_t>* uids, std::vector<gid_t>* gids);

// BlockDaemonSignals blocks SIGHUP, SIGTERM and SIGINT in the calling thread (and threads it
// creates later), so that they wait for the signalfd instead of killing the process.
void BlockDaemonSignals();

class Daemon {
 public:
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Start loads the config, creates or adopts the segment and publishes the config into it.
  // Stores nullptr in *out and returns the problem (config, ownership, segment) on error.
  static Status Start(const DaemonOptions& options, std::unique_ptr<Daemon>* out);

  // Run blocks SIGHUP, SIGTERM and SIGINT, notifies READY=1 and ticks until SIGTERM or
  // SIGINT. Returns the process exit code (0 on a clean stop).
  int Run();

  // Tick does one housekeeping pass at CLOCK_MONOTONIC `now_ns`: heartbeat (and the daemon's
  // pid, put back if another writer changed it), reclaim of dead owners' leases and expired
  // leases, pending dependencies, change and event logging, watchdog, status line and, when
  // due, the metrics textfile.
  void Tick(uint64_t now_ns);
  // Reap reclaims the leases of workers found dead (the reaper's pass): every tick, and at once
  // when a watched worker's pidfd says it exited.
  void Reap(uint64_t now_ns);

  // Reload re-reads the config file. On error the running config stays unchanged, every error
  // of the file is logged, a line each, and the status is returned. Otherwise each key it
  // changes is logged with its old and new value, a line per section or dependency
  // (config_diff.h). Capacity, segment, ownership and mode changes are logged and ignored
  // until a restart. A dependency that cannot be written now (the create lock is
  // held by another creator, the table is full) is logged as pending, named in the STATUS
  // line, and written by a later tick; the log says "applied" only when all of it was.
  Status Reload();

  // StatusLine: "12 dependencies, 2 open, 37 processes attached", then the last reload's
  // failure and the pending dependencies, if any.
  std::string StatusLine() const;

  const shm::Segment& segment() const { return *segment_; }
  const Config& config() const { return config_; }

 private:
  // What the daemon last saw of a dependency slot, to log changes made by others.
  struct SlotView {
    uint32_t generation = 0;
    uint32_t state = 0;
    uint32_t mode = 0;
    uint64_t breaker = 0;
    // The transition counters (opened, half_opened, closed) as of the last breaker line
    // logged: the next line accounts for every transition since, seen by the tick or not.
    uint64_t logged_transitions[3] = {0, 0, 0};
  };

  Daemon() = default;
  // The two ways to hold the segment ([daemon] socket): at its /dev/shm name (create or adopt),
  // or sealed and handed out through the socket (attach_server.h).
  Status OpenNamedSegment(const Config& cfg, uid_t uid, gid_t gid);
  Status OpenSealedSegment(const Config& cfg, uid_t uid, gid_t gid);
  Status ApplyOwnership(const DaemonSettings& d);
  // What one Publish wrote into the segment.
  struct PublishCounts {
    size_t added = 0;    // dependencies the segment did not hold active
    size_t changed = 0;  // dependencies it held, given a new policy
    size_t retired = 0;
  };
  // A dependency of the config that the segment does not hold yet: PutDependency refused
  // (another creator held the create lock, or the table was full). Tick tries it again.
  struct PendingPut {
    shm::Policy policy;
    Status::Code code = Status::Code::kOk;  // why the last try failed
    uint64_t since_ns = 0;                  // first failure
  };
  // Publish writes `cfg` into the segment; `previous` is null at start. What it cannot write
  // goes to pending_.
  PublishCounts Publish(const Config& cfg, const Config* previous);
  // Put writes one dependency, waiting for the create lock until `deadline_ns` at most (one try
  // past it), and keeps it in pending_ if refused. True if written, with its slot in *index.
  bool Put(const std::string& name, const shm::Policy& policy, uint64_t deadline_ns,
           uint32_t* index);
  // RetryPending tries pending_ again, once per kPendingRetryNs.
  void RetryPending(uint64_t now_ns);
  // PendingSummary: "2 dependencies pending, not yet in the segment (a, b): WHY", or "".
  std::string PendingSummary() const;
  void Observe(uint32_t index, bool log_changes);
  void ObserveAll(bool log_changes);
  void CheckEvents(uint64_t now_ns);
  // WriteMetrics renders the textfile and hands it to metrics_writer_ (never waits on the disk).
  void WriteMetrics(uint64_t now_ns);
  void Notify(const std::string& message);
  void ArmTimer();

  // A pass of writes (a reload, a start, one tick's retry of pending_) waits for the create
  // lock this long in total at most, then tries each remaining dependency once without
  // waiting; so a create lock held by another creator delays a tick by this much, not by 2 s
  // per dependency (the heartbeat, the reaper and the watchdog run on the tick).
  static constexpr uint64_t kLockWaitPerPassNs = 10'000'000;
  static constexpr uint64_t kPendingRetryNs = 250'000'000;

  DaemonOptions options_;
  // The config file as last loaded; the segment holds all of it but pending_.
  Config config_;
  std::map<std::string, PendingPut> pending_;
  uint64_t next_pending_try_ns_ = 0;
  std::unique_ptr<shm::Segment> segment_;
  // The socket workers attach through ([daemon] socket), or null when the segment keeps its
  // /dev/shm name.
  std::unique_ptr<AttachServer> attach_;
  // The fleet ([fleet]), or null. Declared after segment_: it stops before the segment goes.
  std::unique_ptr<Fleet> fleet_;
  FdStore fd_store_;  // the service manager's, to keep the sealed segment across restarts
  std::vector<SlotView> seen_;
  shm::Caller caller_{};
  shm::DeadOwnerReaper reaper_;
  uint32_t sweep_next_ = 0;  // next slot of the expired-lease sweep
  uint32_t sweep_pass_ = 0;  // sweeps of the whole table begun (kFullSweepEvery, daemon.cc)

  int signal_fd_ = -1;
  int timer_fd_ = -1;
  uint64_t watchdog_interval_ns_ = 0;  // 0: no watchdog
  uint64_t last_watchdog_ns_ = 0;
  uint64_t next_status_ns_ = 0;
  uint64_t next_metrics_ns_ = 0;
  // Writes the textfile off the tick ([daemon] metrics_textfile), or null until the first write.
  std::unique_ptr<MetricsFileWriter> metrics_writer_;
  std::string last_status_;
  std::string last_reload_error_;

  // Header event counters as last reported, and when (rate limit of the warnings).
  uint64_t seen_table_full_ = 0;
  uint64_t seen_registry_full_ = 0;
  uint64_t seen_unknown_dependency_ = 0;
  uint64_t next_event_report_ns_ = 0;

  // Rate limit of per-dependency change lines: at most kChangeLinesPerSecond per second.
  uint64_t change_window_start_ns_ = 0;
  uint32_t change_lines_ = 0;
  uint32_t change_lines_suppressed_ = 0;
  bool LogAllowed(uint64_t now_ns);
  uint64_t now_ns_ = 0;  // time of the current tick, for the rate limit
};

}  // namespace retryd::daemon
