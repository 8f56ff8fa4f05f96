// bench/stampede/fleet.h: the simulator's model of retryd's fleet mode (daemon/fleet.h): the
// shared store and, on every host, the daemon's fleet thread, acting on the host's real segment.
//
// Each host syncs every `sync_ms`, at its own phase (uniform in [0, sync_ms), drawn once). All
// the fleet decides, it decides at a host's sync tick, so every step costs up to a sync period:
//
//   publish  the host stores its breaker window totals (calls, failures, slow) in the store;
//            others see them from their next sync on. A report is fresh for 3 syncs. An open
//            host whose open period the model follows reports the window it opened on (no call
//            lands in it while open) with the fleet's outcome count at the time: it counts until
//            the fleet's probe next succeeds, not after (the daemon's opened_at and success_n)
//   trip     the fleet's window (the counted reports summed) has >= min_calls calls and a rate
//            at or over its threshold, and >= fleet_min_hosts hosts report failures (or slow
//            calls): a closed breaker opens (kTrip: its own open period and jitter), but for a
//            lease holder's, whose own probe answers for the fleet. The breaker's own trip
//            rule stays, between syncs.
//   floor    fleet_min_retries_per_sec and fleet_retry_burst, when set, are divided (rounded
//            up) among the hosts with a fresh report; the ratio stays the host's.
//   hold     an open breaker is held open (SetOpenUntil) past its open period until a sync
//            grants it one of fleet_half_open_probes leases, and only if no outcome came since
//            it opened and its workers called since its last sync (a call refused as open: the
//            host has traffic to probe with). A lease is free or expired: its holder renews it
//            at every sync, and it lasts 3 syncs past the last. A host that asks in vain is on
//            the waiting list for 2 syncs with its demand (calls refused per minute over its
//            open period), and no host takes a lease while a busier one waits. The lease holder
//            goes half-open and probes under its own half_open_probes and close_after; a holder
//            whose breaker is still open (no admit came) 2 syncs after the grant is held again
//            and gives the lease back if a host with more than twice its demand at the grant
//            waits, or any host once its last call is older than twice its usual gap between
//            calls (by that demand) and 2 syncs.
//   outcome  at the holder's next sync, its breaker closed publishes "success", reopened
//            publishes "failure" (not if its lease expired first: it is lost). A held host
//            that finds an outcome newer than its open period closes after uniform
//            [0, open_jitter] (kFleetClosed), or reopens at once with its backed-off period
//            (kFleetReopened).
//   outage   a sync inside a [[store_outage]] window finds the store unreachable: the host
//            gives back its hold (its breaker's own open period again), its lease and its
//            pending close, restores its own floor and burst, and decides alone, exactly as
//            the host scope, until its first sync after the window, where it rejoins.
//
// Between syncs the daemon steps (at most 100 ms apart) and notices a new open period at once:
// the model does so when the simulator tells it the breaker moved (OnBreakerMoved), and holds
// an open period that would end before the next sync until just after it. What the model
// leaves out: store latency, a store that answers some hosts and not others, and hosts that
// die (every host is live, save for its staleness after an outage).
// Thread safety: not thread-safe; one per simulation run.
#pragma once

#include <cstdint>
#include <vector>

#include "bench/stampede/scenario.h"
#include "shm/breaker.h"
#include "shm/layout.h"

namespace retryd::stampede {

struct FleetCounters {
  uint64_t trips = 0;        // breakers a sync opened on the fleet's window
  uint64_t leases = 0;       // fleet probe leases granted
  uint64_t leases_lost = 0;  // leases that expired before their holder's outcome was published
  uint64_t leases_unused = 0;  // leases given back: no admit came to probe with
  uint64_t outcomes = 0;     // outcomes published ("success" or "failure")
  uint64_t closed = 0;       // held breakers closed on the fleet's success (kFleetClosed)
  uint64_t reopened = 0;     // held breakers reopened on the fleet's failure (kFleetReopened)
  uint64_t local_syncs = 0;  // host syncs that found the store unreachable
  uint64_t fallbacks = 0;    // times a joined host lost the store and began deciding alone
};

class FleetModel {
 public:
  // FleetModel models `hosts` hosts of strategy `st` (scope kFleet) whose store is unreachable
  // in `outages`; `epoch_ns` is the shm clock at virtual time 0. The hosts' phases and the
  // fleet's jitter come from `seed` alone, never from the simulation's generator.
  FleetModel(const Strategy& st, std::vector<StoreOutage> outages, uint32_t hosts,
             uint64_t epoch_ns, uint64_t seed);

  int64_t sync_ns() const { return sync_ns_; }
  // FirstSync: virtual ns of the first sync of `host` (its phase).
  int64_t FirstSync(uint32_t host) const { return hosts_[host].phase_ns; }

  // A close to schedule: at virtual time `at_ns`, OnClose(host, token). at_ns < 0: none.
  struct Close {
    int64_t at_ns = -1;
    uint32_t token = 0;
  };
  // Sync runs the sync tick of `host` at virtual time `now_ns` on the host's slot.
  Close Sync(uint32_t host, shm::DependencySlot& slot, int64_t now_ns);
  // OnClose closes the held breaker of `host` if the close Sync scheduled still stands.
  void OnClose(uint32_t host, uint32_t token, shm::DependencySlot& slot, int64_t now_ns);
  // OnBreakerMoved: the breaker word of `host` changed its seq (an admit or a completion moved
  // it). A joined host registers a new open period and holds it to its next sync.
  void OnBreakerMoved(uint32_t host, shm::DependencySlot& slot, int64_t now_ns);

  const FleetCounters& counters() const { return counters_; }

 private:
  struct Host {
    int64_t phase_ns = 0;
    bool joined = false;  // the last sync reached the store
    uint32_t syncs_joined = 0;  // syncs since it last joined, this one included
    // The open period the host follows (its breaker's seq and drawn end), and the outcome
    // count it had seen when that period began.
    bool open_known = false;
    uint16_t open_seq = 0;
    uint64_t due_ms = 0;  // shm clock, full ms
    uint64_t outcome_n = 0;
    uint64_t open_round = 0;  // the outcome count when the period began (news does not move it)
    int64_t close_at_ns = -1;  // a close is scheduled (virtual ns); -1: none
    uint32_t close_token = 0;  // bumped to void a scheduled close
    int32_t lease = -1;        // the fleet lease held, or -1
    uint16_t lease_seq = 0;    // the open word it was granted under
    shm::WindowStats report;   // the last published window
    int64_t report_opened_at = -1;  // with it: -1 closed, else the outcome count it opened at
    uint64_t rejected_seen = 0;  // its breaker's open rejections at its last sync
    bool calling = false;        // some came since the sync before (its workers call)
    int64_t lease_taken_ns = 0;
    int64_t open_since_ns = 0;   // when the open period it follows began
    uint64_t rejected_at_open = 0;
    int64_t called_ns = INT64_MIN / 2;  // the last sync that saw a call refused as open
    uint64_t lease_demand = 0;          // its demand when it took its lease
    int64_t wanted_ns = INT64_MIN / 2;  // when it last asked for a lease in vain
    uint64_t wanted_demand = 0;         // and its demand then
    int64_t published_ns = INT64_MIN / 2;
  };
  struct Lease {
    int32_t holder = -1;
    int64_t expires_ns = 0;
  };

  bool Reachable(int64_t now_ns) const;
  int64_t NextSync(const Host& h, int64_t now_ns) const;
  uint64_t ShmNs(int64_t now_ns) const { return epoch_ns_ + uint64_t(now_ns); }
  void Register(Host& h, const shm::DependencySlot& slot, const shm::BreakerWord& b,
                int64_t now_ns);
  void Hold(Host& h, shm::DependencySlot& slot, int64_t now_ns, int64_t until_ns);
  void GoLocal(Host& h, shm::DependencySlot& slot, int64_t now_ns);
  Close Follow(uint32_t host, shm::DependencySlot& slot, int64_t now_ns);
  void SetFloor(shm::DependencySlot& slot, uint32_t floor, uint32_t burst);
  uint64_t Demand(const Host& h, int64_t now_ns) const;
  // Stopped: the lease holder's last call is older than twice its usual gap between calls (by
  // its demand at the grant) and 2 syncs.
  bool Stopped(const Host& h, int64_t now_ns) const;
  // BusierWaits: another host asked for a lease in vain within kWantedSyncs with a demand over
  // `demand`.
  bool BusierWaits(uint32_t host, uint64_t demand, int64_t now_ns) const;

  const FleetKnobs knobs_;
  const uint32_t local_floor_;
  const uint32_t local_burst_;
  const uint32_t open_jitter_ms_;
  const std::vector<StoreOutage> outages_;
  const uint64_t epoch_ns_;
  const int64_t sync_ns_;
  std::vector<Host> hosts_;
  std::vector<Lease> leases_;
  // The store's outcome: how many were published, and the last one.
  uint64_t outcome_n_ = 0;
  bool outcome_success_ = false;
  uint64_t success_n_ = 0;  // the count of the last success: open reports before it are past
  uint32_t rng_;
  FleetCounters counters_;
};

}  // namespace retryd::stampede
