#include "shm/admission.h"

#include <algorithm>

#include "shm/breaker.h"
#include "shm/clock.h"
#include "shm/leases.h"
#include "shm/policy.h"
#include "shm/retry_budget.h"

namespace retryd::shm {

Stripe* UseStripe(DependencySlot& slot, uint32_t i) {
  if (i >= StripeCount(slot)) return nullptr;
  // In the map before the first write, so that a reader that finds the write finds the stripe.
  slot.stripes_written[i / 64].fetch_or(uint64_t{1} << (i % 64), std::memory_order_acq_rel);
  return &StripeAt(slot, i);
}

namespace admission_internal {
namespace {

// Bounded retries of a breaker decision that raced with a transition; past it, answer busy.
constexpr int kMaxBreakerRounds = 4;

uint64_t MakeLease(uint16_t owner, uint16_t tag, uint32_t now_ms, uint32_t timeout_ms) {
  return Lease::Make(owner, tag, now_ms + std::max<uint32_t>(timeout_ms, 1));
}

}  // namespace

// FoldDeposits takes every stripe's pending deposits
// into the budget word, capped at `burst`:
// each thousandth is taken once (a CAS on the stripe's deposits_taken), then added. A process
// killed between the two loses what it took: the budget grants less, never more.
void FoldDeposits(DependencySlot& slot, uint32_t burst) {
  uint64_t gained = 0;
  WrittenStripes(slot).ForEach([&](uint32_t i) {
    Stripe& s = StripeAt(slot, i);
    uint64_t taken = s.deposits_taken.load(kRelaxed);
    for (;;) {
      const uint64_t made = s.deposits.load(kRelaxed);
      if (made <= taken) break;
      if (s.deposits_taken.compare_exchange_weak(taken, made, kRelaxed)) {
        gained += made - taken;
        break;
      }
    }
  });
  if (gained > 0) RetryBudget::AddCapped(slot.budget, gained, burst);
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
Decision AdmitBreaker(DependencySlot& slot, uint64_t now_ns, Caller& caller, Permit* p,
                      bool may_probe) {
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
    if (!may_probe) return Decision::kRejectedHalfOpenBusy;
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
    // The lease is ours; it is a probe only if the breaker is still in the half-open we saw,
    // and the word still holds it: a caller stalled here while its lease expired, was swept
    // and 65,536 more half-opens brought the seq round again must not probe beside another.
    const BreakerWord again = BreakerWord::Decode(slot.breaker.load(std::memory_order_acquire));
    if (again.state != BreakerState::kHalfOpen || again.seq != b.seq) {
      Lease::Release(slot.probe_leases[i], lease);
      continue;
    }
    if (slot.probe_leases[i].load(std::memory_order_acquire) != lease) continue;
    p->probe_lease = lease;
    p->probe_index = uint8_t(i);
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

bool TakeBulkhead(DependencySlot& slot, uint32_t limit, uint64_t now_ns, Caller& caller,
                  Permit* p) {
  const uint32_t now_ms = NsToMs32(now_ns);
  const uint64_t lease = MakeLease(caller.owner, ++caller.lease_tag, now_ms,
                                   LoadKnob<Knob::bulkhead_timeout_ms>(slot.policy));
  // A spread start, so that processes do not all contend on word 0.
  const uint32_t start = (uint32_t(caller.owner) * 2654435761u + caller.lease_tag) % limit;
  int i = Lease::TryAcquire(slot.bulkhead_leases, limit, start, lease);
  if (i < 0 && ReclaimExpired(slot, now_ns, caller) > 0) {
    i = Lease::TryAcquire(slot.bulkhead_leases, limit, start, lease);
  }
  if (i < 0) return false;
  p->bulkhead_lease = lease;
  p->bulkhead_index = uint8_t(i);
  p->flags |= kPermitBulkhead;
  return true;
}

bool WithdrawRetry(DependencySlot& slot, uint32_t now_ms, uint32_t burst) {
  FoldDeposits(slot, burst);
  return RetryBudget::TryWithdraw(slot.budget, now_ms,
                                  LoadKnob<Knob::min_retries_per_sec>(slot.policy), burst);
}

void CompleteSlow(DependencySlot& slot, Permit* p, Outcome outcome, bool slow,
                  uint64_t latency_ns, uint64_t now_ns, Caller& caller) {
  if (outcome == Outcome::kSuccess) {
    CountSuccess(slot, StripeOf(slot, caller), caller, latency_ns);
  } else {
    Count(slot, outcome == Outcome::kFailure ? kFailures : kIgnored);
    CountLatency(slot, latency_ns);
  }
  if (slow) Count(slot, kSlowCalls);
  const bool failed = outcome == Outcome::kFailure || slow;

  if (p->flags & kPermitProbe) {
    // Only the half-open the probe was granted in hears of it, and only while the probe still
    // holds its lease: one that expired was counted as failed already, and one voided belongs
    // to a half-open that has ended. An ignored outcome says nothing about the dependency.
    // The outcome reaches the breaker before the lease is given back: the probe's place must
    // not be free while the half-open it reports on still stands, or another process would take
    // it and send a second probe after a failure, or after the success that closes.
    std::atomic<uint64_t>& word = slot.probe_leases[p->probe_index % kMaxProbes];
    const bool held = word.load(std::memory_order_acquire) == p->probe_lease;
    if (held && failed) {
      ReportProbe(slot, ProbeOutcome::kFailed, now_ns);
      ApplyBreakerEvent(slot, BreakerEvent::kProbeFailed, now_ns, p->breaker_seq, caller.rng);
    } else if (held && outcome != Outcome::kIgnored) {
      ReportProbe(slot, ProbeOutcome::kSucceeded, now_ns);
      ApplyBreakerEvent(slot, BreakerEvent::kProbeSucceeded, now_ns, p->breaker_seq, caller.rng);
    }
  } else if (outcome != Outcome::kIgnored) {
    RecordOutcome(slot, now_ns, outcome == Outcome::kFailure, slow, caller.rng, caller.stripe,
                  caller.stripe_mode, caller.cpu);
  }
  ReleaseLeases(slot, p);
}

}  // namespace admission_internal

using admission_internal::Count;

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

uint32_t ReclaimExpired(DependencySlot& slot, uint64_t now_ns, Caller& caller, Sweep sweep) {
  const uint32_t now_ms = NsToMs32(now_ns);
  uint32_t freed = 0;
  // A probe of the current half-open that outlived its timeout failed: the breaker reopens,
  // before the probe's place is free (as Complete reports before it gives a place back), so that
  // no admit takes a second probe in a half-open whose probe has already failed. A probe of an
  // earlier half-open only gives its word back. The breaker is read after each word: a
  // breaker read before the word could be older than the half-open the word's probe belongs to
  // (this sweeper descheduled while later half-opens began), and would free that probe's place
  // without reopening.
  bool reopened = false;
  uint16_t reopened_seq = 0;
  for (auto& word : slot.probe_leases) {
    uint64_t w = word.load(std::memory_order_acquire);
    if (!Lease::Expired(w, now_ms)) continue;
    const BreakerWord b = BreakerWord::Decode(slot.breaker.load(std::memory_order_acquire));
    const uint16_t tag = Lease::Tag(w);
    const bool current = (b.state == BreakerState::kHalfOpen && tag == b.seq) ||
                         (reopened && tag == reopened_seq);
    if (current && !reopened) {
      ReportProbe(slot, ProbeOutcome::kExpired, now_ns);
      ApplyBreakerEvent(slot, BreakerEvent::kProbeExpired, now_ns, b.seq, caller.rng);
      reopened = true;
      reopened_seq = b.seq;
    }
    if (!word.compare_exchange_strong(w, 0, kRelaxed)) continue;
    ++freed;
    Count(slot, kLeasesReclaimedExpired);
    if (current) Count(slot, kProbeTimeouts);
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

void FoldDeposits(DependencySlot& slot) {
  admission_internal::FoldDeposits(slot, LoadKnob<Knob::retry_burst>(slot.policy));
}

void StorePolicyOf(DependencySlot& slot, const Policy& policy) {
  FoldDeposits(slot);
  const uint32_t window_ms = LoadKnob<Knob::window_ms>(slot.policy);
  const uint32_t buckets = LoadKnob<Knob::window_buckets>(slot.policy);
  StorePolicy(policy, slot.policy);
  if (LoadKnob<Knob::window_ms>(slot.policy) != window_ms ||
      LoadKnob<Knob::window_buckets>(slot.policy) != buckets) {
    StartWindowAnew(slot);
  }
}

void DropStripeDeposits(DependencySlot& slot) {
  WrittenStripes(slot).ForEach([&](uint32_t i) {
    Stripe& s = StripeAt(slot, i);
    uint64_t taken = s.deposits_taken.load(kRelaxed);
    for (uint64_t made; (made = s.deposits.load(kRelaxed)) > taken;) {
      if (s.deposits_taken.compare_exchange_weak(taken, made, kRelaxed)) break;
    }
  });
}

void Reset(DependencySlot& slot, uint64_t now_ns) {
  // The deposits waiting in the stripes were made before the reset: it refills without them.
  DropStripeDeposits(slot);
  uint32_t rng = 1;  // a reset closes: nothing to draw
  ApplyBreakerEvent(slot, BreakerEvent::kReset, now_ns, 0, rng);
  // An empty window in every state: a head with no bucket bits (breaker.h) holds no calls, and
  // the first call of each period starts its bucket anew.
  StartEpoch(slot);
  const uint64_t burst = LoadKnob<Knob::retry_burst>(slot.policy);
  slot.budget.store(RetryBudget::Make(burst * RetryBudget::kTokenScale, NsToMs32(now_ns)),
                    kRelaxed);
}

}  // namespace retryd::shm
