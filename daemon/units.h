// daemon/units.h: the daemon's unit of time conversion.
#pragma once

#include <cstdint>

namespace retryd::daemon {

// Nanoseconds in a millisecond: the clocks read nanoseconds (shm/clock.h), the config and the
// segment's words speak milliseconds.
inline constexpr uint64_t kMsNs = 1'000'000;

}  // namespace retryd::daemon
