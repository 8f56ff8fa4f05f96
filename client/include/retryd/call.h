// retryd/call.h: the retry loop. One logical call to a dependency, as a bounded series of
// attempts, each admitted by the host's segment and reported back to it.
//
// For every attempt the loop
//   1. checks the deadline: an attempt that cannot finish in time is not started;
//   2. asks Client::Admit; a rejection (breaker open, half-open busy, bulkhead full, retry
//      budget empty) ends the call at once with the reason, so the caller can serve a fallback;
//      a call with less time left than a fresh call's first attempt has (its attempt
//      timeout, or half its deadline if less) is never the half-open's probe
//      (Client::AdmitNoProbe): while the breaker is half-open it is refused as half-open busy,
//      and the probe stays for the next caller;
//   3. runs the attempt function with the time left for it (to pass downstream);
//   4. classifies the result (method, status, transport error, idempotency key: classify.h) and
//      reports its breaker outcome with Client::Complete (a 4xx is ignored by the breaker);
//   5. stops on success, on a terminal class, after `max_attempts`, or when the server's
//      Retry-After exceeds `retry_after_max`; otherwise picks the wait max(backoff with jitter,
//      Retry-After + small jitter) (backoff.h), gives up if that wait plus the attempt that
//      follows cannot finish within the deadline, and sleeps.
//
//   retryd::RetryPolicy policy;
//   policy.deadline = std::chrono::seconds(2);
//   retryd::RetryLoop loop(*client, orders, policy);
//   Response response;
//   retryd::CallResult r = loop.Run([&](const retryd::AttemptContext& ctx) {
//     response = http.Get(url, /*timeout=*/ctx.remaining);
//     return retryd::AttemptResult{.status = response.status,
//                                  .retry_after_header = response.header("Retry-After"),
//                                  .date_header = response.header("Date")};
//   });
//   if (r.rejected()) return Fallback();
//
// Time, sleep and randomness are injected (`LoopEnv`): tests run the loop on virtual time and
// never sleep. The breaker and budget in the segment keep their own (real, coarse) clock.
//
// The loop never sleeps into a retry that cannot finish before the deadline, and never starts
// an attempt with less than `expected_attempt` left. It cannot stop an attempt that ignores the
// time it was given: pass `AttemptContext::remaining` down as the attempt's timeout.
//
// Thread safety: a RetryLoop is immutable after construction; Run is thread-safe if the
// functions in its LoopEnv and its observer are (the defaults are). Each Run is one call.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "retryd/backoff.h"
#include "retryd/classify.h"
#include "retryd/client.h"
#include "retryd/deadline.h"
#include "retryd/export.h"

namespace retryd {

// Why a call ended. The values are the C ABI's RETRYD_STOP_* (retryd_call.h).
enum class StopReason : int {
  kNone = 0,               // observer only: the loop retries after `wait`
  kSuccess = 1,            // an attempt succeeded
  kTerminal = 2,           // an attempt's class was terminal (a 4xx; an unsafe call's timeout)
  kAttemptsExhausted = 3,  // `max_attempts` attempts were made
  kRejected = 4,           // admission refused: see CallResult::rejection
  kDeadline = 5,           // no time left for another attempt (and its wait)
  kRetryAfterTooLong = 6,  // the server asked for a wait above `retry_after_max`
  kCancelled = 7,          // the sleep function reported an interruption
  kAborted = 8,            // the attempt set AttemptResult::abort
};
// StopReasonName returns "none", "success", "terminal", "attempts_exhausted", "rejected",
// "deadline", "retry_after_too_long", "cancelled" or "aborted"; never nullptr. Thread-safe.
RETRYD_EXPORT const char* StopReasonName(StopReason r);

struct RetryPolicy {
  // Attempts per call, the first included. Default 3 (two retries): enough to ride out a blip,
  // few enough that a synchronous caller's tail latency stays bounded. 0 counts as 1.
  uint32_t max_attempts = 3;
  // Backoff kind, base, cap and the jitter added to a Retry-After (backoff.h). Defaults: full
  // jitter, 100 ms base, 10 s cap, 100 ms Retry-After jitter.
  BackoffOptions backoff;
  // The longest Retry-After the loop honours. A server asking for more ends the call
  // (kRetryAfterTooLong) rather than retrying earlier than it asked. Default 30 s.
  std::chrono::nanoseconds retry_after_max = std::chrono::seconds(30);
  // The total budget of the call, waits included. Default: none (nanoseconds::max()); a
  // synchronous caller should always set one.
  std::chrono::nanoseconds deadline = std::chrono::nanoseconds::max();
  // Each attempt's own timeout, further clamped to what is left of the deadline. Default: none.
  std::chrono::nanoseconds attempt_timeout = std::chrono::nanoseconds::max();
  // The time an attempt needs to be worth starting (its p99, say): no attempt starts, and no
  // wait is taken before one, with less than this left. Default 0: the slowest attempt of this
  // call so far (0 before the first).
  std::chrono::nanoseconds expected_attempt{0};
  // The classification table; borrowed, must outlive the loop. nullptr: the defaults
  // (ClassificationPolicy::Default(), the table in classify.h).
  const ClassificationPolicy* classification = nullptr;
};

// What the attempt function is told.
struct AttemptContext {
  uint32_t attempt = 0;  // 0 for the first attempt, 1 for the first retry...
  // The time this attempt has: min(attempt_timeout, what is left of the deadline), never 0.
  // nanoseconds::max() when neither is set. Use it as the attempt's timeout and pass it
  // downstream (deadline_header()).
  std::chrono::nanoseconds remaining = std::chrono::nanoseconds::max();
  bool probe = false;  // this attempt is the breaker's half-open probe
  bool bounded() const { return remaining != std::chrono::nanoseconds::max(); }
  // deadline_header returns the `grpc-timeout` value for `remaining` ("" when unbounded).
  std::string deadline_header() const { return bounded() ? FormatDeadlineHeader(remaining) : ""; }
};

// What the attempt function reports.
struct AttemptResult {
  int status = 0;                      // HTTP status; 0 when no response arrived
  ErrorKind error = ErrorKind::kNone;  // the transport error, if any
  // The server's wait, already parsed. When empty, `retry_after_header` is parsed (with
  // `date_header` as the server's clock for an HTTP-date); an unparsable value is ignored.
  std::optional<std::chrono::nanoseconds> retry_after;
  std::string retry_after_header;
  std::string date_header;
  // Overrides the classification table (for non-HTTP calls, or a caller's own rules).
  std::optional<Classification> classification;
  // Ends the call at once (kAborted), without retrying. The attempt is reported with the
  // `classification` override's breaker outcome if set, else as a failure.
  bool abort = false;
};

// What the observer sees: one record per admission, after its decision is made.
struct AttemptRecord {
  uint32_t attempt = 0;
  Decision admission = Decision::kAdmitted;  // a rejected admission sent nothing
  AttemptClass attempt_class = AttemptClass::kTerminal;
  BreakerOutcome breaker = BreakerOutcome::kIgnored;
  int status = 0;
  ErrorKind error = ErrorKind::kNone;
  std::chrono::nanoseconds latency{0};
  std::optional<std::chrono::nanoseconds> retry_after;  // the server's wait, if it sent one
  std::chrono::nanoseconds wait{0};                     // the wait chosen before the next attempt
  StopReason next = StopReason::kNone;                  // kNone: retrying after `wait`
};
using AttemptObserver = std::function<void(const AttemptRecord&)>;

struct CallResult {
  StopReason stop = StopReason::kNone;
  // The class of the last attempt made; kTerminal when none was made.
  AttemptClass final_class = AttemptClass::kTerminal;
  uint32_t attempts = 0;   // attempts sent
  int last_status = 0;     // of the last attempt made (0: none, or no response)
  ErrorKind last_error = ErrorKind::kNone;
  // The refusal that ended the call (stop == kRejected); kAdmitted otherwise.
  Decision rejection = Decision::kAdmitted;
  std::chrono::nanoseconds elapsed{0};  // on the loop's clock, waits included

  bool ok() const { return stop == StopReason::kSuccess; }
  bool rejected() const { return stop == StopReason::kRejected; }
};

// The call being made: what the classification needs beyond the result.
struct CallOptions {
  // The method as sent, case-sensitive. Default "GET"; say "POST" (or "PATCH") for anything
  // not safe to repeat, so that an ambiguous failure fails closed.
  std::string_view method = "GET";
  bool has_idempotency_key = false;
  // A tighter deadline for this call (an upstream's, say); the smaller of it and the
  // policy's applies. Default: none.
  std::chrono::nanoseconds deadline = std::chrono::nanoseconds::max();
};

// The world the loop runs in. Every member defaults to the real thing.
struct LoopEnv {
  const Clock* clock = nullptr;  // nullptr: Clock::Steady(); borrowed, must outlive the loop
  // Sleeps for the given time; returns false if interrupted (the call ends, kCancelled).
  // Empty: std::this_thread::sleep_for.
  std::function<bool(std::chrono::nanoseconds)> sleep;
  RandomSource random;  // empty: ThreadLocalRandom
  // The local wall clock, for an HTTP-date Retry-After without a Date header.
  // Empty: std::chrono::system_clock::now.
  std::function<std::chrono::system_clock::time_point()> wall_clock;
};

using AttemptFn = std::function<AttemptResult(const AttemptContext&)>;

// One call made one step at a time, for callers whose waits must not block a thread (an event
// loop): the caller sends each attempt and takes each wait itself, the steps decide, admit,
// classify and report exactly as Run does (Run is these steps with a blocking sleep):
//
//   CallSteps call(client, orders, policy);
//   AttemptContext ctx;
//   AttemptRecord rec;
//   while (call.Admit(&ctx, &rec) == CallSteps::Next::kAttempt) {
//     AttemptResult res = ...;                        // send attempt ctx.attempt
//     if (call.Report(res, &rec) == CallSteps::Next::kStop) break;
//     co_await timer(rec.wait);                       // the caller's own, non-blocking wait
//   }
//   CallResult r = call.result();
//
// Not thread-safe: one thread at a time drives a call (a coroutine may move between threads).
// Admit and Report never block.
class RETRYD_EXPORT CallSteps {
 public:
  enum class Next {
    kStop,     // the call has ended: result() says how
    kAttempt,  // admitted: send the attempt, then Report its result exactly once
    kWait,     // wait the record's `wait` (on a timer), then Admit the next attempt
  };

  // `client`, the policy's classification table and env.clock are borrowed and must outlive
  // the steps; env.sleep is not used. `options.method` is copied.
  CallSteps(Client& client, Dependency dep, const RetryPolicy& policy = {},
            const CallOptions& options = {}, const LoopEnv& env = {});
  // An attempt admitted and not yet reported is completed as a failure (as Run reports an
  // attempt that threw).
  ~CallSteps();
  CallSteps(const CallSteps&) = delete;
  CallSteps& operator=(const CallSteps&) = delete;

  // Checks the deadline and asks the host to admit the next attempt: kAttempt (`ctx` filled;
  // `record` untouched), or kStop (the deadline; or a refusal, and then `*record` is what an
  // observer is shown and `*recorded` is set true). Outside its turn (an attempt waiting for
  // its report) it changes nothing and returns kAttempt again; after the end, kStop.
  Next Admit(AttemptContext* ctx, AttemptRecord* record, bool* recorded = nullptr);
  // Reports the admitted attempt's result and decides what follows: kWait (`record->wait`) or
  // kStop. `*record` is what an observer is shown. Outside its turn it returns kStop if the
  // call has ended and kWait with no wait otherwise, and changes nothing.
  Next Report(const AttemptResult& result, AttemptRecord* record);
  // Ends the call as kCancelled; an attempt in flight is completed with `in_flight`. A call
  // that has ended is not changed.
  void Cancel(Outcome in_flight);

  bool attempt_in_flight() const { return stage_ == Stage::kInFlight; }
  bool done() const { return stage_ == Stage::kDone; }
  const CallResult& result() const { return result_; }

 private:
  enum class Stage { kReady, kInFlight, kDone };
  std::chrono::nanoseconds Needed() const;
  std::chrono::nanoseconds ProbeNeeds() const;
  Next Finish(StopReason stop);
  void CompleteInFlight(Outcome outcome, std::chrono::nanoseconds latency);

  Client* client_;
  Dependency dep_;
  RetryPolicy policy_;
  const ClassificationPolicy* table_;
  std::string method_;
  bool has_idempotency_key_;
  const Clock* clock_;
  Deadline deadline_;
  Backoff backoff_;
  std::function<std::chrono::system_clock::time_point()> wall_clock_;
  std::chrono::milliseconds retry_after_ceiling_;

  Stage stage_ = Stage::kReady;
  uint32_t attempt_ = 0;  // the number of the next (or the in-flight) attempt
  Permit permit_;
  std::chrono::nanoseconds started_{0};  // the in-flight attempt's admission, on the clock
  std::chrono::nanoseconds slowest_{0};
  CallResult result_;
};

class RETRYD_EXPORT RetryLoop {
 public:
  // `client` must outlive the loop; `dep` comes from client.Resolve.
  RetryLoop(Client& client, Dependency dep, RetryPolicy policy = {}, AttemptObserver observer = {},
            LoopEnv env = {});

  // Run makes one call: attempts `attempt` as the policy allows and returns how it ended.
  // Every admitted attempt is completed, also when `attempt` throws: the exception then
  // propagates after the attempt is reported as a failure. A dependency handle the client does
  // not know is refused like a rejection, with `rejection` holding RETRYD_EINVAL (not a
  // Decision value). Thread-safe.
  CallResult Run(const AttemptFn& attempt, const CallOptions& options = {}) const;

  const RetryPolicy& policy() const { return policy_; }
  Dependency dependency() const { return dep_; }

 private:
  Client* client_;
  Dependency dep_;
  RetryPolicy policy_;
  AttemptObserver observer_;
  LoopEnv env_;
};

}  // namespace retryd
