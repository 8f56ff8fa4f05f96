// shm/breaker.h: the circuit breaker of one dependency: a state word and a bucketed window.
//
// State machine (Resilience4j semantics, host-wide):
//
//   state     | event                                   | next
//   ----------+-----------------------------------------+------------------------------------
//   Closed    | success / ignored                       | Closed
//   Closed    | failure or slow call, and the window    | Open (reopens = 0)
//             | has >= min_calls calls and failure rate |
//             | or slow-call rate >= its threshold      |
//   Open      | admit at or after `until`               | HalfOpen (successes = 0)
//   Open      | admit before `until`                    | Open (rejected)
//   HalfOpen  | admit, a probe lease free               | HalfOpen (admitted as probe)
//   HalfOpen  | admit, every probe lease taken          | HalfOpen (rejected, busy)
//   HalfOpen  | probe success, successes+1 < close_after| HalfOpen (successes + 1)
//   HalfOpen  | probe success, reaching close_after     | Closed (window restarts)
//   HalfOpen  | probe failure or probe timeout          | Open (reopens + 1)
//
// Open lasts min(open_for x 2^reopens, open_for_max) + uniform [0, open_jitter], so hosts that
// tripped together do not probe together.
//
// State word (DependencySlot::breaker):
//   bits  0..1   state (kClosed, kOpen, kHalfOpen)
//   bits  2..7   reopens, saturating at 63
//   bits  8..15  half-open probe successes
//   bits 16..31  seq, +1 on every transition (a probe completes only under its own seq)
//   bits 32..63  Open: until, ms mod 2^32; Closed: when it closed; HalfOpen: when it began
// Invariant: every transition is one CAS from the word the deciding process read.
//
// Window bucket word (DependencySlot::buckets[i], bucket i holds the periods p with
// p % window_buckets == i, of length window_ms / window_buckets):
//   bits  0..15  period number mod 2^16 (a bucket from another period counts as empty)
//   bits 16..31  calls   bits 32..47 failures   bits 48..63 slow calls  (each saturating)
// Approximation: a bucket counts at most 65,535 calls (beyond, its rates are those of its
// first 65,535 calls); a call completing at a period edge may land in either bucket; a window
// that spans the breaker's last close ignores the buckets before it, at bucket granularity.
// Thread safety: thread-safe and process-safe.
#pragma once

#include <cstdint>

#include "shm/layout.h"

namespace retryd::shm {

enum class BreakerState : uint32_t { kClosed = 0, kOpen = 1, kHalfOpen = 2 };
const char* BreakerStateName(BreakerState s);

struct BreakerWord {
  BreakerState state;
  uint32_t reopens;
  uint32_t successes;
  uint16_t seq;
  uint32_t time_ms;

  static BreakerWord Decode(uint64_t w) {
    uint32_t s = uint32_t(w & 3);
    return {s > 2 ? BreakerState::kClosed : BreakerState(s), uint32_t((w >> 2) & 63),
            uint32_t((w >> 8) & 255), uint16_t(w >> 16), uint32_t(w >> 32)};
  }
  uint64_t Encode() const {
    return uint64_t(state) | (uint64_t(reopens & 63) << 2) | (uint64_t(successes & 255) << 8) |
           (uint64_t(seq) << 16) | (uint64_t(time_ms) << 32);
  }
};

struct WindowStats {
  uint64_t calls = 0;
  uint64_t failures = 0;
  uint64_t slow = 0;
};

struct Bucket {
  static constexpr uint64_t kMax = 0xFFFF;
  static uint16_t Period(uint64_t w) { return uint16_t(w); }
  static uint64_t Calls(uint64_t w) { return (w >> 16) & kMax; }
  static uint64_t Failures(uint64_t w) { return (w >> 32) & kMax; }
  static uint64_t Slow(uint64_t w) { return (w >> 48) & kMax; }
  static uint64_t Make(uint16_t period, uint64_t calls, uint64_t failures, uint64_t slow) {
    return uint64_t(period) | (calls << 16) | (failures << 32) | (slow << 48);
  }
};

// ReadWindow reads the breaker window of `slot` at `now_ns`, honoring the last close.
WindowStats ReadWindow(const DependencySlot& slot, uint64_t now_ns);

// RecordCall adds one call to the window. To decide whether to trip, the caller reads the
// window afterwards (ReadWindow, ShouldTrip).
void RecordCall(DependencySlot& slot, uint64_t now_ns, bool failure, bool slow);

// ShouldTrip: calls >= min_calls and a rate at or over its threshold.
bool ShouldTrip(const DependencySlot& slot, const WindowStats& w);

// OpenPeriodMs: min(open_for x 2^reopens, open_for_max) + jitter in [0, open_jitter].
uint32_t OpenPeriodMs(const DependencySlot& slot, uint32_t reopens, uint32_t random);

// TryTransition CASes the breaker from `from` (as read) to `to`, bumping seq and counting the
// transition. Returns false if another process moved it first.
bool TryTransition(DependencySlot& slot, uint64_t from, BreakerWord to);

}  // namespace retryd::shm
