// retryd/classify.h: what one attempt's result means, for the retry loop and for the breaker.
//
// Inputs: the HTTP method, the status code (0 when no response arrived), the transport error
// kind, and whether the request carries an idempotency key. Outputs: an `AttemptClass`
// (success, retryable, terminal) and a `BreakerOutcome` (success, failure, ignored).
//
// The policy is data: a `Rule` per status code (with a default per status class 1xx..5xx), a
// `Rule` per transport error kind, and the set of idempotent methods; `SetStatus`, `SetError`
// and `SetIdempotent` override any entry. The defaults:
//
//   result                         class        unsafe retry  breaker   why
//   2xx, 3xx                       success      -             success
//   4xx (400 401 403 404 409 422)  terminal     -             ignored   the caller's fault
//   408 Request Timeout            retryable    yes           ignored   server never got it all
//   425 Too Early                  retryable    yes           ignored   server refused to process
//   429 Too Many Requests          retryable    yes           failure   downstream shedding load
//   5xx (500 502 503 504 ...)      retryable    no            failure
//   501, 505                       terminal     -             ignored   permanent, our request
//   1xx as a final status          terminal     -             ignored   protocol error
//   dns, connect_refused           retryable    yes           failure   request never sent
//   connection_reset, tls,         retryable    no            failure   request may have been
//     timeout, other                                                    processed: ambiguous
//
// "unsafe retry" says whether the rule also retries a call that is not safe to repeat. A call
// is safe to repeat when its method is idempotent (default GET HEAD OPTIONS TRACE PUT DELETE)
// or it carries an idempotency key; POST, PATCH and unknown methods are not. A retryable rule
// without "unsafe retry" makes an unsafe call terminal: a POST that timed out after it was sent
// fails closed, for reconciliation, instead of risking a double charge. Only statuses that prove
// the request was not processed (408, 425, 429) and errors before sending (dns,
// connect_refused) retry unsafe calls. 503 is deliberately not among them: a proxy's 503 proves
// nothing about what the application behind it did.
//
// 429 counts as a breaker failure: the downstream is protecting itself, and the breaker opening
// is what stops a host from pushing on. 408 and 425 do not: they speak of one request.
// A status outside 100..599, and "status 0 with no error", are treated as ErrorKind::kOther
// (ambiguous, so an unsafe call fails closed). A transport error takes precedence over the
// status (a reset while reading a 200's body is a reset). Methods are matched
// case-sensitively, as RFC 9110 defines them ("get" is not GET, so it is not retried unsafely).
//
// Thread safety: a `ClassificationPolicy` is a value. Classify is const and thread-safe; the
// setters are not: finish configuring a policy before sharing it.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "retryd/export.h"

namespace retryd {

// The values are the C ABI's RETRYD_ERROR_* (retryd_policy.h).
enum class ErrorKind : int {
  kNone = 0,             // a response arrived
  kDns = 1,              // name resolution failed
  kConnectRefused = 2,   // the connection was refused (nothing listening)
  kConnectionReset = 3,  // the connection was reset or closed after the request began
  kTls = 4,              // TLS handshake or record error
  kTimeout = 5,          // connect, write or read timed out
  kOther = 6,            // anything else
};
inline constexpr int kErrorKindCount = 7;

// The values are the C ABI's RETRYD_ATTEMPT_* (retryd_policy.h).
enum class AttemptClass : int {
  kSuccess = 0,    // done
  kRetryable = 1,  // may be retried (subject to the retry budget, backoff and deadline)
  kTerminal = 2,   // give up now and report the error
};

// The values are those of the outcome the client's completion call takes (retryd::Outcome in
// client.h; RETRYD_SUCCESS, RETRYD_FAILURE, RETRYD_IGNORED in retryd.h), so a classification
// can be passed straight on; in retryd_policy.h they are RETRYD_BREAKER_OUTCOME_*.
enum class BreakerOutcome : int {
  kSuccess = 0,
  kFailure = 1,  // counts toward opening the breaker
  kIgnored = 2,  // not the dependency's fault: the breaker does not see it
};

struct Classification {
  AttemptClass attempt_class = AttemptClass::kTerminal;
  BreakerOutcome breaker = BreakerOutcome::kIgnored;
};

class RETRYD_EXPORT ClassificationPolicy {
 public:
  struct Rule {
    AttemptClass attempt_class = AttemptClass::kTerminal;
    BreakerOutcome breaker = BreakerOutcome::kIgnored;
    // kRetryable also for a call that is not safe to repeat: the result proves the request
    // was not processed. Meaningless for the other classes.
    bool retry_unsafe = false;
  };

  // A policy with the defaults in the table above.
  ClassificationPolicy();

  // Default returns a shared policy with the defaults; it is never modified. Thread-safe.
  static const ClassificationPolicy& Default();

  // SetStatus sets the rule for `status` (100..599) and returns false, changing nothing, for any
  // other code. Not thread-safe.
  bool SetStatus(int status, Rule rule);
  // SetStatusClass sets the rule for every status of class `hundreds` (1..5) that has no rule
  // of its own from SetStatus or the defaults; returns false for another class. Not thread-safe.
  bool SetStatusClass(int hundreds, Rule rule);
  // SetError sets the rule for a transport error (not kNone); returns false for kNone or an
  // unknown kind. Not thread-safe.
  bool SetError(ErrorKind error, Rule rule);
  // SetIdempotent adds `method` to, or removes it from, the idempotent methods. Not thread-safe.
  void SetIdempotent(std::string_view method, bool idempotent);

  // IsIdempotent reports whether `method` is in the idempotent set. Thread-safe.
  bool IsIdempotent(std::string_view method) const;
  // StatusRule returns the rule in force for `status` (100..599); any other code gets the rule
  // for ErrorKind::kOther. Thread-safe.
  Rule StatusRule(int status) const;
  // ErrorRule returns the rule for `error`; kNone and unknown kinds get kOther's. Thread-safe.
  Rule ErrorRule(ErrorKind error) const;

  // Classify applies the policy to one attempt's result. Thread-safe.
  Classification Classify(std::string_view method, int status, ErrorKind error,
                          bool has_idempotency_key) const;

 private:
  static constexpr int kMinStatus = 100;
  static constexpr int kMaxStatus = 599;
  struct Entry {
    Rule rule;
    bool set = false;
  };
  std::array<Entry, kMaxStatus - kMinStatus + 1> status_rules_;
  std::array<Rule, 5> class_rules_;  // index: hundreds - 1
  std::array<Rule, kErrorKindCount> error_rules_;
  std::vector<std::string> idempotent_methods_;
};

// AttemptClassName returns "success", "retryable" or "terminal"; BreakerOutcomeName returns
// "success", "failure" or "ignored"; ErrorKindName returns "none", "dns", "connect_refused",
// "connection_reset", "tls", "timeout" or "other". Never nullptr. Thread-safe.
RETRYD_EXPORT const char* AttemptClassName(AttemptClass c);
RETRYD_EXPORT const char* BreakerOutcomeName(BreakerOutcome o);
RETRYD_EXPORT const char* ErrorKindName(ErrorKind e);

}  // namespace retryd
