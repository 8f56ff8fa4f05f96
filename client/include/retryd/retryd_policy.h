/* retryd/retryd_policy.h: the retry-policy toolkit as a C ABI, for workers in any language.
 *
 * The same backoff, Retry-After, classification and deadline logic as the C++ headers
 * (backoff.h, retry_after.h, classify.h, deadline.h), as plain functions: integers and
 * NUL-terminated strings in, integers out through pointers. Nothing here touches the shared
 * segment, allocates (except retryd_classifier_new and _set_idempotent) or throws; time and
 * randomness are parameters, so every function is deterministic given its arguments (except
 * retryd_random and retryd_monotonic_now_ns, which read the world).
 *
 * Result codes: functions returning `int` return RETRYD_POLICY_OK (0) on success and a negative
 * RETRYD_POLICY_E* code on failure, and then leave every output untouched.
 * Strings: every `const char*` argument is borrowed for the duration of the call only.
 * Thread safety: every function is thread-safe, except that a retryd_classifier must not be
 * changed (retryd_classifier_set_*, _free) while another thread uses it.
 */
#ifndef RETRYD_RETRYD_POLICY_H_
#define RETRYD_RETRYD_POLICY_H_

#include <stddef.h>
#include <stdint.h>

#include "retryd/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Result codes. -10..-13 are the C++ retryd::ParseError values. */
#define RETRYD_POLICY_OK 0
#define RETRYD_POLICY_EINVAL (-1)     /* a null pointer, unknown enum value or bad number */
#define RETRYD_POLICY_ENOMEM (-2)     /* allocation failed */
#define RETRYD_POLICY_ENOSPC (-3)     /* the output buffer is too small */
#define RETRYD_POLICY_EEMPTY (-10)    /* the header value is empty or only whitespace */
#define RETRYD_POLICY_EMALFORMED (-11) /* the header value is off the grammar */
#define RETRYD_POLICY_ENEGATIVE (-12) /* a negative number where none is allowed */
#define RETRYD_POLICY_ERANGE (-13)    /* a number too large to represent */

/* retryd_policy_strerror returns a static description of `code` ("malformed header value"),
 * never NULL. */
RETRYD_EXPORT const char* retryd_policy_strerror(int code);

/* ---- Backoff (backoff.h) ------------------------------------------------------------------ */

#define RETRYD_JITTER_NONE 0
#define RETRYD_JITTER_FULL 1
#define RETRYD_JITTER_EQUAL 2
#define RETRYD_JITTER_DECORRELATED 3

/* retryd_random returns the next value of this thread's generator (retryd::ThreadLocalRandom:
 * seeded per thread, reseeded after fork). Pass it as `random` below. */
RETRYD_EXPORT uint64_t retryd_random(void);

/* retryd_backoff_ns stores in *wait_ns the wait before the retry that follows `attempt`
 * earlier retries (0 before the first retry): min(cap, base * 2^attempt) shaped by `jitter`,
 * with `random` as the only randomness. `prev_ns` is the previous wait, used only by
 * RETRYD_JITTER_DECORRELATED (pass 0 before the first retry). Every `attempt` up to UINT32_MAX
 * is safe. The result is in [0, cap_ns].
 * Returns RETRYD_POLICY_EINVAL for an unknown jitter, a null wait_ns, or a negative base_ns,
 * cap_ns or prev_ns. */
RETRYD_EXPORT int retryd_backoff_ns(int jitter, int64_t base_ns, int64_t cap_ns,
                                    uint32_t attempt, int64_t prev_ns, uint64_t random,
                                    int64_t* wait_ns);

/* retryd_merge_wait_ns stores in *wait_ns
 *   max(backoff_ns, retry_after_ns + U[0, retry_after_jitter_max_ns])
 * or backoff_ns when retry_after_ns is negative (no Retry-After). The jitter keeps
 * "Retry-After: 0" from becoming a tight loop. Returns RETRYD_POLICY_EINVAL for a null wait_ns
 * or a negative backoff_ns or retry_after_jitter_max_ns. */
RETRYD_EXPORT int retryd_merge_wait_ns(int64_t backoff_ns, int64_t retry_after_ns,
                                       int64_t retry_after_jitter_max_ns, uint64_t random,
                                       int64_t* wait_ns);

/* ---- Retry-After (retry_after.h) ---------------------------------------------------------- */

#define RETRYD_RETRY_AFTER_DEFAULT_MAX_WAIT_MS 300000

/* retryd_parse_http_date parses an HTTP-date in IMF-fixdate, RFC 850 or asctime form and
 * stores the instant in seconds since the Unix epoch in *unix_seconds. `now_unix_ms` (the local
 * wall clock) resolves an RFC 850 two-digit year. Returns RETRYD_POLICY_EEMPTY,
 * RETRYD_POLICY_EMALFORMED, or RETRYD_POLICY_EINVAL for a null pointer. */
RETRYD_EXPORT int retryd_parse_http_date(const char* value, int64_t now_unix_ms,
                                         int64_t* unix_seconds);

/* retryd_parse_retry_after parses a Retry-After value (delay-seconds or HTTP-date) and stores
 * in *wait_ms how long to wait from now, in [0, max_wait_ms]. `date_header` is the response's
 * Date header or NULL; when it parses it is the reference clock for an HTTP-date (clock skew),
 * else `now_unix_ms` is. A past date gives 0. A longer wait is clamped to `max_wait_ms` (pass
 * RETRYD_RETRY_AFTER_DEFAULT_MAX_WAIT_MS for the default).
 * Returns RETRYD_POLICY_EEMPTY, _EMALFORMED (garbage, fraction, trailing junk, bad date),
 * _ENEGATIVE ("-5"), _ERANGE (more than 2^63 ms), or _EINVAL (null value or wait_ms, or
 * max_wait_ms < 0). A failure is never reported as a wait of 0. */
RETRYD_EXPORT int retryd_parse_retry_after(const char* value, const char* date_header,
                                           int64_t now_unix_ms, int64_t max_wait_ms,
                                           int64_t* wait_ms);

/* ---- Classification (classify.h) ---------------------------------------------------------- */

#define RETRYD_ERROR_NONE 0
#define RETRYD_ERROR_DNS 1
#define RETRYD_ERROR_CONNECT_REFUSED 2
#define RETRYD_ERROR_CONNECTION_RESET 3
#define RETRYD_ERROR_TLS 4
#define RETRYD_ERROR_TIMEOUT 5
#define RETRYD_ERROR_OTHER 6

#define RETRYD_ATTEMPT_SUCCESS 0
#define RETRYD_ATTEMPT_RETRYABLE 1
#define RETRYD_ATTEMPT_TERMINAL 2

/* The same values as the completion outcomes RETRYD_SUCCESS, RETRYD_FAILURE and
 * RETRYD_IGNORED of retryd.h: pass *breaker_outcome straight on. */
#define RETRYD_BREAKER_OUTCOME_SUCCESS 0
#define RETRYD_BREAKER_OUTCOME_FAILURE 1
#define RETRYD_BREAKER_OUTCOME_IGNORED 2

/* retryd_classify classifies one attempt's result with the default policy (the table in
 * classify.h): `method` as sent ("GET", case-sensitive), `status` the HTTP status or 0 with no
 * response, `error_kind` a RETRYD_ERROR_*, `has_idempotency_key` nonzero if the request carries
 * one. Stores a RETRYD_ATTEMPT_* in *attempt_class and a RETRYD_BREAKER_OUTCOME_* in
 * *breaker_outcome. Returns RETRYD_POLICY_EINVAL for a null pointer, a status outside 0..999 or
 * an unknown error kind. */
RETRYD_EXPORT int retryd_classify(const char* method, int status, int error_kind,
                                  int has_idempotency_key, int* attempt_class,
                                  int* breaker_outcome);

/* A classification policy of one's own: the defaults, then overrides. Owned by the caller:
 * create with retryd_classifier_new (NULL if out of memory), release with
 * retryd_classifier_free (NULL is fine). Configure it before sharing it between threads. */
typedef struct retryd_classifier retryd_classifier;

RETRYD_EXPORT retryd_classifier* retryd_classifier_new(void);
RETRYD_EXPORT void retryd_classifier_free(retryd_classifier* classifier);

/* retryd_classifier_set_status sets the rule for one status (100..599): the class for a call
 * safe to repeat, the breaker outcome, and whether a retryable status also retries a call that
 * is not safe to repeat (`retry_unsafe` nonzero: the status proves the request was not
 * processed). Returns RETRYD_POLICY_EINVAL for a null classifier, a status out of range or an
 * unknown class or outcome. */
RETRYD_EXPORT int retryd_classifier_set_status(retryd_classifier* classifier, int status,
                                               int attempt_class, int breaker_outcome,
                                               int retry_unsafe);
/* retryd_classifier_set_error: the same for a transport error kind (not RETRYD_ERROR_NONE). */
RETRYD_EXPORT int retryd_classifier_set_error(retryd_classifier* classifier, int error_kind,
                                              int attempt_class, int breaker_outcome,
                                              int retry_unsafe);
/* retryd_classifier_set_idempotent adds `method` to (nonzero `idempotent`) or removes it from
 * the idempotent methods. Returns RETRYD_POLICY_EINVAL for a null pointer, _ENOMEM if out of
 * memory. */
RETRYD_EXPORT int retryd_classifier_set_idempotent(retryd_classifier* classifier,
                                                   const char* method, int idempotent);
/* retryd_classifier_classify: retryd_classify with `classifier`'s policy. */
RETRYD_EXPORT int retryd_classifier_classify(const retryd_classifier* classifier,
                                             const char* method, int status, int error_kind,
                                             int has_idempotency_key, int* attempt_class,
                                             int* breaker_outcome);

/* ---- Deadline (deadline.h) ---------------------------------------------------------------- */

/* The header that carries the remaining budget downstream, in the gRPC timeout format
 * ("1500m": 1 to 8 digits and a unit H M S m u n; see deadline.h). */
#define RETRYD_DEADLINE_HEADER_NAME "grpc-timeout"
/* A buffer of this many bytes holds any formatted value and its NUL. */
#define RETRYD_DEADLINE_HEADER_BUFSIZE 10

/* A deadline: a plain value owned by the caller; copy it freely. Time is passed in as
 * `now_ns` from one monotonic clock (retryd_monotonic_now_ns, or the caller's own). */
typedef struct retryd_deadline {
  int64_t start_ns;
  int64_t budget_ns; /* INT64_MAX: never expires */
} retryd_deadline;

/* retryd_monotonic_now_ns returns CLOCK_MONOTONIC in nanoseconds. */
RETRYD_EXPORT int64_t retryd_monotonic_now_ns(void);

/* retryd_deadline_start starts a budget of `budget_ns` at `now_ns`. Returns
 * RETRYD_POLICY_EINVAL for a null deadline or a negative budget. */
RETRYD_EXPORT int retryd_deadline_start(retryd_deadline* deadline, int64_t budget_ns,
                                        int64_t now_ns);
/* retryd_deadline_remaining_ns returns the time left at `now_ns`, in [0, budget_ns] (also if
 * the clock went backwards); 0 for a null deadline. */
RETRYD_EXPORT int64_t retryd_deadline_remaining_ns(const retryd_deadline* deadline,
                                                   int64_t now_ns);
/* retryd_deadline_expired returns 1 if no time is left at `now_ns` (or deadline is NULL),
 * else 0. */
RETRYD_EXPORT int retryd_deadline_expired(const retryd_deadline* deadline, int64_t now_ns);
/* retryd_deadline_can_finish returns 1 if something taking `duration_ns` (a wait plus an
 * attempt), started at `now_ns`, ends within the deadline; else 0 (also for NULL). */
RETRYD_EXPORT int retryd_deadline_can_finish(const retryd_deadline* deadline, int64_t now_ns,
                                             int64_t duration_ns);

/* retryd_format_deadline_header writes the header value for `remaining_ns` (negative counts
 * as 0), NUL-terminated, into buf[0..buf_size) and returns its length (without the NUL).
 * Returns RETRYD_POLICY_EINVAL for a null buf, _ENOSPC if buf_size is too small (size it
 * RETRYD_DEADLINE_HEADER_BUFSIZE). */
RETRYD_EXPORT int retryd_format_deadline_header(int64_t remaining_ns, char* buf,
                                                size_t buf_size);
/* retryd_parse_deadline_header parses a header value and stores the timeout in *timeout_ns
 * (INT64_MAX when it is longer than that). Returns RETRYD_POLICY_EEMPTY, _ENEGATIVE,
 * _EMALFORMED (off the grammar), or _EINVAL for a null pointer. */
RETRYD_EXPORT int retryd_parse_deadline_header(const char* value, int64_t* timeout_ns);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* RETRYD_RETRYD_POLICY_H_ */
