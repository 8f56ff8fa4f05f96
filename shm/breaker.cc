#include "shm/breaker.h"

#include <algorithm>

#include "shm/clock.h"
#include "shm/policy.h"

namespace retryd::shm {

static_assert(kMaxDeadlineAheadMs >= 2 * uint64_t{Policy::kMaxDurationMs},
              "an open period (open_for_max + open_jitter) must fit under the wrap guard");

namespace {

struct WindowShape {
  uint64_t bucket_ns;
  uint32_t buckets;
};

WindowShape Shape(const DependencySlot& slot) {
  // Clamp again: the words are shared memory and must never index out of bounds.
  const uint32_t buckets = std::clamp<uint32_t>(
      slot.policy.window_buckets.load(std::memory_order_relaxed), 1, kMaxBuckets);
  const uint32_t window_ms =
      std::max<uint32_t>(slot.policy.window_ms.load(std::memory_order_relaxed), 100);
  return {std::max<uint64_t>(uint64_t{window_ms} * 1'000'000u / buckets, 1'000'000u), buckets};
}

// The first period that counts: the breaker's last close, when that is within the window.
uint64_t FloorPeriod(const DependencySlot& slot, uint64_t now_ns, const WindowShape& s) {
  const BreakerWord b = BreakerWord::Decode(slot.breaker.load(std::memory_order_relaxed));
  if (b.state != BreakerState::kClosed) return 0;
  const uint32_t age_ms = NsToMs32(now_ns) - b.time_ms;
  const uint64_t age_ns = uint64_t{age_ms} * 1'000'000u;
  if (age_ns >= s.bucket_ns * s.buckets || age_ns > now_ns) return 0;
  return (now_ns - age_ns) / s.bucket_ns;
}

}  // namespace

const char* BreakerStateName(BreakerState s) {
  switch (s) {
    case BreakerState::kClosed: return "closed";
    case BreakerState::kOpen: return "open";
    case BreakerState::kHalfOpen: return "half-open";
  }
  return "invalid";
}

WindowStats ReadWindow(const DependencySlot& slot, uint64_t now_ns) {
  const WindowShape s = Shape(slot);
  const uint64_t period = now_ns / s.bucket_ns;
  const uint64_t floor = FloorPeriod(slot, now_ns, s);
  WindowStats w;
  for (uint32_t i = 0; i < s.buckets; ++i) {
    const uint64_t word = slot.buckets[i].load(std::memory_order_relaxed);
    const uint16_t age = uint16_t(uint16_t(period) - Bucket::Period(word));
    if (age >= s.buckets || period - age < floor) continue;
    w.calls += Bucket::Calls(word);
    w.failures += Bucket::Failures(word);
    w.slow += Bucket::Slow(word);
  }
  return w;
}

void RecordCall(DependencySlot& slot, uint64_t now_ns, bool failure, bool slow) {
  const WindowShape s = Shape(slot);
  const uint64_t period = now_ns / s.bucket_ns;
  std::atomic<uint64_t>& word = slot.buckets[period % s.buckets];
  uint64_t cur = word.load(std::memory_order_relaxed);
  for (;;) {
    uint64_t calls = 0, failures = 0, slows = 0;
    if (Bucket::Period(cur) == uint16_t(period)) {
      calls = Bucket::Calls(cur);
      failures = Bucket::Failures(cur);
      slows = Bucket::Slow(cur);
      if (calls == Bucket::kMax) return;  // saturated: see the approximation in breaker.h
    }
    const uint64_t next = Bucket::Make(uint16_t(period), calls + 1, failures + (failure ? 1 : 0),
                                       slows + (slow ? 1 : 0));
    if (word.compare_exchange_weak(cur, next, std::memory_order_relaxed)) return;
  }
}

bool ShouldTrip(const DependencySlot& slot, const WindowStats& w) {
  const uint64_t min_calls = slot.policy.min_calls.load(std::memory_order_relaxed);
  if (w.calls == 0 || w.calls < min_calls) return false;
  const uint64_t fr = slot.policy.failure_rate_pct.load(std::memory_order_relaxed);
  const uint64_t sr = slot.policy.slow_call_rate_pct.load(std::memory_order_relaxed);
  if (w.failures * 100 >= std::max<uint64_t>(fr, 1) * w.calls) return true;
  if (slot.policy.slow_call_ms.load(std::memory_order_relaxed) != 0 &&
      w.slow * 100 >= std::max<uint64_t>(sr, 1) * w.calls) {
    return true;
  }
  return false;
}

uint32_t OpenPeriodMs(const DependencySlot& slot, uint32_t reopens, uint32_t random) {
  const uint64_t base =
      std::max<uint32_t>(slot.policy.open_for_ms.load(std::memory_order_relaxed), 1);
  const uint64_t cap =
      std::max<uint64_t>(slot.policy.open_for_max_ms.load(std::memory_order_relaxed), base);
  const uint64_t jitter =
      std::min<uint32_t>(slot.policy.open_jitter_ms.load(std::memory_order_relaxed), 86'400'000u);
  // base < 2^27 after clamping and the shift stops at 31: no overflow.
  const uint64_t scaled = reopens >= 31 ? cap : std::min(cap, base << reopens);
  const uint64_t extra = jitter == 0 ? 0 : random % (jitter + 1);
  return uint32_t(std::min<uint64_t>(scaled + extra, 0x7FFF'FFFF));
}

bool TryTransition(DependencySlot& slot, uint64_t from, BreakerWord to) {
  to.seq = uint16_t(BreakerWord::Decode(from).seq + 1);
  if (!slot.breaker.compare_exchange_strong(from, to.Encode(), std::memory_order_acq_rel,
                                            std::memory_order_relaxed)) {
    return false;
  }
  const Counter c = to.state == BreakerState::kOpen       ? kOpened
                    : to.state == BreakerState::kHalfOpen ? kHalfOpened
                                                          : kClosed;
  slot.counters[c].fetch_add(1, std::memory_order_relaxed);
  return true;
}

}  // namespace retryd::shm
