#include "retryd/classify.h"

#include <ostream>

#include <gtest/gtest.h>

namespace retryd {
namespace {

constexpr AttemptClass kOk = AttemptClass::kSuccess;
constexpr AttemptClass kRetry = AttemptClass::kRetryable;
constexpr AttemptClass kStop = AttemptClass::kTerminal;
constexpr BreakerOutcome kSuccess = BreakerOutcome::kSuccess;
constexpr BreakerOutcome kFailure = BreakerOutcome::kFailure;
constexpr BreakerOutcome kIgnored = BreakerOutcome::kIgnored;
constexpr bool kKey = true;
constexpr bool kNoKey = false;

struct Case {
  const char* method;
  int status;
  ErrorKind error;
  bool idempotency_key;
  AttemptClass want_class;
  BreakerOutcome want_breaker;
};

std::ostream& operator<<(std::ostream& os, const Case& c) {
  return os << c.method << " status " << c.status << " error " << ErrorKindName(c.error)
            << (c.idempotency_key ? " with key" : " without key");
}

class DefaultPolicyTest : public ::testing::TestWithParam<Case> {};

TEST_P(DefaultPolicyTest, Classifies) {
  const Case& c = GetParam();
  Classification got =
      ClassificationPolicy::Default().Classify(c.method, c.status, c.error, c.idempotency_key);
  EXPECT_EQ(got.attempt_class, c.want_class)
      << c << ": got " << AttemptClassName(got.attempt_class);
  EXPECT_EQ(got.breaker, c.want_breaker) << c << ": got " << BreakerOutcomeName(got.breaker);
}

constexpr ErrorKind kNone = ErrorKind::kNone;

INSTANTIATE_TEST_SUITE_P(
    Success, DefaultPolicyTest,
    ::testing::Values(Case{"GET", 200, kNone, kNoKey, kOk, kSuccess},
                      Case{"POST", 201, kNone, kNoKey, kOk, kSuccess},
                      Case{"DELETE", 204, kNone, kNoKey, kOk, kSuccess},
                      Case{"GET", 299, kNone, kNoKey, kOk, kSuccess},
                      Case{"GET", 301, kNone, kNoKey, kOk, kSuccess},
                      Case{"GET", 304, kNone, kNoKey, kOk, kSuccess},
                      Case{"PATCH", 399, kNone, kNoKey, kOk, kSuccess}));

INSTANTIATE_TEST_SUITE_P(
    CallersFault, DefaultPolicyTest,
    ::testing::Values(Case{"GET", 400, kNone, kNoKey, kStop, kIgnored},
                      Case{"GET", 401, kNone, kNoKey, kStop, kIgnored},
                      Case{"PUT", 403, kNone, kKey, kStop, kIgnored},
                      Case{"GET", 404, kNone, kNoKey, kStop, kIgnored},
                      Case{"POST", 409, kNone, kKey, kStop, kIgnored},
                      Case{"POST", 422, kNone, kNoKey, kStop, kIgnored},
                      Case{"GET", 451, kNone, kNoKey, kStop, kIgnored},
                      Case{"GET", 499, kNone, kNoKey, kStop, kIgnored},
                      Case{"GET", 501, kNone, kNoKey, kStop, kIgnored},
                      Case{"GET", 505, kNone, kNoKey, kStop, kIgnored},
                      Case{"GET", 101, kNone, kNoKey, kStop, kIgnored}));

INSTANTIATE_TEST_SUITE_P(
    NotProcessed, DefaultPolicyTest,
    ::testing::Values(
        // 408, 425 and 429 prove the request was not processed: retried even for POST.
        Case{"GET", 408, kNone, kNoKey, kRetry, kIgnored},
        Case{"POST", 408, kNone, kNoKey, kRetry, kIgnored},
        Case{"POST", 425, kNone, kNoKey, kRetry, kIgnored},
        Case{"GET", 429, kNone, kNoKey, kRetry, kFailure},
        Case{"POST", 429, kNone, kNoKey, kRetry, kFailure},
        Case{"PATCH", 429, kNone, kNoKey, kRetry, kFailure}));

INSTANTIATE_TEST_SUITE_P(
    ServerErrors, DefaultPolicyTest,
    ::testing::Values(
        Case{"GET", 500, kNone, kNoKey, kRetry, kFailure},
        Case{"HEAD", 502, kNone, kNoKey, kRetry, kFailure},
        Case{"OPTIONS", 503, kNone, kNoKey, kRetry, kFailure},
        Case{"PUT", 504, kNone, kNoKey, kRetry, kFailure},
        Case{"DELETE", 500, kNone, kNoKey, kRetry, kFailure},
        Case{"TRACE", 503, kNone, kNoKey, kRetry, kFailure},
        Case{"GET", 507, kNone, kNoKey, kRetry, kFailure},
        Case{"GET", 599, kNone, kNoKey, kRetry, kFailure},
        // Not safe to repeat: the failure still counts, but the call stops.
        Case{"POST", 500, kNone, kNoKey, kStop, kFailure},
        Case{"POST", 502, kNone, kNoKey, kStop, kFailure},
        Case{"POST", 503, kNone, kNoKey, kStop, kFailure},
        Case{"PATCH", 504, kNone, kNoKey, kStop, kFailure},
        Case{"CONNECT", 503, kNone, kNoKey, kStop, kFailure},
        Case{"PROPFIND", 503, kNone, kNoKey, kStop, kFailure},
        // An idempotency key makes them safe.
        Case{"POST", 500, kNone, kKey, kRetry, kFailure},
        Case{"POST", 503, kNone, kKey, kRetry, kFailure},
        Case{"PATCH", 504, kNone, kKey, kRetry, kFailure}));

INSTANTIATE_TEST_SUITE_P(
    TransportErrors, DefaultPolicyTest,
    ::testing::Values(
        // Never sent: safe for anything.
        Case{"POST", 0, ErrorKind::kDns, kNoKey, kRetry, kFailure},
        Case{"GET", 0, ErrorKind::kDns, kNoKey, kRetry, kFailure},
        Case{"POST", 0, ErrorKind::kConnectRefused, kNoKey, kRetry, kFailure},
        Case{"PATCH", 0, ErrorKind::kConnectRefused, kNoKey, kRetry, kFailure},
        // Ambiguous: a POST that may have been processed fails closed.
        Case{"POST", 0, ErrorKind::kTimeout, kNoKey, kStop, kFailure},
        Case{"POST", 0, ErrorKind::kConnectionReset, kNoKey, kStop, kFailure},
        Case{"POST", 0, ErrorKind::kTls, kNoKey, kStop, kFailure},
        Case{"POST", 0, ErrorKind::kOther, kNoKey, kStop, kFailure},
        Case{"PATCH", 0, ErrorKind::kTimeout, kNoKey, kStop, kFailure},
        Case{"POST", 0, ErrorKind::kTimeout, kKey, kRetry, kFailure},
        Case{"GET", 0, ErrorKind::kTimeout, kNoKey, kRetry, kFailure},
        Case{"PUT", 0, ErrorKind::kConnectionReset, kNoKey, kRetry, kFailure},
        Case{"GET", 0, ErrorKind::kTls, kNoKey, kRetry, kFailure},
        Case{"DELETE", 0, ErrorKind::kOther, kNoKey, kRetry, kFailure},
        // The error wins over a status already received.
        Case{"POST", 200, ErrorKind::kConnectionReset, kNoKey, kStop, kFailure},
        Case{"GET", 200, ErrorKind::kTimeout, kNoKey, kRetry, kFailure}));

INSTANTIATE_TEST_SUITE_P(
    OddInputs, DefaultPolicyTest,
    ::testing::Values(
        // No response and no error, or an impossible status: treated as kOther.
        Case{"GET", 0, kNone, kNoKey, kRetry, kFailure},
        Case{"POST", 0, kNone, kNoKey, kStop, kFailure},
        Case{"GET", 99, kNone, kNoKey, kRetry, kFailure},
        Case{"POST", 600, kNone, kNoKey, kStop, kFailure},
        Case{"GET", -1, kNone, kNoKey, kRetry, kFailure},
        // Methods are case-sensitive: "get" is not GET, so it is not safe to repeat.
        Case{"get", 503, kNone, kNoKey, kStop, kFailure},
        Case{"", 503, kNone, kNoKey, kStop, kFailure},
        // An error kind outside the enum is kOther.
        Case{"POST", 0, ErrorKind(99), kNoKey, kStop, kFailure}));

TEST(ClassificationPolicyTest, DefaultIdempotentMethods) {
  const ClassificationPolicy& p = ClassificationPolicy::Default();
  for (const char* m : {"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"}) {
    EXPECT_TRUE(p.IsIdempotent(m)) << m;
  }
  for (const char* m : {"POST", "PATCH", "CONNECT", "get", "", "GETX"}) {
    EXPECT_FALSE(p.IsIdempotent(m)) << m;
  }
}

TEST(ClassificationPolicyTest, SetStatusOverridesOneCode) {
  ClassificationPolicy p;
  // A service whose 404 means "not replicated yet": retry, without blaming it.
  ASSERT_TRUE(p.SetStatus(404, {kRetry, kIgnored, false}));
  EXPECT_EQ(p.Classify("GET", 404, kNone, kNoKey).attempt_class, kRetry);
  EXPECT_EQ(p.Classify("GET", 404, kNone, kNoKey).breaker, kIgnored);
  EXPECT_EQ(p.Classify("POST", 404, kNone, kNoKey).attempt_class, kStop);
  EXPECT_EQ(p.Classify("GET", 403, kNone, kNoKey).attempt_class, kStop);  // neighbours unchanged
  // 503 from this service's load balancer proves nothing was processed.
  ASSERT_TRUE(p.SetStatus(503, {kRetry, kFailure, true}));
  EXPECT_EQ(p.Classify("POST", 503, kNone, kNoKey).attempt_class, kRetry);
  // 429 as not the dependency's health.
  ASSERT_TRUE(p.SetStatus(429, {kRetry, kIgnored, true}));
  EXPECT_EQ(p.Classify("GET", 429, kNone, kNoKey).breaker, kIgnored);
  // The shared default is untouched.
  EXPECT_EQ(ClassificationPolicy::Default().Classify("GET", 404, kNone, kNoKey).attempt_class,
            kStop);
  EXPECT_EQ(p.StatusRule(503).retry_unsafe, true);
  EXPECT_EQ(ClassificationPolicy::Default().StatusRule(503).retry_unsafe, false);
}

TEST(ClassificationPolicyTest, SetStatusRejectsCodesOutOfRange) {
  ClassificationPolicy p;
  for (int code : {-1, 0, 99, 600, 1000}) {
    EXPECT_FALSE(p.SetStatus(code, {kOk, kSuccess, false})) << code;
  }
  EXPECT_TRUE(p.SetStatus(100, {kOk, kSuccess, false}));
  EXPECT_TRUE(p.SetStatus(599, {kOk, kSuccess, false}));
  // 0 still means "no response".
  EXPECT_EQ(p.Classify("GET", 0, kNone, kNoKey).attempt_class, kRetry);
}

TEST(ClassificationPolicyTest, SetStatusClassKeepsCodesWithTheirOwnRule) {
  ClassificationPolicy p;
  ASSERT_TRUE(p.SetStatusClass(5, {kStop, kFailure, false}));  // never retry a 5xx...
  EXPECT_EQ(p.Classify("GET", 500, kNone, kNoKey).attempt_class, kStop);
  EXPECT_EQ(p.Classify("GET", 503, kNone, kNoKey).attempt_class, kStop);
  EXPECT_EQ(p.Classify("GET", 501, kNone, kNoKey).breaker, kIgnored);  // ...501 keeps its rule
  ASSERT_TRUE(p.SetStatus(503, {kRetry, kFailure, false}));  // ...except 503
  EXPECT_EQ(p.Classify("GET", 503, kNone, kNoKey).attempt_class, kRetry);
  ASSERT_TRUE(p.SetStatusClass(4, {kStop, kFailure, false}));  // every 4xx counts
  EXPECT_EQ(p.Classify("GET", 404, kNone, kNoKey).breaker, kFailure);
  EXPECT_EQ(p.Classify("GET", 408, kNone, kNoKey).breaker, kIgnored);  // 408 keeps its rule
  EXPECT_FALSE(p.SetStatusClass(0, {kOk, kSuccess, false}));
  EXPECT_FALSE(p.SetStatusClass(6, {kOk, kSuccess, false}));
}

TEST(ClassificationPolicyTest, SetErrorOverridesOneKind) {
  ClassificationPolicy p;
  // A TLS failure here is always a handshake failure, before anything was sent.
  ASSERT_TRUE(p.SetError(ErrorKind::kTls, {kRetry, kFailure, true}));
  EXPECT_EQ(p.Classify("POST", 0, ErrorKind::kTls, kNoKey).attempt_class, kRetry);
  EXPECT_EQ(p.Classify("POST", 0, ErrorKind::kTimeout, kNoKey).attempt_class, kStop);
  // DNS failures are configuration, not transient: stop, and do not blame the dependency.
  ASSERT_TRUE(p.SetError(ErrorKind::kDns, {kStop, kIgnored, false}));
  Classification c = p.Classify("GET", 0, ErrorKind::kDns, kNoKey);
  EXPECT_EQ(c.attempt_class, kStop);
  EXPECT_EQ(c.breaker, kIgnored);
  EXPECT_FALSE(p.SetError(ErrorKind::kNone, {kOk, kSuccess, false}));
  EXPECT_FALSE(p.SetError(ErrorKind(7), {kOk, kSuccess, false}));
  EXPECT_FALSE(p.SetError(ErrorKind(-1), {kOk, kSuccess, false}));
}

TEST(ClassificationPolicyTest, SetIdempotentChangesTheMethodSet) {
  ClassificationPolicy p;
  // A POST endpoint that upserts by a business key.
  p.SetIdempotent("POST", true);
  EXPECT_EQ(p.Classify("POST", 0, ErrorKind::kTimeout, kNoKey).attempt_class, kRetry);
  p.SetIdempotent("POST", true);  // adding twice is harmless
  p.SetIdempotent("POST", false);
  EXPECT_EQ(p.Classify("POST", 0, ErrorKind::kTimeout, kNoKey).attempt_class, kStop);
  // A DELETE with side effects (it emails someone).
  p.SetIdempotent("DELETE", false);
  EXPECT_EQ(p.Classify("DELETE", 503, kNone, kNoKey).attempt_class, kStop);
  EXPECT_EQ(p.Classify("DELETE", 503, kNone, kKey).attempt_class, kRetry);
  p.SetIdempotent("PROPFIND", true);
  EXPECT_TRUE(p.IsIdempotent("PROPFIND"));
  p.SetIdempotent("NOSUCH", false);  // removing an absent one is harmless
  EXPECT_TRUE(p.IsIdempotent("GET"));
}

TEST(ClassificationPolicyTest, SuccessAndTerminalRulesIgnoreIdempotency) {
  ClassificationPolicy p;
  ASSERT_TRUE(p.SetStatus(418, {kOk, kSuccess, false}));
  EXPECT_EQ(p.Classify("POST", 418, kNone, kNoKey).attempt_class, kOk);
  EXPECT_EQ(p.Classify("GET", 400, kNone, kKey).attempt_class, kStop);
}

TEST(ClassifyNamesTest, NameEveryValue) {
  EXPECT_STREQ(AttemptClassName(kOk), "success");
  EXPECT_STREQ(AttemptClassName(kRetry), "retryable");
  EXPECT_STREQ(AttemptClassName(kStop), "terminal");
  EXPECT_STREQ(BreakerOutcomeName(kSuccess), "success");
  EXPECT_STREQ(BreakerOutcomeName(kFailure), "failure");
  EXPECT_STREQ(BreakerOutcomeName(kIgnored), "ignored");
  EXPECT_STREQ(ErrorKindName(ErrorKind::kConnectRefused), "connect_refused");
  EXPECT_STREQ(ErrorKindName(ErrorKind::kConnectionReset), "connection_reset");
  EXPECT_STREQ(ErrorKindName(ErrorKind(42)), "unknown");
}

}  // namespace
}  // namespace retryd
