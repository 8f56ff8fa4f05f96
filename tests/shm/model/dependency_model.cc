#include "tests/shm/model/dependency_model.h"

#include <algorithm>

namespace retryd::model {
namespace {

using shm::BreakerState;
using shm::Decision;
using shm::Mode;
using shm::Outcome;

constexpr uint64_t kNsPerMs = 1'000'000;
// clock.h: a stored deadline is never more than two days ahead when it is set, and a reader's
// clock lags by at most a minute.
constexpr uint32_t kMaxDeadlineAheadMs = 2 * 86'400'000u + 60'000;
// retry_budget.h: a stamp up to a minute ahead of the clock reads as time going backwards.
constexpr uint32_t kMaxClockSkewMs = 60'000;
// breaker.h: a bucket counts at most this many calls.

// LeaseExpired: the clock has reached a lease's `deadline_ms`. A lease word stores it as ms
// modulo 2^32 and reads it as ahead when it reads as at most kMaxDeadlineAheadMs ahead
// (leases.h), so a deadline missed by k x 2^32 ms less at most that much still reads as ahead.
bool LeaseExpired(uint64_t now_ms, uint64_t deadline_ms) {
  if (now_ms < deadline_ms) return false;
  return uint32_t(now_ms - deadline_ms) < 0u - kMaxDeadlineAheadMs;
}

}  // namespace

DependencyModel::DependencyModel(const shm::Policy& policy, uint64_t now_ms)
    : policy_(policy), mode_(policy.mode) {
  Reset(now_ms);
}

void DependencyModel::SetPolicy(const shm::Policy& policy) {
  const Mode mode = mode_;
  // A new window shape starts the window anew: a period of the old shape is none of the new.
  if (policy.window_ms != policy_.window_ms || policy.window_buckets != policy_.window_buckets) {
    periods_.clear();
    any_period_ = false;
  }
  policy_ = policy;
  mode_ = mode;
}

uint32_t DependencyModel::NextRandom(ModelThread& thread) {
  uint32_t x = thread.rng ? thread.rng : 0x9E3779B9u;
  x ^= x << 13;
  x ^= x >> 17;
  x ^= x << 5;
  thread.rng = x;
  return x;
}

// --- Admission ---------------------------------------------------------------------------

Decision DependencyModel::Admit(uint32_t attempt, uint64_t now_ms, ModelThread& thread,
                                ModelPermit* p, bool may_probe) {
  *p = ModelPermit{};
  if (mode_ == Mode::kDisabled) {
    p->active = true;
    return Decision::kAdmitted;
  }
  if (mode_ == Mode::kForcedOpen) {
    Count(shm::kRejectedOpen);
    return Decision::kRejectedOpen;
  }
  const bool shadow = mode_ == Mode::kShadow;
  p->active = true;
  p->record = true;
  bool would_reject = false;
  // Enforce refuses at the first step that says no, giving back what earlier steps took.
  auto refuse = [&](Decision d) {
    switch (d) {
      case Decision::kRejectedOpen: Count(shm::kRejectedOpen); break;
      case Decision::kRejectedHalfOpenBusy: Count(shm::kRejectedHalfOpenBusy); break;
      case Decision::kRejectedBulkheadFull: Count(shm::kRejectedBulkheadFull); break;
      case Decision::kRejectedBudgetEmpty: Count(shm::kRetriesDenied); break;
      default: break;
    }
    ReleaseLeases(p);
    *p = ModelPermit{};
    return d;
  };

  // 1. The breaker.
  if (breaker_.state != BreakerState::kClosed) {
    const Decision d = AdmitBreaker(now_ms, thread, p, may_probe);
    if (!shm::IsAdmitted(d)) {
      if (!shadow) return refuse(d);
      would_reject = true;
    }
  }
  // 2. The bulkhead.
  if (policy_.bulkhead_limit > 0 && !TakeBulkhead(now_ms, thread.owner, p)) {
    if (ReclaimExpired(now_ms, thread) == 0 || !TakeBulkhead(now_ms, thread.owner, p)) {
      if (!shadow) return refuse(Decision::kRejectedBulkheadFull);
      would_reject = true;
    }
  }
  // 3. The retry budget.
  if (attempt == 0) {
    Deposit();
    Count(shm::kFirstAttempts);
  } else if (TryWithdraw(now_ms)) {
    Count(shm::kRetriesGranted);
  } else {
    if (!shadow) return refuse(Decision::kRejectedBudgetEmpty);
    would_reject = true;
  }
  if (would_reject) Count(shm::kShadowWouldReject);
  if (p->probe_lease != 0) {
    Count(shm::kProbesGranted);
    return Decision::kAdmittedProbe;
  }
  return Decision::kAdmitted;
}

Decision DependencyModel::AdmitBreaker(uint64_t now_ms, ModelThread& thread, ModelPermit* p,
                                       bool may_probe) {
  for (;;) {
    if (breaker_.state == BreakerState::kClosed) return Decision::kAdmitted;
    if (breaker_.state == BreakerState::kOpen) {
      // The breaker keeps its time in full beside its word (breaker.h): exact at any age.
      if (now_ms < breaker_.time_ms) return Decision::kRejectedOpen;
      Enter(BreakerState::kHalfOpen, breaker_.reopens, now_ms);
      continue;
    }
    // Half-open: an attempt that may not probe is busy; else the first of half_open_probes
    // words that is free or holds a void probe.
    if (!may_probe) return Decision::kRejectedHalfOpenBusy;
    for (uint32_t i = 0; i < policy_.half_open_probes; ++i) {
      ModelLease& word = probes_[i];
      if (word.serial != 0 && word.tag == breaker_.seq) continue;
      if (word.serial != 0) Count(shm::kLeasesReclaimedVoided);
      word = {next_serial_++, thread.owner, breaker_.seq,
              now_ms + std::max<uint32_t>(policy_.probe_timeout_ms, 1)};
      p->probe_lease = word.serial;
      p->probe_index = i;
      p->probe_seq = breaker_.seq;
      return Decision::kAdmittedProbe;
    }
    if (ReclaimExpired(now_ms, thread) == 0) return Decision::kRejectedHalfOpenBusy;
  }
}

void DependencyModel::Complete(ModelPermit* p, Outcome outcome, uint64_t latency_ns,
                               uint64_t now_ms, ModelThread& thread) {
  if (!p->active) return;
  p->active = false;
  if (!p->record) {
    ReleaseLeases(p);
    return;
  }
  const uint64_t slow_ms = policy_.slow_call_ms;
  const bool slow = slow_ms != 0 && outcome != Outcome::kIgnored && latency_ns >= slow_ms * kNsPerMs;
  Count(outcome == Outcome::kSuccess   ? shm::kSuccesses
        : outcome == Outcome::kFailure ? shm::kFailures
                                       : shm::kIgnored);
  if (slow) Count(shm::kSlowCalls);
  const bool failed = outcome == Outcome::kFailure || slow;
  if (p->probe_lease != 0) {
    // Only a probe that still holds its lease reports, and only to its own half-open.
    const uint16_t seq = p->probe_seq;
    const bool held = ReleaseProbe(p);
    const bool current = breaker_.state == BreakerState::kHalfOpen && breaker_.seq == seq;
    if (held && failed) {
      const uint32_t random = NextRandom(thread);  // an event that opens draws, applied or not
      if (current) Open(breaker_.reopens + 1, now_ms, random);
    } else if (held && outcome != Outcome::kIgnored && current) {
      if (breaker_.successes + 1 >= policy_.close_after) {
        Enter(BreakerState::kClosed, 0, now_ms);
      } else {
        ++breaker_.successes;
      }
    }
  } else if (outcome != Outcome::kIgnored) {
    RecordOutcome(now_ms, outcome == Outcome::kFailure, slow, thread);
  }
  ReleaseLeases(p);
}

uint32_t DependencyModel::ReclaimExpired(uint64_t now_ms, ModelThread& thread) {
  uint32_t freed = 0;
  const ModelBreaker seen = breaker_;
  bool current_probe_expired = false;
  for (ModelLease& word : probes_) {
    if (word.serial == 0 || !LeaseExpired(now_ms, word.expiry_ms)) continue;
    ++freed;
    Count(shm::kLeasesReclaimedExpired);
    if (seen.state == BreakerState::kHalfOpen && word.tag == seen.seq) {
      Count(shm::kProbeTimeouts);
      current_probe_expired = true;
    }
    word = ModelLease{};
  }
  if (current_probe_expired) {
    const uint32_t random = NextRandom(thread);
    if (breaker_.state == BreakerState::kHalfOpen && breaker_.seq == seen.seq) {
      Open(breaker_.reopens + 1, now_ms, random);
    }
  }
  const auto expired = [&](const ModelLease& l) { return LeaseExpired(now_ms, l.expiry_ms); };
  const size_t before = bulkhead_.size();
  bulkhead_.erase(std::remove_if(bulkhead_.begin(), bulkhead_.end(), expired), bulkhead_.end());
  for (size_t i = bulkhead_.size(); i < before; ++i) {
    ++freed;
    Count(shm::kLeasesReclaimedExpired);
  }
  return freed;
}

uint32_t DependencyModel::ReclaimOwner(uint16_t owner) {
  uint32_t freed = 0;
  for (ModelLease& word : probes_) {
    if (word.serial != 0 && word.owner == owner) {
      word = ModelLease{};
      ++freed;
    }
  }
  const size_t before = bulkhead_.size();
  bulkhead_.erase(std::remove_if(bulkhead_.begin(), bulkhead_.end(),
                                 [&](const ModelLease& l) { return l.owner == owner; }),
                  bulkhead_.end());
  freed += uint32_t(before - bulkhead_.size());
  counters_[shm::kLeasesReclaimedDead] += freed;
  return freed;
}

void DependencyModel::Reset(uint64_t now_ms) {
  Enter(BreakerState::kClosed, 0, now_ms);
  periods_.clear();
  tokens_milli_ = uint64_t{policy_.retry_burst} * 1000;
  stamp_ms_ = now_ms;
}

// --- Breaker -----------------------------------------------------------------------------

// Enter makes a transition: a new seq, no probe successes, counted by the state entered. A
// close restarts the window; a half-open voids the probes of earlier half-opens.
void DependencyModel::Enter(BreakerState state, uint32_t reopens, uint64_t time_ms) {
  breaker_ = {state, std::min<uint32_t>(reopens, 63), 0, uint16_t(breaker_.seq + 1), time_ms};
  switch (state) {
    case BreakerState::kOpen: Count(shm::kOpened); break;
    case BreakerState::kHalfOpen:
      Count(shm::kHalfOpened);
      for (ModelLease& word : probes_) {
        if (word.serial != 0 && word.tag != breaker_.seq) {
          word = ModelLease{};
          Count(shm::kLeasesReclaimedVoided);
        }
      }
      break;
    case BreakerState::kClosed:
      Count(shm::kClosed);
      periods_.erase(time_ms * kNsPerMs / BucketNs());
      break;
  }
}

void DependencyModel::Open(uint32_t reopens, uint64_t now_ms, uint32_t random) {
  reopens = std::min<uint32_t>(reopens, 63);
  Enter(BreakerState::kOpen, reopens, now_ms + OpenPeriodMs(reopens, random));
}

// min(open_for x 2^reopens, open_for_max) + uniform [0, open_jitter].
uint64_t DependencyModel::OpenPeriodMs(uint32_t reopens, uint32_t random) const {
  const uint64_t base = policy_.open_for_ms;
  const uint64_t cap = std::max<uint64_t>(policy_.open_for_max_ms, base);
  uint64_t scaled = base;
  for (uint32_t i = 0; i < reopens && scaled < cap; ++i) scaled *= 2;
  scaled = std::min(scaled, cap);
  const uint64_t jitter = policy_.open_jitter_ms;
  return scaled + (jitter == 0 ? 0 : random % (jitter + 1));
}

void DependencyModel::RecordOutcome(uint64_t now_ms, bool failure, bool slow,
                                    ModelThread& thread) {
  if (breaker_.state != BreakerState::kClosed) return;
  RecordCall(now_ms, failure, slow);
  if (!(failure || slow) || !ShouldTrip(Window(now_ms))) return;
  Open(0, now_ms, NextRandom(thread));
}

bool DependencyModel::ShouldTrip(const ModelWindowStats& w) const {
  if (w.calls == 0 || w.calls < policy_.min_calls) return false;
  if (w.failures * 100 >= uint64_t{policy_.failure_rate_pct} * w.calls) return true;
  return policy_.slow_call_ms != 0 && w.slow * 100 >= uint64_t{policy_.slow_call_rate_pct} * w.calls;
}

// --- Window ------------------------------------------------------------------------------

uint64_t DependencyModel::BucketNs() const {
  return std::max<uint64_t>(uint64_t{policy_.window_ms} * kNsPerMs / policy_.window_buckets,
                            kNsPerMs);
}

// A call lands in the bucket period of its time. Periods a window older than the newest period
// are gone; a call in one of them is not counted.
void DependencyModel::RecordCall(uint64_t now_ms, bool failure, bool slow) {
  const uint64_t buckets = policy_.window_buckets;
  const uint64_t period = now_ms * kNsPerMs / BucketNs();
  if (!any_period_ || period > newest_period_) {
    newest_period_ = period;
    any_period_ = true;
    while (!periods_.empty() && periods_.begin()->first + buckets <= newest_period_) {
      periods_.erase(periods_.begin());
    }
  }
  if (period + buckets <= newest_period_) return;
  Counts& c = periods_[period];
  ++c.calls;
  c.failures += failure ? 1 : 0;
  c.slow += slow ? 1 : 0;
}

// The calls of the `window_buckets` periods ending with the period of `now_ms`; while closed,
// none before the period of the last close if that was less than a window ago (a clock read
// that lags the close still sees the close).
ModelWindowStats DependencyModel::Window(uint64_t now_ms) const {
  const uint64_t bucket_ns = BucketNs();
  const uint64_t buckets = policy_.window_buckets;
  const uint64_t now_ns = now_ms * kNsPerMs;
  const uint64_t period = now_ns / bucket_ns;
  uint64_t floor = 0;
  if (breaker_.state == BreakerState::kClosed) {
    const uint64_t closed_ns = breaker_.time_ms * kNsPerMs;
    if (closed_ns >= now_ns || now_ns - closed_ns < bucket_ns * buckets) {
      floor = closed_ns / bucket_ns;
    }
  }
  ModelWindowStats w;
  for (const auto& [p, c] : periods_) {
    if (p > period || period - p >= buckets || p < floor) continue;
    w.calls += c.calls;
    w.failures += c.failures;
    w.slow += c.slow;
  }
  return w;
}

uint64_t DependencyModel::NextBucketPeriodMs(uint64_t now_ms) const {
  const uint64_t next = now_ms * kNsPerMs / BucketNs() + 1;
  return (next * BucketNs() + kNsPerMs - 1) / kNsPerMs;
}

bool DependencyModel::RecordedInPeriodOf(uint64_t now_ms) const {
  return any_period_ && newest_period_ == now_ms * kNsPerMs / BucketNs();
}

// --- Retry budget ------------------------------------------------------------------------

// The floor refill since the stamp, capped at the burst. Elapsed time is read modulo 2^32 ms,
// and a reading within kMaxClockSkewMs below 2^32 is the clock going backwards: no refill
// (retry_budget.h).
uint64_t DependencyModel::Refilled(uint64_t now_ms) const {
  const uint64_t cap = uint64_t{policy_.retry_burst} * 1000;
  const uint32_t elapsed = uint32_t(now_ms - stamp_ms_);
  const bool backwards = elapsed >= 0u - kMaxClockSkewMs;
  const uint64_t refill = backwards ? 0 : uint64_t{elapsed} * policy_.min_retries_per_sec;
  return std::min(cap, tokens_milli_ + refill);
}

void DependencyModel::Deposit() {
  const uint64_t cap = uint64_t{policy_.retry_burst} * 1000;
  if (policy_.retry_ratio_milli == 0 || tokens_milli_ >= cap) return;
  tokens_milli_ += policy_.retry_ratio_milli;
}

bool DependencyModel::TryWithdraw(uint64_t now_ms) {
  const uint64_t tokens = Refilled(now_ms);
  if (tokens < 1000) return false;
  tokens_milli_ = tokens - 1000;
  // The stamp never moves backwards.
  if (uint32_t(now_ms - stamp_ms_) < 0u - kMaxClockSkewMs) stamp_ms_ = now_ms;
  return true;
}

// --- Leases ------------------------------------------------------------------------------

bool DependencyModel::TakeBulkhead(uint64_t now_ms, uint16_t owner, ModelPermit* p) {
  if (bulkhead_.size() >= policy_.bulkhead_limit) return false;
  const uint64_t expiry = now_ms + std::max<uint32_t>(policy_.bulkhead_timeout_ms, 1);
  bulkhead_.push_back({next_serial_++, owner, 0, expiry});
  p->bulkhead_lease = bulkhead_.back().serial;
  return true;
}

bool DependencyModel::ReleaseProbe(ModelPermit* p) {
  ModelLease& word = probes_[p->probe_index];
  const bool held = p->probe_lease != 0 && word.serial == p->probe_lease;
  if (held) word = ModelLease{};
  p->probe_lease = 0;
  return held;
}

void DependencyModel::ReleaseBulkhead(ModelPermit* p) {
  if (p->bulkhead_lease == 0) return;
  const uint64_t serial = p->bulkhead_lease;
  bulkhead_.erase(std::remove_if(bulkhead_.begin(), bulkhead_.end(),
                                 [&](const ModelLease& l) { return l.serial == serial; }),
                  bulkhead_.end());
  p->bulkhead_lease = 0;
}

void DependencyModel::ReleaseLeases(ModelPermit* p) {
  ReleaseProbe(p);
  ReleaseBulkhead(p);
}

uint32_t DependencyModel::CurrentProbesInFlight() const {
  if (breaker_.state != BreakerState::kHalfOpen) return 0;
  uint32_t n = 0;
  for (const ModelLease& word : probes_) n += word.serial != 0 && word.tag == breaker_.seq;
  return n;
}

}  // namespace retryd::model
