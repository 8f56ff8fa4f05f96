/* retryd/retryd.h: the stable C ABI of the retryd client library.
 *
 * This is what worker processes in any language bind to (Python, PHP, Ruby, Go, C). A worker
 * opens a client once, resolves each dependency by name once, and then, for every attempt of
 * every call, asks `retryd_admit` and reports back with `retryd_complete`:
 *
 *   retryd_client_t* c;  retryd_dependency_t orders;  retryd_permit_t p;
 *   if (retryd_open(NULL, &c) != RETRYD_OK) ...;           // cold: maps the host's segment
 *   retryd_resolve(c, "orders", &orders);                  // cold: once per dependency
 *   int d = retryd_admit(c, orders, attempt, &p);          // hot: a few atomic instructions
 *   if (d == RETRYD_ADMITTED || d == RETRYD_ADMITTED_PROBE) { ...send...; }
 *   retryd_complete(c, &p, RETRYD_SUCCESS, latency_ns);   // hot: always, whatever d was
 *
 * Ownership: the client is owned by the caller until retryd_close. Permits are caller-owned
 * plain structs (stack is fine); the library keeps no pointer to them.
 * Errors: cold-path functions return RETRYD_OK (0) or a negative RETRYD_E* code; the message
 * naming the problem is in retryd_last_error() (thread-local). Nothing throws.
 * Thread safety: a client may be used from any number of threads at once. After fork() the
 * child may keep using the parent's client: it registers itself as a new process on its next
 * admit (through the daemon's socket: the child closes its copy of the parent's connection at
 * the fork, and attaches with its own on its next admit or resolve).
 * ABI: structs the caller allocates (retryd_options_t, retryd_permit_t) never change size or
 * layout: a caller built against an older header passes the smaller struct. New settings come
 * as new functions (retryd_open_socket) or environment variables.
 * Hot path: retryd_admit and retryd_complete make no syscall, take no lock and allocate
 * nothing (except after fork or when the segment was replaced: a one-time reattach). */
#ifndef RETRYD_RETRYD_H_
#define RETRYD_RETRYD_H_

#include <stdint.h>

#include "retryd/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Result codes of cold-path calls. */
#define RETRYD_OK 0
#define RETRYD_EINVAL (-1)        /* bad argument: name, option, handle */
#define RETRYD_ENOENT (-2)        /* no segment, or no such dependency */
#define RETRYD_EPERM (-3)         /* the segment exists but may not be mapped by this user */
#define RETRYD_EINCOMPATIBLE (-4) /* foreign, truncated, corrupt, retired or newer segment */
#define RETRYD_EFULL (-5)         /* no free dependency or process slot */
#define RETRYD_EIO (-6)           /* any other system error */

/* Decisions of retryd_admit (non-negative). */
#define RETRYD_ADMITTED 0
#define RETRYD_ADMITTED_PROBE 1          /* admitted as the half-open probe */
#define RETRYD_REJECTED_OPEN 2           /* breaker open (or mode forced-open) */
#define RETRYD_REJECTED_HALF_OPEN_BUSY 3 /* half-open, the probe leases are taken */
#define RETRYD_REJECTED_BULKHEAD_FULL 4
#define RETRYD_REJECTED_BUDGET_EMPTY 5 /* a retry, and the host's retry budget is spent */

/* Outcomes for retryd_complete. */
#define RETRYD_SUCCESS 0
#define RETRYD_FAILURE 1 /* counts toward the breaker */
#define RETRYD_IGNORED 2 /* the caller's fault (a 4xx): the breaker does not see it */

/* Breaker states, from retryd_breaker_state (non-negative). */
#define RETRYD_STATE_CLOSED 0
#define RETRYD_STATE_OPEN 1      /* rejecting until its open period ends */
#define RETRYD_STATE_HALF_OPEN 2 /* letting probes through */

typedef struct retryd_client retryd_client_t;
typedef int32_t retryd_dependency_t;

/* A caller-allocated permit: what one admitted attempt holds until it completes.
 * `decision` is the last decision; the rest is private to the library. */
typedef struct retryd_permit {
  int32_t decision;
  uint32_t reserved;
  uint64_t opaque[5];
} retryd_permit_t;

typedef struct retryd_options {
  /* Segment name. NULL: $RETRYD_SEGMENT, else "retryd". Not used with a socket. */
  const char* segment;
  /* Nonzero (the default with NULL options): when no segment exists (no daemon answers at the
   * socket within 20 ms: none, stopped, hung), run on process-private state with the built-in
   * default policy instead of failing or waiting, and say so once in the log; the client moves
   * to the host's segment on its first call after one appears (the daemon answers). Zero:
   * retryd_open fails (after at most 1 s without an answer). A daemon that refuses the process
   * is an error either way (RETRYD_EPERM). */
  int fallback_to_local;
} retryd_options_t;

/* retryd_open maps the host's segment and registers this process. With no segment named in
 * `options`, it attaches through the daemon's Unix socket instead, as retryd_open_socket does,
 * when $RETRYD_SOCKET is set and non-empty (at that path) or, with $RETRYD_SEGMENT unset or
 * empty, when /run/retryd/retryd.sock exists (the packaged daemon's socket). On success stores
 * a new client in *out and returns RETRYD_OK; on error stores NULL and returns a RETRYD_E*
 * code. `options` may be NULL. Thread-safe. */
RETRYD_EXPORT int retryd_open(const retryd_options_t* options, retryd_client_t** out);

/* retryd_open_socket attaches through the daemon's Unix socket `socket_path` (the daemon's
 * config `socket`; NULL or "": as retryd_open), waiting at most 20 ms for the daemon's answer
 * (1 s with fallback_to_local zero); an answer that comes later is taken on a later call, which
 * never waits for it. The daemon registers the process and gives it the segment; the library
 * keeps the connection open (close-on-exec) until retryd_close, and the daemon takes its close,
 * however the process dies, as the process's death. Errors as retryd_open, and RETRYD_EPERM
 * when the daemon refuses the process (retryd_last_error() holds its reason). Thread-safe. */
RETRYD_EXPORT int retryd_open_socket(const char* socket_path, const retryd_options_t* options,
                                     retryd_client_t** out);

/* retryd_close unregisters this process (closes its connection) and frees the client. Permits not
 * yet completed are abandoned (their leases expire). NULL is a no-op. Not thread-safe with other
 * calls on the same client. */
RETRYD_EXPORT void retryd_close(retryd_client_t* client);

/* retryd_resolve finds (or, where the daemon allows, creates) dependency `name` and stores its
 * handle in *out. Returns RETRYD_OK, RETRYD_EINVAL (bad name), or RETRYD_OK with per-process
 * limits when the host's table is full or unknown names are refused (logged once). Cold path:
 * call once per dependency and keep the handle. Thread-safe. */
RETRYD_EXPORT int retryd_resolve(retryd_client_t* client, const char* name,
                                 retryd_dependency_t* out);

/* retryd_admit asks whether attempt number `attempt` (0 = first attempt, 1 = first retry...)
 * may go out now, and fills *permit (every word the library reads of it later: a caller need
 * not clear it first, and a compiler's clearing of it, in 16-byte stores, costs a third more
 * per call where the permit straddles a page). Returns the decision (RETRYD_ADMITTED...) or
 * RETRYD_EINVAL for a bad handle. Every admit must be followed by one retryd_complete with
 * the same permit, whatever the decision. Hot path. Thread-safe. */
RETRYD_EXPORT int retryd_admit(retryd_client_t* client, retryd_dependency_t dependency,
                               uint32_t attempt, retryd_permit_t* permit);

/* retryd_admit_no_probe is retryd_admit for an attempt that must not be the half-open probe:
 * one without the time a probe needs (a retry late in its deadline), which would spend the
 * breaker's few probes on a timeout of its own and reopen it. While the breaker is half-open it
 * is refused as RETRYD_REJECTED_HALF_OPEN_BUSY, taking nothing (in shadow mode it goes out, as
 * an ordinary attempt, and counts as one enforce would refuse); otherwise it decides as
 * retryd_admit. The retry loop (retryd_call.h) uses it for an attempt with less time left
 * than its attempt timeout, or half its deadline if less. Thread-safe. */
RETRYD_EXPORT int retryd_admit_no_probe(retryd_client_t* client, retryd_dependency_t dependency,
                                        uint32_t attempt, retryd_permit_t* permit);

/* retryd_complete reports how the attempt ended (RETRYD_SUCCESS, _FAILURE, _IGNORED) and how
 * long it took, and releases any lease the permit holds. A second call with the same permit,
 * or a call with a rejected permit, is a no-op. Hot path. Thread-safe. */
RETRYD_EXPORT void retryd_complete(retryd_client_t* client, retryd_permit_t* permit, int outcome,
                                   uint64_t latency_ns);

/* retryd_breaker_state returns the state of `dependency`'s breaker as this process sees it
 * now (RETRYD_STATE_CLOSED, _OPEN, _HALF_OPEN): the breaker word of its slot in the host's
 * segment, or of its per-process slot while the client runs on private state (retryd_is_local)
 * or the name is on per-process limits. A breaker whose open period has ended reads OPEN until
 * the next admit makes it HALF_OPEN. Breaker states only: a dependency whose mode is forced open
 * or disabled reads its breaker's state all the same. Returns RETRYD_EINVAL for a NULL client
 * or a bad handle, with the message in retryd_last_error(). One atomic load, no syscall and no
 * lock, but where admit would do more first (after a fork, or once the dependency's slot was
 * given to another name by a reload): then it does the same, and reads the breaker the next
 * admit uses. Nothing on the admit/complete path changes for a process that never calls it:
 * the bindings' state-change subscriptions call it only while they have a subscriber.
 * Thread-safe. */
RETRYD_EXPORT int retryd_breaker_state(retryd_client_t* client, retryd_dependency_t dependency);

/* retryd_is_local: 1 if the client runs on process-private state (no segment), else 0. */
RETRYD_EXPORT int retryd_is_local(const retryd_client_t* client);

/* retryd_strerror / retryd_decision_name: static strings for codes and decisions. */
RETRYD_EXPORT const char* retryd_strerror(int code);
RETRYD_EXPORT const char* retryd_decision_name(int decision);

/* retryd_last_error: the message of the last failed cold-path call on this thread ("" if
 * none). Valid until the next call on this thread. */
RETRYD_EXPORT const char* retryd_last_error(void);

/* retryd_set_log_callback routes the library's log lines (one line each, no newline) to `fn`;
 * NULL restores the default, one line on stderr. level: 0 info, 1 warning, 2 error.
 * Thread-safe; `fn` may be called from any thread that uses a client. */
typedef void (*retryd_log_fn)(void* context, int level, const char* line);
RETRYD_EXPORT void retryd_set_log_callback(retryd_log_fn fn, void* context);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* RETRYD_RETRYD_H_ */
