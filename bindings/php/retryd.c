/* retryd.c: the retryd PHP extension over libretryd's C ABI (retryd.h, retryd_call.h,
 * retryd_policy.h).
 *
 * One client per process: `new Retryd\Client()` returns a view of a per-process handle that is
 * opened on first use in that process and kept until the process exits, so a php-fpm child
 * attaches once (its first request) and every later request reuses the mapping and the
 * resolved dependency handles; nothing of it is freed between requests. The FPM master never
 * opens one (it serves no request); should it have one (opcache preload), a forked child keeps
 * using it and the library registers the child as a process of its own on its next admit.
 *
 * Every admitted attempt is completed exactly once: by Permit::success/failure/ignored, by the
 * end of the callable given to Dependency::admit, or, for a Permit dropped unreported, by its
 * destructor (as a failure). A fatal error raised inside a callback that runs under
 * retryd_call is caught before it could unwind through the library and raised again once the
 * loop has returned.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <string.h>
#include <unistd.h>

#include "php.h"
#include "ext/standard/info.h"
#include "zend_exceptions.h"
#include "zend_interfaces.h"
#include "zend_smart_str.h"
#include "ext/spl/spl_exceptions.h"

#include "php_retryd.h"

#ifdef ZTS
/* The per-process client table below is not locked: one PHP thread per process only. */
#error "retryd: thread-safe (ZTS) PHP builds are not supported"
#endif
#include "retryd/retryd.h"
#include "retryd/retryd_call.h"
#include "retryd/retryd_policy.h"

/* ---- names ------------------------------------------------------------------------------- */

static const char* decision_reason(int d) {
  switch (d) {
    case RETRYD_ADMITTED: return "admitted";
    case RETRYD_ADMITTED_PROBE: return "admitted_probe";
    case RETRYD_REJECTED_OPEN: return "open";
    case RETRYD_REJECTED_HALF_OPEN_BUSY: return "half_open_busy";
    case RETRYD_REJECTED_BULKHEAD_FULL: return "bulkhead_full";
    case RETRYD_REJECTED_BUDGET_EMPTY: return "budget_empty";
    default: return "unknown";
  }
}

static const char* const error_names[] = {"none", "dns", "connect_refused", "connection_reset",
                                          "tls", "timeout", "other"};
#define ERROR_KIND_COUNT 7

static const char* error_name(int kind) {
  return kind >= 0 && kind < ERROR_KIND_COUNT ? error_names[kind] : "unknown";
}

static int error_kind_of(const char* name) {
  for (int i = 0; i < ERROR_KIND_COUNT; i++) {
    if (strcmp(name, error_names[i]) == 0) return i;
  }
  return -1;
}

static const char* stop_name(int stop) {
  switch (stop) {
    case RETRYD_STOP_NONE: return "retry";
    case RETRYD_STOP_SUCCESS: return "success";
    case RETRYD_STOP_TERMINAL: return "terminal";
    case RETRYD_STOP_ATTEMPTS_EXHAUSTED: return "attempts_exhausted";
    case RETRYD_STOP_REJECTED: return "rejected";
    case RETRYD_STOP_DEADLINE: return "deadline";
    case RETRYD_STOP_RETRY_AFTER_TOO_LONG: return "retry_after_too_long";
    case RETRYD_STOP_CANCELLED: return "cancelled";
    case RETRYD_STOP_ABORTED: return "aborted";
    default: return "unknown";
  }
}

/* ---- classes ----------------------------------------------------------------------------- */

static zend_class_entry *ce_client, *ce_dependency, *ce_permit, *ce_policy, *ce_attempt_result,
    *ce_subscription;
static zend_class_entry *ce_error, *ce_rejected, *ce_call_failed;
static zend_object_handlers client_handlers, dependency_handlers, permit_handlers,
    policy_handlers, subscription_handlers;

/* A process's client: opened once per process and per (socket, segment, fallback). */
typedef struct {
  retryd_client_t* c;
  pid_t pid;      /* the process that opened it */
  HashTable deps; /* name => dependency handle (long), persistent */
} proc_client;

/* Persistent: lives as long as the process, across requests. */
static HashTable proc_clients;

static void proc_client_free(zval* zv) {
  proc_client* pc = Z_PTR_P(zv);
  /* Only the opener unregisters; a child holding an inherited copy lets its exit do it. */
  if (pc->c != NULL && pc->pid == getpid()) retryd_close(pc->c);
  zend_hash_destroy(&pc->deps);
  pefree(pc, 1);
}

typedef struct {
  proc_client* pc;
  zend_object std;
} client_obj;

typedef struct {
  retryd_client_t* c;
  proc_client* pc;
  int32_t id;
  zend_string* name;
  zend_object std;
} dependency_obj;

typedef struct {
  retryd_client_t* c;
  proc_client* pc;     /* with id and name: whose breaker state a completion shows */
  int32_t id;
  zend_string* name;
  retryd_permit_t permit;
  int64_t start_ns;
  int done;
  uint32_t attempt;
  zend_object std;
} permit_obj;

typedef struct {
  retryd_call_policy_t p;
  zend_string* method;
  zval classify_exception; /* callable or UNDEF */
  zend_object std;
} policy_obj;

#define OBJ_OF(type, zobj) ((type*)((char*)(zobj) - XtOffsetOf(type, std)))
#define THIS(type) OBJ_OF(type, Z_OBJ_P(ZEND_THIS))

static zend_object* client_new(zend_class_entry* ce) {
  client_obj* o = zend_object_alloc(sizeof(client_obj), ce);
  zend_object_std_init(&o->std, ce);
  object_properties_init(&o->std, ce);
  o->std.handlers = &client_handlers;
  return &o->std;
}

static zend_object* dependency_new(zend_class_entry* ce) {
  dependency_obj* o = zend_object_alloc(sizeof(dependency_obj), ce);
  zend_object_std_init(&o->std, ce);
  object_properties_init(&o->std, ce);
  o->std.handlers = &dependency_handlers;
  return &o->std;
}

static void dependency_free(zend_object* obj) {
  dependency_obj* o = OBJ_OF(dependency_obj, obj);
  if (o->name) zend_string_release(o->name);
  zend_object_std_dtor(obj);
}

static zend_object* permit_new(zend_class_entry* ce) {
  permit_obj* o = zend_object_alloc(sizeof(permit_obj), ce);
  zend_object_std_init(&o->std, ce);
  object_properties_init(&o->std, ce);
  o->std.handlers = &permit_handlers;
  o->done = 1;
  return &o->std;
}

static void observe_state(proc_client* pc, int32_t id, zend_string* name);

/* Reports the attempt once; `observe`: then shows the state-change subscribers the breaker. */
static void permit_finish(permit_obj* o, int outcome, int observe) {
  if (o->done) return;
  o->done = 1;
  int64_t latency = retryd_monotonic_now_ns() - o->start_ns;
  retryd_complete(o->c, &o->permit, outcome, latency > 0 ? (uint64_t)latency : 0);
  if (observe && o->name) observe_state(o->pc, o->id, o->name);
}

static void permit_complete(permit_obj* o, int outcome) { permit_finish(o, outcome, 1); }

static void permit_free(zend_object* obj) {
  permit_obj* o = OBJ_OF(permit_obj, obj);
  /* Dropped without a report: the attempt did not finish normally, so it counts as failed
   * (and its lease is given back now rather than at its timeout). No subscriber runs here: a
   * free may come after the request's end. */
  permit_finish(o, RETRYD_FAILURE, 0);
  if (o->name) zend_string_release(o->name);
  zend_object_std_dtor(obj);
}

static zend_object* policy_new(zend_class_entry* ce) {
  policy_obj* o = zend_object_alloc(sizeof(policy_obj), ce);
  zend_object_std_init(&o->std, ce);
  object_properties_init(&o->std, ce);
  o->std.handlers = &policy_handlers;
  retryd_call_policy_init(&o->p);
  ZVAL_UNDEF(&o->classify_exception);
  return &o->std;
}

static void policy_free(zend_object* obj) {
  policy_obj* o = OBJ_OF(policy_obj, obj);
  if (o->method) zend_string_release(o->method);
  zval_ptr_dtor(&o->classify_exception);
  zend_object_std_dtor(obj);
}

static HashTable* policy_get_gc(zend_object* obj, zval** table, int* n) {
  policy_obj* o = OBJ_OF(policy_obj, obj);
  *table = Z_ISUNDEF(o->classify_exception) ? NULL : &o->classify_exception;
  *n = Z_ISUNDEF(o->classify_exception) ? 0 : 1;
  return zend_std_get_properties(obj);
}

/* ---- errors ------------------------------------------------------------------------------ */

static void throw_client_error(int code, const char* what) {
  const char* detail = retryd_last_error();
  zend_throw_exception_ex(ce_error, code, "%s: %s%s%s", what, retryd_strerror(code),
                          detail && *detail ? ": " : "", detail ? detail : "");
}

/* Throws Retryd\Rejected; `value` (may be NULL) is the last attempt's value, `previous` (may
 * be NULL, reference taken over) the last attempt's exception. */
static void throw_rejected(int decision, zend_string* dep, zval* value, zend_object* previous) {
  const char* reason = decision_reason(decision);
  zend_object* ex = zend_throw_exception_ex(ce_rejected, decision, "%s: rejected: %s",
                                            ZSTR_VAL(dep), reason);
  zend_update_property_string(ce_rejected, ex, ZEND_STRL("reason"), reason);
  zend_update_property_str(ce_rejected, ex, ZEND_STRL("dependency"), dep);
  if (value && !Z_ISUNDEF_P(value)) zend_update_property(ce_rejected, ex, ZEND_STRL("value"), value);
  if (previous) zend_exception_set_previous(ex, previous);
}

/* ---- state changes ----------------------------------------------------------------------- */

/* Subscriptions to breaker state changes, as this process sees them: a callable for one
 * dependency of a process client, or for all of them. They last for the request at most (a
 * PHP callable does not outlive it): the table is emptied at the request's end. With no active
 * subscription, nothing reads a breaker's state. */
typedef struct {
  proc_client* pc;
  zend_string* name; /* NULL: every dependency of pc */
  zval fn;
  int active;
} subscription;

typedef struct {
  zend_ulong index; /* in `subscriptions` */
  zend_object std;
} subscription_obj;

static HashTable subscriptions; /* index => subscription*, this request's */
static int subscriptions_ready;
static uint32_t subscriptions_active;
static zend_ulong subscriptions_next; /* the next subscription's index */
/* The last state each watched dependency was seen in, this request: "pc/id" => state. */
static HashTable seen_states;

static void subscription_dtor(zval* zv) {
  subscription* sub = Z_PTR_P(zv);
  if (sub->name) zend_string_release(sub->name);
  zval_ptr_dtor(&sub->fn);
  efree(sub);
}

static void subscriptions_start(void) {
  if (subscriptions_ready) return;
  zend_hash_init(&subscriptions, 4, NULL, subscription_dtor, 0);
  zend_hash_init(&seen_states, 8, NULL, NULL, 0);
  subscriptions_next = 0;
  subscriptions_ready = 1;
}

static void subscriptions_end(void) {
  if (!subscriptions_ready) return;
  subscriptions_ready = 0;
  subscriptions_active = 0;
  zend_hash_destroy(&subscriptions);
  zend_hash_destroy(&seen_states);
}

static const char* state_name(int state) {
  switch (state) {
    case RETRYD_STATE_CLOSED: return "closed";
    case RETRYD_STATE_OPEN: return "open";
    case RETRYD_STATE_HALF_OPEN: return "half_open";
    default: return "unknown";
  }
}

static int subscription_matches(const subscription* sub, proc_client* pc, zend_string* name) {
  return sub->active && sub->pc == pc && (sub->name == NULL || zend_string_equals(sub->name, name));
}

static zend_string* seen_key(proc_client* pc, int32_t id) {
  return zend_strpprintf(0, "%p/%d", (void*)pc, (int)id);
}

/* Starts watching a dependency: the state to compare the next one with, if none yet. */
static void watch_dependency(proc_client* pc, int32_t id) {
  zend_string* key = seen_key(pc, id);
  if (!zend_hash_exists(&seen_states, key)) {
    int state = retryd_breaker_state(pc->c, id);
    if (state >= 0) {
      zval v;
      ZVAL_LONG(&v, state);
      zend_hash_add(&seen_states, key, &v);
    }
  }
  zend_string_release(key);
}

/* Reads the breaker's state after an admission or a completion and, if it differs from the one
 * last seen, calls every matching subscriber with (name, old, new). An exception a subscriber
 * throws is reported as a warning and the call goes on. */
static void observe_state(proc_client* pc, int32_t id, zend_string* name) {
  if (subscriptions_active == 0 || pc == NULL) return;
  int watched = 0;
  subscription* sub;
  ZEND_HASH_FOREACH_PTR(&subscriptions, sub) {
    if (subscription_matches(sub, pc, name)) {
      watched = 1;
      break;
    }
  } ZEND_HASH_FOREACH_END();
  if (!watched) return;
  int state = retryd_breaker_state(pc->c, id);
  if (state < 0) return;
  zend_string* key = seen_key(pc, id);
  zval* seen = zend_hash_find(&seen_states, key);
  int old = seen ? (int)Z_LVAL_P(seen) : -1;
  zval v;
  ZVAL_LONG(&v, state);
  zend_hash_update(&seen_states, key, &v);
  zend_string_release(key);
  if (old < 0 || old == state) return;

  /* Subscribers may subscribe and unsubscribe: walk the indices present now, each checked
   * again when its turn comes. */
  zend_ulong last = subscriptions_next;
  for (zend_ulong i = 0; i < last; i++) {
    sub = zend_hash_index_find_ptr(&subscriptions, i);
    if (sub == NULL || !subscription_matches(sub, pc, name)) continue;
    zval args[3], ret, fn;
    ZVAL_STR_COPY(&args[0], name);
    ZVAL_STRING(&args[1], state_name(old));
    ZVAL_STRING(&args[2], state_name(state));
    ZVAL_COPY(&fn, &sub->fn); /* the subscription may go while it runs */
    ZVAL_UNDEF(&ret);
    call_user_function(NULL, NULL, &fn, &ret, 3, args);
    int leaving = EG(exception) && zend_is_unwind_exit(EG(exception));
    if (EG(exception) && !leaving) {
      zend_object* ex = EG(exception);
      GC_ADDREF(ex);
      zend_clear_exception();
      zval msg;
      zend_call_method_with_0_params(ex, ex->ce, NULL, "getmessage", &msg);
      php_error_docref(NULL, E_WARNING, "state-change subscriber of %s threw %s: %s",
                       ZSTR_VAL(name), ZSTR_VAL(ex->ce->name),
                       Z_TYPE(msg) == IS_STRING ? Z_STRVAL(msg) : "");
      zval_ptr_dtor(&msg);
      OBJ_RELEASE(ex);
      if (EG(exception)) zend_clear_exception();
    }
    zval_ptr_dtor(&ret);
    zval_ptr_dtor(&fn);
    for (int a = 0; a < 3; a++) zval_ptr_dtor(&args[a]);
    /* exit() in a subscriber: the script ends; the exit stays pending for the engine (it is
     * not a Throwable to report), and no other subscriber runs. */
    if (leaving) return;
  }
}

/* Subscribes `fn` for `name` (NULL: every dependency of pc) into return_value. */
static void subscribe(proc_client* pc, zend_string* name, zval* fn, zval* return_value) {
  subscriptions_start();
  subscription* sub = emalloc(sizeof(*sub));
  sub->pc = pc;
  sub->name = name ? zend_string_copy(name) : NULL;
  ZVAL_COPY(&sub->fn, fn);
  sub->active = 1;
  zend_ulong index = subscriptions_next++;
  zend_hash_index_add_new_ptr(&subscriptions, index, sub);
  subscriptions_active++;
  if (name) {
    zval* id = zend_hash_find(&pc->deps, name);
    if (id) watch_dependency(pc, (int32_t)Z_LVAL_P(id));
  } else {
    zval* id;
    ZEND_HASH_FOREACH_VAL(&pc->deps, id) { watch_dependency(pc, (int32_t)Z_LVAL_P(id)); }
    ZEND_HASH_FOREACH_END();
  }
  object_init_ex(return_value, ce_subscription);
  OBJ_OF(subscription_obj, Z_OBJ_P(return_value))->index = index;
}

static zend_object* subscription_new(zend_class_entry* ce) {
  subscription_obj* o = zend_object_alloc(sizeof(subscription_obj), ce);
  zend_object_std_init(&o->std, ce);
  object_properties_init(&o->std, ce);
  o->std.handlers = &subscription_handlers;
  o->index = (zend_ulong)-1;
  return &o->std;
}

static subscription* subscription_of(zval* this_zv) {
  if (!subscriptions_ready) return NULL;
  zend_ulong index = OBJ_OF(subscription_obj, Z_OBJ_P(this_zv))->index;
  return zend_hash_index_find_ptr(&subscriptions, index);
}

PHP_METHOD(Retryd_Subscription, __construct) { ZEND_PARSE_PARAMETERS_NONE(); }

/* Subscription::unsubscribe(): void. Ends the calls; a second call is a no-op. */
PHP_METHOD(Retryd_Subscription, unsubscribe) {
  ZEND_PARSE_PARAMETERS_NONE();
  subscription* sub = subscription_of(ZEND_THIS);
  if (sub && sub->active) {
    sub->active = 0;
    subscriptions_active--;
  }
}

PHP_METHOD(Retryd_Subscription, isActive) {
  ZEND_PARSE_PARAMETERS_NONE();
  subscription* sub = subscription_of(ZEND_THIS);
  RETURN_BOOL(sub && sub->active);
}

/* ---- Retryd\Client ----------------------------------------------------------------------- */

/* Client::__construct(?string $socket = null, ?string $segment = null,
 *                     bool $fallbackToLocal = true) */
PHP_METHOD(Retryd_Client, __construct) {
  zend_string *socket = NULL, *segment = NULL;
  bool fallback = true;
  ZEND_PARSE_PARAMETERS_START(0, 3)
    Z_PARAM_OPTIONAL
    Z_PARAM_STR_OR_NULL(socket)
    Z_PARAM_STR_OR_NULL(segment)
    Z_PARAM_BOOL(fallback)
  ZEND_PARSE_PARAMETERS_END();

  smart_str key = {0};
  smart_str_appends(&key, socket ? ZSTR_VAL(socket) : "");
  smart_str_appendc(&key, '\n');
  smart_str_appends(&key, segment ? ZSTR_VAL(segment) : "");
  smart_str_appendc(&key, '\n');
  smart_str_appendc(&key, fallback ? '1' : '0');
  smart_str_0(&key);

  proc_client* pc = zend_hash_str_find_ptr(&proc_clients, ZSTR_VAL(key.s), ZSTR_LEN(key.s));
  if (pc == NULL) {
    retryd_options_t opts;
    opts.segment = segment && ZSTR_LEN(segment) ? ZSTR_VAL(segment) : NULL;
    opts.fallback_to_local = fallback ? 1 : 0;
    retryd_client_t* c = NULL;
    int rc = socket && ZSTR_LEN(socket) ? retryd_open_socket(ZSTR_VAL(socket), &opts, &c)
                                        : retryd_open(&opts, &c);
    if (rc != RETRYD_OK) {
      smart_str_free(&key);
      throw_client_error(rc, "retryd_open");
      RETURN_THROWS();
    }
    pc = pemalloc(sizeof(*pc), 1);
    pc->c = c;
    pc->pid = getpid();
    zend_hash_init(&pc->deps, 8, NULL, NULL, 1);
    zend_hash_str_add_ptr(&proc_clients, ZSTR_VAL(key.s), ZSTR_LEN(key.s), pc);
  }
  smart_str_free(&key);
  THIS(client_obj)->pc = pc;
}

static proc_client* client_checked(zval* this_zv) {
  proc_client* pc = OBJ_OF(client_obj, Z_OBJ_P(this_zv))->pc;
  if (pc == NULL) zend_throw_exception(ce_error, "Retryd\\Client is not constructed", 0);
  return pc;
}

/* Client::dependency(string $name): Dependency. Resolved once per process, then cached. */
PHP_METHOD(Retryd_Client, dependency) {
  zend_string* name;
  ZEND_PARSE_PARAMETERS_START(1, 1)
    Z_PARAM_STR(name)
  ZEND_PARSE_PARAMETERS_END();
  proc_client* pc = client_checked(ZEND_THIS);
  if (!pc) RETURN_THROWS();
  zval* found = zend_hash_find(&pc->deps, name);
  int32_t id;
  if (found) {
    id = (int32_t)Z_LVAL_P(found);
  } else {
    if (ZSTR_LEN(name) == 0 || strlen(ZSTR_VAL(name)) != ZSTR_LEN(name)) {
      zend_throw_exception(ce_error, "retryd_resolve: invalid dependency name", RETRYD_EINVAL);
      RETURN_THROWS();
    }
    int rc = retryd_resolve(pc->c, ZSTR_VAL(name), &id);
    if (rc != RETRYD_OK) {
      throw_client_error(rc, "retryd_resolve");
      RETURN_THROWS();
    }
    zval v;
    ZVAL_LONG(&v, id);
    zend_hash_str_add(&pc->deps, ZSTR_VAL(name), ZSTR_LEN(name), &v);
  }
  object_init_ex(return_value, ce_dependency);
  dependency_obj* d = OBJ_OF(dependency_obj, Z_OBJ_P(return_value));
  d->c = pc->c;
  d->pc = pc;
  d->id = id;
  d->name = zend_string_copy(name);
  if (subscriptions_active) {
    subscription* sub;
    ZEND_HASH_FOREACH_PTR(&subscriptions, sub) {
      if (subscription_matches(sub, pc, name)) {
        watch_dependency(pc, id);
        break;
      }
    } ZEND_HASH_FOREACH_END();
  }
}

/* Client::onStateChange(callable $fn): Subscription. Calls $fn(string $name, string $old,
 * string $new) whenever this process sees the breaker of any of this client's dependencies
 * change state ("closed", "open", "half_open"), for the rest of the request at most. */
PHP_METHOD(Retryd_Client, onStateChange) {
  zval* fn;
  ZEND_PARSE_PARAMETERS_START(1, 1)
    Z_PARAM_ZVAL(fn)
  ZEND_PARSE_PARAMETERS_END();
  if (!zend_is_callable(fn, 0, NULL)) {
    zend_argument_type_error(1, "must be a valid callback");
    RETURN_THROWS();
  }
  proc_client* pc = client_checked(ZEND_THIS);
  if (!pc) RETURN_THROWS();
  subscribe(pc, NULL, fn, return_value);
}

/* Client::isLocal(): bool, true while on per-process state (no daemon answered). */
PHP_METHOD(Retryd_Client, isLocal) {
  ZEND_PARSE_PARAMETERS_NONE();
  proc_client* pc = client_checked(ZEND_THIS);
  if (!pc) RETURN_THROWS();
  RETURN_BOOL(retryd_is_local(pc->c));
}

/* ---- Retryd\Permit ----------------------------------------------------------------------- */

/* Admits attempt `attempt`; on refusal completes the permit (the contract) and throws. */
static permit_obj* admit_into(dependency_obj* d, uint32_t attempt, zval* out) {
  object_init_ex(out, ce_permit);
  permit_obj* p = OBJ_OF(permit_obj, Z_OBJ_P(out));
  p->c = d->c;
  p->pc = d->pc;
  p->id = d->id;
  p->name = zend_string_copy(d->name);
  p->attempt = attempt;
  int decision = retryd_admit(d->c, d->id, attempt, &p->permit);
  p->start_ns = retryd_monotonic_now_ns();
  if (decision == RETRYD_ADMITTED || decision == RETRYD_ADMITTED_PROBE) {
    p->done = 0;
    observe_state(d->pc, d->id, d->name);
    return p;
  }
  retryd_complete(d->c, &p->permit, RETRYD_IGNORED, 0);
  observe_state(d->pc, d->id, d->name);
  zval_ptr_dtor(out);
  ZVAL_UNDEF(out);
  if (decision < 0) {
    zend_throw_exception_ex(ce_error, decision, "%s: invalid dependency handle", ZSTR_VAL(d->name));
  } else {
    throw_rejected(decision, d->name, NULL, NULL);
  }
  return NULL;
}

PHP_METHOD(Retryd_Permit, success) {
  ZEND_PARSE_PARAMETERS_NONE();
  permit_complete(THIS(permit_obj), RETRYD_SUCCESS);
}

PHP_METHOD(Retryd_Permit, failure) {
  ZEND_PARSE_PARAMETERS_NONE();
  permit_complete(THIS(permit_obj), RETRYD_FAILURE);
}

PHP_METHOD(Retryd_Permit, ignored) {
  ZEND_PARSE_PARAMETERS_NONE();
  permit_complete(THIS(permit_obj), RETRYD_IGNORED);
}

PHP_METHOD(Retryd_Permit, isProbe) {
  ZEND_PARSE_PARAMETERS_NONE();
  RETURN_BOOL(THIS(permit_obj)->permit.decision == RETRYD_ADMITTED_PROBE);
}

PHP_METHOD(Retryd_Permit, isDone) {
  ZEND_PARSE_PARAMETERS_NONE();
  RETURN_BOOL(THIS(permit_obj)->done);
}

PHP_METHOD(Retryd_Permit, attempt) {
  ZEND_PARSE_PARAMETERS_NONE();
  RETURN_LONG(THIS(permit_obj)->attempt);
}

/* ---- Retryd\Dependency ------------------------------------------------------------------- */

/* Dependencies come from Client::dependency and permits from Dependency::permit only. */
PHP_METHOD(Retryd_Dependency, __construct) { ZEND_PARSE_PARAMETERS_NONE(); }
PHP_METHOD(Retryd_Permit, __construct) { ZEND_PARSE_PARAMETERS_NONE(); }

PHP_METHOD(Retryd_Dependency, name) {
  ZEND_PARSE_PARAMETERS_NONE();
  RETURN_STR_COPY(THIS(dependency_obj)->name);
}

/* Dependency::state(): string, the breaker's state as this process sees it now: "closed",
 * "open" or "half_open" (an open period that has ended reads "open" until the next admit). */
PHP_METHOD(Retryd_Dependency, state) {
  ZEND_PARSE_PARAMETERS_NONE();
  dependency_obj* d = THIS(dependency_obj);
  int state = retryd_breaker_state(d->c, d->id);
  if (state < 0) {
    throw_client_error(state, "retryd_breaker_state");
    RETURN_THROWS();
  }
  RETURN_STRING(state_name(state));
}

/* Dependency::onStateChange(callable $fn): Subscription. Calls $fn(string $name, string $old,
 * string $new) whenever this process sees this dependency's breaker change state: after each
 * of its admissions and completions (permit, admit, call, the Guzzle middleware) the state is
 * read and compared with the last one seen. For the rest of the request at most; an exception
 * the callable throws is reported as a warning and the call goes on. */
PHP_METHOD(Retryd_Dependency, onStateChange) {
  zval* fn;
  ZEND_PARSE_PARAMETERS_START(1, 1)
    Z_PARAM_ZVAL(fn)
  ZEND_PARSE_PARAMETERS_END();
  if (!zend_is_callable(fn, 0, NULL)) {
    zend_argument_type_error(1, "must be a valid callback");
    RETURN_THROWS();
  }
  dependency_obj* d = THIS(dependency_obj);
  subscribe(d->pc, d->name, fn, return_value);
}

/* Dependency::permit(int $attempt = 0): Permit, or throws Rejected. */
PHP_METHOD(Retryd_Dependency, permit) {
  zend_long attempt = 0;
  ZEND_PARSE_PARAMETERS_START(0, 1)
    Z_PARAM_OPTIONAL
    Z_PARAM_LONG(attempt)
  ZEND_PARSE_PARAMETERS_END();
  if (attempt < 0 || attempt > UINT32_MAX) {
    zend_argument_value_error(1, "must be between 0 and 4294967295");
    RETURN_THROWS();
  }
  if (!admit_into(THIS(dependency_obj), (uint32_t)attempt, return_value)) RETURN_THROWS();
}

/* Dependency::admit(callable $fn, int $attempt = 0): mixed. Calls $fn($permit) if admitted;
 * a normal return completes the permit as a success, an exception as a failure (unless $fn
 * completed it itself), and the exception propagates. */
PHP_METHOD(Retryd_Dependency, admit) {
  zend_fcall_info fci;
  zend_fcall_info_cache fcc;
  zend_long attempt = 0;
  ZEND_PARSE_PARAMETERS_START(1, 2)
    Z_PARAM_FUNC(fci, fcc)
    Z_PARAM_OPTIONAL
    Z_PARAM_LONG(attempt)
  ZEND_PARSE_PARAMETERS_END();
  if (attempt < 0 || attempt > UINT32_MAX) {
    zend_argument_value_error(2, "must be between 0 and 4294967295");
    RETURN_THROWS();
  }
  zval permit;
  permit_obj* p = admit_into(THIS(dependency_obj), (uint32_t)attempt, &permit);
  if (!p) RETURN_THROWS();
  zval ret;
  ZVAL_UNDEF(&ret);
  fci.retval = &ret;
  fci.params = &permit;
  fci.param_count = 1;
  zend_result rc = zend_call_function(&fci, &fcc);
  permit_complete(p, rc == SUCCESS && !EG(exception) ? RETRYD_SUCCESS : RETRYD_FAILURE);
  zval_ptr_dtor(&permit);
  if (rc != SUCCESS || EG(exception)) {
    zval_ptr_dtor(&ret);
    RETURN_THROWS();
  }
  RETURN_COPY_VALUE(&ret);
}

/* The state of one Dependency::call. */
typedef struct {
  zend_fcall_info fci;
  zend_fcall_info_cache fcc;
  policy_obj* policy;
  zval value;         /* the last attempt's value */
  zend_object* exc;   /* the last attempt's exception */
  zend_string* retry_after;
  zend_string* date;
  int bailout;
  dependency_obj* dep; /* whose breaker the state-change subscribers see */
} call_state;

static void state_clear_attempt(call_state* s) {
  zval_ptr_dtor(&s->value);
  ZVAL_UNDEF(&s->value);
  if (s->exc) OBJ_RELEASE(s->exc);
  s->exc = NULL;
  if (s->retry_after) zend_string_release(s->retry_after);
  if (s->date) zend_string_release(s->date);
  s->retry_after = s->date = NULL;
}

static zend_string* header_line(zval* response, const char* name) {
  zval arg, ret;
  ZVAL_STRING(&arg, name);
  zend_call_method_with_1_params(Z_OBJ_P(response), Z_OBJCE_P(response), NULL, "getheaderline",
                                 &ret, &arg);
  zval_ptr_dtor(&arg);
  if (EG(exception) || Z_TYPE(ret) != IS_STRING) {
    zval_ptr_dtor(&ret);
    return NULL;
  }
  if (Z_STRLEN(ret) == 0) {
    zval_ptr_dtor(&ret);
    return NULL;
  }
  return Z_STR(ret);
}

static zval* prop(zval* obj, const char* name) {
  zval rv;
  zval* v = zend_read_property(Z_OBJCE_P(obj), Z_OBJ_P(obj), name, strlen(name), 1, &rv);
  return v;
}

/* Fills `out` from a Retryd\AttemptResult; its value becomes the attempt's value. Returns 0,
 * or 1 for an unknown error kind (the call is aborted with a ValueError). */
static int fill_from_attempt_result(call_state* s, zval* r, retryd_attempt_result_t* out) {
  zval* v = prop(r, "value");
  zval_ptr_dtor(&s->value);
  ZVAL_COPY(&s->value, v);
  zval* status = prop(r, "status");
  if (Z_TYPE_P(status) == IS_LONG) out->status = (int)Z_LVAL_P(status);
  zval* err = prop(r, "error");
  if (Z_TYPE_P(err) == IS_STRING) {
    int kind = error_kind_of(Z_STRVAL_P(err));
    if (kind < 0) {
      zend_value_error("Retryd\\AttemptResult::$error: unknown error kind \"%s\"", Z_STRVAL_P(err));
      return 1;
    }
    out->error_kind = kind;
  }
  zval* ra = prop(r, "retryAfter");
  if (Z_TYPE_P(ra) == IS_STRING && Z_STRLEN_P(ra) > 0) {
    s->retry_after = zend_string_copy(Z_STR_P(ra));
    out->retry_after = ZSTR_VAL(s->retry_after);
  } else if (Z_TYPE_P(ra) == IS_LONG || Z_TYPE_P(ra) == IS_DOUBLE) {
    double sec = zval_get_double(ra);
    out->retry_after_ms = sec < 0 ? 0 : (int64_t)(sec * 1000.0);
  }
  zval* date = prop(r, "date");
  if (Z_TYPE_P(date) == IS_STRING && Z_STRLEN_P(date) > 0) {
    s->date = zend_string_copy(Z_STR_P(date));
    out->date = ZSTR_VAL(s->date);
  }
  return 0;
}

/* Maps the attempt's return value: a Retryd\AttemptResult as it says, a PSR-7 response (an
 * object with getStatusCode) by its status and Retry-After / Date headers, anything else a
 * success. */
static int inspect_value(call_state* s, zval* ret, retryd_attempt_result_t* out) {
  if (Z_TYPE_P(ret) == IS_OBJECT && instanceof_function(Z_OBJCE_P(ret), ce_attempt_result)) {
    return fill_from_attempt_result(s, ret, out);
  }
  ZVAL_COPY(&s->value, ret);
  if (Z_TYPE_P(ret) == IS_OBJECT &&
      zend_hash_str_exists(&Z_OBJCE_P(ret)->function_table, ZEND_STRL("getstatuscode"))) {
    zval status;
    zend_call_method_with_0_params(Z_OBJ_P(ret), Z_OBJCE_P(ret), NULL, "getstatuscode", &status);
    if (EG(exception)) return 1;
    out->status = (int)zval_get_long(&status);
    zval_ptr_dtor(&status);
    if (out->status < 0 || out->status > 999) out->status = 0;
    if (zend_hash_str_exists(&Z_OBJCE_P(ret)->function_table, ZEND_STRL("getheaderline"))) {
      s->retry_after = header_line(ret, "Retry-After");
      if (EG(exception)) return 1;
      if (s->retry_after) out->retry_after = ZSTR_VAL(s->retry_after);
      s->date = header_line(ret, "Date");
      if (EG(exception)) return 1;
      if (s->date) out->date = ZSTR_VAL(s->date);
    }
    return 0;
  }
  out->attempt_class = RETRYD_ATTEMPT_SUCCESS;
  out->breaker_outcome = RETRYD_BREAKER_OUTCOME_SUCCESS;
  return 0;
}

/* Maps the attempt's exception through the policy's classifyException: a string error kind,
 * a Retryd\AttemptResult, or null (the call ends and the exception propagates). Returns 0 to
 * go on classifying, 1 to abort. */
static int classify_exception(call_state* s, retryd_attempt_result_t* out) {
  if (!s->policy || Z_ISUNDEF(s->policy->classify_exception)) return 1;
  zval arg, ret;
  ZVAL_OBJ_COPY(&arg, s->exc);
  ZVAL_UNDEF(&ret);
  zend_result rc = call_user_function(NULL, NULL, &s->policy->classify_exception, &ret, 1, &arg);
  zval_ptr_dtor(&arg);
  int abort = 1;
  if (rc == SUCCESS && !EG(exception)) {
    if (Z_TYPE(ret) == IS_STRING) {
      int kind = error_kind_of(Z_STRVAL(ret));
      if (kind < 0) {
        zend_value_error("classifyException returned an unknown error kind \"%s\"", Z_STRVAL(ret));
      } else {
        out->error_kind = kind;
        abort = 0;
      }
    } else if (Z_TYPE(ret) == IS_OBJECT && instanceof_function(Z_OBJCE(ret), ce_attempt_result)) {
      abort = fill_from_attempt_result(s, &ret, out);
    }
  }
  zval_ptr_dtor(&ret);
  return abort;
}

/* Takes a pending exception over as the attempt's exception. */
static void take_exception(call_state* s) {
  zend_object* e = EG(exception);
  GC_ADDREF(e);
  zend_clear_exception();
  if (s->exc) OBJ_RELEASE(s->exc);
  s->exc = e;
}

/* The script is ending while the loop runs (exit(), or a fatal error held until the loop
 * returns): no more attempts go out. */
static int call_ending(const call_state* s) {
  return s->bailout || (EG(exception) && zend_is_unwind_exit(EG(exception)));
}

static int attempt_cb(void* ctx, uint32_t attempt, int64_t remaining_ms,
                      retryd_attempt_result_t* out) {
  call_state* s = ctx;
  int rc = 0;
  if (call_ending(s)) return 1;
  state_clear_attempt(s);
  zend_try {
    zval args[2], ret;
    ZVAL_LONG(&args[0], attempt);
    if (remaining_ms == RETRYD_NO_TIMEOUT) {
      ZVAL_NULL(&args[1]);
    } else {
      ZVAL_DOUBLE(&args[1], (double)remaining_ms / 1000.0);
    }
    ZVAL_UNDEF(&ret);
    s->fci.params = args;
    s->fci.param_count = 2;
    s->fci.retval = &ret;
    if (zend_call_function(&s->fci, &s->fcc) != SUCCESS && !EG(exception)) {
      rc = 1;
    } else if (EG(exception) && zend_is_unwind_exit(EG(exception))) {
      rc = 1;  /* exit() in the attempt: left pending, the loop ends, the script exits */
    } else if (EG(exception)) {
      take_exception(s);
      rc = classify_exception(s, out);
      if (EG(exception)) take_exception(s);
    } else {
      rc = inspect_value(s, &ret, out);
      if (EG(exception)) take_exception(s);
    }
    zval_ptr_dtor(&ret);
  } zend_catch {
    s->bailout = 1;
    rc = 1;
  } zend_end_try();
  return rc;
}

/* After each admission inside retryd_call: the state-change subscribers see the breaker. A
 * fatal error there must not unwind through the library: it is raised again after the loop. */
static void observer_cb(void* ctx, const retryd_attempt_info_t* info) {
  (void)info;
  call_state* s = ctx;
  if (call_ending(s)) return;
  zend_try {
    observe_state(s->dep->pc, s->dep->id, s->dep->name);
  } zend_catch {
    s->bailout = 1;
  } zend_end_try();
}

/* Dependency::call(callable $fn, ?Policy $policy = null): mixed.
 * Calls $fn(int $attempt, ?float $timeout) for each admitted attempt under the policy's retry
 * loop (retryd_call) and returns the value of the successful attempt. Throws Rejected when an
 * attempt is refused, CallFailed when the loop gives up, and an exception the policy does not
 * map as is. */
PHP_METHOD(Retryd_Dependency, call) {
  call_state s;
  memset(&s, 0, sizeof(s));
  zval* policy_zv = NULL;
  ZEND_PARSE_PARAMETERS_START(1, 2)
    Z_PARAM_FUNC(s.fci, s.fcc)
    Z_PARAM_OPTIONAL
    Z_PARAM_OBJECT_OF_CLASS_OR_NULL(policy_zv, ce_policy)
  ZEND_PARSE_PARAMETERS_END();
  dependency_obj* d = THIS(dependency_obj);
  ZVAL_UNDEF(&s.value);
  retryd_call_policy_t defaults;
  const retryd_call_policy_t* pol = NULL;
  if (policy_zv) {
    s.policy = OBJ_OF(policy_obj, Z_OBJ_P(policy_zv));
    GC_ADDREF(&s.policy->std); /* kept alive while its callable may run */
    pol = &s.policy->p;
  } else {
    retryd_call_policy_init(&defaults);
    pol = &defaults;
  }
  retryd_call_result_t res;
  memset(&res, 0, sizeof(res));
  s.dep = d;
  int rc = retryd_call(d->c, d->id, pol, attempt_cb, &s,
                       subscriptions_active ? observer_cb : NULL, &s, NULL, &res);
  if (s.retry_after) zend_string_release(s.retry_after);
  if (s.date) zend_string_release(s.date);
  s.retry_after = s.date = NULL;
  if (s.policy) OBJ_RELEASE(&s.policy->std);
  if (s.bailout) {
    zval_ptr_dtor(&s.value);
    if (s.exc) OBJ_RELEASE(s.exc);
    zend_bailout();
  }
  if (EG(exception) && zend_is_unwind_exit(EG(exception))) {  /* exit(): let it end the script */
    zval_ptr_dtor(&s.value);
    if (s.exc) OBJ_RELEASE(s.exc);
    RETURN_THROWS();
  }
  if (rc != RETRYD_OK && res.stop == 0) {
    zval_ptr_dtor(&s.value);
    if (s.exc) OBJ_RELEASE(s.exc);
    zend_throw_exception_ex(ce_error, rc, "%s: retryd_call: %s (check the policy)",
                            ZSTR_VAL(d->name), retryd_strerror(rc));
    RETURN_THROWS();
  }
  if (res.stop == RETRYD_STOP_SUCCESS) {
    if (s.exc) OBJ_RELEASE(s.exc);
    RETURN_COPY_VALUE(&s.value);
  }
  if (res.stop == RETRYD_STOP_ABORTED && s.exc) {
    zval_ptr_dtor(&s.value);
    zval ex;
    ZVAL_OBJ(&ex, s.exc);
    zend_throw_exception_object(&ex);
    RETURN_THROWS();
  }
  if (res.stop == RETRYD_STOP_REJECTED) {
    throw_rejected(res.rejection, d->name, &s.value, s.exc);
    zval_ptr_dtor(&s.value);
    RETURN_THROWS();
  }
  zend_object* ex = zend_throw_exception_ex(
      ce_call_failed, res.stop, "%s: gave up (%s) after %u attempt(s), last status %d, last error %s",
      ZSTR_VAL(d->name), stop_name(res.stop), res.attempts, res.last_status,
      error_name(res.last_error_kind));
  zend_update_property_string(ce_call_failed, ex, ZEND_STRL("stop"), stop_name(res.stop));
  zend_update_property_long(ce_call_failed, ex, ZEND_STRL("attempts"), res.attempts);
  zend_update_property_long(ce_call_failed, ex, ZEND_STRL("lastStatus"), res.last_status);
  zend_update_property_string(ce_call_failed, ex, ZEND_STRL("lastError"),
                              error_name(res.last_error_kind));
  zend_update_property_str(ce_call_failed, ex, ZEND_STRL("dependency"), d->name);
  if (!Z_ISUNDEF(s.value)) zend_update_property(ce_call_failed, ex, ZEND_STRL("value"), &s.value);
  zval_ptr_dtor(&s.value);
  if (s.exc) zend_exception_set_previous(ex, s.exc);
  RETURN_THROWS();
}

/* ---- Retryd\Policy ----------------------------------------------------------------------- */

static int64_t seconds_to_ms(double s) { return (int64_t)(s * 1000.0 + (s >= 0 ? 0.5 : -0.5)); }

/* Policy::__construct(int $maxAttempts = 3, string $jitter = "full", float $base = 0.1,
 *   float $cap = 10.0, float $retryAfterJitter = 0.1, float $retryAfterMax = 30.0,
 *   ?float $deadline = null, ?float $attemptTimeout = null, ?float $expectedAttempt = null,
 *   string $method = "GET", bool $idempotencyKey = false, ?callable $classifyException = null)
 * Times in seconds; the defaults are the C library's. */
PHP_METHOD(Retryd_Policy, __construct) {
  zend_long max_attempts = 3;
  zend_string* jitter = NULL;
  double base = 0.1, cap = 10.0, ra_jitter = 0.1, ra_max = 30.0;
  double deadline = 0, attempt_timeout = 0, expected = 0;
  bool deadline_null = 1, timeout_null = 1, expected_null = 1, idem = 0;
  zend_string* method = NULL;
  zend_fcall_info fci = empty_fcall_info;
  zend_fcall_info_cache fcc = empty_fcall_info_cache;
  ZEND_PARSE_PARAMETERS_START(0, 12)
    Z_PARAM_OPTIONAL
    Z_PARAM_LONG(max_attempts)
    Z_PARAM_STR(jitter)
    Z_PARAM_DOUBLE(base)
    Z_PARAM_DOUBLE(cap)
    Z_PARAM_DOUBLE(ra_jitter)
    Z_PARAM_DOUBLE(ra_max)
    Z_PARAM_DOUBLE_OR_NULL(deadline, deadline_null)
    Z_PARAM_DOUBLE_OR_NULL(attempt_timeout, timeout_null)
    Z_PARAM_DOUBLE_OR_NULL(expected, expected_null)
    Z_PARAM_STR(method)
    Z_PARAM_BOOL(idem)
    Z_PARAM_FUNC_OR_NULL(fci, fcc)
  ZEND_PARSE_PARAMETERS_END();
  policy_obj* o = THIS(policy_obj);
  int j = RETRYD_JITTER_FULL;
  if (jitter) {
    const char* js = ZSTR_VAL(jitter);
    if (!strcmp(js, "none")) j = RETRYD_JITTER_NONE;
    else if (!strcmp(js, "full")) j = RETRYD_JITTER_FULL;
    else if (!strcmp(js, "equal")) j = RETRYD_JITTER_EQUAL;
    else if (!strcmp(js, "decorrelated")) j = RETRYD_JITTER_DECORRELATED;
    else {
      zend_argument_value_error(2, "must be \"none\", \"full\", \"equal\" or \"decorrelated\"");
      RETURN_THROWS();
    }
  }
  if (base < 0 || cap < 0 || ra_jitter < 0 || ra_max < 0) {
    zend_value_error("Retryd\\Policy: times must not be negative");
    RETURN_THROWS();
  }
  retryd_call_policy_init(&o->p);
  o->p.max_attempts = max_attempts < 1 ? 1 : (max_attempts > UINT32_MAX ? UINT32_MAX : (uint32_t)max_attempts);
  o->p.jitter = j;
  o->p.backoff_base_ms = seconds_to_ms(base);
  o->p.backoff_cap_ms = seconds_to_ms(cap);
  o->p.retry_after_jitter_max_ms = seconds_to_ms(ra_jitter);
  o->p.retry_after_max_ms = seconds_to_ms(ra_max);
  o->p.deadline_ms = deadline_null ? -1 : (deadline < 0 ? 0 : seconds_to_ms(deadline));
  o->p.attempt_timeout_ms = timeout_null ? -1 : (attempt_timeout < 0.001 ? 1 : seconds_to_ms(attempt_timeout));
  o->p.expected_attempt_ms = expected_null || expected < 0 ? 0 : seconds_to_ms(expected);
  if (o->method) zend_string_release(o->method);
  o->method = method ? zend_string_copy(method) : zend_string_init("GET", 3, 0);
  o->p.method = ZSTR_VAL(o->method);
  o->p.has_idempotency_key = idem ? 1 : 0;
  o->p.classifier = NULL;
  zval_ptr_dtor(&o->classify_exception);
  ZVAL_UNDEF(&o->classify_exception);
  if (ZEND_FCI_INITIALIZED(fci)) ZVAL_COPY(&o->classify_exception, &fci.function_name);
}

/* Policy::withClassifyException(?callable $fn): Policy, a copy with another exception map. */
PHP_METHOD(Retryd_Policy, withClassifyException) {
  zend_fcall_info fci = empty_fcall_info;
  zend_fcall_info_cache fcc = empty_fcall_info_cache;
  ZEND_PARSE_PARAMETERS_START(1, 1)
    Z_PARAM_FUNC_OR_NULL(fci, fcc)
  ZEND_PARSE_PARAMETERS_END();
  policy_obj* src = THIS(policy_obj);
  object_init_ex(return_value, ce_policy);
  policy_obj* o = OBJ_OF(policy_obj, Z_OBJ_P(return_value));
  o->p = src->p;
  o->method = src->method ? zend_string_copy(src->method) : zend_string_init("GET", 3, 0);
  o->p.method = ZSTR_VAL(o->method);
  if (ZEND_FCI_INITIALIZED(fci)) ZVAL_COPY(&o->classify_exception, &fci.function_name);
}

/* Policy::toArray(): array, the settings in seconds (for logs and tests). */
PHP_METHOD(Retryd_Policy, toArray) {
  ZEND_PARSE_PARAMETERS_NONE();
  policy_obj* o = THIS(policy_obj);
  static const char* const jitters[] = {"none", "full", "equal", "decorrelated"};
  array_init(return_value);
  add_assoc_long(return_value, "maxAttempts", o->p.max_attempts);
  add_assoc_string(return_value, "jitter", (char*)jitters[o->p.jitter & 3]);
  add_assoc_double(return_value, "base", o->p.backoff_base_ms / 1000.0);
  add_assoc_double(return_value, "cap", o->p.backoff_cap_ms / 1000.0);
  add_assoc_double(return_value, "retryAfterJitter", o->p.retry_after_jitter_max_ms / 1000.0);
  add_assoc_double(return_value, "retryAfterMax", o->p.retry_after_max_ms / 1000.0);
  if (o->p.deadline_ms < 0) add_assoc_null(return_value, "deadline");
  else add_assoc_double(return_value, "deadline", o->p.deadline_ms / 1000.0);
  if (o->p.attempt_timeout_ms <= 0) add_assoc_null(return_value, "attemptTimeout");
  else add_assoc_double(return_value, "attemptTimeout", o->p.attempt_timeout_ms / 1000.0);
  if (o->p.expected_attempt_ms <= 0) add_assoc_null(return_value, "expectedAttempt");
  else add_assoc_double(return_value, "expectedAttempt", o->p.expected_attempt_ms / 1000.0);
  add_assoc_string(return_value, "method", o->p.method ? (char*)o->p.method : "GET");
  add_assoc_bool(return_value, "idempotencyKey", o->p.has_idempotency_key);
}

/* ---- Retryd\AttemptResult ---------------------------------------------------------------- */

/* AttemptResult::__construct(mixed $value = null, int $status = 0, string $error = "none",
 *   string|float|int|null $retryAfter = null, ?string $date = null) */
PHP_METHOD(Retryd_AttemptResult, __construct) {
  zval* value = NULL;
  zend_long status = 0;
  zend_string* error = NULL;
  zval* retry_after = NULL;
  zend_string* date = NULL;
  ZEND_PARSE_PARAMETERS_START(0, 5)
    Z_PARAM_OPTIONAL
    Z_PARAM_ZVAL(value)
    Z_PARAM_LONG(status)
    Z_PARAM_STR(error)
    Z_PARAM_ZVAL(retry_after)
    Z_PARAM_STR_OR_NULL(date)
  ZEND_PARSE_PARAMETERS_END();
  zend_object* obj = Z_OBJ_P(ZEND_THIS);
  if (error && error_kind_of(ZSTR_VAL(error)) < 0) {
    zend_argument_value_error(3, "must be one of none, dns, connect_refused, connection_reset, tls, timeout, other");
    RETURN_THROWS();
  }
  if (value) zend_update_property(ce_attempt_result, obj, ZEND_STRL("value"), value);
  zend_update_property_long(ce_attempt_result, obj, ZEND_STRL("status"), status);
  zend_update_property_string(ce_attempt_result, obj, ZEND_STRL("error"), error ? ZSTR_VAL(error) : "none");
  if (retry_after) zend_update_property(ce_attempt_result, obj, ZEND_STRL("retryAfter"), retry_after);
  if (date) zend_update_property_str(ce_attempt_result, obj, ZEND_STRL("date"), date);
}

/* ---- functions --------------------------------------------------------------------------- */

/* Retryd\deadline_header(float $seconds): string, the grpc-timeout value for a remaining time. */
PHP_FUNCTION(Retryd_deadline_header) {
  double seconds;
  ZEND_PARSE_PARAMETERS_START(1, 1)
    Z_PARAM_DOUBLE(seconds)
  ZEND_PARSE_PARAMETERS_END();
  char buf[RETRYD_DEADLINE_HEADER_BUFSIZE];
  double ns = seconds * 1e9;
  int64_t v = ns >= 9.2e18 ? INT64_MAX : (ns < 0 ? 0 : (int64_t)ns);
  int n = retryd_format_deadline_header(v, buf, sizeof(buf));
  if (n < 0) RETURN_EMPTY_STRING();
  RETURN_STRINGL(buf, n);
}

/* ---- arginfo ----------------------------------------------------------------------------- */

ZEND_BEGIN_ARG_INFO_EX(ai_none, 0, 0, 0)
ZEND_END_ARG_INFO()

ZEND_BEGIN_ARG_INFO_EX(ai_client_construct, 0, 0, 0)
  ZEND_ARG_TYPE_INFO_WITH_DEFAULT_VALUE(0, socket, IS_STRING, 1, "null")
  ZEND_ARG_TYPE_INFO_WITH_DEFAULT_VALUE(0, segment, IS_STRING, 1, "null")
  ZEND_ARG_TYPE_INFO_WITH_DEFAULT_VALUE(0, fallbackToLocal, _IS_BOOL, 0, "true")
ZEND_END_ARG_INFO()

ZEND_BEGIN_ARG_WITH_RETURN_OBJ_INFO_EX(ai_client_dependency, 0, 1, Retryd\\Dependency, 0)
  ZEND_ARG_TYPE_INFO(0, name, IS_STRING, 0)
ZEND_END_ARG_INFO()

ZEND_BEGIN_ARG_WITH_RETURN_TYPE_INFO_EX(ai_bool, 0, 0, _IS_BOOL, 0)
ZEND_END_ARG_INFO()

ZEND_BEGIN_ARG_WITH_RETURN_TYPE_INFO_EX(ai_void, 0, 0, IS_VOID, 0)
ZEND_END_ARG_INFO()

ZEND_BEGIN_ARG_WITH_RETURN_TYPE_INFO_EX(ai_long, 0, 0, IS_LONG, 0)
ZEND_END_ARG_INFO()

ZEND_BEGIN_ARG_WITH_RETURN_TYPE_INFO_EX(ai_string, 0, 0, IS_STRING, 0)
ZEND_END_ARG_INFO()

ZEND_BEGIN_ARG_WITH_RETURN_OBJ_INFO_EX(ai_dep_permit, 0, 0, Retryd\\Permit, 0)
  ZEND_ARG_TYPE_INFO_WITH_DEFAULT_VALUE(0, attempt, IS_LONG, 0, "0")
ZEND_END_ARG_INFO()

ZEND_BEGIN_ARG_WITH_RETURN_TYPE_INFO_EX(ai_dep_admit, 0, 1, IS_MIXED, 0)
  ZEND_ARG_TYPE_INFO(0, fn, IS_CALLABLE, 0)
  ZEND_ARG_TYPE_INFO_WITH_DEFAULT_VALUE(0, attempt, IS_LONG, 0, "0")
ZEND_END_ARG_INFO()

ZEND_BEGIN_ARG_WITH_RETURN_TYPE_INFO_EX(ai_dep_call, 0, 1, IS_MIXED, 0)
  ZEND_ARG_TYPE_INFO(0, fn, IS_CALLABLE, 0)
  ZEND_ARG_OBJ_INFO_WITH_DEFAULT_VALUE(0, policy, Retryd\\Policy, 1, "null")
ZEND_END_ARG_INFO()

ZEND_BEGIN_ARG_INFO_EX(ai_policy_construct, 0, 0, 0)
  ZEND_ARG_TYPE_INFO_WITH_DEFAULT_VALUE(0, maxAttempts, IS_LONG, 0, "3")
  ZEND_ARG_TYPE_INFO_WITH_DEFAULT_VALUE(0, jitter, IS_STRING, 0, "\"full\"")
  ZEND_ARG_TYPE_INFO_WITH_DEFAULT_VALUE(0, base, IS_DOUBLE, 0, "0.1")
  ZEND_ARG_TYPE_INFO_WITH_DEFAULT_VALUE(0, cap, IS_DOUBLE, 0, "10.0")
  ZEND_ARG_TYPE_INFO_WITH_DEFAULT_VALUE(0, retryAfterJitter, IS_DOUBLE, 0, "0.1")
  ZEND_ARG_TYPE_INFO_WITH_DEFAULT_VALUE(0, retryAfterMax, IS_DOUBLE, 0, "30.0")
  ZEND_ARG_TYPE_INFO_WITH_DEFAULT_VALUE(0, deadline, IS_DOUBLE, 1, "null")
  ZEND_ARG_TYPE_INFO_WITH_DEFAULT_VALUE(0, attemptTimeout, IS_DOUBLE, 1, "null")
  ZEND_ARG_TYPE_INFO_WITH_DEFAULT_VALUE(0, expectedAttempt, IS_DOUBLE, 1, "null")
  ZEND_ARG_TYPE_INFO_WITH_DEFAULT_VALUE(0, method, IS_STRING, 0, "\"GET\"")
  ZEND_ARG_TYPE_INFO_WITH_DEFAULT_VALUE(0, idempotencyKey, _IS_BOOL, 0, "false")
  ZEND_ARG_TYPE_INFO_WITH_DEFAULT_VALUE(0, classifyException, IS_CALLABLE, 1, "null")
ZEND_END_ARG_INFO()

ZEND_BEGIN_ARG_WITH_RETURN_OBJ_INFO_EX(ai_policy_with, 0, 1, Retryd\\Policy, 0)
  ZEND_ARG_TYPE_INFO(0, classifyException, IS_CALLABLE, 1)
ZEND_END_ARG_INFO()

ZEND_BEGIN_ARG_WITH_RETURN_TYPE_INFO_EX(ai_array, 0, 0, IS_ARRAY, 0)
ZEND_END_ARG_INFO()

ZEND_BEGIN_ARG_INFO_EX(ai_result_construct, 0, 0, 0)
  ZEND_ARG_TYPE_INFO_WITH_DEFAULT_VALUE(0, value, IS_MIXED, 0, "null")
  ZEND_ARG_TYPE_INFO_WITH_DEFAULT_VALUE(0, status, IS_LONG, 0, "0")
  ZEND_ARG_TYPE_INFO_WITH_DEFAULT_VALUE(0, error, IS_STRING, 0, "\"none\"")
  ZEND_ARG_TYPE_MASK(0, retryAfter, MAY_BE_STRING | MAY_BE_DOUBLE | MAY_BE_LONG | MAY_BE_NULL, "null")
  ZEND_ARG_TYPE_INFO_WITH_DEFAULT_VALUE(0, date, IS_STRING, 1, "null")
ZEND_END_ARG_INFO()

ZEND_BEGIN_ARG_WITH_RETURN_TYPE_INFO_EX(ai_deadline_header, 0, 1, IS_STRING, 0)
  ZEND_ARG_TYPE_INFO(0, seconds, IS_DOUBLE, 0)
ZEND_END_ARG_INFO()

ZEND_BEGIN_ARG_WITH_RETURN_OBJ_INFO_EX(ai_on_state_change, 0, 1, Retryd\\Subscription, 0)
  ZEND_ARG_TYPE_INFO(0, fn, IS_CALLABLE, 0)
ZEND_END_ARG_INFO()

static const zend_function_entry client_methods[] = {
  PHP_ME(Retryd_Client, __construct, ai_client_construct, ZEND_ACC_PUBLIC)
  PHP_ME(Retryd_Client, dependency, ai_client_dependency, ZEND_ACC_PUBLIC)
  PHP_ME(Retryd_Client, isLocal, ai_bool, ZEND_ACC_PUBLIC)
  PHP_ME(Retryd_Client, onStateChange, ai_on_state_change, ZEND_ACC_PUBLIC)
  PHP_FE_END
};

static const zend_function_entry subscription_methods[] = {
  PHP_ME(Retryd_Subscription, __construct, ai_none, ZEND_ACC_PRIVATE)
  PHP_ME(Retryd_Subscription, unsubscribe, ai_void, ZEND_ACC_PUBLIC)
  PHP_ME(Retryd_Subscription, isActive, ai_bool, ZEND_ACC_PUBLIC)
  PHP_FE_END
};

static const zend_function_entry dependency_methods[] = {
  PHP_ME(Retryd_Dependency, __construct, ai_none, ZEND_ACC_PRIVATE)
  PHP_ME(Retryd_Dependency, name, ai_string, ZEND_ACC_PUBLIC)
  PHP_ME(Retryd_Dependency, permit, ai_dep_permit, ZEND_ACC_PUBLIC)
  PHP_ME(Retryd_Dependency, admit, ai_dep_admit, ZEND_ACC_PUBLIC)
  PHP_ME(Retryd_Dependency, call, ai_dep_call, ZEND_ACC_PUBLIC)
  PHP_ME(Retryd_Dependency, state, ai_string, ZEND_ACC_PUBLIC)
  PHP_ME(Retryd_Dependency, onStateChange, ai_on_state_change, ZEND_ACC_PUBLIC)
  PHP_FE_END
};

static const zend_function_entry permit_methods[] = {
  PHP_ME(Retryd_Permit, __construct, ai_none, ZEND_ACC_PRIVATE)
  PHP_ME(Retryd_Permit, success, ai_void, ZEND_ACC_PUBLIC)
  PHP_ME(Retryd_Permit, failure, ai_void, ZEND_ACC_PUBLIC)
  PHP_ME(Retryd_Permit, ignored, ai_void, ZEND_ACC_PUBLIC)
  PHP_ME(Retryd_Permit, isProbe, ai_bool, ZEND_ACC_PUBLIC)
  PHP_ME(Retryd_Permit, isDone, ai_bool, ZEND_ACC_PUBLIC)
  PHP_ME(Retryd_Permit, attempt, ai_long, ZEND_ACC_PUBLIC)
  PHP_FE_END
};

static const zend_function_entry policy_methods[] = {
  PHP_ME(Retryd_Policy, __construct, ai_policy_construct, ZEND_ACC_PUBLIC)
  PHP_ME(Retryd_Policy, withClassifyException, ai_policy_with, ZEND_ACC_PUBLIC)
  PHP_ME(Retryd_Policy, toArray, ai_array, ZEND_ACC_PUBLIC)
  PHP_FE_END
};

static const zend_function_entry attempt_result_methods[] = {
  PHP_ME(Retryd_AttemptResult, __construct, ai_result_construct, ZEND_ACC_PUBLIC)
  PHP_FE_END
};

static const zend_function_entry retryd_functions[] = {
  ZEND_NS_FALIAS("Retryd", deadline_header, Retryd_deadline_header, ai_deadline_header)
  PHP_FE_END
};

/* ---- module ------------------------------------------------------------------------------ */

#define NS_CONST(name, value) \
  REGISTER_NS_LONG_CONSTANT("Retryd", name, value, CONST_CS | CONST_PERSISTENT)

static zend_class_entry* register_class(const char* name, const zend_function_entry* methods,
                                        zend_object* (*create)(zend_class_entry*),
                                        zend_class_entry* parent, uint32_t flags) {
  zend_class_entry ce;
  INIT_CLASS_ENTRY_EX(ce, name, strlen(name), methods);
  zend_class_entry* r = zend_register_internal_class_ex(&ce, parent);
  if (create) r->create_object = create;
  r->ce_flags |= flags;
  return r;
}

PHP_MINIT_FUNCTION(retryd) {
  zend_hash_init(&proc_clients, 4, NULL, proc_client_free, 1);

  ce_client = register_class("Retryd\\Client", client_methods, client_new, NULL, ZEND_ACC_FINAL);
  memcpy(&client_handlers, zend_get_std_object_handlers(), sizeof(zend_object_handlers));
  client_handlers.offset = XtOffsetOf(client_obj, std);
  client_handlers.clone_obj = NULL;

  ce_dependency = register_class("Retryd\\Dependency", dependency_methods, dependency_new, NULL,
                                 ZEND_ACC_FINAL | ZEND_ACC_NO_DYNAMIC_PROPERTIES);
  ce_dependency->ce_flags |= ZEND_ACC_NOT_SERIALIZABLE;
  memcpy(&dependency_handlers, zend_get_std_object_handlers(), sizeof(zend_object_handlers));
  dependency_handlers.offset = XtOffsetOf(dependency_obj, std);
  dependency_handlers.free_obj = dependency_free;
  dependency_handlers.clone_obj = NULL;

  ce_permit = register_class("Retryd\\Permit", permit_methods, permit_new, NULL,
                             ZEND_ACC_FINAL | ZEND_ACC_NO_DYNAMIC_PROPERTIES | ZEND_ACC_NOT_SERIALIZABLE);
  memcpy(&permit_handlers, zend_get_std_object_handlers(), sizeof(zend_object_handlers));
  permit_handlers.offset = XtOffsetOf(permit_obj, std);
  permit_handlers.free_obj = permit_free;
  permit_handlers.clone_obj = NULL;

  ce_subscription = register_class("Retryd\\Subscription", subscription_methods, subscription_new,
                                   NULL, ZEND_ACC_FINAL | ZEND_ACC_NO_DYNAMIC_PROPERTIES |
                                             ZEND_ACC_NOT_SERIALIZABLE);
  memcpy(&subscription_handlers, zend_get_std_object_handlers(), sizeof(zend_object_handlers));
  subscription_handlers.offset = XtOffsetOf(subscription_obj, std);
  subscription_handlers.clone_obj = NULL;

  ce_policy = register_class("Retryd\\Policy", policy_methods, policy_new, NULL,
                             ZEND_ACC_FINAL | ZEND_ACC_NO_DYNAMIC_PROPERTIES | ZEND_ACC_NOT_SERIALIZABLE);
  memcpy(&policy_handlers, zend_get_std_object_handlers(), sizeof(zend_object_handlers));
  policy_handlers.offset = XtOffsetOf(policy_obj, std);
  policy_handlers.free_obj = policy_free;
  policy_handlers.get_gc = policy_get_gc;
  policy_handlers.clone_obj = NULL;

  ce_attempt_result = register_class("Retryd\\AttemptResult", attempt_result_methods, NULL, NULL,
                                     ZEND_ACC_FINAL);
  zend_declare_property_null(ce_attempt_result, ZEND_STRL("value"), ZEND_ACC_PUBLIC);
  zend_declare_property_long(ce_attempt_result, ZEND_STRL("status"), 0, ZEND_ACC_PUBLIC);
  zend_declare_property_string(ce_attempt_result, ZEND_STRL("error"), "none", ZEND_ACC_PUBLIC);
  zend_declare_property_null(ce_attempt_result, ZEND_STRL("retryAfter"), ZEND_ACC_PUBLIC);
  zend_declare_property_null(ce_attempt_result, ZEND_STRL("date"), ZEND_ACC_PUBLIC);

  ce_error = register_class("Retryd\\Error", NULL, NULL, spl_ce_RuntimeException, 0);
  ce_rejected = register_class("Retryd\\Rejected", NULL, NULL, ce_error, 0);
  zend_declare_property_string(ce_rejected, ZEND_STRL("reason"), "", ZEND_ACC_PUBLIC);
  zend_declare_property_string(ce_rejected, ZEND_STRL("dependency"), "", ZEND_ACC_PUBLIC);
  zend_declare_property_null(ce_rejected, ZEND_STRL("value"), ZEND_ACC_PUBLIC);
  ce_call_failed = register_class("Retryd\\CallFailed", NULL, NULL, ce_error, 0);
  zend_declare_property_string(ce_call_failed, ZEND_STRL("stop"), "", ZEND_ACC_PUBLIC);
  zend_declare_property_long(ce_call_failed, ZEND_STRL("attempts"), 0, ZEND_ACC_PUBLIC);
  zend_declare_property_long(ce_call_failed, ZEND_STRL("lastStatus"), 0, ZEND_ACC_PUBLIC);
  zend_declare_property_string(ce_call_failed, ZEND_STRL("lastError"), "none", ZEND_ACC_PUBLIC);
  zend_declare_property_string(ce_call_failed, ZEND_STRL("dependency"), "", ZEND_ACC_PUBLIC);
  zend_declare_property_null(ce_call_failed, ZEND_STRL("value"), ZEND_ACC_PUBLIC);

  /* retryd.h */
  NS_CONST("OK", RETRYD_OK);
  NS_CONST("EINVAL", RETRYD_EINVAL);
  NS_CONST("ENOENT", RETRYD_ENOENT);
  NS_CONST("EPERM", RETRYD_EPERM);
  NS_CONST("EINCOMPATIBLE", RETRYD_EINCOMPATIBLE);
  NS_CONST("EFULL", RETRYD_EFULL);
  NS_CONST("EIO", RETRYD_EIO);
  NS_CONST("ADMITTED", RETRYD_ADMITTED);
  NS_CONST("ADMITTED_PROBE", RETRYD_ADMITTED_PROBE);
  NS_CONST("REJECTED_OPEN", RETRYD_REJECTED_OPEN);
  NS_CONST("REJECTED_HALF_OPEN_BUSY", RETRYD_REJECTED_HALF_OPEN_BUSY);
  NS_CONST("REJECTED_BULKHEAD_FULL", RETRYD_REJECTED_BULKHEAD_FULL);
  NS_CONST("REJECTED_BUDGET_EMPTY", RETRYD_REJECTED_BUDGET_EMPTY);
  NS_CONST("SUCCESS", RETRYD_SUCCESS);
  NS_CONST("FAILURE", RETRYD_FAILURE);
  NS_CONST("IGNORED", RETRYD_IGNORED);
  NS_CONST("STATE_CLOSED", RETRYD_STATE_CLOSED);
  NS_CONST("STATE_OPEN", RETRYD_STATE_OPEN);
  NS_CONST("STATE_HALF_OPEN", RETRYD_STATE_HALF_OPEN);
  /* retryd_policy.h */
  NS_CONST("JITTER_NONE", RETRYD_JITTER_NONE);
  NS_CONST("JITTER_FULL", RETRYD_JITTER_FULL);
  NS_CONST("JITTER_EQUAL", RETRYD_JITTER_EQUAL);
  NS_CONST("JITTER_DECORRELATED", RETRYD_JITTER_DECORRELATED);
  NS_CONST("ERROR_NONE", RETRYD_ERROR_NONE);
  NS_CONST("ERROR_DNS", RETRYD_ERROR_DNS);
  NS_CONST("ERROR_CONNECT_REFUSED", RETRYD_ERROR_CONNECT_REFUSED);
  NS_CONST("ERROR_CONNECTION_RESET", RETRYD_ERROR_CONNECTION_RESET);
  NS_CONST("ERROR_TLS", RETRYD_ERROR_TLS);
  NS_CONST("ERROR_TIMEOUT", RETRYD_ERROR_TIMEOUT);
  NS_CONST("ERROR_OTHER", RETRYD_ERROR_OTHER);
  NS_CONST("ATTEMPT_SUCCESS", RETRYD_ATTEMPT_SUCCESS);
  NS_CONST("ATTEMPT_RETRYABLE", RETRYD_ATTEMPT_RETRYABLE);
  NS_CONST("ATTEMPT_TERMINAL", RETRYD_ATTEMPT_TERMINAL);
  /* retryd_call.h */
  NS_CONST("STOP_NONE", RETRYD_STOP_NONE);
  NS_CONST("STOP_SUCCESS", RETRYD_STOP_SUCCESS);
  NS_CONST("STOP_TERMINAL", RETRYD_STOP_TERMINAL);
  NS_CONST("STOP_ATTEMPTS_EXHAUSTED", RETRYD_STOP_ATTEMPTS_EXHAUSTED);
  NS_CONST("STOP_REJECTED", RETRYD_STOP_REJECTED);
  NS_CONST("STOP_DEADLINE", RETRYD_STOP_DEADLINE);
  NS_CONST("STOP_RETRY_AFTER_TOO_LONG", RETRYD_STOP_RETRY_AFTER_TOO_LONG);
  NS_CONST("STOP_CANCELLED", RETRYD_STOP_CANCELLED);
  NS_CONST("STOP_ABORTED", RETRYD_STOP_ABORTED);
  return SUCCESS;
}

PHP_MSHUTDOWN_FUNCTION(retryd) {
  zend_hash_destroy(&proc_clients);
  return SUCCESS;
}

/* The request's subscriptions end with it (their callables do). */
PHP_RSHUTDOWN_FUNCTION(retryd) {
  subscriptions_end();
  return SUCCESS;
}

PHP_MINFO_FUNCTION(retryd) {
  php_info_print_table_start();
  php_info_print_table_header(2, "retryd support", "enabled");
  php_info_print_table_row(2, "extension version", PHP_RETRYD_VERSION);
  php_info_print_table_row(2, "license", "Apache-2.0");
  php_info_print_table_row(2, "clients open in this process",
                           zend_hash_num_elements(&proc_clients) ? "yes" : "no");
  php_info_print_table_end();
}

zend_module_entry retryd_module_entry = {
  STANDARD_MODULE_HEADER,
  "retryd",
  retryd_functions,
  PHP_MINIT(retryd),
  PHP_MSHUTDOWN(retryd),
  NULL,
  PHP_RSHUTDOWN(retryd),
  PHP_MINFO(retryd),
  PHP_RETRYD_VERSION,
  STANDARD_MODULE_PROPERTIES
};

#ifdef COMPILE_DL_RETRYD
ZEND_GET_MODULE(retryd)
#endif
