// retryd/deadline.h: the total time budget of one logical call, and passing it downstream.
//
// A retry loop must never overrun its caller's budget: before each wait-and-retry it asks
// `CanFinish(wait + expected_attempt)` and gives up when the answer is no, instead of sleeping
// into a retry that cannot complete in time. Each attempt's own timeout is `Clamp`ed to what
// is left. Time comes from an injected monotonic `Clock` (tests pass a fake one).
//
// Downstream propagation uses the gRPC convention (grpc/doc/PROTOCOL-HTTP2.md), also usable
// as a plain HTTP header:
//
//   grpc-timeout: <TimeoutValue><TimeoutUnit>
//   TimeoutValue: 1 to 8 ASCII digits;  TimeoutUnit: H hours, M minutes, S seconds,
//                 m milliseconds, u microseconds, n nanoseconds
//
// It says how long is left, not an absolute time, so the two hosts' clocks need not agree.
// The receiver starts counting when the request arrives, so the time in flight is not
// deducted: its deadline ends later than the caller's by the one-way delay (as in gRPC). A
// caller that cares sends remaining() minus a margin.
//
// FormatDeadlineHeader picks the finest unit whose value fits in 8 digits, rounding down so
// that the downstream never believes it has more time than the caller (the loss is below 1e-5
// of the value), then the coarsest unit that still says the same ("150m", not "150000u").
// ParseDeadlineHeader accepts exactly the grammar, with optional whitespace around it; "0n"
// (any unit) is a valid, already expired deadline. A value beyond what int64 nanoseconds hold
// (over 292 years: "99999999H") saturates to nanoseconds::max().
//
// Thread safety: `Deadline` is a value; its const methods are thread-safe if the clock's `Now`
// is (Clock::Steady() is). The free functions are thread-safe.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>

#include "retryd/export.h"
#include "retryd/parse_error.h"

namespace retryd {

// The header that carries the remaining budget downstream.
inline constexpr std::string_view kDeadlineHeaderName = "grpc-timeout";
// The longest header value FormatDeadlineHeader writes: 8 digits and a unit.
inline constexpr size_t kDeadlineHeaderMaxLength = 9;

// A monotonic clock. `Now` must never go backwards on a real clock; `Deadline` nevertheless
// stays sane if it does (remaining time never exceeds the budget).
class RETRYD_EXPORT Clock {
 public:
  virtual ~Clock() = default;
  // Now returns the time since an arbitrary fixed origin.
  virtual std::chrono::nanoseconds Now() const = 0;
  // Steady returns a process-wide clock over std::chrono::steady_clock (CLOCK_MONOTONIC, the
  // same origin for every process on the host). Thread-safe.
  static const Clock& Steady();
};

class RETRYD_EXPORT Deadline {
 public:
  // Starts a budget of `budget` (negative counts as 0) now on `clock`, which must outlive the
  // Deadline and every copy of it.
  explicit Deadline(std::chrono::nanoseconds budget, const Clock& clock = Clock::Steady());

  // Infinite returns a deadline that never expires (remaining() is nanoseconds::max()).
  static Deadline Infinite(const Clock& clock = Clock::Steady());

  // remaining returns the time left, in [0, budget]. One clock read.
  std::chrono::nanoseconds remaining() const;
  // elapsed returns the time since the start, never negative. One clock read.
  std::chrono::nanoseconds elapsed() const;
  // expired reports whether no time is left. One clock read.
  bool expired() const { return remaining().count() == 0; }
  // CanFinish reports whether something taking `duration` (a wait plus an attempt, say),
  // started now, ends within the deadline. A negative duration counts as 0; an expired
  // deadline can finish nothing, not even a zero duration. One clock read.
  bool CanFinish(std::chrono::nanoseconds duration) const;
  // Clamp returns min(`timeout`, remaining()): the timeout to give the next attempt. One clock
  // read.
  std::chrono::nanoseconds Clamp(std::chrono::nanoseconds timeout) const;

  std::chrono::nanoseconds budget() const { return budget_; }
  bool infinite() const { return budget_ == std::chrono::nanoseconds::max(); }

 private:
  const Clock* clock_;
  std::chrono::nanoseconds start_;
  std::chrono::nanoseconds budget_;
};

// FormatDeadlineHeader returns the header value for `remaining` ("1500m", "2S"); negative
// counts as 0 ("0n"). A caller with an expired deadline should not send the call at all.
RETRYD_EXPORT std::string FormatDeadlineHeader(std::chrono::nanoseconds remaining);
// FormatDeadlineHeader writes the same value, without a NUL, into out[0..kDeadlineHeaderMaxLength)
// and returns its length. Never allocates.
RETRYD_EXPORT size_t FormatDeadlineHeader(std::chrono::nanoseconds remaining, char* out);

// ParseDeadlineHeader parses a header value and stores the timeout in *timeout. Returns kEmpty
// for an empty value, kNegative for a leading '-', kMalformed for anything else off the grammar
// (9 or more digits, a sign, a fraction, an unknown unit, inner whitespace, trailing junk), and
// leaves *timeout untouched on error.
RETRYD_EXPORT ParseError ParseDeadlineHeader(std::string_view value,
                                             std::chrono::nanoseconds* timeout);

}  // namespace retryd
