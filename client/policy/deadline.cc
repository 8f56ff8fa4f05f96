#include "retryd/deadline.h"

#include <algorithm>
#include <array>
#include <cstdint>

#include "deadline_math.h"
#include "header_text.h"

namespace retryd {
namespace {

using std::chrono::nanoseconds;
using policy_internal::IsDigit;
using policy_internal::TrimOws;

class SteadyClock final : public Clock {
 public:
  nanoseconds Now() const override {
    return std::chrono::duration_cast<nanoseconds>(
        std::chrono::steady_clock::now().time_since_epoch());
  }
};

struct Unit {
  char symbol;
  int64_t ns;
};
// Finest first.
constexpr std::array<Unit, 6> kUnits = {{{'n', 1},
                                         {'u', 1'000},
                                         {'m', 1'000'000},
                                         {'S', 1'000'000'000},
                                         {'M', 60'000'000'000},
                                         {'H', 3'600'000'000'000}}};
constexpr int64_t kMaxValue = 99'999'999;  // 8 digits
constexpr size_t kMaxDigits = 8;

}  // namespace

const Clock& Clock::Steady() {
  static const SteadyClock clock;
  return clock;
}

Deadline::Deadline(nanoseconds budget, const Clock& clock)
    : clock_(&clock), start_(clock.Now()), budget_(std::max(budget, nanoseconds(0))) {}

Deadline Deadline::Infinite(const Clock& clock) { return Deadline(nanoseconds::max(), clock); }

nanoseconds Deadline::elapsed() const {
  return policy_internal::Elapsed(start_, clock_->Now());
}

nanoseconds Deadline::remaining() const {
  return policy_internal::Remaining(start_, budget_, clock_->Now());
}

bool Deadline::CanFinish(nanoseconds duration) const {
  return policy_internal::CanFinish(remaining(), duration);
}

nanoseconds Deadline::Clamp(nanoseconds timeout) const {
  return std::clamp(timeout, nanoseconds(0), remaining());
}

size_t FormatDeadlineHeader(nanoseconds remaining, char* out) {
  int64_t ns = std::max<int64_t>(0, remaining.count());
  size_t u = 0;
  while (u + 1 < kUnits.size() && ns / kUnits[u].ns > kMaxValue) ++u;
  while (u + 1 < kUnits.size() && ns != 0 && ns % kUnits[u + 1].ns == 0) ++u;
  // INT64_MAX ns is 2'562'047 H: the coarsest unit always fits in 8 digits.
  int64_t value = ns / kUnits[u].ns;
  char digits[kMaxDigits];
  size_t n = 0;
  do {
    digits[n++] = char('0' + value % 10);
    value /= 10;
  } while (value != 0);
  for (size_t i = 0; i < n; ++i) out[i] = digits[n - 1 - i];
  out[n] = kUnits[u].symbol;
  return n + 1;
}

std::string FormatDeadlineHeader(nanoseconds remaining) {
  char text[kDeadlineHeaderMaxLength];
  return std::string(text, FormatDeadlineHeader(remaining, text));
}

ParseError ParseDeadlineHeader(std::string_view value, nanoseconds* timeout) {
  std::string_view v = TrimOws(value);
  if (v.empty()) return ParseError::kEmpty;
  if (v.front() == '-') return ParseError::kNegative;
  size_t digits = 0;
  int64_t n = 0;
  while (digits < v.size() && IsDigit(v[digits])) {
    if (digits == kMaxDigits) return ParseError::kMalformed;
    n = n * 10 + (v[digits] - '0');
    ++digits;
  }
  if (digits == 0 || digits + 1 != v.size()) return ParseError::kMalformed;
  for (const Unit& unit : kUnits) {
    if (unit.symbol != v.back()) continue;
    int64_t ns;
    *timeout = __builtin_mul_overflow(n, unit.ns, &ns) ? nanoseconds::max() : nanoseconds(ns);
    return ParseError::kNone;
  }
  return ParseError::kMalformed;
}

}  // namespace retryd
