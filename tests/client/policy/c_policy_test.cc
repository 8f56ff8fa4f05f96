// The C ABI of the retry-policy toolkit, called as a binding would call it: result codes,
// outputs left alone on failure, NULL handling, and agreement with the C++ functions.
#include "retryd/retryd_policy.h"

#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>

#include <gtest/gtest.h>

#include "retryd/backoff.h"
#include "retryd/classify.h"
#include "retryd/client.h"
#include "retryd/retryd.h"

extern "C" int retryd_policy_test_from_c(void);

namespace {

// A classification's breaker outcome is passed straight to the client's completion call.
static_assert(RETRYD_BREAKER_OUTCOME_SUCCESS == RETRYD_SUCCESS);
static_assert(RETRYD_BREAKER_OUTCOME_FAILURE == RETRYD_FAILURE);
static_assert(RETRYD_BREAKER_OUTCOME_IGNORED == RETRYD_IGNORED);
static_assert(int(retryd::BreakerOutcome::kSuccess) == int(retryd::Outcome::kSuccess));
static_assert(int(retryd::BreakerOutcome::kFailure) == int(retryd::Outcome::kFailure));
static_assert(int(retryd::BreakerOutcome::kIgnored) == int(retryd::Outcome::kIgnored));

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kSentinel = -4242;
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
// Sun, 06 Nov 1994 08:49:37 GMT in Unix milliseconds.
constexpr int64_t kNowUnixMs = 784'111'777'000;

TEST(CPolicyTest, AWholeRetryDecisionFromC) { EXPECT_EQ(retryd_policy_test_from_c(), 0); }

TEST(CPolicyTest, StrerrorNamesEveryCode) {
  for (int code : {RETRYD_POLICY_OK, RETRYD_POLICY_EINVAL, RETRYD_POLICY_ENOMEM,
                   RETRYD_POLICY_ENOSPC, RETRYD_POLICY_EEMPTY, RETRYD_POLICY_EMALFORMED,
                   RETRYD_POLICY_ENEGATIVE, RETRYD_POLICY_ERANGE}) {
    const char* s = retryd_policy_strerror(code);
    ASSERT_NE(s, nullptr);
    EXPECT_STRNE(s, "unknown retryd policy error") << code;
  }
  EXPECT_STREQ(retryd_policy_strerror(12345), "unknown retryd policy error");
  EXPECT_STREQ(retryd_policy_strerror(RETRYD_POLICY_EMALFORMED), "malformed header value");
}

TEST(CPolicyTest, BackoffMatchesTheCppFunction) {
  std::mt19937_64 rng(11);
  for (int jitter = RETRYD_JITTER_NONE; jitter <= RETRYD_JITTER_DECORRELATED; ++jitter) {
    for (uint32_t attempt : {0u, 1u, 5u, 63u, 10'000u, std::numeric_limits<uint32_t>::max()}) {
      uint64_t r = rng();
      int64_t wait_ns = kSentinel;
      ASSERT_EQ(retryd_backoff_ns(jitter, 100 * kMs, 10'000 * kMs, attempt, 250 * kMs, r,
                                  &wait_ns),
                RETRYD_POLICY_OK);
      EXPECT_EQ(wait_ns, retryd::BackoffWait(retryd::Jitter(jitter),
                                             std::chrono::milliseconds(100),
                                             std::chrono::seconds(10), attempt,
                                             std::chrono::milliseconds(250), r)
                             .count());
      EXPECT_GE(wait_ns, 0);
      EXPECT_LE(wait_ns, 10'000 * kMs);
    }
  }
  int64_t wait_ns = kSentinel;
  ASSERT_EQ(retryd_backoff_ns(RETRYD_JITTER_FULL, 1, kInt64Max,
                              std::numeric_limits<uint32_t>::max(), 0, ~uint64_t(0), &wait_ns),
            RETRYD_POLICY_OK);
  EXPECT_EQ(wait_ns, kInt64Max);
}

TEST(CPolicyTest, BackoffRejectsBadArguments) {
  int64_t wait_ns = kSentinel;
  EXPECT_EQ(retryd_backoff_ns(4, kMs, kMs, 0, 0, 0, &wait_ns), RETRYD_POLICY_EINVAL);
  EXPECT_EQ(retryd_backoff_ns(-1, kMs, kMs, 0, 0, 0, &wait_ns), RETRYD_POLICY_EINVAL);
  EXPECT_EQ(retryd_backoff_ns(RETRYD_JITTER_FULL, -1, kMs, 0, 0, 0, &wait_ns),
            RETRYD_POLICY_EINVAL);
  EXPECT_EQ(retryd_backoff_ns(RETRYD_JITTER_FULL, kMs, -1, 0, 0, 0, &wait_ns),
            RETRYD_POLICY_EINVAL);
  EXPECT_EQ(retryd_backoff_ns(RETRYD_JITTER_DECORRELATED, kMs, kMs, 0, -1, 0, &wait_ns),
            RETRYD_POLICY_EINVAL);
  EXPECT_EQ(wait_ns, kSentinel);
  EXPECT_EQ(retryd_backoff_ns(RETRYD_JITTER_FULL, kMs, kMs, 0, 0, 0, nullptr),
            RETRYD_POLICY_EINVAL);
}

TEST(CPolicyTest, MergeWait) {
  int64_t wait_ns = kSentinel;
  // No Retry-After (negative): the backoff.
  ASSERT_EQ(retryd_merge_wait_ns(300 * kMs, -1, 100 * kMs, ~uint64_t(0), &wait_ns),
            RETRYD_POLICY_OK);
  EXPECT_EQ(wait_ns, 300 * kMs);
  // Retry-After 0: never 0 with a nonzero random value.
  ASSERT_EQ(retryd_merge_wait_ns(0, 0, 100 * kMs, ~uint64_t(0), &wait_ns), RETRYD_POLICY_OK);
  EXPECT_EQ(wait_ns, 100 * kMs);
  ASSERT_EQ(retryd_merge_wait_ns(0, 5'000 * kMs, 100 * kMs, 0, &wait_ns), RETRYD_POLICY_OK);
  EXPECT_EQ(wait_ns, 5'000 * kMs);
  wait_ns = kSentinel;
  EXPECT_EQ(retryd_merge_wait_ns(-1, 0, 0, 0, &wait_ns), RETRYD_POLICY_EINVAL);
  EXPECT_EQ(retryd_merge_wait_ns(0, 0, -1, 0, &wait_ns), RETRYD_POLICY_EINVAL);
  EXPECT_EQ(retryd_merge_wait_ns(0, 0, 0, 0, nullptr), RETRYD_POLICY_EINVAL);
  EXPECT_EQ(wait_ns, kSentinel);
}

TEST(CPolicyTest, RandomVaries) {
  uint64_t a = retryd_random(), b = retryd_random(), c = retryd_random();
  EXPECT_FALSE(a == b && b == c);
}

TEST(CPolicyTest, ParseRetryAfter) {
  struct Case {
    const char* value;
    const char* date;
    int64_t max_wait_ms;
    int want_rc;
    int64_t want_ms;
  };
  const Case cases[] = {
      {"120", nullptr, RETRYD_RETRY_AFTER_DEFAULT_MAX_WAIT_MS, RETRYD_POLICY_OK, 120'000},
      {"120", nullptr, 60'000, RETRYD_POLICY_OK, 60'000},
      {"0", nullptr, RETRYD_RETRY_AFTER_DEFAULT_MAX_WAIT_MS, RETRYD_POLICY_OK, 0},
      {"Sun, 06 Nov 1994 08:51:37 GMT", nullptr, RETRYD_RETRY_AFTER_DEFAULT_MAX_WAIT_MS,
       RETRYD_POLICY_OK, 120'000},
      {"Sun, 06 Nov 1994 08:51:37 GMT", "Sun, 06 Nov 1994 08:51:00 GMT",
       RETRYD_RETRY_AFTER_DEFAULT_MAX_WAIT_MS, RETRYD_POLICY_OK, 37'000},
      {"Sun, 06 Nov 1994 08:51:37 GMT", "", RETRYD_RETRY_AFTER_DEFAULT_MAX_WAIT_MS,
       RETRYD_POLICY_OK, 120'000},
      {"Sun, 06 Nov 1994 08:00:00 GMT", nullptr, RETRYD_RETRY_AFTER_DEFAULT_MAX_WAIT_MS,
       RETRYD_POLICY_OK, 0},
      {"", nullptr, 1000, RETRYD_POLICY_EEMPTY, 0},
      {"-3", nullptr, 1000, RETRYD_POLICY_ENEGATIVE, 0},
      {"3s", nullptr, 1000, RETRYD_POLICY_EMALFORMED, 0},
      {"Sun, 06 Nov 1994", nullptr, 1000, RETRYD_POLICY_EMALFORMED, 0},
      {"100000000000000000000", nullptr, 1000, RETRYD_POLICY_ERANGE, 0},
      {"5", nullptr, -1, RETRYD_POLICY_EINVAL, 0},
  };
  for (const Case& c : cases) {
    int64_t wait_ms = kSentinel;
    EXPECT_EQ(retryd_parse_retry_after(c.value, c.date, kNowUnixMs, c.max_wait_ms, &wait_ms),
              c.want_rc)
        << c.value;
    EXPECT_EQ(wait_ms, c.want_rc == RETRYD_POLICY_OK ? c.want_ms : kSentinel) << c.value;
  }
  int64_t wait_ms = kSentinel;
  EXPECT_EQ(retryd_parse_retry_after(nullptr, nullptr, kNowUnixMs, 1000, &wait_ms),
            RETRYD_POLICY_EINVAL);
  EXPECT_EQ(retryd_parse_retry_after("5", nullptr, kNowUnixMs, 1000, nullptr),
            RETRYD_POLICY_EINVAL);
}

TEST(CPolicyTest, ParseHttpDate) {
  int64_t unix_seconds = kSentinel;
  ASSERT_EQ(retryd_parse_http_date("Sunday, 06-Nov-94 08:49:37 GMT", kNowUnixMs, &unix_seconds),
            RETRYD_POLICY_OK);
  EXPECT_EQ(unix_seconds, 784'111'777);
  unix_seconds = kSentinel;
  EXPECT_EQ(retryd_parse_http_date("06 Nov 1994", kNowUnixMs, &unix_seconds),
            RETRYD_POLICY_EMALFORMED);
  EXPECT_EQ(retryd_parse_http_date("", kNowUnixMs, &unix_seconds), RETRYD_POLICY_EEMPTY);
  EXPECT_EQ(retryd_parse_http_date(nullptr, kNowUnixMs, &unix_seconds), RETRYD_POLICY_EINVAL);
  EXPECT_EQ(retryd_parse_http_date("Sun Nov  6 08:49:37 1994", kNowUnixMs, nullptr),
            RETRYD_POLICY_EINVAL);
  EXPECT_EQ(unix_seconds, kSentinel);
}

TEST(CPolicyTest, ClassifyMatchesTheDefaultPolicy) {
  const char* methods[] = {"GET", "HEAD", "PUT", "DELETE", "POST", "PATCH", "BREW"};
  const int statuses[] = {0, 200, 304, 400, 404, 408, 425, 429, 500, 501, 502, 503, 504, 599};
  for (const char* method : methods) {
    for (int status : statuses) {
      for (int error = RETRYD_ERROR_NONE; error <= RETRYD_ERROR_OTHER; ++error) {
        for (int key : {0, 1}) {
          int attempt_class = -1, breaker_outcome = -1;
          ASSERT_EQ(retryd_classify(method, status, error, key, &attempt_class,
                                    &breaker_outcome),
                    RETRYD_POLICY_OK);
          retryd::Classification want = retryd::ClassificationPolicy::Default().Classify(
              method, status, retryd::ErrorKind(error), key != 0);
          EXPECT_EQ(attempt_class, int(want.attempt_class)) << method << " " << status;
          EXPECT_EQ(breaker_outcome, int(want.breaker)) << method << " " << status;
        }
      }
    }
  }
}

TEST(CPolicyTest, ClassifyTheSeedCases) {
  struct Case {
    const char* method;
    int status;
    int error;
    int key;
    int want_class;
    int want_breaker;
  };
  const Case cases[] = {
      {"GET", 503, RETRYD_ERROR_NONE, 0, RETRYD_ATTEMPT_RETRYABLE, RETRYD_BREAKER_OUTCOME_FAILURE},
      {"POST", 0, RETRYD_ERROR_TIMEOUT, 0, RETRYD_ATTEMPT_TERMINAL,
       RETRYD_BREAKER_OUTCOME_FAILURE},
      {"POST", 0, RETRYD_ERROR_TIMEOUT, 1, RETRYD_ATTEMPT_RETRYABLE,
       RETRYD_BREAKER_OUTCOME_FAILURE},
      {"POST", 0, RETRYD_ERROR_CONNECT_REFUSED, 0, RETRYD_ATTEMPT_RETRYABLE,
       RETRYD_BREAKER_OUTCOME_FAILURE},
      {"GET", 401, RETRYD_ERROR_NONE, 0, RETRYD_ATTEMPT_TERMINAL, RETRYD_BREAKER_OUTCOME_IGNORED},
      {"POST", 429, RETRYD_ERROR_NONE, 0, RETRYD_ATTEMPT_RETRYABLE,
       RETRYD_BREAKER_OUTCOME_FAILURE},
      {"GET", 200, RETRYD_ERROR_NONE, 0, RETRYD_ATTEMPT_SUCCESS, RETRYD_BREAKER_OUTCOME_SUCCESS},
  };
  for (const Case& c : cases) {
    int attempt_class = -1, breaker_outcome = -1;
    ASSERT_EQ(retryd_classify(c.method, c.status, c.error, c.key, &attempt_class,
                              &breaker_outcome),
              RETRYD_POLICY_OK);
    EXPECT_EQ(attempt_class, c.want_class) << c.method << " " << c.status;
    EXPECT_EQ(breaker_outcome, c.want_breaker) << c.method << " " << c.status;
  }
}

TEST(CPolicyTest, ClassifyRejectsBadArguments) {
  int attempt_class = -1, breaker_outcome = -1;
  EXPECT_EQ(retryd_classify(nullptr, 200, 0, 0, &attempt_class, &breaker_outcome),
            RETRYD_POLICY_EINVAL);
  EXPECT_EQ(retryd_classify("GET", -1, 0, 0, &attempt_class, &breaker_outcome),
            RETRYD_POLICY_EINVAL);
  EXPECT_EQ(retryd_classify("GET", 1000, 0, 0, &attempt_class, &breaker_outcome),
            RETRYD_POLICY_EINVAL);
  EXPECT_EQ(retryd_classify("GET", 200, 7, 0, &attempt_class, &breaker_outcome),
            RETRYD_POLICY_EINVAL);
  EXPECT_EQ(retryd_classify("GET", 200, -1, 0, &attempt_class, &breaker_outcome),
            RETRYD_POLICY_EINVAL);
  EXPECT_EQ(retryd_classify("GET", 200, 0, 0, nullptr, &breaker_outcome), RETRYD_POLICY_EINVAL);
  EXPECT_EQ(retryd_classify("GET", 200, 0, 0, &attempt_class, nullptr), RETRYD_POLICY_EINVAL);
  EXPECT_EQ(attempt_class, -1);
  EXPECT_EQ(breaker_outcome, -1);
  // 600..999 are accepted and treated as an ambiguous error.
  ASSERT_EQ(retryd_classify("POST", 999, 0, 0, &attempt_class, &breaker_outcome),
            RETRYD_POLICY_OK);
  EXPECT_EQ(attempt_class, RETRYD_ATTEMPT_TERMINAL);
}

TEST(CPolicyTest, ClassifierOverrides) {
  retryd_classifier* c = retryd_classifier_new();
  ASSERT_NE(c, nullptr);
  int attempt_class = -1, breaker_outcome = -1;
  // Defaults first.
  ASSERT_EQ(retryd_classifier_classify(c, "POST", 503, 0, 0, &attempt_class, &breaker_outcome),
            RETRYD_POLICY_OK);
  EXPECT_EQ(attempt_class, RETRYD_ATTEMPT_TERMINAL);
  // This service's 503 comes from its load balancer: nothing was processed.
  ASSERT_EQ(retryd_classifier_set_status(c, 503, RETRYD_ATTEMPT_RETRYABLE,
                                         RETRYD_BREAKER_OUTCOME_FAILURE, 1),
            RETRYD_POLICY_OK);
  ASSERT_EQ(retryd_classifier_classify(c, "POST", 503, 0, 0, &attempt_class, &breaker_outcome),
            RETRYD_POLICY_OK);
  EXPECT_EQ(attempt_class, RETRYD_ATTEMPT_RETRYABLE);
  EXPECT_EQ(breaker_outcome, RETRYD_BREAKER_OUTCOME_FAILURE);
  // DNS failures stop at once and do not count.
  ASSERT_EQ(retryd_classifier_set_error(c, RETRYD_ERROR_DNS, RETRYD_ATTEMPT_TERMINAL,
                                        RETRYD_BREAKER_OUTCOME_IGNORED, 0),
            RETRYD_POLICY_OK);
  ASSERT_EQ(retryd_classifier_classify(c, "GET", 0, RETRYD_ERROR_DNS, 0, &attempt_class,
                                       &breaker_outcome),
            RETRYD_POLICY_OK);
  EXPECT_EQ(attempt_class, RETRYD_ATTEMPT_TERMINAL);
  EXPECT_EQ(breaker_outcome, RETRYD_BREAKER_OUTCOME_IGNORED);
  // POST made idempotent.
  ASSERT_EQ(retryd_classifier_set_idempotent(c, "POST", 1), RETRYD_POLICY_OK);
  ASSERT_EQ(retryd_classifier_classify(c, "POST", 0, RETRYD_ERROR_TIMEOUT, 0, &attempt_class,
                                       &breaker_outcome),
            RETRYD_POLICY_OK);
  EXPECT_EQ(attempt_class, RETRYD_ATTEMPT_RETRYABLE);
  // The default policy is unaffected.
  ASSERT_EQ(retryd_classify("POST", 503, 0, 0, &attempt_class, &breaker_outcome),
            RETRYD_POLICY_OK);
  EXPECT_EQ(attempt_class, RETRYD_ATTEMPT_TERMINAL);
  // Bad arguments.
  EXPECT_EQ(retryd_classifier_set_status(c, 600, 0, 0, 0), RETRYD_POLICY_EINVAL);
  EXPECT_EQ(retryd_classifier_set_status(c, 500, 3, 0, 0), RETRYD_POLICY_EINVAL);
  EXPECT_EQ(retryd_classifier_set_status(c, 500, 0, 3, 0), RETRYD_POLICY_EINVAL);
  EXPECT_EQ(retryd_classifier_set_status(nullptr, 500, 0, 0, 0), RETRYD_POLICY_EINVAL);
  EXPECT_EQ(retryd_classifier_set_error(c, RETRYD_ERROR_NONE, 0, 0, 0), RETRYD_POLICY_EINVAL);
  EXPECT_EQ(retryd_classifier_set_error(c, 7, 0, 0, 0), RETRYD_POLICY_EINVAL);
  EXPECT_EQ(retryd_classifier_set_error(nullptr, 1, 0, 0, 0), RETRYD_POLICY_EINVAL);
  EXPECT_EQ(retryd_classifier_set_idempotent(c, nullptr, 1), RETRYD_POLICY_EINVAL);
  EXPECT_EQ(retryd_classifier_set_idempotent(nullptr, "GET", 1), RETRYD_POLICY_EINVAL);
  EXPECT_EQ(retryd_classifier_classify(nullptr, "GET", 200, 0, 0, &attempt_class,
                                       &breaker_outcome),
            RETRYD_POLICY_EINVAL);
  EXPECT_EQ(retryd_classifier_classify(c, "GET", 1000, 0, 0, &attempt_class, &breaker_outcome),
            RETRYD_POLICY_EINVAL);
  retryd_classifier_free(c);
  retryd_classifier_free(nullptr);
}

TEST(CPolicyTest, DeadlineWithTimeAsAParameter) {
  retryd_deadline d;
  ASSERT_EQ(retryd_deadline_start(&d, 2'000 * kMs, 10'000 * kMs), RETRYD_POLICY_OK);
  EXPECT_EQ(retryd_deadline_remaining_ns(&d, 10'000 * kMs), 2'000 * kMs);
  EXPECT_EQ(retryd_deadline_remaining_ns(&d, 11'500 * kMs), 500 * kMs);
  EXPECT_EQ(retryd_deadline_remaining_ns(&d, 9'000 * kMs), 2'000 * kMs);  // clock went back
  EXPECT_EQ(retryd_deadline_expired(&d, 11'999 * kMs), 0);
  EXPECT_EQ(retryd_deadline_expired(&d, 12'000 * kMs), 1);
  EXPECT_EQ(retryd_deadline_can_finish(&d, 11'500 * kMs, 500 * kMs), 1);
  EXPECT_EQ(retryd_deadline_can_finish(&d, 11'500 * kMs, 500 * kMs + 1), 0);
  EXPECT_EQ(retryd_deadline_can_finish(&d, 12'000 * kMs, 0), 0);
  // Infinite.
  ASSERT_EQ(retryd_deadline_start(&d, kInt64Max, 0), RETRYD_POLICY_OK);
  EXPECT_EQ(retryd_deadline_remaining_ns(&d, kInt64Max), kInt64Max);
  EXPECT_EQ(retryd_deadline_expired(&d, kInt64Max), 0);
  // Bad arguments.
  EXPECT_EQ(retryd_deadline_start(nullptr, 1, 0), RETRYD_POLICY_EINVAL);
  EXPECT_EQ(retryd_deadline_start(&d, -1, 0), RETRYD_POLICY_EINVAL);
  EXPECT_EQ(retryd_deadline_remaining_ns(nullptr, 0), 0);
  EXPECT_EQ(retryd_deadline_expired(nullptr, 0), 1);
  EXPECT_EQ(retryd_deadline_can_finish(nullptr, 0, 0), 0);
  // A corrupt struct (negative budget) is expired, not UB.
  retryd_deadline corrupt = {0, -5};
  EXPECT_EQ(retryd_deadline_expired(&corrupt, 0), 1);
}

TEST(CPolicyTest, MonotonicClockMovesForward) {
  int64_t a = retryd_monotonic_now_ns();
  int64_t b = retryd_monotonic_now_ns();
  EXPECT_GT(a, 0);
  EXPECT_GE(b, a);
}

TEST(CPolicyTest, DeadlineHeader) {
  char buf[RETRYD_DEADLINE_HEADER_BUFSIZE];
  EXPECT_EQ(retryd_format_deadline_header(1'500 * kMs, buf, sizeof(buf)), 5);
  EXPECT_STREQ(buf, "1500m");
  EXPECT_EQ(retryd_format_deadline_header(99'999'999, buf, sizeof(buf)), 9);
  EXPECT_STREQ(buf, "99999999n");
  EXPECT_EQ(retryd_format_deadline_header(-1, buf, sizeof(buf)), 2);
  EXPECT_STREQ(buf, "0n");
  // Too small: nothing written.
  char small[5];
  std::memset(small, 'x', sizeof(small));
  EXPECT_EQ(retryd_format_deadline_header(1'500 * kMs, small, sizeof(small)),
            RETRYD_POLICY_ENOSPC);
  EXPECT_EQ(std::string(small, sizeof(small)), "xxxxx");
  char exact[6];
  EXPECT_EQ(retryd_format_deadline_header(1'500 * kMs, exact, sizeof(exact)), 5);
  EXPECT_STREQ(exact, "1500m");
  EXPECT_EQ(retryd_format_deadline_header(1, nullptr, 10), RETRYD_POLICY_EINVAL);

  int64_t timeout_ns = kSentinel;
  ASSERT_EQ(retryd_parse_deadline_header("1500m", &timeout_ns), RETRYD_POLICY_OK);
  EXPECT_EQ(timeout_ns, 1'500 * kMs);
  ASSERT_EQ(retryd_parse_deadline_header("99999999H", &timeout_ns), RETRYD_POLICY_OK);
  EXPECT_EQ(timeout_ns, kInt64Max);
  timeout_ns = kSentinel;
  EXPECT_EQ(retryd_parse_deadline_header("", &timeout_ns), RETRYD_POLICY_EEMPTY);
  EXPECT_EQ(retryd_parse_deadline_header("-5m", &timeout_ns), RETRYD_POLICY_ENEGATIVE);
  EXPECT_EQ(retryd_parse_deadline_header("5 m", &timeout_ns), RETRYD_POLICY_EMALFORMED);
  EXPECT_EQ(retryd_parse_deadline_header("123456789m", &timeout_ns), RETRYD_POLICY_EMALFORMED);
  EXPECT_EQ(retryd_parse_deadline_header(nullptr, &timeout_ns), RETRYD_POLICY_EINVAL);
  EXPECT_EQ(retryd_parse_deadline_header("5m", nullptr), RETRYD_POLICY_EINVAL);
  EXPECT_EQ(timeout_ns, kSentinel);
}

}  // namespace
