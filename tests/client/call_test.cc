// The C++ retry loop (call.h, client/src/call.cc) against real segments, on virtual time: the
// loop's clock and sleep are fakes, so no test sleeps through a backoff. (The breaker's own
// open period runs on the segment's real coarse clock; one test waits a few milliseconds for
// it.) The C ABI's retry loop (retryd_call.h) is tested in c_call_test.cc.
#include "retryd/call.h"

#include <unistd.h>

#include <atomic>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "retryd/retryd_call.h"
#include "shm/breaker.h"
#include "tests/shm/test_util.h"

namespace retryd {
namespace {

using std::chrono::milliseconds;
using std::chrono::nanoseconds;
using std::chrono::seconds;

class FakeClock final : public Clock {
 public:
  nanoseconds Now() const override { return now; }
  void Advance(nanoseconds d) { now += d; }
  nanoseconds now = seconds(1000);
};

// A segment holding one dependency "dep" with policy `p`, and a client on it.
struct Fixture {
  testing::NamedSegment seg;
  uint32_t index;
  std::unique_ptr<Client> client;
  Dependency dep;
  FakeClock clock;
  std::vector<nanoseconds> sleeps;
  std::vector<AttemptRecord> records;
  uint64_t random_state = 42;

  explicit Fixture(const shm::Policy& p = {}) : seg("call") {
    index = testing::AddDependency(*seg.seg, "dep", p);
    ClientOptions opt;
    opt.segment = seg.name;
    opt.fallback_to_local = false;
    Status s = Client::Open(opt, &client);
    if (!s.ok()) throw std::runtime_error(s.ToString());
    s = client->Resolve("dep", &dep);
    if (!s.ok()) throw std::runtime_error(s.ToString());
  }

  LoopEnv Env() {
    LoopEnv env;
    env.clock = &clock;
    env.sleep = [this](nanoseconds d) {
      sleeps.push_back(d);
      clock.Advance(d);
      return true;
    };
    env.random = [this] {
      random_state = random_state * 6364136223846793005ull + 1442695040888963407ull;
      return random_state;
    };
    return env;
  }
  RetryLoop Loop(const RetryPolicy& policy) {
    return RetryLoop(*client, dep, policy, [this](const AttemptRecord& r) { records.push_back(r); },
                     Env());
  }
  shm::BreakerState Breaker() const {
    return shm::BreakerWord::Decode(seg.seg->dependency(index)->breaker.load()).state;
  }
};

// An attempt function replaying `statuses`, each taking `latency` of virtual time.
AttemptFn Replay(FakeClock& clock, std::vector<AttemptResult> results, nanoseconds latency,
                 int* calls) {
  return [&clock, results, latency, calls](const AttemptContext&) {
    clock.Advance(latency);
    const size_t i = size_t(*calls);
    ++*calls;
    return results[std::min(i, results.size() - 1)];
  };
}

AttemptResult Http(int status) {
  AttemptResult r;
  r.status = status;
  return r;
}
AttemptResult Err(ErrorKind e) {
  AttemptResult r;
  r.error = e;
  return r;
}

TEST(RetryLoopTest, RetriesUntilSuccessAndTheObserverSeesEachAttempt) {
  Fixture f;
  int calls = 0;
  RetryPolicy policy;
  policy.max_attempts = 5;
  CallResult r = f.Loop(policy).Run(Replay(f.clock, {Http(503), Http(502), Http(200)},
                                           milliseconds(5), &calls));
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.stop, StopReason::kSuccess);
  EXPECT_EQ(r.attempts, 3u);
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(r.last_status, 200);
  EXPECT_EQ(r.final_class, AttemptClass::kSuccess);
  EXPECT_EQ(r.rejection, Decision::kAdmitted);
  ASSERT_EQ(f.records.size(), 3u);
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(f.records[i].attempt, i);
    EXPECT_EQ(f.records[i].admission, Decision::kAdmitted);
    EXPECT_EQ(f.records[i].latency, milliseconds(5));
    EXPECT_FALSE(f.records[i].retry_after);
  }
  EXPECT_EQ(f.records[0].status, 503);
  EXPECT_EQ(f.records[0].attempt_class, AttemptClass::kRetryable);
  EXPECT_EQ(f.records[0].breaker, BreakerOutcome::kFailure);
  EXPECT_EQ(f.records[0].next, StopReason::kNone);
  EXPECT_EQ(f.records[1].next, StopReason::kNone);
  EXPECT_EQ(f.records[2].next, StopReason::kSuccess);
  EXPECT_EQ(f.records[2].wait, nanoseconds(0));
  // The waits the observer saw are the ones slept, within full jitter's bounds.
  ASSERT_EQ(f.sleeps.size(), 2u);
  EXPECT_EQ(f.sleeps[0], f.records[0].wait);
  EXPECT_EQ(f.sleeps[1], f.records[1].wait);
  EXPECT_LE(f.sleeps[0], milliseconds(100));
  EXPECT_LE(f.sleeps[1], milliseconds(200));
  EXPECT_EQ(r.elapsed, milliseconds(15) + f.sleeps[0] + f.sleeps[1]);
}

TEST(RetryLoopTest, StopsAfterMaxAttempts) {
  Fixture f;
  int calls = 0;
  RetryPolicy policy;
  policy.max_attempts = 3;
  CallResult r = f.Loop(policy).Run(Replay(f.clock, {Http(503)}, milliseconds(1), &calls));
  EXPECT_EQ(r.stop, StopReason::kAttemptsExhausted);
  EXPECT_EQ(r.attempts, 3u);
  EXPECT_EQ(r.final_class, AttemptClass::kRetryable);
  EXPECT_EQ(f.sleeps.size(), 2u);
  ASSERT_EQ(f.records.size(), 3u);
  EXPECT_EQ(f.records[2].next, StopReason::kAttemptsExhausted);
}

// --- Rejections: each returns at once, with its reason, and sends nothing. ----------------

void ExpectRejected(Fixture& f, Decision reason, uint32_t attempts_before = 0) {
  int calls = 0;
  RetryPolicy policy;
  policy.max_attempts = 5;
  CallResult r = f.Loop(policy).Run(Replay(f.clock, {Http(503)}, milliseconds(1), &calls));
  EXPECT_TRUE(r.rejected());
  EXPECT_EQ(r.rejection, reason) << DecisionName(r.rejection);
  EXPECT_EQ(r.attempts, attempts_before);
  EXPECT_EQ(calls, int(attempts_before));
  ASSERT_EQ(f.records.size(), attempts_before + 1);
  EXPECT_EQ(f.records.back().admission, reason);
  EXPECT_EQ(f.records.back().next, StopReason::kRejected);
}

TEST(RetryLoopTest, BreakerOpenRejectsAtOnce) {
  shm::Policy p;
  p.min_calls = 2;
  p.open_for_ms = 60'000;
  Fixture f(p);
  for (int i = 0; i < 2; ++i) {
    Permit permit;
    ASSERT_TRUE(f.client->Admit(f.dep, 0, &permit));
    f.client->Complete(&permit, Outcome::kFailure, milliseconds(1));
  }
  ASSERT_EQ(f.Breaker(), shm::BreakerState::kOpen);
  ExpectRejected(f, Decision::kRejectedOpen);
  EXPECT_TRUE(f.sleeps.empty());
}

TEST(RetryLoopTest, ForcedOpenRejectsAsOpen) {
  shm::Policy p;
  p.mode = shm::Mode::kForcedOpen;
  Fixture f(p);
  ExpectRejected(f, Decision::kRejectedOpen);
}

// A breaker of one call that opens on one failure for a millisecond (on the segment's real
// clock), with one probe, closed by one success.
shm::Policy OneCallBreaker() {
  shm::Policy p;
  p.min_calls = 1;
  p.open_for_ms = 1;
  p.open_for_max_ms = 1;
  p.open_jitter_ms = 0;
  p.probe_timeout_ms = 60'000;
  p.half_open_probes = 1;
  p.close_after = 1;
  return p;
}

TEST(RetryLoopTest, HalfOpenBusyRejectsAtOnce) {
  Fixture f(OneCallBreaker());
  Permit permit;
  ASSERT_TRUE(f.client->Admit(f.dep, 0, &permit));
  f.client->Complete(&permit, Outcome::kFailure, milliseconds(1));
  ASSERT_EQ(f.Breaker(), shm::BreakerState::kOpen);
  // The open period is on the segment's real (coarse) clock: let it pass, then hold the probe.
  Permit probe;
  for (int i = 0; i < 200 && !probe.probe(); ++i) {
    usleep(5'000);
    f.client->Admit(f.dep, 0, &probe);
  }
  ASSERT_TRUE(probe.probe());
  ExpectRejected(f, Decision::kRejectedHalfOpenBusy);
  f.client->Complete(&probe, Outcome::kSuccess, milliseconds(1));
}

// ShortRetry makes a call whose first attempt fails after 1.5 s of its 2 s and opens the
// breaker; when its retry is admitted the breaker is half-open, and the retry, with under 0.5 s
// left where a fresh call's attempt has 1 s, would be its probe. `records` sees each attempt.
CallResult ShortRetry(Fixture& f, int* calls, std::vector<AttemptRecord>* records) {
  LoopEnv env = f.Env();
  env.sleep = [&f](nanoseconds d) {
    f.clock.Advance(d);
    usleep(20'000);  // the breaker's open period passes on the segment's real clock
    return true;
  };
  RetryPolicy policy;
  policy.max_attempts = 3;
  policy.deadline = seconds(2);
  policy.attempt_timeout = seconds(1);
  policy.expected_attempt = milliseconds(10);
  policy.backoff.base = milliseconds(1);
  policy.backoff.cap = milliseconds(1);
  return RetryLoop(
             *f.client, f.dep, policy,
             [records](const AttemptRecord& rec) { records->push_back(rec); }, env)
      .Run(Replay(f.clock, {Http(503)}, milliseconds(1'500), calls));
}

TEST(RetryLoopTest, ARetryShortOfTimeLeavesTheHalfOpensProbeToTheNextCaller) {
  Fixture f(OneCallBreaker());
  std::vector<AttemptRecord> records;
  int calls = 0;
  const CallResult r = ShortRetry(f, &calls, &records);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(r.attempts, 1u);
  EXPECT_EQ(r.stop, StopReason::kRejected);
  EXPECT_EQ(r.rejection, Decision::kRejectedHalfOpenBusy);
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[1].admission, Decision::kRejectedHalfOpenBusy);
  EXPECT_EQ(records[1].next, StopReason::kRejected);
  // Counted as the refusal it was: no probe, no retry (nor its token), no completion.
  const shm::DependencySlot& slot = *f.seg.seg->dependency(f.index);
  EXPECT_EQ(shm::ReadCounter(slot, shm::kRejectedHalfOpenBusy), 1u);
  EXPECT_EQ(shm::ReadCounter(slot, shm::kProbesGranted), 0u);
  EXPECT_EQ(shm::ReadCounter(slot, shm::kRetriesGranted), 0u);
  EXPECT_EQ(shm::ReadCounter(slot, shm::kIgnored), 0u);
  EXPECT_EQ(shm::ReadCounter(slot, shm::kFailures), 1u);
  // The breaker is still half-open, its probe free: the next caller probes and closes it.
  EXPECT_EQ(f.Breaker(), shm::BreakerState::kHalfOpen);
  int fresh_calls = 0;
  bool probed = false;
  RetryPolicy policy;
  policy.deadline = seconds(2);
  policy.attempt_timeout = seconds(1);
  const CallResult fresh =
      RetryLoop(*f.client, f.dep, policy, {}, f.Env()).Run([&](const AttemptContext& ctx) {
        probed = ctx.probe;
        ++fresh_calls;
        return Http(200);
      });
  EXPECT_TRUE(fresh.ok());
  EXPECT_TRUE(probed);
  EXPECT_EQ(fresh_calls, 1);
  EXPECT_EQ(shm::ReadCounter(slot, shm::kProbesGranted), 1u);
  EXPECT_EQ(f.Breaker(), shm::BreakerState::kClosed);
}

// Shadow mode refuses nothing: the retry short of time goes out, as an ordinary attempt, and
// counts as one that enforce would refuse.
TEST(RetryLoopTest, InShadowModeARetryShortOfTimeGoesOutWithoutTheProbe) {
  Fixture f(OneCallBreaker());
  f.seg.seg->dependency(f.index)->mode.store(uint32_t(shm::Mode::kShadow));
  std::vector<AttemptRecord> records;
  int calls = 0;
  const CallResult r = ShortRetry(f, &calls, &records);
  EXPECT_NE(r.stop, StopReason::kRejected);
  EXPECT_EQ(calls, 2);
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[1].admission, Decision::kAdmitted);
  const shm::DependencySlot& slot = *f.seg.seg->dependency(f.index);
  EXPECT_EQ(shm::ReadCounter(slot, shm::kProbesGranted), 0u);
  EXPECT_EQ(shm::ReadCounter(slot, shm::kShadowWouldReject), 1u);
  EXPECT_EQ(f.Breaker(), shm::BreakerState::kHalfOpen) << "an ordinary attempt is no probe";
}

TEST(RetryLoopTest, AFreshCallAlwaysHasTheTimeToProbeWhateverItsDeadline) {
  // A deadline under the attempt timeout: the probe needs half the deadline, which a fresh
  // call has; were it the attempt timeout, no call could ever probe and the breaker would stay
  // half-open for good.
  for (const nanoseconds deadline : {milliseconds(1), milliseconds(100), milliseconds(5'000)}) {
    SCOPED_TRACE(deadline.count());
    Fixture f(OneCallBreaker());
    Permit permit;
    ASSERT_TRUE(f.client->Admit(f.dep, 0, &permit));
    f.client->Complete(&permit, Outcome::kFailure, milliseconds(1));
    ASSERT_EQ(f.Breaker(), shm::BreakerState::kOpen);
    usleep(20'000);  // the open period, on the segment's real clock
    RetryPolicy policy;
    policy.deadline = deadline;
    policy.attempt_timeout = seconds(10);
    bool probed = false;
    const CallResult r = f.Loop(policy).Run([&](const AttemptContext& ctx) {
      probed = ctx.probe;
      return Http(200);
    });
    EXPECT_TRUE(r.ok());
    EXPECT_TRUE(probed);
    EXPECT_EQ(f.Breaker(), shm::BreakerState::kClosed);
  }
}

TEST(RetryLoopTest, BulkheadFullRejectsAtOnce) {
  shm::Policy p;
  p.bulkhead_limit = 1;
  Fixture f(p);
  Permit held;
  ASSERT_TRUE(f.client->Admit(f.dep, 0, &held));
  ExpectRejected(f, Decision::kRejectedBulkheadFull);
  f.client->Complete(&held, Outcome::kSuccess, milliseconds(1));
}

TEST(RetryLoopTest, EmptyBudgetStopsRetries) {
  shm::Policy p;
  p.retry_ratio_milli = 0;
  p.min_retries_per_sec = 0;
  p.retry_burst = 1;
  Fixture f(p);
  // Spend the budget's only token.
  for (int i = 0; i < 10; ++i) {
    Permit permit;
    const bool ok = f.client->Admit(f.dep, 1, &permit);
    f.client->Complete(&permit, Outcome::kSuccess, milliseconds(1));
    if (!ok) break;
  }
  // The first attempt goes out (it needs no token); the retry is refused at once.
  ExpectRejected(f, Decision::kRejectedBudgetEmpty, /*attempts_before=*/1);
  EXPECT_EQ(f.records[0].next, StopReason::kNone);
  EXPECT_EQ(f.records[0].attempt_class, AttemptClass::kRetryable);
}

TEST(RetryLoopTest, EmptyBudgetResultKeepsTheLastAttempt) {
  shm::Policy p;
  p.retry_ratio_milli = 0;
  p.min_retries_per_sec = 0;
  p.retry_burst = 1;
  Fixture f(p);
  int calls = 0;
  RetryPolicy policy;
  policy.max_attempts = 10;
  // One token: attempt 0 and attempt 1 go out, attempt 2 is refused.
  CallResult r = f.Loop(policy).Run(Replay(f.clock, {Http(503)}, milliseconds(1), &calls));
  EXPECT_EQ(r.stop, StopReason::kRejected);
  EXPECT_EQ(r.rejection, Decision::kRejectedBudgetEmpty);
  EXPECT_EQ(r.attempts, 2u);
  EXPECT_EQ(r.last_status, 503);
  EXPECT_EQ(r.final_class, AttemptClass::kRetryable);
}

// --- Deadline ------------------------------------------------------------------------------

TEST(RetryLoopTest, DeadlineIsNeverOverrun) {
  // Many random schedules: attempts of random latency (respecting the time they were given),
  // random failures, waits from every jitter kind. The loop must end within the deadline and
  // never start an attempt, nor sleep before one, without `expected_attempt` left.
  std::mt19937_64 rng(7);
  for (int round = 0; round < 300; ++round) {
    Fixture f;
    RetryPolicy policy;
    policy.max_attempts = 1 + uint32_t(rng() % 12);
    policy.backoff.jitter = Jitter(rng() % 4);
    policy.backoff.base = milliseconds(1 + rng() % 200);
    policy.backoff.cap = milliseconds(1 + rng() % 2000);
    policy.deadline = milliseconds(rng() % 3000);
    policy.expected_attempt = milliseconds(rng() % 300);
    if (rng() % 2) policy.attempt_timeout = milliseconds(1 + rng() % 500);
    const nanoseconds start = f.clock.now;
    nanoseconds last_sleep_end{0};
    auto env = f.Env();
    env.sleep = [&](nanoseconds d) {
      f.clock.Advance(d);
      last_sleep_end = f.clock.now;
      // After the sleep, the expected attempt must still fit.
      EXPECT_LE(f.clock.now - start + policy.expected_attempt, policy.deadline) << round;
      return true;
    };
    RetryLoop loop(*f.client, f.dep, policy, {}, env);
    CallResult r = loop.Run([&](const AttemptContext& ctx) {
      EXPECT_LE(f.clock.now - start + policy.expected_attempt, policy.deadline) << round;
      EXPECT_LE(ctx.remaining, policy.attempt_timeout);
      EXPECT_LE(f.clock.now - start + ctx.remaining, policy.deadline) << round;
      const nanoseconds want = milliseconds(rng() % 400);
      if (want >= ctx.remaining) {
        f.clock.Advance(ctx.remaining);
        return Err(ErrorKind::kTimeout);
      }
      f.clock.Advance(want);
      return Http(rng() % 4 == 0 ? 200 : 503);
    });
    EXPECT_LE(r.elapsed, policy.deadline) << round;
    EXPECT_EQ(r.elapsed, f.clock.now - start);
    if (r.stop == StopReason::kDeadline && r.attempts > 0) {
      EXPECT_LE(last_sleep_end, f.clock.now);
    }
  }
}

TEST(RetryLoopTest, GivesUpInsteadOfSleepingIntoAnAttemptThatCannotFinish) {
  Fixture f;
  int calls = 0;
  RetryPolicy policy;
  policy.max_attempts = 10;
  policy.backoff.jitter = Jitter::kNone;
  policy.backoff.base = milliseconds(400);
  policy.deadline = seconds(1);
  // Each attempt takes 300 ms: 300 + 400 + 300 = 1000 fits, the next 800 + 300 does not.
  CallResult r = f.Loop(policy).Run(Replay(f.clock, {Http(503)}, milliseconds(300), &calls));
  EXPECT_EQ(r.stop, StopReason::kDeadline);
  EXPECT_EQ(r.attempts, 2u);
  EXPECT_EQ(r.elapsed, seconds(1));
  ASSERT_EQ(f.sleeps.size(), 1u);
  ASSERT_EQ(f.records.size(), 2u);
  EXPECT_EQ(f.records[1].next, StopReason::kDeadline);
  EXPECT_EQ(f.records[1].wait, nanoseconds(0));
}

TEST(RetryLoopTest, ExpiredDeadlineStartsNothing) {
  Fixture f;
  int calls = 0;
  RetryPolicy policy;
  policy.deadline = nanoseconds(0);
  CallResult r = f.Loop(policy).Run(Replay(f.clock, {Http(200)}, milliseconds(1), &calls));
  EXPECT_EQ(r.stop, StopReason::kDeadline);
  EXPECT_EQ(r.attempts, 0u);
  EXPECT_EQ(calls, 0);
  // And an attempt expected to take longer than the budget is not started either.
  policy.deadline = milliseconds(100);
  policy.expected_attempt = milliseconds(150);
  r = f.Loop(policy).Run(Replay(f.clock, {Http(200)}, milliseconds(1), &calls));
  EXPECT_EQ(r.stop, StopReason::kDeadline);
  EXPECT_EQ(calls, 0);
}

TEST(RetryLoopTest, PassesTheRemainingTimeDownstream) {
  Fixture f;
  RetryPolicy policy;
  policy.max_attempts = 3;
  policy.backoff.jitter = Jitter::kNone;
  policy.backoff.base = milliseconds(100);
  policy.deadline = seconds(2);
  policy.attempt_timeout = milliseconds(700);
  policy.expected_attempt = milliseconds(100);
  std::vector<nanoseconds> given;
  std::vector<std::string> headers;
  CallResult r = f.Loop(policy).Run([&](const AttemptContext& ctx) {
    given.push_back(ctx.remaining);
    headers.push_back(ctx.deadline_header());
    f.clock.Advance(ctx.remaining);  // every attempt times out
    return Err(ErrorKind::kTimeout);
  });
  // 700 (timeout), +100 wait, 700, +200 wait, then only 300 ms are left.
  ASSERT_EQ(given.size(), 3u);
  EXPECT_EQ(given[0], milliseconds(700));
  EXPECT_EQ(given[1], milliseconds(700));
  EXPECT_EQ(given[2], milliseconds(300));
  EXPECT_EQ(headers[0], "700m");
  EXPECT_EQ(headers[2], "300m");
  EXPECT_EQ(r.stop, StopReason::kAttemptsExhausted);
  EXPECT_EQ(r.elapsed, seconds(2));
  // By default an attempt needs as long as the slowest so far (700 ms): 300 ms left is not
  // worth the wait, and the call ends before it instead.
  policy.expected_attempt = nanoseconds(0);
  given.clear();
  f.records.clear();
  const nanoseconds start = f.clock.now;
  r = f.Loop(policy).Run([&](const AttemptContext& ctx) {
    given.push_back(ctx.remaining);
    f.clock.Advance(ctx.remaining);
    return Err(ErrorKind::kTimeout);
  });
  EXPECT_EQ(given.size(), 2u);
  EXPECT_EQ(r.stop, StopReason::kDeadline);
  EXPECT_EQ(f.clock.now - start, milliseconds(1500));
}

TEST(RetryLoopTest, PerCallDeadlineTightensThePolicy) {
  Fixture f;
  RetryPolicy policy;
  policy.deadline = seconds(10);
  nanoseconds given{0};
  CallOptions options;
  options.deadline = milliseconds(250);
  f.Loop(policy).Run(
      [&](const AttemptContext& ctx) {
        given = ctx.remaining;
        return Http(200);
      },
      options);
  EXPECT_EQ(given, milliseconds(250));
  // Unbounded when neither is set.
  f.Loop(RetryPolicy{}).Run([&](const AttemptContext& ctx) {
    EXPECT_FALSE(ctx.bounded());
    EXPECT_EQ(ctx.deadline_header(), "");
    return Http(200);
  });
}

// --- Retry-After -----------------------------------------------------------------------------

TEST(RetryLoopTest, RetryAfterIsAFloorOverTheBackoff) {
  Fixture f;
  int calls = 0;
  RetryPolicy policy;
  policy.backoff.jitter = Jitter::kNone;
  policy.backoff.base = milliseconds(10);
  policy.backoff.retry_after_jitter_max = milliseconds(50);
  AttemptResult busy = Http(503);
  busy.retry_after_header = "2";
  CallResult r = f.Loop(policy).Run(Replay(f.clock, {busy, Http(200)}, milliseconds(1), &calls));
  EXPECT_TRUE(r.ok());
  ASSERT_EQ(f.sleeps.size(), 1u);
  EXPECT_GE(f.sleeps[0], seconds(2));
  EXPECT_LE(f.sleeps[0], seconds(2) + milliseconds(50));
  ASSERT_TRUE(f.records[0].retry_after);
  EXPECT_EQ(*f.records[0].retry_after, seconds(2));
  EXPECT_EQ(f.records[0].wait, f.sleeps[0]);
}

TEST(RetryLoopTest, BackoffLongerThanRetryAfterWins) {
  Fixture f;
  int calls = 0;
  RetryPolicy policy;
  policy.backoff.jitter = Jitter::kNone;
  policy.backoff.base = seconds(5);
  policy.backoff.retry_after_jitter_max = milliseconds(50);
  AttemptResult busy = Http(429);
  busy.retry_after = seconds(1);
  f.Loop(policy).Run(Replay(f.clock, {busy, Http(200)}, milliseconds(1), &calls));
  ASSERT_EQ(f.sleeps.size(), 1u);
  EXPECT_EQ(f.sleeps[0], seconds(5));
}

TEST(RetryLoopTest, RetryAfterZeroStillGetsJitter) {
  Fixture f;
  int calls = 0;
  RetryPolicy policy;
  policy.backoff.jitter = Jitter::kNone;
  policy.backoff.base = nanoseconds(0);
  AttemptResult busy = Http(503);
  busy.retry_after_header = "0";
  f.Loop(policy).Run(Replay(f.clock, {busy, busy, Http(200)}, milliseconds(1), &calls));
  ASSERT_EQ(f.sleeps.size(), 2u);
  EXPECT_GT(f.sleeps[0] + f.sleeps[1], nanoseconds(0));
  EXPECT_LE(f.sleeps[0], milliseconds(100));
}

TEST(RetryLoopTest, HttpDateRetryAfterUsesTheDateHeader) {
  Fixture f;
  int calls = 0;
  RetryPolicy policy;
  policy.backoff.jitter = Jitter::kNone;
  policy.backoff.base = milliseconds(1);
  policy.backoff.retry_after_jitter_max = nanoseconds(0);
  auto env = f.Env();
  // The local clock is an hour behind the server's: the Date header rules.
  env.wall_clock = [] { return std::chrono::system_clock::from_time_t(784111777 - 3600); };
  AttemptResult busy = Http(503);
  busy.retry_after_header = "Sun, 06 Nov 1994 08:49:40 GMT";
  busy.date_header = "Sun, 06 Nov 1994 08:49:37 GMT";
  RetryLoop loop(*f.client, f.dep, policy, {}, env);
  EXPECT_TRUE(loop.Run(Replay(f.clock, {busy, Http(200)}, milliseconds(1), &calls)).ok());
  ASSERT_EQ(f.sleeps.size(), 1u);
  EXPECT_EQ(f.sleeps[0], seconds(3));
}

TEST(RetryLoopTest, RetryAfterAboveTheCeilingEndsTheCall) {
  Fixture f;
  int calls = 0;
  RetryPolicy policy;
  policy.retry_after_max = seconds(30);
  AttemptResult busy = Http(503);
  busy.retry_after_header = "120";
  CallResult r = f.Loop(policy).Run(Replay(f.clock, {busy, Http(200)}, milliseconds(1), &calls));
  EXPECT_EQ(r.stop, StopReason::kRetryAfterTooLong);
  EXPECT_EQ(r.attempts, 1u);
  EXPECT_TRUE(f.sleeps.empty());
  // No ceiling at all: a server's absurd wait is clamped, still too long, never an overflow.
  policy.retry_after_max = nanoseconds::max();
  busy.retry_after_header = "99999999999999";
  calls = 0;
  r = f.Loop(policy).Run(Replay(f.clock, {busy, Http(200)}, milliseconds(1), &calls));
  EXPECT_EQ(r.stop, StopReason::kRetryAfterTooLong);
  policy.retry_after_max = seconds(30);
  busy.retry_after_header = "";
  busy.retry_after = seconds(31);
  calls = 0;
  r = f.Loop(policy).Run(Replay(f.clock, {busy, Http(200)}, milliseconds(1), &calls));
  EXPECT_EQ(r.stop, StopReason::kRetryAfterTooLong);
}

TEST(RetryLoopTest, RetryAfterBeyondTheDeadlineGivesUpWithoutSleeping) {
  Fixture f;
  int calls = 0;
  RetryPolicy policy;
  policy.deadline = seconds(5);
  AttemptResult busy = Http(503);
  busy.retry_after_header = "10";
  CallResult r = f.Loop(policy).Run(Replay(f.clock, {busy, Http(200)}, milliseconds(1), &calls));
  EXPECT_EQ(r.stop, StopReason::kDeadline);
  EXPECT_TRUE(f.sleeps.empty());
  EXPECT_EQ(r.elapsed, milliseconds(1));
}

TEST(RetryLoopTest, UnparsableRetryAfterIsIgnored) {
  Fixture f;
  int calls = 0;
  RetryPolicy policy;
  policy.backoff.cap = milliseconds(100);
  AttemptResult busy = Http(503);
  busy.retry_after_header = "soon";
  CallResult r = f.Loop(policy).Run(Replay(f.clock, {busy, Http(200)}, milliseconds(1), &calls));
  EXPECT_TRUE(r.ok());
  EXPECT_FALSE(f.records[0].retry_after);
  EXPECT_LE(f.sleeps[0], milliseconds(100));
}

// --- Classification --------------------------------------------------------------------------

TEST(RetryLoopTest, NonIdempotentPostTimeoutFailsClosed) {
  Fixture f;
  int calls = 0;
  CallOptions post;
  post.method = "POST";
  CallResult r = f.Loop(RetryPolicy{}).Run(
      Replay(f.clock, {Err(ErrorKind::kTimeout), Http(200)}, milliseconds(1), &calls), post);
  EXPECT_EQ(r.stop, StopReason::kTerminal);
  EXPECT_EQ(r.attempts, 1u);
  EXPECT_EQ(r.last_error, ErrorKind::kTimeout);
  EXPECT_EQ(f.records[0].breaker, BreakerOutcome::kFailure);  // the dependency still failed
  // With an idempotency key the same timeout is retried.
  post.has_idempotency_key = true;
  calls = 0;
  r = f.Loop(RetryPolicy{}).Run(
      Replay(f.clock, {Err(ErrorKind::kTimeout), Http(200)}, milliseconds(1), &calls), post);
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.attempts, 2u);
  // A refused connection proves nothing was sent: a POST retries it.
  post.has_idempotency_key = false;
  calls = 0;
  r = f.Loop(RetryPolicy{}).Run(
      Replay(f.clock, {Err(ErrorKind::kConnectRefused), Http(200)}, milliseconds(1), &calls),
      post);
  EXPECT_TRUE(r.ok());
}

TEST(RetryLoopTest, ClientErrorIsTerminalAndIgnoredByTheBreaker) {
  shm::Policy p;
  p.min_calls = 3;
  p.open_for_ms = 60'000;
  Fixture f(p);
  for (int i = 0; i < 10; ++i) {
    int calls = 0;
    CallResult r = f.Loop(RetryPolicy{}).Run(Replay(f.clock, {Http(404)}, milliseconds(1), &calls));
    EXPECT_EQ(r.stop, StopReason::kTerminal);
    EXPECT_EQ(r.attempts, 1u);
    EXPECT_EQ(r.final_class, AttemptClass::kTerminal);
  }
  EXPECT_EQ(f.records.back().breaker, BreakerOutcome::kIgnored);
  EXPECT_EQ(f.Breaker(), shm::BreakerState::kClosed);
  // The same number of 500s opens it.
  for (int i = 0; i < 3; ++i) {
    int calls = 0;
    RetryPolicy once;
    once.max_attempts = 1;
    f.Loop(once).Run(Replay(f.clock, {Http(500)}, milliseconds(1), &calls));
  }
  EXPECT_EQ(f.Breaker(), shm::BreakerState::kOpen);
}

TEST(RetryLoopTest, CustomTableAndOverride) {
  Fixture f;
  ClassificationPolicy table;
  table.SetStatus(409, {AttemptClass::kRetryable, BreakerOutcome::kIgnored, false});
  RetryPolicy policy;
  policy.classification = &table;
  int calls = 0;
  CallResult r = f.Loop(policy).Run(Replay(f.clock, {Http(409), Http(200)}, milliseconds(1), &calls));
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.attempts, 2u);
  // A non-HTTP call classifies itself.
  AttemptResult busy;
  busy.classification = Classification{AttemptClass::kRetryable, BreakerOutcome::kFailure};
  AttemptResult done;
  done.classification = Classification{AttemptClass::kSuccess, BreakerOutcome::kSuccess};
  calls = 0;
  r = f.Loop(RetryPolicy{}).Run(Replay(f.clock, {busy, done}, milliseconds(1), &calls));
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.attempts, 2u);
}

// --- Failure paths -----------------------------------------------------------------------------

TEST(RetryLoopTest, ThrowingAttemptIsCompletedAndPropagates) {
  shm::Policy p;
  p.bulkhead_limit = 1;
  Fixture f(p);
  EXPECT_THROW(f.Loop(RetryPolicy{}).Run([](const AttemptContext&) -> AttemptResult {
    throw std::runtime_error("boom");
  }),
               std::runtime_error);
  // The bulkhead lease was released: the next call gets in.
  Permit permit;
  EXPECT_TRUE(f.client->Admit(f.dep, 0, &permit));
  f.client->Complete(&permit, Outcome::kSuccess, milliseconds(1));
}

TEST(RetryLoopTest, InterruptedSleepCancels) {
  Fixture f;
  int calls = 0;
  auto env = f.Env();
  env.sleep = [](nanoseconds) { return false; };
  RetryLoop loop(*f.client, f.dep, RetryPolicy{}, {}, env);
  CallResult r = loop.Run(Replay(f.clock, {Http(503)}, milliseconds(1), &calls));
  EXPECT_EQ(r.stop, StopReason::kCancelled);
  EXPECT_EQ(r.attempts, 1u);
}

TEST(RetryLoopTest, AbortStopsWithoutRetrying) {
  Fixture f;
  AttemptResult abort = Http(503);
  abort.abort = true;
  int calls = 0;
  CallResult r = f.Loop(RetryPolicy{}).Run(Replay(f.clock, {abort}, milliseconds(1), &calls));
  EXPECT_EQ(r.stop, StopReason::kAborted);
  EXPECT_EQ(r.attempts, 1u);
  EXPECT_EQ(f.records[0].breaker, BreakerOutcome::kFailure);
}

TEST(RetryLoopTest, OneLoopServesManyThreads) {
  shm::Policy p;
  p.min_calls = 1'000'000;      // half the attempts fail: keep the breaker out of it
  p.retry_ratio_milli = 2'000;  // and let every first attempt pay for its retry
  Fixture f(p);
  RetryPolicy policy;
  policy.max_attempts = 3;
  policy.backoff.base = std::chrono::microseconds(1);
  policy.backoff.cap = std::chrono::microseconds(10);
  const RetryLoop loop(*f.client, f.dep, policy);  // the real clock, sleep and randomness
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        CallResult r = loop.Run([](const AttemptContext& ctx) {
          return Http(ctx.attempt == 0 ? 503 : 200);
        });
        if (r.ok() && r.attempts == 2) ok.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 800);
}

TEST(RetryLoopTest, StopReasonNames) {
  EXPECT_STREQ(StopReasonName(StopReason::kRetryAfterTooLong), "retry_after_too_long");
  EXPECT_STREQ(retryd_stop_name(RETRYD_STOP_REJECTED), "rejected");
  EXPECT_STREQ(retryd_stop_name(99), "invalid");
}

}  // namespace
}  // namespace retryd
