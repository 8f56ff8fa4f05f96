// shm/admission.h: the hot path. "May this attempt go out?" and "how did it end?".
//
// Admit composes the mode, the breaker, the bulkhead and the retry budget of one dependency
// slot into one decision and records any lease it takes in the caller's Permit. Complete
// feeds the outcome back to the breaker window (or, for a probe, to the half-open state) and
// releases the leases. Time is a parameter: the client passes a coarse monotonic clock, tests
// and the simulator pass virtual time.
//
// Thread safety: thread-safe and process-safe. No syscall, lock, allocation or exception:
// only loads, stores, CAS and fetch-add on the slot, and restartable sequences on the caller's
// stripe (stripes.h). Every shared update is one single-word commit, so a process killed at
// any instruction leaves the slot consistent: at worst a lease it held stays taken until its
// owner is seen dead or it expires, or what it was moving out of a stripe (a period's successes,
// deposits) is lost, which can only make the window count fewer calls and the budget grant less.
#pragma once

#include <cstddef>
#include <cstdint>

#include "shm/breaker.h"
#include "shm/clock.h"
#include "shm/latency.h"
#include "shm/layout.h"
#include "shm/memory_order.h"
#include "shm/policy.h"
#include "shm/retry_budget.h"
#include "shm/stripes.h"

namespace retryd::shm {

// Decision values are the C ABI's RETRYD_ADMITTED... (retryd.h); keep them in step.
enum class Decision : uint32_t {
  kAdmitted = 0,              // go ahead
  kAdmittedProbe = 1,         // go ahead: this attempt is the half-open probe
  kRejectedOpen = 2,          // breaker open (or mode forced-open)
  kRejectedHalfOpenBusy = 3,  // half-open and the probe leases are all taken
  kRejectedBulkheadFull = 4,  // bulkhead full
  kRejectedBudgetEmpty = 5,   // a retry, and the retry budget has no token
};
inline bool IsAdmitted(Decision d) {
  return d == Decision::kAdmitted || d == Decision::kAdmittedProbe;
}
const char* DecisionName(Decision d);

enum class Outcome : uint32_t {
  kSuccess = 0,
  kFailure = 1,  // counts toward the breaker
  kIgnored = 2,  // not the dependency's fault (a 4xx): the breaker does not see it
};

// What an admitted attempt holds until Complete. Caller-owned, trivially copyable; the C ABI
// carries it in retryd_permit_t's private words.
struct Permit {
  uint32_t dependency;   // slot index
  uint32_t generation;   // slot generation at admit: a reassigned slot ignores the permit
  uint64_t probe_lease;  // the lease word taken, 0 if none
  uint64_t bulkhead_lease;
  uint8_t probe_index;     // < kMaxProbes
  uint8_t bulkhead_index;  // < kMaxBulkhead
  // The CPU the caller ran on at admit (Caller::cpu), or kNoStripe: where Complete's common path
  // writes without reading the CPU again (CompleteOnStripe).
  uint16_t cpu;
  uint16_t breaker_seq;  // breaker transition seq the probe was granted under
  uint8_t flags;         // kPermit*
  uint8_t decision;      // Decision
};
inline constexpr uint8_t kPermitActive = 1u << 0;  // admitted and not yet completed
inline constexpr uint8_t kPermitProbe = 1u << 1;
inline constexpr uint8_t kPermitBulkhead = 1u << 2;
inline constexpr uint8_t kPermitRecord = 1u << 3;  // record the outcome (not disabled mode)
// Admitted by AdmitFirstAttemptOnStripe: the stripe of `cpu` is in the map of the stripes
// written, which only grows, so CompleteOnAdmitStripe need not look at the map again.
inline constexpr uint8_t kPermitOnStripe = 1u << 4;
static_assert(sizeof(Permit) == 32 && alignof(Permit) == 8);

// ClearPermit zeroes `*p`'s 8-byte words from word `first` on, each in one 8-byte store. A
// permit is 8-byte aligned wherever its caller keeps it (its stack, the heap, a binding's
// buffer), so none of these stores crosses a cache line or a page. A compiler zeroes a permit
// in 16-byte stores at an 8-byte boundary, which cross a page when the permit straddles one (2
// stack placements in 256): every call of such a caller then took about 35 % longer
// (docs/BENCHMARKS.md, the placement mode). Word 0 is the dependency and the generation, which
// an admit writes whole: it clears from word 1.
inline void ClearPermit(Permit* p, int first = 0) {
  static_assert(offsetof(Permit, generation) == 4 && offsetof(Permit, probe_lease) == 8 &&
                sizeof(Permit) == 4 * sizeof(uint64_t));
  using Word = uint64_t __attribute__((__may_alias__));
  Word* words = reinterpret_cast<Word*>(p);
  // Relaxed atomic stores, which a compiler does not merge into wider ones.
  if (first <= 0) __atomic_store_n(&words[0], uint64_t{0}, __ATOMIC_RELAXED);
  __atomic_store_n(&words[1], uint64_t{0}, __ATOMIC_RELAXED);
  __atomic_store_n(&words[2], uint64_t{0}, __ATOMIC_RELAXED);
  __atomic_store_n(&words[3], uint64_t{0}, __ATOMIC_RELAXED);
}

// Per-thread context of the caller: who owns the leases, a random state for jitter, and the
// stripe it writes (stripes.h): that of the CPU it runs on, read just before the call, or
// kNoStripe. In kPerCpu mode the stripe's words are written only while the thread runs on `cpu`
// (OnCpu sets both); the stripe is the CPU's own, except under a test's `stripe_base`.
struct Caller {
  uint16_t owner;      // process registry owner id (kUnknownOwner if unregistered)
  uint16_t lease_tag;  // bumped per lease to keep lease words unique
  uint32_t rng;        // xorshift state, nonzero
  uint16_t stripe = kNoStripe;
  StripeMode stripe_mode = StripeMode::kPerCpu;
  uint16_t cpu = kNoStripe;  // kPerCpu: the CPU the stripe's sequences commit on

  // OnCpu: the caller runs on `c` (CurrentCpu, stripes.h) and writes its stripe. A test maps CPU
  // c onto stripe `stripe_base` + c, so that a host of 2 CPUs writes the stripes of CPU 1,000
  // (kNoStripe past kMaxStripes).
  void OnCpu(uint16_t c, uint32_t stripe_base = 0) {
    cpu = c;
    stripe = c != kNoStripe && c + stripe_base < kMaxStripes ? uint16_t(c + stripe_base)
                                                              : kNoStripe;
  }
};

// Admit decides whether attempt number `attempt` (0: first attempt) of a call to the
// dependency in `slot` may go out at `now_ns`, and fills *permit. Every Admit must be followed
// by exactly one Complete with the same permit, whatever the decision (a rejected permit
// completes as a no-op). Without `may_probe`, the attempt is never the half-open's probe (as
// AdmitAsBound below). Thread-safe.
inline Decision Admit(DependencySlot& slot, uint32_t index, uint32_t attempt, uint64_t now_ns,
                      Caller& caller, Permit* permit, bool may_probe = true);
// Admit with a clock instead of a time: `now_ns()` is called at most once, and not at all for
// a first attempt on a closed breaker (the common path), since a clock read costs about three
// uncontended CASes. Thread-safe.
inline Decision Admit(DependencySlot& slot, uint32_t index, uint32_t attempt,
                      uint64_t (*now_ns)(), Caller& caller, Permit* permit);
// AdmitAsBound is Admit with a clock for a caller that checked `slot` against `generation`, the
// slot's generation when it looked the dependency up (the client's handles): the permit carries
// `generation`, not the slot's generation read again, so that a slot given to another
// dependency after the check records nothing of this attempt's outcome (Complete). Admit
// itself may still count the attempt in the new dependency once (a first attempt and its
// deposit, or a withdrawal) if the slot changes hands during the call. Without `may_probe` the
// attempt is never the half-open's probe: while the breaker is half-open it is refused as
// kRejectedHalfOpenBusy, taking no lease and spending nothing (in shadow mode it goes out as
// an ordinary attempt, counted as one enforce would refuse): for an attempt without the time a
// probe needs, which would spend the half-open's probe on a timeout of its own. Thread-safe.
inline Decision AdmitAsBound(DependencySlot& slot, uint32_t index, uint32_t generation,
                             uint32_t attempt, uint64_t (*now_ns)(), Caller& caller,
                             Permit* permit, bool may_probe = true);

// AdmitFirstAttemptOnStripe is Admit's common path alone, for a caller that writes the stripe
// of the CPU it runs on in kPerCpu mode (the client): a first attempt (`attempt` 0) in enforce
// or shadow mode, breaker closed, no bulkhead, by a caller on CPU `cpu` (CurrentCpu, stripes.h)
// whose stripe is already in the map of the stripes written. Then it does what AdmitAsBound
// does there (the deposit, the first attempt counted, the permit filled, decision kAdmitted),
// sets kPermitOnStripe and returns true; otherwise it returns false having written nothing, and
// the caller calls AdmitAsBound. It needs no lease tag and no random state. Thread-safe.
inline bool AdmitFirstAttemptOnStripe(DependencySlot& slot, uint32_t index, uint32_t generation,
                                      uint32_t attempt, uint16_t cpu, Permit* permit);

// CompletesOnAdmitStripe: may `permit` complete with `outcome` through CompleteOnAdmitStripe?
// (Admitted by AdmitFirstAttemptOnStripe, holding no lease, a success.) A test of the permit's
// own words: the caller reads its clock only then.
inline bool CompletesOnAdmitStripe(const Permit& permit, Outcome outcome);
// CompleteOnAdmitStripe is CompleteOnStripe for a permit that CompletesOnAdmitStripe accepted,
// written in the stripe of the CPU admit ran on (`permit->cpu`), in kPerCpu mode, without
// looking at the map of the stripes written again. True if it completed the permit; false if it
// wrote nothing and Complete must (on another CPU now, the sequences refuse). Thread-safe.
inline bool CompleteOnAdmitStripe(DependencySlot& slot, Permit* permit, uint64_t latency_ns,
                                  uint64_t now_ns);

// CompleteOnStripe is Complete's common path alone: a success, not slow, holding no lease, in
// the window period the caller's stripe holds, written in that stripe. True if it completed the
// permit; false if it did nothing and Complete must. `caller` needs no lease tag or random state
// (the client passes the CPU the permit was admitted on, not read again: on another CPU now, the
// sequences refuse and Complete takes it). Thread-safe.
inline bool CompleteOnStripe(DependencySlot& slot, Permit* permit, Outcome outcome,
                             uint64_t latency_ns, uint64_t now_ns, const Caller& caller);
// Complete records how the admitted attempt in *permit ended and releases its leases.
// `latency_ns` decides whether the call was slow, and counts in the latency histogram
// (latency.h). A probe's outcome reaches the breaker only if
// the probe still held its lease (not expired and reclaimed, which counted as a failed probe,
// nor voided because its half-open ended); the counters count every completion. A probe
// whose outcome is kIgnored says nothing of the dependency's health: its place goes to the next
// caller, which probes in the same half-open (as a probe's does when its process dies and the
// daemon reclaims its lease: registry.h). Calling it twice with one permit is a no-op the
// second time. Thread-safe.
inline void Complete(DependencySlot& slot, Permit* permit, Outcome outcome, uint64_t latency_ns,
                     uint64_t now_ns, Caller& caller);

// ReclaimExpired (daemon tick, and Admit when it finds every lease taken) frees leases past
// their expiry; an expired probe of the current half-open is a failed probe and reopens the
// breaker (one of an earlier half-open only gives its word back). kLimits
// sweeps every probe word and the bulkhead words under the current limit; kAllWords also the
// bulkhead words above it, which a reload that lowered the limit may have left taken. The
// daemon sweeps every slot that is not free, retired ones included, with kAllWords once per
// sweep period. Returns the number of leases freed. Thread-safe.
enum class Sweep { kLimits, kAllWords };
uint32_t ReclaimExpired(DependencySlot& slot, uint64_t now_ns, Caller& caller,
                        Sweep sweep = Sweep::kLimits);

// FoldDeposits takes the retry-budget deposits waiting in the stripes (stripes.h) into the
// budget word, capped at the slot's retry_burst: each thousandth is taken once (a CAS on its
// stripe's deposits_taken), then added; a process killed between the two loses what it took,
// so the budget grants less, never more. Every withdrawal folds first; a writer of the slot's
// policy folds before it stores a new one, so that deposits made under the old cap are capped
// by it. Thread-safe.
void FoldDeposits(DependencySlot& slot);

// StorePolicyOf publishes `policy` into the policy words of the live slot `slot` as every writer
// of a live slot's policy must: the deposits waiting in the stripes are folded first, under the
// cap they were made with, and a change of the window's shape (window or window_buckets) starts
// the window anew once the new shape is stored (StartWindowAnew, breaker.h), since the periods
// of the old shape are not periods of the new. Daemon only; safe against workers. Thread-safe.
void StorePolicyOf(DependencySlot& slot, const Policy& policy);

// Reset (operator) closes the breaker, clears the window and refills the retry budget (the
// deposits waiting in the stripes are dropped: the refill replaces them).
void Reset(DependencySlot& slot, uint64_t now_ns);

// DropStripeDeposits drops the deposits waiting in the stripes of `slot`: each stripe's
// deposits_taken is moved up to its deposits, as a withdrawal takes them, so that no stripe
// word is written from another CPU (stripes.h). A deposit that races it stays. Thread-safe.
void DropStripeDeposits(DependencySlot& slot);

}  // namespace retryd::shm

#include "shm/admission_inline.h"  // IWYU pragma: export
