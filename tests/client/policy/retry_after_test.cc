#include "retryd/retry_after.h"

#include <chrono>
#include <cstdint>
#include <string>

#include <gtest/gtest.h>

namespace retryd {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using std::chrono::system_clock;

// Sun, 06 Nov 1994 08:49:37 GMT, the RFC's example instant.
constexpr int64_t kRfcExampleUnix = 784'111'777;

system_clock::time_point At(int64_t unix_seconds, int64_t extra_ms = 0) {
  return system_clock::time_point(
      std::chrono::duration_cast<system_clock::duration>(seconds(unix_seconds) +
                                                         milliseconds(extra_ms)));
}

const system_clock::time_point kNow = At(kRfcExampleUnix);
// 2026-06-15 12:00:00 UTC: a "now" in this century, for two-digit years.
const system_clock::time_point kNow2026 = At(1'781'524'800);

TEST(ParseHttpDateTest, AllThreeFormsOfTheSameInstant) {
  struct Case {
    const char* text;
    RetryAfterForm form;
  };
  const Case cases[] = {
      {"Sun, 06 Nov 1994 08:49:37 GMT", RetryAfterForm::kImfFixdate},
      {"Sunday, 06-Nov-94 08:49:37 GMT", RetryAfterForm::kRfc850},
      {"Sun Nov  6 08:49:37 1994", RetryAfterForm::kAsctime},
      {"Sun Nov 06 08:49:37 1994", RetryAfterForm::kAsctime},
      {" \tSun, 06 Nov 1994 08:49:37 GMT\t ", RetryAfterForm::kImfFixdate},
  };
  for (const Case& c : cases) {
    int64_t unix_seconds = -1;
    RetryAfterForm form = RetryAfterForm::kDelaySeconds;
    EXPECT_EQ(ParseHttpDate(c.text, kNow, &unix_seconds, &form), ParseError::kNone) << c.text;
    EXPECT_EQ(unix_seconds, kRfcExampleUnix) << c.text;
    EXPECT_EQ(form, c.form) << c.text;
  }
}

TEST(ParseHttpDateTest, CalendarEdges) {
  struct Case {
    const char* text;
    int64_t want;
  };
  const Case cases[] = {
      {"Thu, 01 Jan 1970 00:00:00 GMT", 0},
      {"Wed, 31 Dec 1969 23:59:59 GMT", -1},
      {"Thu, 29 Feb 1996 12:00:00 GMT", 825'595'200},
      {"Tue, 29 Feb 2000 00:00:00 GMT", 951'782'400},
      {"Tue, 19 Jan 2038 03:14:08 GMT", 2'147'483'648},  // past 32-bit time_t
      {"Fri, 31 Dec 9999 23:59:59 GMT", 253'402'300'799},
      {"Sat, 31 Dec 2016 23:59:60 GMT", 1'483'228'800},  // a leap second: the next second
  };
  for (const Case& c : cases) {
    int64_t unix_seconds = 12345;
    EXPECT_EQ(ParseHttpDate(c.text, kNow, &unix_seconds), ParseError::kNone) << c.text;
    EXPECT_EQ(unix_seconds, c.want) << c.text;
  }
}

TEST(ParseHttpDateTest, TwoDigitYearsFollowTheFiftyYearRule) {
  struct Case {
    const char* text;
    int64_t year_start;  // unix seconds of Jan 1 of the expected year
  };
  // With now in 2026: 94 -> 1994, 30 -> 2030, 76 -> 2076 (exactly 50 years ahead: kept),
  // 77 -> 1977 (more than 50 years ahead: the previous century).
  const Case cases[] = {
      {"Saturday, 01-Jan-94 00:00:00 GMT", 757'382'400},
      {"Tuesday, 01-Jan-30 00:00:00 GMT", 1'893'456'000},
      {"Wednesday, 01-Jan-76 00:00:00 GMT", 3'345'062'400},
      {"Saturday, 01-Jan-77 00:00:00 GMT", 220'924'800},
      {"Saturday, 01-Jan-00 00:00:00 GMT", 946'684'800},
  };
  for (const Case& c : cases) {
    int64_t unix_seconds = 0;
    EXPECT_EQ(ParseHttpDate(c.text, kNow2026, &unix_seconds), ParseError::kNone) << c.text;
    EXPECT_EQ(unix_seconds, c.year_start) << c.text;
  }
  // With now in 1994, "94" is 1994 and "30" is 2030: within 50 years ahead.
  int64_t unix_seconds = 0;
  ASSERT_EQ(ParseHttpDate("Tuesday, 01-Jan-30 00:00:00 GMT", kNow, &unix_seconds),
            ParseError::kNone);
  EXPECT_EQ(unix_seconds, 1'893'456'000);
}

TEST(ParseHttpDateTest, RejectsAnythingOffTheGrammar) {
  const char* bad[] = {
      "Sun, 6 Nov 1994 08:49:37 GMT",      // one-digit day in IMF-fixdate
      "sun, 06 Nov 1994 08:49:37 GMT",     // names are case-sensitive
      "Sun, 06 nov 1994 08:49:37 GMT",
      "Sun, 06 Nov 1994 08:49:37 gmt",
      "Sun, 06 Nov 1994 08:49:37 UTC",
      "Sun, 06 Nov 1994 08:49:37 +0000",
      "Sun, 06 Nov 1994 08:49:37",         // no zone
      "Sun, 06 Nov 1994 08:49:37 GMT x",   // trailing junk
      "Sun, 06 Nov 1994 08:49:37 GMTT",
      "Sun,  06 Nov 1994 08:49:37 GMT",    // extra space
      "Sun, 06 Nov 94 08:49:37 GMT",       // two-digit year in IMF-fixdate
      "Sun, 06 Nov 1994 8:49:37 GMT",      // one-digit hour
      "Sun, 06 Nov 1994 24:00:00 GMT",     // hour out of range
      "Sun, 06 Nov 1994 08:60:00 GMT",
      "Sun, 06 Nov 1994 08:49:61 GMT",
      "Sun, 00 Nov 1994 08:49:37 GMT",     // day out of range
      "Sun, 31 Nov 1994 08:49:37 GMT",
      "Sun, 29 Feb 1900 08:49:37 GMT",     // 1900 is not a leap year
      "Sun, 06 Foo 1994 08:49:37 GMT",
      "Xyz, 06 Nov 1994 08:49:37 GMT",
      "Sun, 06 Nov 1994 08:49:37 GMT\r\n",
      "Sun, 06 Nov 1994 08:49 GMT",
      "Sun, 06 Nov 1994",
      "Sun, 06 Nov 1994 08:49:37 GMT, Sun, 06 Nov 1994 08:49:37 GMT",
      "Sunday, 06-Nov-1994 08:49:37 GMT",  // four-digit year in RFC 850
      "Sun, 06-Nov-94 08:49:37 GMT",       // short day name in RFC 850
      "Sunday, 06 Nov 94 08:49:37 GMT",
      "Sun Nov 6 08:49:37 1994",           // asctime needs two columns for the day
      "Sun Nov  6 08:49:37 94",
      "Sun Nov  6 08:49:37 1994 GMT",
      "Sunday Nov  6 08:49:37 1994",
      "2024-01-01T00:00:00Z",
      "yesterday",
      ",",
      "Sun,",
  };
  for (const char* text : bad) {
    int64_t unix_seconds = 777;
    RetryAfterForm form = RetryAfterForm::kDelaySeconds;
    EXPECT_EQ(ParseHttpDate(text, kNow, &unix_seconds, &form), ParseError::kMalformed) << text;
    EXPECT_EQ(unix_seconds, 777) << text;  // untouched
    EXPECT_EQ(form, RetryAfterForm::kDelaySeconds) << text;
  }
  int64_t unix_seconds = 777;
  EXPECT_EQ(ParseHttpDate("", kNow, &unix_seconds), ParseError::kEmpty);
  EXPECT_EQ(ParseHttpDate(" \t ", kNow, &unix_seconds), ParseError::kEmpty);
  EXPECT_EQ(unix_seconds, 777);
}

struct RetryAfterCase {
  const char* value;
  const char* date_header;
  system_clock::time_point now;
  ParseError want_error;
  int64_t want_wait_ms;
  bool want_clamped;
  bool want_used_date;
};

class ParseRetryAfterTableTest : public ::testing::TestWithParam<RetryAfterCase> {};

TEST_P(ParseRetryAfterTableTest, Parses) {
  const RetryAfterCase& c = GetParam();
  RetryAfter out;
  out.wait = milliseconds(-42);  // a sentinel: must stay on error
  ParseError e = ParseRetryAfter(c.value, c.date_header, c.now, &out);
  ASSERT_EQ(e, c.want_error) << "'" << c.value << "' got " << ParseErrorName(e);
  if (e != ParseError::kNone) {
    EXPECT_EQ(out.wait, milliseconds(-42)) << "output written on error";
    return;
  }
  EXPECT_EQ(out.wait, milliseconds(c.want_wait_ms)) << c.value;
  EXPECT_EQ(out.clamped, c.want_clamped) << c.value;
  EXPECT_EQ(out.used_date_header, c.want_used_date) << c.value;
}

constexpr auto kOk = ParseError::kNone;
constexpr int64_t kMaxMs = 300'000;  // the default ceiling

INSTANTIATE_TEST_SUITE_P(
    DelaySeconds, ParseRetryAfterTableTest,
    ::testing::Values(
        RetryAfterCase{"120", "", kNow, kOk, 120'000, false, false},
        RetryAfterCase{"0", "", kNow, kOk, 0, false, false},
        RetryAfterCase{"007", "", kNow, kOk, 7'000, false, false},
        RetryAfterCase{" \t120\t ", "", kNow, kOk, 120'000, false, false},
        RetryAfterCase{"300", "", kNow, kOk, kMaxMs, false, false},
        RetryAfterCase{"301", "", kNow, kOk, kMaxMs, true, false},
        RetryAfterCase{"86400", "", kNow, kOk, kMaxMs, true, false},
        // The largest count of seconds whose milliseconds fit in int64: clamped, not rejected.
        RetryAfterCase{"9223372036854775", "", kNow, kOk, kMaxMs, true, false},
        RetryAfterCase{"9223372036854776", "", kNow, ParseError::kOutOfRange, 0, false, false},
        RetryAfterCase{"99999999999999999999999999", "", kNow, ParseError::kOutOfRange, 0,
                       false, false},
        // A Date header does not change delay-seconds.
        RetryAfterCase{"5", "Sun, 06 Nov 1994 07:00:00 GMT", kNow, kOk, 5'000, false, false}));

INSTANTIATE_TEST_SUITE_P(
    Rejected, ParseRetryAfterTableTest,
    ::testing::Values(
        RetryAfterCase{"", "", kNow, ParseError::kEmpty, 0, false, false},
        RetryAfterCase{"  ", "", kNow, ParseError::kEmpty, 0, false, false},
        RetryAfterCase{"-5", "", kNow, ParseError::kNegative, 0, false, false},
        RetryAfterCase{"-0", "", kNow, ParseError::kNegative, 0, false, false},
        RetryAfterCase{"-", "", kNow, ParseError::kMalformed, 0, false, false},
        RetryAfterCase{"-5s", "", kNow, ParseError::kMalformed, 0, false, false},
        RetryAfterCase{"+5", "", kNow, ParseError::kMalformed, 0, false, false},
        RetryAfterCase{"1.5", "", kNow, ParseError::kMalformed, 0, false, false},
        RetryAfterCase{"12abc", "", kNow, ParseError::kMalformed, 0, false, false},
        RetryAfterCase{"12 34", "", kNow, ParseError::kMalformed, 0, false, false},
        RetryAfterCase{"0x10", "", kNow, ParseError::kMalformed, 0, false, false},
        RetryAfterCase{"1e3", "", kNow, ParseError::kMalformed, 0, false, false},
        RetryAfterCase{"120\r\n", "", kNow, ParseError::kMalformed, 0, false, false},
        RetryAfterCase{"soon", "", kNow, ParseError::kMalformed, 0, false, false},
        RetryAfterCase{"Sun, 06 Nov 1994 08:49:37 UTC", "", kNow, ParseError::kMalformed, 0,
                       false, false}));

INSTANTIATE_TEST_SUITE_P(
    HttpDate, ParseRetryAfterTableTest,
    ::testing::Values(
        // Two minutes after the local clock, in each form.
        RetryAfterCase{"Sun, 06 Nov 1994 08:51:37 GMT", "", kNow, kOk, 120'000, false, false},
        RetryAfterCase{"Sunday, 06-Nov-94 08:51:37 GMT", "", kNow, kOk, 120'000, false, false},
        RetryAfterCase{"Sun Nov  6 08:51:37 1994", "", kNow, kOk, 120'000, false, false},
        // Millisecond precision of the local clock is kept.
        RetryAfterCase{"Sun, 06 Nov 1994 08:51:37 GMT", "", At(kRfcExampleUnix, 250), kOk,
                       119'750, false, false},
        // Past dates clamp to 0.
        RetryAfterCase{"Sun, 06 Nov 1994 08:49:37 GMT", "", kNow, kOk, 0, false, false},
        RetryAfterCase{"Thu, 01 Jan 1970 00:00:00 GMT", "", kNow, kOk, 0, false, false},
        // Far future clamps to the ceiling.
        RetryAfterCase{"Fri, 31 Dec 9999 23:59:59 GMT", "", kNow, kOk, kMaxMs, true, false}));

INSTANTIATE_TEST_SUITE_P(
    ClockSkew, ParseRetryAfterTableTest,
    ::testing::Values(
        // The local clock is an hour behind the server: measured against the local clock the
        // wait would be an hour and a minute (clamped); against Date it is the minute meant.
        RetryAfterCase{"Sun, 06 Nov 1994 08:50:37 GMT", "", At(kRfcExampleUnix - 3600), kOk,
                       kMaxMs, true, false},
        RetryAfterCase{"Sun, 06 Nov 1994 08:50:37 GMT", "Sun, 06 Nov 1994 08:49:37 GMT",
                       At(kRfcExampleUnix - 3600), kOk, 60'000, false, true},
        // The local clock is an hour ahead: without Date the date looks past (0, a tight
        // retry); with Date the minute is kept.
        RetryAfterCase{"Sun, 06 Nov 1994 08:50:37 GMT", "", At(kRfcExampleUnix + 3600), kOk, 0,
                       false, false},
        RetryAfterCase{"Sun, 06 Nov 1994 08:50:37 GMT", "Sun, 06 Nov 1994 08:49:37 GMT",
                       At(kRfcExampleUnix + 3600), kOk, 60'000, false, true},
        // A Date header in an obsolete form works too.
        RetryAfterCase{"Sun, 06 Nov 1994 08:50:37 GMT", "Sun Nov  6 08:49:37 1994",
                       At(kRfcExampleUnix + 3600), kOk, 60'000, false, true},
        RetryAfterCase{"Sun Nov  6 08:50:37 1994", "Sunday, 06-Nov-94 08:49:37 GMT",
                       At(kRfcExampleUnix + 3600), kOk, 60'000, false, true},
        // A Date after the Retry-After date: 0.
        RetryAfterCase{"Sun, 06 Nov 1994 08:50:37 GMT", "Sun, 06 Nov 1994 09:00:00 GMT", kNow,
                       kOk, 0, false, true},
        // A Date header that does not parse is ignored: the local clock decides.
        RetryAfterCase{"Sun, 06 Nov 1994 08:51:37 GMT", "garbage", kNow, kOk, 120'000, false,
                       false},
        RetryAfterCase{"Sun, 06 Nov 1994 08:51:37 GMT", "Sun, 06 Nov 1994 07:00:00 UTC", kNow,
                       kOk, 120'000, false, false}));

TEST(ParseRetryAfterTest, ReportsTheForm) {
  RetryAfter out;
  ASSERT_EQ(ParseRetryAfter("Sunday, 06-Nov-94 08:51:37 GMT", "", kNow, &out), ParseError::kNone);
  EXPECT_EQ(out.form, RetryAfterForm::kRfc850);
  ASSERT_EQ(ParseRetryAfter("Sun Nov  6 08:51:37 1994", "", kNow, &out), ParseError::kNone);
  EXPECT_EQ(out.form, RetryAfterForm::kAsctime);
  ASSERT_EQ(ParseRetryAfter("Sun, 06 Nov 1994 08:51:37 GMT", "", kNow, &out), ParseError::kNone);
  EXPECT_EQ(out.form, RetryAfterForm::kImfFixdate);
  ASSERT_EQ(ParseRetryAfter("3", "", kNow, &out), ParseError::kNone);
  EXPECT_EQ(out.form, RetryAfterForm::kDelaySeconds);
}

TEST(ParseRetryAfterTest, TheCeilingIsConfigurable) {
  RetryAfterOptions options;
  options.max_wait = seconds(10);
  RetryAfter out;
  ASSERT_EQ(ParseRetryAfter("11", "", kNow, &out, options), ParseError::kNone);
  EXPECT_EQ(out.wait, seconds(10));
  EXPECT_TRUE(out.clamped);
  ASSERT_EQ(ParseRetryAfter("10", "", kNow, &out, options), ParseError::kNone);
  EXPECT_EQ(out.wait, seconds(10));
  EXPECT_FALSE(out.clamped);
  options.max_wait = seconds(3600);
  ASSERT_EQ(ParseRetryAfter("Sun, 06 Nov 1994 09:49:37 GMT", "", kNow, &out, options),
            ParseError::kNone);
  EXPECT_EQ(out.wait, seconds(3600));
  EXPECT_FALSE(out.clamped);
  options.max_wait = milliseconds(-1);  // nonsense counts as 0
  ASSERT_EQ(ParseRetryAfter("5", "", kNow, &out, options), ParseError::kNone);
  EXPECT_EQ(out.wait, milliseconds(0));
  EXPECT_TRUE(out.clamped);
}

TEST(ParseErrorNameTest, NamesEveryError) {
  EXPECT_STREQ(ParseErrorName(ParseError::kNone), "ok");
  EXPECT_STREQ(ParseErrorName(ParseError::kEmpty), "empty");
  EXPECT_STREQ(ParseErrorName(ParseError::kMalformed), "malformed");
  EXPECT_STREQ(ParseErrorName(ParseError::kNegative), "negative");
  EXPECT_STREQ(ParseErrorName(ParseError::kOutOfRange), "out of range");
  EXPECT_STREQ(ParseErrorName(ParseError(1)), "unknown parse error");
}

}  // namespace
}  // namespace retryd
