// shm/latency.h: each dependency's histogram of call latencies.
//
// Every completed call that is recorded (a success, a failure or an ignored outcome; not one
// admitted in the disabled mode) counts once in one of kLatencyBuckets buckets by the latency
// its caller gave `complete`, and adds that latency to a sum: the host's distribution per
// dependency, from which an operator chooses `slow_call_duration` and sees a downstream slow
// down before it fails. The daemon exports it as the Prometheus histogram
// retryd_call_duration_seconds; `retryctl status DEP` shows it.
//
// The buckets are log-spaced, by powers of two from half a millisecond:
//   bucket 0        latency <= 0.5 ms
//   bucket i, 1..14 0.5 ms * 2^(i-1) < latency <= 0.5 ms * 2^i      (1 ms, 2 ms, ..., 8.192 s)
//   bucket 15       latency > 8.192 s
// so that each bucket's upper bound is the Prometheus `le` of its line, exactly.
//
// Where the counts live. A success on the stripes' path counts in its CPU's stripe
// (Stripe::successes_by_latency, Stripe::success_latency_us): no line another core writes. Its
// bucket word is also that stripe's success count, so a success writes two words there (its
// bucket, its latency), where a count, a bucket and a latency would be three. Every other call
// counts in the slot's shared words (DependencySlot::latency, latency_sum_us) with atomic adds,
// off the common path. A reader adds the two. So, at any instant the writes have all been
// made, the histogram's count equals successes + failures + ignored of the slot's counters.
//
// The sum is in microseconds, each call's latency rounded to the nearest, modulo 2^64: it wraps
// after 584,000 years of summed latency (7 months at ten million calls of 100 ms a second), and
// Prometheus reads a wrap as a counter reset.
//
// A slot given to another dependency (Segment::PutDependency) starts at 0, but a call of the
// old dependency that was completing at that instant (it checked the slot's generation before
// the reassignment and writes after the slot was zeroed) counts in the new one: at most one call
// per thread completing then. The slot's counters have the same bound.
//
// Thread safety: the writes are those of stripes.h; ReadLatency is thread-safe and reads each
// word once (a read racing writes sees each word before or after each write).
#pragma once

#include <atomic>
#include <cstdint>

#include "shm/layout.h"
#include "shm/stripes.h"

namespace retryd::shm {

inline constexpr uint64_t kLatencyBaseNs = 500'000;  // bucket 0's upper bound: 0.5 ms
inline constexpr uint32_t kLatencyLastBucket = kLatencyBuckets - 1;  // the one without a bound

// LatencyBucket: the bucket of a call that took `latency_ns`. A few instructions: a multiply
// (the division by a constant), a bit scan and a conditional move.
[[gnu::always_inline]] inline uint32_t LatencyBucket(uint64_t latency_ns) {
  // Bucket i holds the latencies whose half-milliseconds, rounded up, are in (2^(i-1), 2^i]:
  // those whose (latency_ns - 1) / kLatencyBaseNs, rounded down, has i significant bits (0 for
  // a latency of 0). The bit scan of 2q + 1 gives q's significant bits without a branch for 0.
  const uint64_t q = (latency_ns - (latency_ns != 0)) / kLatencyBaseNs;
  const uint64_t b = 63 ^ uint64_t(__builtin_clzll(2 * q + 1));  // one bsr
  return uint32_t(b < kLatencyLastBucket ? b : kLatencyLastBucket);
}

// LatencyUs: `latency_ns` in microseconds, rounded to the nearest (an add, a multiply and
// shifts; the latencies within 500 ns of 2^64 take a branch of their own).
[[gnu::always_inline]] inline uint64_t LatencyUs(uint64_t latency_ns) {
  uint64_t up;
  if (__builtin_expect(__builtin_add_overflow(latency_ns, uint64_t{500}, &up), 0)) {
    return latency_ns / 1000 + (latency_ns % 1000 >= 500);
  }
  return up / 1000;
}

// LatencyBucketBoundNs: the upper bound of bucket `b` (a latency equal to it is in it); 0 for
// the last bucket, which has none.
constexpr uint64_t LatencyBucketBoundNs(uint32_t b) {
  return b < kLatencyLastBucket ? kLatencyBaseNs << b : 0;
}

// One dependency's histogram, read from the segment.
struct LatencyHistogram {
  uint64_t buckets[kLatencyBuckets] = {};  // calls per bucket (not cumulative)
  uint64_t sum_us = 0;                     // their latencies summed (us), modulo 2^64

  uint64_t Count() const {
    uint64_t n = 0;
    for (uint64_t b : buckets) n += b;
    return n;
  }
  // Quantile: the upper bound (ns) of the bucket holding the q-quantile call (0 < q <= 1), as
  // the histogram can tell it; 0 when it holds no call, UINT64_MAX when that call is in the
  // last bucket (over 8.192 s).
  uint64_t Quantile(double q) const {
    const uint64_t n = Count();
    if (n == 0) return 0;
    double rank = q * double(n);
    uint64_t seen = 0;
    for (uint32_t b = 0; b < kLatencyBuckets; ++b) {
      seen += buckets[b];
      if (double(seen) >= rank) {
        return b == kLatencyLastBucket ? UINT64_MAX : LatencyBucketBoundNs(b);
      }
    }
    return UINT64_MAX;
  }
};

// ReadLatency: the histogram of `slot`, its shared words plus every stripe's, modulo 2^64 (as
// ReadCounter, stripes.h). Thread-safe.
inline LatencyHistogram ReadLatency(const DependencySlot& slot) {
  LatencyHistogram h;
  for (uint32_t b = 0; b < kLatencyBuckets; ++b) {
    h.buckets[b] = slot.latency[b].load(std::memory_order_relaxed);
  }
  h.sum_us = slot.latency_sum_us.load(std::memory_order_relaxed);
  WrittenStripes(slot).ForEach([&](uint32_t s) {
    const Stripe& st = StripeAt(slot, s);
    for (uint32_t b = 0; b < kLatencyBuckets; ++b) {
      h.buckets[b] += st.successes_by_latency[b].load(std::memory_order_relaxed);
    }
    h.sum_us += st.success_latency_us.load(std::memory_order_relaxed);
  });
  return h;
}

}  // namespace retryd::shm
