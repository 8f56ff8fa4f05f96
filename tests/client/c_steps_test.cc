// The retry loop one step at a time (retryd_steps_*, retryd_call.h) against real segments: the
// same call as retryd_call step for step, on virtual time; refusals with their records; an
// attempt in flight given back when the caller gives up; every step out of turn refused.
#include <unistd.h>

#include <cstdint>
#include <stdexcept>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "retryd/retryd_call.h"
#include "tests/shm/test_util.h"

namespace retryd {
namespace {

// A scripted downstream on virtual time: each attempt takes 2 ms and answers the next status.
struct Script {
  std::vector<int> statuses;
  const char* retry_after = nullptr;
  int abort_at = -1;
};

struct Trace {
  int64_t now_ns = 1'000'000'000'000;
  std::vector<int64_t> waits;
  std::vector<int64_t> remaining;
  std::vector<retryd_attempt_info_t> records;
  retryd_call_result_t result{};
};

struct RetrydCallWorld {
  const Script* script;
  Trace* trace;
};

// Sends attempt `n` of `script` on `trace`'s clock; returns nonzero to abort.
int Send(const Script& script, Trace* trace, uint32_t n, int64_t remaining_ms,
         retryd_attempt_result_t* out) {
  trace->remaining.push_back(remaining_ms);
  trace->now_ns += 2'000'000;
  out->status = script.statuses[std::min<size_t>(n, script.statuses.size() - 1)];
  out->retry_after = script.retry_after;
  return int(n) == script.abort_at ? 1 : 0;
}

retryd_call_env_t Env(Trace* trace) {
  retryd_call_env_t env{};
  env.ctx = trace;
  env.now_ns = [](void* c) { return static_cast<Trace*>(c)->now_ns; };
  env.sleep_ns = [](void* c, int64_t ns) {
    auto* t = static_cast<Trace*>(c);
    t->waits.push_back(ns);
    t->now_ns += ns;
    return 0;
  };
  uint64_t (*random)(void*) = [](void*) { return uint64_t(0x5bd1e9955bd1e995ull); };
  env.random = random;
  env.wall_now_ms = [](void*) { return int64_t(1'700'000'000'000); };
  return env;
}

void CallAtOnce(retryd_client_t* client, retryd_dependency_t dep, const retryd_call_policy_t& p,
                const Script& script, Trace* trace) {
  RetrydCallWorld world{&script, trace};
  retryd_call_env_t env = Env(trace);
  ASSERT_EQ(retryd_call(
                client, dep, &p,
                [](void* ctx, uint32_t n, int64_t remaining_ms, retryd_attempt_result_t* out) {
                  auto* w = static_cast<RetrydCallWorld*>(ctx);
                  return Send(*w->script, w->trace, n, remaining_ms, out);
                },
                &world,
                [](void* ctx, const retryd_attempt_info_t* info) {
                  static_cast<RetrydCallWorld*>(ctx)->trace->records.push_back(*info);
                },
                &world, &env, &trace->result),
            RETRYD_OK);
}

void CallInSteps(retryd_client_t* client, retryd_dependency_t dep, const retryd_call_policy_t& p,
                 const Script& script, Trace* trace) {
  retryd_call_env_t env = Env(trace);
  env.sleep_ns = nullptr;  // the caller waits
  retryd_steps_t* call = nullptr;
  ASSERT_EQ(retryd_steps_begin(client, dep, &p, &env, &call), RETRYD_OK);
  retryd_step_t step;
  int next;
  while ((next = retryd_steps_admit(call, &step)) == RETRYD_STEP_ATTEMPT) {
    retryd_attempt_result_t out;
    retryd_attempt_result_init(&out);
    const int abort = Send(script, trace, step.attempt, step.remaining_ms, &out);
    next = retryd_steps_report(call, &out, abort, &step);
    ASSERT_TRUE(step.has_record);
    trace->records.push_back(step.record);
    if (next == RETRYD_STEP_STOP) break;
    ASSERT_EQ(next, RETRYD_STEP_WAIT);
    EXPECT_EQ(step.wait_ns, step.record.wait_ns);
    trace->waits.push_back(step.wait_ns);
    trace->now_ns += step.wait_ns;
  }
  if (next == RETRYD_STEP_STOP && step.has_record && step.record.next == RETRYD_STOP_REJECTED) {
    trace->records.push_back(step.record);
  }
  retryd_steps_end(call, &trace->result);
}

struct StepsFixture {
  testing::NamedSegment seg{"csteps"};
  retryd_client_t* client = nullptr;
  retryd_dependency_t dep = -1;
  explicit StepsFixture(const shm::Policy& p = {}) {
    testing::AddDependency(*seg.seg, "dep", p);
    retryd_options_t opt{seg.name.c_str(), 0};
    if (retryd_open(&opt, &client) != RETRYD_OK) throw std::runtime_error(retryd_last_error());
    if (retryd_resolve(client, "dep", &dep) != RETRYD_OK) {
      throw std::runtime_error(retryd_last_error());
    }
  }
  ~StepsFixture() { retryd_close(client); }
};

void ExpectSameRecords(const std::vector<retryd_attempt_info_t>& a,
                       const std::vector<retryd_attempt_info_t>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(a[i].attempt, b[i].attempt);
    EXPECT_EQ(a[i].decision, b[i].decision);
    EXPECT_EQ(a[i].attempt_class, b[i].attempt_class);
    EXPECT_EQ(a[i].breaker_outcome, b[i].breaker_outcome);
    EXPECT_EQ(a[i].status, b[i].status);
    EXPECT_EQ(a[i].error_kind, b[i].error_kind);
    EXPECT_EQ(a[i].latency_ns, b[i].latency_ns);
    EXPECT_EQ(a[i].retry_after_ns, b[i].retry_after_ns);
    EXPECT_EQ(a[i].wait_ns, b[i].wait_ns);
    EXPECT_EQ(a[i].next, b[i].next);
  }
}

TEST(RetryStepsCTest, StepsMakeTheSameCallAsRetrydCall) {
  struct Case {
    const char* name;
    Script script;
    int64_t deadline_ms;
    uint32_t max_attempts;
  };
  const std::vector<Case> cases = {
      {"retries then succeeds", {{503, 503, 200}, "1", -1}, 5000, 4},
      {"attempts exhausted", {{503}, nullptr, -1}, -1, 3},
      {"terminal 4xx", {{409}, nullptr, -1}, -1, 3},
      {"aborted", {{503}, nullptr, 1}, -1, 5},
      {"retry-after past the deadline", {{503}, "3", -1}, 2000, 5},
      {"retry-after too long", {{429}, "120", -1}, -1, 5},
      {"an HTTP-date retry-after", {{503, 200}, "Tue, 14 Nov 2023 22:13:22 GMT", -1}, -1, 3},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    StepsFixture f;
    retryd_call_policy_t p;
    retryd_call_policy_init(&p);
    p.deadline_ms = c.deadline_ms;
    p.max_attempts = c.max_attempts;
    Trace at_once, in_steps;
    CallAtOnce(f.client, f.dep, p, c.script, &at_once);
    CallInSteps(f.client, f.dep, p, c.script, &in_steps);
    EXPECT_EQ(at_once.waits, in_steps.waits);
    EXPECT_EQ(at_once.remaining, in_steps.remaining);
    ExpectSameRecords(at_once.records, in_steps.records);
    EXPECT_EQ(at_once.result.stop, in_steps.result.stop);
    EXPECT_EQ(at_once.result.final_class, in_steps.result.final_class);
    EXPECT_EQ(at_once.result.attempts, in_steps.result.attempts);
    EXPECT_EQ(at_once.result.last_status, in_steps.result.last_status);
    EXPECT_EQ(at_once.result.rejection, in_steps.result.rejection);
    EXPECT_EQ(at_once.result.elapsed_ns, in_steps.result.elapsed_ns);
  }
}

TEST(RetryStepsCTest, ARefusedAdmissionStopsTheCallWithItsRecord) {
  shm::Policy p;
  p.mode = shm::Mode::kForcedOpen;
  StepsFixture f(p);
  Script script{{200}, nullptr, -1};
  Trace at_once, in_steps;
  retryd_call_policy_t policy;
  retryd_call_policy_init(&policy);
  CallAtOnce(f.client, f.dep, policy, script, &at_once);
  CallInSteps(f.client, f.dep, policy, script, &in_steps);
  EXPECT_TRUE(in_steps.remaining.empty());  // nothing was sent
  ExpectSameRecords(at_once.records, in_steps.records);
  ASSERT_EQ(in_steps.records.size(), 1u);
  EXPECT_EQ(in_steps.records[0].decision, RETRYD_REJECTED_OPEN);
  EXPECT_EQ(in_steps.result.stop, RETRYD_STOP_REJECTED);
  EXPECT_EQ(in_steps.result.rejection, RETRYD_REJECTED_OPEN);
  EXPECT_EQ(in_steps.result.attempts, 0u);
}

// A breaker that trips on one failure and reopens for a probe 1 ms later.
shm::Policy TripsAtOnce() {
  shm::Policy p;
  p.min_calls = 1;
  p.open_for_ms = 1;
  p.open_for_max_ms = 1;
  p.open_jitter_ms = 0;
  p.probe_timeout_ms = 60'000;
  p.close_after = 1;
  return p;
}

void Trip(const StepsFixture& f) {
  retryd_permit_t permit;
  ASSERT_EQ(retryd_admit(f.client, f.dep, 0, &permit), RETRYD_ADMITTED);
  retryd_complete(f.client, &permit, RETRYD_FAILURE, 1'000'000);
  ASSERT_EQ(retryd_breaker_state(f.client, f.dep), RETRYD_STATE_OPEN);
}

// Begins calls until one is admitted as the half-open probe (the open period runs on the
// segment's real, coarse clock) and returns it, admitted and in flight.
retryd_steps_t* HoldTheProbe(const StepsFixture& f) {
  for (int i = 0; i < 400; ++i) {
    retryd_steps_t* call = nullptr;
    if (retryd_steps_begin(f.client, f.dep, nullptr, nullptr, &call) != RETRYD_OK) return nullptr;
    retryd_step_t step;
    if (retryd_steps_admit(call, &step) == RETRYD_STEP_ATTEMPT) {
      if (step.probe) return call;
      ADD_FAILURE() << "admitted, but not as the probe";
    }
    retryd_steps_end(call, nullptr);
    usleep(5'000);
  }
  return nullptr;
}

TEST(RetryStepsCTest, ACallCancelledWithItsProbeInFlightGivesTheProbeBack) {
  StepsFixture f(TripsAtOnce());
  Trip(f);
  retryd_steps_t* first = HoldTheProbe(f);
  ASSERT_NE(first, nullptr);
  // The probe is out: another call is refused as half-open busy, with its record.
  retryd_steps_t* other = nullptr;
  ASSERT_EQ(retryd_steps_begin(f.client, f.dep, nullptr, nullptr, &other), RETRYD_OK);
  retryd_step_t step;
  ASSERT_EQ(retryd_steps_admit(other, &step), RETRYD_STEP_STOP);
  ASSERT_TRUE(step.has_record);
  EXPECT_EQ(step.record.decision, RETRYD_REJECTED_HALF_OPEN_BUSY);
  retryd_steps_end(other, nullptr);

  // The caller gives up (a cancelled coroutine): the probe goes back unjudged.
  retryd_steps_cancel(first, RETRYD_IGNORED);
  retryd_call_result_t res;
  retryd_steps_end(first, &res);
  EXPECT_EQ(res.stop, RETRYD_STOP_CANCELLED);
  EXPECT_EQ(res.attempts, 0u);
  EXPECT_EQ(retryd_breaker_state(f.client, f.dep), RETRYD_STATE_HALF_OPEN);
  retryd_steps_t* next = HoldTheProbe(f);
  ASSERT_NE(next, nullptr) << "the cancelled call's probe was not given back";
  retryd_attempt_result_t ok;
  retryd_attempt_result_init(&ok);
  ok.status = 200;
  EXPECT_EQ(retryd_steps_report(next, &ok, 0, &step), RETRYD_STEP_STOP);
  retryd_steps_end(next, &res);
  EXPECT_EQ(res.stop, RETRYD_STOP_SUCCESS);
  EXPECT_EQ(retryd_breaker_state(f.client, f.dep), RETRYD_STATE_CLOSED);
}

TEST(RetryStepsCTest, EndingACallWithAnAttemptInFlightReportsItAsAFailure) {
  StepsFixture f(TripsAtOnce());
  retryd_steps_t* call = nullptr;
  ASSERT_EQ(retryd_steps_begin(f.client, f.dep, nullptr, nullptr, &call), RETRYD_OK);
  retryd_step_t step;
  ASSERT_EQ(retryd_steps_admit(call, &step), RETRYD_STEP_ATTEMPT);
  retryd_call_result_t res;
  retryd_steps_end(call, &res);
  EXPECT_EQ(res.stop, RETRYD_STOP_CANCELLED);
  EXPECT_EQ(retryd_breaker_state(f.client, f.dep), RETRYD_STATE_OPEN);
}

TEST(RetryStepsCTest, StepsOutOfTurnAreRefusedAndChangeNothing) {
  StepsFixture f;
  retryd_steps_t* call = nullptr;
  retryd_call_policy_t bad;
  retryd_call_policy_init(&bad);
  bad.jitter = 9;
  EXPECT_EQ(retryd_steps_begin(f.client, f.dep, &bad, nullptr, &call), RETRYD_EINVAL);
  EXPECT_EQ(call, nullptr);
  EXPECT_EQ(retryd_steps_begin(nullptr, f.dep, nullptr, nullptr, &call), RETRYD_EINVAL);
  EXPECT_EQ(retryd_steps_begin(f.client, f.dep, nullptr, nullptr, nullptr), RETRYD_EINVAL);

  retryd_call_policy_t p;
  retryd_call_policy_init(&p);
  p.backoff_base_ms = 0;
  p.backoff_cap_ms = 0;
  p.max_attempts = 2;
  ASSERT_EQ(retryd_steps_begin(f.client, f.dep, &p, nullptr, &call), RETRYD_OK);
  retryd_step_t step;
  retryd_attempt_result_t failed;
  retryd_attempt_result_init(&failed);
  failed.status = 503;
  EXPECT_EQ(retryd_steps_report(call, &failed, 0, &step), RETRYD_EINVAL);  // nothing admitted
  EXPECT_EQ(retryd_steps_admit(nullptr, &step), RETRYD_EINVAL);
  EXPECT_EQ(retryd_steps_admit(call, nullptr), RETRYD_EINVAL);
  ASSERT_EQ(retryd_steps_admit(call, &step), RETRYD_STEP_ATTEMPT);
  EXPECT_EQ(step.attempt, 0u);
  EXPECT_EQ(step.remaining_ms, RETRYD_NO_TIMEOUT);
  EXPECT_EQ(retryd_steps_admit(call, &step), RETRYD_EINVAL);  // the attempt awaits its report
  EXPECT_EQ(retryd_steps_report(call, &failed, 0, nullptr), RETRYD_EINVAL);
  ASSERT_EQ(retryd_steps_report(call, &failed, 0, &step), RETRYD_STEP_WAIT);
  EXPECT_EQ(step.record.next, RETRYD_STOP_NONE);
  EXPECT_EQ(retryd_steps_report(call, &failed, 0, &step), RETRYD_EINVAL);  // reported once
  ASSERT_EQ(retryd_steps_admit(call, &step), RETRYD_STEP_ATTEMPT);
  EXPECT_EQ(step.attempt, 1u);
  // A NULL result is an attempt that reported nothing: no response, a failure.
  ASSERT_EQ(retryd_steps_report(call, nullptr, 0, &step), RETRYD_STEP_STOP);
  EXPECT_EQ(step.record.status, 0);
  // Once ended, a call stays ended; cancelling it changes nothing.
  EXPECT_EQ(retryd_steps_admit(call, &step), RETRYD_STEP_STOP);
  EXPECT_EQ(retryd_steps_report(call, &failed, 0, &step), RETRYD_EINVAL);
  retryd_steps_cancel(call, RETRYD_IGNORED);
  retryd_call_result_t res;
  retryd_steps_end(call, &res);
  EXPECT_EQ(res.stop, RETRYD_STOP_ATTEMPTS_EXHAUSTED);
  EXPECT_EQ(res.attempts, 2u);
  retryd_steps_end(nullptr, &res);
  retryd_steps_cancel(nullptr, RETRYD_IGNORED);
}

TEST(RetryStepsCTest, ACancelledWaitEndsTheCall) {
  StepsFixture f;
  retryd_steps_t* call = nullptr;
  ASSERT_EQ(retryd_steps_begin(f.client, f.dep, nullptr, nullptr, &call), RETRYD_OK);
  retryd_step_t step;
  ASSERT_EQ(retryd_steps_admit(call, &step), RETRYD_STEP_ATTEMPT);
  retryd_attempt_result_t failed;
  retryd_attempt_result_init(&failed);
  failed.error_kind = RETRYD_ERROR_CONNECT_REFUSED;
  ASSERT_EQ(retryd_steps_report(call, &failed, 0, &step), RETRYD_STEP_WAIT);
  retryd_steps_cancel(call, RETRYD_IGNORED);
  EXPECT_EQ(retryd_steps_admit(call, &step), RETRYD_STEP_STOP);
  EXPECT_FALSE(step.has_record);
  retryd_call_result_t res;
  retryd_steps_end(call, &res);
  EXPECT_EQ(res.stop, RETRYD_STOP_CANCELLED);
  EXPECT_EQ(res.attempts, 1u);
  EXPECT_EQ(res.last_error_kind, RETRYD_ERROR_CONNECT_REFUSED);
}

// Calls in steps on many threads at once, on one client, each its own: every admitted attempt
// is reported once (no bulkhead lease is left behind) and only the budget refuses retries.
TEST(RetryStepsCTest, ManyThreadsDriveTheirOwnCallsOnOneClient) {
  constexpr int kThreads = 4, kCalls = 300;
  shm::Policy p;
  p.bulkhead_limit = kThreads;  // one attempt in flight per thread: never full, unless leaked
  p.min_calls = 1'000'000;      // the breaker never trips
  StepsFixture f(p);
  std::vector<std::thread> threads;
  std::vector<retryd_call_result_t> results(kThreads * kCalls);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      retryd_call_policy_t policy;
      retryd_call_policy_init(&policy);
      policy.backoff_base_ms = 0;
      policy.backoff_cap_ms = 0;
      for (int i = 0; i < kCalls; ++i) {
        retryd_steps_t* call = nullptr;
        if (retryd_steps_begin(f.client, f.dep, &policy, nullptr, &call) != RETRYD_OK) return;
        retryd_step_t step;
        while (retryd_steps_admit(call, &step) == RETRYD_STEP_ATTEMPT) {
          retryd_attempt_result_t out;
          retryd_attempt_result_init(&out);
          out.status = (i + int(step.attempt)) % 3 == 0 ? 200 : 503;
          if (retryd_steps_report(call, &out, 0, &step) == RETRYD_STEP_STOP) break;
        }
        retryd_steps_end(call, &results[size_t(t * kCalls + i)]);
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& r : results) {
    if (r.stop == RETRYD_STOP_REJECTED) {
      EXPECT_EQ(r.rejection, RETRYD_REJECTED_BUDGET_EMPTY);
    } else {
      EXPECT_TRUE(r.stop == RETRYD_STOP_SUCCESS || r.stop == RETRYD_STOP_ATTEMPTS_EXHAUSTED)
          << r.stop;
    }
  }
  retryd_permit_t held[kThreads];
  for (auto& permit : held) EXPECT_EQ(retryd_admit(f.client, f.dep, 0, &permit), RETRYD_ADMITTED);
  for (auto& permit : held) retryd_complete(f.client, &permit, RETRYD_SUCCESS, 1);
}

}  // namespace
}  // namespace retryd
