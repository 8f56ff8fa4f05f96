// Storms against retryd_steps_* (retryd_call.h) against real segments:
//   - a differential fuzz: thousands of random policies and scripts (statuses, transport errors,
//     Retry-After as header, date or value, overrides valid and not, aborts, cancelled waits,
//     a custom classifier, deadlines, attempt timeouts) made once by retryd_call and once in
//     steps, on virtual time with the same random source: every wait, timeout, record and
//     result must be equal;
//   - a misuse storm: threads driving several calls each, taking random steps in and out of
//     turn, reporting twice, cancelling with any outcome, ending mid-attempt, NULL arguments,
//     while the breaker trips and half-opens over and over: every admitted attempt is completed
//     exactly once (the segment's completion counters equal the admissions counted here), no
//     bulkhead or probe lease is left, no bulkhead refusal happens (the limit is what can be in
//     flight), and the budget grants no more than burst + ratio x first attempts;
//   - a cancelled probe, at each point it can be cancelled, goes back unjudged, again and again,
//     with one and with two probes allowed.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "retryd/retryd_call.h"
#include "shm/stripes.h"
#include "tests/sanitized.h"
#include "tests/shm/test_util.h"

namespace retryd {
namespace {

struct Fixture {
  testing::NamedSegment seg{"stepsadv"};
  retryd_client_t* client = nullptr;
  retryd_dependency_t dep = -1;
  uint32_t index = 0;
  explicit Fixture(const shm::Policy& p = {}) {
    index = testing::AddDependency(*seg.seg, "dep", p);
    retryd_options_t opt{seg.name.c_str(), 0};
    if (retryd_open(&opt, &client) != RETRYD_OK) throw std::runtime_error(retryd_last_error());
    if (retryd_resolve(client, "dep", &dep) != RETRYD_OK) {
      throw std::runtime_error(retryd_last_error());
    }
  }
  ~Fixture() { retryd_close(client); }
  shm::DependencySlot& slot() const { return *seg.seg->dependency(index); }
  uint64_t counter(shm::Counter c) const { return shm::ReadCounter(slot(), c); }
};

// ---------------------------------------------------------------------------------------------
// Differential fuzz.

struct AttemptScript {
  int status = 0;
  int error_kind = RETRYD_ERROR_NONE;
  int64_t retry_after_ms = -1;
  const char* retry_after = nullptr;
  const char* date = nullptr;
  int attempt_class = -1;
  int breaker_outcome = -1;
  int abort = 0;
  int64_t latency_ns = 0;
};

struct Case {
  retryd_call_policy_t policy;
  std::vector<AttemptScript> attempts;
  int cancel_wait_at = -1;  // the sleep (0-based) that is interrupted
  uint64_t seed = 0;
  bool custom_classifier = false;
};

struct World {
  const Case* c;
  int64_t now_ns = 1'000'000'000'000;
  uint64_t rng;
  int sleeps = 0;
  std::vector<int64_t> waits;
  std::vector<int64_t> remaining;
  std::vector<uint32_t> numbers;
  std::vector<retryd_attempt_info_t> records;
  retryd_call_result_t result{};
  explicit World(const Case* k) : c(k), rng(k->seed) {}
};

uint64_t SplitMix(uint64_t* s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

retryd_call_env_t EnvOf(World* w) {
  retryd_call_env_t env{};
  env.ctx = w;
  env.now_ns = [](void* c) { return static_cast<World*>(c)->now_ns; };
  env.sleep_ns = [](void* c, int64_t ns) {
    auto* w = static_cast<World*>(c);
    w->waits.push_back(ns);
    w->now_ns += ns;
    return w->sleeps++ == w->c->cancel_wait_at ? 1 : 0;
  };
  env.random = [](void* c) { return SplitMix(&static_cast<World*>(c)->rng); };
  env.wall_now_ms = [](void*) { return int64_t(1'700'000'000'000); };
  return env;
}

int Send(World* w, uint32_t n, int64_t remaining_ms, retryd_attempt_result_t* out) {
  w->numbers.push_back(n);
  w->remaining.push_back(remaining_ms);
  const AttemptScript& a = w->c->attempts[std::min<size_t>(n, w->c->attempts.size() - 1)];
  w->now_ns += a.latency_ns;
  out->status = a.status;
  out->error_kind = a.error_kind;
  out->retry_after_ms = a.retry_after_ms;
  out->retry_after = a.retry_after;
  out->date = a.date;
  out->attempt_class = a.attempt_class;
  out->breaker_outcome = a.breaker_outcome;
  return a.abort;
}

void RunAtOnce(const Fixture& f, World* w) {
  retryd_call_env_t env = EnvOf(w);
  ASSERT_EQ(retryd_call(
                f.client, f.dep, &w->c->policy,
                [](void* ctx, uint32_t n, int64_t rem, retryd_attempt_result_t* out) {
                  return Send(static_cast<World*>(ctx), n, rem, out);
                },
                w,
                [](void* ctx, const retryd_attempt_info_t* info) {
                  static_cast<World*>(ctx)->records.push_back(*info);
                },
                w, &env, &w->result),
            RETRYD_OK);
}

void RunInSteps(const Fixture& f, World* w) {
  retryd_call_env_t env = EnvOf(w);
  env.sleep_ns = nullptr;
  retryd_steps_t* call = nullptr;
  ASSERT_EQ(retryd_steps_begin(f.client, f.dep, &w->c->policy, &env, &call), RETRYD_OK);
  retryd_step_t step;
  int next;
  while ((next = retryd_steps_admit(call, &step)) == RETRYD_STEP_ATTEMPT) {
    retryd_attempt_result_t out;
    retryd_attempt_result_init(&out);
    const int abort = Send(w, step.attempt, step.remaining_ms, &out);
    next = retryd_steps_report(call, &out, abort, &step);
    ASSERT_TRUE(step.has_record);
    w->records.push_back(step.record);
    if (next == RETRYD_STEP_STOP) break;
    ASSERT_EQ(next, RETRYD_STEP_WAIT);
    ASSERT_EQ(step.wait_ns, step.record.wait_ns);
    w->waits.push_back(step.wait_ns);
    w->now_ns += step.wait_ns;
    if (w->sleeps++ == w->c->cancel_wait_at) retryd_steps_cancel(call, RETRYD_IGNORED);
  }
  if (next == RETRYD_STEP_STOP && step.has_record && step.record.next == RETRYD_STOP_REJECTED) {
    w->records.push_back(step.record);
  }
  retryd_steps_end(call, &w->result);
}

Case RandomCase(std::mt19937_64& g, const retryd_classifier* classifier) {
  auto pick = [&](int lo, int hi) { return int(std::uniform_int_distribution<int>(lo, hi)(g)); };
  Case c;
  retryd_call_policy_init(&c.policy);
  c.seed = g();
  c.policy.max_attempts = uint32_t(pick(0, 6));
  c.policy.jitter = pick(0, 3);
  c.policy.backoff_base_ms = pick(0, 3) == 0 ? 0 : pick(1, 400);
  c.policy.backoff_cap_ms = pick(0, 3) == 0 ? 0 : pick(1, 3000);
  c.policy.retry_after_jitter_max_ms = pick(0, 200);
  c.policy.retry_after_max_ms = pick(0, 4) == 0 ? 0 : pick(1, 5000);
  c.policy.deadline_ms = pick(0, 2) == 0 ? -1 : pick(0, 6000);
  c.policy.attempt_timeout_ms = pick(0, 2) == 0 ? -1 : pick(0, 3000);
  c.policy.expected_attempt_ms = pick(0, 2) == 0 ? 0 : pick(1, 800);
  static const char* const methods[] = {nullptr, "GET", "POST", "PATCH", "PUT", "get"};
  c.policy.method = methods[pick(0, 5)];
  c.policy.has_idempotency_key = pick(0, 1);
  if (pick(0, 4) == 0) {
    c.policy.classifier = classifier;
    c.custom_classifier = true;
  }
  c.cancel_wait_at = pick(0, 3) == 0 ? pick(0, 4) : -1;
  static const int statuses[] = {0, 200, 201, 204, 400, 404, 408, 409, 429, 500, 502, 503, 504,
                                 1000, -1, 99};
  static const char* const retry_afters[] = {"0", "1", "2", "120", "-1", "abc", "2.5", "",
                                             "Tue, 14 Nov 2023 22:13:22 GMT",
                                             "Tue, 14 Nov 2023 22:13:25 GMT", "  3  ", "99999999999999999999"};
  static const char* const dates[] = {nullptr, "Tue, 14 Nov 2023 22:13:20 GMT", "garbage"};
  const int n = pick(1, 7);
  for (int i = 0; i < n; ++i) {
    AttemptScript a;
    a.status = statuses[pick(0, 15)];
    if (pick(0, 3) == 0) a.error_kind = pick(-1, 8);
    switch (pick(0, 4)) {
      case 0: a.retry_after_ms = pick(0, 3) == 0 ? int64_t(1) << 62 : pick(0, 4000); break;
      case 1: a.retry_after = retry_afters[pick(0, 11)]; a.date = dates[pick(0, 2)]; break;
      default: break;
    }
    if (pick(0, 5) == 0) {
      a.attempt_class = pick(-1, 3);
      a.breaker_outcome = pick(-1, 3);
    }
    a.abort = pick(0, 12) == 0 ? 1 : 0;
    a.latency_ns = int64_t(pick(0, 1500)) * 1'000'000 + pick(0, 999);
    c.attempts.push_back(a);
  }
  return c;
}

void ExpectSame(const World& a, const World& b) {
  EXPECT_EQ(a.numbers, b.numbers);
  EXPECT_EQ(a.waits, b.waits);
  EXPECT_EQ(a.remaining, b.remaining);
  EXPECT_EQ(a.now_ns, b.now_ns);
  ASSERT_EQ(a.records.size(), b.records.size());
  for (size_t i = 0; i < a.records.size(); ++i) {
    SCOPED_TRACE(i);
    const auto& x = a.records[i];
    const auto& y = b.records[i];
    EXPECT_EQ(x.attempt, y.attempt);
    EXPECT_EQ(x.decision, y.decision);
    EXPECT_EQ(x.attempt_class, y.attempt_class);
    EXPECT_EQ(x.breaker_outcome, y.breaker_outcome);
    EXPECT_EQ(x.status, y.status);
    EXPECT_EQ(x.error_kind, y.error_kind);
    EXPECT_EQ(x.latency_ns, y.latency_ns);
    EXPECT_EQ(x.retry_after_ns, y.retry_after_ns);
    EXPECT_EQ(x.wait_ns, y.wait_ns);
    EXPECT_EQ(x.next, y.next);
  }
  EXPECT_EQ(a.result.stop, b.result.stop);
  EXPECT_EQ(a.result.final_class, b.result.final_class);
  EXPECT_EQ(a.result.attempts, b.result.attempts);
  EXPECT_EQ(a.result.last_status, b.result.last_status);
  EXPECT_EQ(a.result.last_error_kind, b.result.last_error_kind);
  EXPECT_EQ(a.result.rejection, b.result.rejection);
  EXPECT_EQ(a.result.elapsed_ns, b.result.elapsed_ns);
}

TEST(RetryStepsStormTest, RandomCallsInStepsEqualRetrydCall) {
  constexpr int kCases = Rounds(1000);
  retryd_classifier* classifier = retryd_classifier_new();
  ASSERT_NE(classifier, nullptr);
  retryd_classifier_set_status(classifier, 409, RETRYD_ATTEMPT_RETRYABLE,
                               RETRYD_BREAKER_OUTCOME_IGNORED, 1);
  retryd_classifier_set_status(classifier, 503, RETRYD_ATTEMPT_TERMINAL,
                               RETRYD_BREAKER_OUTCOME_FAILURE, 0);
  retryd_classifier_set_error(classifier, RETRYD_ERROR_TIMEOUT, RETRYD_ATTEMPT_RETRYABLE,
                              RETRYD_BREAKER_OUTCOME_FAILURE, 1);
  std::mt19937_64 g(20240611);
  shm::Policy p;
  p.min_calls = 1'000'000;  // the breaker never trips: both calls see the same host
  shm::Policy tight = p;    // a budget of one retry: the second is refused
  tight.retry_ratio_milli = 0;
  tight.min_retries_per_sec = 0;
  tight.retry_burst = 1;
  int differing = 0;
  std::vector<int> stops(9, 0);
  for (int i = 0; i < kCases && differing < 5; ++i) {
    const Case c = RandomCase(g, classifier);
    const shm::Policy& host = i % 4 == 3 ? tight : p;
    Fixture fa(host), fb(host);
    World a(&c), b(&c);
    RunAtOnce(fa, &a);
    RunInSteps(fb, &b);
    const int failures_before = ::testing::UnitTest::GetInstance()->current_test_info()->result()
                                    ->total_part_count();
    {
      SCOPED_TRACE("case " + std::to_string(i));
      ExpectSame(a, b);
    }
    if (::testing::UnitTest::GetInstance()->current_test_info()->result()->total_part_count() !=
        failures_before) {
      ++differing;
    }
    if (a.result.stop >= 0 && a.result.stop < 9) ++stops[size_t(a.result.stop)];
  }
  retryd_classifier_free(classifier);
  std::string mix;
  for (int s = 0; s < 9; ++s) mix += std::string(retryd_stop_name(s)) + "=" + std::to_string(stops[s]) + " ";
  std::printf("stop reasons over %d cases: %s\n", kCases, mix.c_str());
}

// ---------------------------------------------------------------------------------------------
// Misuse storm.

shm::Policy Flapping(uint32_t bulkhead, uint32_t probes) {
  shm::Policy p;
  p.min_calls = 30;
  p.failure_rate_pct = 70;
  p.window_ms = 100;
  p.window_buckets = 2;
  p.open_for_ms = 1;
  p.open_for_max_ms = 2;
  p.open_jitter_ms = 0;
  p.half_open_probes = probes;
  p.probe_timeout_ms = 60'000;     // no expiry hides a probe left behind
  p.bulkhead_timeout_ms = 60'000;  // nor a bulkhead lease left behind
  p.close_after = 1;
  p.bulkhead_limit = bulkhead;
  p.retry_ratio_milli = 200;
  p.min_retries_per_sec = 0;
  p.retry_burst = 5;
  return p;
}

void ExpectNoLeaseLeft(const Fixture& f) {
  for (uint32_t i = 0; i < shm::kMaxBulkhead; ++i) {
    EXPECT_EQ(f.slot().bulkhead_leases[i].load(), 0u) << "bulkhead lease " << i << " left";
  }
  for (uint32_t i = 0; i < shm::kMaxProbes; ++i) {
    EXPECT_EQ(f.slot().probe_leases[i].load(), 0u) << "probe lease " << i << " left";
  }
}

// The storm runs with calls of no deadline, and with calls of 4 ms whose attempts have 2 ms,
// most of which reach a half-open without the time a probe needs and must leave it alone.
class MisuseStormTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(MisuseStormTest, AMisuseStormLeavesNoLeaseAndCompletesEveryAttemptOnce) {
  constexpr int kThreads = 4, kCallsPerThread = 1'000'000, kLive = 3;
  Fixture f(Flapping(kThreads * kLive, 2));
  std::atomic<uint64_t> calls{0}, admitted{0}, attempts_reported{0}, einval{0}, probes{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 g(uint64_t(t) * 7919 + 17);
      auto pick = [&](int lo, int hi) { return int(std::uniform_int_distribution<int>(lo, hi)(g)); };
      retryd_call_policy_t policy;
      retryd_call_policy_init(&policy);
      policy.backoff_base_ms = 0;
      policy.backoff_cap_ms = 0;
      policy.max_attempts = 4;
      if (GetParam() > 0) {
        policy.deadline_ms = GetParam();
        policy.attempt_timeout_ms = GetParam() / 2;
      }
      std::vector<retryd_steps_t*> live;
      int begun = 0, actions = 0;
      const auto stop_at = std::chrono::steady_clock::now() +
                           std::chrono::nanoseconds(StressNs(1'000'000'000));
      while (begun < kCallsPerThread || !live.empty()) {
        if (begun < kCallsPerThread && std::chrono::steady_clock::now() >= stop_at) {
          begun = kCallsPerThread;  // time is up: finish the calls in hand
        }
        // Let the segment's coarse (ms) clock move, so that the breaker opens, half-opens and
        // closes many times during the storm.
        if (++actions % 8 == 0) usleep(50);
        if (begun < kCallsPerThread && (live.size() < size_t(kLive)) && pick(0, 2) == 0) {
          retryd_steps_t* call = nullptr;
          if (retryd_steps_begin(f.client, f.dep, &policy, nullptr, &call) == RETRYD_OK) {
            live.push_back(call);
            calls.fetch_add(1);
          }
          ++begun;
          continue;
        }
        if (live.empty()) continue;
        const size_t k = size_t(pick(0, int(live.size()) - 1));
        retryd_steps_t* call = live[k];
        retryd_step_t step;
        retryd_attempt_result_t out;
        retryd_attempt_result_init(&out);
        static const int statuses[] = {200, 200, 200, 503, 404, 0};
        out.status = statuses[pick(0, 5)];
        if (pick(0, 6) == 0) out.error_kind = RETRYD_ERROR_TIMEOUT;
        int rc = 0;
        switch (pick(0, 11)) {
          case 0: case 1: case 2: case 3:
            rc = retryd_steps_admit(call, &step);
            if (rc == RETRYD_STEP_ATTEMPT) {
              admitted.fetch_add(1);
              if (step.probe) probes.fetch_add(1);
            }
            break;
          case 4: case 5: case 6:
            rc = retryd_steps_report(call, pick(0, 5) == 0 ? nullptr : &out, pick(0, 20) == 0,
                                     &step);
            if (rc == RETRYD_STEP_WAIT || rc == RETRYD_STEP_STOP) attempts_reported.fetch_add(1);
            break;
          case 7:
            rc = retryd_steps_report(call, &out, 0, nullptr);  // NULL step: refused
            break;
          case 8:
            rc = retryd_steps_admit(call, nullptr);
            break;
          case 9:
            retryd_steps_cancel(call, pick(-2, 4));  // any outcome, valid or not
            break;
          case 10: case 11: {
            retryd_call_result_t res;
            retryd_steps_end(call, pick(0, 1) ? &res : nullptr);
            live.erase(live.begin() + long(k));
            break;
          }
        }
        if (rc == RETRYD_EINVAL) einval.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();

  const uint64_t completed = f.counter(shm::kSuccesses) + f.counter(shm::kFailures) +
                             f.counter(shm::kIgnored);
  const uint64_t first = f.counter(shm::kFirstAttempts);
  const uint64_t granted = f.counter(shm::kRetriesGranted);
  std::printf("calls begun %llu, admitted %llu (probes %llu, %llu in the segment), reported %llu, "
              "completed %llu, einval %llu, first %llu, retries granted %llu, denied %llu, "
              "opened %llu, half-opened %llu, closed %llu, half-open busy %llu, bulkhead full "
              "%llu\n",
              (unsigned long long)calls.load(), (unsigned long long)admitted.load(),
              (unsigned long long)probes.load(),
              (unsigned long long)f.counter(shm::kProbesGranted),
              (unsigned long long)attempts_reported.load(), (unsigned long long)completed,
              (unsigned long long)einval.load(), (unsigned long long)first,
              (unsigned long long)granted, (unsigned long long)f.counter(shm::kRetriesDenied),
              (unsigned long long)f.counter(shm::kOpened),
              (unsigned long long)f.counter(shm::kHalfOpened),
              (unsigned long long)f.counter(shm::kClosed),
              (unsigned long long)f.counter(shm::kRejectedHalfOpenBusy),
              (unsigned long long)f.counter(shm::kRejectedBulkheadFull));
  EXPECT_EQ(completed, admitted.load()) << "an admitted attempt completed zero or two times";
  EXPECT_EQ(f.counter(shm::kRejectedBulkheadFull), 0u) << "a bulkhead lease was leaked";
  EXPECT_EQ(f.counter(shm::kProbesGranted), probes.load());
  // The budget: at most burst + ratio x first attempts (no floor refill: min_retries_per_sec 0).
  EXPECT_LE(granted, 5 + first * 200 / 1000 + 1) << "the budget was over-granted";
  EXPECT_GT(f.counter(shm::kHalfOpened), 10u) << "the storm did not exercise half-open";
  ExpectNoLeaseLeft(f);
}

INSTANTIATE_TEST_SUITE_P(Deadlines, MisuseStormTest, ::testing::Values(int64_t{-1}, int64_t{4}),
                         [](const ::testing::TestParamInfo<int64_t>& info) {
                           return info.param < 0 ? std::string("NoDeadline")
                                                 : "Deadline" + std::to_string(info.param) + "ms";
                         });

// ---------------------------------------------------------------------------------------------
// A cancelled probe goes back unjudged, at every point it can be cancelled.

retryd_steps_t* AdmitProbe(const Fixture& f, int max_tries = 2000) {
  for (int i = 0; i < max_tries; ++i) {
    retryd_steps_t* call = nullptr;
    if (retryd_steps_begin(f.client, f.dep, nullptr, nullptr, &call) != RETRYD_OK) return nullptr;
    retryd_step_t step;
    if (retryd_steps_admit(call, &step) == RETRYD_STEP_ATTEMPT) {
      if (step.probe) return call;
      retryd_steps_cancel(call, RETRYD_IGNORED);  // closed: not a probe
    }
    retryd_steps_end(call, nullptr);
    usleep(1'000);
  }
  return nullptr;
}

TEST(RetryStepsStormTest, ACancelledProbeGoesBackUnjudgedEveryTime) {
  for (uint32_t probes : {1u, 2u}) {
    SCOPED_TRACE("half_open_probes " + std::to_string(probes));
    shm::Policy p = Flapping(0, probes);
    p.min_calls = 1;
    p.close_after = 1;
    Fixture f(p);
    retryd_permit_t permit;
    ASSERT_EQ(retryd_admit(f.client, f.dep, 0, &permit), RETRYD_ADMITTED);
    retryd_complete(f.client, &permit, RETRYD_FAILURE, 1);
    ASSERT_EQ(retryd_breaker_state(f.client, f.dep), RETRYD_STATE_OPEN);
    constexpr int kRounds = Rounds(150);
    for (int round = 0; round < kRounds; ++round) {
      SCOPED_TRACE(round);
      std::vector<retryd_steps_t*> held;
      for (uint32_t i = 0; i < probes; ++i) {
        retryd_steps_t* c = AdmitProbe(f);
        ASSERT_NE(c, nullptr) << "no probe admitted: one was not given back";
        held.push_back(c);
      }
      // Every probe is out: the next caller is refused half-open busy.
      retryd_permit_t other;
      EXPECT_EQ(retryd_admit(f.client, f.dep, 0, &other), RETRYD_REJECTED_HALF_OPEN_BUSY);
      retryd_complete(f.client, &other, RETRYD_IGNORED, 0);
      for (retryd_steps_t* c : held) {
        retryd_call_result_t res;
        switch (round % 3) {
          case 0: retryd_steps_cancel(c, RETRYD_IGNORED); retryd_steps_end(c, &res); break;
          case 1:  // cancelled twice, the second time with a failure: the first one counts
            retryd_steps_cancel(c, RETRYD_IGNORED);
            retryd_steps_cancel(c, RETRYD_FAILURE);
            retryd_steps_end(c, &res);
            break;
          default: {  // a report out of turn first, then the cancel
            retryd_step_t step;
            EXPECT_EQ(retryd_steps_admit(c, &step), RETRYD_EINVAL);
            retryd_steps_cancel(c, RETRYD_IGNORED);
            EXPECT_EQ(retryd_steps_report(c, nullptr, 0, &step), RETRYD_EINVAL);
            retryd_steps_end(c, &res);
          }
        }
        EXPECT_EQ(res.stop, RETRYD_STOP_CANCELLED);
        EXPECT_EQ(res.attempts, 0u);
      }
      ASSERT_EQ(retryd_breaker_state(f.client, f.dep), RETRYD_STATE_HALF_OPEN)
          << "a cancelled probe was judged";
    }
    EXPECT_EQ(f.counter(shm::kOpened), 1u);
    EXPECT_EQ(f.counter(shm::kFailures), 1u);
    ExpectNoLeaseLeft(f);
  }
}

}  // namespace
}  // namespace retryd
