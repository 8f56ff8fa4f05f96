// shm/breaker.h: the circuit breaker of one dependency: a state word, a bucketed window, and
// the one function that moves the state.
//
// State machine (Resilience4j semantics, host-wide). Every row is one BreakerEvent, applied by
// ApplyBreakerEvent and nothing else:
//
//   state     | event                                    | next
//   ----------+------------------------------------------+-----------------------------------
//   Closed    | kTrip: a failure or slow call recorded,   | Open (reopens = 0)
//             | and the window has >= min_calls calls and |
//             | failure or slow-call rate >= its threshold|
//   Open      | kOpenPeriodOver: an admit at/after `until`| HalfOpen (successes = 0)
//             | (OpenPeriodOver decides; the table does   |
//             | not look at the time)                     |
//   Open      | (an admit before `until`)                 | Open (rejected by admission)
//   HalfOpen  | (admit, a probe lease free)               | HalfOpen (admitted as probe)
//   HalfOpen  | (admit, every probe lease taken)          | HalfOpen (rejected, busy)
//   HalfOpen  | kProbeSucceeded, successes+1 < close_after| HalfOpen (successes + 1, same seq)
//   HalfOpen  | kProbeSucceeded, reaching close_after     | Closed (window restarts)
//   HalfOpen  | kProbeFailed                              | Open (reopens + 1)
//   HalfOpen  | kProbeExpired: a probe lease of this      | Open (reopens + 1)
//             | half-open timed out                       |
//   any       | kReset: an operator's reset               | Closed
//   Open      | kFleetClosed: the fleet's probe succeeded | Closed (window restarts)
//   Open      | kFleetReopened: the fleet's probe failed  | Open (reopens + 1)
//
// The two fleet rows are the daemon's, in fleet mode (daemon/fleet.h), and so is the one change
// of an open word that is not a transition: SetOpenUntil moves an open period's end (same seq,
// same reopens), to hold a host open while another host probes for the fleet.
//
// The probe events apply only to the half-open the probe was granted in (its seq, which its
// lease word carries as its tag: leases.h); an event that does not apply to the state it finds
// changes nothing. Entering half-open voids the probe leases of earlier half-opens, and a probe
// reports only while it still holds its lease (admission.h), so an old probe cannot become
// current again when the 16-bit seq wraps: its lease is gone by then (voided when the next
// half-open began, or, if the process that began it died before voiding, taken over by a new
// probe or freed at its expiry).
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
// Breaker time word (DependencySlot::breaker_time), stored by the process that committed a
// transition, right after its CAS:
//   bits  0..47  the state word's time in full: ms of the clock (48 bits: 8,900 years)
//   bits 48..63  the seq of the state word it belongs to
// A reader that finds it matching the state word (same seq, same low 32 bits of the time)
// compares full times, so an open period and the last close read right at any age, 2^32 ms
// (49.7 days) and its multiples included. Until it matches (its writer has not stored it yet,
// or died between the CAS and the store) readers use the 32-bit time and its rules
// (DeadlinePassed, clock.h), which are right unless the time is a multiple of 2^32 ms old.
//
// Window bucket word (DependencySlot::buckets[i], bucket i holds the periods p with
// p % window_buckets == i, of length window_ms / window_buckets):
//   bits  0..11  period number mod 2^12
//   bits 12..15  scale: each count below is in units of 2^scale calls (Bucket::Add)
//   bits 16..31  calls   bits 32..47 failures   bits 48..63 slow calls
// Window head word (DependencySlot::window_head), written once per bucket period:
//   bits  0..15  bit i set: bucket i holds the calls of its period in the window that ends
//                with the newest period (the one period p <= newest, p > newest - buckets,
//                with p % window_buckets == i)
//   bits 16..19  the window's epoch (mod 16): StartWindowAnew and Reset move it on, and every
//                other write keeps it
//   bits 20..63  the newest period's start, ms of the clock (44 bits: 557 years)
// The epoch keeps a window read honest across a reload (ReadWindow): a window started anew
// soon has the head it had before (the same period's start, the same bucket's bit), and a
// reader that compared the head alone before and after its read took the old buckets'
// failures for the new window's, beside stripes already emptied. Sixteen restarts within one
// read bring the epoch back; a restart also counts as a handover on every stripe
// (Stripe::handovers), which a read with stripes compares in full.
// A 12-bit period number alone aliases: after 4,096 periods a stale bucket reads as current.
// So a bucket counts only when its bit is set in the head and its period number is the one the
// head expects, and the window is empty when the newest period is a window old: no idle gap of
// any length, and no bucket left untouched by sparse traffic, reads as current. The first call
// of a bucket period replaces the bucket and then sets its bit; a new newest period keeps only
// the bits of periods still in its window. A later call in the period adds to the bucket: the
// common path reads the head with the breaker word and writes nothing more than before.
// A head more than a minute ahead of the clock (scribbled, or stamped under another clock) is
// ignored: the window reads empty and the next call starts it anew.
// Approximation: a bucket counts up to 65,535 calls exactly; past that its unit doubles as
// often as needed (Bucket::Add), and a call that is not a whole unit counts as one unit with
// the matching probability: the counts are unbiased, and the rates stay within a fraction of a
// percent of those of every call the bucket was given. A call completing at a
// period edge may land in either bucket; processes
// racing to make the first call of a bucket period may replace each other's first call (a
// bucket loses at most one call per racing process: the first call replaces, with one CAS, the
// bucket as read before the head said the period had not started it); a call whose clock read
// lags a window behind the newest period is not counted, and if it raced with the newest
// period's first call it may replace that bucket's calls so far (the next call of the period
// then starts the bucket again); a reload that changes the window's shape starts the window
// anew (StartWindowAnew); a window that spans the breaker's last close
// ignores the buckets before it, at bucket granularity.
// Thread safety: thread-safe and process-safe.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>

#include "shm/layout.h"
#include "shm/stripes.h"

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

// The breaker time word (see above).
struct BreakerTime {
  static constexpr uint64_t kMsMask = (uint64_t{1} << 48) - 1;
  static uint64_t Make(uint16_t seq, uint64_t ms) { return (uint64_t(seq) << 48) | (ms & kMsMask); }
  static uint16_t Seq(uint64_t w) { return uint16_t(w >> 48); }
  static uint64_t Ms(uint64_t w) { return w & kMsMask; }
};

// ProbeReport: DependencySlot::last_probe, what the last probe reported and when (full ms,
// the clock of BreakerTime). An expired probe is a failure the sweep reported for it.
enum class ProbeOutcome : uint32_t { kNone = 0, kSucceeded = 1, kFailed = 2, kExpired = 3 };
const char* ProbeOutcomeName(ProbeOutcome o);  // "none", "succeeded", "failed", "expired"
struct ProbeReport {
  static uint64_t Make(ProbeOutcome o, uint64_t ms) {
    return (uint64_t(o) << 62) | (ms & BreakerTime::kMsMask);
  }
  static ProbeOutcome Outcome(uint64_t w) { return ProbeOutcome(w >> 62); }
  static uint64_t Ms(uint64_t w) { return w & BreakerTime::kMsMask; }
};
// ReportProbe records a probe's outcome in the slot (a relaxed store: probes only).
void ReportProbe(DependencySlot& slot, ProbeOutcome o, uint64_t now_ns);

// ModeSetter: DependencySlot::mode_setter, who last set the mode: kKnown | uid << 32 | pid
// (0: nobody has said, as when the config set it). Written by the writer itself: it names a process
// as honestly as the trust model's writers are (README, Trust model).
struct ModeSetter {
  static constexpr uint64_t kKnown = uint64_t{1} << 63;
  static uint64_t Make(uint32_t uid, uint32_t pid) {
    return kKnown | (uint64_t(uid & 0x7fffffffu) << 32) | pid;
  }
  static bool Known(uint64_t w) { return (w & kKnown) != 0; }
  static uint32_t Uid(uint64_t w) { return uint32_t(w >> 32) & 0x7fffffffu; }
  static uint32_t Pid(uint64_t w) { return uint32_t(w); }
};

// FullTimeMs is the time of state word `b` in full ms, when the slot's breaker time word
// matches it (see above); nullopt otherwise.
std::optional<uint64_t> FullTimeMs(const DependencySlot& slot, const BreakerWord& b);

// OpenPeriodOver: has the open period of `b` (an open breaker's word) ended at `now_ns`?
// Exact with the full time; else the 32-bit rule of DeadlinePassed. Thread-safe.
bool OpenPeriodOver(const DependencySlot& slot, const BreakerWord& b, uint64_t now_ns);

// The events of the state machine above.
enum class BreakerEvent : uint32_t {
  kTrip,
  kOpenPeriodOver,
  kProbeSucceeded,
  kProbeFailed,
  kProbeExpired,
  kReset,
  kFleetClosed,
  kFleetReopened,
};

// NextBreakerWord is the table above as a pure function: the word after `event` at `now_ms`
// for a breaker read as `current`, or nullopt when the event does not apply to that state (or
// to that seq). `probe_seq` is the seq a probe was granted under (kProbeSucceeded/Failed);
// `random` draws the open period's jitter. Reads only the policy words. Thread-safe.
std::optional<uint64_t> NextBreakerWord(const PolicyWords& policy, uint64_t current,
                                        BreakerEvent event, uint32_t now_ms, uint16_t probe_seq,
                                        uint32_t random);

// NextRandom advances a caller's xorshift state (nonzero) and returns it: the open periods'
// jitter. Not thread-safe: one state per thread.
inline uint32_t NextRandom(uint32_t& state) {
  uint32_t x = state ? state : 0x9E3779B9u;
  x ^= x << 13;
  x ^= x >> 17;
  x ^= x << 5;
  state = x;
  return x;
}

// ApplyBreakerEvent applies `event` to the breaker of `slot` at `now_ns` with one CAS from the
// word it read, reading again and retrying while other processes change the word under it (a
// bounded number of rounds: each retry means another process committed a change). Counts the
// transition (kOpened, kHalfOpened, kClosed) and, on closing, restarts the window. Draws from
// `rng` (the caller's NextRandom state) only for an event that opens the breaker. Returns true
// if this call changed the word. Thread-safe; `rng` is the calling thread's.
bool ApplyBreakerEvent(DependencySlot& slot, BreakerEvent event, uint64_t now_ns,
                       uint16_t probe_seq, uint32_t& rng);

// SetOpenUntil moves the end of the open period of the breaker of `slot` to `until_ms` (full ms
// of the clock, within kMaxDeadlineAheadMs of `now_ns`), if the breaker is still the open word
// of seq `seq`: one CAS, then the breaker time word. Not a transition: seq, reopens and the
// counters stay. Returns true if it moved the end. Daemon only (fleet mode). Thread-safe.
bool SetOpenUntil(DependencySlot& slot, uint16_t seq, uint64_t until_ms, uint64_t now_ns);

struct WindowStats {
  uint64_t calls = 0;
  uint64_t failures = 0;
  uint64_t slow = 0;
  // A stripe still counts in a period of another shape: a reload stored a new shape and has not
  // yet started the window anew (its daemon stopped between the two steps). The read counts
  // that period's successes in full, but the window mixes two shapes: RecordOutcome starts it
  // anew, as the reload would, rather than decide a trip on it.
  bool mixed_shapes = false;
};

struct Bucket {
  static constexpr uint64_t kMax = 0xFFFF;  // a count field's largest value, in its units
  static constexpr uint64_t kPeriodMask = 0xFFF;
  static constexpr uint32_t kMaxScale = 15;
  static uint16_t Period(uint64_t w) { return uint16_t(w & kPeriodMask); }
  // PeriodOf: a period number as a bucket word keeps it (mod 2^12).
  static uint16_t PeriodOf(uint64_t period) { return uint16_t(period & kPeriodMask); }
  // Ahead: how many periods the bucket's period is ahead of `period`, mod 2^12 (0: the same).
  static uint16_t Ahead(uint64_t w, uint64_t period) {
    return uint16_t((Period(w) - PeriodOf(period)) & kPeriodMask);
  }
  static uint32_t Scale(uint64_t w) { return uint32_t(w >> 12) & 15; }
  // The counts, in calls: each field times 2^scale.
  static uint64_t Calls(uint64_t w) { return ((w >> 16) & kMax) << Scale(w); }
  static uint64_t Failures(uint64_t w) { return ((w >> 32) & kMax) << Scale(w); }
  static uint64_t Slow(uint64_t w) { return ((w >> 48) & kMax) << Scale(w); }
  // Make: a bucket of `period` holding the given counts, in units of 2^scale calls.
  static uint64_t Make(uint64_t period, uint64_t calls, uint64_t failures, uint64_t slow,
                       uint32_t scale = 0) {
    return PeriodOf(period) | (uint64_t(scale & 15) << 12) | ((calls & kMax) << 16) |
           ((failures & kMax) << 32) | ((slow & kMax) << 48);
  }
  // Add adds `calls` calls (`failures` and `slow` of them) to bucket word `w`. A field that would
  // pass kMax doubles the bucket's unit instead (halving every field, up to 2^15 calls a unit:
  // 2.1 billion calls a bucket; past that the fields are halved in the same unit, so the
  // bucket's rates hold and its calls are undercounted), and calls that are not a whole number
  // of units are rounded up or down at random (from `random`, the caller's draw), so that every
  // count is unbiased and the rates stay those of every call given, one by one or as a
  // stripe's lump of successes.
  // The fields keep failures <= calls and slow <= calls, whatever a scribbled word held.
  // NeedsDraw: whether adding `calls` calls to `w` uses Add's `random` (a scaled bucket, or one
  // these calls would scale), so that a caller draws only then.
  static bool NeedsDraw(uint64_t w, uint64_t calls) {
    return Scale(w) != 0 || ((w >> 16) & kMax) + calls > kMax;
  }
  static uint64_t Add(uint64_t w, uint64_t calls, uint64_t failures, uint64_t slow,
                      uint32_t random) {
    uint32_t scale = Scale(w);
    uint64_t c = (w >> 16) & kMax;
    uint64_t f = std::min((w >> 32) & kMax, c);
    uint64_t s = std::min((w >> 48) & kMax, c);
    failures = std::min(failures, calls);
    slow = std::min(slow, calls);
    for (uint32_t bit = 31;; --bit) {
      // One draw for the three fields keeps failures and slow calls within the calls.
      const uint64_t draw = random & ((uint32_t{1} << scale) - 1);
      const uint64_t add_c = (calls + draw) >> scale;
      if (c + add_c <= kMax || bit == 15) {
        const uint64_t nc = std::min(c + add_c, kMax);
        return Make(w, nc, std::min(f + ((failures + draw) >> scale), nc),
                    std::min(s + ((slow + draw) >> scale), nc), scale);
      }
      const uint64_t half = (random >> bit) & 1;  // round the halving at random too
      c = (c + half) >> 1;
      f = (f + half) >> 1;
      s = (s + half) >> 1;
      // At the largest unit the counts are halved in it: the bucket keeps its rates, and its
      // calls count for half as much beside the other buckets' each time it fills again.
      if (scale < kMaxScale) ++scale;
    }
  }
};

// The head word of the window (see above).
struct WindowHead {
  static constexpr uint64_t kBitsMask = 0xFFFF;
  static constexpr uint64_t kEpochMask = 0xF;
  static uint32_t Bits(uint64_t w) { return uint32_t(w & kBitsMask); }
  static uint32_t Epoch(uint64_t w) { return uint32_t(w >> 16 & kEpochMask); }
  static uint64_t StartMs(uint64_t w) { return w >> 20; }
  static uint64_t Make(uint64_t start_ms, uint32_t bits, uint32_t epoch = 0) {
    return (start_ms << 20) | (uint64_t{epoch} & kEpochMask) << 16 | (bits & kBitsMask);
  }
  // Moved is `head` with its newest period's start and bits replaced, in the same epoch.
  static uint64_t Moved(uint64_t head, uint64_t start_ms, uint32_t bits) {
    return Make(start_ms, bits, Epoch(head));
  }
  // Anew is the empty window of the epoch after `head`'s.
  static uint64_t Anew(uint64_t head) { return Make(0, 0, Epoch(head) + 1); }
};

// StartWindowAnew empties the window of `slot`, its shared buckets and the periods its stripes
// hold: a reload that changes the window's shape calls it after storing the new policy
// (StorePolicyOf, admission.h), since a period of the old shape is not one of the new. A success
// racing it on another CPU may keep its stripe's old period (stripes.h): that stripe's successes
// then go to the shared buckets until the old period ends, when its count is handed over to the
// bucket of the new shape's period that ends there. Until it is called, a stripe may count on in
// a period of the old shape: a read counts such a period while it holds the reader's now
// (ReadWindow). Thread-safe.
void StartWindowAnew(DependencySlot& slot);

// StartEpoch empties the shared buckets of `slot`'s window: a head with no bucket bits, in the
// next epoch, so that no read that began before it counts what the buckets held (ReadWindow).
// Thread-safe.
void StartEpoch(DependencySlot& slot);

// ReadWindow reads the breaker window of `slot` at `now_ns`, honoring the last close.
WindowStats ReadWindow(const DependencySlot& slot, uint64_t now_ns);

// For tests only: where a window read may be stopped (ReadWindow reads the stripes' counts of
// handovers and the head, the stripes, then the shared buckets, then the stripes again), or a
// writer handing a full stripe's count over, and the function called at each of those points
// when one is set, so that a test can do there what other processes would while the scheduler
// stops the reader or the writer. Never set in the product: a relaxed load of a null pointer,
// off the common path.
enum class WindowReadPause {
  kHeadRead,       // the stripes' counts of handovers and the head read
  kStripesRead,    // the stripes read
  kBucketsRead,    // the shared buckets read
  kHandoverTaken,  // (a writer's) a full stripe's count taken, not yet in its bucket
};
namespace window_internal {
extern std::atomic<void (*)(WindowReadPause)> g_read_pause;
}  // namespace window_internal

// RecordOutcome records one completed call of a closed breaker (not a probe) in the window and,
// for a failure or a slow call, trips the breaker if the window says so (kTrip), drawing the
// open period's jitter from `rng`. A success that is not slow goes to stripe `stripe`, written
// in `mode` (kPerCpu: on CPU `cpu`, kNoStripe for the stripe's own), when the slot has it
// (stripes.h); everything else to the shared buckets. Thread-safe; `rng` is the calling
// thread's.
void RecordOutcome(DependencySlot& slot, uint64_t now_ns, bool failure, bool slow, uint32_t& rng,
                   uint16_t stripe = kNoStripe, StripeMode mode = StripeMode::kPerCpu,
                   uint16_t cpu = kNoStripe);

// RecordSuccessInStripePeriod is RecordOutcome's common path, inline: a success that is not slow,
// on a closed breaker, in the period stripe `stripe` already holds (stripes.h), written on
// `cpu` in kPerCpu mode. True if it was recorded; false if RecordOutcome must take it (the one
// that finds the stripe full included). Thread-safe.
inline bool RecordSuccessInStripePeriod(DependencySlot& slot, uint64_t now_ns, uint16_t stripe,
                                        uint16_t cpu, StripeMode mode) {
  if (BreakerWord::Decode(slot.breaker.load(std::memory_order_acquire)).state !=
      BreakerState::kClosed) {
    return false;
  }
  Stripe& s = StripeAt(slot, stripe);
  const uint64_t w = s.window.load(std::memory_order_relaxed);
  if (!StripeWindow::Holds(w, s.window_start.load(std::memory_order_relaxed),
                           now_ns / 1'000'000u)) {
    return false;
  }
  if (StripeWindow::Count(w) >= StripeWindow::kStripeWindowMax) return false;  // full: shared
  return StripeCompareStore(s.window, w, w + 1, cpu, mode) == 0;
}

// ShouldTrip: calls >= min_calls and a rate at or over its threshold.
bool ShouldTrip(const DependencySlot& slot, const WindowStats& w);

// OpenPeriodMs: min(open_for x 2^reopens, open_for_max) + jitter in [0, open_jitter].
uint32_t OpenPeriodMs(const PolicyWords& policy, uint32_t reopens, uint32_t random);

}  // namespace retryd::shm
