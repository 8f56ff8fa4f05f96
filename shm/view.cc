#include "shm/view.h"

#include <signal.h>

#include <algorithm>
#include <cerrno>

#include "shm/clock.h"
#include "shm/leases.h"
#include "shm/memory_order.h"
#include "shm/policy.h"
#include "shm/registry.h"
#include "shm/retry_budget.h"
#include "shm/stripes.h"

namespace retryd::shm {
namespace {

constexpr auto kAcquire = std::memory_order_acquire;

uint32_t CountTaken(const std::atomic<uint64_t>* words, uint32_t count) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < count; ++i) n += words[i].load(kRelaxed) != 0 ? 1 : 0;
  return n;
}

// SlotsInUse: the dependency slots ever used, never more than the table holds.
uint32_t SlotsInUse(const Segment& seg) {
  return std::min(seg.header().dependency_high_water.load(kAcquire), seg.max_dependencies());
}

DependencyStatus ReadDependency(const DependencySlot& slot, uint32_t index, uint64_t now_ns) {
  DependencyStatus d;
  d.index = index;
  d.generation = slot.generation.load(kAcquire);
  d.name = ReadName(slot);
  d.mode_word = slot.mode.load(kRelaxed);
  d.mode = d.mode_word < kModeCount ? Mode(d.mode_word) : Mode::kEnforce;
  const BreakerWord b = BreakerWord::Decode(slot.breaker.load(kAcquire));
  d.breaker = b.state;
  d.policy = LoadPolicy(slot.policy);
  d.policy.mode = d.mode;

  const uint32_t now_ms = NsToMs32(now_ns);
  d.reopens = b.reopens;
  d.probe_successes = b.state == BreakerState::kHalfOpen ? b.successes : 0;
  if (b.state == BreakerState::kOpen) {
    // What the next admit would find: the full time when known, else the 32-bit rule, under
    // which a deadline a month old has passed (so 0, due now, not the wrapped difference).
    const int64_t in_ms = int32_t(b.time_ms - now_ms);
    if (const std::optional<uint64_t> until_ms = FullTimeMs(slot, b)) {
      d.half_open_in_ms = int64_t(*until_ms) - int64_t(now_ns / 1'000'000u);
    } else {
      d.half_open_in_ms = OpenPeriodOver(slot, b, now_ns) ? std::min<int64_t>(in_ms, 0) : in_ms;
    }
  }
  d.probes_in_flight = CountTaken(slot.probe_leases, kMaxProbes);
  const uint64_t now_full_ms = now_ns / 1'000'000u;
  const uint64_t since = slot.state_since.load(kRelaxed);
  if (BreakerTime::Ms(since) != 0 && BreakerTime::Seq(since) == b.seq) {
    const uint64_t at_ms = BreakerTime::Ms(since);
    d.state_age_ms = now_full_ms > at_ms ? now_full_ms - at_ms : 0;
  }
  const uint64_t probe = slot.last_probe.load(kRelaxed);
  d.last_probe = ProbeReport::Outcome(probe);
  if (d.last_probe != ProbeOutcome::kNone) {
    d.last_probe_age_ms =
        now_full_ms > ProbeReport::Ms(probe) ? now_full_ms - ProbeReport::Ms(probe) : 0;
  }
  const uint64_t setter = slot.mode_setter.load(kRelaxed);
  if (ModeSetter::Known(setter)) {
    d.mode_set_by_uid = ModeSetter::Uid(setter);
    d.mode_set_by_pid = ModeSetter::Pid(setter);
  }

  d.window = ReadWindow(slot, now_ns);
  // What a withdrawal would find: the word refilled, plus the deposits the stripes hold.
  d.tokens_available_milli = std::min<uint64_t>(
      uint64_t{d.policy.retry_burst} * RetryBudget::kTokenScale,
      RetryBudget::Available(slot.budget.load(kRelaxed), now_ms, d.policy.min_retries_per_sec,
                             d.policy.retry_burst) +
          PendingDeposits(slot));
  d.bulkhead_in_use = CountTaken(slot.bulkhead_leases, kMaxBulkhead);
  const uint64_t fleet = slot.fleet.load(kRelaxed);
  d.fleet_role = FleetWord::Role(fleet);
  d.fleet_hosts = FleetWord::Hosts(fleet);
  for (uint32_t c = 0; c < kCounterCount; ++c) d.counters[c] = ReadCounter(slot, Counter(c));
  d.latency = ReadLatency(slot);
  return d;
}

}  // namespace

const char* DaemonStateName(DaemonState s) {
  switch (s) {
    case DaemonState::kUp:
      return "up";
    case DaemonState::kStale:
      return "stale";
    case DaemonState::kDown:
      return "down";
  }
  return "down";
}

const char* WorkerStateName(WorkerState s) {
  switch (s) {
    case WorkerState::kLive:
      return "live";
    case WorkerState::kDead:
      return "dead";
    case WorkerState::kClaiming:
      return "claiming";
    case WorkerState::kUnknown:
      return "unknown";
  }
  return "dead";
}

bool PidAliveByKill(pid_t pid) {
  if (pid <= 0) return false;
  // EPERM: the process exists but belongs to someone else.
  return kill(pid, 0) == 0 || errno == EPERM;
}

bool DependencyStatus::IsOpen() const {
  if (mode == Mode::kForcedOpen) return true;
  if (mode == Mode::kDisabled) return false;
  return breaker != BreakerState::kClosed;
}

std::optional<double> DependencyStatus::FailureRate() const {
  if (window.calls == 0) return std::nullopt;
  return double(window.failures) / double(window.calls);
}

std::optional<double> DependencyStatus::RetryRatio() const {
  const uint64_t first = counter(kFirstAttempts);
  if (first == 0) return std::nullopt;
  return double(counter(kRetriesGranted)) / double(first);
}

bool SegmentStatus::AnyOpen() const {
  return std::any_of(dependencies.begin(), dependencies.end(),
                     [](const DependencyStatus& d) { return d.IsOpen(); });
}

Status BuildStatus(const Segment& seg, const BuildOptions& opt, SegmentStatus* out) {
  const SegmentHeader& h = seg.header();
  SegmentStatus s;
  s.name = seg.name();
  s.now_ns = opt.now_ns;
  s.layout_version = h.layout_version.load(kRelaxed);
  s.generation = h.generation.load(kAcquire);
  s.created_unix_ms = h.created_unix_ms.load(kRelaxed);
  s.max_dependencies = seg.max_dependencies();
  s.max_processes = seg.max_processes();
  s.auto_create = (h.flags.load(kRelaxed) & kFlagAutoCreate) != 0;
  s.table_full_events = h.table_full_events.load(kRelaxed);
  s.registry_full_events = h.registry_full_events.load(kRelaxed);
  s.unknown_dependency_events = h.unknown_dependency_events.load(kRelaxed);
  const uint32_t fleet_state = h.fleet_state.load(kRelaxed);
  s.fleet.state = fleet_state <= 2 ? FleetState(fleet_state) : FleetState::kOff;
  s.fleet.hosts = h.fleet_hosts.load(kRelaxed);
  s.fleet.synced_unix_ms = h.fleet_synced_unix_ms.load(kRelaxed);
  s.fleet.fallbacks = h.fleet_fallbacks.load(kRelaxed);
  s.fleet.trips = h.fleet_trips.load(kRelaxed);
  s.fleet.leases = h.fleet_leases.load(kRelaxed);

  DaemonStatus& d = s.daemon;
  d.pid = h.daemon_pid.load(kAcquire);
  d.pid_alive = d.pid != 0 && opt.pid_alive && opt.pid_alive(pid_t(d.pid));
  d.heartbeat_ns = h.heartbeat_ns.load(kAcquire);
  d.heartbeat_unix_ms = h.heartbeat_unix_ms.load(kRelaxed);
  if (d.heartbeat_ns != 0) {
    d.heartbeat_age_ms =
        opt.now_ns > d.heartbeat_ns ? (opt.now_ns - d.heartbeat_ns) / 1'000'000 : 0;
  }
  d.lock = opt.probe_lock ? seg.ProbeDaemonLock() : DaemonLock::kUnknown;
  const bool held = d.lock == DaemonLock::kHeldHere || d.lock == DaemonLock::kHeld;
  if (!held && (d.pid == 0 || !d.pid_alive)) {
    d.state = DaemonState::kDown;
  } else if (!d.heartbeat_age_ms || *d.heartbeat_age_ms > opt.stale_after_ms) {
    d.state = DaemonState::kStale;
  } else {
    d.state = DaemonState::kUp;
  }

  for (uint32_t i = 0; i < seg.process_high_water(); ++i) {
    s.processes_attached +=
        ProcessOwner::Decode(seg.process(i)->owner.load(kRelaxed)).attached();
  }
  if (opt.check_processes) {
    for (const WorkerStatus& w : BuildWorkers(seg, opt.process_alive)) {
      if (w.state == WorkerState::kLive) ++s.processes_live;
      if (w.state == WorkerState::kDead) ++s.processes_dead;
    }
  }

  const uint32_t used = SlotsInUse(seg);
  for (uint32_t i = 0; i < used; ++i) {
    const DependencySlot& slot = *seg.dependency(i);
    if (slot.state.load(kAcquire) != uint32_t(SlotState::kActive)) continue;
    if (opt.summary_only) {
      // The two words IsOpen reads, as ReadDependency reads them.
      DependencyStatus d;
      d.mode_word = slot.mode.load(kRelaxed);
      d.mode = d.mode_word < kModeCount ? Mode(d.mode_word) : Mode::kEnforce;
      d.breaker = BreakerWord::Decode(slot.breaker.load(kAcquire)).state;
      ++s.dependencies_active;
      s.dependencies_open += d.IsOpen() ? 1 : 0;
      continue;
    }
    s.dependencies.push_back(ReadDependency(slot, i, opt.now_ns));
    ++s.dependencies_active;
    s.dependencies_open += s.dependencies.back().IsOpen() ? 1 : 0;
  }
  std::sort(s.dependencies.begin(), s.dependencies.end(),
            [](const DependencyStatus& a, const DependencyStatus& b) { return a.name < b.name; });

  if (!opt.only.empty()) {
    std::vector<DependencyStatus> picked;
    for (const std::string& want : opt.only) {
      auto it = std::find_if(s.dependencies.begin(), s.dependencies.end(),
                             [&](const DependencyStatus& x) { return x.name == want; });
      if (it == s.dependencies.end()) {
        std::string known;
        for (const DependencyStatus& x : s.dependencies)
          known += (known.empty() ? "" : ", ") + x.name;
        return Status::NotFound("no dependency '" + want + "' in segment '" + s.name +
                                "' (known: " + (known.empty() ? "none" : known) + ")");
      }
      if (std::none_of(picked.begin(), picked.end(),
                       [&](const DependencyStatus& x) { return x.index == it->index; })) {
        picked.push_back(*it);
      }
    }
    s.dependencies = std::move(picked);
  }
  *out = std::move(s);
  return Status::Ok();
}

SegmentStatus Delta(const SegmentStatus& now, const SegmentStatus& before) {
  SegmentStatus out = now;
  for (DependencyStatus& d : out.dependencies) {
    auto it = std::find_if(before.dependencies.begin(), before.dependencies.end(),
                           [&](const DependencyStatus& b) {
                             return b.index == d.index && b.generation == d.generation;
                           });
    if (it == before.dependencies.end()) continue;
    for (uint32_t c = 0; c < kCounterCount; ++c) {
      // A counter never goes down; if it does (slot reassigned in between), show it whole.
      if (d.counters[c] >= it->counters[c]) d.counters[c] -= it->counters[c];
    }
    // The histogram as the counters: its buckets never go down (the sum wraps modulo 2^64).
    bool went_down = false;
    for (uint32_t b = 0; b < kLatencyBuckets; ++b) {
      went_down |= d.latency.buckets[b] < it->latency.buckets[b];
    }
    d.latency_whole = went_down;
    if (!went_down) {
      for (uint32_t b = 0; b < kLatencyBuckets; ++b) d.latency.buckets[b] -= it->latency.buckets[b];
      d.latency.sum_us -= it->latency.sum_us;
    }
  }
  return out;
}

std::vector<WorkerStatus> BuildWorkers(const Segment& seg, const AliveFn& alive_in) {
  const AliveFn alive = alive_in ? alive_in : ProcessAliveByProc;
  std::vector<WorkerStatus> workers;
  for (uint32_t i = 0; i < seg.max_processes(); ++i) {
    const ProcessSlot& p = *seg.process(i);
    const uint64_t word = p.owner.load(kAcquire);
    if (word == 0) continue;
    const ProcessOwner owner = ProcessOwner::Decode(word);
    WorkerStatus w;
    w.slot = i;
    w.pid = uint32_t(owner.pid);
    if (!owner.attached()) {
      // A start time and a name are the owner's only once it is attached (registry.h): a slot
      // being claimed may still show its previous owner's.
      w.state = owner.state == ProcessState::kClaiming ? WorkerState::kClaiming
                                                       : WorkerState::kUnknown;
      workers.push_back(std::move(w));
      continue;
    }
    w.start_time = p.start_time.load(kRelaxed);
    w.attach_unix_ms = p.attach_unix_ms.load(kRelaxed);
    char comm[17] = {};
    for (int k = 0; k < 2; ++k) {
      const uint64_t word = p.comm[k].load(kRelaxed);
      for (int b = 0; b < 8; ++b) comm[k * 8 + b] = char(word >> (8 * b));
    }
    for (char& c : comm) {
      if (c != '\0' && (c < 0x20 || c == 0x7f)) c = '?';  // never print control bytes
    }
    w.comm = comm;
    if (owner.connected()) {
      // The daemon frees a connected slot the moment its connection closes: it is live.
      w.connected = true;
      const uint32_t own = uint32_t(p.own_pid.load(kRelaxed));
      w.own_pid = own != w.pid ? own : 0;
      w.state = WorkerState::kLive;
    } else {
      w.state = alive(pid_t(w.pid), w.start_time) ? WorkerState::kLive : WorkerState::kDead;
    }
    workers.push_back(std::move(w));
  }
  if (workers.empty()) return workers;

  // Lease words name their owner as slot index + 1: count them over every dependency slot.
  std::vector<uint32_t> by_slot_probe(seg.max_processes() + 1, 0);
  std::vector<uint32_t> by_slot_bulkhead(seg.max_processes() + 1, 0);
  const uint32_t used = SlotsInUse(seg);
  for (uint32_t i = 0; i < used; ++i) {
    const DependencySlot& slot = *seg.dependency(i);
    for (const auto& word : slot.probe_leases) {
      const uint64_t w = word.load(kRelaxed);
      const uint16_t owner = Lease::Owner(w);
      if (w != 0 && owner != 0 && owner <= seg.max_processes()) ++by_slot_probe[owner];
    }
    for (const auto& word : slot.bulkhead_leases) {
      const uint64_t w = word.load(kRelaxed);
      const uint16_t owner = Lease::Owner(w);
      if (w != 0 && owner != 0 && owner <= seg.max_processes()) ++by_slot_bulkhead[owner];
    }
  }
  for (WorkerStatus& w : workers) {
    w.probe_leases = by_slot_probe[w.slot + 1];
    w.bulkhead_leases = by_slot_bulkhead[w.slot + 1];
  }
  return workers;
}

}  // namespace retryd::shm
