// client/src/c_call.cc: the C ABI of the retry loop (retryd_call.h) over RetryLoop.
//
// The loop sees the C client through a Client adapter that calls the public retryd_admit and
// retryd_complete, and the C callbacks through std::function adapters. Nothing throws across
// the ABI: an allocation failure is RETRYD_EIO.
#include "retryd/retryd_call.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <new>
#include <optional>
#include <string>
#include <string_view>

#include "retryd/call.h"

namespace {

using std::chrono::milliseconds;
using std::chrono::nanoseconds;

// A Client over the C ABI's handle, for the loop's Admit and Complete.
class CClient final : public retryd::Client {
 public:
  explicit CClient(retryd_client_t* c) : c_(c) {}
  retryd::Status Resolve(std::string_view, retryd::Dependency*) override {
    return retryd::Status::InvalidArgument("resolve through retryd_resolve");
  }
  bool Admit(retryd::Dependency dep, uint32_t attempt, retryd::Permit* permit) override {
    const int d = retryd_admit(c_, dep.id, attempt, permit->raw());
    return d == RETRYD_ADMITTED || d == RETRYD_ADMITTED_PROBE;
  }
  void Complete(retryd::Permit* permit, retryd::Outcome outcome, nanoseconds latency) override {
    retryd_complete(c_, permit->raw(), int(outcome),
                    uint64_t(std::max<int64_t>(0, latency.count())));
  }
  bool local() const override { return retryd_is_local(c_) != 0; }
  std::string segment_name() const override { return std::string(); }

 private:
  retryd_client_t* c_;
};

class EnvClock final : public retryd::Clock {
 public:
  explicit EnvClock(const retryd_call_env_t& env) : env_(env) {}
  nanoseconds Now() const override { return nanoseconds(env_.now_ns(env_.ctx)); }

 private:
  const retryd_call_env_t& env_;
};

nanoseconds FromMs(int64_t ms) {
  if (ms > std::numeric_limits<int64_t>::max() / 1'000'000) return nanoseconds::max();
  return milliseconds(ms);
}

bool ValidOverride(int attempt_class, int breaker_outcome) {
  return attempt_class >= RETRYD_ATTEMPT_SUCCESS && attempt_class <= RETRYD_ATTEMPT_TERMINAL &&
         breaker_outcome >= RETRYD_BREAKER_OUTCOME_SUCCESS &&
         breaker_outcome <= RETRYD_BREAKER_OUTCOME_IGNORED;
}

int64_t RemainingMs(nanoseconds remaining) {
  if (remaining == nanoseconds::max()) return RETRYD_NO_TIMEOUT;
  // Never 0: many clients read a zero timeout as "none". Rounds down otherwise, so that the
  // downstream never believes it has more time than the caller.
  return std::max<int64_t>(1, std::chrono::duration_cast<milliseconds>(remaining).count());
}

int64_t OrMinusOne(const std::optional<nanoseconds>& v) { return v ? v->count() : -1; }

int Call(retryd_client_t* client, retryd_dependency_t dependency,
         const retryd_call_policy_t& p, retryd_attempt_fn attempt, void* attempt_ctx,
         retryd_observer_fn observer, void* observer_ctx, const retryd_call_env_t* env,
         retryd_call_result_t* result) {
  retryd::RetryPolicy policy;
  policy.max_attempts = p.max_attempts;
  policy.backoff.jitter = retryd::Jitter(p.jitter);
  policy.backoff.base = FromMs(p.backoff_base_ms);
  policy.backoff.cap = FromMs(p.backoff_cap_ms);
  policy.backoff.retry_after_jitter_max = FromMs(p.retry_after_jitter_max_ms);
  policy.retry_after_max = FromMs(p.retry_after_max_ms);
  policy.deadline = p.deadline_ms < 0 ? nanoseconds::max() : FromMs(p.deadline_ms);
  policy.attempt_timeout =
      p.attempt_timeout_ms <= 0 ? nanoseconds::max() : FromMs(p.attempt_timeout_ms);
  policy.expected_attempt = FromMs(std::max<int64_t>(0, p.expected_attempt_ms));
  const char* method = p.method ? p.method : "GET";
  const retryd_classifier* classifier = p.classifier;
  const int has_key = p.has_idempotency_key;

  retryd::AttemptObserver observe;
  if (observer) {
    observe = [observer, observer_ctx](const retryd::AttemptRecord& r) {
      retryd_attempt_info_t info;
      info.attempt = r.attempt;
      info.decision = int(r.admission);
      info.attempt_class = int(r.attempt_class);
      info.breaker_outcome = int(r.breaker);
      info.status = r.status;
      info.error_kind = int(r.error);
      info.latency_ns = r.latency.count();
      info.retry_after_ns = OrMinusOne(r.retry_after);
      info.wait_ns = r.wait.count();
      info.next = int(r.next);
      observer(observer_ctx, &info);
    };
  }

  retryd::LoopEnv loop_env;
  std::optional<EnvClock> clock;
  if (env) {
    if (env->now_ns) loop_env.clock = &clock.emplace(*env);
    if (env->sleep_ns) {
      loop_env.sleep = [env](nanoseconds ns) { return env->sleep_ns(env->ctx, ns.count()) == 0; };
    }
    if (env->random) loop_env.random = [env] { return env->random(env->ctx); };
    if (env->wall_now_ms) {
      loop_env.wall_clock = [env] {
        return std::chrono::system_clock::time_point(
            std::chrono::duration_cast<std::chrono::system_clock::duration>(
                milliseconds(env->wall_now_ms(env->ctx))));
      };
    }
  }

  CClient adapter(client);
  retryd::RetryLoop loop(adapter, retryd::Dependency{dependency}, policy, std::move(observe),
                         std::move(loop_env));
  retryd::CallOptions options;
  options.method = method;
  options.has_idempotency_key = has_key != 0;

  retryd::CallResult r = loop.Run(
      [&](const retryd::AttemptContext& ctx) {
        retryd_attempt_result_t out;
        out.status = 0;
        out.error_kind = RETRYD_ERROR_NONE;
        out.retry_after_ms = -1;
        out.retry_after = nullptr;
        out.date = nullptr;
        out.attempt_class = -1;
        out.breaker_outcome = -1;
        const int rc = attempt(attempt_ctx, ctx.attempt, RemainingMs(ctx.remaining), &out);
        retryd::AttemptResult res;
        res.status = out.status;
        res.error = retryd::ErrorKind(
            out.error_kind >= RETRYD_ERROR_NONE && out.error_kind <= RETRYD_ERROR_OTHER
                ? out.error_kind
                : RETRYD_ERROR_OTHER);
        if (out.retry_after_ms >= 0) {
          res.retry_after = FromMs(out.retry_after_ms);
        } else if (out.retry_after) {
          res.retry_after_header = out.retry_after;
          if (out.date) res.date_header = out.date;
        }
        res.abort = rc != 0;
        if (ValidOverride(out.attempt_class, out.breaker_outcome)) {
          res.classification = retryd::Classification{retryd::AttemptClass(out.attempt_class),
                                                      retryd::BreakerOutcome(out.breaker_outcome)};
        } else if (classifier && !res.abort) {
          int cls = RETRYD_ATTEMPT_TERMINAL;
          int outcome = RETRYD_BREAKER_OUTCOME_FAILURE;
          if (retryd_classifier_classify(classifier, method, res.status, int(res.error), has_key,
                                         &cls, &outcome) != RETRYD_POLICY_OK) {
            // A status the table cannot take (above 999): an ambiguous failure.
            retryd_classifier_classify(classifier, method, 0, RETRYD_ERROR_OTHER, has_key, &cls,
                                       &outcome);
          }
          res.classification = retryd::Classification{retryd::AttemptClass(cls),
                                                      retryd::BreakerOutcome(outcome)};
        }
        return res;
      },
      options);

  result->stop = int(r.stop);
  result->final_class = int(r.final_class);
  result->attempts = r.attempts;
  result->last_status = r.last_status;
  result->last_error_kind = int(r.last_error);
  result->rejection = int(r.rejection);
  result->elapsed_ns = r.elapsed.count();
  return int(r.rejection) < 0 ? RETRYD_EINVAL : RETRYD_OK;
}

}  // namespace

extern "C" {

void retryd_call_policy_init(retryd_call_policy_t* policy) {
  if (!policy) return;
  policy->max_attempts = 3;
  policy->jitter = RETRYD_JITTER_FULL;
  policy->backoff_base_ms = 100;
  policy->backoff_cap_ms = 10'000;
  policy->retry_after_jitter_max_ms = 100;
  policy->retry_after_max_ms = 30'000;
  policy->deadline_ms = -1;
  policy->attempt_timeout_ms = -1;
  policy->expected_attempt_ms = 0;
  policy->method = nullptr;
  policy->has_idempotency_key = 0;
  policy->classifier = nullptr;
}

int retryd_call(retryd_client_t* client, retryd_dependency_t dependency,
                const retryd_call_policy_t* policy, retryd_attempt_fn attempt, void* attempt_ctx,
                retryd_observer_fn observer, void* observer_ctx, const retryd_call_env_t* env,
                retryd_call_result_t* result) {
  if (!client || !attempt || !result) return RETRYD_EINVAL;
  retryd_call_policy_t defaults;
  retryd_call_policy_init(&defaults);
  const retryd_call_policy_t& p = policy ? *policy : defaults;
  if (p.jitter < RETRYD_JITTER_NONE || p.jitter > RETRYD_JITTER_DECORRELATED ||
      p.backoff_base_ms < 0 || p.backoff_cap_ms < 0 || p.retry_after_jitter_max_ms < 0 ||
      p.retry_after_max_ms < 0) {
    return RETRYD_EINVAL;
  }
  try {
    return Call(client, dependency, p, attempt, attempt_ctx, observer, observer_ctx, env, result);
  } catch (...) {
    // Only an allocation can throw here: the callbacks are C, the loop's own code does not.
    return RETRYD_EIO;
  }
}

const char* retryd_stop_name(int stop) {
  if (stop < int(retryd::StopReason::kNone) || stop > int(retryd::StopReason::kAborted)) {
    return "invalid";
  }
  return retryd::StopReasonName(retryd::StopReason(stop));
}

}  // extern "C"
