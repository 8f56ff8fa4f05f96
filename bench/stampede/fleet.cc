#include "bench/stampede/fleet.h"

#include <algorithm>

#include "shm/admission.h"
#include "shm/policy.h"

namespace retryd::stampede {
namespace {

constexpr int64_t kMsNs = 1'000'000;
constexpr int64_t kFreshSyncs = 3;  // a report is fresh for 3 syncs (the daemon's rule)
constexpr int64_t kLeaseSyncs = 3;  // a lease lasts 3 syncs from its grant or last renewal
// A holder whose breaker is still open this many syncs after the grant gives the lease back.
constexpr int64_t kUnusedLeaseSyncs = 2;
// A host that asked for a lease in vain waits on the list this many syncs.
constexpr int64_t kWantedSyncs = 2;

uint64_t SplitMix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The open period's end of open word `b`, full ms (the daemon's FullUntilMs).
uint64_t FullUntilMs(const shm::DependencySlot& slot, const shm::BreakerWord& b, uint64_t now_ns) {
  if (const std::optional<uint64_t> t = shm::FullTimeMs(slot, b)) return *t;
  const uint64_t now_ms = now_ns / uint64_t(kMsNs);
  return now_ms + int64_t(int32_t(b.time_ms - uint32_t(now_ms)));
}

shm::BreakerWord Read(const shm::DependencySlot& slot) {
  return shm::BreakerWord::Decode(slot.breaker.load(std::memory_order_acquire));
}

}  // namespace

FleetModel::FleetModel(const Strategy& st, std::vector<StoreOutage> outages, uint32_t hosts,
                       uint64_t epoch_ns, uint64_t seed)
    : knobs_(st.fleet),
      local_floor_(st.policy.min_retries_per_sec),
      local_burst_(st.policy.retry_burst),
      open_jitter_ms_(st.policy.open_jitter_ms),
      outages_(std::move(outages)),
      epoch_ns_(epoch_ns),
      sync_ns_(int64_t(st.fleet.sync_ms) * kMsNs),
      hosts_(hosts),
      leases_(st.fleet.fleet_half_open_probes),
      rng_(uint32_t(SplitMix(seed ^ 0xF1EE7ull)) | 1) {
  for (uint32_t i = 0; i < hosts; ++i) {
    const uint64_t r = SplitMix(seed * 0x100000001B3ull + i);
    hosts_[i].phase_ns = int64_t(double(r >> 11) * 0x1.0p-53 * double(sync_ns_));
  }
}

bool FleetModel::Reachable(int64_t now_ns) const {
  const double t_s = double(now_ns) / 1e9;
  for (const StoreOutage& o : outages_) {
    if (o.start_s <= t_s && t_s < o.end_s) return false;
  }
  return true;
}

int64_t FleetModel::NextSync(const Host& h, int64_t now_ns) const {
  if (now_ns < h.phase_ns) return h.phase_ns;
  return h.phase_ns + ((now_ns - h.phase_ns) / sync_ns_ + 1) * sync_ns_;
}

void FleetModel::Register(Host& h, const shm::DependencySlot& slot, const shm::BreakerWord& b,
                          int64_t now_ns) {
  h.open_known = true;
  h.open_seq = b.seq;
  h.due_ms = FullUntilMs(slot, b, ShmNs(now_ns));
  h.outcome_n = outcome_n_;  // what is in the store when the period begins
  h.open_round = outcome_n_;
  h.open_since_ns = now_ns;
  h.rejected_at_open = shm::ReadCounter(slot, shm::kRejectedOpen);
  h.close_at_ns = -1;
  ++h.close_token;
}

// Hold keeps the open word the host follows open until `until_ns` (virtual), or until its own
// end if that is later.
void FleetModel::Hold(Host& h, shm::DependencySlot& slot, int64_t now_ns, int64_t until_ns) {
  const uint64_t until_ms = std::max(h.due_ms, ShmNs(until_ns) / uint64_t(kMsNs) + 1);
  shm::SetOpenUntil(slot, h.open_seq, until_ms, ShmNs(now_ns));
}

void FleetModel::SetFloor(shm::DependencySlot& slot, uint32_t floor, uint32_t burst) {
  if (slot.policy.min_retries_per_sec.load(std::memory_order_relaxed) == floor &&
      slot.policy.retry_burst.load(std::memory_order_relaxed) == burst) {
    return;
  }
  shm::FoldDeposits(slot);  // deposits made under the old cap are capped by it
  slot.policy.min_retries_per_sec.store(floor, std::memory_order_relaxed);
  slot.policy.retry_burst.store(burst, std::memory_order_relaxed);
}

void FleetModel::GoLocal(Host& h, shm::DependencySlot& slot, int64_t now_ns) {
  const shm::BreakerWord b = Read(slot);
  if (h.open_known && b.state == shm::BreakerState::kOpen && b.seq == h.open_seq) {
    // The open period as the breaker drew it: over already, the next admit goes half-open.
    shm::SetOpenUntil(slot, h.open_seq, std::max(h.due_ms, ShmNs(now_ns) / uint64_t(kMsNs)),
                      ShmNs(now_ns));
  }
  if (knobs_.fleet_min_retries_per_sec > 0 || knobs_.fleet_retry_burst > 0) {
    SetFloor(slot, local_floor_, local_burst_);
  }
  h.joined = false;
  ++counters_.fallbacks;
  h.open_known = false;
  h.lease = -1;  // the store frees it at its expiry
  h.close_at_ns = -1;
  ++h.close_token;
}

FleetModel::Close FleetModel::Sync(uint32_t host, shm::DependencySlot& slot, int64_t now_ns) {
  Host& h = hosts_[host];
  if (!Reachable(now_ns)) {
    ++counters_.local_syncs;
    if (h.joined) GoLocal(h, slot, now_ns);
    return {};
  }
  if (!h.joined) h.syncs_joined = 0;
  h.joined = true;
  ++h.syncs_joined;
  const uint64_t shm_now = ShmNs(now_ns);

  // The host's demand: a call refused as open since its last sync.
  const uint64_t rejected = shm::ReadCounter(slot, shm::kRejectedOpen);
  h.calling = rejected != h.rejected_seen;
  h.rejected_seen = rejected;
  if (h.calling) h.called_ns = now_ns;

  // Publish, then read the fleet: the fresh reports, this one included, but for those of open
  // hosts that opened before the fleet's last success. An open host's window is the one it
  // opened on, if the model follows its open period (the daemon's rule).
  const shm::BreakerWord now_b = Read(slot);
  h.report = {};
  h.report_opened_at = -1;
  if (now_b.state == shm::BreakerState::kClosed) {
    h.report = shm::ReadWindow(slot, shm_now);
  } else if (h.open_known && now_b.seq == h.open_seq) {
    h.report = shm::ReadWindow(slot, shm_now);
    h.report_opened_at = int64_t(h.open_round);
  }
  h.published_ns = now_ns;
  shm::WindowStats fleet;
  uint32_t live = 0, failing = 0;
  for (const Host& o : hosts_) {
    if (now_ns - o.published_ns >= kFreshSyncs * sync_ns_) continue;
    ++live;
    if (o.report_opened_at >= 0 && uint64_t(o.report_opened_at) < success_n_) continue;
    fleet.calls += o.report.calls;
    fleet.failures += o.report.failures;
    fleet.slow += o.report.slow;
    if (o.report.failures > 0 || o.report.slow > 0) ++failing;
  }
  // A lease holder's breaker answers for the fleet: closed by its probe, it publishes the
  // success below and must not trip first on the reports of hosts that have not heard it.
  if (h.lease < 0 && Read(slot).state == shm::BreakerState::kClosed &&
      failing >= knobs_.fleet_min_hosts &&
      shm::ShouldTrip(slot, fleet) &&
      shm::ApplyBreakerEvent(slot, shm::BreakerEvent::kTrip, shm_now, 0, rng_)) {
    ++counters_.trips;
  }
  if (knobs_.fleet_min_retries_per_sec > 0 || knobs_.fleet_retry_burst > 0) {
    const uint32_t n = std::max<uint32_t>(live, 1);
    uint32_t floor = knobs_.fleet_min_retries_per_sec > 0
                         ? (knobs_.fleet_min_retries_per_sec + n - 1) / n
                         : local_floor_;
    uint32_t burst = knobs_.fleet_retry_burst > 0
                         ? std::max<uint32_t>((knobs_.fleet_retry_burst + n - 1) / n, 1)
                         : local_burst_;
    // The daemon's rule: at the first sync after joining, at most the host's own.
    if (h.syncs_joined == 1) {
      floor = std::min(floor, local_floor_);
      burst = std::max<uint32_t>(std::min(burst, local_burst_), 1);
    }
    SetFloor(slot, floor, burst);
  }
  return Follow(host, slot, now_ns);
}

FleetModel::Close FleetModel::Follow(uint32_t host, shm::DependencySlot& slot, int64_t now_ns) {
  Host& h = hosts_[host];
  const uint64_t shm_now = ShmNs(now_ns);
  const uint64_t now_ms = shm_now / uint64_t(kMsNs);
  shm::BreakerWord b = Read(slot);

  if (h.lease >= 0) {
    Lease& l = leases_[size_t(h.lease)];
    const bool mine = l.holder == int32_t(host) && now_ns < l.expires_ns;
    const bool ended = b.state == shm::BreakerState::kClosed ||
                       (b.state == shm::BreakerState::kOpen && b.seq != h.lease_seq);
    if (ended && mine) {
      // The prober's half-open ended: its outcome is the fleet's.
      ++outcome_n_;
      outcome_success_ = b.state == shm::BreakerState::kClosed;
      if (outcome_success_) success_n_ = outcome_n_;
      ++counters_.outcomes;
      l.holder = -1;
      h.lease = -1;
      h.outcome_n = outcome_n_;  // its own outcome is no news to it
      if (b.state == shm::BreakerState::kClosed) return {};
    } else if (!mine) {
      ++counters_.leases_lost;  // expired before an outcome: another host may probe
      if (l.holder == int32_t(host)) l.holder = -1;
      h.lease = -1;
    } else if (b.state == shm::BreakerState::kOpen && b.seq == h.lease_seq &&
               now_ns - h.lease_taken_ns >= kUnusedLeaseSyncs * sync_ns_ &&
               BusierWaits(host, Stopped(h, now_ns) ? 0 : 2 * h.lease_demand, now_ns)) {
      // No admit took it half-open, and a host with more than twice its demand at the grant
      // waits (or any host, its calls having stopped): held again, and the lease goes back.
      ++counters_.leases_unused;
      l.holder = -1;
      h.lease = -1;
      h.calling = false;
      Hold(h, slot, now_ns, NextSync(h, now_ns));
      return {};
    } else {
      l.expires_ns = now_ns + kLeaseSyncs * sync_ns_;  // still probing: renewed
      return {};
    }
  }
  if (b.state != shm::BreakerState::kOpen) return {};
  // A period the step did not see (opened by this sync's trip): it begins now.
  if (!h.open_known || b.seq != h.open_seq) Register(h, slot, b, now_ns);
  if (h.close_at_ns >= 0) {  // closing on the fleet's success: held until then
    Hold(h, slot, now_ns, std::max(h.close_at_ns, NextSync(h, now_ns)));
    return {};
  }
  if (outcome_n_ != h.outcome_n) {
    h.outcome_n = outcome_n_;
    if (outcome_success_) {
      const uint32_t jitter =
          open_jitter_ms_ > 0 ? shm::NextRandom(rng_) % (open_jitter_ms_ + 1) : 0;
      h.close_at_ns = now_ns + int64_t(jitter) * kMsNs;
      Hold(h, slot, now_ns, std::max(h.close_at_ns, NextSync(h, now_ns)));
      return {h.close_at_ns, h.close_token};
    }
    if (shm::ApplyBreakerEvent(slot, shm::BreakerEvent::kFleetReopened, shm_now, 0, rng_)) {
      ++counters_.reopened;
      b = Read(slot);
      Register(h, slot, b, now_ns);
      Hold(h, slot, now_ns, NextSync(h, now_ns));
    }
    return {};
  }
  if (now_ms >= h.due_ms && h.calling) {
    const uint64_t demand = Demand(h, now_ns);
    const bool busier = BusierWaits(host, demand, now_ns);
    for (size_t k = 0; k < leases_.size() && !busier; ++k) {
      Lease& l = leases_[k];
      if (l.holder >= 0 && now_ns < l.expires_ns) continue;
      l.holder = int32_t(host);
      l.expires_ns = now_ns + kLeaseSyncs * sync_ns_;
      h.lease = int32_t(k);
      h.lease_seq = b.seq;
      h.lease_taken_ns = now_ns;
      h.lease_demand = demand;
      h.wanted_ns = INT64_MIN / 2;
      ++counters_.leases;
      // Let it go: the next admit takes the breaker half-open.
      shm::SetOpenUntil(slot, h.open_seq, std::max(h.due_ms, now_ms), shm_now);
      return {};
    }
    h.wanted_ns = now_ns;  // in vain: on the waiting list
    h.wanted_demand = demand;
  }
  Hold(h, slot, now_ns, NextSync(h, now_ns));
  return {};
}

bool FleetModel::Stopped(const Host& h, int64_t now_ns) const {
  const int64_t gap_ns = int64_t(60'000'000'000ull / std::max<uint64_t>(h.lease_demand, 1));
  return now_ns - h.called_ns > 2 * gap_ns + 2 * sync_ns_;
}

uint64_t FleetModel::Demand(const Host& h, int64_t now_ns) const {
  return (h.rejected_seen - std::min(h.rejected_seen, h.rejected_at_open)) * 60'000'000'000ull /
         uint64_t(std::max(now_ns - h.open_since_ns, sync_ns_));
}

bool FleetModel::BusierWaits(uint32_t host, uint64_t demand, int64_t now_ns) const {
  for (uint32_t i = 0; i < hosts_.size(); ++i) {
    const Host& o = hosts_[i];
    if (i != host && now_ns - o.wanted_ns <= kWantedSyncs * sync_ns_ && o.wanted_demand > demand) {
      return true;
    }
  }
  return false;
}

void FleetModel::OnClose(uint32_t host, uint32_t token, shm::DependencySlot& slot, int64_t now_ns) {
  Host& h = hosts_[host];
  if (!h.joined || token != h.close_token || h.close_at_ns < 0) return;
  h.close_at_ns = -1;
  const shm::BreakerWord b = Read(slot);
  if (b.state != shm::BreakerState::kOpen || b.seq != h.open_seq) return;
  if (shm::ApplyBreakerEvent(slot, shm::BreakerEvent::kFleetClosed, ShmNs(now_ns), 0, rng_)) {
    ++counters_.closed;
  }
}

void FleetModel::OnBreakerMoved(uint32_t host, shm::DependencySlot& slot, int64_t now_ns) {
  Host& h = hosts_[host];
  if (!h.joined) return;
  const shm::BreakerWord b = Read(slot);
  if (b.state != shm::BreakerState::kOpen || (h.open_known && b.seq == h.open_seq)) return;
  const uint64_t seen = h.outcome_n;
  const bool prober = h.lease >= 0;
  Register(h, slot, b, now_ns);
  if (prober) h.outcome_n = seen;  // its outcome is published at its sync, not news to it
  Hold(h, slot, now_ns, NextSync(h, now_ns));
}

}  // namespace retryd::stampede
