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
// Invariant: over any interval, retries granted <= retry_burst + ratio x first attempts +
// min_retries_per_sec x seconds elapsed, summed over all processes. Concurrent deposits may
// push the stored count past the cap by at most one ratio per racing process; the cap is
// applied again at every withdrawal, so the bound holds exactly.
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

  // Available returns whole-token thousandths available at `now_ms` (read-only).
  static uint64_t Available(uint64_t word, uint32_t now_ms, uint32_t floor_per_sec,
                            uint32_t burst) {
    return Refilled(word, now_ms, floor_per_sec, burst);
  }

 private:
  // Refilled applies the floor refill since the stamp. Time going backwards (a stamp up to
  // 2^30 ms ahead: another process's clock read a moment later) adds nothing; anything else
  // is elapsed time, so a budget untouched for a month still refills.
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
  static bool Backwards(uint32_t elapsed_ms) { return elapsed_ms > 0xC000'0000u; }
};

}  // namespace retryd::shm
