/* retryd/retryd_call.h: the retry loop (retryd/call.h) as a C ABI, for workers in any language.
 *
 * retryd_call makes one logical call to a dependency: it admits each attempt through the host's
 * segment, runs the caller's attempt callback with the time left for it, classifies the result
 * (retryd_policy.h), reports its breaker outcome, and retries with backoff, jitter and the
 * server's Retry-After while the policy, the retry budget and the deadline allow:
 *
 *   static int attempt(void* ctx, uint32_t n, int64_t remaining_ms, retryd_attempt_result_t* out) {
 *     struct response r = http_get(ctx, remaining_ms);     // remaining_ms: the attempt's timeout
 *     out->status = r.status;                              // 0 if no response
 *     out->error_kind = r.error;                           // RETRYD_ERROR_*
 *     out->retry_after = r.retry_after_header;             // NULL if none
 *     out->date = r.date_header;
 *     return 0;
 *   }
 *   retryd_call_policy_t policy;
 *   retryd_call_policy_init(&policy);
 *   policy.deadline_ms = 2000;
 *   retryd_call_result_t res;
 *   retryd_call(client, orders, &policy, attempt, &conn, NULL, NULL, NULL, &res);
 *   if (res.stop == RETRYD_STOP_REJECTED) serve_fallback();
 *
 * Ownership: every pointer argument is borrowed for the duration of the call only; the library
 * keeps none of them. Strings an attempt callback stores in its result must stay valid until
 * the callback is called again or retryd_call returns.
 * Callbacks run on the calling thread, inside retryd_call. They must not unwind through it (no
 * C++ exception, no longjmp out): report failure through the result or the return value.
 * Errors: retryd_call returns RETRYD_OK when the loop ran (how the call ended is in the result),
 * RETRYD_EINVAL for a bad argument, RETRYD_EIO if out of memory; nothing throws.
 * Thread safety: retryd_call is thread-safe: any number of threads may run calls on one client
 * at once, each with its own result struct.
 */
#ifndef RETRYD_RETRYD_CALL_H_
#define RETRYD_RETRYD_CALL_H_

#include <stdint.h>

#include "retryd/export.h"
#include "retryd/retryd.h"
#include "retryd/retryd_policy.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Why a call ended (retryd_call_result_t.stop), and the observer's next step. */
#define RETRYD_STOP_NONE 0                 /* observer only: the loop retries after wait_ns */
#define RETRYD_STOP_SUCCESS 1
#define RETRYD_STOP_TERMINAL 2             /* a terminal class (a 4xx, an unsafe call's timeout) */
#define RETRYD_STOP_ATTEMPTS_EXHAUSTED 3
#define RETRYD_STOP_REJECTED 4             /* not admitted: see `rejection` */
#define RETRYD_STOP_DEADLINE 5             /* no time left for another attempt and its wait */
#define RETRYD_STOP_RETRY_AFTER_TOO_LONG 6 /* the server asked for more than retry_after_max_ms */
#define RETRYD_STOP_CANCELLED 7            /* the env's sleep callback returned nonzero */
#define RETRYD_STOP_ABORTED 8              /* the attempt callback returned nonzero */

/* Passed as remaining_ms when neither a deadline nor an attempt timeout is set. */
#define RETRYD_NO_TIMEOUT INT64_MAX

/* The policy of a call. Initialize with retryd_call_policy_init, then change what you need. */
typedef struct retryd_call_policy {
  uint32_t max_attempts;             /* attempts, the first included. Default 3; 0 counts as 1 */
  int jitter;                        /* RETRYD_JITTER_*. Default RETRYD_JITTER_FULL */
  int64_t backoff_base_ms;           /* default 100 */
  int64_t backoff_cap_ms;            /* default 10000 */
  int64_t retry_after_jitter_max_ms; /* added to a Retry-After wait. Default 100 */
  int64_t retry_after_max_ms;        /* a longer Retry-After ends the call. Default 30000 */
  int64_t deadline_ms;               /* total budget, waits included; negative: none (default -1) */
  int64_t attempt_timeout_ms;        /* each attempt's timeout; 0 or negative: none (default -1) */
  int64_t expected_attempt_ms;       /* no attempt starts with less left; 0 (default): the
                                        slowest attempt of this call so far */
  const char* method;                /* as sent, case-sensitive. NULL: "GET" (default). Say
                                        "POST" for calls not safe to repeat: they fail closed */
  int has_idempotency_key;           /* nonzero: the request carries one (safe to repeat) */
  const retryd_classifier* classifier; /* NULL: the default table (classify.h) */
} retryd_call_policy_t;

/* What the attempt callback reports. retryd_call clears it before each attempt (status 0,
 * RETRYD_ERROR_NONE, retry_after_ms -1, strings NULL, attempt_class -1). */
typedef struct retryd_attempt_result {
  int status;             /* HTTP status; 0 when no response arrived */
  int error_kind;         /* RETRYD_ERROR_* */
  int64_t retry_after_ms; /* the server's wait, already parsed; -1: parse `retry_after` */
  const char* retry_after; /* the Retry-After header value or NULL; an unparsable one is ignored */
  const char* date;       /* the response's Date header or NULL (reference for an HTTP-date) */
  int attempt_class;      /* -1: classify; else a RETRYD_ATTEMPT_* that overrides the table */
  int breaker_outcome;    /* with an override: its RETRYD_BREAKER_OUTCOME_* (an override with
                             an unknown class or outcome is ignored) */
} retryd_attempt_result_t;

/* The attempt callback. `attempt` is 0 for the first attempt; `remaining_ms` is the time the
 * attempt has (min of the attempt timeout and what is left of the deadline, at least 1), or
 * RETRYD_NO_TIMEOUT: use it as the attempt's timeout and pass it downstream
 * (retryd_format_deadline_header). Return 0; nonzero ends the call at once
 * (RETRYD_STOP_ABORTED), the attempt being reported with the override outcome if set, else as
 * a failure. */
typedef int (*retryd_attempt_fn)(void* ctx, uint32_t attempt, int64_t remaining_ms,
                                 retryd_attempt_result_t* out);

/* What the observer sees, once per admission, after the loop decided what comes next. */
typedef struct retryd_attempt_info {
  uint32_t attempt;
  int decision;           /* RETRYD_ADMITTED...; a rejected admission sent nothing */
  int attempt_class;      /* RETRYD_ATTEMPT_* */
  int breaker_outcome;    /* RETRYD_BREAKER_OUTCOME_* as reported */
  int status;
  int error_kind;
  int64_t latency_ns;
  int64_t retry_after_ns; /* the server's wait; -1 if it sent none */
  int64_t wait_ns;        /* the wait chosen before the next attempt (0 when stopping) */
  int next;               /* RETRYD_STOP_NONE (retrying) or why the call ends */
} retryd_attempt_info_t;

typedef void (*retryd_observer_fn)(void* ctx, const retryd_attempt_info_t* info);

/* The world the loop runs in, for tests (virtual time, no real sleep) and for cancellable
 * sleeps. NULL env, or a NULL member: the real thing (CLOCK_MONOTONIC, nanosleep, the
 * per-thread generator, the wall clock). */
typedef struct retryd_call_env {
  void* ctx;
  int64_t (*now_ns)(void* ctx);                 /* a monotonic clock */
  int (*sleep_ns)(void* ctx, int64_t ns);       /* returns 0, or nonzero if interrupted */
  uint64_t (*random)(void* ctx);                /* uniform 64-bit values */
  int64_t (*wall_now_ms)(void* ctx);            /* Unix time in ms, for an HTTP-date */
} retryd_call_env_t;

typedef struct retryd_call_result {
  int stop;             /* RETRYD_STOP_* */
  int final_class;      /* RETRYD_ATTEMPT_* of the last attempt made; TERMINAL if none */
  uint32_t attempts;    /* attempts sent */
  int last_status;      /* of the last attempt made */
  int last_error_kind;
  int rejection;        /* the refusal that ended the call, else RETRYD_ADMITTED */
  int64_t elapsed_ns;   /* waits included */
} retryd_call_result_t;

/* retryd_call_policy_init fills *policy with the defaults above. NULL is a no-op. */
RETRYD_EXPORT void retryd_call_policy_init(retryd_call_policy_t* policy);

/* retryd_call makes one call to `dependency` (from retryd_resolve) under `policy` (NULL: the
 * defaults), running `attempt` for each admitted attempt and `observer` (may be NULL) after
 * each admission, and stores how it ended in *result. Returns RETRYD_OK; RETRYD_EINVAL with
 * *result untouched for a NULL client, attempt or result, an unknown jitter, a negative
 * backoff value; RETRYD_EINVAL with *result filled for a
 * dependency handle the client does not know (nothing was sent); RETRYD_EIO when out of
 * memory. Thread-safe. */
RETRYD_EXPORT int retryd_call(retryd_client_t* client, retryd_dependency_t dependency,
                              const retryd_call_policy_t* policy, retryd_attempt_fn attempt,
                              void* attempt_ctx, retryd_observer_fn observer, void* observer_ctx,
                              const retryd_call_env_t* env, retryd_call_result_t* result);

/* The same loop one step at a time, for callers whose waits must not block a thread (an event
 * loop: asyncio, Node.js, nginx's Lua). The caller makes each attempt and takes each wait
 * itself, on a timer; the library decides, admits, classifies and reports exactly as
 * retryd_call does (the same code runs both):
 *
 *   retryd_steps_t* call;
 *   if (retryd_steps_begin(client, orders, &policy, NULL, &call) != RETRYD_OK) ...;
 *   retryd_step_t step;
 *   while (retryd_steps_admit(call, &step) == RETRYD_STEP_ATTEMPT) {
 *     retryd_attempt_result_t out;
 *     retryd_attempt_result_init(&out);
 *     ... send attempt step.attempt with step.remaining_ms as its timeout; fill out ...
 *     if (retryd_steps_report(call, &out, 0, &step) == RETRYD_STEP_STOP) break;
 *     ... wait step.wait_ns on a timer (a coroutine's sleep, setTimeout, ngx.sleep) ...
 *   }
 *   retryd_call_result_t res;
 *   retryd_steps_end(call, &res);   (frees call; res.stop says how the call ended)
 *
 * A call's steps are not thread-safe: one thread at a time drives a call (any number of calls
 * may run at once on one client, from any threads). The env's now_ns, random and wall_now_ms
 * are used as retryd_call uses them; its sleep_ns is not (the caller waits). The policy and env
 * structs are copied (the method string too); the policy's classifier and the env's ctx are
 * borrowed and must stay valid until retryd_steps_end. */

/* What retryd_steps_admit and retryd_steps_report return. */
#define RETRYD_STEP_STOP 0    /* the call has ended: retryd_steps_end gives how */
#define RETRYD_STEP_ATTEMPT 1 /* admitted: send attempt `attempt` now, then retryd_steps_report */
#define RETRYD_STEP_WAIT 2    /* wait `wait_ns` (on a timer), then retryd_steps_admit */

typedef struct retryd_steps retryd_steps_t;

/* One step's details. */
typedef struct retryd_step {
  uint32_t attempt;     /* RETRYD_STEP_ATTEMPT: the attempt's number, 0 for the first */
  int probe;            /* RETRYD_STEP_ATTEMPT: nonzero if it is the breaker's half-open probe */
  int64_t remaining_ms; /* RETRYD_STEP_ATTEMPT: the attempt's timeout, as retryd_attempt_fn's */
  int64_t wait_ns;      /* RETRYD_STEP_WAIT: the wait before the next admission, else 0 */
  int has_record;       /* nonzero: `record` is what retryd_call's observer would be shown for
                           this step (after every report, and after a refused admission) */
  retryd_attempt_info_t record;
} retryd_step_t;

/* retryd_attempt_result_init clears *result as retryd_call clears it before each attempt. */
RETRYD_EXPORT void retryd_attempt_result_init(retryd_attempt_result_t* result);

/* retryd_steps_begin starts a call to `dependency` under `policy` (NULL: the defaults) and
 * stores it in *out; nothing is admitted yet. Returns RETRYD_OK; RETRYD_EINVAL for a NULL
 * client or out and for a policy retryd_call refuses; RETRYD_EIO when out of memory. The
 * client must outlive the call. */
RETRYD_EXPORT int retryd_steps_begin(retryd_client_t* client, retryd_dependency_t dependency,
                                     const retryd_call_policy_t* policy,
                                     const retryd_call_env_t* env, retryd_steps_t** out);

/* retryd_steps_admit checks the deadline and asks the host to admit the next attempt.
 * RETRYD_STEP_ATTEMPT: admitted (step->attempt, probe, remaining_ms); report it exactly once
 * with retryd_steps_report. RETRYD_STEP_STOP: the call has ended (the deadline, or a refusal,
 * with its record). Called in any other state (an attempt not yet reported, a call that has
 * ended) it changes nothing and returns RETRYD_STEP_STOP for an ended call, RETRYD_EINVAL
 * otherwise; RETRYD_EINVAL for a NULL argument. Never blocks. */
RETRYD_EXPORT int retryd_steps_admit(retryd_steps_t* call, retryd_step_t* step);

/* retryd_steps_report reports the admitted attempt's result (as the attempt callback fills it;
 * `abort` nonzero as the callback's nonzero return: the call ends, RETRYD_STOP_ABORTED) and
 * decides what comes next: RETRYD_STEP_WAIT (step->wait_ns) or RETRYD_STEP_STOP. The record
 * is in step->record. Strings in *result are read before it returns. RETRYD_EINVAL when no
 * attempt is waiting for its report, or for a NULL call or step. Never blocks. */
RETRYD_EXPORT int retryd_steps_report(retryd_steps_t* call, const retryd_attempt_result_t* result,
                                      int abort, retryd_step_t* step);

/* retryd_steps_cancel ends the call as RETRYD_STOP_CANCELLED (the caller gave up: a cancelled
 * coroutine, a client that went away). An attempt admitted and not yet reported is completed
 * with `outcome` (RETRYD_IGNORED when the caller's giving up says nothing about the
 * dependency; RETRYD_FAILURE when it does, a timeout of the caller's own). A call that has
 * already ended is not changed. NULL is a no-op. */
RETRYD_EXPORT void retryd_steps_cancel(retryd_steps_t* call, int outcome);

/* retryd_steps_end stores how the call ended in *result (may be NULL) and frees the call. A
 * call that has not ended is cancelled first, an attempt in flight completed as a failure (as
 * retryd_call reports an attempt whose callback failed). NULL is a no-op. */
RETRYD_EXPORT void retryd_steps_end(retryd_steps_t* call, retryd_call_result_t* result);

/* retryd_stop_name returns "success", "terminal", ... (retryd::StopReasonName), never NULL. */
RETRYD_EXPORT const char* retryd_stop_name(int stop);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* RETRYD_RETRYD_CALL_H_ */
