// The C ABI's retry loop (retryd_call.h, client/src/c_call.cc) against real segments, on
// virtual time: the environment's clock and sleep are fakes that only move a number.
// The C++ retry loop (call.h) is tested in call_test.cc.
#include "retryd/retryd_call.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include <gtest/gtest.h>

#include "tests/shm/test_util.h"

namespace retryd {
namespace {

struct CWorld {
  int64_t now_ns = 1'000'000'000'000;
  std::vector<int64_t> sleeps;
  std::vector<retryd_attempt_info_t> infos;
  std::vector<int> statuses;
  std::vector<int64_t> remaining;
  const char* retry_after = nullptr;
  int abort_at = -1;
  int override_class = -1;
};

int CAttempt(void* ctx, uint32_t attempt, int64_t remaining_ms, retryd_attempt_result_t* out) {
  auto* w = static_cast<CWorld*>(ctx);
  w->remaining.push_back(remaining_ms);
  w->now_ns += 2'000'000;
  out->status = w->statuses[std::min<size_t>(attempt, w->statuses.size() - 1)];
  out->retry_after = w->retry_after;
  if (w->override_class >= 0) {
    out->attempt_class = w->override_class;
    out->breaker_outcome = RETRYD_BREAKER_OUTCOME_IGNORED;
  }
  return int(attempt) == w->abort_at ? 1 : 0;
}

void CObserve(void* ctx, const retryd_attempt_info_t* info) {
  static_cast<CWorld*>(ctx)->infos.push_back(*info);
}

retryd_call_env_t CEnv(CWorld* w) {
  retryd_call_env_t env{};
  env.ctx = w;
  env.now_ns = [](void* c) { return static_cast<CWorld*>(c)->now_ns; };
  env.sleep_ns = [](void* c, int64_t ns) {
    auto* w = static_cast<CWorld*>(c);
    w->sleeps.push_back(ns);
    w->now_ns += ns;
    return 0;
  };
  env.random = [](void*) { return uint64_t(0x8000000000000000ull); };
  return env;
}

struct CFixture {
  testing::NamedSegment seg{"ccall"};
  retryd_client_t* client = nullptr;
  retryd_dependency_t dep = -1;
  explicit CFixture(const shm::Policy& p = {}) {
    testing::AddDependency(*seg.seg, "dep", p);
    retryd_options_t opt{seg.name.c_str(), 0};
    if (retryd_open(&opt, &client) != RETRYD_OK) throw std::runtime_error(retryd_last_error());
    if (retryd_resolve(client, "dep", &dep) != RETRYD_OK) throw std::runtime_error(retryd_last_error());
  }
  ~CFixture() { retryd_close(client); }
};

TEST(RetryCallCTest, RetriesWithVirtualTimeAndObserves) {
  CFixture f;
  CWorld w;
  w.statuses = {503, 503, 200};
  w.retry_after = "1";
  retryd_call_policy_t policy;
  retryd_call_policy_init(&policy);
  policy.max_attempts = 4;
  policy.deadline_ms = 5000;
  policy.retry_after_jitter_max_ms = 0;
  retryd_call_env_t env = CEnv(&w);
  retryd_call_result_t res;
  ASSERT_EQ(retryd_call(f.client, f.dep, &policy, CAttempt, &w, CObserve, &w, &env, &res), RETRYD_OK);
  EXPECT_EQ(res.stop, RETRYD_STOP_SUCCESS);
  EXPECT_EQ(res.attempts, 3u);
  EXPECT_EQ(res.last_status, 200);
  EXPECT_EQ(res.final_class, RETRYD_ATTEMPT_SUCCESS);
  EXPECT_EQ(res.rejection, RETRYD_ADMITTED);
  ASSERT_EQ(w.sleeps.size(), 2u);
  EXPECT_EQ(w.sleeps[0], 1'000'000'000);  // Retry-After 1 s beats a backoff of at most 100 ms
  EXPECT_EQ(res.elapsed_ns, 6'000'000 + 2'000'000'000);
  ASSERT_EQ(w.remaining.size(), 3u);
  EXPECT_EQ(w.remaining[0], 5000);
  EXPECT_EQ(w.remaining[1], 5000 - 1002);
  ASSERT_EQ(w.infos.size(), 3u);
  EXPECT_EQ(w.infos[0].status, 503);
  EXPECT_EQ(w.infos[0].attempt_class, RETRYD_ATTEMPT_RETRYABLE);
  EXPECT_EQ(w.infos[0].retry_after_ns, 1'000'000'000);
  EXPECT_EQ(w.infos[0].wait_ns, 1'000'000'000);
  EXPECT_EQ(w.infos[0].next, RETRYD_STOP_NONE);
  EXPECT_EQ(w.infos[0].latency_ns, 2'000'000);
  EXPECT_EQ(w.infos[2].next, RETRYD_STOP_SUCCESS);
}

TEST(RetryCallCTest, RejectionAndFallback) {
  shm::Policy p;
  p.mode = shm::Mode::kForcedOpen;
  CFixture f(p);
  CWorld w;
  w.statuses = {200};
  retryd_call_env_t env = CEnv(&w);
  retryd_call_result_t res;
  ASSERT_EQ(retryd_call(f.client, f.dep, nullptr, CAttempt, &w, CObserve, &w, &env, &res), RETRYD_OK);
  EXPECT_EQ(res.stop, RETRYD_STOP_REJECTED);
  EXPECT_EQ(res.rejection, RETRYD_REJECTED_OPEN);
  EXPECT_EQ(res.attempts, 0u);
  EXPECT_TRUE(w.remaining.empty());
  ASSERT_EQ(w.infos.size(), 1u);
  EXPECT_EQ(w.infos[0].decision, RETRYD_REJECTED_OPEN);
}

// What every binding's `call` runs: a retry with less time left than a fresh call's attempt,
// admitted while the breaker is half-open, does not take the probe and is refused as busy.
TEST(RetryCallCTest, ARetryShortOfTimeLeavesTheHalfOpensProbe) {
  shm::Policy p;
  p.min_calls = 1;
  p.open_for_ms = 1;
  p.open_for_max_ms = 1;
  p.open_jitter_ms = 0;
  p.half_open_probes = 1;
  p.close_after = 1;
  CFixture f(p);
  CWorld w;
  w.statuses = {503};
  retryd_call_policy_t policy;
  retryd_call_policy_init(&policy);
  policy.deadline_ms = 2000;
  policy.attempt_timeout_ms = 1000;
  policy.expected_attempt_ms = 10;
  policy.backoff_base_ms = 1;
  policy.backoff_cap_ms = 1;
  retryd_call_env_t env = CEnv(&w);
  env.sleep_ns = [](void* c, int64_t ns) {
    static_cast<CWorld*>(c)->now_ns += ns;
    usleep(20'000);  // the breaker's open period passes on the segment's real clock
    return 0;
  };
  // The first attempt fails after 1.5 s and opens the breaker (CAttempt adds the last 2 ms).
  auto attempt = [](void* ctx, uint32_t a, int64_t remaining_ms, retryd_attempt_result_t* out) {
    static_cast<CWorld*>(ctx)->now_ns += 1'498'000'000;
    return CAttempt(ctx, a, remaining_ms, out);
  };
  retryd_call_result_t res;
  ASSERT_EQ(retryd_call(f.client, f.dep, &policy, attempt, &w, CObserve, &w, &env, &res),
            RETRYD_OK);
  EXPECT_EQ(res.stop, RETRYD_STOP_REJECTED);
  EXPECT_EQ(res.rejection, RETRYD_REJECTED_HALF_OPEN_BUSY);
  EXPECT_EQ(res.attempts, 1u);
  ASSERT_EQ(w.infos.size(), 2u);
  EXPECT_EQ(w.infos[1].decision, RETRYD_REJECTED_HALF_OPEN_BUSY);
  // The probe is free: the next caller takes it.
  retryd_permit_t probe;
  EXPECT_EQ(retryd_admit(f.client, f.dep, 0, &probe), RETRYD_ADMITTED_PROBE);
  retryd_complete(f.client, &probe, RETRYD_SUCCESS, 1'000'000);
}

TEST(RetryCallCTest, ClassifierOverrideAndAbort) {
  CFixture f;
  CWorld w;
  w.statuses = {409, 200};
  retryd_classifier* table = retryd_classifier_new();
  ASSERT_NE(table, nullptr);
  ASSERT_EQ(retryd_classifier_set_status(table, 409, RETRYD_ATTEMPT_RETRYABLE,
                                         RETRYD_BREAKER_OUTCOME_IGNORED, 1),
            RETRYD_POLICY_OK);
  retryd_call_policy_t policy;
  retryd_call_policy_init(&policy);
  policy.classifier = table;
  policy.method = "POST";
  retryd_call_env_t env = CEnv(&w);
  retryd_call_result_t res;
  ASSERT_EQ(retryd_call(f.client, f.dep, &policy, CAttempt, &w, nullptr, nullptr, &env, &res), RETRYD_OK);
  EXPECT_EQ(res.stop, RETRYD_STOP_SUCCESS);
  EXPECT_EQ(res.attempts, 2u);
  // Without the classifier a 409 is terminal.
  policy.classifier = nullptr;
  ASSERT_EQ(retryd_call(f.client, f.dep, &policy, CAttempt, &w, nullptr, nullptr, &env, &res), RETRYD_OK);
  EXPECT_EQ(res.stop, RETRYD_STOP_TERMINAL);
  // A per-attempt override wins over the table.
  w.override_class = RETRYD_ATTEMPT_RETRYABLE;
  w.statuses = {409};
  ASSERT_EQ(retryd_call(f.client, f.dep, &policy, CAttempt, &w, nullptr, nullptr, &env, &res), RETRYD_OK);
  EXPECT_EQ(res.stop, RETRYD_STOP_ATTEMPTS_EXHAUSTED);
  // A nonzero return aborts.
  w.override_class = -1;
  w.statuses = {503};
  w.abort_at = 0;
  ASSERT_EQ(retryd_call(f.client, f.dep, &policy, CAttempt, &w, nullptr, nullptr, &env, &res), RETRYD_OK);
  EXPECT_EQ(res.stop, RETRYD_STOP_ABORTED);
  EXPECT_EQ(res.attempts, 1u);
  retryd_classifier_free(table);
}

TEST(RetryCallCTest, BadArguments) {
  CFixture f;
  CWorld w;
  w.statuses = {200};
  retryd_call_result_t res;
  res.stop = -7;
  EXPECT_EQ(retryd_call(nullptr, f.dep, nullptr, CAttempt, &w, nullptr, nullptr, nullptr, &res), RETRYD_EINVAL);
  EXPECT_EQ(retryd_call(f.client, f.dep, nullptr, nullptr, &w, nullptr, nullptr, nullptr, &res), RETRYD_EINVAL);
  EXPECT_EQ(retryd_call(f.client, f.dep, nullptr, CAttempt, &w, nullptr, nullptr, nullptr, nullptr), RETRYD_EINVAL);
  retryd_call_policy_t policy;
  retryd_call_policy_init(&policy);
  policy.jitter = 9;
  EXPECT_EQ(retryd_call(f.client, f.dep, &policy, CAttempt, &w, nullptr, nullptr, nullptr, &res), RETRYD_EINVAL);
  EXPECT_EQ(res.stop, -7);
  // An unknown dependency handle sends nothing.
  EXPECT_EQ(retryd_call(f.client, 77, nullptr, CAttempt, &w, nullptr, nullptr, nullptr, &res), RETRYD_EINVAL);
  EXPECT_EQ(res.stop, RETRYD_STOP_REJECTED);
  EXPECT_TRUE(w.remaining.empty());
  // With the real clock and no env, a success still works.
  ASSERT_EQ(retryd_call(f.client, f.dep, nullptr, CAttempt, &w, nullptr, nullptr, nullptr, &res), RETRYD_OK);
  EXPECT_EQ(res.stop, RETRYD_STOP_SUCCESS);
  EXPECT_EQ(w.remaining.back(), RETRYD_NO_TIMEOUT);
}

}  // namespace
}  // namespace retryd
