// retryd/retry_after.h: the server's own answer to "when may I retry?" (RFC 9110 §10.2.3).
//
// A 429 or 503 often carries `Retry-After`, either as delay-seconds ("120") or as an HTTP-date
// (RFC 9110 §5.6.7) in any of its three forms:
//
//   IMF-fixdate  "Sun, 06 Nov 1994 08:49:37 GMT"   (what servers must send)
//   RFC 850      "Sunday, 06-Nov-94 08:49:37 GMT"  (obsolete, two-digit year)
//   asctime      "Sun Nov  6 08:49:37 1994"        (obsolete)
//
// An HTTP-date is an instant on the server's clock, so the wait is measured against the
// response's `Date` header when it parses (the server's "now"), and against the local wall clock
// only when it does not: a host whose clock runs a minute behind then neither hammers the server
// nor sleeps a minute too long. A date in the past means "now": the wait clamps to 0.
//
// The parser is our own: no strptime, no locale, no time zone. Names are case-sensitive and
// whitespace is exact, as in the grammar, except for optional whitespace around the value. The
// day name is checked to be a day name, not checked against the date. A two-digit year is the
// year with those digits within 50 years of now, never more than 50 years ahead (RFC 9110
// §5.6.7; the comparison is by year): in 2026, "94" is 1994, "76" 2076 and "77" 1977. Seconds
// may be 60 (a leap second counts as the next second).
//
// Thread safety: pure functions; thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <string_view>

#include "retryd/export.h"
#include "retryd/parse_error.h"

namespace retryd {

enum class RetryAfterForm : int {
  kDelaySeconds = 0,
  kImfFixdate = 1,
  kRfc850 = 2,
  kAsctime = 3,
};

struct RetryAfterOptions {
  // The longest wait a server may impose; a longer one is clamped to it (and `clamped` set).
  // Default 300 s. A wait longer than the caller's deadline is the deadline's business: the
  // retry loop gives up instead of sleeping past it.
  std::chrono::milliseconds max_wait = std::chrono::seconds(300);
};

struct RetryAfter {
  std::chrono::milliseconds wait{0};  // in [0, max_wait]
  RetryAfterForm form = RetryAfterForm::kDelaySeconds;
  bool clamped = false;           // the server asked for more than max_wait
  bool used_date_header = false;  // an HTTP-date was measured against the `Date` header
};

// ParseHttpDate parses `text` (optional whitespace around it) in any of the three HTTP-date
// forms and stores the instant, in seconds since the Unix epoch, in *unix_seconds. `now`
// resolves the century of an RFC 850 two-digit year. Stores the form in *form if `form` is not
// nullptr. On error returns kEmpty or kMalformed and leaves the outputs untouched.
RETRYD_EXPORT ParseError ParseHttpDate(std::string_view text,
                                       std::chrono::system_clock::time_point now,
                                       int64_t* unix_seconds, RetryAfterForm* form = nullptr);

// ParseRetryAfter parses the value of a `Retry-After` header and stores in *out how long to wait
// from now. `date_header` is the value of the same response's `Date` header ("" if none); `now`
// is the local wall clock. Delay-seconds is 1*DIGIT: a sign, a fraction, trailing junk or an
// empty value is rejected (kNegative for a leading '-', kMalformed otherwise, kEmpty for
// nothing), and so is a number too large for a 64-bit count of milliseconds (kOutOfRange); a
// merely large one is clamped to `options.max_wait`. An HTTP-date that does not parse is
// kMalformed; a `Date` header that does not parse is ignored in favour of `now`. On error,
// *out is left untouched.
RETRYD_EXPORT ParseError ParseRetryAfter(std::string_view value, std::string_view date_header,
                                         std::chrono::system_clock::time_point now,
                                         RetryAfter* out, const RetryAfterOptions& options = {});

}  // namespace retryd
