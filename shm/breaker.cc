#include "shm/breaker.h"

#include <alloca.h>

#include <algorithm>
#include <optional>

#include "shm/clock.h"
#include "shm/leases.h"
#include "shm/memory_order.h"
#include "shm/policy.h"

namespace retryd::shm {

namespace window_internal {
std::atomic<void (*)(WindowReadPause)> g_read_pause{nullptr};
}  // namespace window_internal

static_assert(kMaxStampedAheadMs >= 2 * uint64_t{kMaxKnobDurationMs},
              "an open period (open_for_max + open_jitter) must fit under the wrap guard");

namespace {

void PauseForTest(WindowReadPause at) {
  if (const auto pause = window_internal::g_read_pause.load(kRelaxed)) pause(at);
}

// Bound on the rounds of ApplyBreakerEvent. Each round that fails means another process
// committed a change to the word. An event applies to one state (a probe's, to one seq), and
// in it the word changes at most close_after (<= 255) times before the event no longer
// applies, so honest traffic never reaches the bound and no probe outcome is dropped by it;
// it only keeps a client scribbling the word from spinning us.
constexpr int kMaxEventRounds = 1024;

struct WindowShape {
  uint64_t bucket_ns;
  uint32_t buckets;
};

WindowShape Shape(const DependencySlot& slot) {
  const uint32_t buckets = LoadKnob<Knob::window_buckets>(slot.policy);
  const uint32_t window_ms = LoadKnob<Knob::window_ms>(slot.policy);
  // A scribbled window_buckets could still make a bucket shorter than a millisecond.
  return {std::max<uint64_t>(uint64_t{window_ms} * 1'000'000u / buckets, 1'000'000u), buckets};
}

// The first period that counts: the breaker's last close, when that is within the window.
uint64_t FloorPeriod(const DependencySlot& slot, uint64_t now_ns, const WindowShape& s) {
  const BreakerWord b = BreakerWord::Decode(slot.breaker.load(std::memory_order_acquire));
  if (b.state != BreakerState::kClosed) return 0;
  if (const std::optional<uint64_t> closed_ms = FullTimeMs(slot, b)) {
    // A close stamped ahead of a lagging reader's clock still hides what came before it.
    return *closed_ms * 1'000'000u / s.bucket_ns;
  }
  const uint32_t age_ms = NsToMs32(now_ns) - b.time_ms;
  const uint64_t age_ns = uint64_t{age_ms} * 1'000'000u;
  if (age_ns >= s.bucket_ns * s.buckets || age_ns > now_ns) return 0;
  // The close's own millisecond, as its full time gives it above: not the reader's offset
  // within it, which for a period that is not a whole number of ms could put the floor a
  // period past the calls made in that millisecond after the close.
  return (now_ns / 1'000'000u - age_ms) * 1'000'000u / s.bucket_ns;
}

// RestartWindow empties the bucket of `now_ns`, which may hold calls from before a trip. A
// bucket that holds a later period (a close whose clock read lags the newest period, in a
// window whose buckets that period shares) holds calls after the close: they stay.
void RestartWindow(DependencySlot& slot, uint64_t now_ns) {
  const WindowShape s = Shape(slot);
  const uint64_t period = now_ns / s.bucket_ns;
  std::atomic<uint64_t>& word = slot.buckets[period % s.buckets];
  uint64_t cur = word.load(kRelaxed);
  for (;;) {
    const uint16_t ahead = Bucket::Ahead(cur, period);
    if (ahead != 0 && ahead <= Bucket::kPeriodMask / 2) return;
    if (word.compare_exchange_weak(cur, Bucket::Make(period, 0, 0, 0), kRelaxed)) return;
  }
}

// The newest period of a head, or kNoPeriod for a head too far ahead of `now_ns` to trust.
constexpr uint64_t kNoPeriod = ~uint64_t{0};
// A head further ahead of the clock than any reader can lag (clock.h) was not stamped by it.
constexpr uint64_t kMaxHeadAheadMs = kMaxClockSkewMs;
// Bound on the rounds of RecordCall; each failed round means the head moved under us.
constexpr int kMaxRecordRounds = 64;

uint64_t PeriodStartMs(uint64_t period, const WindowShape& s) {
  return period * s.bucket_ns / 1'000'000u;
}

uint64_t NewestPeriod(uint64_t head, uint64_t now_ns, const WindowShape& s) {
  const uint64_t start_ms = WindowHead::StartMs(head);
  if (start_ms > now_ns / 1'000'000u + kMaxHeadAheadMs) return kNoPeriod;
  // The period whose start, in whole ms, is start_ms (bucket_ns is at least 1 ms).
  const uint64_t period = (start_ms * 1'000'000u + s.bucket_ns - 1) / s.bucket_ns;
  // A start that is no period's start under this shape was stamped under another one (a call
  // that read the window's shape before a reload changed it): the head is not this window's.
  return PeriodStartMs(period, s) == start_ms ? period : kNoPeriod;
}

// The period of bucket `index` in the window ending with `newest`, or kNoPeriod before the
// clock's first window.
uint64_t ExpectedPeriod(uint64_t newest, uint32_t index, const WindowShape& s) {
  const uint64_t back = (newest % s.buckets + s.buckets - index) % s.buckets;
  return back > newest ? kNoPeriod : newest - back;
}

// The bits of `head` whose periods are still in the window ending with `period` > newest.
uint32_t KeptBits(uint64_t head, uint64_t newest, uint64_t period, const WindowShape& s) {
  if (newest == kNoPeriod || period - newest >= s.buckets) return 0;
  uint32_t keep = 0;
  for (uint64_t p = newest; p + s.buckets > period; --p) {
    keep |= 1u << (p % s.buckets);
    if (p == 0) break;
  }
  return WindowHead::Bits(head) & keep;
}

// AddCalls adds `calls` calls of `period` (`failures` and `slow` of them) to the bucket `word`,
// read as `cur`, each field saturating. An older period there was left by a call whose clock read
// lagged a window behind (it replaced the bucket after this period had started it): the bucket
// starts again with these calls, so that one late call costs this period the calls it replaced,
// not the rest of the period. A newer period there means these calls are the late ones: they are
// not counted.
void AddCalls(std::atomic<uint64_t>& word, uint64_t cur, uint64_t period, uint64_t calls,
              uint64_t failures, uint64_t slow, uint32_t& rng) {
  for (;;) {
    const uint16_t ahead = Bucket::Ahead(cur, period);
    if (ahead != 0 && ahead <= Bucket::kPeriodMask / 2) {
      return;  // a newer period holds the bucket: these calls' clock read lagged a window
    }
    const uint64_t base = ahead != 0 ? Bucket::Make(period, 0, 0, 0) : cur;
    const uint32_t random = Bucket::NeedsDraw(base, calls) ? NextRandom(rng) : 0;
    const uint64_t next = Bucket::Add(base, calls, failures, slow, random);
    if (word.compare_exchange_weak(cur, next, kRelaxed)) return;
  }
}

// RecordCalls records `calls` calls of bucket period `period` (`failures` and `slow` of them) in
// the shared buckets at `now_ns` (a call's own period, or an older one a stripe hands over).
// AdvanceHead makes `period` the window's newest, if it is newer than the head's: a stripe
// starting a period does, though its successes stay in the stripe, so that the shared buckets
// know the newest period with any call, as if every call were theirs.
void AdvanceHead(DependencySlot& slot, const WindowShape& s, uint64_t period, uint64_t now_ns) {
  const uint64_t start_ms = PeriodStartMs(period, s);
  uint64_t head = slot.window_head.load(std::memory_order_acquire);
  for (int round = 0; round < kMaxRecordRounds; ++round) {
    if (WindowHead::StartMs(head) == start_ms) return;
    const uint64_t newest = NewestPeriod(head, now_ns, s);
    if (newest != kNoPeriod && newest >= period) return;
    const uint64_t next = WindowHead::Moved(head, start_ms, KeptBits(head, newest, period, s));
    if (slot.window_head.compare_exchange_weak(head, next, std::memory_order_acq_rel,
                                               std::memory_order_acquire)) {
      return;
    }
  }
}

void RecordCalls(DependencySlot& slot, const WindowShape& s, uint64_t period, uint64_t now_ns,
                 uint64_t calls, uint64_t failures, uint64_t slow, uint32_t& rng) {
  const uint32_t bit = 1u << (period % s.buckets);
  const uint64_t start_ms = PeriodStartMs(period, s);
  std::atomic<uint64_t>& word = slot.buckets[period % s.buckets];
  // The bucket is read before the head: if the head then says this period has not started the
  // bucket, whatever the bucket held when read is older, and the first call replaces exactly
  // that (a CAS from it), never the calls of a racer that started the period meanwhile.
  uint64_t cur = word.load(kRelaxed);
  uint64_t head = slot.window_head.load(std::memory_order_acquire);
  for (int round = 0; round < kMaxRecordRounds; ++round) {
    const uint64_t newest =
        WindowHead::StartMs(head) == start_ms ? period : NewestPeriod(head, now_ns, s);
    if (newest == kNoPeriod || newest < period) {
      // A new bucket period: the newest moves to it, keeping the buckets still in its window.
      const uint64_t next = WindowHead::Moved(head, start_ms, KeptBits(head, newest, period, s));
      if (slot.window_head.compare_exchange_weak(head, next, std::memory_order_acq_rel,
                                                 std::memory_order_acquire)) {
        head = next;
      }
      continue;
    }
    if (period + s.buckets <= newest) return;  // a window older than the newest period
    if (WindowHead::Bits(head) & bit) {
      // The bucket holds this period: add the call. Unless this is the newest period and the
      // bucket holds a later one, which no call of this window's shape can have written: a
      // reload stored a shape of longer periods and has not yet started the window anew, and
      // the head's start is a period's start under both shapes. That bucket is started afresh,
      // rather than every call of the period dropped as one whose clock lags.
      uint64_t held = word.load(kRelaxed);
      const uint16_t ahead = Bucket::Ahead(held, period);
      if (period != newest || ahead == 0 || ahead > Bucket::kPeriodMask / 2) {
        return AddCalls(word, held, period, calls, failures, slow, rng);
      }
      const uint64_t empty = Bucket::Make(period, 0, 0, 0);
      const uint64_t fresh = Bucket::Add(empty, calls, failures, slow,
                                         Bucket::NeedsDraw(empty, calls) ? NextRandom(rng) : 0);
      if (word.compare_exchange_strong(held, fresh, kRelaxed)) return;
      cur = held;
      head = slot.window_head.load(std::memory_order_acquire);
      continue;
    }
    // The first call of this bucket period, as far as the head tells.
    const uint64_t empty = Bucket::Make(period, 0, 0, 0);
    const uint64_t fresh = Bucket::Add(empty, calls, failures, slow,
                                       Bucket::NeedsDraw(empty, calls) ? NextRandom(rng) : 0);
    if (!word.compare_exchange_strong(cur, fresh, kRelaxed)) {
      // The bucket changed since it was read: a racer started this period (add to it; it sets
      // the bit), or a late call wrote an older one (look again).
      if (Bucket::Ahead(cur, period) == 0) {
        return AddCalls(word, cur, period, calls, failures, slow, rng);
      }
      head = slot.window_head.load(std::memory_order_acquire);
      continue;
    }
    uint64_t expected = head;
    while (!slot.window_head.compare_exchange_weak(expected, expected | bit,
                                                   std::memory_order_release, kRelaxed)) {
      // Another process set this bit, moved the newest on or started the window anew: either
      // way, nothing to add.
      if ((expected | WindowHead::kBitsMask) != (head | WindowHead::kBitsMask) ||
          (WindowHead::Bits(expected) & bit)) {
        return;
      }
    }
    return;
  }
}

void RecordCall(DependencySlot& slot, uint64_t now_ns, bool failure, bool slow, uint32_t& rng) {
  const WindowShape s = Shape(slot);
  RecordCalls(slot, s, now_ns / s.bucket_ns, now_ns, 1, failure ? 1 : 0, slow ? 1 : 0, rng);
}

// The period of a stripe's window word `w`, seen at `now_ms` (stripes.h): its end is the first
// whole ms at or after the period's end, so the period is the one of the last ms before the
// end. (Not the one before the end's: under another shape, a reload not yet followed by
// StartWindowAnew, the end need not be a period's end.)
uint64_t StripePeriod(uint64_t w, uint64_t now_ms, const WindowShape& s) {
  const uint64_t end_ms = StripeWindow::EndMs(w, now_ms);
  return end_ms == 0 ? 0 : (end_ms - 1) * 1'000'000u / s.bucket_ns;
}

// BeginHandover claims stripe `st`'s `handing` word for the count of its window word `w`, about
// to leave the stripe for the shared bucket of its period, before it does (the fence orders the
// claim and the count of handovers before the take, for a reader that reads the stripe's window
// first): from the moment the stripe no longer holds the count until the bucket does, a reader
// finds it there (ReadWindowOnce). False when another handover holds the word with a period
// still in the window (its process stopped, or killed, between its take and its add): the caller
// then records its success in the shared bucket and leaves the stripe as it is, so that no
// count on its way is ever out of sight. A word whose period has left the window is free again.
// EndHandover gives the word back once the bucket holds the count (or the take failed).
bool BeginHandover(Stripe& st, uint64_t w, uint64_t now_ms, uint64_t period, const WindowShape& s) {
  uint64_t held = st.handing.load(kRelaxed);
  if (held != 0 && StripePeriod(held, now_ms, s) + s.buckets > period) return false;
  if (!st.handing.compare_exchange_strong(held, w, kRelaxed)) return false;
  st.handovers.fetch_add(1, kRelaxed);
  std::atomic_thread_fence(std::memory_order_release);
  return true;
}

void EndHandover(Stripe& st, uint64_t w) {
  st.handing.compare_exchange_strong(w, 0, std::memory_order_release, kRelaxed);
}

// RecordStripeSuccess records one success (not slow) at `now_ns` in stripe `i`, written in
// `mode` (kPerCpu: on CPU `cpu`); false when the shared buckets must take it instead: the stripe or the window's head
// holds a later period (this call's clock read lags it), or it could not be written. A
// saturated stripe counts no more in its period (stripes.h). The first success
// of a later period hands the stripe's count over to the shared bucket of its period, if that
// is still in the window.
bool RecordStripeSuccess(DependencySlot& slot, uint64_t now_ns, uint16_t i, uint16_t cpu,
                         StripeMode mode, uint32_t& rng) {
  Stripe& st = StripeAt(slot, i);
  const uint64_t now_ms = now_ns / 1'000'000u;
  const WindowShape s = Shape(slot);
  const uint64_t period = now_ns / s.bucket_ns;
  for (int round = 0; round < 4; ++round) {
    const uint64_t w = st.window.load(kRelaxed);
    if (StripeWindow::Holds(w, st.window_start.load(kRelaxed), now_ms)) {
      if (StripeWindow::Count(w) >= StripeWindow::kStripeWindowMax) {
        // Full: the count goes to the shared bucket of its period, and the stripe counts on.
        if (!BeginHandover(st, w, now_ms, period, s)) return false;
        const int r = StripeCompareStore(st.window, w,
                                         StripeWindow::Make(StripeWindow::End40(w), 1), cpu,
                                         mode);
        if (r != 0) EndHandover(st, w);
        if (r < 0) return false;
        if (r > 0) continue;
        PauseForTest(WindowReadPause::kHandoverTaken);
        // The stripe's period holds now: under another shape (a reload not yet followed by
        // StartWindowAnew) it may end past this call's period, and its count goes to this one,
        // never to a bucket ahead of the clock.
        RecordCalls(slot, s, std::min(StripePeriod(w, now_ms, s), period), now_ns,
                    StripeWindow::Count(w), 0, 0, rng);
        EndHandover(st, w);
        return true;
      }
      const int r = StripeCompareStore(st.window, w, w + 1, cpu, mode);
      if (r < 0) return false;
      if (r == 0) return true;
      continue;  // preempted by another thread of this CPU: look again
    }
    const uint64_t old = StripePeriod(w, now_ms, s);
    const bool empty = StripeWindow::Count(w) == 0;
    if (!empty && old >= period) return false;  // a lagging read: its own period's bucket
    // A stripe starts only the newest period (or a newer one): a read lagging the head goes to
    // the shared buckets, which count it in its period, or not at all a window behind.
    if (const uint64_t newest =
            NewestPeriod(slot.window_head.load(std::memory_order_acquire), now_ns, s);
        newest != kNoPeriod && period < newest) {
      return false;
    }
    const uint64_t start_ms = (period * s.bucket_ns + 999'999u) / 1'000'000u;
    const uint64_t end_ms = ((period + 1) * s.bucket_ns + 999'999u) / 1'000'000u;
    const bool hands_over = !empty && period - old < s.buckets;
    if (hands_over && !BeginHandover(st, w, now_ms, period, s)) return false;
    const int r = StripeCompareStore2(st.window, w, StripeWindow::Make(end_ms, 1), st.window_start,
                                      start_ms, cpu, mode);
    if (r != 0 && hands_over) EndHandover(st, w);
    if (r < 0) return false;
    if (r > 0) continue;
    // A reload that changed the shape since `s` was read may have emptied the stripes before
    // this store (StartWindowAnew): the period just stored is one of the old shape, which the
    // window would read as a later one and skip, with every success the stripe counts in it.
    // Put it out of reach, as StartWindowAnew does: the next success hands it over. The head's
    // read-modify-write orders the store before the shape's read against StartWindowAnew's
    // (a full barrier, where a fence would be one the thread sanitizer cannot follow).
    slot.window_head.fetch_add(0, std::memory_order_acq_rel);
    if (const WindowShape now_shape = Shape(slot);
        now_shape.bucket_ns != s.bucket_ns || now_shape.buckets != s.buckets) {
      st.window_start.store(~uint64_t{0}, kRelaxed);
    }
    if (hands_over) {
      RecordCalls(slot, s, old, now_ns, StripeWindow::Count(w), 0, 0, rng);
      EndHandover(st, w);
    }
    AdvanceHead(slot, s, period, now_ns);
    return true;
  }
  return false;
}

// RestartStripeWindows restarts the stripes' windows at a close (or a reset) at `now_ns`, as
// RestartWindow does the shared bucket of `now_ns`: the successes a stripe holds for that period
// are dropped, those of any other period handed over to its shared bucket, where those before
// the close wait for the floor (FloorPeriod) like every call before it.
void RestartStripeWindows(DependencySlot& slot, uint64_t now_ns) {
  const WindowShape s = Shape(slot);
  const uint64_t period = now_ns / s.bucket_ns;
  WrittenStripes(slot).ForEach([&](uint32_t i) {
    StripeAt(slot, i).handovers.fetch_add(1, kRelaxed);  // a read across this reads again
    const uint64_t start_ms = StripeAt(slot, i).window_start.load(kRelaxed);
    std::atomic<uint64_t>& word = StripeAt(slot, i).window;
    uint64_t w = word.load(kRelaxed);
    while (w != 0 && !word.compare_exchange_weak(w, 0, kRelaxed)) {
    }
    if (StripeWindow::Count(w) == 0) return;
    const uint64_t now_ms = now_ns / 1'000'000u;
    const uint64_t p = StripePeriod(w, now_ms, s);
    // A period past the close's that holds its now is one of another shape (a reload not yet
    // followed by StartWindowAnew): the close's own, whose successes are dropped, not one to
    // hand to a bucket ahead of the clock. A period that begins after `now_ns` (a close whose
    // clock read lags the stripe's newest period) is after the close: its successes count, as
    // the shared bucket's calls of it do.
    if (p > period && StripeWindow::Holds(w, start_ms, now_ms)) return;
    if (p > period || (p < period && period - p < s.buckets)) {
      // No caller's random state here: the word just taken seeds the draws.
      uint32_t rng = uint32_t(w ^ (w >> 32)) | 1;
      RecordCalls(slot, s, p, now_ns, StripeWindow::Count(w), 0, 0, rng);
    }
  });
}

// VoidEarlierProbes frees the probe words of earlier half-opens when half-open `seq` begins, so
// that a probe still out from an earlier half-open neither takes a probe place in this one nor
// reports into it (its holder's release fails, and Complete then ignores its outcome). A word
// this misses (its voider died first) is taken over by TryAcquireProbe, and freed by expiry.
// Only earlier tags: a voider descheduled between its commit and this loop may run after later
// half-opens began, and their probes are current.
void VoidEarlierProbes(DependencySlot& slot, uint16_t seq) {
  for (auto& word : slot.probe_leases) {
    uint64_t w = word.load(kRelaxed);
    if (w == 0 || !Lease::EarlierSeq(Lease::Tag(w), seq)) continue;
    if (word.compare_exchange_strong(w, 0, kRelaxed)) {
      slot.counters[kLeasesReclaimedVoided].fetch_add(1, kRelaxed);
    }
  }
}

// Commit CASes the breaker from `from` to `to` and does what a transition entails. Returns
// false if another process moved the word first.
bool Commit(DependencySlot& slot, uint64_t from, uint64_t to, uint64_t now_ns) {
  const BreakerWord before = BreakerWord::Decode(from);
  const BreakerWord after = BreakerWord::Decode(to);
  // A breaker that closes after an outage starts its window before it reads closed: nothing is
  // recorded in the window while it is not closed, so nothing is lost, and no caller finds the
  // breaker closed beside the outage's failures or sees its first successes dropped by a
  // restart that came after them (a closer stopped between the two). Should the swap fail, the
  // window restarted is one nobody records in, or the next close restarts it again.
  const bool reopens_window = after.state == BreakerState::kClosed &&
                              before.state != BreakerState::kClosed && after.seq != before.seq;
  if (reopens_window) {
    RestartWindow(slot, now_ns);
    RestartStripeWindows(slot, now_ns);
  }
  if (!slot.breaker.compare_exchange_strong(from, to, std::memory_order_acq_rel, kRelaxed)) {
    return false;
  }
  if (after.seq == before.seq) return true;  // a probe success counted, no transition
  // The new word's time in full: now, or the open period's end, `until - now` after it.
  const uint64_t now_ms = now_ns / 1'000'000u;
  slot.breaker_time.store(
      BreakerTime::Make(after.seq, now_ms + uint32_t(after.time_ms - uint32_t(now_ms))),
      std::memory_order_release);
  slot.state_since.store(BreakerTime::Make(after.seq, now_ms), kRelaxed);
  const Counter c = after.state == BreakerState::kOpen       ? kOpened
                    : after.state == BreakerState::kHalfOpen ? kHalfOpened
                                                             : kClosed;
  slot.counters[c].fetch_add(1, kRelaxed);
  if (after.state == BreakerState::kClosed && !reopens_window) {  // a reset of a closed one
    RestartWindow(slot, now_ns);
    RestartStripeWindows(slot, now_ns);
  }
  if (after.state == BreakerState::kHalfOpen) VoidEarlierProbes(slot, after.seq);
  return true;
}

BreakerWord Transition(const BreakerWord& from, BreakerState state, uint32_t reopens,
                       uint32_t time_ms) {
  return {state, reopens, 0, uint16_t(from.seq + 1), time_ms};
}

BreakerWord Reopened(const PolicyWords& policy, const BreakerWord& b, uint32_t now_ms,
                     uint32_t random) {
  const uint32_t reopens = std::min<uint32_t>(b.reopens + 1, 63);
  return Transition(b, BreakerState::kOpen, reopens,
                    now_ms + OpenPeriodMs(policy, reopens, random));
}

}  // namespace

void StartEpoch(DependencySlot& slot) {
  uint64_t head = slot.window_head.load(kRelaxed);
  while (!slot.window_head.compare_exchange_weak(head, WindowHead::Anew(head),
                                                 std::memory_order_acq_rel, kRelaxed)) {
  }
}

// StartWindowAnew empties the window for a new shape: no bucket counts (the head's bits are
// cleared), and no stripe holds a period of the old shape. In three steps, so that the window
// never holds the failures of a moment without its successes, however long this takes (a
// thousand stripes, or a scheduler that stops it midway):
//   1. every stripe's start is put out of reach: from then on no success adds to a stripe's
//      present period (it starts a new one, or goes to the shared buckets: stripes.h), so a
//      count still held from here is of successes before this step;
//   2. the buckets (failures) are emptied: the head's epoch moves on;
//   3. every stripe still out of reach is emptied. One a success restarted since step 1 holds
//      only successes after it (those between steps 1 and 2 err toward staying closed) and
//      keeps them: emptied, they would have left the failures of the same moment, counted in
//      the new buckets, without them, and tripped a healthy dependency.
// A reader that finds a stripe emptied finds the head changed when it looks again (ReadWindow),
// and never counts the old failures without the successes beside them.
void StartWindowAnew(DependencySlot& slot) {
  // The new shape is stored before the stripes are emptied, and read by a stripe's first
  // success after it stores a period (RecordStripeSuccess): both read-modify-write the head in
  // between, so the later of the two sees what the earlier stored.
  // The stripes written before step 1: one first written after it has started a period of its
  // own since (its start was never out of reach), and holds nothing of the old shape.
  const StripeMap written = WrittenStripes(slot);
  written.ForEach([&](uint32_t i) {
    StripeAt(slot, i).handovers.fetch_add(1, kRelaxed);  // a read across this reads again
    StripeAt(slot, i).window_start.store(~uint64_t{0}, kRelaxed);
  });
  StartEpoch(slot);
  written.ForEach([&](uint32_t i) {
    Stripe& st = StripeAt(slot, i);
    st.handovers.fetch_add(1, kRelaxed);
    std::atomic<uint64_t>& word = st.window;
    uint64_t w = word.load(std::memory_order_acquire);
    // The start is stored before the window word that goes with it (StripeCompareStore2): a
    // start read after the word is at least that word's.
    while (w != 0 && st.window_start.load(kRelaxed) == ~uint64_t{0} &&
           !word.compare_exchange_weak(w, 0, std::memory_order_release,
                                       std::memory_order_acquire)) {
    }
    st.handing.store(0, kRelaxed);
  });
}

std::optional<uint64_t> FullTimeMs(const DependencySlot& slot, const BreakerWord& b) {
  const uint64_t t = slot.breaker_time.load(std::memory_order_acquire);
  if (BreakerTime::Seq(t) != b.seq || uint32_t(BreakerTime::Ms(t)) != b.time_ms) {
    return std::nullopt;
  }
  return BreakerTime::Ms(t);
}

bool OpenPeriodOver(const DependencySlot& slot, const BreakerWord& b, uint64_t now_ns) {
  if (const std::optional<uint64_t> until_ms = FullTimeMs(slot, b)) {
    return now_ns / 1'000'000u >= *until_ms;
  }
  return DeadlinePassed(NsToMs32(now_ns), b.time_ms, kMaxDeadlineAheadMs);
}

void ReportProbe(DependencySlot& slot, ProbeOutcome o, uint64_t now_ns) {
  slot.last_probe.store(ProbeReport::Make(o, now_ns / 1'000'000u), kRelaxed);
}

const char* ProbeOutcomeName(ProbeOutcome o) {
  switch (o) {
    case ProbeOutcome::kNone: return "none";
    case ProbeOutcome::kSucceeded: return "succeeded";
    case ProbeOutcome::kFailed: return "failed";
    case ProbeOutcome::kExpired: return "expired";
  }
  return "none";
}

const char* FleetStateName(FleetState s) {
  switch (s) {
    case FleetState::kOff: return "off";
    case FleetState::kJoined: return "joined";
    case FleetState::kLocal: return "local";
  }
  return "off";
}

const char* FleetRoleName(FleetRole r) {
  switch (r) {
    case FleetRole::kNone: return "none";
    case FleetRole::kMember: return "member";
    case FleetRole::kHolding: return "holding";
    case FleetRole::kProbing: return "probing";
  }
  return "none";
}

const char* BreakerStateName(BreakerState s) {
  switch (s) {
    case BreakerState::kClosed: return "closed";
    case BreakerState::kOpen: return "open";
    case BreakerState::kHalfOpen: return "half-open";
  }
  return "invalid";
}

std::optional<uint64_t> NextBreakerWord(const PolicyWords& policy, uint64_t current,
                                        BreakerEvent event, uint32_t now_ms, uint16_t probe_seq,
                                        uint32_t random) {
  const BreakerWord b = BreakerWord::Decode(current);
  const bool half_open = b.state == BreakerState::kHalfOpen;
  switch (event) {
    case BreakerEvent::kTrip:
      if (b.state != BreakerState::kClosed) return std::nullopt;
      return Transition(b, BreakerState::kOpen, 0, now_ms + OpenPeriodMs(policy, 0, random))
          .Encode();
    case BreakerEvent::kOpenPeriodOver:
      if (b.state != BreakerState::kOpen) return std::nullopt;
      return Transition(b, BreakerState::kHalfOpen, b.reopens, now_ms).Encode();
    case BreakerEvent::kProbeSucceeded: {
      if (!half_open || b.seq != probe_seq) return std::nullopt;
      const uint32_t successes = b.successes + 1;
      if (successes >= LoadKnob<Knob::close_after>(policy)) {
        return Transition(b, BreakerState::kClosed, 0, now_ms).Encode();
      }
      BreakerWord next = b;
      next.successes = successes;  // same seq: the other probes of this half-open stay valid
      return next.Encode();
    }
    case BreakerEvent::kProbeFailed:
    case BreakerEvent::kProbeExpired:
      if (!half_open || b.seq != probe_seq) return std::nullopt;
      return Reopened(policy, b, now_ms, random).Encode();
    case BreakerEvent::kReset: return Transition(b, BreakerState::kClosed, 0, now_ms).Encode();
    case BreakerEvent::kFleetClosed:
      if (b.state != BreakerState::kOpen) return std::nullopt;
      return Transition(b, BreakerState::kClosed, 0, now_ms).Encode();
    case BreakerEvent::kFleetReopened:
      if (b.state != BreakerState::kOpen) return std::nullopt;
      return Reopened(policy, b, now_ms, random).Encode();
  }
  return std::nullopt;
}

bool ApplyBreakerEvent(DependencySlot& slot, BreakerEvent event, uint64_t now_ns,
                       uint16_t probe_seq, uint32_t& rng) {
  const uint32_t now_ms = NsToMs32(now_ns);
  const bool opens = event == BreakerEvent::kTrip || event == BreakerEvent::kProbeFailed ||
                     event == BreakerEvent::kProbeExpired || event == BreakerEvent::kFleetReopened;
  for (int round = 0; round < kMaxEventRounds; ++round) {
    const uint64_t word = slot.breaker.load(std::memory_order_acquire);
    if (event == BreakerEvent::kOpenPeriodOver &&
        !OpenPeriodOver(slot, BreakerWord::Decode(word), now_ns)) {
      return false;
    }
    const std::optional<uint64_t> next =
        NextBreakerWord(slot.policy, word, event, now_ms, probe_seq, opens ? NextRandom(rng) : 0);
    if (!next) return false;
    if (Commit(slot, word, *next, now_ns)) return true;
  }
  return false;
}

bool SetOpenUntil(DependencySlot& slot, uint16_t seq, uint64_t until_ms, uint64_t now_ns) {
  const uint64_t now_ms = now_ns / 1'000'000u;
  if (until_ms > now_ms + kMaxDeadlineAheadMs) return false;
  uint64_t word = slot.breaker.load(std::memory_order_acquire);
  BreakerWord b = BreakerWord::Decode(word);
  if (b.state != BreakerState::kOpen || b.seq != seq || b.time_ms == uint32_t(until_ms)) {
    return false;
  }
  BreakerWord next = b;
  next.time_ms = uint32_t(until_ms);
  if (!slot.breaker.compare_exchange_strong(word, next.Encode(), std::memory_order_acq_rel,
                                            kRelaxed)) {
    return false;
  }
  // Until this store, readers find the time word not matching and use the 32-bit time.
  slot.breaker_time.store(BreakerTime::Make(seq, until_ms), std::memory_order_release);
  return true;
}

namespace {

// The successes stripe word `word` (its period starting at `start_ms`) holds for a period of the
// reader's window, as a bucket's calls count (ReadWindowOnce): in the window of `period`, not a
// window behind the newest period, and not before the floor. A period that holds the reader's
// now but ends past its period is one of another shape (`mixed_shapes`): a reload stored a new
// shape and has not yet started the window anew (StorePolicyOf, admission.h), and the stripe
// still counts its successes there. They count, in full: the failures of the meantime, in the
// shared buckets of the new shape, count too, and a read without the successes beside them
// found a healthy dependency failing.
uint64_t StripeCalls(uint64_t word, uint64_t start_ms, uint64_t now_ns, uint64_t period,
                     uint64_t floor, uint64_t newest, const WindowShape& s, bool& mixed_shapes) {
  if (StripeWindow::Count(word) == 0) return 0;
  const uint64_t now_ms = now_ns / 1'000'000u;
  const uint64_t p = StripePeriod(word, now_ms, s);
  if (p > period) {
    if (!StripeWindow::Holds(word, start_ms, now_ms)) return 0;
    mixed_shapes = true;
    return StripeWindow::Count(word);
  }
  if (p + s.buckets <= period || p < floor || (newest != kNoPeriod && p + s.buckets <= newest)) {
    return 0;
  }
  return StripeWindow::Count(word);
}

// ReadWindowOnce reads the window under `head`, read just before, or nothing when a stripe
// moved while it read. The stripes (successes) are read before the shared buckets (the failures
// among them) and again after: a reader that the scheduler stops between the two would
// otherwise count the failures that came meanwhile without the successes beside them, and a
// young window (a reload's, a close's) then reads as failing. From the second read, each
// stripe's successes include every one that came before the buckets were read, as long as no
// handover began on the stripe in between (its count of handovers, its period and its count
// tell). A stripe that handed its count over to a shared bucket in between (a new period, or a
// full count, even one the stripe counted back past) may have given it to the bucket after the
// bucket was read: the read is not counted, and ReadWindow reads again. A count already on
// its way when the stripes were first read (taken from the stripe, not yet in its bucket:
// BeginHandover) counts from the stripe's `handing` word; if it reached the bucket before the
// bucket was read, it counts twice for this read, which errs toward staying closed.
std::optional<WindowStats> ReadWindowOnce(const DependencySlot& slot, uint64_t now_ns,
                                          uint64_t& head) {
  const WindowShape s = Shape(slot);
  // The stripes ever written: one first written during the read (its first successes) is seen
  // by the look at the map after the buckets, and the read is not counted.
  const StripeMap written = WrittenStripes(slot);
  const uint32_t stripes = written.Count();
  // Four words a stripe written, on the reader's stack: 32 bytes per CPU of the host that has
  // called the dependency (the map holds no stripe past the slot's: 32 KiB at most, on a host
  // of 1,024 CPUs that all have).
  auto* const seen = static_cast<uint64_t*>(alloca(sizeof(uint64_t) * 4 * (stripes ? stripes : 1)));
  uint64_t* const handovers = seen;
  uint64_t* const before = seen + stripes;
  uint64_t* const starts = seen + 2 * stripes;
  uint64_t* const handing = seen + 3 * stripes;
  // The stripes' counts of handovers before the head: every restart moves them on (as well as
  // the head's 4-bit epoch, which 16 restarts bring back), so that a read with stripes sees any
  // restart after this, however many.
  uint32_t k = 0;
  written.ForEach([&](uint32_t i) {
    handovers[k++] = StripeAt(slot, i).handovers.load(std::memory_order_acquire);
  });
  head = slot.window_head.load(std::memory_order_acquire);
  PauseForTest(WindowReadPause::kHeadRead);
  const uint64_t period = now_ns / s.bucket_ns;
  const uint64_t floor = FloorPeriod(slot, now_ns, s);
  const uint64_t newest = NewestPeriod(head, now_ns, s);
  k = 0;
  written.ForEach([&](uint32_t i) {
    const Stripe& st = StripeAt(slot, i);
    before[k] = st.window.load(std::memory_order_acquire);
    starts[k] = st.window_start.load(std::memory_order_relaxed);
    handing[k] = st.handing.load(std::memory_order_acquire);
    ++k;
  });
  PauseForTest(WindowReadPause::kStripesRead);
  WindowStats w;
  if (newest != kNoPeriod) {
    for (uint32_t i = 0; i < s.buckets; ++i) {
      if (!(WindowHead::Bits(head) & (1u << i))) continue;
      const uint64_t expected = ExpectedPeriod(newest, i, s);
      if (expected == kNoPeriod || expected > period || period - expected >= s.buckets ||
          expected < floor) {
        continue;
      }
      const uint64_t word = slot.buckets[i].load(std::memory_order_acquire);
      if (Bucket::Ahead(word, expected) != 0) continue;
      w.calls += Bucket::Calls(word);
      w.failures += Bucket::Failures(word);
      w.slow += Bucket::Slow(word);
    }
  }
  PauseForTest(WindowReadPause::kBucketsRead);
  if (!(WrittenStripes(slot) == written)) return std::nullopt;
  bool moved = false;
  k = 0;
  written.ForEach([&](uint32_t i) {
    const Stripe& st = StripeAt(slot, i);
    const uint64_t after = st.window.load(std::memory_order_acquire);
    if (moved || StripeWindow::End40(after) != StripeWindow::End40(before[k]) ||
        StripeWindow::Count(after) < StripeWindow::Count(before[k]) ||
        st.handovers.load(std::memory_order_acquire) != handovers[k]) {
      moved = true;
      return;
    }
    // The period's start read with the first read: the same period (its end, above, has not
    // moved), unless a restart put it out of reach meanwhile (then it counts as ended).
    w.calls += StripeCalls(after, starts[k], now_ns, period, floor, newest, s, w.mixed_shapes);
    if (handing[k] != before[k]) {
      // A full stripe's count on its way is of the stripe's own period, and its start.
      const bool same = StripeWindow::End40(handing[k]) == StripeWindow::End40(after);
      w.calls += StripeCalls(handing[k], same ? starts[k] : ~uint64_t{0}, now_ns, period, floor,
                             newest, s, w.mixed_shapes);
    }
    ++k;
  });
  if (moved) return std::nullopt;
  return w;
}

}  // namespace

WindowStats ReadWindow(const DependencySlot& slot, uint64_t now_ns) {
  // A window started anew (StartWindowAnew) while it was read could give the old buckets'
  // failures without the stripes' successes: read again when the head moved meanwhile, and
  // read nothing if it keeps moving. The head's epoch tells a window started anew from the
  // old one even when its first calls gave it the old head's period and bits.
  for (int round = 0; round < 4; ++round) {
    uint64_t head;
    const std::optional<WindowStats> w = ReadWindowOnce(slot, now_ns, head);
    if (w && slot.window_head.load(std::memory_order_acquire) == head) return *w;
  }
  return WindowStats{};
}

void RecordOutcome(DependencySlot& slot, uint64_t now_ns, bool failure, bool slow, uint32_t& rng,
                   uint16_t stripe, StripeMode mode, uint16_t cpu) {
  const uint64_t word = slot.breaker.load(std::memory_order_acquire);
  if (BreakerWord::Decode(word).state != BreakerState::kClosed) return;
  if (!failure && !slow && stripe < StripeCount(slot) &&
      (StripeWritten(slot, stripe) || UseStripe(slot, stripe) != nullptr) &&
      RecordStripeSuccess(slot, now_ns, stripe, cpu == kNoStripe ? stripe : cpu, mode, rng)) {
    return;
  }
  RecordCall(slot, now_ns, failure, slow, rng);
  if (!(failure || slow)) return;
  const WindowStats w = ReadWindow(slot, now_ns);
  if (w.mixed_shapes) {
    // The reload that stored a new shape stopped before starting the window anew: do it for
    // it (thread-safe, and the reload's own call later only empties the window once more), so
    // that the next failures are counted in a window of one shape.
    StartWindowAnew(slot);
    return;
  }
  if (!ShouldTrip(slot, w)) return;
  // From the word read before the call was recorded: if the breaker moved since (another
  // process tripped it, or it closed anew and the window restarted), this trip is stale.
  if (const std::optional<uint64_t> next = NextBreakerWord(slot.policy, word, BreakerEvent::kTrip,
                                                           NsToMs32(now_ns), 0, NextRandom(rng))) {
    Commit(slot, word, *next, now_ns);
  }
}

bool ShouldTrip(const DependencySlot& slot, const WindowStats& w) {
  const uint64_t min_calls = LoadKnob<Knob::min_calls>(slot.policy);
  if (w.calls == 0 || w.calls < min_calls) return false;
  const uint64_t fr = LoadKnob<Knob::failure_rate_pct>(slot.policy);
  const uint64_t sr = LoadKnob<Knob::slow_call_rate_pct>(slot.policy);
  if (w.failures * 100 >= fr * w.calls) return true;
  return LoadKnob<Knob::slow_call_ms>(slot.policy) != 0 && w.slow * 100 >= sr * w.calls;
}

uint32_t OpenPeriodMs(const PolicyWords& policy, uint32_t reopens, uint32_t random) {
  const uint64_t base = LoadKnob<Knob::open_for_ms>(policy);
  const uint64_t cap = std::max<uint64_t>(LoadKnob<Knob::open_for_max_ms>(policy), base);
  const uint64_t jitter = LoadKnob<Knob::open_jitter_ms>(policy);
  // base <= kMaxKnobDurationMs < 2^27 and the shift stops at 31: no overflow.
  const uint64_t scaled = reopens >= 31 ? cap : std::min(cap, base << reopens);
  const uint64_t extra = jitter == 0 ? 0 : random % (jitter + 1);
  return uint32_t(std::min<uint64_t>(scaled + extra, 0x7FFF'FFFF));
}

}  // namespace retryd::shm
