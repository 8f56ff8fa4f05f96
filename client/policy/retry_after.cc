#include "retryd/retry_after.h"

#include <algorithm>
#include <array>
#include <limits>

#include "header_text.h"

namespace retryd {
namespace {

using policy_internal::AllDigits;
using policy_internal::IsDigit;
using policy_internal::TrimOws;
using std::chrono::milliseconds;
using std::chrono::system_clock;

constexpr std::array<std::string_view, 7> kDayNames = {"Mon", "Tue", "Wed", "Thu",
                                                       "Fri", "Sat", "Sun"};
constexpr std::array<std::string_view, 7> kLongDayNames = {
    "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"};
constexpr std::array<std::string_view, 12> kMonthNames = {
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};

// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's days_from_civil).
int64_t DaysFromCivil(int64_t y, unsigned m, unsigned d) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const unsigned yoe = unsigned(y - era * 400);
  const unsigned doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + int64_t(doe) - 719468;
}

int64_t YearOfDays(int64_t z) {
  z += 719468;
  const int64_t era = (z >= 0 ? z : z - 146096) / 146097;
  const unsigned doe = unsigned(z - era * 146097);
  const unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  const unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  const unsigned mp = (5 * doy + 2) / 153;
  const unsigned m = mp < 10 ? mp + 3 : mp - 9;
  return int64_t(yoe) + era * 400 + (m <= 2);
}

bool IsLeap(int64_t y) { return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0; }

unsigned DaysInMonth(int64_t y, unsigned m) {
  static constexpr unsigned kDays[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  return m == 2 && IsLeap(y) ? 29 : kDays[m - 1];
}

int64_t FloorDiv(int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }

// A cursor over the text of one date; every step either consumes exactly what the grammar
// says or fails.
class Scanner {
 public:
  explicit Scanner(std::string_view s) : s_(s) {}

  bool Literal(std::string_view lit) {
    if (s_.substr(pos_, lit.size()) != lit) return false;
    pos_ += lit.size();
    return true;
  }
  bool Digits(size_t n, int* value) {
    if (pos_ + n > s_.size()) return false;
    int v = 0;
    for (size_t i = 0; i < n; ++i) {
      char c = s_[pos_ + i];
      if (!IsDigit(c)) return false;
      v = v * 10 + (c - '0');
    }
    pos_ += n;
    *value = v;
    return true;
  }
  template <size_t N>
  bool OneOf(const std::array<std::string_view, N>& names, unsigned* index) {
    for (size_t i = 0; i < N; ++i) {
      if (Literal(names[i])) {
        *index = unsigned(i);
        return true;
      }
    }
    return false;
  }
  bool Done() const { return pos_ == s_.size(); }

 private:
  std::string_view s_;
  size_t pos_ = 0;
};

struct Fields {
  int64_t year = 0;
  unsigned month = 0;  // 1..12
  int day = 0;
  int hour = 0, minute = 0, second = 0;
};

bool TimeOfDay(Scanner& in, Fields* f) {
  return in.Digits(2, &f->hour) && in.Literal(":") && in.Digits(2, &f->minute) &&
         in.Literal(":") && in.Digits(2, &f->second);
}

bool Month(Scanner& in, Fields* f) {
  unsigned m;
  if (!in.OneOf(kMonthNames, &m)) return false;
  f->month = m + 1;
  return true;
}

// "Sun, 06 Nov 1994 08:49:37 GMT"
bool ImfFixdate(std::string_view s, Fields* f) {
  Scanner in(s);
  unsigned dow;
  int year;
  if (!(in.OneOf(kDayNames, &dow) && in.Literal(", ") && in.Digits(2, &f->day) &&
        in.Literal(" ") && Month(in, f) && in.Literal(" ") && in.Digits(4, &year) &&
        in.Literal(" ") && TimeOfDay(in, f) && in.Literal(" GMT") && in.Done())) {
    return false;
  }
  f->year = year;
  return true;
}

// "Sunday, 06-Nov-94 08:49:37 GMT"; the century comes from `now_year`.
bool Rfc850(std::string_view s, int64_t now_year, Fields* f) {
  Scanner in(s);
  unsigned dow;
  int yy;
  if (!(in.OneOf(kLongDayNames, &dow) && in.Literal(", ") && in.Digits(2, &f->day) &&
        in.Literal("-") && Month(in, f) && in.Literal("-") && in.Digits(2, &yy) &&
        in.Literal(" ") && TimeOfDay(in, f) && in.Literal(" GMT") && in.Done())) {
    return false;
  }
  // The year with these last two digits in (now - 50, now + 50].
  int64_t year = FloorDiv(now_year, 100) * 100 + yy;
  if (year > now_year + 50) year -= 100;
  if (year <= now_year - 50) year += 100;
  f->year = year;
  return true;
}

// "Sun Nov  6 08:49:37 1994" (or "Sun Nov 06 ...")
bool Asctime(std::string_view s, Fields* f) {
  Scanner in(s);
  unsigned dow;
  int year;
  if (!(in.OneOf(kDayNames, &dow) && in.Literal(" ") && Month(in, f) && in.Literal(" "))) {
    return false;
  }
  if (!(in.Digits(2, &f->day) || (in.Literal(" ") && in.Digits(1, &f->day)))) return false;
  if (!(in.Literal(" ") && TimeOfDay(in, f) && in.Literal(" ") && in.Digits(4, &year) &&
        in.Done())) {
    return false;
  }
  f->year = year;
  return true;
}

bool InRange(const Fields& f) {
  return f.day >= 1 && unsigned(f.day) <= DaysInMonth(f.year, f.month) && f.hour <= 23 &&
         f.minute <= 59 && f.second <= 60;
}

int64_t UnixMillis(system_clock::time_point t) {
  return std::chrono::duration_cast<milliseconds>(t.time_since_epoch()).count();
}

}  // namespace

const char* ParseErrorName(ParseError e) {
  switch (e) {
    case ParseError::kNone: return "ok";
    case ParseError::kEmpty: return "empty";
    case ParseError::kMalformed: return "malformed";
    case ParseError::kNegative: return "negative";
    case ParseError::kOutOfRange: return "out of range";
  }
  return "unknown parse error";
}

ParseError ParseHttpDate(std::string_view text, system_clock::time_point now,
                         int64_t* unix_seconds, RetryAfterForm* form) {
  std::string_view s = TrimOws(text);
  if (s.empty()) return ParseError::kEmpty;
  Fields f;
  RetryAfterForm parsed;
  if (s.size() > 3 && s[3] == ',') {
    if (!ImfFixdate(s, &f)) return ParseError::kMalformed;
    parsed = RetryAfterForm::kImfFixdate;
  } else if (s.find(',') != std::string_view::npos) {
    int64_t now_year = YearOfDays(FloorDiv(UnixMillis(now), 86'400'000));
    if (!Rfc850(s, now_year, &f)) return ParseError::kMalformed;
    parsed = RetryAfterForm::kRfc850;
  } else {
    if (!Asctime(s, &f)) return ParseError::kMalformed;
    parsed = RetryAfterForm::kAsctime;
  }
  if (!InRange(f)) return ParseError::kMalformed;
  *unix_seconds = DaysFromCivil(f.year, f.month, unsigned(f.day)) * 86'400 + f.hour * 3'600 +
                  f.minute * 60 + f.second;
  if (form != nullptr) *form = parsed;
  return ParseError::kNone;
}

ParseError ParseRetryAfter(std::string_view value, std::string_view date_header,
                           system_clock::time_point now, RetryAfter* out,
                           const RetryAfterOptions& options) {
  std::string_view v = TrimOws(value);
  if (v.empty()) return ParseError::kEmpty;
  const int64_t max_wait_ms = std::max<int64_t>(0, options.max_wait.count());

  RetryAfter result;
  int64_t wait_ms;
  if (IsDigit(v.front())) {
    if (!AllDigits(v)) return ParseError::kMalformed;
    constexpr int64_t kMaxSeconds = std::numeric_limits<int64_t>::max() / 1000;
    int64_t seconds = 0;
    for (char c : v) {
      int digit = c - '0';
      if (seconds > (kMaxSeconds - digit) / 10) return ParseError::kOutOfRange;
      seconds = seconds * 10 + digit;
    }
    wait_ms = seconds * 1000;
    result.form = RetryAfterForm::kDelaySeconds;
  } else if (v.front() == '-') {
    return AllDigits(v.substr(1)) ? ParseError::kNegative : ParseError::kMalformed;
  } else {
    int64_t retry_at_s;
    ParseError e = ParseHttpDate(v, now, &retry_at_s, &result.form);
    if (e != ParseError::kNone) return ParseError::kMalformed;
    int64_t reference_ms = UnixMillis(now);
    int64_t server_now_s;
    if (ParseHttpDate(date_header, now, &server_now_s) == ParseError::kNone) {
      reference_ms = server_now_s * 1000;
      result.used_date_header = true;
    }
    // Both instants lie within a few hundred thousand years of 1970: no overflow.
    wait_ms = std::max<int64_t>(0, retry_at_s * 1000 - reference_ms);
  }
  if (wait_ms > max_wait_ms) {
    wait_ms = max_wait_ms;
    result.clamped = true;
  }
  result.wait = milliseconds(wait_ms);
  *out = result;
  return ParseError::kNone;
}

}  // namespace retryd
