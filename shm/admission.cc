#include "shm/admission.h"

#include <algorithm>

#include "shm/breaker.h"
#include "shm/clock.h"
#include "shm/leases.h"
#include "shm/policy.h"
#include "shm/retry_budget.h"

namespace retryd::shm {
namespace {

constexpr auto kRelaxed = std::memory_order_relaxed;
// Bounded retries of a breaker decision that raced with a transition; past it, answer busy.
constexpr int kMaxBreakerRounds = 4;

void Count(DependencySlot& slot, Counter c) {
  slot.counters[c].fetch_add(1, kRelaxed);
}

uint64_t MakeLease(uint16_t owner, uint16_t tag, uint32_t now_ms, uint32_t timeout_ms) {
  return Lease::Make(owner, tag, now_ms + std::max<uint32_t>(timeout_ms, 1));
}

void ReleaseLeases(DependencySlot& slot, Permit* p) {
  if (p->flags & kPermitProbe) {
    Lease::Release(slot.probe_leases[p->probe_index % kMaxProbes], p->probe_lease);
  }
  if (p->flags & kPermitBulkhead) {
    Lease::Release(slot.bulkhead_leases[p->bulkhead_index % kMaxBulkhead], p->bulkhead_lease);
  }
  p->flags &= uint8_t(~(kPermitProbe | kPermitBulkhead));
}

// AdmitBreaker decides for a breaker that is not closed; on a probe grant it fills the
// permit's probe fields.
Decision AdmitBreaker(DependencySlot& slot, uint64_t now_ns, Caller& caller, Permit* p) {
  const uint32_t now_ms = NsToMs32(now_ns);
  for (int round = 0; round < kMaxBreakerRounds; ++round) {
    const uint64_t word = slot.breaker.load(std::memory_order_acquire);
    const BreakerWord b = BreakerWord::Decode(word);
    if (b.state == BreakerState::kClosed) return Decision::kAdmitted;
    if (b.state == BreakerState::kOpen) {
      if (!OpenPeriodOver(slot, b, now_ns)) return Decision::kRejectedOpen;
      ApplyBreakerEvent(slot, BreakerEvent::kOpenPeriodOver, now_ns, 0, caller.rng);
      continue;  // whoever moved it, look again
    }
    // Half-open: a probe lease tagged with this half-open's seq, or nothing.
    const uint64_t lease =
        MakeLease(caller.owner, b.seq, now_ms, LoadKnob<Knob::probe_timeout_ms>(slot.policy));
    bool voided = false;
    const int i = Lease::TryAcquireProbe(
        slot.probe_leases, LoadKnob<Knob::half_open_probes>(slot.policy), b.seq, lease, &voided);
    if (voided) Count(slot, kLeasesReclaimedVoided);
    if (i < 0) {
      if (ReclaimExpired(slot, now_ns, caller) > 0) continue;
      return Decision::kRejectedHalfOpenBusy;
    }
    // The lease is ours; it is a probe only if the breaker is still in the half-open we saw.
    const BreakerWord again = BreakerWord::Decode(slot.breaker.load(std::memory_order_acquire));
    if (again.state != BreakerState::kHalfOpen || again.seq != b.seq) {
      Lease::Release(slot.probe_leases[i], lease);
      continue;
    }
    p->probe_lease = lease;
    p->probe_index = uint16_t(i);
    p->breaker_seq = b.seq;
    p->flags |= kPermitProbe;
    return Decision::kAdmittedProbe;
  }
  return Decision::kRejectedHalfOpenBusy;
}

// Reject refuses the attempt: counts the reason and gives back any lease already taken.
Decision Reject(DependencySlot& slot, Permit* p, Decision d) {
  switch (d) {
    case Decision::kRejectedOpen: Count(slot, kRejectedOpen); break;
    case Decision::kRejectedHalfOpenBusy: Count(slot, kRejectedHalfOpenBusy); break;
    case Decision::kRejectedBulkheadFull: Count(slot, kRejectedBulkheadFull); break;
    case Decision::kRejectedBudgetEmpty: Count(slot, kRetriesDenied); break;
    default: break;
  }
  ReleaseLeases(slot, p);
  p->flags = 0;
  p->decision = uint8_t(d);
  return d;
}

}  // namespace

const char* DecisionName(Decision d) {
  switch (d) {
    case Decision::kAdmitted: return "admitted";
    case Decision::kAdmittedProbe: return "admitted-probe";
    case Decision::kRejectedOpen: return "rejected-open";
    case Decision::kRejectedHalfOpenBusy: return "rejected-half-open-busy";
    case Decision::kRejectedBulkheadFull: return "rejected-bulkhead-full";
    case Decision::kRejectedBudgetEmpty: return "rejected-budget-empty";
  }
  return "invalid";
}

namespace {

// AdmitImpl is Admit with a lazy clock: `now()` is read at most once, and only on paths that
// need the time (a breaker that is not closed, the bulkhead, a retry). A first attempt on a
// closed breaker reads no clock.
template <typename NowFn>
Decision AdmitImpl(DependencySlot& slot, uint32_t index, uint32_t attempt, NowFn now,
                   Caller& caller, Permit* p) {
  *p = Permit{};
  p->dependency = index;
  p->generation = slot.generation.load(kRelaxed);
  const Mode mode = Mode(slot.mode.load(kRelaxed));
  if (mode == Mode::kDisabled) {
    p->flags = kPermitActive;
    return Decision::kAdmitted;
  }
  if (mode == Mode::kForcedOpen) return Reject(slot, p, Decision::kRejectedOpen);
  // Shadow mode takes every step enforce takes and lets the attempt go out whatever they
  // decide: an attempt enforce would refuse counts once, as shadow_would_reject, and the steps
  // after the refusal still run (a first attempt deposits and counts), since the call is real.
  const bool shadow = mode == Mode::kShadow;
  bool would_reject = false;
  p->flags = kPermitActive | kPermitRecord;

  uint64_t now_cache = 0;
  bool have_now = false;
  auto now_ns = [&] {
    if (!have_now) {
      now_cache = now();
      have_now = true;
    }
    return now_cache;
  };

  // 1. The breaker. A closed breaker costs one load.
  Decision d = Decision::kAdmitted;
  if (BreakerWord::Decode(slot.breaker.load(std::memory_order_acquire)).state !=
      BreakerState::kClosed) {
    d = AdmitBreaker(slot, now_ns(), caller, p);
    if (!IsAdmitted(d)) {
      if (!shadow) return Reject(slot, p, d);
      would_reject = true;
      d = Decision::kAdmitted;
    }
  }

  // 2. The bulkhead, if any: a lease among the first `limit` words, starting at a spread
  // offset so that processes do not all contend on word 0.
  if (const uint32_t limit = LoadKnob<Knob::bulkhead_limit>(slot.policy); limit > 0) {
    const uint32_t now_ms = NsToMs32(now_ns());
    const uint64_t lease = MakeLease(caller.owner, ++caller.lease_tag, now_ms,
                                     LoadKnob<Knob::bulkhead_timeout_ms>(slot.policy));
    const uint32_t start = (uint32_t(caller.owner) * 2654435761u + caller.lease_tag) % limit;
    int i = Lease::TryAcquire(slot.bulkhead_leases, limit, start, lease);
    if (i < 0 && ReclaimExpired(slot, now_ns(), caller) > 0) {
      i = Lease::TryAcquire(slot.bulkhead_leases, limit, start, lease);
    }
    if (i >= 0) {
      p->bulkhead_lease = lease;
      p->bulkhead_index = uint16_t(i);
      p->flags |= kPermitBulkhead;
    } else if (shadow) {
      would_reject = true;
    } else {
      return Reject(slot, p, Decision::kRejectedBulkheadFull);
    }
  }

  // 3. The retry budget: first attempts deposit, retries withdraw.
  const uint32_t burst = LoadKnob<Knob::retry_burst>(slot.policy);
  if (attempt == 0) {
    RetryBudget::Deposit(slot.budget, LoadKnob<Knob::retry_ratio_milli>(slot.policy), burst);
    Count(slot, kFirstAttempts);
  } else if (RetryBudget::TryWithdraw(slot.budget, NsToMs32(now_ns()),
                                      LoadKnob<Knob::min_retries_per_sec>(slot.policy), burst)) {
    Count(slot, kRetriesGranted);
  } else if (shadow) {
    would_reject = true;
  } else {
    return Reject(slot, p, Decision::kRejectedBudgetEmpty);
  }
  if (would_reject) Count(slot, kShadowWouldReject);
  // A probe counts once it goes out: the bulkhead or the budget may still have refused it.
  if (d == Decision::kAdmittedProbe) Count(slot, kProbesGranted);
  p->decision = uint8_t(d);
  return d;
}

}  // namespace

Decision Admit(DependencySlot& slot, uint32_t index, uint32_t attempt, uint64_t now_ns,
               Caller& caller, Permit* p) {
  return AdmitImpl(
      slot, index, attempt, [now_ns] { return now_ns; }, caller, p);
}

Decision Admit(DependencySlot& slot, uint32_t index, uint32_t attempt, uint64_t (*now_ns)(),
               Caller& caller, Permit* p) {
  return AdmitImpl(slot, index, attempt, now_ns, caller, p);
}

void Complete(DependencySlot& slot, Permit* p, Outcome outcome, uint64_t latency_ns,
              uint64_t now_ns, Caller& caller) {
  if (!(p->flags & kPermitActive)) return;
  p->flags &= uint8_t(~kPermitActive);
  // A slot reassigned since admit: give back the leases (their words are unique), record nothing.
  if (!(p->flags & kPermitRecord) || slot.generation.load(kRelaxed) != p->generation) {
    ReleaseLeases(slot, p);
    return;
  }
  const uint32_t slow_ms = LoadKnob<Knob::slow_call_ms>(slot.policy);
  const bool slow =
      slow_ms != 0 && outcome != Outcome::kIgnored && latency_ns >= uint64_t{slow_ms} * 1'000'000u;
  Count(slot, outcome == Outcome::kSuccess   ? kSuccesses
              : outcome == Outcome::kFailure ? kFailures
                                             : kIgnored);
  if (slow) Count(slot, kSlowCalls);
  const bool failed = outcome == Outcome::kFailure || slow;

  if (p->flags & kPermitProbe) {
    // Only the half-open the probe was granted in hears of it, and only while the probe still
    // holds its lease: one that expired was counted as failed already, and one voided belongs
    // to a half-open that has ended. An ignored outcome says nothing about the dependency.
    const bool held =
        Lease::Release(slot.probe_leases[p->probe_index % kMaxProbes], p->probe_lease);
    p->flags &= uint8_t(~kPermitProbe);
    if (held && failed) {
      ReportProbe(slot, ProbeOutcome::kFailed, now_ns);
      ApplyBreakerEvent(slot, BreakerEvent::kProbeFailed, now_ns, p->breaker_seq, caller.rng);
    } else if (held && outcome != Outcome::kIgnored) {
      ReportProbe(slot, ProbeOutcome::kSucceeded, now_ns);
      ApplyBreakerEvent(slot, BreakerEvent::kProbeSucceeded, now_ns, p->breaker_seq, caller.rng);
    }
  } else if (outcome != Outcome::kIgnored) {
    RecordOutcome(slot, now_ns, outcome == Outcome::kFailure, slow, caller.rng);
  }
  ReleaseLeases(slot, p);
}

uint32_t ReclaimExpired(DependencySlot& slot, uint64_t now_ns, Caller& caller, Sweep sweep) {
  const uint32_t now_ms = NsToMs32(now_ns);
  uint32_t freed = 0;
  // A probe of the current half-open that outlived its timeout failed: the breaker reopens. A
  // probe of an earlier half-open only gives its word back.
  const BreakerWord b = BreakerWord::Decode(slot.breaker.load(std::memory_order_acquire));
  bool current_probe_expired = false;
  for (auto& word : slot.probe_leases) {
    uint64_t w = word.load(kRelaxed);
    if (!Lease::Expired(w, now_ms) || !word.compare_exchange_strong(w, 0, kRelaxed)) continue;
    ++freed;
    Count(slot, kLeasesReclaimedExpired);
    if (b.state == BreakerState::kHalfOpen && Lease::Tag(w) == b.seq) {
      Count(slot, kProbeTimeouts);
      current_probe_expired = true;
    }
  }
  if (current_probe_expired) {
    ReportProbe(slot, ProbeOutcome::kExpired, now_ns);
    ApplyBreakerEvent(slot, BreakerEvent::kProbeExpired, now_ns, b.seq, caller.rng);
  }
  const uint32_t bulkhead_words =
      sweep == Sweep::kAllWords ? kMaxBulkhead : LoadKnob<Knob::bulkhead_limit>(slot.policy);
  for (uint32_t i = 0; i < bulkhead_words; ++i) {
    uint64_t w = slot.bulkhead_leases[i].load(kRelaxed);
    if (!Lease::Expired(w, now_ms) ||
        !slot.bulkhead_leases[i].compare_exchange_strong(w, 0, kRelaxed)) {
      continue;
    }
    ++freed;
    Count(slot, kLeasesReclaimedExpired);
  }
  return freed;
}

void Reset(DependencySlot& slot, uint64_t now_ns) {
  uint32_t rng = 1;  // a reset closes: nothing to draw
  ApplyBreakerEvent(slot, BreakerEvent::kReset, now_ns, 0, rng);
  // An empty window in every state: a head with no bucket bits (breaker.h) holds no calls, and
  // the first call of each period starts its bucket anew.
  slot.window_head.store(0, std::memory_order_release);
  const uint64_t burst = LoadKnob<Knob::retry_burst>(slot.policy);
  slot.budget.store(RetryBudget::Make(burst * RetryBudget::kTokenScale, NsToMs32(now_ns)),
                    kRelaxed);
}

}  // namespace retryd::shm
