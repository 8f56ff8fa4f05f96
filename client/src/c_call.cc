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
  bool AdmitNoProbe(retryd::Dependency dep, uint32_t attempt, retryd::Permit* permit) override {
    return retryd_admit_no_probe(c_, dep.id, attempt, permit->raw()) == RETRYD_ADMITTED;
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

retryd::RetryPolicy ToPolicy(const retryd_call_policy_t& p) {
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
  return policy;
}

bool ValidPolicy(const retryd_call_policy_t& p) {
  return p.jitter >= RETRYD_JITTER_NONE && p.jitter <= RETRYD_JITTER_DECORRELATED &&
         p.backoff_base_ms >= 0 && p.backoff_cap_ms >= 0 && p.retry_after_jitter_max_ms >= 0 &&
         p.retry_after_max_ms >= 0;
}

// The loop's world from a C env: `env` (a copy the caller keeps alive) and `clock` must outlive
// the result. A NULL env, or a NULL member, is the real thing.
retryd::LoopEnv ToLoopEnv(const retryd_call_env_t* env, std::optional<EnvClock>* clock) {
  retryd::LoopEnv loop_env;
  if (!env) return loop_env;
  if (env->now_ns) loop_env.clock = &clock->emplace(*env);
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
  return loop_env;
}

// The loop's view of what an attempt reported: `out` as the attempt filled it, `abort` its
// nonzero return. The caller's classifier, if any, replaces the default table.
retryd::AttemptResult ToAttemptResult(const retryd_attempt_result_t& out, bool abort,
                                      const char* method, const retryd_classifier* classifier,
                                      int has_key) {
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
  res.abort = abort;
  if (ValidOverride(out.attempt_class, out.breaker_outcome)) {
    res.classification = retryd::Classification{retryd::AttemptClass(out.attempt_class),
                                                retryd::BreakerOutcome(out.breaker_outcome)};
  } else if (classifier && !res.abort) {
    int cls = RETRYD_ATTEMPT_TERMINAL;
    int outcome = RETRYD_BREAKER_OUTCOME_FAILURE;
    if (retryd_classifier_classify(classifier, method, res.status, int(res.error), has_key, &cls,
                                   &outcome) != RETRYD_POLICY_OK) {
      // A status the table cannot take (above 999): an ambiguous failure.
      retryd_classifier_classify(classifier, method, 0, RETRYD_ERROR_OTHER, has_key, &cls,
                                 &outcome);
    }
    res.classification =
        retryd::Classification{retryd::AttemptClass(cls), retryd::BreakerOutcome(outcome)};
  }
  return res;
}

void ToInfo(const retryd::AttemptRecord& r, retryd_attempt_info_t* info) {
  info->attempt = r.attempt;
  info->decision = int(r.admission);
  info->attempt_class = int(r.attempt_class);
  info->breaker_outcome = int(r.breaker);
  info->status = r.status;
  info->error_kind = int(r.error);
  info->latency_ns = r.latency.count();
  info->retry_after_ns = OrMinusOne(r.retry_after);
  info->wait_ns = r.wait.count();
  info->next = int(r.next);
}

void ToResult(const retryd::CallResult& r, retryd_call_result_t* result) {
  result->stop = int(r.stop);
  result->final_class = int(r.final_class);
  result->attempts = r.attempts;
  result->last_status = r.last_status;
  result->last_error_kind = int(r.last_error);
  result->rejection = int(r.rejection);
  result->elapsed_ns = r.elapsed.count();
}

int Call(retryd_client_t* client, retryd_dependency_t dependency,
         const retryd_call_policy_t& p, retryd_attempt_fn attempt, void* attempt_ctx,
         retryd_observer_fn observer, void* observer_ctx, const retryd_call_env_t* env,
         retryd_call_result_t* result) {
  const char* method = p.method ? p.method : "GET";
  const retryd_classifier* classifier = p.classifier;
  const int has_key = p.has_idempotency_key;

  retryd::AttemptObserver observe;
  if (observer) {
    observe = [observer, observer_ctx](const retryd::AttemptRecord& r) {
      retryd_attempt_info_t info;
      ToInfo(r, &info);
      observer(observer_ctx, &info);
    };
  }
  std::optional<EnvClock> clock;
  CClient adapter(client);
  retryd::RetryLoop loop(adapter, retryd::Dependency{dependency}, ToPolicy(p), std::move(observe),
                         ToLoopEnv(env, &clock));
  retryd::CallOptions options;
  options.method = method;
  options.has_idempotency_key = has_key != 0;

  retryd::CallResult r = loop.Run(
      [&](const retryd::AttemptContext& ctx) {
        retryd_attempt_result_t out;
        retryd_attempt_result_init(&out);
        const int rc = attempt(attempt_ctx, ctx.attempt, RemainingMs(ctx.remaining), &out);
        return ToAttemptResult(out, rc != 0, method, classifier, has_key);
      },
      options);
  ToResult(r, result);
  return int(r.rejection) < 0 ? RETRYD_EINVAL : RETRYD_OK;
}

void ClearStep(retryd_step_t* step) {
  step->attempt = 0;
  step->probe = 0;
  step->remaining_ms = 0;
  step->wait_ns = 0;
  step->has_record = 0;
}

}  // namespace

// A call made one step at a time: the C policy's strings and the env copied, the client
// adapted, the steps over them. Members are declared in the order they must be built.
struct retryd_steps {
  retryd_steps(retryd_client_t* client, retryd_dependency_t dependency,
               const retryd_call_policy_t& p, const retryd_call_env_t* caller_env)
      : method(p.method ? p.method : "GET"),
        classifier(p.classifier),
        has_idempotency_key(p.has_idempotency_key),
        env(caller_env ? *caller_env : retryd_call_env_t{}),
        adapter(client),
        steps(adapter, retryd::Dependency{dependency}, ToPolicy(p), Options(),
              ToLoopEnv(caller_env ? &env : nullptr, &clock)) {}

  retryd::CallOptions Options() const {
    retryd::CallOptions options;
    options.method = method;
    options.has_idempotency_key = has_idempotency_key != 0;
    return options;
  }

  const std::string method;
  const retryd_classifier* const classifier;
  const int has_idempotency_key;
  const retryd_call_env_t env;
  std::optional<EnvClock> clock;
  CClient adapter;
  retryd::CallSteps steps;
};

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
  if (!ValidPolicy(p)) return RETRYD_EINVAL;
  try {
    return Call(client, dependency, p, attempt, attempt_ctx, observer, observer_ctx, env, result);
  } catch (...) {
    // Only an allocation can throw here: the callbacks are C, the loop's own code does not.
    return RETRYD_EIO;
  }
}

void retryd_attempt_result_init(retryd_attempt_result_t* out) {
  if (!out) return;
  out->status = 0;
  out->error_kind = RETRYD_ERROR_NONE;
  out->retry_after_ms = -1;
  out->retry_after = nullptr;
  out->date = nullptr;
  out->attempt_class = -1;
  out->breaker_outcome = -1;
}

int retryd_steps_begin(retryd_client_t* client, retryd_dependency_t dependency,
                       const retryd_call_policy_t* policy, const retryd_call_env_t* env,
                       retryd_steps_t** out) {
  if (!client || !out) return RETRYD_EINVAL;
  retryd_call_policy_t defaults;
  retryd_call_policy_init(&defaults);
  const retryd_call_policy_t& p = policy ? *policy : defaults;
  if (!ValidPolicy(p)) return RETRYD_EINVAL;
  try {
    *out = new retryd_steps(client, dependency, p, env);
    return RETRYD_OK;
  } catch (...) {
    return RETRYD_EIO;
  }
}

int retryd_steps_admit(retryd_steps_t* call, retryd_step_t* step) {
  if (!call || !step) return RETRYD_EINVAL;
  ClearStep(step);
  if (call->steps.done()) return RETRYD_STEP_STOP;
  if (call->steps.attempt_in_flight()) return RETRYD_EINVAL;
  retryd::AttemptContext ctx;
  retryd::AttemptRecord rec;
  bool recorded = false;
  if (call->steps.Admit(&ctx, &rec, &recorded) == retryd::CallSteps::Next::kStop) {
    if (recorded) {
      step->has_record = 1;
      ToInfo(rec, &step->record);
    }
    return RETRYD_STEP_STOP;
  }
  step->attempt = ctx.attempt;
  step->probe = ctx.probe ? 1 : 0;
  step->remaining_ms = RemainingMs(ctx.remaining);
  return RETRYD_STEP_ATTEMPT;
}

int retryd_steps_report(retryd_steps_t* call, const retryd_attempt_result_t* result, int abort,
                        retryd_step_t* step) {
  if (!call || !step) return RETRYD_EINVAL;
  ClearStep(step);
  if (!call->steps.attempt_in_flight()) return RETRYD_EINVAL;
  retryd_attempt_result_t empty;
  retryd_attempt_result_init(&empty);
  retryd::AttemptRecord rec;
  try {
    const retryd::AttemptResult res =
        ToAttemptResult(result ? *result : empty, abort != 0, call->method.c_str(),
                        call->classifier, call->has_idempotency_key);
    const auto next = call->steps.Report(res, &rec);
    step->has_record = 1;
    ToInfo(rec, &step->record);
    if (next == retryd::CallSteps::Next::kStop) return RETRYD_STEP_STOP;
    step->wait_ns = rec.wait.count();
    return RETRYD_STEP_WAIT;
  } catch (...) {
    // Only the copy of a Retry-After or Date header can throw (out of memory): the attempt is
    // reported as the abort it then is.
    call->steps.Cancel(retryd::Outcome::kFailure);
    return RETRYD_STEP_STOP;
  }
}

void retryd_steps_cancel(retryd_steps_t* call, int outcome) {
  if (!call) return;
  if (outcome < RETRYD_SUCCESS || outcome > RETRYD_IGNORED) outcome = RETRYD_FAILURE;
  call->steps.Cancel(retryd::Outcome(outcome));
}

void retryd_steps_end(retryd_steps_t* call, retryd_call_result_t* result) {
  if (!call) return;
  call->steps.Cancel(retryd::Outcome::kFailure);  // a no-op for a call that has ended
  if (result) ToResult(call->steps.result(), result);
  delete call;
}

const char* retryd_stop_name(int stop) {
  if (stop < int(retryd::StopReason::kNone) || stop > int(retryd::StopReason::kAborted)) {
    return "invalid";
  }
  return retryd::StopReasonName(retryd::StopReason(stop));
}

}  // extern "C"
