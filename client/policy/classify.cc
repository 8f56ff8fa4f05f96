#include "retryd/classify.h"

#include <algorithm>

namespace retryd {
namespace {

using Rule = ClassificationPolicy::Rule;

constexpr Rule kSuccess{AttemptClass::kSuccess, BreakerOutcome::kSuccess, false};
constexpr Rule kCallersFault{AttemptClass::kTerminal, BreakerOutcome::kIgnored, false};
constexpr Rule kRetrySafeFailure{AttemptClass::kRetryable, BreakerOutcome::kFailure, false};
constexpr Rule kRetryAnyFailure{AttemptClass::kRetryable, BreakerOutcome::kFailure, true};
constexpr Rule kRetryAnyIgnored{AttemptClass::kRetryable, BreakerOutcome::kIgnored, true};

}  // namespace

ClassificationPolicy::ClassificationPolicy()
    : class_rules_{kCallersFault, kSuccess, kSuccess, kCallersFault, kRetrySafeFailure},
      idempotent_methods_{"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"} {
  SetStatus(408, kRetryAnyIgnored);
  SetStatus(425, kRetryAnyIgnored);
  SetStatus(429, kRetryAnyFailure);
  SetStatus(501, kCallersFault);
  SetStatus(505, kCallersFault);
  error_rules_[int(ErrorKind::kNone)] = kRetrySafeFailure;  // never consulted: see ErrorRule
  error_rules_[int(ErrorKind::kDns)] = kRetryAnyFailure;
  error_rules_[int(ErrorKind::kConnectRefused)] = kRetryAnyFailure;
  error_rules_[int(ErrorKind::kConnectionReset)] = kRetrySafeFailure;
  error_rules_[int(ErrorKind::kTls)] = kRetrySafeFailure;
  error_rules_[int(ErrorKind::kTimeout)] = kRetrySafeFailure;
  error_rules_[int(ErrorKind::kOther)] = kRetrySafeFailure;
}

const ClassificationPolicy& ClassificationPolicy::Default() {
  static const ClassificationPolicy policy;
  return policy;
}

bool ClassificationPolicy::SetStatus(int status, Rule rule) {
  if (status < kMinStatus || status > kMaxStatus) return false;
  status_rules_[status - kMinStatus] = Entry{rule, true};
  return true;
}

bool ClassificationPolicy::SetStatusClass(int hundreds, Rule rule) {
  if (hundreds < 1 || hundreds > 5) return false;
  class_rules_[hundreds - 1] = rule;
  return true;
}

bool ClassificationPolicy::SetError(ErrorKind error, Rule rule) {
  int i = int(error);
  if (error == ErrorKind::kNone || i < 0 || i >= kErrorKindCount) return false;
  error_rules_[i] = rule;
  return true;
}

void ClassificationPolicy::SetIdempotent(std::string_view method, bool idempotent) {
  auto it = std::find(idempotent_methods_.begin(), idempotent_methods_.end(), method);
  if (idempotent && it == idempotent_methods_.end()) {
    idempotent_methods_.emplace_back(method);
  } else if (!idempotent && it != idempotent_methods_.end()) {
    idempotent_methods_.erase(it);
  }
}

bool ClassificationPolicy::IsIdempotent(std::string_view method) const {
  return std::find(idempotent_methods_.begin(), idempotent_methods_.end(), method) !=
         idempotent_methods_.end();
}

ClassificationPolicy::Rule ClassificationPolicy::StatusRule(int status) const {
  if (status < kMinStatus || status > kMaxStatus) return ErrorRule(ErrorKind::kOther);
  const Entry& e = status_rules_[status - kMinStatus];
  return e.set ? e.rule : class_rules_[status / 100 - 1];
}

ClassificationPolicy::Rule ClassificationPolicy::ErrorRule(ErrorKind error) const {
  int i = int(error);
  if (error == ErrorKind::kNone || i < 0 || i >= kErrorKindCount) {
    return error_rules_[int(ErrorKind::kOther)];
  }
  return error_rules_[i];
}

Classification ClassificationPolicy::Classify(std::string_view method, int status,
                                              ErrorKind error, bool has_idempotency_key) const {
  Rule rule = error != ErrorKind::kNone ? ErrorRule(error) : StatusRule(status);
  Classification c{rule.attempt_class, rule.breaker};
  if (c.attempt_class == AttemptClass::kRetryable && !rule.retry_unsafe &&
      !has_idempotency_key && !IsIdempotent(method)) {
    c.attempt_class = AttemptClass::kTerminal;
  }
  return c;
}

const char* AttemptClassName(AttemptClass c) {
  switch (c) {
    case AttemptClass::kSuccess: return "success";
    case AttemptClass::kRetryable: return "retryable";
    case AttemptClass::kTerminal: return "terminal";
  }
  return "unknown";
}

const char* BreakerOutcomeName(BreakerOutcome o) {
  switch (o) {
    case BreakerOutcome::kSuccess: return "success";
    case BreakerOutcome::kFailure: return "failure";
    case BreakerOutcome::kIgnored: return "ignored";
  }
  return "unknown";
}

const char* ErrorKindName(ErrorKind e) {
  switch (e) {
    case ErrorKind::kNone: return "none";
    case ErrorKind::kDns: return "dns";
    case ErrorKind::kConnectRefused: return "connect_refused";
    case ErrorKind::kConnectionReset: return "connection_reset";
    case ErrorKind::kTls: return "tls";
    case ErrorKind::kTimeout: return "timeout";
    case ErrorKind::kOther: return "other";
  }
  return "unknown";
}

}  // namespace retryd
