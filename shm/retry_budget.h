// shm/retry_budget.h: the host-wide retry budget, one 64-bit word per dependency.
//
// Word layout (DependencySlot::budget):
//   bits  0..31  tokens, in thousandths of a token (kTokenScale)
//   bits 32..63  time of the last floor refill, ms modulo 2^32 (see clock.h)
// Each admitted first attempt deposits `retry_ratio_milli` thousandths with one fetch-add,
// skipped while the bucket is full (a load), so a healthy dependency costs no write here. A
// retry withdraws one token with a CAS that first adds `min_retries_per_sec` x elapsed time
// and caps the result at `retry_burst`.
//
// Elapsed time is `now_ms - stamp` modulo 2^32. It reads as "the clock went backwards" only
// within kMaxClockSkewMs below 2^32: a process that read the clock, was descheduled, and
// then found a stamp another process wrote a moment later. Such a refill adds nothing and
// leaves the stamp where it is. Every other difference is elapsed time, however long the
// budget sat idle, so the floor refills after any gap. Two approximations of the idle gap,
// both on the side of granting less:
//   - A gap is credited modulo 2^32 ms (49.7 days): after a gap of k x 2^32 ms plus d, the
//     refill is min(burst, tokens + floor x d).
//   - A gap ending within kMaxClockSkewMs below a multiple of 2^32 ms reads as backwards: the
//     floor adds nothing until that multiple has passed (at most kMaxClockSkewMs later), then
//     refills at its full rate.
// Neither happens while a daemon runs: its sweep calls Refresh on every slot, which folds the
// refill into a stamp older than kStampRefreshMs, so no stamp is ever read more than
// kStampRefreshMs plus one sweep old.
// Beyond the skew: a process whose clock read lags the stamp by more than kMaxClockSkewMs
// (stopped for a minute between reading the clock and its CAS) reads the lag as 49.7 days of
// elapsed time, refills to the cap and moves the stamp back; the budget then grants at most
// retry_burst + min_retries_per_sec x the lag in seconds more than the invariant allows.
//
// Invariant: over any interval, retries granted <= retry_burst + ratio x first attempts +
// min_retries_per_sec x seconds elapsed, summed over all processes, while clock reads arrive
// in order. A withdrawal whose clock read lags the newest read by L ms (L <= kMaxClockSkewMs)
// may add up to min_retries_per_sec x L thousandths of a token to that bound: floor time it
// could not see is credited again by a later read. Concurrent deposits may push the stored
// count past the cap by at most one ratio per racing process; the cap is applied again at
// every withdrawal. tests/shm/model_test.cc checks the bound, with that margin for lagging
// reads, at every step.
// Thread safety: thread-safe and process-safe; each operation commits with a single word.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "shm/clock.h"

namespace retryd::shm {

class RetryBudget {
 public:
  static constexpr uint64_t kTokenScale = 1000;
  static constexpr uint64_t kTokenMask = 0xFFFF'FFFFull;
  // The most a clock read may lag the newest stamp and still read as time going backwards
  // rather than as elapsed time. A clock read lags by the time between reading it and the CAS
  // (microseconds; milliseconds for a descheduled process) plus the coarse clock's tick (a
  // few ms). A minute is thousands of times that, and costs at most a minute of floor after a
  // gap ending within a minute below a multiple of 49.7 days with no daemon running.
  static constexpr uint32_t kMaxClockSkewMs = shm::kMaxClockSkewMs;
  // Refresh folds the refill into stamps older than this: an hour is far from the skew
  // window below the wrap, and one write per slot per hour is nothing.
  static constexpr uint32_t kStampRefreshMs = 3'600'000;

  static uint64_t Tokens(uint64_t word) { return word & kTokenMask; }
  static uint32_t StampMs(uint64_t word) { return uint32_t(word >> 32); }
  static uint64_t Make(uint64_t tokens_milli, uint32_t stamp_ms) {
    return (uint64_t{stamp_ms} << 32) | (tokens_milli & kTokenMask);
  }

  // Deposit adds `ratio_milli` unless the bucket already holds `burst` tokens.
  static void Deposit(std::atomic<uint64_t>& word, uint32_t ratio_milli, uint32_t burst) {
    const uint64_t cap = uint64_t{burst} * kTokenScale;
    if (ratio_milli == 0 || Tokens(word.load(std::memory_order_relaxed)) >= cap) return;
    word.fetch_add(ratio_milli, std::memory_order_relaxed);
  }

  // Full: the word holds `burst` tokens (a deposit would add nothing).
  static bool Full(uint64_t word, uint32_t burst) {
    return Tokens(word) >= uint64_t{burst} * kTokenScale;
  }

  // AddCapped adds `milli` thousandths (deposits folded in from the stripes, stripes.h), capped
  // at `burst` tokens, keeping the stamp: the floor refill since the stamp still applies, so
  // min(cap, min(cap, tokens + milli) + refill) is what one word holding them all would give.
  static void AddCapped(std::atomic<uint64_t>& word, uint64_t milli, uint32_t burst) {
    const uint64_t cap = uint64_t{burst} * kTokenScale;
    uint64_t cur = word.load(std::memory_order_relaxed);
    for (;;) {
      const uint64_t tokens = std::min(cap, Tokens(cur) + std::min(milli, cap));
      if (tokens <= Tokens(cur)) return;
      if (word.compare_exchange_weak(cur, Make(tokens, StampMs(cur)), std::memory_order_relaxed)) {
        return;
      }
    }
  }

  // TryWithdraw takes one token at `now_ms`, refilling first; false if less than one token.
  [[nodiscard]] static bool TryWithdraw(std::atomic<uint64_t>& word, uint32_t now_ms,
                                        uint32_t floor_per_sec, uint32_t burst) {
    uint64_t cur = word.load(std::memory_order_relaxed);
    for (;;) {
      const uint64_t tokens = Refilled(cur, now_ms, floor_per_sec, burst);
      if (tokens < kTokenScale) {
        // Record the refill so far only if it changes the word: a denied retry costs no write.
        return false;
      }
      const uint64_t next = Make(tokens - kTokenScale, Later(StampMs(cur), now_ms));
      if (word.compare_exchange_weak(cur, next, std::memory_order_relaxed)) return true;
    }
  }

  // Refresh folds the floor refill into the word at `now_ms` if its stamp is at least
  // kStampRefreshMs old: the same tokens a withdrawal would see, with the stamp moved to
  // `now_ms`, so no refill is lost or counted twice. Returns true if it changed the word. The
  // daemon calls it for every slot once per sweep, so that no stamp ages near the 2^32 ms
  // wrap while a daemon runs. Thread-safe.
  static bool Refresh(std::atomic<uint64_t>& word, uint32_t now_ms, uint32_t floor_per_sec,
                      uint32_t burst) {
    uint64_t cur = word.load(std::memory_order_relaxed);
    for (;;) {
      const uint32_t age_ms = now_ms - StampMs(cur);
      if (Backwards(age_ms) || age_ms < kStampRefreshMs) return false;
      const uint64_t next = Make(Refilled(cur, now_ms, floor_per_sec, burst), now_ms);
      if (word.compare_exchange_weak(cur, next, std::memory_order_relaxed)) return true;
    }
  }

  // Available returns whole-token thousandths available at `now_ms` (read-only).
  static uint64_t Available(uint64_t word, uint32_t now_ms, uint32_t floor_per_sec,
                            uint32_t burst) {
    return Refilled(word, now_ms, floor_per_sec, burst);
  }

 private:
  // Refilled applies the floor refill since the stamp. Time going backwards (a stamp up to
  // kMaxClockSkewMs ahead) adds nothing; anything else is elapsed time modulo 2^32 ms.
  static uint64_t Refilled(uint64_t word, uint32_t now_ms, uint32_t floor_per_sec,
                           uint32_t burst) {
    const uint64_t cap = uint64_t{burst} * kTokenScale;
    const uint32_t elapsed = now_ms - StampMs(word);
    // One token per second is one thousandth per ms.
    const uint64_t refill = Backwards(elapsed) ? 0 : uint64_t(elapsed) * floor_per_sec;
    return std::min(cap, Tokens(word) + refill);
  }
  // The stamp never moves backwards, or a clock step back would refill twice.
  static uint32_t Later(uint32_t stamp_ms, uint32_t now_ms) {
    return Backwards(now_ms - stamp_ms) ? stamp_ms : now_ms;
  }
  static bool Backwards(uint32_t elapsed_ms) { return elapsed_ms >= 0u - kMaxClockSkewMs; }
};

}  // namespace retryd::shm
