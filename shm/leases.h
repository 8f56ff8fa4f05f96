// shm/leases.h: probe and bulkhead leases: a slot of shared memory that says "taken, by
// whom, until when".
//
// Lease word (DependencySlot::probe_leases[i], bulkhead_leases[i]):
//   0             free
//   bits  0..15   owner id (process slot index + 1, kUnknownOwner if unregistered)
//   bits 16..31   tag. Bulkhead: per taker, bumped per lease. Probe: the seq of the half-open
//                 the probe was granted in (its epoch, see breaker.h), so that a probe of an
//                 earlier half-open is known as such: it is void, and its word is free to take.
//   bits 32..63   expiry, ms modulo 2^32
// Expiry is judged by DeadlinePassed (clock.h): a lease is held until its expiry and expired
// from then, at any clock offset, except that an expired lease nobody has freed reads as held
// again during the last kMaxDeadlineAheadMs (2 days and a minute) before each multiple of
// 2^32 ms (49.7 days) after its expiry. Only a lease of a holder that died can age that far,
// and only without a daemon: the daemon's sweep frees every expired lease within its sweep
// period, and the reaper a dead holder's at once.
// A lease reclaimed from a live holder (expired, or voided) is never given out again with the
// same value, so that holder's late release cannot free its successor: a bulkhead taker's tag
// changes per lease, a voided probe carried another seq, and an expired probe word taken again
// under the same seq expires later. A dead owner releases nothing; a probe word its own holder
// released may be taken again with the same value within the same millisecond, and that holder
// has already released, once.
// Acquire is one CAS from 0; Release is one CAS from the exact value taken back to 0, so a
// lease that expired and was handed to someone else is never released by its former holder.
// Invariant: at every instant, leases taken <= the number of words scanned (the limit). Calls
// in flight equal leases taken while every call ends before its lease's timeout: a call that
// outlives it is no longer counted, and a reload that lowers a limit leaves the leases above
// the new limit to finish (they are swept by expiry like any other).
// Thread safety: thread-safe and process-safe.
#pragma once

#include <atomic>
#include <cstdint>

#include "shm/clock.h"

namespace retryd::shm {

struct Lease {
  static uint16_t Owner(uint64_t w) { return uint16_t(w); }
  static uint16_t Tag(uint64_t w) { return uint16_t(w >> 16); }
  static uint32_t ExpiryMs(uint64_t w) { return uint32_t(w >> 32); }
  static uint64_t Make(uint16_t owner, uint16_t tag, uint32_t expiry_ms) {
    // Owner is never 0, so a taken lease is never the free value.
    return uint64_t(owner == 0 ? 1 : owner) | (uint64_t(tag) << 16) | (uint64_t(expiry_ms) << 32);
  }
  static bool Expired(uint64_t w, uint32_t now_ms) {
    return w != 0 && DeadlinePassed(now_ms, ExpiryMs(w), kMaxDeadlineAheadMs);
  }

  // TryAcquire scans `count` words from `start` (wrapping) and takes the first free one.
  // Returns its index, or -1 if all are taken.
  static int TryAcquire(std::atomic<uint64_t>* words, uint32_t count, uint32_t start,
                        uint64_t value) {
    for (uint32_t n = 0; n < count; ++n) {
      uint32_t i = start + n;
      if (i >= count) i -= count;
      uint64_t cur = words[i].load(std::memory_order_relaxed);
      if (cur == 0 && words[i].compare_exchange_strong(cur, value, std::memory_order_acquire,
                                                       std::memory_order_relaxed)) {
        return int(i);
      }
    }
    return -1;
  }

  // EarlierSeq: is `tag` the seq of a half-open before half-open `seq` (16-bit serial
  // arithmetic)? A probe tagged with a later seq is not void: the caller that read `seq` read a
  // breaker that has moved on since, and a probe of the current half-open must stay untouched.
  // A tag 32,768 or more transitions old reads as later: such a word (its holder died and nobody
  // took it over since) is freed by expiry or by the daemon's reaper instead.
  static bool EarlierSeq(uint16_t tag, uint16_t seq) {
    return int16_t(uint16_t(seq - tag)) > 0;
  }

  // TryAcquireProbe takes the first of `count` probe words that is free or holds a void probe
  // (a tag earlier than `seq`: a probe of an earlier half-open). Returns its index, or -1; sets
  // *voided when the word it took held a void probe.
  static int TryAcquireProbe(std::atomic<uint64_t>* words, uint32_t count, uint16_t seq,
                             uint64_t value, bool* voided) {
    for (uint32_t i = 0; i < count; ++i) {
      uint64_t cur = words[i].load(std::memory_order_relaxed);
      if (cur != 0 && !EarlierSeq(Tag(cur), seq)) continue;
      // acq_rel: a reader that sees this probe's word sees the half-open it was taken in.
      if (words[i].compare_exchange_strong(cur, value, std::memory_order_acq_rel,
                                           std::memory_order_relaxed)) {
        *voided = cur != 0;
        return int(i);
      }
    }
    return -1;
  }

  // Release frees `word` if it still holds `value`. Returns false if it had been reclaimed.
  static bool Release(std::atomic<uint64_t>& word, uint64_t value) {
    uint64_t expected = value;
    return word.compare_exchange_strong(expected, 0, std::memory_order_release,
                                        std::memory_order_relaxed);
  }
};

}  // namespace retryd::shm
