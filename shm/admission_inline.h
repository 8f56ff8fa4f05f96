// shm/admission_inline.h: the common path of Admit and Complete, compiled into the caller.
//
// Included by admission.h only. A first attempt on a closed breaker and its successful
// completion run entirely here, so that the client library's call is one function deep; every
// step that is not that path (a breaker that is not closed, the bulkhead, a retry, a failure, a
// probe, a rejection) is a call into admission.cc.
#pragma once

namespace retryd::shm {
namespace admission_internal {

inline void Count(DependencySlot& slot, Counter c) { slot.counters[c].fetch_add(1, kRelaxed); }

// The caller's stripe of `slot`, or nullptr when it writes the shared words (stripes.h). A
// stripe's first writer puts it in the map of the stripes written (UseStripe, out of line).
inline Stripe* StripeOf(DependencySlot& slot, const Caller& caller) {
  if (__builtin_expect(StripeWritten(slot, caller.stripe), 1)) return &StripeAt(slot, caller.stripe);
  return caller.stripe < StripeCount(slot) ? UseStripe(slot, caller.stripe) : nullptr;
}

// The functions below write the caller's stripe `s` (StripeOf), or the shared words when it is
// nullptr or its sequence is refused.

// CountStriped counts one `c` (a striped counter) in the caller's stripe, or the shared word.
inline void CountStriped(DependencySlot& slot, Stripe* s, const Caller& caller, Counter c) {
  if (s != nullptr && StripeAdd(*StripedCounter(*s, c), 1, caller.cpu, caller.stripe_mode)) {
    return;
  }
  Count(slot, c);
}

// CountLatency counts one call of `latency_ns` in the slot's shared histogram (latency.h).
inline void CountLatency(DependencySlot& slot, uint64_t latency_ns) {
  slot.latency[LatencyBucket(latency_ns)].fetch_add(1, kRelaxed);
  slot.latency_sum_us.fetch_add(LatencyUs(latency_ns), kRelaxed);
}

// CountSuccess counts a success and its latency in the caller's stripe (its bucket there is the
// stripe's success count), or in the shared words.
inline void CountSuccess(DependencySlot& slot, Stripe* s, const Caller& caller,
                         uint64_t latency_ns) {
  if (s != nullptr && StripeAdd(s->successes_by_latency[LatencyBucket(latency_ns)], 1, caller.cpu,
                                caller.stripe_mode)) {
    const uint64_t us = LatencyUs(latency_ns);
    if (!StripeAdd(s->success_latency_us, us, caller.cpu, caller.stripe_mode)) {
      slot.latency_sum_us.fetch_add(us, kRelaxed);
    }
    return;
  }
  Count(slot, kSuccesses);
  CountLatency(slot, latency_ns);
}

// Deposit: a first attempt's share of a retry, in the caller's stripe (or the shared word),
// unless the budget word already holds `burst` tokens (retry_budget.h).
inline void Deposit(DependencySlot& slot, Stripe* s, const Caller& caller, uint32_t ratio_milli,
                    uint32_t burst) {
  if (ratio_milli == 0 || RetryBudget::Full(slot.budget.load(kRelaxed), burst)) return;
  if (s != nullptr && StripeAdd(s->deposits, ratio_milli, caller.cpu, caller.stripe_mode)) {
    return;
  }
  slot.budget.fetch_add(ratio_milli, kRelaxed);
}

// Out of line (admission.cc): the steps off the common path.
// AdmitBreaker decides for a breaker that is not closed; on a probe grant it fills the permit's
// probe fields. Without `may_probe`, a half-open breaker refuses as busy and takes no lease.
Decision AdmitBreaker(DependencySlot& slot, uint64_t now_ns, Caller& caller, Permit* p,
                      bool may_probe);
// Reject refuses the attempt: counts the reason and gives back any lease already taken.
Decision Reject(DependencySlot& slot, Permit* p, Decision d);
// ReleaseLeases gives back the leases the permit holds.
void ReleaseLeases(DependencySlot& slot, Permit* p);
// TakeBulkhead takes a bulkhead lease among the first `limit` words into the permit.
bool TakeBulkhead(DependencySlot& slot, uint32_t limit, uint64_t now_ns, Caller& caller,
                  Permit* p);
// FoldDeposits takes every stripe's pending deposits into the budget word, capped at `burst`.
void FoldDeposits(DependencySlot& slot, uint32_t burst);
// WithdrawRetry folds the stripes' deposits into the budget word and takes one token from it.
bool WithdrawRetry(DependencySlot& slot, uint32_t now_ms, uint32_t burst);
// CompleteSlow records every outcome but a plain success already in its stripe's period.
void CompleteSlow(DependencySlot& slot, Permit* p, Outcome outcome, bool slow,
                  uint64_t latency_ns, uint64_t now_ns, Caller& caller);

// kReadGeneration: AdmitImpl's `generation` when the permit takes the slot's own.
inline constexpr uint64_t kReadGeneration = ~uint64_t{0};

// AdmitImpl is Admit with a lazy clock: `now()` is read at most once, and only on paths that
// need the time (a breaker that is not closed, the bulkhead, a retry). A first attempt on a
// closed breaker reads no clock. The permit carries `generation`, or the slot's own with
// kReadGeneration. Without `may_probe`, the attempt is never the half-open's probe (AdmitBreaker).
template <typename NowFn>
[[gnu::always_inline]] inline Decision AdmitImpl(DependencySlot& slot, uint32_t index,
                                                uint64_t generation, uint32_t attempt, NowFn now,
                                                Caller& caller, Permit* p,
                                                bool may_probe = true) {
  ClearPermit(p, 1);
  p->dependency = index;
  p->generation = generation == kReadGeneration ? slot.generation.load(kRelaxed)
                                                : uint32_t(generation);
  p->cpu = caller.cpu;
  const Mode mode = Mode(slot.mode.load(kRelaxed));
  if (__builtin_expect(mode == Mode::kDisabled, 0)) {
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
  if (__builtin_expect(BreakerWord::Decode(slot.breaker.load(std::memory_order_acquire)).state !=
                           BreakerState::kClosed,
                       0)) {
    d = AdmitBreaker(slot, now_ns(), caller, p, may_probe);
    if (!IsAdmitted(d)) {
      if (!shadow) return Reject(slot, p, d);
      would_reject = true;
      d = Decision::kAdmitted;
    }
  }

  // 2. The bulkhead, if any.
  if (const uint32_t limit = LoadKnob<Knob::bulkhead_limit>(slot.policy); limit > 0) {
    if (!TakeBulkhead(slot, limit, now_ns(), caller, p)) {
      if (!shadow) return Reject(slot, p, Decision::kRejectedBulkheadFull);
      would_reject = true;
    }
  }

  // 3. The retry budget: first attempts deposit, retries withdraw.
  const uint32_t burst = LoadKnob<Knob::retry_burst>(slot.policy);
  if (attempt == 0) {
    Stripe* const stripe = StripeOf(slot, caller);
    Deposit(slot, stripe, caller, LoadKnob<Knob::retry_ratio_milli>(slot.policy), burst);
    CountStriped(slot, stripe, caller, kFirstAttempts);
  } else if (WithdrawRetry(slot, NsToMs32(now_ns()), burst)) {
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

}  // namespace admission_internal

[[gnu::always_inline]] inline Decision Admit(DependencySlot& slot, uint32_t index,
                                             uint32_t attempt, uint64_t now_ns, Caller& caller,
                                             Permit* p, bool may_probe) {
  return admission_internal::AdmitImpl(
      slot, index, admission_internal::kReadGeneration, attempt, [now_ns] { return now_ns; },
      caller, p, may_probe);
}

[[gnu::always_inline]] inline Decision Admit(DependencySlot& slot, uint32_t index,
                                             uint32_t attempt, uint64_t (*now_ns)(),
                                             Caller& caller, Permit* p) {
  return admission_internal::AdmitImpl(slot, index, admission_internal::kReadGeneration, attempt,
                                       now_ns, caller, p);
}

[[gnu::always_inline]] inline Decision AdmitAsBound(DependencySlot& slot, uint32_t index,
                                                    uint32_t generation, uint32_t attempt,
                                                    uint64_t (*now_ns)(), Caller& caller,
                                                    Permit* p, bool may_probe) {
  return admission_internal::AdmitImpl(slot, index, generation, attempt, now_ns, caller, p,
                                       may_probe);
}

[[gnu::always_inline]] inline bool AdmitFirstAttemptOnStripe(DependencySlot& slot,
                                                             uint32_t index, uint32_t generation,
                                                             uint32_t attempt, uint16_t cpu,
                                                             Permit* p) {
  using namespace admission_internal;
  // The steps AdmitImpl takes in this case, its checks all first, so that a decline has
  // written nothing; any other case is AdmitImpl's.
  if (attempt != 0 || !StripeWritten(slot, cpu)) return false;
  const Mode mode = Mode(slot.mode.load(kRelaxed));
  if (mode != Mode::kEnforce && mode != Mode::kShadow) return false;
  if (BreakerWord::Decode(slot.breaker.load(std::memory_order_acquire)).state !=
          BreakerState::kClosed ||
      LoadKnob<Knob::bulkhead_limit>(slot.policy) != 0) {
    return false;
  }
  ClearPermit(p, 1);
  p->dependency = index;
  p->generation = generation;
  p->cpu = cpu;
  p->flags = kPermitActive | kPermitRecord | kPermitOnStripe;
  p->decision = uint8_t(Decision::kAdmitted);
  Caller caller{0, 0, 1};
  caller.OnCpu(cpu);  // cpu < kMaxStripes (StripeWritten): its own stripe
  Stripe* const stripe = &StripeAt(slot, cpu);
  Deposit(slot, stripe, caller, LoadKnob<Knob::retry_ratio_milli>(slot.policy),
          LoadKnob<Knob::retry_burst>(slot.policy));
  CountStriped(slot, stripe, caller, kFirstAttempts);
  return true;
}

[[gnu::always_inline]] inline bool CompletesOnAdmitStripe(const Permit& p, Outcome outcome) {
  return (p.flags & (kPermitActive | kPermitRecord | kPermitProbe | kPermitBulkhead |
                     kPermitOnStripe)) == (kPermitActive | kPermitRecord | kPermitOnStripe) &&
         outcome == Outcome::kSuccess;
}

[[gnu::always_inline]] inline bool CompleteOnAdmitStripe(DependencySlot& slot, Permit* p,
                                                         uint64_t latency_ns, uint64_t now_ns) {
  using namespace admission_internal;
  // As CompleteOnStripe, the map aside: the slot's own generation, not slow, the period held.
  // The bound on `cpu` keeps a scribbled permit's stripe inside the segment.
  const uint16_t cpu = p->cpu;
  if (cpu >= kMaxStripes || slot.generation.load(kRelaxed) != p->generation) return false;
  const uint32_t slow_ms = LoadKnob<Knob::slow_call_ms>(slot.policy);
  if (slow_ms != 0 && latency_ns >= uint64_t{slow_ms} * 1'000'000u) return false;
  if (!RecordSuccessInStripePeriod(slot, now_ns, cpu, cpu, StripeMode::kPerCpu)) return false;
  p->flags &= uint8_t(~kPermitActive);
  Caller caller{0, 0, 1};
  caller.OnCpu(cpu);
  CountSuccess(slot, &StripeAt(slot, cpu), caller, latency_ns);
  return true;
}

[[gnu::always_inline]] inline bool CompleteOnStripe(DependencySlot& slot, Permit* p,
                                                    Outcome outcome, uint64_t latency_ns,
                                                    uint64_t now_ns, const Caller& caller) {
  using namespace admission_internal;
  // Active, recording, on the slot's own generation; a success that is not slow; no lease.
  if ((p->flags & (kPermitActive | kPermitRecord | kPermitProbe | kPermitBulkhead)) !=
          (kPermitActive | kPermitRecord) ||
      outcome != Outcome::kSuccess || slot.generation.load(kRelaxed) != p->generation) {
    return false;
  }
  const uint32_t slow_ms = LoadKnob<Knob::slow_call_ms>(slot.policy);
  if (slow_ms != 0 && latency_ns >= uint64_t{slow_ms} * 1'000'000u) return false;
  Stripe* const stripe = StripeOf(slot, caller);
  if (stripe == nullptr ||
      !RecordSuccessInStripePeriod(slot, now_ns, caller.stripe, caller.cpu, caller.stripe_mode)) {
    return false;
  }
  p->flags &= uint8_t(~kPermitActive);
  CountSuccess(slot, stripe, caller, latency_ns);
  return true;
}

[[gnu::always_inline]] inline void Complete(DependencySlot& slot, Permit* p, Outcome outcome,
                                            uint64_t latency_ns, uint64_t now_ns,
                                            Caller& caller) {
  using namespace admission_internal;
  // The common path: a success, not slow, holding no lease, recorded in its stripe's period.
  if (__builtin_expect(CompleteOnStripe(slot, p, outcome, latency_ns, now_ns, caller), 1)) return;
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
  CompleteSlow(slot, p, outcome, slow, latency_ns, now_ns, caller);
}

}  // namespace retryd::shm
