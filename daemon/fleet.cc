#include "daemon/fleet.h"

#include <glog/logging.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <sstream>

#include "daemon/units.h"
#include "shm/admission.h"
#include "shm/breaker.h"
#include "shm/clock.h"
#include "shm/leases.h"
#include "shm/memory_order.h"
#include "shm/policy.h"
#include "shm/stripes.h"

namespace retryd::daemon {
namespace {

// The step: how often an open breaker's hold, lease and the fleet's outcome are looked at.
constexpr uint64_t kMaxStepMs = 100;
constexpr uint64_t kMinBackoffMs = 250;
constexpr uint64_t kMaxBackoffMs = 30'000;
// A host's report counts for this many syncs; its lease lives as long unless renewed.
constexpr uint32_t kFreshSyncs = 3;
// A lease whose holder's breaker has not gone half-open this many syncs after it was taken
// (no admit came: the host went quiet) is given back if a host with more calls waits for it,
// and that host asks again only after its workers call once more: the fleet's probe goes to
// the host with the most traffic. With no busier host waiting, the holder keeps it until its
// next call probes.
constexpr uint32_t kUnusedLeaseSyncs = 2;
// A host that asked for a lease in vain is on the waiting list (its demand: the calls its
// breaker refused per minute over its open period) for this many syncs.
constexpr uint32_t kWantedSyncs = 2;

// Every script reads the store's own clock (TIME), so hosts' clocks need not agree.
//
// KEYS[1] the windows, KEYS[2] the outcome; ARGV: host, "calls failures slow opened_at", the
// key's expiry, the freshness, the store's epoch the host read when its open period began ("":
// none), an epoch for a store that has none yet (as kReadOutcome). A report of an open period
// whose epoch is not the store's is of a period begun before the store: kBeforeThisStore, from
// the host's first report after the store was emptied, not only once its next step reads it.
// opened_at is -1 for a closed host; for an open one, the outcome count it read when its open
// period began, or kBeforeThisStore. An open host's window is the failures it opened on: it
// counts until the fleet's probe succeeds (the outcome's success_n), not after, so that the
// hosts closing on that success do not trip again on the past. One of a period begun before
// the store was emptied (which may have lost that success) counts only beside a current report
// with failures: it confirms a downstream failing now, and never trips a host alone.
constexpr int64_t kBeforeThisStore = -2;
constexpr const char* kPublishWindow = R"lua(
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local epoch = ARGV[6]
if redis.call('HSETNX', KEYS[2], 'epoch', ARGV[6]) == 0 then
  epoch = redis.call('HGET', KEYS[2], 'epoch')
end
local mine = ARGV[2]
if ARGV[5] ~= '' and ARGV[5] ~= epoch then mine = (string.gsub(mine, '%-?%d+$', '-2')) end
redis.call('HSET', KEYS[1], ARGV[1], mine .. ' ' .. now)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
local success_n = tonumber(redis.call('HGET', KEYS[2], 'success_n') or '0')
local all = redis.call('HGETALL', KEYS[1])
local out = {}
local before = {}
local failing_now = false
for i = 1, #all, 2 do
  local v = all[i + 1]
  local ms = tonumber(string.match(v, '(%d+)$')) or 0
  local failures, slow, opened_at = string.match(v, '^%d+ (%d+) (%d+) (%-?%d+) %d+$')
  opened_at = tonumber(opened_at or '-1')
  if now - ms > tonumber(ARGV[4]) then
    redis.call('HDEL', KEYS[1], all[i])
  elseif opened_at == -1 or opened_at >= success_n then
    table.insert(out, v)
    if tonumber(failures or '0') > 0 or tonumber(slow or '0') > 0 then failing_now = true end
  elseif opened_at == -2 then
    table.insert(before, v)
  end
end
if failing_now then
  for _, v in ipairs(before) do table.insert(out, v) end
end
return out
)lua";

constexpr const char* kJoinHosts = R"lua(
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return redis.call('ZCARD', KEYS[1])
)lua";

// KEYS[1] the outcome, KEYS[2] the waiting list, KEYS[3..] the leases; ARGV: the outcome count
// the host last read, its token, the lease's expiry, its demand (calls refused lately), how long
// a wish stays on the list. The host with the most demand among those waiting takes the lease:
// a quieter one waits (on the list) while a busier one's wish is fresh. Returns the lease
// taken, -1 if an outcome came since, -2 if every lease is taken, -3 if a busier host waits.
constexpr const char* kAcquireLease = R"lua(
local n = tonumber(redis.call('HGET', KEYS[1], 'n') or '0')
if n ~= tonumber(ARGV[1]) then return -1 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local demand = tonumber(ARGV[4])
local busier = false
local all = redis.call('HGETALL', KEYS[2])
for i = 1, #all, 2 do
  local d, ms = string.match(all[i + 1], '^(%d+) (%d+)$')
  if not ms or now - tonumber(ms) > tonumber(ARGV[5]) then
    redis.call('HDEL', KEYS[2], all[i])
  elseif all[i] ~= ARGV[2] and tonumber(d) > demand then
    busier = true
  end
end
if not busier then
  for i = 3, #KEYS do
    if redis.call('SET', KEYS[i], ARGV[2], 'NX', 'PX', ARGV[3]) then
      redis.call('HDEL', KEYS[2], ARGV[2])
      return i - 3
    end
  end
end
redis.call('HSET', KEYS[2], ARGV[2], demand .. ' ' .. now)
redis.call('PEXPIRE', KEYS[2], ARGV[5])
if busier then return -3 end
return -2
)lua";

// KEYS[1] the waiting list; ARGV: the holder's token, how long a wish stays on the list, a
// demand. Returns 1 if a host with more than that demand waits for a lease.
constexpr const char* kLeaseWanted = R"lua(
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local d, ms = string.match(all[i + 1], '^(%d+) (%d+)$')
  if ms and all[i] ~= ARGV[1] and now - tonumber(ms) <= tonumber(ARGV[2]) and
     tonumber(d) > tonumber(ARGV[3]) then
    return 1
  end
end
return 0
)lua";

constexpr const char* kRenewLease = R"lua(
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
)lua";

// KEYS[1] the outcome, KEYS[2] the lease; ARGV: result, host, token, and the round: the outcome
// count the lease was taken at. Publishes only while the lease is this host's: a prober whose
// lease expired speaks for itself alone. A success also becomes success_n, before which no open
// host's window counts (kPublishWindow). Returns the new outcome count, or -1.
constexpr const char* kPublishOutcome = R"lua(
if redis.call('GET', KEYS[2]) ~= ARGV[3] then return -1 end
redis.call('DEL', KEYS[2])
local n = redis.call('HINCRBY', KEYS[1], 'n', 1)
redis.call('HSET', KEYS[1], 'result', ARGV[1], 'host', ARGV[2], 'round', ARGV[4])
if ARGV[1] == 'success' then redis.call('HSET', KEYS[1], 'success_n', n) end
return n
)lua";

// KEYS[1] the outcome; ARGV[1] an epoch for a store that has none yet. Returns the count, the
// result, its round, the last success's count and the epoch: a store restarted empty, or
// flushed, has a new epoch, and its counts start again at 0.
constexpr const char* kReadOutcome = R"lua(
redis.call('HSETNX', KEYS[1], 'epoch', ARGV[1])
return redis.call('HMGET', KEYS[1], 'n', 'result', 'round', 'success_n', 'epoch')
)lua";

// KEYS[1] the windows; ARGV: a success's outcome count, the freshness. Returns how many fresh
// reports are of hosts that opened in a round at or after that success: as many as the
// fleet's min_hosts, and the fleet tripped again after it (one host alone may trip on its own).
constexpr const char* kOpenedSince = R"lua(
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = 0
for _, v in ipairs(redis.call('HVALS', KEYS[1])) do
  local ms = tonumber(string.match(v, '(%d+)$')) or 0
  local opened_at = tonumber(string.match(v, '^%d+ %d+ %d+ (%-?%d+) %d+$') or '-1')
  if now - ms <= tonumber(ARGV[2]) and opened_at >= tonumber(ARGV[1]) then n = n + 1 end
end
return n
)lua";

constexpr const char* kReleaseLease = R"lua(
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
)lua";

uint64_t FullUntilMs(const shm::DependencySlot& slot, const shm::BreakerWord& b,
                     uint64_t now_ns) {
  if (const std::optional<uint64_t> t = shm::FullTimeMs(slot, b)) return *t;
  const uint64_t now_ms = now_ns / kMsNs;
  return now_ms + int64_t(int32_t(b.time_ms - uint32_t(now_ms)));
}

// StoreIfChanged writes `w` only if it changes it: the words written here share cache lines with
// those every admit reads (the policy, the breaker's line), which a needless store would take
// from every core's cache.
template <typename T>
void StoreIfChanged(std::atomic<T>& w, T v) {
  if (w.load(kRelaxed) != v) w.store(v, kRelaxed);
}

// StoreBudget gives the slot's retry budget a new floor and burst. A new burst is stored only
// after the deposits waiting in the stripes are folded under the burst they were made with
// (FoldDeposits, admission.h): folded later, they would fill a raised burst with first attempts
// that the old one capped.
void StoreBudget(shm::DependencySlot& slot, uint32_t min_retries_per_sec, uint32_t burst) {
  if (slot.policy.retry_burst.load(kRelaxed) != burst) shm::FoldDeposits(slot);
  StoreIfChanged(slot.policy.min_retries_per_sec, min_retries_per_sec);
  StoreIfChanged(slot.policy.retry_burst, burst);
}

// ProbeOut: a probe lease of half-open `seq` is taken. An expired one counts: its probe hangs,
// and the probe's timeout (an admit, or the sweep) reopens the breaker, which is published as
// the fleet's probe failing.
bool ProbeOut(const shm::DependencySlot& slot, uint16_t seq) {
  for (const std::atomic<uint64_t>& word : slot.probe_leases) {
    const uint64_t w = word.load(std::memory_order_acquire);
    if (w != 0 && shm::Lease::Tag(w) == seq) return true;
  }
  return false;
}

std::string MakeToken(const std::string& host) {
  std::random_device rd;
  std::ostringstream s;
  s << host << ":" << getpid() << ":" << std::hex << ((uint64_t(rd()) << 32) | rd());
  return s.str();
}

}  // namespace

struct Fleet::Run {
  FleetDependency cfg;
  int32_t index = -1;
  uint32_t generation = 0;
  bool seen = false;                // the word below was read once
  uint16_t seq = 0;                 // the breaker seq last followed
  uint64_t due_ms = 0;              // the open period's own end, before any hold
  bool held = false;                // its end moved by this daemon
  int32_t lease = -1;               // the fleet probe lease held, or -1
  int64_t lease_round = 0;          // the outcome count it was taken at: its round
  uint64_t lease_taken_ns = 0;
  uint64_t next_renew_ns = 0;
  uint64_t rejected_seen = 0;       // the breaker's rejections counted at the last step
  uint64_t called_ns = 0;           // when a step last saw a new rejection
  uint64_t open_since_ns = 0;       // when this open period was first seen
  uint64_t rejected_at_open = 0;    // the rejections counted then
  uint64_t next_unused_check_ns = 0;  // an unused lease kept (no busier host waits): next look
  uint64_t lease_demand = 0;        // the host's demand when it took its lease
  int64_t outcome_n = 0;            // the fleet's outcome count last read (news moves it)
  int64_t open_round = 0;           // the outcome count when this open period began, or
                                    // kBeforeThisStore (it began before the store it reads)
  std::string open_epoch;           // the store's epoch then (kReadOutcome)
  bool followed_open = false;       // open_round is the round the open period of `seq` began in
  int64_t lost_round = -1;          // the round of a lease lost before its probe reported, or -1
  uint64_t close_at_ms = 0;         // a jittered close pending (the fleet's probe succeeded)
  uint32_t hosts = 0;               // live hosts at the last sync
};

std::map<std::string, FleetDependency> FleetDependencies(const Config& cfg) {
  std::map<std::string, FleetDependency> out;
  if (!cfg.fleet.enabled()) return out;
  for (const auto& [name, f] : cfg.fleet_policies) {
    if (!f.fleet) continue;
    const shm::Policy& p = cfg.dependencies.at(name);
    out[name] = {f, p.min_retries_per_sec, p.retry_burst};
  }
  return out;
}

std::string FleetHostId(const FleetSettings& s) {
  if (!s.host_id.empty()) return s.host_id;
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

Fleet::Fleet(shm::Segment& segment, FleetSettings settings)
    : segment_(segment),
      settings_(std::move(settings)),
      host_id_(FleetHostId(settings_)),
      token_(MakeToken(host_id_)),
      store_(settings_) {
  rng_ = uint32_t(std::random_device()()) | 1;
  shm::SegmentHeader& h = segment_.header();
  h.fleet_state.store(uint32_t(shm::FleetState::kLocal), kRelaxed);
  h.fleet_hosts.store(0, kRelaxed);
}

Fleet::~Fleet() { Stop(); }

void Fleet::Start() {
  if (thread_.joinable()) return;
  thread_ = std::thread([this] { Loop(); });
}

void Fleet::SetDependencies(std::map<std::string, FleetDependency> deps) {
  std::lock_guard<std::mutex> lock(mu_);
  pending_ = std::make_unique<std::map<std::string, FleetDependency>>(std::move(deps));
  cv_.notify_all();
}

std::string Fleet::Key(const std::string& dep, const std::string& what) const {
  return settings_.key_prefix + ":dep:" + dep + ":" + what;
}

shm::DependencySlot* Fleet::SlotOf(const std::string& name, Run& run) {
  if (run.index >= 0) {
    shm::DependencySlot* slot = segment_.dependency(uint32_t(run.index));
    if (slot != nullptr && slot->generation.load(std::memory_order_acquire) == run.generation &&
        shm::SlotState(slot->state.load(std::memory_order_acquire)) == shm::SlotState::kActive) {
      return slot;
    }
  }
  run.index = segment_.Find(name);
  if (run.index < 0) return nullptr;
  shm::DependencySlot* slot = segment_.dependency(uint32_t(run.index));
  run.generation = slot->generation.load(std::memory_order_acquire);
  run.seen = false;
  run.followed_open = false;
  return slot;
}

void Fleet::Release(Run& run, uint64_t now_ns) {
  shm::DependencySlot* slot = run.index >= 0 ? segment_.dependency(uint32_t(run.index)) : nullptr;
  if (slot != nullptr && slot->generation.load(std::memory_order_acquire) == run.generation) {
    // The open period as the breaker drew it: over already, the next admit takes it half-open.
    if (run.held) shm::SetOpenUntil(*slot, run.seq, std::max(run.due_ms, now_ns / kMsNs), now_ns);
    StoreBudget(*slot, run.cfg.local_min_retries_per_sec, run.cfg.local_retry_burst);
    StoreIfChanged(slot->fleet, shm::FleetWord::Make(shm::FleetRole::kNone, 0));
  }
  run.held = false;
  run.lease = -1;
  run.lost_round = -1;
  run.close_at_ms = 0;
  run.seen = false;
}

void Fleet::GoLocal(const std::string& why) {
  const uint64_t now_ns = shm::PreciseNowNs();
  for (auto& [name, run] : runs_) Release(run, now_ns);
  store_.Disconnect();
  shm::SegmentHeader& h = segment_.header();
  h.fleet_state.store(uint32_t(shm::FleetState::kLocal), kRelaxed);
  if (joined_) h.fleet_fallbacks.fetch_add(1, kRelaxed);
  if (!outage_logged_) {
    LOG(WARNING) << "fleet: " << why << ": deciding locally (every breaker, probe and floor is "
                 << "this host's) until the store answers; trying again with backoff (up to "
                 << kMaxBackoffMs / 1000 << "s)";
    outage_logged_ = true;
  }
  joined_ = false;
}

void Fleet::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    stop_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
  const uint64_t now_ns = shm::PreciseNowNs();
  for (auto& [name, run] : runs_) {
    if (run.lease >= 0 && store_.connected()) {
      (void)store_.Command({"EVAL", kReleaseLease, "1",
                            Key(name, "lease:" + std::to_string(run.lease)), token_},
                           nullptr);
    }
    Release(run, now_ns);
  }
  store_.Disconnect();
  segment_.header().fleet_state.store(uint32_t(shm::FleetState::kLocal), kRelaxed);
}

void Fleet::Loop() {
  const uint64_t step_ms = std::min<uint64_t>(kMaxStepMs, settings_.sync_ms / 4);
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (stop_) return;
      if (pending_) {
        const uint64_t now_ns = shm::PreciseNowNs();
        for (auto it = runs_.begin(); it != runs_.end();) {
          if (pending_->count(it->first)) {
            ++it;
          } else {
            Release(it->second, now_ns);
            it = runs_.erase(it);
          }
        }
        for (const auto& [name, dep] : *pending_) runs_[name].cfg = dep;
        pending_.reset();
      }
    }
    const uint64_t now_ns = shm::PreciseNowNs();
    if (!store_.connected() && now_ns >= next_connect_ns_) {
      if (Status st = store_.Connect(); st.ok()) {
        LOG(INFO) << "fleet: host " << host_id_ << " joined through " << store_.address()
                  << " (sync every " << settings_.sync_ms << "ms, " << runs_.size()
                  << (runs_.size() == 1 ? " fleet dependency)" : " fleet dependencies)");
        joined_ = true;
        syncs_since_join_ = 0;
        outage_logged_ = false;
        backoff_ms_ = 0;
        next_sync_ns_ = now_ns;
        segment_.header().fleet_state.store(uint32_t(shm::FleetState::kJoined), kRelaxed);
      } else {
        backoff_ms_ = std::clamp<uint64_t>(backoff_ms_ * 2, kMinBackoffMs, kMaxBackoffMs);
        // Jitter, so that hosts that lost the store together do not come back together.
        const uint64_t wait_ms = backoff_ms_ / 2 + shm::NextRandom(rng_) % (backoff_ms_ / 2 + 1);
        next_connect_ns_ = now_ns + wait_ms * kMsNs;
        GoLocal("cannot reach the store: " + st.message());
      }
      // After the segment's state: a reader that sees this sees what the attempt found.
      joining_.store(false, std::memory_order_release);
    }
    if (store_.connected() && !Step(shm::PreciseNowNs())) {
      // Step named what failed; next_connect_ns_ is now, so the next pass reconnects (at once
      // to a failed-over master), then backs off.
      next_connect_ns_ = shm::PreciseNowNs();
    }
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::milliseconds(step_ms), [this] { return stop_ || pending_; });
  }
}

bool Fleet::Step(uint64_t now_ns) {
  if (now_ns >= next_sync_ns_) {
    next_sync_ns_ = now_ns + uint64_t{settings_.sync_ms} * kMsNs;
    if (!Sync(now_ns)) return false;
  }
  for (auto& [name, run] : runs_) {
    if (!Follow(name, run, shm::PreciseNowNs())) return false;
  }
  return true;
}

bool Fleet::Sync(uint64_t now_ns) {
  shm::SegmentHeader& h = segment_.header();
  const std::string fresh_ms = std::to_string(uint64_t{settings_.sync_ms} * kFreshSyncs);
  const std::string keep_ms = std::to_string(uint64_t{settings_.sync_ms} * 10);
  StoreReply reply;
  if (Status st = store_.Command({"EVAL", kJoinHosts, "1", settings_.key_prefix + ":hosts",
                                  host_id_, fresh_ms, keep_ms},
                                 &reply);
      !st.ok()) {
    GoLocal(st.message());
    return false;
  }
  h.fleet_hosts.store(uint32_t(std::max<int64_t>(reply.integer, 0)), kRelaxed);
  for (auto& [name, run] : runs_) {
    shm::DependencySlot* slot = SlotOf(name, run);
    if (slot == nullptr) continue;  // not in the segment yet (pending), or retired
    const shm::BreakerWord b =
        shm::BreakerWord::Decode(slot->breaker.load(std::memory_order_acquire));
    // An open host's window holds the failures it opened on (no call lands in it while open):
    // it counts as a failing host's until the fleet's probe succeeds, so that a host too quiet
    // to trip opens with hosts that tripped on their own. Its open period is the one this
    // thread follows (run.seq), or it reports nothing until the next sync.
    shm::WindowStats w;
    int64_t opened_at = -1;
    if (b.state == shm::BreakerState::kClosed) {
      w = shm::ReadWindow(*slot, now_ns);
    } else if (run.seen && run.seq == b.seq && run.close_at_ms == 0) {
      // The round it opened in, not the last outcome read. A host that has read the fleet's
      // success and waits for its jittered close reports nothing: its failures are the past
      // (whatever the store's count says since: a store flushed meanwhile lost the success).
      w = shm::ReadWindow(*slot, now_ns);
      opened_at = run.open_round;
    }
    const std::string mine = std::to_string(w.calls) + " " + std::to_string(w.failures) + " " +
                             std::to_string(w.slow) + " " + std::to_string(opened_at);
    const std::string epoch = opened_at >= 0 ? run.open_epoch : "";
    if (Status st = store_.Command(
            {"EVAL", kPublishWindow, "2", Key(name, "window"), Key(name, "outcome"), host_id_, mine,
             keep_ms, fresh_ms, epoch, token_ + ":" + std::to_string(shm::NextRandom(rng_))},
            &reply);
        !st.ok()) {
      GoLocal(st.message());
      return false;
    }
    shm::WindowStats fleet;
    uint32_t hosts = 0, failing = 0;
    for (const StoreReply& e : reply.elements) {
      std::istringstream in(e.str);
      uint64_t calls = 0, failures = 0, slow = 0;
      if (!(in >> calls >> failures >> slow)) continue;
      ++hosts;
      fleet.calls += calls;
      fleet.failures += failures;
      fleet.slow += slow;
      if (failures > 0 || slow > 0) ++failing;
    }
    run.hosts = hosts;
    // A lease holder's breaker answers for the fleet: closed by its probe, it publishes the
    // success at its next step, and must not trip first on the reports of hosts that have not
    // heard it yet.
    if (run.lease < 0 && b.state == shm::BreakerState::kClosed &&
        failing >= run.cfg.fleet.min_hosts &&
        shm::ShouldTrip(*slot, fleet) &&
        shm::ApplyBreakerEvent(*slot, shm::BreakerEvent::kTrip, now_ns, 0, rng_)) {
      h.fleet_trips.fetch_add(1, kRelaxed);
      LOG(INFO) << "fleet: dependency " << name << ": opened on the fleet's window: "
                << fleet.failures << " failures, " << fleet.slow << " slow of " << fleet.calls
                << " calls from " << hosts << " hosts (" << failing << " failing)";
    }
    // The fleet's floor and cap, divided among its live hosts (this one included). At the first
    // sync after joining, the hosts it sees are only those that published since the store came
    // back: a share counted on them could be the whole fleet's, so it is at most the host's own
    // until the next sync, when every host that joined meanwhile has published.
    const uint32_t n = std::max<uint32_t>(hosts, 1);
    const FleetPolicy& f = run.cfg.fleet;
    uint32_t floor = f.min_retries_per_sec > 0 ? (f.min_retries_per_sec + n - 1) / n
                                               : run.cfg.local_min_retries_per_sec;
    uint32_t burst = f.retry_burst > 0 ? std::max<uint32_t>((f.retry_burst + n - 1) / n, 1)
                                       : run.cfg.local_retry_burst;
    if (syncs_since_join_ == 0) {
      floor = std::min(floor, run.cfg.local_min_retries_per_sec);
      burst = std::max<uint32_t>(std::min(burst, run.cfg.local_retry_burst), 1);
    }
    StoreBudget(*slot, floor, burst);
  }
  h.fleet_synced_unix_ms.store(shm::UnixNowMs(), kRelaxed);
  ++syncs_since_join_;
  return true;
}

bool Fleet::Follow(const std::string& name, Run& run, uint64_t now_ns) {
  shm::DependencySlot* slot = SlotOf(name, run);
  if (slot == nullptr) return true;
  const uint64_t now_ms = now_ns / kMsNs;
  const uint64_t sync_ms = settings_.sync_ms;
  const shm::BreakerWord b =
      shm::BreakerWord::Decode(slot->breaker.load(std::memory_order_acquire));
  const std::string outcome_key = Key(name, "outcome");
  StoreReply reply;
  auto fail = [&](const Status& st) {
    GoLocal(st.message());
    return false;
  };
  // The fleet's last outcome: its count, "success" or "failure", its round, the last
  // success's count and the store's epoch.
  struct Outcome {
    int64_t n = 0, round = 0, success_n = 0;
    std::string result, epoch;
  };
  auto read_outcome = [&](Outcome* o) {
    StoreReply r;
    // A new value at every read: whichever host reads a store first, its epoch differs from
    // that of the store before it (this host's token alone would not, if it read both first).
    const std::string epoch = token_ + ":" + std::to_string(shm::NextRandom(rng_));
    Status st = store_.Command({"EVAL", kReadOutcome, "1", outcome_key, epoch}, &r);
    if (st.ok()) {
      const bool whole = r.elements.size() == 5;
      auto number = [&](size_t i) {
        return whole && !r.elements[i].str.empty()
                   ? std::strtoll(r.elements[i].str.c_str(), nullptr, 10)
                   : int64_t{0};
      };
      *o = Outcome{number(0), number(2), number(3), whole ? r.elements[1].str : "",
                   whole ? r.elements[4].str : ""};
    }
    return st;
  };
  // Whether the fleet tripped again after the success of count `success_n`: as many fresh
  // reports as it takes to trip it say their host opened in a round at or after it.
  auto opened_since = [&](int64_t success_n, bool* since) {
    StoreReply r;
    Status st = store_.Command(
        {"EVAL", kOpenedSince, "1", Key(name, "window"), std::to_string(success_n),
         std::to_string(uint64_t{settings_.sync_ms} * kFreshSyncs)},
        &r);
    *since = st.ok() && r.integer >= int64_t{std::max<uint32_t>(run.cfg.fleet.min_hosts, 1)};
    return st;
  };

  // The open period this host followed before it lost the store (Release), followed again: it
  // began in the same round, which its report keeps, and an outcome published meanwhile (the
  // fleet's success, most likely) is news to it. Read afresh, the round would be the newest
  // outcome's: its window, the outage's failures, would count as failing in the round of the
  // success, and the hosts that had closed would trip again on it. A store emptied meanwhile
  // (another epoch: restarted without its data, or flushed) began its counts after this open
  // period began (kBeforeThisStore: every outcome of it is news, and the period's failures, whose
  // end it may have lost, count there only beside current ones: kPublishWindow). And if the fleet
  // tripped again after a success that came meanwhile, that success is past: this host's open
  // period is the fleet's new one, begun in the round of the newest outcome, read afresh below.
  bool same_open =
      !run.seen && run.followed_open && b.seq == run.seq && b.state == shm::BreakerState::kOpen;
  Outcome rejoined;
  const bool reread = same_open;
  if (same_open) {
    if (Status st = read_outcome(&rejoined); !st.ok()) return fail(st);
    const int64_t round = rejoined.epoch == run.open_epoch ? run.open_round : kBeforeThisStore;
    if (rejoined.success_n > round) {
      bool reopened = false;
      if (Status st = opened_since(rejoined.success_n, &reopened); !st.ok()) return fail(st);
      same_open = !reopened;
    }
    if (same_open) {
      run.open_round = round;
      run.open_epoch = rejoined.epoch;
    }
  }
  if (!run.seen || b.seq != run.seq) {
    // The breaker moved. A prober's own half-open ending is the fleet's outcome: the lease was
    // taken while open, and only its half-open (seen or not: it may begin and end between two
    // steps) moves an open word of a lease holder on to another open or to closed.
    if (run.lease >= 0 && run.seen && b.state != shm::BreakerState::kHalfOpen) {
      const char* result = b.state == shm::BreakerState::kClosed ? "success" : "failure";
      if (Status st = store_.Command({"EVAL", kPublishOutcome, "2", outcome_key,
                                      Key(name, "lease:" + std::to_string(run.lease)), result,
                                      host_id_, token_, std::to_string(run.lease_round)},
                                     &reply);
          !st.ok()) {
        return fail(st);
      }
      LOG(INFO) << "fleet: dependency " << name << ": this host's fleet probe: " << result
                << (reply.integer < 0 ? " (its lease had expired: not published)" : "");
      if (reply.integer < 0) run.lost_round = run.lease_round;
      run.lease = -1;
    } else if (run.lease >= 0 && !run.seen) {
      // The slot was looked up again (reassigned): the lease is given back.
      if (Status st = store_.Command({"EVAL", kReleaseLease, "1",
                                      Key(name, "lease:" + std::to_string(run.lease)), token_},
                                     nullptr);
          !st.ok()) {
        return fail(st);
      }
      run.lease = -1;
    }
    run.seen = true;
    run.seq = b.seq;
    run.held = false;
    run.close_at_ms = 0;
    if (b.state == shm::BreakerState::kOpen) {
      run.due_ms = FullUntilMs(*slot, b, now_ns);
      run.open_since_ns = now_ns;
      run.rejected_at_open = shm::ReadCounter(*slot, shm::kRejectedOpen);
      Outcome o = rejoined;
      if (same_open) {
        run.outcome_n = std::max<int64_t>(run.open_round, 0);
      } else {
        if (!reread) {
          if (Status st = read_outcome(&o); !st.ok()) return fail(st);
        }
        run.outcome_n = o.n;
        run.open_round = o.n;
        run.open_epoch = o.epoch;
      }
      // A prober whose lease lapsed before its probe reported (its daemon stopped, or too slow
      // to renew) sees that probe's failure only when its daemon runs again, and the outcome it
      // reads here, as its new open period's start, may already be the fleet's success by the
      // host that took the lease after it. That success is news to it, as to a held host: it
      // closes with the fleet. Without this it stayed open for its backed-off open period, then
      // probed on its own and published a second outcome for the fleet's one recovery.
      if (run.lost_round >= 0 && o.result == "success" && o.round >= run.lost_round) {
        run.open_round = run.lost_round;  // its report, until it closes, is of that past round
        const uint32_t jitter = shm::LoadKnob<shm::Knob::open_jitter_ms>(slot->policy);
        run.close_at_ms = now_ms + (jitter > 0 ? shm::NextRandom(rng_) % (jitter + 1) : 0);
        LOG(INFO) << "fleet: dependency " << name << ": the fleet's probe succeeded after this "
                  << "host's lease lapsed: it closes with the fleet";
      }
    }
    // A lost round counts until the breaker next leaves half-open, its probe's end.
    if (b.state != shm::BreakerState::kHalfOpen) run.lost_round = -1;
    run.followed_open = b.state == shm::BreakerState::kOpen;
  }

  // The host's demand: a call refused since the last step (held or open, its workers still
  // call). Only a host with calls can probe: a lease goes to one that has them.
  if (const uint64_t rejected = shm::ReadCounter(*slot, shm::kRejectedOpen);
      rejected != run.rejected_seen) {
    run.rejected_seen = rejected;
    run.called_ns = now_ns;
  }
  const bool calling = run.called_ns != 0 && now_ns - run.called_ns <= sync_ms * kMsNs;
  // The host's demand: the calls its breaker refused per minute over this open period (at
  // least a sync of it), which decays while no call comes.
  const uint64_t demand =
      (run.rejected_seen - std::min(run.rejected_seen, run.rejected_at_open)) * 60'000'000'000ull /
      std::max<uint64_t>(now_ns - std::min(now_ns, run.open_since_ns), sync_ms * kMsNs);

  shm::FleetRole role = shm::FleetRole::kMember;
  bool give_back = false;
  // A half-open with no probe out: its probe's call was refused after it took the probe (the
  // bulkhead, the retry budget), and nothing moves the breaker on until another admit comes.
  const bool idle_half_open = run.lease >= 0 && b.state == shm::BreakerState::kHalfOpen &&
                              b.seq == run.seq && !ProbeOut(*slot, b.seq);
  if (run.lease >= 0 && ((b.state == shm::BreakerState::kOpen && b.seq == run.seq) ||
                         idle_half_open) &&
      now_ns - run.lease_taken_ns >= kUnusedLeaseSyncs * sync_ms * kMsNs &&
      now_ns >= run.next_unused_check_ns) {
    // No admit took the breaker half-open since the lease was taken (or its probe's call was
    // refused, and none came since). If a host with more than twice the demand this one had
    // when it took the lease waits for one, this one gives it back; if none does (every host is
    // about as quiet, and this one calls less often than every two syncs), it keeps it until
    // its next call probes. Once its last call is older than twice its usual gap between calls
    // (by that demand) and two syncs, its calls have stopped: any host that waits gets it.
    const uint64_t gap_ns = 60'000'000'000ull / std::max<uint64_t>(run.lease_demand, 1);
    const bool stopped = now_ns - std::min(now_ns, run.called_ns) >
                         2 * gap_ns + 2 * uint64_t{sync_ms} * kMsNs;
    if (Status st = store_.Command({"EVAL", kLeaseWanted, "1", Key(name, "wanted"), token_,
                                    std::to_string(sync_ms * kWantedSyncs),
                                    std::to_string(stopped ? 0 : 2 * run.lease_demand)},
                                   &reply);
        !st.ok()) {
      return fail(st);
    }
    give_back = reply.integer == 1;
    run.next_unused_check_ns = now_ns + sync_ms * kMsNs;
  }
  if (give_back && shm::SetOpenUntil(*slot, run.seq, now_ms + sync_ms, now_ns)) {
    // It is held again first (the breaker cannot go half-open once this succeeds), then the
    // lease goes back, for the host that waits.
    if (Status st = store_.Command({"EVAL", kReleaseLease, "1",
                                    Key(name, "lease:" + std::to_string(run.lease)), token_},
                                   nullptr);
        !st.ok()) {
      return fail(st);
    }
    LOG(INFO) << "fleet: dependency " << name << ": no call came to probe with in "
              << kUnusedLeaseSyncs << " syncs and another host waits for it: the fleet probe "
              << "lease is given back";
    run.lease = -1;
    run.held = true;
    run.called_ns = 0;
  } else if (give_back && idle_half_open) {
    // A half-open cannot be held: it is reopened as its probe's timeout would (the lease is
    // dropped first, so that the reopening is not published as the fleet's probe failing),
    // then the lease goes back. A probe taken in between is voided by the reopening.
    const int32_t k = run.lease;
    run.lease = -1;
    (void)shm::ApplyBreakerEvent(*slot, shm::BreakerEvent::kProbeExpired, now_ns, b.seq, rng_);
    if (Status st = store_.Command({"EVAL", kReleaseLease, "1",
                                    Key(name, "lease:" + std::to_string(k)), token_},
                                   nullptr);
        !st.ok()) {
      return fail(st);
    }
    LOG(INFO) << "fleet: dependency " << name << ": its half-open has no probe out (its call "
              << "was refused) and another host waits: reopened, the fleet probe lease given back";
    run.called_ns = 0;
    return true;  // the next step follows the new open period
  }
  if (run.lease >= 0) {
    role = shm::FleetRole::kProbing;
    if (now_ns >= run.next_renew_ns) {
      run.next_renew_ns = now_ns + sync_ms * kMsNs;
      if (Status st = store_.Command({"EVAL", kRenewLease, "1",
                                      Key(name, "lease:" + std::to_string(run.lease)), token_,
                                      std::to_string(sync_ms * kFreshSyncs)},
                                     &reply);
          !st.ok()) {
        return fail(st);
      }
      if (reply.integer == 0) {
        LOG(WARNING) << "fleet: dependency " << name
                     << ": this host's fleet probe lease expired before its probe reported";
        run.lost_round = run.lease_round;
        run.lease = -1;
        role = shm::FleetRole::kMember;
      }
    }
  } else if (b.state == shm::BreakerState::kOpen) {
    role = shm::FleetRole::kHolding;
    Outcome o;
    if (Status st = read_outcome(&o); !st.ok()) return fail(st);
    if (o.epoch != run.open_epoch && run.close_at_ms == 0) {
      // The store was emptied (restarted without its data, or flushed) while this host stayed
      // with it: its counts began after this open period began. Its outcomes are news, and
      // this period's failures, whose end it may have lost, count there only beside current
      // ones (kPublishWindow).
      run.outcome_n = 0;
      run.open_round = kBeforeThisStore;
      run.open_epoch = o.epoch;
    }
    if (o.n != run.outcome_n && run.close_at_ms == 0) {
      // An outcome of a round that began before this open period (another prober of a round
      // this host already followed) is not news.
      const bool news = o.round >= run.outcome_n;
      run.outcome_n = o.n;
      if (news && o.result == "success") {
        const uint32_t jitter = shm::LoadKnob<shm::Knob::open_jitter_ms>(slot->policy);
        run.close_at_ms = now_ms + (jitter > 0 ? shm::NextRandom(rng_) % (jitter + 1) : 0);
      } else if (news && o.result == "failure") {
        if (shm::ApplyBreakerEvent(*slot, shm::BreakerEvent::kFleetReopened, now_ns, 0, rng_)) {
          LOG(INFO) << "fleet: dependency " << name
                    << ": reopened: the fleet's probe failed";
        }
        return true;  // the next step follows the new open period
      }
    }
    if (run.close_at_ms != 0 && now_ms >= run.close_at_ms) {
      // Closed at the clients' clock (shm/clock.h, CoarseNowNs).
      if (shm::ApplyBreakerEvent(*slot, shm::BreakerEvent::kFleetClosed, shm::CoarseNowNs(), 0,
                                 rng_)) {
        LOG(INFO) << "fleet: dependency " << name << ": closed: the fleet's probe succeeded";
      }
      return true;
    }
    if (run.close_at_ms == 0 && now_ms >= run.due_ms && calling) {
      std::vector<std::string> argv = {"EVAL", kAcquireLease,
                                       std::to_string(2 + run.cfg.fleet.half_open_probes),
                                       outcome_key, Key(name, "wanted")};
      for (uint32_t k = 0; k < run.cfg.fleet.half_open_probes; ++k) {
        argv.push_back(Key(name, "lease:" + std::to_string(k)));
      }
      argv.push_back(std::to_string(run.outcome_n));
      argv.push_back(token_);
      argv.push_back(std::to_string(sync_ms * kFreshSyncs));
      argv.push_back(std::to_string(demand));
      argv.push_back(std::to_string(sync_ms * kWantedSyncs));
      if (Status st = store_.Command(argv, &reply); !st.ok()) return fail(st);
      if (reply.integer >= 0) {
        run.lease = int32_t(reply.integer);
        run.lease_round = run.outcome_n;
        run.lease_taken_ns = now_ns;
        run.lease_demand = demand;
        run.next_unused_check_ns = 0;
        run.next_renew_ns = now_ns + sync_ms * kMsNs;
        segment_.header().fleet_leases.fetch_add(1, kRelaxed);
        LOG(INFO) << "fleet: dependency " << name << ": this host probes for the fleet (lease "
                  << run.lease << " of " << run.cfg.fleet.half_open_probes << ")";
        // The role first, so that the probe the next admit takes is never seen under the
        // role of a held host; then the open period as drawn is over: the next admit takes the
        // breaker half-open.
        StoreIfChanged(slot->fleet, shm::FleetWord::Make(shm::FleetRole::kProbing, run.hosts));
        if (run.held) shm::SetOpenUntil(*slot, run.seq, run.due_ms, now_ns);
        run.held = false;
        return true;
      }
    }
    // Held: never more than one sync past this step, so that a store that stops answering
    // hands the breaker back to its own rules within one sync period.
    const uint64_t until_ms = FullUntilMs(*slot, b, now_ns);
    const uint64_t want_ms = std::max(run.due_ms, now_ms) + sync_ms;
    if (until_ms < want_ms - sync_ms / 2 &&
        shm::SetOpenUntil(*slot, run.seq, want_ms, now_ns)) {
      run.held = true;
    }
  }
  StoreIfChanged(slot->fleet, shm::FleetWord::Make(role, run.hosts));
  return true;
}

}  // namespace retryd::daemon
