// tests/shm/model/dependency_model.h: a reference model of one dependency slot, for tests.
//
// DependencyModel is what one slot does, written down from the headers of shm/ (admission.h,
// breaker.h, retry_budget.h, leases.h, clock.h) and docs/ARCHITECTURE.md as plain sequential
// code: a retry budget, a bucketed window and the breaker's state machine, probe and bulkhead
// leases, the four modes and every counter. It never calls the shm algorithms; it shares only
// their vocabulary (Policy, Mode, Decision, Outcome, Counter, BreakerState). A test drives the
// real slot and the model with the same operations and compares them after each one
// (tests/shm/model_test.cc).
//
// Time is a 64-bit count of milliseconds. Where a header says that a word keeps milliseconds
// modulo 2^32 and states what that reading decides, the model applies the same reading, and
// says so where it does: the retry budget's elapsed time and the deadlines of open periods and
// leases. Everywhere else the model keeps the exact time.
//
// Leases are tracked by identity (a serial number per lease taken), not by their word's value:
// a permit holds its lease exactly until it releases it or the lease is freed under it (expiry,
// voiding, its owner reaped). Bulkhead leases are a set: which word the real code picks is its
// own business, and the test keeps bulkhead_limit fixed so that every word is under the limit.
//
// Shadow mode is modelled as evaluating every step as enforce would, and admitting anyway: an
// attempt enforce would refuse counts once in shadow_would_reject and in no rejection counter;
// a first attempt always deposits; a lease or a budget token is taken only if one is there.
//
// Thread safety: none. One model per test, driven from one thread.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <vector>

#include "shm/admission.h"
#include "shm/breaker.h"
#include "shm/layout.h"
#include "shm/policy.h"

namespace retryd::model {

// A virtual thread, as the model sees it: the owner of its leases and its random state (the
// xorshift the header of breaker.h specifies, drawn once per breaker event that opens).
struct ModelThread {
  uint16_t owner = 1;
  uint32_t rng = 1;
};

// What an admitted attempt holds in the model until Complete.
struct ModelPermit {
  bool active = false;   // admitted and not yet completed
  bool record = false;   // its outcome is recorded (every mode but disabled)
  uint64_t probe_lease = 0;     // lease serial, 0 if none
  uint32_t probe_index = 0;
  uint16_t probe_seq = 0;       // the half-open the probe was granted in
  uint64_t bulkhead_lease = 0;  // lease serial, 0 if none
};

struct ModelBreaker {
  shm::BreakerState state = shm::BreakerState::kClosed;
  uint32_t reopens = 0;
  uint32_t successes = 0;
  uint16_t seq = 0;
  uint64_t time_ms = 0;  // open: until; closed: when it closed; half-open: when it began
};

struct ModelWindowStats {
  uint64_t calls = 0;
  uint64_t failures = 0;
  uint64_t slow = 0;
};

struct ModelLease {
  uint64_t serial = 0;  // 0: free
  uint16_t owner = 0;
  uint16_t tag = 0;     // probes: the seq of the half-open it was granted in
  uint64_t expiry_ms = 0;
};

class DependencyModel {
 public:
  // A slot with `policy` (mode included) that an operator has just reset at `now_ms`: closed,
  // an empty window, a full retry budget, no lease taken; `closed` counts that reset.
  DependencyModel(const shm::Policy& policy, uint64_t now_ms);

  void SetMode(shm::Mode mode) { mode_ = mode; }
  // SetPolicy publishes a new policy (mode excluded). The window's shape, half_open_probes and
  // bulkhead_limit must stay as they were: the model does not follow a reshaped window.
  void SetPolicy(const shm::Policy& policy);
  const shm::Policy& policy() const { return policy_; }
  shm::Mode mode() const { return mode_; }

  // The hot path and the janitors, as admission.h describes them.
  shm::Decision Admit(uint32_t attempt, uint64_t now_ms, ModelThread& thread, ModelPermit* p,
                      bool may_probe = true);
  void Complete(ModelPermit* p, shm::Outcome outcome, uint64_t latency_ns, uint64_t now_ms,
                ModelThread& thread);
  uint32_t ReclaimExpired(uint64_t now_ms, ModelThread& thread);
  // ReclaimOwner frees every lease of `owner` (a dead process reaped by the daemon).
  uint32_t ReclaimOwner(uint16_t owner);
  void Reset(uint64_t now_ms);

  // Observers, for comparison with the real slot.
  uint64_t counter(shm::Counter c) const { return counters_[c]; }
  const ModelBreaker& breaker() const { return breaker_; }
  ModelWindowStats Window(uint64_t now_ms) const;
  uint64_t budget_tokens_milli() const { return tokens_milli_; }
  // The count a reload leaves when it folds the stripes' deposits under the old cap: the
  // overshoot past the cap that single deposits leave (under one ratio) is not kept.
  void set_budget_tokens_milli(uint64_t tokens) { tokens_milli_ = tokens; }
  uint64_t budget_stamp_ms() const { return stamp_ms_; }
  // The whole thousandths of a token a retry would find at `now_ms`.
  uint64_t BudgetAvailableMilli(uint64_t now_ms) const { return Refilled(now_ms); }
  const ModelLease& probe_word(uint32_t i) const { return probes_[i]; }
  const std::vector<ModelLease>& bulkhead_leases() const { return bulkhead_; }
  // The first millisecond of the bucket period after that of `now_ms`, and whether a call has
  // been recorded in the period of `now_ms`.
  uint64_t NextBucketPeriodMs(uint64_t now_ms) const;
  bool RecordedInPeriodOf(uint64_t now_ms) const;
  // Probe leases taken under the current half-open (0 unless half-open).
  uint32_t CurrentProbesInFlight() const;

 private:
  struct Counts {
    uint32_t calls = 0, failures = 0, slow = 0;
  };

  void Count(shm::Counter c) { ++counters_[c]; }
  uint32_t NextRandom(ModelThread& thread);

  // Breaker.
  shm::Decision AdmitBreaker(uint64_t now_ms, ModelThread& thread, ModelPermit* p,
                             bool may_probe);
  void Enter(shm::BreakerState state, uint32_t reopens, uint64_t time_ms);
  void Open(uint32_t reopens, uint64_t now_ms, uint32_t random);
  uint64_t OpenPeriodMs(uint32_t reopens, uint32_t random) const;
  void RecordOutcome(uint64_t now_ms, bool failure, bool slow, ModelThread& thread);
  bool ShouldTrip(const ModelWindowStats& w) const;

  // Window.
  uint64_t BucketNs() const;
  void RecordCall(uint64_t now_ms, bool failure, bool slow);

  // Retry budget.
  uint64_t Refilled(uint64_t now_ms) const;
  void Deposit();
  bool TryWithdraw(uint64_t now_ms);

  // Leases.
  bool TakeBulkhead(uint64_t now_ms, uint16_t owner, ModelPermit* p);
  bool ReleaseProbe(ModelPermit* p);
  void ReleaseBulkhead(ModelPermit* p);
  void ReleaseLeases(ModelPermit* p);

  shm::Policy policy_;
  shm::Mode mode_;
  std::array<uint64_t, shm::kCounterSlots> counters_{};

  ModelBreaker breaker_;

  // The calls of each bucket period, for the periods in the window that ends with the newest
  // period any call was recorded in.
  std::map<uint64_t, Counts> periods_;
  uint64_t newest_period_ = 0;
  bool any_period_ = false;

  uint64_t tokens_milli_ = 0;
  uint64_t stamp_ms_ = 0;

  std::array<ModelLease, shm::kMaxProbes> probes_{};
  std::vector<ModelLease> bulkhead_;
  uint64_t next_serial_ = 1;
};

}  // namespace retryd::model
