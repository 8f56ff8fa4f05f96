/* retryd_node.c: the Node.js addon of retryd, a thin layer of Node-API (node_api.h, NAPI_VERSION
 * 8, so one build loads in every Node.js from 16 on) over the C ABI of libretryd (retryd.h,
 * retryd_call.h, retryd_policy.h). lib/ builds the JavaScript API on it; nothing here is public.
 *
 * libretryd is opened with dlopen on first use, not linked: the path in $RETRYD_LIBRARY if set,
 * else its soname, libretryd.so.0 (the libretryd0 package, or LD_LIBRARY_PATH), as the Python
 * and Ruby bindings find it. So `require('retryd')` never fails for want of the library (the
 * first Client says what is missing), the addon builds with the headers alone, and one build of
 * it runs over whichever libretryd0 the host has. The retry loop's steps (retryd_steps_*) are
 * looked up on their own: a library without them still admits and completes.
 *
 * Hot path: admit and complete pass the permit through a buffer shared with JavaScript (one per
 * addon instance, so per thread), not through a JavaScript object made here: admit writes the
 * permit (a plain struct the library keeps no pointer to, so it may be copied) and its start
 * time into it, the Permit object copies them out, and complete reads what the Permit copied
 * back in. No allocation, no handle scope and no object creation on either call.
 *
 * Lifetimes: a client, a classifier and a call in progress are each a native box behind a
 * JavaScript external, counted by the boxes that use it, so finalizers that run in any order
 * (a garbage collection, a worker thread's exit) never free a client a call still uses.
 * Thread safety: every function runs on the JavaScript thread of its instance; the boxes are
 * never shared between instances (an external cannot cross threads). Loading the library is
 * done once per process (pthread_once). */
#define _GNU_SOURCE /* dladdr */
#define NAPI_VERSION 8
#include <node_api.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "retryd/retryd.h"
#include "retryd/retryd_call.h"
#include "retryd/retryd_policy.h"

/* ---- the library ------------------------------------------------------------------------- */

#define RETRYD_REQUIRED(X)                                                                  \
  X(retryd_open) X(retryd_open_socket) X(retryd_close) X(retryd_resolve) X(retryd_admit)   \
  X(retryd_complete) X(retryd_breaker_state) X(retryd_is_local) X(retryd_strerror)         \
  X(retryd_last_error) X(retryd_format_deadline_header) X(retryd_classifier_new)            \
  X(retryd_classifier_free) X(retryd_classifier_set_status) X(retryd_classifier_set_error)  \
  X(retryd_classifier_set_idempotent) X(retryd_call_policy_init) X(retryd_stop_name)
#define RETRYD_STEPS(X)                                                                     \
  X(retryd_attempt_result_init) X(retryd_steps_begin) X(retryd_steps_admit)                 \
  X(retryd_steps_report) X(retryd_steps_cancel) X(retryd_steps_end)

#define DECLARE_FN(name) __typeof__(name)* name;
static struct {
  RETRYD_REQUIRED(DECLARE_FN)
  RETRYD_STEPS(DECLARE_FN)
} lib;
#undef DECLARE_FN

static pthread_once_t lib_once = PTHREAD_ONCE_INIT;
static int lib_ok;           /* the required functions are there */
static int lib_has_steps;    /* and the retry loop's steps */
static char lib_error[2048]; /* why not, when !lib_ok */
static char lib_path[1024];  /* the file it came from */

static void load_library(void) {
  const char* env = getenv("RETRYD_LIBRARY");
  const char* path = env && *env ? env : "libretryd.so.0";
  void* handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = dlerror();
    snprintf(lib_error, sizeof lib_error,
             "libretryd not found; install libretryd0 or set RETRYD_LIBRARY to its path (%s)",
             why ? why : path);
    return;
  }
#define LOAD_REQUIRED(name)                                                              \
  if (!(lib.name = (__typeof__(name)*)dlsym(handle, #name))) {                           \
    snprintf(lib_error, sizeof lib_error, "%s: no symbol %s (not libretryd, or too old)", \
             path, #name);                                                               \
    dlclose(handle);                                                                     \
    return;                                                                              \
  }
  RETRYD_REQUIRED(LOAD_REQUIRED)
#undef LOAD_REQUIRED
  lib_has_steps = 1;
#define LOAD_STEPS(name) \
  if (!(lib.name = (__typeof__(name)*)dlsym(handle, #name))) lib_has_steps = 0;
  RETRYD_STEPS(LOAD_STEPS)
#undef LOAD_STEPS
  Dl_info info;
  if (dladdr((void*)lib.retryd_open, &info) && info.dli_fname) {
    snprintf(lib_path, sizeof lib_path, "%s", info.dli_fname);
  } else {
    snprintf(lib_path, sizeof lib_path, "%s", path);
  }
  lib_ok = 1;
}

static int library_loaded(void) {
  pthread_once(&lib_once, load_library);
  return lib_ok;
}

/* ---- Node-API plumbing ------------------------------------------------------------------- */

/* The buffers shared with JavaScript. permit: the retryd_permit_t (12 words) and the admission's
 * monotonic time in ns (2 words, low first). step: a step's or a call's numbers. */
#define PERMIT_WORDS 14
#define STEP_SLOTS 16

typedef struct {
  int32_t* permit;
  double* step;
  napi_ref permit_ref;
  napi_ref step_ref;
} addon_t;

/* Returned instead of a decision or code when the client was closed. */
#define CLOSED_CODE (-1000)

#define CHECK(env, call)                                                      \
  do {                                                                        \
    if ((call) != napi_ok) {                                                  \
      const napi_extended_error_info* info_ = NULL;                           \
      napi_get_last_error_info((env), &info_);                                \
      bool pending_ = false;                                                  \
      napi_is_exception_pending((env), &pending_);                            \
      if (!pending_) {                                                        \
        napi_throw_error((env), NULL,                                         \
                         info_ && info_->error_message ? info_->error_message \
                                                       : "retryd: Node-API call failed"); \
      }                                                                       \
      return NULL;                                                            \
    }                                                                         \
  } while (0)

#define ARGS(n)                                                                  \
  size_t argc = (n);                                                             \
  napi_value argv[(n) > 0 ? (n) : 1];                                            \
  addon_t* addon = NULL;                                                         \
  CHECK(env, napi_get_cb_info(env, info, &argc, argv, NULL, (void**)&addon));    \
  (void)addon

static napi_value make_int(napi_env env, int32_t v) {
  napi_value out;
  return napi_create_int32(env, v, &out) == napi_ok ? out : NULL;
}

static napi_value make_string(napi_env env, const char* s) {
  napi_value out;
  return napi_create_string_utf8(env, s ? s : "", NAPI_AUTO_LENGTH, &out) == napi_ok ? out
                                                                                     : NULL;
}

static napi_value undefined(napi_env env) {
  napi_value out;
  napi_get_undefined(env, &out);
  return out;
}

static int is_nullish(napi_env env, napi_value v) {
  napi_valuetype t;
  return napi_typeof(env, v, &t) != napi_ok || t == napi_undefined || t == napi_null;
}

/* Copies a string argument into a malloc'd buffer (NULL for null or undefined). Returns 0 and
 * throws on anything else. */
static int get_string(napi_env env, napi_value v, char** out) {
  *out = NULL;
  if (is_nullish(env, v)) return 1;
  size_t len = 0;
  if (napi_get_value_string_utf8(env, v, NULL, 0, &len) != napi_ok) {
    napi_throw_type_error(env, NULL, "retryd: expected a string");
    return 0;
  }
  *out = malloc(len + 1);
  if (!*out) {
    napi_throw_error(env, NULL, "retryd: out of memory");
    return 0;
  }
  napi_get_value_string_utf8(env, v, *out, len + 1, &len);
  return 1;
}

static int64_t monotonic_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---- clients ----------------------------------------------------------------------------- */

typedef struct {
  retryd_client_t* client; /* NULL once closed */
  uint32_t calls;          /* calls in progress (steps), which need the client open */
  int close_requested;     /* close() was called, or the external was collected */
  int external_alive;
} client_box;

static void client_box_settle(client_box* box) {
  if (box->close_requested && box->calls == 0 && box->client) {
    lib.retryd_close(box->client);
    box->client = NULL;
  }
  if (!box->external_alive && box->calls == 0) free(box);
}

static void client_finalize(napi_env env, void* data, void* hint) {
  (void)env;
  (void)hint;
  client_box* box = data;
  box->close_requested = 1;
  box->external_alive = 0;
  client_box_settle(box);
}

/* The client behind an external, or NULL (and CLOSED_CODE is what to answer) once closed. */
static retryd_client_t* client_of(napi_env env, napi_value v, client_box** box_out) {
  void* data = NULL;
  if (napi_get_value_external(env, v, &data) != napi_ok || !data) return NULL;
  client_box* box = data;
  if (box_out) *box_out = box;
  return box->close_requested ? NULL : box->client;
}

/* load() -> null, or why the library cannot be used. */
static napi_value fn_load(napi_env env, napi_callback_info info) {
  (void)info;
  if (library_loaded()) {
    napi_value out;
    napi_get_null(env, &out);
    return out;
  }
  return make_string(env, lib_error);
}

static napi_value fn_library_path(napi_env env, napi_callback_info info) {
  (void)info;
  return make_string(env, library_loaded() ? lib_path : "");
}

/* open(segment|null, socket|null, fallbackToLocal) -> external, or a RETRYD_E* code. */
static napi_value fn_open(napi_env env, napi_callback_info info) {
  ARGS(3);
  if (!library_loaded()) {
    napi_throw_error(env, "RETRYD_LIBRARY_NOT_FOUND", lib_error);
    return NULL;
  }
  char *segment = NULL, *socket = NULL;
  bool fallback = true;
  if (!get_string(env, argv[0], &segment)) return NULL;
  if (!get_string(env, argv[1], &socket)) {
    free(segment);
    return NULL;
  }
  napi_get_value_bool(env, argv[2], &fallback);
  retryd_options_t options = {segment, fallback ? 1 : 0};
  retryd_client_t* client = NULL;
  int rc = socket && *socket ? lib.retryd_open_socket(socket, &options, &client)
                             : lib.retryd_open(&options, &client);
  free(segment);
  free(socket);
  if (rc != RETRYD_OK) return make_int(env, rc);
  client_box* box = calloc(1, sizeof *box);
  if (!box) {
    lib.retryd_close(client);
    napi_throw_error(env, NULL, "retryd: out of memory");
    return NULL;
  }
  box->client = client;
  box->external_alive = 1;
  napi_value out;
  if (napi_create_external(env, box, client_finalize, NULL, &out) != napi_ok) {
    lib.retryd_close(client);
    free(box);
    napi_throw_error(env, NULL, "retryd: cannot make the client's handle");
    return NULL;
  }
  return out;
}

/* close(client): unregisters the process now, or when its last call in progress ends. */
static napi_value fn_close(napi_env env, napi_callback_info info) {
  ARGS(1);
  client_box* box = NULL;
  client_of(env, argv[0], &box);
  if (box && !box->close_requested) {
    box->close_requested = 1;
    client_box_settle(box);
  }
  return undefined(env);
}

static napi_value fn_is_local(napi_env env, napi_callback_info info) {
  ARGS(1);
  retryd_client_t* client = client_of(env, argv[0], NULL);
  return make_int(env, client ? lib.retryd_is_local(client) : CLOSED_CODE);
}

/* resolve(client, name) -> RETRYD_OK with the handle in permit[0], or a RETRYD_E* code. */
static napi_value fn_resolve(napi_env env, napi_callback_info info) {
  ARGS(2);
  retryd_client_t* client = client_of(env, argv[0], NULL);
  if (!client) return make_int(env, CLOSED_CODE);
  char* name = NULL;
  if (!get_string(env, argv[1], &name)) return NULL;
  retryd_dependency_t dep = 0;
  int rc = lib.retryd_resolve(client, name ? name : "", &dep);
  free(name);
  if (rc == RETRYD_OK) addon->permit[0] = dep;
  return make_int(env, rc);
}

/* admit(client, dependency, attempt) -> the decision; an admitted permit and its start time
 * are in the shared buffer. A refusal is completed here, as the C ABI asks of every admission
 * (for a refusal it is a no-op). */
static napi_value fn_admit(napi_env env, napi_callback_info info) {
  ARGS(3);
  retryd_client_t* client = client_of(env, argv[0], NULL);
  if (!client) return make_int(env, CLOSED_CODE);
  int32_t dep = 0;
  uint32_t attempt = 0;
  CHECK(env, napi_get_value_int32(env, argv[1], &dep));
  CHECK(env, napi_get_value_uint32(env, argv[2], &attempt));
  retryd_permit_t* permit = (retryd_permit_t*)addon->permit;
  int decision = lib.retryd_admit(client, dep, attempt, permit);
  if (decision == RETRYD_ADMITTED || decision == RETRYD_ADMITTED_PROBE) {
    int64_t now = monotonic_ns();
    memcpy(addon->permit + 12, &now, sizeof now);
  } else {
    lib.retryd_complete(client, permit, RETRYD_IGNORED, 0);
  }
  return make_int(env, decision);
}

/* complete(client, outcome, latencyMs) reports the permit in the shared buffer; a negative
 * latency: the time since its admission. Returns 0, or CLOSED_CODE. */
static napi_value fn_complete(napi_env env, napi_callback_info info) {
  ARGS(3);
  retryd_client_t* client = client_of(env, argv[0], NULL);
  if (!client) return make_int(env, CLOSED_CODE);
  int32_t outcome = 0;
  double latency_ms = -1;
  CHECK(env, napi_get_value_int32(env, argv[1], &outcome));
  CHECK(env, napi_get_value_double(env, argv[2], &latency_ms));
  uint64_t latency_ns;
  if (latency_ms >= 0) {
    latency_ns = latency_ms >= 1.8e13 ? UINT64_MAX / 2 : (uint64_t)(latency_ms * 1e6);
  } else {
    int64_t start;
    memcpy(&start, addon->permit + 12, sizeof start);
    int64_t d = monotonic_ns() - start;
    latency_ns = d > 0 ? (uint64_t)d : 0;
  }
  lib.retryd_complete(client, (retryd_permit_t*)addon->permit, outcome, latency_ns);
  return make_int(env, 0);
}

static napi_value fn_breaker_state(napi_env env, napi_callback_info info) {
  ARGS(2);
  retryd_client_t* client = client_of(env, argv[0], NULL);
  if (!client) return make_int(env, CLOSED_CODE);
  int32_t dep = 0;
  CHECK(env, napi_get_value_int32(env, argv[1], &dep));
  return make_int(env, lib.retryd_breaker_state(client, dep));
}

static napi_value fn_last_error(napi_env env, napi_callback_info info) {
  (void)info;
  return make_string(env, library_loaded() ? lib.retryd_last_error() : lib_error);
}

static napi_value fn_strerror(napi_env env, napi_callback_info info) {
  ARGS(1);
  int32_t code = 0;
  CHECK(env, napi_get_value_int32(env, argv[0], &code));
  return make_string(env, library_loaded() ? lib.retryd_strerror(code) : "");
}

static napi_value fn_stop_name(napi_env env, napi_callback_info info) {
  ARGS(1);
  int32_t stop = 0;
  CHECK(env, napi_get_value_int32(env, argv[0], &stop));
  return make_string(env, library_loaded() ? lib.retryd_stop_name(stop) : "");
}

/* empty(): nothing, the cost of a call into the addon (bench/admit_bench.js). */
static napi_value fn_empty(napi_env env, napi_callback_info info) {
  (void)env;
  (void)info;
  return NULL;
}

/* formatDeadlineHeader(remainingMs) -> the grpc-timeout value, or null. */
static napi_value fn_format_deadline_header(napi_env env, napi_callback_info info) {
  ARGS(1);
  double ms = 0;
  CHECK(env, napi_get_value_double(env, argv[0], &ms));
  if (!library_loaded()) return NULL;
  char buf[RETRYD_DEADLINE_HEADER_BUFSIZE];
  int64_t ns = ms >= 9.2e12 ? INT64_MAX : ms <= 0 ? 0 : (int64_t)(ms * 1e6);
  if (lib.retryd_format_deadline_header(ns, buf, sizeof buf) < 0) {
    napi_value out;
    napi_get_null(env, &out);
    return out;
  }
  return make_string(env, buf);
}

/* ---- classifiers ------------------------------------------------------------------------- */

typedef struct {
  retryd_classifier* classifier;
  uint32_t refs; /* the external, and each call that uses it */
} classifier_box;

static void classifier_release(classifier_box* box) {
  if (--box->refs == 0) {
    lib.retryd_classifier_free(box->classifier);
    free(box);
  }
}

static void classifier_finalize(napi_env env, void* data, void* hint) {
  (void)env;
  (void)hint;
  classifier_release(data);
}

static classifier_box* classifier_of(napi_env env, napi_value v) {
  void* data = NULL;
  if (napi_get_value_external(env, v, &data) != napi_ok || !data) {
    napi_throw_type_error(env, NULL, "retryd: expected a Classifier");
    return NULL;
  }
  return data;
}

static napi_value fn_classifier_new(napi_env env, napi_callback_info info) {
  (void)info;
  if (!library_loaded()) {
    napi_throw_error(env, "RETRYD_LIBRARY_NOT_FOUND", lib_error);
    return NULL;
  }
  classifier_box* box = calloc(1, sizeof *box);
  if (box) box->classifier = lib.retryd_classifier_new();
  if (!box || !box->classifier) {
    free(box);
    napi_throw_error(env, NULL, "retryd: out of memory");
    return NULL;
  }
  box->refs = 1;
  napi_value out;
  if (napi_create_external(env, box, classifier_finalize, NULL, &out) != napi_ok) {
    classifier_release(box);
    napi_throw_error(env, NULL, "retryd: cannot make the classifier's handle");
    return NULL;
  }
  return out;
}

/* classifierSet(classifier, which (0 status, 1 error kind), key, class, outcome, unsafe). */
static napi_value fn_classifier_set(napi_env env, napi_callback_info info) {
  ARGS(6);
  classifier_box* box = classifier_of(env, argv[0]);
  if (!box) return NULL;
  int32_t which = 0, key = 0, cls = 0, outcome = 0;
  bool unsafe = false;
  CHECK(env, napi_get_value_int32(env, argv[1], &which));
  CHECK(env, napi_get_value_int32(env, argv[2], &key));
  CHECK(env, napi_get_value_int32(env, argv[3], &cls));
  CHECK(env, napi_get_value_int32(env, argv[4], &outcome));
  CHECK(env, napi_get_value_bool(env, argv[5], &unsafe));
  int rc = which == 0 ? lib.retryd_classifier_set_status(box->classifier, key, cls, outcome, unsafe)
                      : lib.retryd_classifier_set_error(box->classifier, key, cls, outcome, unsafe);
  return make_int(env, rc);
}

static napi_value fn_classifier_set_idempotent(napi_env env, napi_callback_info info) {
  ARGS(3);
  classifier_box* box = classifier_of(env, argv[0]);
  if (!box) return NULL;
  char* method = NULL;
  bool on = true;
  CHECK(env, napi_get_value_bool(env, argv[2], &on));
  if (!get_string(env, argv[1], &method)) return NULL;
  int rc = lib.retryd_classifier_set_idempotent(box->classifier, method ? method : "", on);
  free(method);
  return make_int(env, rc);
}

/* ---- the retry loop, one step at a time (retryd_call.h) ---------------------------------- */

typedef struct {
  retryd_steps_t* steps; /* NULL once ended */
  client_box* client;
  classifier_box* classifier; /* may be NULL */
} steps_box;

static void steps_box_end(steps_box* box, retryd_call_result_t* result) {
  if (!box->steps) return;
  lib.retryd_steps_end(box->steps, result);
  box->steps = NULL;
  box->client->calls--;
  client_box_settle(box->client);
  if (box->classifier) classifier_release(box->classifier);
  box->classifier = NULL;
}

/* A call dropped unfinished (its promise never settled and was collected) ends as
 * retryd_steps_end ends it: cancelled, an attempt in flight completed as a failure. */
static void steps_finalize(napi_env env, void* data, void* hint) {
  (void)env;
  (void)hint;
  steps_box_end(data, NULL);
  free(data);
}

static steps_box* steps_of(napi_env env, napi_value v) {
  void* data = NULL;
  if (napi_get_value_external(env, v, &data) != napi_ok || !data) {
    napi_throw_type_error(env, NULL, "retryd: expected a call in progress");
    return NULL;
  }
  steps_box* box = data;
  if (!box->steps) {
    napi_throw_error(env, NULL, "retryd: the call has ended");
    return NULL;
  }
  return box;
}

static void write_step(addon_t* addon, const retryd_step_t* step) {
  double* s = addon->step;
  s[0] = step->attempt;
  s[1] = step->probe ? 1 : 0;
  s[2] = step->remaining_ms == RETRYD_NO_TIMEOUT ? -1 : (double)step->remaining_ms;
  s[3] = (double)step->wait_ns;
  s[4] = step->has_record ? 1 : 0;
  const retryd_attempt_info_t* r = &step->record;
  s[5] = r->attempt;
  s[6] = r->decision;
  s[7] = r->attempt_class;
  s[8] = r->breaker_outcome;
  s[9] = r->status;
  s[10] = r->error_kind;
  s[11] = (double)r->latency_ns;
  s[12] = (double)r->retry_after_ns;
  s[13] = (double)r->wait_ns;
  s[14] = r->next;
}

/* stepsBegin(client, dependency, maxAttempts, jitter, baseMs, capMs, retryAfterJitterMs,
 *            retryAfterMaxMs, deadlineMs, attemptTimeoutMs, expectedAttemptMs, method,
 *            hasIdempotencyKey, classifier|null) -> external, or a RETRYD_E* code. */
static napi_value fn_steps_begin(napi_env env, napi_callback_info info) {
  ARGS(14);
  client_box* cbox = NULL;
  retryd_client_t* client = client_of(env, argv[0], &cbox);
  if (!client) return make_int(env, CLOSED_CODE);
  if (!lib_has_steps) {
    napi_throw_error(env, "RETRYD_NO_STEPS", "retryd: this libretryd has no retryd_steps_begin "
                     "(the retry loop's steps): dep.call needs a newer libretryd");
    return NULL;
  }
  int32_t dep = 0;
  CHECK(env, napi_get_value_int32(env, argv[1], &dep));
  retryd_call_policy_t policy;
  lib.retryd_call_policy_init(&policy);
  uint32_t max_attempts = 0;
  int32_t jitter = 0;
  CHECK(env, napi_get_value_uint32(env, argv[2], &max_attempts));
  CHECK(env, napi_get_value_int32(env, argv[3], &jitter));
  policy.max_attempts = max_attempts;
  policy.jitter = jitter;
  int64_t* ms_fields[] = {&policy.backoff_base_ms,   &policy.backoff_cap_ms,
                          &policy.retry_after_jitter_max_ms, &policy.retry_after_max_ms,
                          &policy.deadline_ms,       &policy.attempt_timeout_ms,
                          &policy.expected_attempt_ms};
  for (size_t i = 0; i < sizeof ms_fields / sizeof ms_fields[0]; i++) {
    CHECK(env, napi_get_value_int64(env, argv[4 + i], ms_fields[i]));
  }
  char* method = NULL;
  bool has_key = false;
  CHECK(env, napi_get_value_bool(env, argv[12], &has_key));
  classifier_box* classifier = NULL;
  if (!is_nullish(env, argv[13])) {
    classifier = classifier_of(env, argv[13]);
    if (!classifier) return NULL;
    policy.classifier = classifier->classifier;
  }
  if (!get_string(env, argv[11], &method)) return NULL;
  policy.method = method;
  policy.has_idempotency_key = has_key;
  steps_box* box = calloc(1, sizeof *box);
  if (!box) {
    free(method);
    napi_throw_error(env, NULL, "retryd: out of memory");
    return NULL;
  }
  int rc = lib.retryd_steps_begin(client, dep, &policy, NULL, &box->steps);
  free(method);
  if (rc != RETRYD_OK) {
    free(box);
    return make_int(env, rc);
  }
  box->client = cbox;
  cbox->calls++;
  if (classifier) {
    classifier->refs++;
    box->classifier = classifier;
  }
  napi_value out;
  if (napi_create_external(env, box, steps_finalize, NULL, &out) != napi_ok) {
    steps_box_end(box, NULL);
    free(box);
    napi_throw_error(env, NULL, "retryd: cannot make the call's handle");
    return NULL;
  }
  return out;
}

/* stepsAdmit(call) -> RETRYD_STEP_*; the step in the shared step buffer. */
static napi_value fn_steps_admit(napi_env env, napi_callback_info info) {
  ARGS(1);
  steps_box* box = steps_of(env, argv[0]);
  if (!box) return NULL;
  retryd_step_t step;
  memset(&step, 0, sizeof step);
  int rc = lib.retryd_steps_admit(box->steps, &step);
  write_step(addon, &step);
  return make_int(env, rc);
}

/* stepsReport(call, status, errorKind, retryAfterMs, retryAfter|null, date|null, attemptClass,
 *             breakerOutcome, abort) -> RETRYD_STEP_*; the step in the shared step buffer. */
static napi_value fn_steps_report(napi_env env, napi_callback_info info) {
  ARGS(9);
  steps_box* box = steps_of(env, argv[0]);
  if (!box) return NULL;
  retryd_attempt_result_t result;
  lib.retryd_attempt_result_init(&result);
  int32_t status = 0, error_kind = 0, attempt_class = -1, breaker = 0;
  int64_t retry_after_ms = -1;
  bool abort_call = false;
  CHECK(env, napi_get_value_int32(env, argv[1], &status));
  CHECK(env, napi_get_value_int32(env, argv[2], &error_kind));
  CHECK(env, napi_get_value_int64(env, argv[3], &retry_after_ms));
  CHECK(env, napi_get_value_int32(env, argv[6], &attempt_class));
  CHECK(env, napi_get_value_int32(env, argv[7], &breaker));
  CHECK(env, napi_get_value_bool(env, argv[8], &abort_call));
  char *retry_after = NULL, *date = NULL;
  if (!get_string(env, argv[4], &retry_after)) return NULL;
  if (!get_string(env, argv[5], &date)) {
    free(retry_after);
    return NULL;
  }
  result.status = status;
  result.error_kind = error_kind;
  result.retry_after_ms = retry_after_ms;
  result.retry_after = retry_after;
  result.date = date;
  result.attempt_class = attempt_class;
  result.breaker_outcome = breaker;
  retryd_step_t step;
  memset(&step, 0, sizeof step);
  int rc = lib.retryd_steps_report(box->steps, &result, abort_call, &step);
  free(retry_after);
  free(date);
  write_step(addon, &step);
  return make_int(env, rc);
}

/* stepsCancel(call, outcome): the caller gave up (an AbortSignal). */
static napi_value fn_steps_cancel(napi_env env, napi_callback_info info) {
  ARGS(2);
  steps_box* box = steps_of(env, argv[0]);
  if (!box) return NULL;
  int32_t outcome = RETRYD_IGNORED;
  CHECK(env, napi_get_value_int32(env, argv[1], &outcome));
  lib.retryd_steps_cancel(box->steps, outcome);
  return undefined(env);
}

/* stepsEnd(call) -> how the call ended (stop); the whole result in the shared step buffer. */
static napi_value fn_steps_end(napi_env env, napi_callback_info info) {
  ARGS(1);
  steps_box* box = steps_of(env, argv[0]);
  if (!box) return NULL;
  retryd_call_result_t result;
  memset(&result, 0, sizeof result);
  steps_box_end(box, &result);
  double* s = addon->step;
  s[0] = result.stop;
  s[1] = result.final_class;
  s[2] = result.attempts;
  s[3] = result.last_status;
  s[4] = result.last_error_kind;
  s[5] = result.rejection;
  s[6] = (double)result.elapsed_ns;
  return make_int(env, result.stop);
}

/* ---- the module -------------------------------------------------------------------------- */

static void addon_finalize(napi_env env, void* data, void* hint) {
  (void)hint;
  addon_t* addon = data;
  napi_delete_reference(env, addon->permit_ref);
  napi_delete_reference(env, addon->step_ref);
  free(addon);
}

static napi_value shared_buffer(napi_env env, napi_typedarray_type type, size_t length,
                                size_t element_size, void** data, napi_ref* ref) {
  napi_value buffer, array;
  if (napi_create_arraybuffer(env, length * element_size, data, &buffer) != napi_ok ||
      napi_create_typedarray(env, type, length, buffer, 0, &array) != napi_ok ||
      napi_create_reference(env, array, 1, ref) != napi_ok) {
    return NULL;
  }
  memset(*data, 0, length * element_size);
  return array;
}

/* The C headers' constants as compiled in, for the constants test to hold against the headers
 * and lib/constants.js. */
static napi_value constants(napi_env env) {
  static const struct {
    const char* name;
    int64_t value;
  } table[] = {
#define C(name) {#name, name},
      C(RETRYD_OK) C(RETRYD_EINVAL) C(RETRYD_ENOENT) C(RETRYD_EPERM) C(RETRYD_EINCOMPATIBLE)
      C(RETRYD_EFULL) C(RETRYD_EIO) C(RETRYD_ADMITTED) C(RETRYD_ADMITTED_PROBE)
      C(RETRYD_REJECTED_OPEN) C(RETRYD_REJECTED_HALF_OPEN_BUSY) C(RETRYD_REJECTED_BULKHEAD_FULL)
      C(RETRYD_REJECTED_BUDGET_EMPTY) C(RETRYD_SUCCESS) C(RETRYD_FAILURE) C(RETRYD_IGNORED)
      C(RETRYD_STATE_CLOSED) C(RETRYD_STATE_OPEN) C(RETRYD_STATE_HALF_OPEN)
      C(RETRYD_JITTER_NONE) C(RETRYD_JITTER_FULL) C(RETRYD_JITTER_EQUAL)
      C(RETRYD_JITTER_DECORRELATED) C(RETRYD_ERROR_NONE) C(RETRYD_ERROR_DNS)
      C(RETRYD_ERROR_CONNECT_REFUSED) C(RETRYD_ERROR_CONNECTION_RESET) C(RETRYD_ERROR_TLS)
      C(RETRYD_ERROR_TIMEOUT) C(RETRYD_ERROR_OTHER) C(RETRYD_ATTEMPT_SUCCESS)
      C(RETRYD_ATTEMPT_RETRYABLE) C(RETRYD_ATTEMPT_TERMINAL) C(RETRYD_BREAKER_OUTCOME_SUCCESS)
      C(RETRYD_BREAKER_OUTCOME_FAILURE) C(RETRYD_BREAKER_OUTCOME_IGNORED) C(RETRYD_STOP_NONE)
      C(RETRYD_STOP_SUCCESS) C(RETRYD_STOP_TERMINAL) C(RETRYD_STOP_ATTEMPTS_EXHAUSTED)
      C(RETRYD_STOP_REJECTED) C(RETRYD_STOP_DEADLINE) C(RETRYD_STOP_RETRY_AFTER_TOO_LONG)
      C(RETRYD_STOP_CANCELLED) C(RETRYD_STOP_ABORTED) C(RETRYD_STEP_STOP)
      C(RETRYD_STEP_ATTEMPT) C(RETRYD_STEP_WAIT)
#undef C
  };
  napi_value out;
  if (napi_create_object(env, &out) != napi_ok) return NULL;
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
    napi_value v;
    if (napi_create_int64(env, table[i].value, &v) != napi_ok ||
        napi_set_named_property(env, out, table[i].name + strlen("RETRYD_"), v) != napi_ok) {
      return NULL;
    }
  }
  return out;
}

NAPI_MODULE_INIT() {
  addon_t* addon = calloc(1, sizeof *addon);
  if (!addon) {
    napi_throw_error(env, NULL, "retryd: out of memory");
    return NULL;
  }
  napi_value permit = shared_buffer(env, napi_int32_array, PERMIT_WORDS, sizeof(int32_t),
                                    (void**)&addon->permit, &addon->permit_ref);
  napi_value step = shared_buffer(env, napi_float64_array, STEP_SLOTS, sizeof(double),
                                  (void**)&addon->step, &addon->step_ref);
  if (!permit || !step || napi_set_instance_data(env, addon, addon_finalize, NULL) != napi_ok) {
    napi_throw_error(env, NULL, "retryd: cannot set up the addon");
    return NULL;
  }
  _Static_assert(sizeof(retryd_permit_t) == 12 * sizeof(int32_t),
                 "the permit is 12 words of the shared buffer");
  static const struct {
    const char* name;
    napi_callback fn;
  } fns[] = {
      {"load", fn_load},
      {"libraryPath", fn_library_path},
      {"open", fn_open},
      {"close", fn_close},
      {"isLocal", fn_is_local},
      {"resolve", fn_resolve},
      {"admit", fn_admit},
      {"complete", fn_complete},
      {"breakerState", fn_breaker_state},
      {"lastError", fn_last_error},
      {"strerror", fn_strerror},
      {"stopName", fn_stop_name},
      {"empty", fn_empty},
      {"formatDeadlineHeader", fn_format_deadline_header},
      {"classifierNew", fn_classifier_new},
      {"classifierSet", fn_classifier_set},
      {"classifierSetIdempotent", fn_classifier_set_idempotent},
      {"stepsBegin", fn_steps_begin},
      {"stepsAdmit", fn_steps_admit},
      {"stepsReport", fn_steps_report},
      {"stepsCancel", fn_steps_cancel},
      {"stepsEnd", fn_steps_end},
  };
  for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) {
    napi_value f;
    if (napi_create_function(env, fns[i].name, NAPI_AUTO_LENGTH, fns[i].fn, addon, &f) !=
            napi_ok ||
        napi_set_named_property(env, exports, fns[i].name, f) != napi_ok) {
      return NULL;
    }
  }
  napi_value consts = constants(env);
  napi_value closed = make_int(env, CLOSED_CODE);
  if (!consts || !closed || napi_set_named_property(env, exports, "permit", permit) != napi_ok ||
      napi_set_named_property(env, exports, "step", step) != napi_ok ||
      napi_set_named_property(env, exports, "constants", consts) != napi_ok ||
      napi_set_named_property(env, exports, "CLOSED", closed) != napi_ok) {
    return NULL;
  }
  return exports;
}
