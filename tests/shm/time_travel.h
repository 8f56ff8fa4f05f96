// tests/shm/time_travel.h: the virtual clock of the time-travel harness: where a run starts,
// how long it stays idle, and one dependency slot living in that clock.
//
// Every stamp in the segment is cut to fewer bits than the clock it comes from: 32-bit
// milliseconds (wrap at 2^32 ms = 49.7 days, signed differences flip at 2^31 ms = 24.8 days),
// 16-bit bucket period numbers and 16-bit breaker seqs. The start offsets below put a run just
// before, at and just after each of those wraps of the absolute clock; the gaps make it idle for
// every order of magnitude from 1 ms to a year and for each wrap length +/- 1.
// Not thread-safe: each test owns its slot.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "shm/admission.h"
#include "shm/breaker.h"
#include "shm/clock.h"
#include "shm/policy.h"
#include "shm/retry_budget.h"

namespace retryd::shm {
// Failures print the names, not the bytes.
inline void PrintTo(BreakerState s, std::ostream* os) {
  *os << BreakerStateName(s);
}
inline void PrintTo(Decision d, std::ostream* os) {
  *os << DecisionName(d);
}
}  // namespace retryd::shm

namespace retryd::testing {

inline constexpr uint64_t kMsNs = 1'000'000;
inline constexpr uint64_t kWrapMs = uint64_t{1} << 32;  // 49.7 days
inline constexpr uint64_t kHalfWrapMs = kWrapMs / 2;    // 24.8 days
inline constexpr uint64_t kDayMs = 86'400'000;
inline constexpr uint64_t kYearMs = 365 * kDayMs;

// A point of the absolute virtual clock, in ms; `name` is a valid test-name fragment.
struct Offset {
  const char* name;
  uint64_t ms;
};

// Where runs start: zero, small, and just before / at / after each wrap of the 32-bit ms clock
// and of its sign, and a few multiples of the wrap.
inline const std::vector<Offset>& StartOffsets() {
  static const std::vector<Offset> offsets = {
      {"Zero", 0},
      {"Small7ms", 7},
      {"Before2p31ms", kHalfWrapMs - 1},  // 24.8 days
      {"At2p31ms", kHalfWrapMs},
      {"After2p31ms", kHalfWrapMs + 1},
      {"Before0xC0000000ms", 0xC000'0000ull - 1},  // 37.3 days
      {"At0xC0000000ms", 0xC000'0000ull},
      {"Before2p32ms", kWrapMs - 1},  // 49.7 days
      {"At2p32ms", kWrapMs},
      {"After2p32ms", kWrapMs + 1},
      {"At2x2p32msPlus2p31ms", 2 * kWrapMs + kHalfWrapMs},
      {"Before3x2p32ms", 3 * kWrapMs - 1},
      {"At3x2p32ms", 3 * kWrapMs},
      {"After3x2p32ms", 3 * kWrapMs + 1},
  };
  return offsets;
}

// A breaker window's shape.
struct WindowShape {
  uint32_t window_ms;
  uint32_t buckets;
  uint64_t bucket_ns() const { return uint64_t{window_ms} * kMsNs / buckets; }
  uint64_t window_ns() const { return bucket_ns() * buckets; }
};
inline const std::vector<WindowShape>& WindowShapes() {
  static const std::vector<WindowShape> shapes = {
      {10'000, 10},  // the default: 1 s buckets
      {800, 16},     // the finest: 50 ms buckets, 2^16 % 16 == 0
      {3'000, 3},    // 1 s buckets, an odd count
  };
  return shapes;
}

// An idle gap: `ms`, plus `periods` bucket periods and `half_windows` half windows of the
// window shape at hand, so that "65,536 periods" means the 16-bit period wrap for every shape.
// Either may be negative.
struct Gap {
  const char* name;
  uint64_t ms;
  int64_t periods = 0;
  int64_t half_windows = 0;
  uint64_t Ns(const WindowShape& shape = {1, 1}) const {
    return ms * kMsNs + uint64_t(periods * int64_t(shape.bucket_ns()) +
                                 half_windows * int64_t(shape.window_ns() / 2));
  }
};

// Every order of magnitude from 1 ms to a year, a month, and each 32-bit wrap length +/- 1.
inline std::vector<Gap> IdleGaps() {
  return {
      {"1ms", 1},
      {"10ms", 10},
      {"100ms", 100},
      {"1s", 1'000},
      {"10s", 10'000},
      {"100s", 100'000},
      {"1e6ms", 1'000'000},
      {"1e7ms", 10'000'000},
      {"1e8ms", 100'000'000},
      {"1e9ms", 1'000'000'000},
      {"1e10ms", 10'000'000'000},
      {"AYear", kYearMs},
      {"AMonth", 30 * kDayMs},
      {"2p31msMinus1", kHalfWrapMs - 1},
      {"2p31ms", kHalfWrapMs},
      {"2p31msPlus1", kHalfWrapMs + 1},
      {"2p32msMinus1Day", kWrapMs - kDayMs},  // 47.7 days
      {"2p32msMinus1", kWrapMs - 1},
      {"2p32ms", kWrapMs},
      {"2p32msPlus1", kWrapMs + 1},
  };
}

// Gaps measured in a window's bucket periods: the 16-bit period number's wrap +/- 1, and a
// whole window past it.
inline std::vector<Gap> PeriodGaps() {
  return {
      {"65536PeriodsMinus1", 0, 65'536 - 1},
      {"65536Periods", 0, 65'536},
      {"65536PeriodsPlus1", 0, 65'536 + 1},
      {"2x65536Periods", 0, 2 * 65'536},
  };
}

template <typename... Lists>
std::vector<Gap> Concat(std::vector<Gap> first, const Lists&... rest) {
  (first.insert(first.end(), rest.begin(), rest.end()), ...);
  return first;
}

// The name of a test instance whose parameter is a gap: "Gap2p31msPlus1".
template <typename ParamInfo>
std::string GapName(const ParamInfo& info) {
  return std::string("Gap") + info.param.name;
}

// VirtualSlot is one dependency slot on its own, created at virtual time `start_ns`: breaker
// closed then, retry budget full then, window empty. Nothing in it has seen the real clock.
class VirtualSlot {
 public:
  VirtualSlot(const shm::Policy& policy, uint64_t start_ns)
      : slot_(std::make_unique<shm::DependencySlot>()) {
    shm::StorePolicy(policy, slot_->policy);
    slot_->mode.store(uint32_t(policy.mode));
    shm::Reset(*slot_, start_ns);
  }

  shm::Decision Admit(uint32_t attempt, uint64_t now_ns, shm::Permit* p, uint16_t owner = 1) {
    caller_.owner = owner;
    return shm::Admit(*slot_, 0, attempt, now_ns, caller_, p);
  }
  void Complete(shm::Permit* p, shm::Outcome o, uint64_t now_ns) {
    shm::Complete(*slot_, p, o, kMsNs, now_ns, caller_);
  }
  // Call runs one first attempt at `now_ns` to outcome `o`; returns the admit's decision.
  shm::Decision Call(uint64_t now_ns, shm::Outcome o) {
    shm::Permit p;
    const shm::Decision d = Admit(0, now_ns, &p);
    Complete(&p, o, now_ns);
    return d;
  }
  shm::BreakerWord Breaker() const { return shm::BreakerWord::Decode(slot_->breaker.load()); }
  shm::BreakerState State() const { return Breaker().state; }
  uint64_t Counter(shm::Counter c) const { return shm::ReadCounter(*slot_, c); }
  shm::DependencySlot& slot() { return *slot_; }
  shm::Caller& caller() { return caller_; }

 private:
  std::unique_ptr<shm::DependencySlot> slot_;
  shm::Caller caller_{1, 0, 12345};
};

}  // namespace retryd::testing
