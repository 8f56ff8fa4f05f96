// The C ABI of the retry-policy toolkit: argument checks and conversions around the C++
// functions. Nothing here may throw across the ABI: the only allocations (new classifier, a
// method name added to its set) are caught and reported as RETRYD_POLICY_ENOMEM.
#include "retryd/retryd_policy.h"

#include <chrono>
#include <cstring>
#include <new>
#include <optional>
#include <string>

#include "deadline_math.h"
#include "retryd/backoff.h"
#include "retryd/classify.h"
#include "retryd/deadline.h"
#include "retryd/retry_after.h"

struct retryd_classifier {
  retryd::ClassificationPolicy policy;
};

namespace {

using std::chrono::milliseconds;
using std::chrono::nanoseconds;
using std::chrono::system_clock;

system_clock::time_point FromUnixMs(int64_t unix_ms) {
  return system_clock::time_point(
      std::chrono::duration_cast<system_clock::duration>(milliseconds(unix_ms)));
}

bool ValidRule(int attempt_class, int breaker_outcome) {
  return attempt_class >= RETRYD_ATTEMPT_SUCCESS && attempt_class <= RETRYD_ATTEMPT_TERMINAL &&
         breaker_outcome >= RETRYD_BREAKER_OUTCOME_SUCCESS &&
         breaker_outcome <= RETRYD_BREAKER_OUTCOME_IGNORED;
}

retryd::ClassificationPolicy::Rule MakeRule(int attempt_class, int breaker_outcome,
                                            int retry_unsafe) {
  return {retryd::AttemptClass(attempt_class), retryd::BreakerOutcome(breaker_outcome),
          retry_unsafe != 0};
}

int Classify(const retryd::ClassificationPolicy& policy, const char* method, int status,
             int error_kind, int has_idempotency_key, int* attempt_class, int* breaker_outcome) {
  if (method == nullptr || attempt_class == nullptr || breaker_outcome == nullptr ||
      status < 0 || status > 999 || error_kind < RETRYD_ERROR_NONE ||
      error_kind > RETRYD_ERROR_OTHER) {
    return RETRYD_POLICY_EINVAL;
  }
  retryd::Classification c = policy.Classify(method, status, retryd::ErrorKind(error_kind),
                                             has_idempotency_key != 0);
  *attempt_class = int(c.attempt_class);
  *breaker_outcome = int(c.breaker);
  return RETRYD_POLICY_OK;
}

static_assert(RETRYD_POLICY_EEMPTY == int(retryd::ParseError::kEmpty));
static_assert(RETRYD_POLICY_EMALFORMED == int(retryd::ParseError::kMalformed));
static_assert(RETRYD_POLICY_ENEGATIVE == int(retryd::ParseError::kNegative));
static_assert(RETRYD_POLICY_ERANGE == int(retryd::ParseError::kOutOfRange));
static_assert(RETRYD_JITTER_DECORRELATED == int(retryd::Jitter::kDecorrelated));
static_assert(RETRYD_ERROR_OTHER == int(retryd::ErrorKind::kOther));
static_assert(RETRYD_ERROR_OTHER + 1 == retryd::kErrorKindCount);
static_assert(RETRYD_ATTEMPT_TERMINAL == int(retryd::AttemptClass::kTerminal));
static_assert(RETRYD_BREAKER_OUTCOME_IGNORED == int(retryd::BreakerOutcome::kIgnored));
static_assert(RETRYD_DEADLINE_HEADER_BUFSIZE == retryd::kDeadlineHeaderMaxLength + 1);

}  // namespace

extern "C" {

const char* retryd_policy_strerror(int code) {
  switch (code) {
    case RETRYD_POLICY_OK: return "ok";
    case RETRYD_POLICY_EINVAL: return "invalid argument";
    case RETRYD_POLICY_ENOMEM: return "out of memory";
    case RETRYD_POLICY_ENOSPC: return "buffer too small";
    case RETRYD_POLICY_EEMPTY: return "empty header value";
    case RETRYD_POLICY_EMALFORMED: return "malformed header value";
    case RETRYD_POLICY_ENEGATIVE: return "negative header value";
    case RETRYD_POLICY_ERANGE: return "header value out of range";
  }
  return "unknown retryd policy error";
}

uint64_t retryd_random(void) { return retryd::ThreadLocalRandom(); }

int retryd_backoff_ns(int jitter, int64_t base_ns, int64_t cap_ns, uint32_t attempt,
                      int64_t prev_ns, uint64_t random, int64_t* wait_ns) {
  if (wait_ns == nullptr || jitter < RETRYD_JITTER_NONE || jitter > RETRYD_JITTER_DECORRELATED ||
      base_ns < 0 || cap_ns < 0 || prev_ns < 0) {
    return RETRYD_POLICY_EINVAL;
  }
  *wait_ns = retryd::BackoffWait(retryd::Jitter(jitter), nanoseconds(base_ns),
                                 nanoseconds(cap_ns), attempt, nanoseconds(prev_ns), random)
                 .count();
  return RETRYD_POLICY_OK;
}

int retryd_merge_wait_ns(int64_t backoff_ns, int64_t retry_after_ns,
                         int64_t retry_after_jitter_max_ns, uint64_t random, int64_t* wait_ns) {
  if (wait_ns == nullptr || backoff_ns < 0 || retry_after_jitter_max_ns < 0) {
    return RETRYD_POLICY_EINVAL;
  }
  std::optional<nanoseconds> retry_after;
  if (retry_after_ns >= 0) retry_after = nanoseconds(retry_after_ns);
  *wait_ns = retryd::MergeWait(nanoseconds(backoff_ns), retry_after,
                               nanoseconds(retry_after_jitter_max_ns), random)
                 .count();
  return RETRYD_POLICY_OK;
}

int retryd_parse_http_date(const char* value, int64_t now_unix_ms, int64_t* unix_seconds) {
  if (value == nullptr || unix_seconds == nullptr) return RETRYD_POLICY_EINVAL;
  return int(retryd::ParseHttpDate(value, FromUnixMs(now_unix_ms), unix_seconds));
}

int retryd_parse_retry_after(const char* value, const char* date_header, int64_t now_unix_ms,
                             int64_t max_wait_ms, int64_t* wait_ms) {
  if (value == nullptr || wait_ms == nullptr || max_wait_ms < 0) return RETRYD_POLICY_EINVAL;
  retryd::RetryAfterOptions options;
  options.max_wait = milliseconds(max_wait_ms);
  retryd::RetryAfter parsed;
  retryd::ParseError e =
      retryd::ParseRetryAfter(value, date_header != nullptr ? date_header : "",
                              FromUnixMs(now_unix_ms), &parsed, options);
  if (e != retryd::ParseError::kNone) return int(e);
  *wait_ms = parsed.wait.count();
  return RETRYD_POLICY_OK;
}

int retryd_classify(const char* method, int status, int error_kind, int has_idempotency_key,
                    int* attempt_class, int* breaker_outcome) {
  return Classify(retryd::ClassificationPolicy::Default(), method, status, error_kind,
                  has_idempotency_key, attempt_class, breaker_outcome);
}

retryd_classifier* retryd_classifier_new(void) {
  return new (std::nothrow) retryd_classifier();
}

void retryd_classifier_free(retryd_classifier* classifier) { delete classifier; }

int retryd_classifier_set_status(retryd_classifier* classifier, int status, int attempt_class,
                                 int breaker_outcome, int retry_unsafe) {
  if (classifier == nullptr || !ValidRule(attempt_class, breaker_outcome)) {
    return RETRYD_POLICY_EINVAL;
  }
  bool ok = classifier->policy.SetStatus(status,
                                         MakeRule(attempt_class, breaker_outcome, retry_unsafe));
  return ok ? RETRYD_POLICY_OK : RETRYD_POLICY_EINVAL;
}

int retryd_classifier_set_error(retryd_classifier* classifier, int error_kind, int attempt_class,
                                int breaker_outcome, int retry_unsafe) {
  if (classifier == nullptr || !ValidRule(attempt_class, breaker_outcome) ||
      error_kind <= RETRYD_ERROR_NONE || error_kind > RETRYD_ERROR_OTHER) {
    return RETRYD_POLICY_EINVAL;
  }
  classifier->policy.SetError(retryd::ErrorKind(error_kind),
                              MakeRule(attempt_class, breaker_outcome, retry_unsafe));
  return RETRYD_POLICY_OK;
}

int retryd_classifier_set_idempotent(retryd_classifier* classifier, const char* method,
                                     int idempotent) {
  if (classifier == nullptr || method == nullptr) return RETRYD_POLICY_EINVAL;
  try {
    classifier->policy.SetIdempotent(method, idempotent != 0);
  } catch (const std::bad_alloc&) {
    return RETRYD_POLICY_ENOMEM;
  }
  return RETRYD_POLICY_OK;
}

int retryd_classifier_classify(const retryd_classifier* classifier, const char* method,
                               int status, int error_kind, int has_idempotency_key,
                               int* attempt_class, int* breaker_outcome) {
  if (classifier == nullptr) return RETRYD_POLICY_EINVAL;
  return Classify(classifier->policy, method, status, error_kind, has_idempotency_key,
                  attempt_class, breaker_outcome);
}

int64_t retryd_monotonic_now_ns(void) { return retryd::Clock::Steady().Now().count(); }

int retryd_deadline_start(retryd_deadline* deadline, int64_t budget_ns, int64_t now_ns) {
  if (deadline == nullptr || budget_ns < 0) return RETRYD_POLICY_EINVAL;
  deadline->start_ns = now_ns;
  deadline->budget_ns = budget_ns;
  return RETRYD_POLICY_OK;
}

int64_t retryd_deadline_remaining_ns(const retryd_deadline* deadline, int64_t now_ns) {
  if (deadline == nullptr || deadline->budget_ns < 0) return 0;
  return retryd::policy_internal::Remaining(nanoseconds(deadline->start_ns),
                                            nanoseconds(deadline->budget_ns),
                                            nanoseconds(now_ns))
      .count();
}

int retryd_deadline_expired(const retryd_deadline* deadline, int64_t now_ns) {
  return retryd_deadline_remaining_ns(deadline, now_ns) == 0 ? 1 : 0;
}

int retryd_deadline_can_finish(const retryd_deadline* deadline, int64_t now_ns,
                               int64_t duration_ns) {
  nanoseconds remaining(retryd_deadline_remaining_ns(deadline, now_ns));
  return retryd::policy_internal::CanFinish(remaining, nanoseconds(duration_ns)) ? 1 : 0;
}

int retryd_format_deadline_header(int64_t remaining_ns, char* buf, size_t buf_size) {
  if (buf == nullptr) return RETRYD_POLICY_EINVAL;
  char text[retryd::kDeadlineHeaderMaxLength];
  size_t length = retryd::FormatDeadlineHeader(nanoseconds(remaining_ns), text);
  if (length + 1 > buf_size) return RETRYD_POLICY_ENOSPC;
  std::memcpy(buf, text, length);
  buf[length] = '\0';
  return int(length);
}

int retryd_parse_deadline_header(const char* value, int64_t* timeout_ns) {
  if (value == nullptr || timeout_ns == nullptr) return RETRYD_POLICY_EINVAL;
  nanoseconds timeout;
  retryd::ParseError e = retryd::ParseDeadlineHeader(value, &timeout);
  if (e != retryd::ParseError::kNone) return int(e);
  *timeout_ns = timeout.count();
  return RETRYD_POLICY_OK;
}

}  // extern "C"
