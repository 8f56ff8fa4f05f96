// client/policy/deadline_math.h: the arithmetic of a deadline with time as a parameter, shared
// by retryd::Deadline (which reads its Clock) and the C ABI (which is passed now_ns).
// Private to the library. Thread safety: pure functions; thread-safe.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace retryd::policy_internal {

// Elapsed returns now - start, 0 if the clock went backwards, saturating on overflow.
inline std::chrono::nanoseconds Elapsed(std::chrono::nanoseconds start,
                                        std::chrono::nanoseconds now) {
  int64_t elapsed;
  if (__builtin_sub_overflow(now.count(), start.count(), &elapsed)) {
    // Only a clock that jumped across most of the int64 range gets here.
    return now < start ? std::chrono::nanoseconds(0) : std::chrono::nanoseconds::max();
  }
  return std::chrono::nanoseconds(std::max<int64_t>(0, elapsed));
}

// Remaining returns the time left in [0, budget]; a budget of nanoseconds::max() never ends.
inline std::chrono::nanoseconds Remaining(std::chrono::nanoseconds start,
                                          std::chrono::nanoseconds budget,
                                          std::chrono::nanoseconds now) {
  if (budget == std::chrono::nanoseconds::max()) return budget;
  std::chrono::nanoseconds e = Elapsed(start, now);
  return e >= budget ? std::chrono::nanoseconds(0) : budget - e;
}

// CanFinish: something taking `duration` (negative counts as 0) ends within `remaining`, and
// the deadline has not already expired.
inline bool CanFinish(std::chrono::nanoseconds remaining, std::chrono::nanoseconds duration) {
  return remaining.count() > 0 && std::max(duration, std::chrono::nanoseconds(0)) <= remaining;
}

}  // namespace retryd::policy_internal
