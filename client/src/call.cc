// client/src/call.cc: the retry loop (call.h) over Client and the policy toolkit.
#include "retryd/call.h"

#include <algorithm>
#include <thread>
#include <utility>

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

// Completes an admitted permit exactly once, also when the attempt function throws.
class PermitGuard {
 public:
  PermitGuard(Client& client, Permit& permit, const Clock& clock)
      : client_(client), permit_(permit), clock_(clock), start_(clock.Now()) {}
  ~PermitGuard() {
    if (!done_) Finish(Outcome::kFailure);
  }
  PermitGuard(const PermitGuard&) = delete;
  PermitGuard& operator=(const PermitGuard&) = delete;

  nanoseconds Elapsed() const { return std::max(nanoseconds(0), clock_.Now() - start_); }
  void Finish(Outcome outcome, nanoseconds latency) {
    done_ = true;
    client_.Complete(&permit_, outcome, latency);
  }

 private:
  void Finish(Outcome outcome) { Finish(outcome, Elapsed()); }
  Client& client_;
  Permit& permit_;
  const Clock& clock_;
  nanoseconds start_;
  bool done_ = false;
};

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

CallResult RetryLoop::Run(const AttemptFn& attempt_fn, const CallOptions& options) const {
  const Clock& clock = env_.clock ? *env_.clock : Clock::Steady();
  const ClassificationPolicy& table =
      policy_.classification ? *policy_.classification : ClassificationPolicy::Default();
  const uint32_t max_attempts = std::max<uint32_t>(1, policy_.max_attempts);
  const Deadline deadline(std::min(policy_.deadline, options.deadline), clock);
  Backoff backoff(policy_.backoff, env_.random);
  RetryAfterOptions retry_after_options;
  retry_after_options.max_wait = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::max(policy_.retry_after_max, nanoseconds(0)));

  CallResult result;
  nanoseconds slowest{0};
  // The time an attempt needs to be worth starting.
  auto needed = [&] {
    return policy_.expected_attempt > nanoseconds(0) ? policy_.expected_attempt : slowest;
  };
  auto finish = [&](StopReason stop) {
    result.stop = stop;
    result.elapsed = deadline.elapsed();
    return result;
  };

  for (uint32_t attempt = 0;; ++attempt) {
    // A wait was only taken if this attempt could finish; the clock may still have moved on
    // (a sleep that overslept, a slow admit), so check again.
    if (!deadline.CanFinish(needed())) return finish(StopReason::kDeadline);

    Permit permit;
    if (!client_->Admit(dep_, attempt, &permit)) {
      client_->Complete(&permit, Outcome::kIgnored, nanoseconds(0));  // a no-op; the contract
      result.rejection = permit.decision();
      if (observer_) {
        AttemptRecord rec;
        rec.attempt = attempt;
        rec.admission = permit.decision();
        rec.next = StopReason::kRejected;
        observer_(rec);
      }
      return finish(StopReason::kRejected);
    }

    AttemptContext ctx;
    ctx.attempt = attempt;
    ctx.remaining = std::max(nanoseconds(1), deadline.Clamp(policy_.attempt_timeout));
    ctx.probe = permit.probe();
    AttemptResult res;
    nanoseconds latency;
    Classification cls;
    {
      PermitGuard guard(*client_, permit, clock);
      res = attempt_fn(ctx);
      latency = guard.Elapsed();
      if (res.classification) {
        cls = *res.classification;
      } else if (res.abort) {
        cls = {AttemptClass::kTerminal, BreakerOutcome::kFailure};
      } else {
        cls = table.Classify(options.method, res.status, res.error, options.has_idempotency_key);
      }
      guard.Finish(Outcome(int(cls.breaker)), latency);
    }
    ++result.attempts;
    result.final_class = cls.attempt_class;
    result.last_status = res.status;
    result.last_error = res.error;
    slowest = std::max(slowest, latency);

    AttemptRecord rec;
    rec.attempt = attempt;
    rec.admission = permit.decision();
    rec.attempt_class = cls.attempt_class;
    rec.breaker = cls.breaker;
    rec.status = res.status;
    rec.error = res.error;
    rec.latency = latency;
    rec.retry_after = res.retry_after;
    bool retry_after_too_long = false;
    if (!rec.retry_after && !res.retry_after_header.empty()) {
      RetryAfter parsed;
      const auto wall = env_.wall_clock ? env_.wall_clock() : std::chrono::system_clock::now();
      if (ParseRetryAfter(res.retry_after_header, res.date_header, wall, &parsed,
                          retry_after_options) == ParseError::kNone) {
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
    } else if (attempt + 1 >= max_attempts) {
      rec.next = StopReason::kAttemptsExhausted;
    } else if (retry_after_too_long) {
      rec.next = StopReason::kRetryAfterTooLong;
    } else {
      rec.wait = backoff.Next(attempt, rec.retry_after);
      if (!deadline.CanFinish(SaturatingAdd(rec.wait, needed()))) {
        rec.next = StopReason::kDeadline;
        rec.wait = nanoseconds(0);
      }
    }
    if (observer_) observer_(rec);
    if (rec.next != StopReason::kNone) return finish(rec.next);

    const bool slept = env_.sleep ? env_.sleep(rec.wait)
                                  : (std::this_thread::sleep_for(rec.wait), true);
    if (!slept) return finish(StopReason::kCancelled);
  }
}

}  // namespace retryd
