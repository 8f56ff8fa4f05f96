// retryd/parse_error.h: why a header value from the wire was rejected.
//
// The retry-policy toolkit parses values a remote server or caller controls (Retry-After,
// Date, the deadline header). None of them is trusted: every parser either returns
// `ParseError::kNone` with a value in range, or one of the errors below and leaves its output
// untouched. A rejected value is never silently read as 0.
// The numeric values are the C ABI's RETRYD_POLICY_E* codes (retryd_policy.h).
// Thread safety: plain values and pure functions; thread-safe.
#pragma once

#include "retryd/export.h"

namespace retryd {

enum class ParseError : int {
  kNone = 0,
  kEmpty = -10,       // absent, empty or only whitespace
  kMalformed = -11,   // not the grammar: garbage, a fraction, trailing junk, a bad date
  kNegative = -12,    // a negative number where the grammar allows none
  kOutOfRange = -13,  // syntactically fine but does not fit (delay-seconds past 2^63 ms)
};

// ParseErrorName returns a short lower-case description ("malformed"), never nullptr.
RETRYD_EXPORT const char* ParseErrorName(ParseError e);

}  // namespace retryd
