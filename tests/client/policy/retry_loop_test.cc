// The toolkit's pieces composed into the retry loop a client runs, under virtual time: a
// scripted downstream, a fake monotonic clock, injected randomness. Checks the properties the
// seeds ask for: Retry-After is honoured, a POST that timed out fails closed, and the loop
// never overruns its deadline.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "retryd/backoff.h"
#include "retryd/classify.h"
#include "retryd/deadline.h"
#include "retryd/retry_after.h"

namespace retryd {
namespace {

using std::chrono::milliseconds;
using std::chrono::nanoseconds;
using std::chrono::seconds;
using std::chrono::system_clock;

class FakeClock final : public Clock {
 public:
  nanoseconds Now() const override { return now_; }
  void Advance(nanoseconds d) { now_ += d; }

 private:
  nanoseconds now_{seconds(1000)};
};

struct Response {
  Response(int status_code = 200, ErrorKind error_kind = ErrorKind::kNone,
           std::string retry_after_value = "", nanoseconds duration = milliseconds(10))
      : status(status_code),
        error(error_kind),
        retry_after(std::move(retry_after_value)),
        takes(duration) {}
  int status;
  ErrorKind error;
  std::string retry_after;
  nanoseconds takes;  // how long the attempt runs unless its timeout cuts it short
};

enum class Ending { kSuccess, kTerminal, kAttemptsExhausted, kDeadline };

struct Result {
  Ending ending = Ending::kTerminal;
  int attempts = 0;
  std::vector<nanoseconds> waits;
};

struct LoopOptions {
  std::string method = "GET";
  bool idempotency_key = false;
  int max_attempts = 4;
  nanoseconds attempt_timeout = seconds(1);
  nanoseconds budget = seconds(10);
};

// The loop retryd::Call runs, minus admission: attempt, classify, parse Retry-After, merge,
// check the deadline, sleep.
Result RunLoop(const LoopOptions& o, const std::vector<Response>& script, FakeClock& clock,
               Backoff& backoff) {
  const system_clock::time_point wall = system_clock::time_point(seconds(784'111'777));
  Deadline deadline(o.budget, clock);
  Result result;
  for (uint32_t retries = 0;; ++retries) {
    const Response& r = script[std::min<size_t>(result.attempts, script.size() - 1)];
    ++result.attempts;
    nanoseconds timeout = deadline.Clamp(o.attempt_timeout);
    bool timed_out = r.takes > timeout;
    clock.Advance(timed_out ? timeout : r.takes);
    Classification c = ClassificationPolicy::Default().Classify(
        o.method, timed_out ? 0 : r.status, timed_out ? ErrorKind::kTimeout : r.error,
        o.idempotency_key);
    if (c.attempt_class == AttemptClass::kSuccess) {
      result.ending = Ending::kSuccess;
      return result;
    }
    if (c.attempt_class == AttemptClass::kTerminal) {
      result.ending = Ending::kTerminal;
      return result;
    }
    if (result.attempts >= o.max_attempts) {
      result.ending = Ending::kAttemptsExhausted;
      return result;
    }
    std::optional<nanoseconds> retry_after;
    RetryAfter parsed;
    if (!timed_out && ParseRetryAfter(r.retry_after, "", wall, &parsed) == ParseError::kNone) {
      retry_after = parsed.wait;
    }
    nanoseconds wait = backoff.Next(retries, retry_after);
    // Give up now rather than sleep into an attempt that cannot finish; expect the attempt to
    // need at least a tenth of its timeout.
    if (!deadline.CanFinish(wait + o.attempt_timeout / 10)) {
      result.ending = Ending::kDeadline;
      return result;
    }
    result.waits.push_back(wait);
    clock.Advance(wait);
  }
}

// Full jitter at the top of its range: waits are exactly base * 2^retries (capped).
Backoff TopOfRangeBackoff() {
  BackoffOptions options;
  options.base = milliseconds(100);
  options.cap = seconds(2);
  return Backoff(options, [] { return std::numeric_limits<uint64_t>::max(); });
}

TEST(RetryLoopTest, GetRecoversAfterTwoServerErrors) {
  FakeClock clock;
  Backoff backoff = TopOfRangeBackoff();
  nanoseconds start = clock.Now();
  Result r = RunLoop({}, {{503}, {502}, {200}}, clock, backoff);
  EXPECT_EQ(r.ending, Ending::kSuccess);
  EXPECT_EQ(r.attempts, 3);
  ASSERT_EQ(r.waits.size(), 2u);
  EXPECT_EQ(r.waits[0], milliseconds(100));
  EXPECT_EQ(r.waits[1], milliseconds(200));
  EXPECT_EQ(clock.Now() - start, milliseconds(3 * 10 + 100 + 200));
}

TEST(RetryLoopTest, PostThatTimedOutFailsClosed) {
  FakeClock clock;
  Backoff backoff = TopOfRangeBackoff();
  LoopOptions o;
  o.method = "POST";
  Result r = RunLoop(o, {{200, ErrorKind::kNone, "", seconds(5)}}, clock, backoff);
  EXPECT_EQ(r.ending, Ending::kTerminal);
  EXPECT_EQ(r.attempts, 1);
  // With an idempotency key it is retried.
  o.idempotency_key = true;
  r = RunLoop(o, {{200, ErrorKind::kNone, "", seconds(5)}, {201}}, clock, backoff);
  EXPECT_EQ(r.ending, Ending::kSuccess);
  EXPECT_EQ(r.attempts, 2);
}

TEST(RetryLoopTest, PostIsRetriedWhenTheRequestNeverLeft) {
  FakeClock clock;
  Backoff backoff = TopOfRangeBackoff();
  LoopOptions o;
  o.method = "POST";
  Result r = RunLoop(o, {{0, ErrorKind::kConnectRefused}, {429, ErrorKind::kNone, "1"}, {201}},
                     clock, backoff);
  EXPECT_EQ(r.ending, Ending::kSuccess);
  EXPECT_EQ(r.attempts, 3);
}

TEST(RetryLoopTest, RetryAfterOverridesAShorterBackoff) {
  FakeClock clock;
  Backoff backoff = TopOfRangeBackoff();
  Result r = RunLoop({}, {{429, ErrorKind::kNone, "3"}, {200}}, clock, backoff);
  EXPECT_EQ(r.ending, Ending::kSuccess);
  ASSERT_EQ(r.waits.size(), 1u);
  // max(100 ms backoff, 3 s + up to 100 ms of jitter; the top of the range here).
  EXPECT_EQ(r.waits[0], seconds(3) + milliseconds(100));
}

TEST(RetryLoopTest, RetryAfterZeroStillWaits) {
  FakeClock clock;
  BackoffOptions options;
  options.base = milliseconds(100);
  std::mt19937_64 rng(1);
  Backoff backoff(options, [&rng] { return rng(); });
  LoopOptions o;
  o.max_attempts = 50;
  o.budget = std::chrono::hours(1);
  std::vector<Response> script(49, Response{503, ErrorKind::kNone, "0"});
  script.push_back({200});
  Result r = RunLoop(o, script, clock, backoff);
  EXPECT_EQ(r.ending, Ending::kSuccess);
  for (nanoseconds w : r.waits) EXPECT_GT(w, nanoseconds(0));
}

TEST(RetryLoopTest, GivesUpBeforeSleepingPastTheDeadline) {
  FakeClock clock;
  Backoff backoff = TopOfRangeBackoff();
  LoopOptions o;
  o.budget = seconds(2);
  nanoseconds start = clock.Now();
  // The server asks for 5 s; the caller has 2 s: give up at once instead of sleeping.
  Result r = RunLoop(o, {{503, ErrorKind::kNone, "5"}, {200}}, clock, backoff);
  EXPECT_EQ(r.ending, Ending::kDeadline);
  EXPECT_EQ(r.attempts, 1);
  EXPECT_TRUE(r.waits.empty());
  EXPECT_EQ(clock.Now() - start, milliseconds(10));
}

TEST(RetryLoopTest, NeverOverrunsTheDeadline) {
  std::mt19937_64 rng(2024);
  const int statuses[] = {200, 404, 429, 500, 502, 503, 504};
  const ErrorKind errors[] = {ErrorKind::kNone, ErrorKind::kNone, ErrorKind::kTimeout,
                              ErrorKind::kConnectionReset, ErrorKind::kDns};
  const char* retry_afters[] = {"", "", "0", "1", "7", "Sun, 06 Nov 1994 08:49:39 GMT", "x"};
  const Jitter jitters[] = {Jitter::kFull, Jitter::kEqual, Jitter::kDecorrelated, Jitter::kNone};
  int endings[4] = {0, 0, 0, 0};
  for (int run = 0; run < 2000; ++run) {
    std::vector<Response> script;
    for (int i = 0; i < 12; ++i) {
      Response r;
      r.status = rng() % 3 == 0 ? 200 : statuses[rng() % 7];
      r.error = errors[rng() % 5];
      r.retry_after = retry_afters[rng() % 7];
      r.takes = milliseconds(int64_t(rng() % 1500));
      script.push_back(r);
    }
    BackoffOptions bo;
    bo.jitter = jitters[run % 4];
    bo.base = milliseconds(50 + int64_t(rng() % 200));
    bo.cap = seconds(1 + int64_t(rng() % 5));
    Backoff backoff(bo, [&rng] { return rng(); });
    LoopOptions o;
    o.method = run % 3 == 0 ? "POST" : "GET";
    o.idempotency_key = run % 5 == 0;
    o.max_attempts = 2 + int(rng() % 6);
    o.budget = milliseconds(500 + int64_t(rng() % 5000));
    FakeClock clock;
    nanoseconds start = clock.Now();
    Result r = RunLoop(o, script, clock, backoff);
    ASSERT_LE(clock.Now() - start, o.budget) << "run " << run;
    ASSERT_GE(r.attempts, 1);
    ASSERT_LE(r.attempts, o.max_attempts);
    ++endings[int(r.ending)];
  }
  // The scripts exercise every way out of the loop.
  for (int e = 0; e < 4; ++e) EXPECT_GT(endings[e], 20) << "ending " << e;
}

}  // namespace
}  // namespace retryd
