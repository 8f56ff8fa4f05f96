// daemon/fleet.h: the host's daemon in a fleet of hosts, coordinated through Redis, never on
// a worker's path (docs/FLEET.md).
//
// Workers decide from the host's segment alone, as always. The daemon's fleet thread, every
// `sync` period, publishes each fleet dependency's window totals and reads the fleet's, and
// between syncs (every step, at most 100 ms apart) follows the fleet's probe:
//
//   trip     the fleet's window (the sum of every live host's) has >= min_calls calls and a
//            rate at or over its threshold, and failures come from >= fleet_min_hosts hosts:
//            a closed breaker here opens (kTrip: the breaker's own rules: seq, open period,
//            jitter), so that a host too quiet to fill its own window opens with the fleet.
//            An open host reports the window it opened on, stamped with the round its open
//            period began in, and it counts until the fleet's probe next succeeds: hosts that
//            tripped on their own open the quiet ones too. A lease holder never trips on the
//            fleet's window (its probe answers for the fleet)
//   probe    an open breaker is held open (SetOpenUntil, never past one sync period from the
//            last step that reached the store) until its own open period is over; then a host
//            whose workers called within the last sync asks for one of fleet_half_open_probes
//            fleet probe leases (a key with an expiry and this daemon's owner token); no host
//            takes one while a busier one (more calls refused per minute over its open period)
//            waits for one. A host that wins lets its breaker go half-open (its workers probe
//            under the breaker's own rules); one whose breaker is still open kUnusedLeaseSyncs
//            syncs later (no call came), or half-open with no probe out (its probe's call was
//            refused), gives the lease back if a host with more than twice its demand at the
//            grant waits, or any host once its own calls have stopped (its last one older than
//            twice its usual gap and two syncs): held again first, or reopened if half-open.
//            Otherwise it keeps the lease until its next call. A host that does not win stays
//            held until the fleet learns the outcome
//   outcome  the prober's breaker closing publishes "success": every held host closes, each
//            after its own uniform [0, open_jitter] (kFleetClosed); its breaker reopening
//            publishes "failure": every held host reopens with its backed-off period
//            (kFleetReopened). A lease is taken only if no outcome came since the host read
//            the last one (one script), so an outcome and a new lease never cross
//   floor    fleet_min_retries_per_sec and fleet_retry_burst, when set, are divided among the
//            hosts that published this dependency within three syncs (rounded up); at the
//            first sync after (re)joining, a share is at most the host's own floor and burst
//            (the hosts seen then are only those that published since the store came back)
//
// Failure is local: a store command that fails or takes longer than `timeout` drops the
// connection, and the host at once decides alone (holds given back, local floors restored,
// FleetState::kLocal in the segment, one log line); it reconnects with backoff from 250 ms to
// 30 s (through the Sentinels again, so a failover is followed) and logs the rejoin once.
//
// Keys, all under "PREFIX:" ([fleet] key_prefix): hosts (sorted set, server time),
// dep:NAME:window (hash host -> "calls failures slow opened_at ms"), dep:NAME:lease:K (owner
// token, with an expiry of three syncs, renewed every sync), dep:NAME:wanted (hash owner token
// -> "demand ms": the hosts waiting for a lease), dep:NAME:outcome (hash n, result, host, round,
// success_n, and epoch: set by the first host to read it, so that a store emptied since, whose
// counts began again, is told apart).
//
// Thread safety: Fleet's public functions may be called from the daemon's thread while the
// fleet thread runs; the fleet thread touches the segment only through its atomic words.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "daemon/config.h"
#include "daemon/fleet_store.h"
#include "shm/segment.h"

namespace retryd::daemon {

// What the fleet needs of one dependency: its fleet keys and the host's own floor and burst
// (restored whenever the host decides alone).
struct FleetDependency {
  FleetPolicy fleet;
  uint32_t local_min_retries_per_sec = 0;
  uint32_t local_retry_burst = 0;
  bool operator==(const FleetDependency&) const = default;
};

// FleetDependencies picks the fleet dependencies of `cfg`.
std::map<std::string, FleetDependency> FleetDependencies(const Config& cfg);

// FleetHostId: [fleet] host_id, or the hostname.
std::string FleetHostId(const FleetSettings& s);

class Fleet {
 public:
  Fleet(shm::Segment& segment, FleetSettings settings);
  ~Fleet();
  Fleet(const Fleet&) = delete;
  Fleet& operator=(const Fleet&) = delete;

  // Start starts the fleet thread; the segment says kLocal until the first sync.
  void Start();
  // joining: no attempt to reach the store has ended since the fleet was made (the first is
  // under way, or Start has not run): the segment's kLocal says nothing has failed yet. Once
  // false, the segment's fleet state is what the attempts found. Thread-safe.
  bool joining() const { return joining_.load(std::memory_order_acquire); }
  // Stop stops the thread, giving back what it holds: holds released, leases deleted (if the
  // store answers within the timeout), local floors restored. Idempotent.
  void Stop();
  // SetDependencies replaces the fleet dependencies (at start and on every reload): those no
  // longer in the fleet get their holds released and their local floor back. Thread-safe.
  void SetDependencies(std::map<std::string, FleetDependency> deps);

  const std::string& host_id() const { return host_id_; }

 private:
  struct Run;   // one dependency's state, fleet.cc
  void Loop();
  bool Step(uint64_t now_ns);  // false: the store failed
  bool Sync(uint64_t now_ns);
  bool Follow(const std::string& name, Run& run, uint64_t now_ns);
  void GoLocal(const std::string& why);
  void Release(Run& run, uint64_t now_ns);  // holds given back, floor restored
  shm::DependencySlot* SlotOf(const std::string& name, Run& run);
  std::string Key(const std::string& dep, const std::string& what) const;

  shm::Segment& segment_;
  const FleetSettings settings_;
  const std::string host_id_;
  const std::string token_;  // this daemon's lease owner token: host id, pid, a random number
  FleetStore store_;

  std::mutex mu_;  // guards pending_, stop_
  std::condition_variable cv_;
  bool stop_ = false;
  std::unique_ptr<std::map<std::string, FleetDependency>> pending_;
  std::atomic<bool> joining_{true};  // cleared once the first connect has ended, either way

  // The fleet thread's own.
  std::map<std::string, Run> runs_;
  bool joined_ = false;
  bool outage_logged_ = false;  // this outage of the store was logged (once per outage)
  uint32_t syncs_since_join_ = 0;
  uint64_t next_sync_ns_ = 0;
  uint64_t next_connect_ns_ = 0;
  uint64_t backoff_ms_ = 0;
  uint32_t rng_ = 0;
  std::thread thread_;
};

}  // namespace retryd::daemon
