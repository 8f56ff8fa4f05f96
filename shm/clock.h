// shm/clock.h: the clocks the public API passes into the algorithms.
//
// The algorithms in shm/ never read a clock: they take `now_ns`. The client reads
// CLOCK_MONOTONIC_COARSE, which the vDSO serves from memory (a few ns, no syscall, a
// few milliseconds of resolution: fine for windows of seconds, leases and open periods). It
// calls the vDSO's clock_gettime directly, found when the library is loaded (clock.cc),
// sparing glibc's wrapper (BM_CoarseClockRead 1.4 to 2.2 ns less here: docs/BENCHMARKS.md);
// where there is none, glibc's.
// CLOCK_MONOTONIC is system-wide, so every process on the host agrees on it, as long as they
// share one time namespace (`unshare --time` moves it; not detected: README.md).
// Thread safety: thread-safe.
#pragma once

#include <time.h>

#include <atomic>
#include <cstdint>

namespace retryd::shm {

namespace clock_internal {
using ClockGettime = int (*)(clockid_t, timespec*);
// The clock_gettime CoarseNowNs calls: the vDSO's once found (at load, or by the first call),
// else glibc's.
extern std::atomic<ClockGettime> g_clock_gettime;
}  // namespace clock_internal

// A writer other than a client (the daemon, retryctl, a segment's creator) stamps a breaker's
// close with CoarseNowNs too, never PreciseNowNs, and the daemon's tick judges the leases the
// clients stamped on it: a precise read is ahead of a coarse read made after it by the coarse
// clock's lag (a tick or more: 2.6 to 11.3 ms measured on a VM whose ticks are 4 ms). The close
// is the floor of the window (breaker.cc, FloorPeriod), which hides the calls stamped in the
// periods before it: stamped precisely, a close just past a period's start would hide the calls
// the clients made in the next few milliseconds; and a sweep on the precise clock would expire a
// lease that clock's lag early.
inline uint64_t CoarseNowNs() {
  timespec ts;
  clock_internal::g_clock_gettime.load(std::memory_order_relaxed)(CLOCK_MONOTONIC_COARSE, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000u + uint64_t(ts.tv_nsec);
}

inline uint64_t PreciseNowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000u + uint64_t(ts.tv_nsec);
}

// Wall-clock milliseconds since the epoch, for times shown to people (attach times, the
// heartbeat in metrics); never for deciding anything.
inline uint64_t UnixNowMs() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return uint64_t(ts.tv_sec) * 1000u + uint64_t(ts.tv_nsec) / 1'000'000u;
}

// Times stored in 32-bit words are milliseconds modulo 2^32; compare them only through
// MsBefore, which is right while the two are less than 24 days apart.
inline uint32_t NsToMs32(uint64_t ns) { return uint32_t(ns / 1'000'000u); }
inline bool MsReached(uint32_t now_ms, uint32_t deadline_ms) {
  return int32_t(now_ms - deadline_ms) >= 0;
}

// DeadlinePassed is MsReached for a deadline that was at most `max_ahead_ms` ahead when it was
// set: one that now reads as further ahead than that was set more than 24 days ago and has
// passed (the 32-bit difference wrapped). Open periods and lease expiries use it, so that a
// dependency nobody touched for a month is not held open or busy for another month.
inline bool DeadlinePassed(uint32_t now_ms, uint32_t deadline_ms, uint32_t max_ahead_ms) {
  return MsReached(now_ms, deadline_ms) || deadline_ms - now_ms > max_ahead_ms;
}

// How far one process's clock read may lag the time another process stamped: a process reads
// the clock, is descheduled, and uses the value after another has stamped a later time. The
// algorithms tolerate this much time going backwards between processes (retry_budget.h says
// what a longer lag costs).
inline constexpr uint32_t kMaxClockSkewMs = 60'000;

// The longest any stamped deadline can be ahead when it is set: an open period (open_for_max
// plus open_jitter, each at most kMaxKnobDurationMs) or a lease timeout (at most
// kMaxKnobDurationMs).
inline constexpr uint32_t kMaxStampedAheadMs = 2 * 86'400'000u;
// The guard of DeadlinePassed: the longest deadline, as seen by a reader whose clock lags the
// one that set it by up to kMaxClockSkewMs. A deadline any further ahead has passed.
inline constexpr uint32_t kMaxDeadlineAheadMs = kMaxStampedAheadMs + kMaxClockSkewMs;

}  // namespace retryd::shm
