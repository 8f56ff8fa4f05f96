// client/src/call.cc: the retry loop (call.h) over Client and the policy toolkit.
#include "retryd/call.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "client/policy/deadline_math.h"
#include "retryd/retry_after.h"

namespace retryd {
namespace {

using std::chrono::nanoseconds;

nanoseconds SaturatingAdd(nanoseconds a, nanoseconds b) {
  int64_t sum;
  if (__builtin_add_overflow(std::max<int64_t>(0, a.count()), std::max<int64_t>(0, b.count()),
                             &sum)) {
    return nanoseconds::max();
  }
  return nanoseconds(sum);
}

}  // namespace

const char* StopReasonName(StopReason r) {
  switch (r) {
    case StopReason::kNone: return "none";
    case StopReason::kSuccess: return "success";
    case StopReason::kTerminal: return "terminal";
    case StopReason::kAttemptsExhausted: return "attempts_exhausted";
    case StopReason::kRejected: return "rejected";
    case StopReason::kDeadline: return "deadline";
    case StopReason::kRetryAfterTooLong: return "retry_after_too_long";
    case StopReason::kCancelled: return "cancelled";
    case StopReason::kAborted: return "aborted";
  }
  return "invalid";
}

RetryLoop::RetryLoop(Client& client, Dependency dep, RetryPolicy policy, AttemptObserver observer,
                     LoopEnv env)
    : client_(&client),
      dep_(dep),
      policy_(std::move(policy)),
      observer_(std::move(observer)),
      env_(std::move(env)) {}

CallSteps::CallSteps(Client& client, Dependency dep, const RetryPolicy& policy,
                     const CallOptions& options, const LoopEnv& env)
    : client_(&client),
      dep_(dep),
      policy_(policy),
      table_(policy.classification ? policy.classification : &ClassificationPolicy::Default()),
      method_(options.method),
      has_idempotency_key_(options.has_idempotency_key),
      clock_(env.clock ? env.clock : &Clock::Steady()),
      deadline_(std::min(policy.deadline, options.deadline), *clock_),
      backoff_(policy.backoff, env.random),
      wall_clock_(env.wall_clock),
      retry_after_ceiling_(std::chrono::duration_cast<std::chrono::milliseconds>(
          std::max(policy.retry_after_max, nanoseconds(0)))) {
  policy_.max_attempts = std::max<uint32_t>(1, policy_.max_attempts);
}

CallSteps::~CallSteps() {
  if (stage_ == Stage::kInFlight) {
    CompleteInFlight(Outcome::kFailure, std::max(nanoseconds(0), clock_->Now() - started_));
  }
}

// The time an attempt needs to be worth starting.
nanoseconds CallSteps::Needed() const {
  return policy_.expected_attempt > nanoseconds(0) ? policy_.expected_attempt : slowest_;
}

// The time a half-open probe needs: what a fresh call's first attempt always has, its attempt
// timeout or half its deadline, whichever is less (0 when neither is set).
nanoseconds CallSteps::ProbeNeeds() const {
  const nanoseconds half_deadline =
      deadline_.infinite() ? nanoseconds::max() : deadline_.budget() / 2;
  const nanoseconds needs = std::min(policy_.attempt_timeout, half_deadline);
  return needs == nanoseconds::max() ? nanoseconds(0) : std::max(nanoseconds(0), needs);
}

CallSteps::Next CallSteps::Finish(StopReason stop) {
  stage_ = Stage::kDone;
  result_.stop = stop;
  result_.elapsed = deadline_.elapsed();
  return Next::kStop;
}

void CallSteps::CompleteInFlight(Outcome outcome, nanoseconds latency) {
  stage_ = Stage::kReady;
  client_->Complete(&permit_, outcome, latency);
}

CallSteps::Next CallSteps::Admit(AttemptContext* ctx, AttemptRecord* record, bool* recorded) {
  if (recorded) *recorded = false;
  if (stage_ == Stage::kDone) return Next::kStop;
  if (stage_ == Stage::kInFlight) return Next::kAttempt;
  // A wait was only taken if this attempt could finish; the clock may still have moved on (a
  // wait that overslept, a slow admit), so check again.
  const nanoseconds left = deadline_.remaining();
  if (!policy_internal::CanFinish(left, Needed())) return Finish(StopReason::kDeadline);

  // The half-open lets few calls through: one short of the time a fresh call's attempt has
  // would spend a probe on an attempt cut off before the downstream answers, and reopen the
  // breaker on a timeout of its own. Such a call never takes the probe, which stays for the
  // next caller, and is refused as any caller is while the probes are out. Judged before the
  // admit, whose own time (a half-open's first admit moves the breaker) is not the call's.
  const bool may_probe = policy_internal::CanFinish(left, ProbeNeeds());
  const bool admitted = may_probe ? client_->Admit(dep_, attempt_, &permit_)
                                  : client_->AdmitNoProbe(dep_, attempt_, &permit_);
  if (!admitted) {  // it writes what complete reads
    client_->Complete(&permit_, Outcome::kIgnored, nanoseconds(0));  // a no-op; the contract
    result_.rejection = permit_.decision();
    *record = AttemptRecord();
    record->attempt = attempt_;
    record->admission = permit_.decision();
    record->next = StopReason::kRejected;
    if (recorded) *recorded = true;
    return Finish(StopReason::kRejected);
  }
  stage_ = Stage::kInFlight;
  started_ = clock_->Now();
  ctx->attempt = attempt_;
  ctx->remaining = std::max(nanoseconds(1), deadline_.Clamp(policy_.attempt_timeout));
  ctx->probe = permit_.probe();
  return Next::kAttempt;
}

CallSteps::Next CallSteps::Report(const AttemptResult& res, AttemptRecord* record) {
  if (stage_ == Stage::kDone) return Next::kStop;
  if (stage_ != Stage::kInFlight) {
    *record = AttemptRecord();
    return Next::kWait;
  }
  const nanoseconds latency = std::max(nanoseconds(0), clock_->Now() - started_);
  Classification cls;
  if (res.classification) {
    cls = *res.classification;
  } else if (res.abort) {
    cls = {AttemptClass::kTerminal, BreakerOutcome::kFailure};
  } else {
    cls = table_->Classify(method_, res.status, res.error, has_idempotency_key_);
  }
  CompleteInFlight(Outcome(int(cls.breaker)), latency);
  ++result_.attempts;
  result_.final_class = cls.attempt_class;
  result_.last_status = res.status;
  result_.last_error = res.error;
  slowest_ = std::max(slowest_, latency);

  AttemptRecord& rec = *record;
  rec = AttemptRecord();
  rec.attempt = attempt_;
  rec.admission = permit_.decision();
  rec.attempt_class = cls.attempt_class;
  rec.breaker = cls.breaker;
  rec.status = res.status;
  rec.error = res.error;
  rec.latency = latency;
  rec.retry_after = res.retry_after;
  bool retry_after_too_long = false;
  if (!rec.retry_after && !res.retry_after_header.empty()) {
    RetryAfter parsed;
    RetryAfterOptions options;
    options.max_wait = retry_after_ceiling_;
    const auto wall = wall_clock_ ? wall_clock_() : std::chrono::system_clock::now();
    if (ParseRetryAfter(res.retry_after_header, res.date_header, wall, &parsed, options) ==
        ParseError::kNone) {
      // `wait` is at most the ceiling in milliseconds, which fits in nanoseconds.
      rec.retry_after = nanoseconds(parsed.wait);
      retry_after_too_long = parsed.clamped;
    }
  }
  if (rec.retry_after) {
    if (*rec.retry_after < nanoseconds(0)) rec.retry_after = nanoseconds(0);
    if (*rec.retry_after > policy_.retry_after_max) retry_after_too_long = true;
  }

  if (res.abort) {
    rec.next = StopReason::kAborted;
  } else if (cls.attempt_class == AttemptClass::kSuccess) {
    rec.next = StopReason::kSuccess;
  } else if (cls.attempt_class != AttemptClass::kRetryable) {
    rec.next = StopReason::kTerminal;
  } else if (attempt_ + 1 >= policy_.max_attempts) {
    rec.next = StopReason::kAttemptsExhausted;
  } else if (retry_after_too_long) {
    rec.next = StopReason::kRetryAfterTooLong;
  } else {
    rec.wait = backoff_.Next(attempt_, rec.retry_after);
    if (!deadline_.CanFinish(SaturatingAdd(rec.wait, Needed()))) {
      rec.next = StopReason::kDeadline;
      rec.wait = nanoseconds(0);
    }
  }
  ++attempt_;
  if (rec.next != StopReason::kNone) return Finish(rec.next);
  return Next::kWait;
}

void CallSteps::Cancel(Outcome in_flight) {
  if (stage_ == Stage::kDone) return;
  if (stage_ == Stage::kInFlight) {
    CompleteInFlight(in_flight, std::max(nanoseconds(0), clock_->Now() - started_));
  }
  Finish(StopReason::kCancelled);
}

CallResult RetryLoop::Run(const AttemptFn& attempt_fn, const CallOptions& options) const {
  // The steps complete an attempt in flight as a failure if attempt_fn throws.
  CallSteps call(*client_, dep_, policy_, options, env_);
  AttemptContext ctx;
  AttemptRecord rec;
  bool recorded = false;
  while (call.Admit(&ctx, &rec, &recorded) == CallSteps::Next::kAttempt) {
    const AttemptResult res = attempt_fn(ctx);
    const CallSteps::Next next = call.Report(res, &rec);
    if (observer_) observer_(rec);
    if (next == CallSteps::Next::kStop) return call.result();
    const bool slept = env_.sleep ? env_.sleep(rec.wait)
                                  : (std::this_thread::sleep_for(rec.wait), true);
    if (!slept) call.Cancel(Outcome::kIgnored);
  }
  if (recorded && observer_) observer_(rec);
  return call.result();
}

}  // namespace retryd
