/* _speedups.c: retryd.Permit in C, the hot path of the Python binding.
 *
 * `with dep.admit(): ...` through ctypes spends almost all of its time converting arguments
 * and building ctypes objects; the C library's admit + complete are a few atomic
 * instructions. This module implements the Permit of retryd/_client.py (same constructor,
 * attributes, methods, `with` and `async with` semantics, same exceptions) with two direct
 * calls into libretryd, and Dependency.admit, which returns one, as a C method. Where a
 * breaker-state subscription watches the dependency (`dep._watched`) it calls the package's
 * `dep._observe_state()` after the admission and the completion, as the Python Permit does.
 *
 * It does not link libretryd: the package finds the library once (retryd._native.lib(): the
 * RETRYD_LIBRARY variable, the soname, ...) and hands bind() the addresses of retryd_admit and
 * retryd_complete, so one library is loaded however it was found, and the module builds and
 * imports without it. The C ABI is declared here by hand, as _native.py declares it for ctypes;
 * where retryd/retryd.h is on the include path (the source tree, libretryd-dev) the
 * declarations are checked against it at compile time.
 *
 * Python's stable ABI (Py_LIMITED_API, 3.10): one build serves every CPython from 3.10 on.
 *
 * Thread safety: every function runs under the GIL, and none releases it (admit and complete
 * never block), so a permit's check-then-complete cannot interleave with another thread's.
 * The module's state (the two addresses, the exception classes) is written by bind(), with
 * the same values at every retryd.Client(), and only read otherwise. Fork safety: nothing here survives a fork differently from the library's
 * own state, which handles a forked child (retryd.h).
 */
#define PY_SSIZE_T_CLEAN
#define Py_LIMITED_API 0x030A0000
#include <Python.h>

#include <stdint.h>
#include <time.h>

/* ---- the C ABI (retryd.h) ------------------------------------------------------------------ */

typedef struct {
  int32_t decision;
  uint32_t reserved;
  uint64_t opaque[5];
} raw_permit;

enum { ADMITTED = 0, ADMITTED_PROBE = 1 };
enum { SUCCESS = 0, FAILURE = 1, IGNORED = 2 };
#define NO_OUTCOME (-1)

typedef int (*admit_fn)(void* client, int32_t dependency, uint32_t attempt, raw_permit* permit);
typedef void (*complete_fn)(void* client, raw_permit* permit, int outcome, uint64_t latency_ns);

#if defined(__has_include)
#if __has_include(<retryd/retryd.h>)
#include <retryd/retryd.h>
_Static_assert(sizeof(raw_permit) == sizeof(retryd_permit_t), "retryd_permit_t changed size");
_Static_assert(_Alignof(raw_permit) == _Alignof(retryd_permit_t), "retryd_permit_t alignment");
_Static_assert(ADMITTED == RETRYD_ADMITTED && ADMITTED_PROBE == RETRYD_ADMITTED_PROBE,
               "retryd.h decisions");
_Static_assert(SUCCESS == RETRYD_SUCCESS && FAILURE == RETRYD_FAILURE && IGNORED == RETRYD_IGNORED,
               "retryd.h outcomes");
/* The declared signatures, checked by assigning the real functions to them. */
__attribute__((unused)) static void check_signatures(void) {
  int (*admit)(retryd_client_t*, retryd_dependency_t, uint32_t, retryd_permit_t*) = retryd_admit;
  void (*complete)(retryd_client_t*, retryd_permit_t*, int, uint64_t) = retryd_complete;
  (void)admit;
  (void)complete;
}
#endif
#endif

/* ---- module state --------------------------------------------------------------------------- */

typedef struct {
  admit_fn admit;       /* NULL until bind() */
  complete_fn complete;
  PyObject* permit_type;
  PyObject* ready_type;
  PyObject* admit_type;
  PyObject* method_type; /* types.MethodType */
  PyObject* error;      /* retryd.Error */
  PyObject* rejected;   /* retryd.Rejected */
  PyObject* reasons;    /* {decision: reason}: _client._ADMISSIONS */
  PyObject* outcomes;   /* {"success": 0, ...}: _policy.OUTCOMES */
  PyObject* s_client;   /* interned attribute names */
  PyObject* s_handle;
  PyObject* s_id;
  PyObject* s_watched;
  PyObject* s_name;
  PyObject* s_observe_state;
} module_state;

/* The module state of `type`, or of the first of its bases this module defined (a Python
 * subclass of Permit has none of its own). */
static module_state* state_of_type(PyTypeObject* type) {
  for (PyTypeObject* t = type; t != NULL; t = (PyTypeObject*)PyType_GetSlot(t, Py_tp_base)) {
    if (PyType_GetFlags(t) & Py_TPFLAGS_HEAPTYPE) {
      module_state* st = (module_state*)PyType_GetModuleState(t);
      if (st != NULL) return st;
      PyErr_Clear();
    }
  }
  PyErr_SetString(PyExc_TypeError, "retryd._speedups: a type this module did not define");
  return NULL;
}

static module_state* type_state(PyObject* self) {
  PyTypeObject* type = Py_TYPE(self);
  module_state* st = (module_state*)PyType_GetModuleState(type);
  if (st != NULL) return st;  /* the Permit itself: one call */
  PyErr_Clear();
  return state_of_type(type);
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);  /* time.monotonic_ns()'s clock */
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* dep._client._handle as a pointer; NULL with retryd.Error set when the client is closed. */
static void* checked_handle(module_state* st, PyObject* dep) {
  PyObject* client = PyObject_GetAttr(dep, st->s_client);
  if (client == NULL) return NULL;
  PyObject* handle_obj = PyObject_GetAttr(client, st->s_handle);
  Py_DECREF(client);
  if (handle_obj == NULL) return NULL;
  void* handle = NULL;
  if (handle_obj == Py_None) {
    PyErr_SetString(st->error, "retryd client is closed");
  } else {
    handle = PyLong_AsVoidPtr(handle_obj);
    if (handle == NULL && !PyErr_Occurred()) PyErr_SetString(st->error, "retryd client is closed");
  }
  Py_DECREF(handle_obj);
  return handle;
}

/* dep._watched: 1, 0, or -1 with an exception set. */
static int is_watched(module_state* st, PyObject* dep) {
  PyObject* watched = PyObject_GetAttr(dep, st->s_watched);
  if (watched == NULL) return -1;
  int r = watched == Py_False ? 0 : watched == Py_True ? 1 : PyObject_IsTrue(watched);
  Py_DECREF(watched);
  return r;
}

static int observe_state(module_state* st, PyObject* dep) {
  PyObject* r = PyObject_CallMethodObjArgs(dep, st->s_observe_state, NULL);
  if (r == NULL) return -1;
  Py_DECREF(r);
  return 0;
}

/* `attempt` as a uint32_t: TypeError for what is not an int, ValueError out of range (the
 * messages of the Python Permit's). */
static int parse_attempt(PyObject* obj, uint32_t* out) {
  PyObject* index = PyNumber_Index(obj);
  if (index == NULL) {
    if (PyErr_ExceptionMatches(PyExc_TypeError)) {
      PyErr_Clear();
      PyErr_Format(PyExc_TypeError, "attempt must be an int, not %R", obj);
    }
    return -1;
  }
  int overflow = 0;
  long long v = PyLong_AsLongLongAndOverflow(index, &overflow);
  Py_DECREF(index);
  if (v == -1 && PyErr_Occurred()) return -1;
  if (overflow != 0 || v < 0 || v > (long long)UINT32_MAX) {
    PyErr_Format(PyExc_ValueError, "attempt must be from 0 to 4294967295, not %R", obj);
    return -1;
  }
  *out = (uint32_t)v;
  return 0;
}

/* An outcome argument: None (*out untouched), "success", "failure", "ignored", or 0, 1, 2. */
static int parse_outcome(module_state* st, PyObject* obj, int* out) {
  if (obj == Py_None) return 0;
  PyObject* value = NULL;
  if (PyUnicode_Check(obj)) {
    value = PyDict_GetItemWithError(st->outcomes, obj);  /* borrowed */
    if (value == NULL) {
      if (!PyErr_Occurred()) {
        PyErr_Format(PyExc_ValueError,
                     "outcome must be \"success\", \"failure\" or \"ignored\", not %R", obj);
      }
      return -1;
    }
  } else if (PyLong_Check(obj)) {
    value = obj;
  } else {
    PyErr_Format(PyExc_TypeError, "outcome must be a str or an int, not %R", obj);
    return -1;
  }
  int overflow = 0;
  long v = PyLong_AsLongAndOverflow(value, &overflow);
  if (v == -1 && PyErr_Occurred()) return -1;
  if (overflow != 0 || v < SUCCESS || v > IGNORED) {
    PyErr_Format(PyExc_ValueError, "outcome must be 0 (success), 1 (failure) or 2 (ignored), not %R",
                 obj);
    return -1;
  }
  *out = (int)v;
  return 0;
}

/* ---- Permit ---------------------------------------------------------------------------------- */

typedef struct {
  PyObject_HEAD
  PyObject* dep;     /* the Dependency; NULL only once the garbage collector cleared it */
  int64_t start_ns;  /* when the admission returned: the latency is measured from there */
  int outcome;       /* chosen by fail(), ignored(), succeed(); NO_OUTCOME until then */
  int done;          /* completed (or refused, or given back) */
  uint32_t attempt;
  raw_permit raw;
} Permit;

/* Gives an admission back unreported, as a refusal is completed: with IGNORED, latency 0.
 * `handle` NULL: the handle is read again (Python code ran since the admission and may have
 * closed the client), keeping any exception already set. */
static void give_back(module_state* st, Permit* p, void* handle) {
  p->done = 1;
  if (handle != NULL) {
    st->complete(handle, &p->raw, IGNORED, 0);
    return;
  }
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  handle = checked_handle(st, p->dep);
  if (handle != NULL) st->complete(handle, &p->raw, IGNORED, 0);
  PyErr_Clear();  /* a closed client abandons its permits: nothing to give back */
  PyErr_Restore(type, value, tb);
}

static void raise_refusal(module_state* st, PyObject* dep, int decision) {
  PyObject* name = PyObject_GetAttr(dep, st->s_name);
  if (name == NULL) return;
  if (decision < 0) {
    PyErr_Format(st->error, "%S: invalid dependency handle", name);
    Py_DECREF(name);
    return;
  }
  PyObject* key = PyLong_FromLong(decision);
  PyObject* reason = key == NULL ? NULL : PyDict_GetItemWithError(st->reasons, key);
  if (reason != NULL) {
    Py_INCREF(reason);
  } else if (!PyErr_Occurred()) {
    reason = PyObject_Str(key);
  }
  Py_XDECREF(key);
  if (reason != NULL) {
    PyObject* exc = PyObject_CallFunctionObjArgs(st->rejected, reason, name, NULL);
    if (exc != NULL) {
      PyErr_SetObject((PyObject*)Py_TYPE(exc), exc);
      Py_DECREF(exc);
    }
    Py_DECREF(reason);
  }
  Py_DECREF(name);
}

/* Admits attempt `attempt` of `dep`: a new Permit, or NULL with Rejected (or another error)
 * set. As the Python Permit's constructor. */
static PyObject* admit(module_state* st, PyTypeObject* type, PyObject* dep, PyObject* attempt_obj) {
  if (st->admit == NULL) {
    PyErr_SetString(PyExc_RuntimeError,
                    "retryd._speedups is not bound to libretryd (retryd.Client() binds it)");
    return NULL;
  }
  uint32_t attempt = 0;
  if (attempt_obj != NULL && parse_attempt(attempt_obj, &attempt) < 0) return NULL;
  void* handle = checked_handle(st, dep);
  if (handle == NULL) return NULL;
  PyObject* id_obj = PyObject_GetAttr(dep, st->s_id);
  if (id_obj == NULL) return NULL;
  long id = PyLong_AsLong(id_obj);
  Py_DECREF(id_obj);
  if (id == -1 && PyErr_Occurred()) return NULL;

  Permit* p = (Permit*)PyType_GenericAlloc(type, 0);
  if (p == NULL) return NULL;
  Py_INCREF(dep);
  p->dep = dep;
  p->outcome = NO_OUTCOME;
  p->attempt = attempt;
  int decision = st->admit(handle, (int32_t)id, attempt, &p->raw);
  p->start_ns = now_ns();

  int watched = is_watched(st, dep);
  if (watched != 0) {
    /* A subscriber's exception (KeyboardInterrupt, say): nothing was sent, so the admission is
     * given back before the exception goes on. */
    if (watched < 0 || observe_state(st, dep) < 0) {
      give_back(st, p, NULL);
      Py_DECREF(p);
      return NULL;
    }
  }
  if (decision != ADMITTED && decision != ADMITTED_PROBE) {
    /* The contract: every admission is completed (for a refusal, a no-op). */
    give_back(st, p, watched ? NULL : handle);
    raise_refusal(st, dep, decision);
    Py_DECREF(p);
    return NULL;
  }
  return (PyObject*)p;
}

/* Reports `outcome` now; a second call is a no-op. As the Python Permit's complete(). */
static int finish(module_state* st, Permit* p, int outcome) {
  if (p->done || p->dep == NULL) return 0;
  p->done = 1;
  int64_t latency = now_ns() - p->start_ns;
  void* handle = checked_handle(st, p->dep);
  if (handle == NULL) return -1;
  st->complete(handle, &p->raw, outcome, latency > 0 ? (uint64_t)latency : 0);
  int watched = is_watched(st, p->dep);
  if (watched != 0 && (watched < 0 || observe_state(st, p->dep) < 0)) return -1;
  return 0;
}

static int finish_at_exit(module_state* st, Permit* p, PyObject* exc_type) {
  int outcome = p->outcome != NO_OUTCOME ? p->outcome : exc_type != Py_None ? FAILURE : SUCCESS;
  return finish(st, p, outcome);
}

/* The arguments (dep, attempt=0) of Permit() and of Dependency.admit (`dep` is its self). */
static int parse_admit_args(PyObject* args, PyObject* kwds, const char* format, PyObject** dep,
                            PyObject** attempt) {
  static char* keywords[] = {"dep", "attempt", NULL};
  Py_ssize_t n = PyTuple_Size(args);
  if (kwds == NULL && (n == 1 || n == 2)) {  /* the usual calls, without parsing a format */
    *dep = PyTuple_GetItem(args, 0);
    *attempt = n == 2 ? PyTuple_GetItem(args, 1) : NULL;
    return 0;
  }
  *attempt = NULL;
  return PyArg_ParseTupleAndKeywords(args, kwds, format, keywords, dep, attempt) ? 0 : -1;
}

/* Permit(dep, attempt=0): the Python Permit's constructor. */
static PyObject* Permit_new(PyTypeObject* type, PyObject* args, PyObject* kwds) {
  PyObject *dep, *attempt;
  if (parse_admit_args(args, kwds, "O|O:Permit", &dep, &attempt) < 0) return NULL;
  module_state* st = state_of_type(type);
  if (st == NULL) return NULL;
  return admit(st, type, dep, attempt);
}

static int Permit_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));
  Py_VISIT(((Permit*)self)->dep);
  return 0;
}

static int Permit_clear(PyObject* self) {
  Py_CLEAR(((Permit*)self)->dep);
  return 0;
}

static void Permit_dealloc(PyObject* self) {
  PyTypeObject* type = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  Permit_clear(self);
  PyObject_GC_Del(self);
  Py_DECREF(type);
}

static PyObject* Permit_probe(PyObject* self, void* closure) {
  (void)closure;
  return PyBool_FromLong(((Permit*)self)->raw.decision == ADMITTED_PROBE);
}

static PyObject* Permit_attempt(PyObject* self, void* closure) {
  (void)closure;
  return PyLong_FromUnsignedLong(((Permit*)self)->attempt);
}

static PyObject* choose(PyObject* self, int outcome) {
  ((Permit*)self)->outcome = outcome;
  Py_RETURN_NONE;
}

static PyObject* Permit_fail(PyObject* self, PyObject* unused) {
  (void)unused;
  return choose(self, FAILURE);
}

static PyObject* Permit_ignored(PyObject* self, PyObject* unused) {
  (void)unused;
  return choose(self, IGNORED);
}

static PyObject* Permit_succeed(PyObject* self, PyObject* unused) {
  (void)unused;
  return choose(self, SUCCESS);
}

static PyObject* Permit_complete(PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                                 PyObject* kwnames) {
  PyObject* outcome_obj = Py_None;
  Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_Size(kwnames);
  if (nargs + nkw > 1) {
    PyErr_Format(PyExc_TypeError, "complete() takes at most 1 argument (%zd given)", nargs + nkw);
    return NULL;
  }
  if (nargs == 1) {
    outcome_obj = args[0];
  } else if (nkw == 1) {
    PyObject* key = PyTuple_GetItem(kwnames, 0);
    if (key == NULL) return NULL;
    if (PyUnicode_CompareWithASCIIString(key, "outcome") != 0) {
      PyErr_Format(PyExc_TypeError, "complete() got an unexpected keyword argument %R", key);
      return NULL;
    }
    outcome_obj = args[0];
  }
  Permit* p = (Permit*)self;
  if (p->done) Py_RETURN_NONE;
  module_state* st = type_state(self);
  if (st == NULL) return NULL;
  int outcome = p->outcome != NO_OUTCOME ? p->outcome : SUCCESS;
  if (parse_outcome(st, outcome_obj, &outcome) < 0) return NULL;
  if (finish(st, p, outcome) < 0) return NULL;
  Py_RETURN_NONE;
}

static PyObject* Permit_enter(PyObject* self, PyObject* unused) {
  (void)unused;
  Py_INCREF(self);
  return self;
}

static PyObject* Permit_exit(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3) {
    PyErr_Format(PyExc_TypeError, "__exit__() takes 3 arguments (%zd given)", nargs);
    return NULL;
  }
  module_state* st = type_state(self);
  if (st == NULL || finish_at_exit(st, (Permit*)self, args[0]) < 0) return NULL;
  Py_RETURN_FALSE;
}

/* ---- the awaitables of __aenter__ and __aexit__ ----------------------------------------------- */

/* An awaitable whose await returns `value` at once, never suspending: admit and complete never
 * block, so `async with` needs no event loop's help. */
typedef struct {
  PyObject_HEAD
  PyObject* value;  /* NULL once returned */
} Ready;

static PyObject* ready(module_state* st, PyObject* value) {
  Ready* r = (Ready*)PyType_GenericAlloc((PyTypeObject*)st->ready_type, 0);
  if (r == NULL) return NULL;
  Py_INCREF(value);
  r->value = value;
  return (PyObject*)r;
}

static PyObject* Ready_await(PyObject* self) {
  Py_INCREF(self);
  return self;
}

static PyObject* Ready_next(PyObject* self) {
  Ready* r = (Ready*)self;
  PyObject* value = r->value;
  if (value == NULL) return NULL;  /* exhausted: StopIteration */
  r->value = NULL;
  /* StopIteration(value), built explicitly: PyErr_SetObject would unpack a tuple. */
  PyObject* stop = PyObject_CallFunctionObjArgs(PyExc_StopIteration, value, NULL);
  Py_DECREF(value);
  if (stop != NULL) {
    PyErr_SetObject(PyExc_StopIteration, stop);
    Py_DECREF(stop);
  }
  return NULL;
}

static int Ready_clear(PyObject* self);

/* The coroutine protocol, so that asyncio takes it wherever it takes a coroutine
 * (create_task, ensure_future: the module registers it as a collections.abc.Coroutine). */
static PyObject* Ready_send(PyObject* self, PyObject* value) {
  if (value != Py_None && ((Ready*)self)->value != NULL) {
    PyErr_SetString(PyExc_TypeError, "can't send non-None value to a just-started coroutine");
    return NULL;
  }
  return Ready_next(self);
}

static PyObject* Ready_throw(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs < 1 || nargs > 3) {
    PyErr_Format(PyExc_TypeError, "throw() takes 1 to 3 arguments (%zd given)", nargs);
    return NULL;
  }
  Ready_clear(self);  /* thrown into: it never returns its value */
  PyObject* exc = args[0];
  if (PyExceptionClass_Check(exc)) {
    PyObject* value = nargs > 1 && args[1] != Py_None ? args[1] : NULL;
    PyErr_SetObject(exc, value);
  } else if (PyExceptionInstance_Check(exc)) {
    PyErr_SetObject((PyObject*)Py_TYPE(exc), exc);
  } else {
    PyErr_SetString(PyExc_TypeError, "exceptions must be classes or instances deriving from BaseException");
  }
  return NULL;
}

static PyObject* Ready_close(PyObject* self, PyObject* unused) {
  (void)unused;
  Ready_clear(self);
  Py_RETURN_NONE;
}

static PyMethodDef Ready_methods[] = {
    {"send", Ready_send, METH_O, NULL},
    {"throw", (PyCFunction)(void (*)(void))Ready_throw, METH_FASTCALL, NULL},
    {"close", Ready_close, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static int Ready_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));
  Py_VISIT(((Ready*)self)->value);
  return 0;
}

static int Ready_clear(PyObject* self) {
  Py_CLEAR(((Ready*)self)->value);
  return 0;
}

static void Ready_dealloc(PyObject* self) {
  PyTypeObject* type = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  Ready_clear(self);
  PyObject_GC_Del(self);
  Py_DECREF(type);
}

static PyObject* Permit_aenter(PyObject* self, PyObject* unused) {
  (void)unused;
  module_state* st = type_state(self);
  return st == NULL ? NULL : ready(st, self);
}

static PyObject* Permit_aexit(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3) {
    PyErr_Format(PyExc_TypeError, "__aexit__() takes 3 arguments (%zd given)", nargs);
    return NULL;
  }
  module_state* st = type_state(self);
  if (st == NULL || finish_at_exit(st, (Permit*)self, args[0]) < 0) return NULL;
  return ready(st, Py_False);
}

static PyGetSetDef Permit_getset[] = {
    {"probe", Permit_probe, NULL, "True if this attempt is the breaker's half-open probe.", NULL},
    {"attempt", Permit_attempt, NULL, "The attempt's number (0: first attempt, 1: first retry...).",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef Permit_methods[] = {
    {"fail", Permit_fail, METH_NOARGS, "Report a failure (counts toward the breaker) at exit."},
    {"ignored", Permit_ignored, METH_NOARGS,
     "Report the attempt as ignored at exit: the caller's fault (a 4xx), not the dependency's;\n"
     "the breaker does not see it."},
    {"succeed", Permit_succeed, METH_NOARGS, "Report a success at exit, even if the block raises."},
    {"complete", (PyCFunction)(void (*)(void))Permit_complete, METH_FASTCALL | METH_KEYWORDS,
     "complete(outcome=None)\n--\n\n"
     "Reports the outcome (\"success\", \"failure\", \"ignored\", or the one chosen by fail(),\n"
     "ignored(), succeed(); default success) now. A second call is a no-op."},
    {"__enter__", Permit_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))Permit_exit, METH_FASTCALL, NULL},
    {"__aenter__", Permit_aenter, METH_NOARGS, NULL},
    {"__aexit__", (PyCFunction)(void (*)(void))Permit_aexit, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot Permit_slots[] = {
    {Py_tp_doc,
     "An admitted attempt, from dep.admit(). Report how it ended exactly once: by leaving its\n"
     "`with` or `async with` block (success on a normal exit, failure on an exception) or by\n"
     "complete(). fail(), ignored() and succeed() choose the outcome reported at exit, whatever\n"
     "happens."},
    {Py_tp_new, Permit_new},
    {Py_tp_dealloc, Permit_dealloc},
    {Py_tp_traverse, Permit_traverse},
    {Py_tp_clear, Permit_clear},
    {Py_tp_getset, Permit_getset},
    {Py_tp_methods, Permit_methods},
    {0, NULL},
};

static PyType_Spec Permit_spec = {
    .name = "retryd._speedups.Permit",
    .basicsize = sizeof(Permit),
    /* A base type, as the ctypes Permit is a class one may derive from. */
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE |
             Py_TPFLAGS_BASETYPE,
    .slots = Permit_slots,
};

static PyType_Slot Ready_slots[] = {
    {Py_am_await, Ready_await},
    {Py_tp_iter, Ready_await},
    {Py_tp_iternext, Ready_next},
    {Py_tp_methods, Ready_methods},
    {Py_tp_dealloc, Ready_dealloc},
    {Py_tp_traverse, Ready_traverse},
    {Py_tp_clear, Ready_clear},
    {0, NULL},
};

static PyType_Spec Ready_spec = {
    .name = "retryd._speedups.Ready",
    .basicsize = sizeof(Ready),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE |
             Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = Ready_slots,
};

/* ---- Dependency.admit --------------------------------------------------------------------- */

/* Dependency.admit(attempt=0) in C: Permit(dep, attempt) without a Python frame between the
 * caller and the admission. It behaves as the function it replaces in the class: `dep.admit(...)`
 * calls it with the dependency first and binds nothing (Py_TPFLAGS_METHOD_DESCRIPTOR), while
 * `dep.admit` alone is a bound method (types.MethodType); its name, documentation and
 * signature are those of the Python function it wraps (`__wrapped__`, as functools.wraps
 * leaves), which it never calls. */
typedef struct {
  PyObject_HEAD
  PyObject* wrapped;
} AdmitMethod;

static PyObject* AdmitMethod_new(PyTypeObject* type, PyObject* args, PyObject* kwds) {
  PyObject* wrapped;
  if (kwds != NULL || !PyArg_ParseTuple(args, "O:admit_method", &wrapped)) {
    if (kwds != NULL) PyErr_SetString(PyExc_TypeError, "admit_method() takes no keyword arguments");
    return NULL;
  }
  AdmitMethod* m = (AdmitMethod*)PyType_GenericAlloc(type, 0);
  if (m == NULL) return NULL;
  Py_INCREF(wrapped);
  m->wrapped = wrapped;
  return (PyObject*)m;
}

static PyObject* AdmitMethod_call(PyObject* self, PyObject* args, PyObject* kwds) {
  PyObject *dep, *attempt;
  if (parse_admit_args(args, kwds, "O|O:admit", &dep, &attempt) < 0) return NULL;
  module_state* st = type_state(self);
  return admit(st, (PyTypeObject*)st->permit_type, dep, attempt);
}

static PyObject* AdmitMethod_get(PyObject* self, PyObject* obj, PyObject* type) {
  (void)type;
  if (obj == NULL || obj == Py_None) {
    Py_INCREF(self);
    return self;
  }
  return PyObject_CallFunctionObjArgs(type_state(self)->method_type, self, obj, NULL);
}

static PyObject* AdmitMethod_wrapped_attr(PyObject* self, void* name) {
  return PyObject_GetAttrString(((AdmitMethod*)self)->wrapped, (const char*)name);
}

static PyObject* AdmitMethod_wrapped(PyObject* self, void* closure) {
  (void)closure;
  PyObject* wrapped = ((AdmitMethod*)self)->wrapped;
  Py_INCREF(wrapped);
  return wrapped;
}

static int AdmitMethod_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));
  Py_VISIT(((AdmitMethod*)self)->wrapped);
  return 0;
}

static int AdmitMethod_clear(PyObject* self) {
  Py_CLEAR(((AdmitMethod*)self)->wrapped);
  return 0;
}

static void AdmitMethod_dealloc(PyObject* self) {
  PyTypeObject* type = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  AdmitMethod_clear(self);
  PyObject_GC_Del(self);
  Py_DECREF(type);
}

static PyGetSetDef AdmitMethod_getset[] = {
    {"__name__", AdmitMethod_wrapped_attr, NULL, NULL, "__name__"},
    {"__qualname__", AdmitMethod_wrapped_attr, NULL, NULL, "__qualname__"},
    {"__module__", AdmitMethod_wrapped_attr, NULL, NULL, "__module__"},
    {"__doc__", AdmitMethod_wrapped_attr, NULL, NULL, "__doc__"},
    {"__wrapped__", AdmitMethod_wrapped, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot AdmitMethod_slots[] = {
    {Py_tp_new, AdmitMethod_new},
    {Py_tp_call, AdmitMethod_call},
    {Py_tp_descr_get, AdmitMethod_get},
    {Py_tp_getset, AdmitMethod_getset},
    {Py_tp_dealloc, AdmitMethod_dealloc},
    {Py_tp_traverse, AdmitMethod_traverse},
    {Py_tp_clear, AdmitMethod_clear},
    {0, NULL},
};

static PyType_Spec AdmitMethod_spec = {
    .name = "retryd._speedups.admit_method",
    .basicsize = sizeof(AdmitMethod),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE |
             Py_TPFLAGS_METHOD_DESCRIPTOR,
    .slots = AdmitMethod_slots,
};

/* ---- module functions -------------------------------------------------------------------- */

static PyObject* bind(PyObject* module, PyObject* args) {
  PyObject *admit_addr, *complete_addr, *error, *rejected, *reasons, *outcomes;
  if (!PyArg_ParseTuple(args, "OOOOO!O!:bind", &admit_addr, &complete_addr, &error, &rejected,
                        &PyDict_Type, &reasons, &PyDict_Type, &outcomes)) {
    return NULL;
  }
  void* admit_ptr = PyLong_AsVoidPtr(admit_addr);
  if (admit_ptr == NULL && PyErr_Occurred()) return NULL;
  void* complete_ptr = PyLong_AsVoidPtr(complete_addr);
  if (complete_ptr == NULL && PyErr_Occurred()) return NULL;
  if (admit_ptr == NULL || complete_ptr == NULL) {
    PyErr_SetString(PyExc_ValueError, "bind: the addresses of retryd_admit and retryd_complete "
                                      "must not be NULL");
    return NULL;
  }
  if (!PyType_Check(error) || !PyType_Check(rejected)) {
    PyErr_SetString(PyExc_TypeError, "bind: Error and Rejected must be exception classes");
    return NULL;
  }
  module_state* st = (module_state*)PyModule_GetState(module);
  PyObject* old[] = {st->error, st->rejected, st->reasons, st->outcomes};
  Py_INCREF(error);
  st->error = error;
  Py_INCREF(rejected);
  st->rejected = rejected;
  Py_INCREF(reasons);
  st->reasons = reasons;
  Py_INCREF(outcomes);
  st->outcomes = outcomes;
  for (size_t i = 0; i < sizeof old / sizeof old[0]; i++) Py_XDECREF(old[i]);
  /* A data pointer converted to a function pointer: what dlsym hands out, too. */
  st->admit = (admit_fn)admit_ptr;
  st->complete = (complete_fn)complete_ptr;
  Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"bind", bind, METH_VARARGS,
     "bind(admit_address, complete_address, Error, Rejected, reasons, outcomes)\n--\n\n"
     "Binds the module to libretryd's retryd_admit and retryd_complete (their addresses),\n"
     "and to the package's exceptions and names. retryd.Client() calls it."},
    {NULL, NULL, 0, NULL},
};

static int module_exec(PyObject* module) {
  module_state* st = (module_state*)PyModule_GetState(module);
  st->permit_type = PyType_FromModuleAndSpec(module, &Permit_spec, NULL);
  if (st->permit_type == NULL) return -1;
  st->ready_type = PyType_FromModuleAndSpec(module, &Ready_spec, NULL);
  if (st->ready_type == NULL) return -1;
  st->admit_type = PyType_FromModuleAndSpec(module, &AdmitMethod_spec, NULL);
  if (st->admit_type == NULL) return -1;
  if (PyModule_AddType(module, (PyTypeObject*)st->permit_type) < 0) return -1;
  if (PyModule_AddType(module, (PyTypeObject*)st->admit_type) < 0) return -1;
  if (PyModule_AddType(module, (PyTypeObject*)st->ready_type) < 0) return -1;
  PyObject* types = PyImport_ImportModule("types");
  if (types == NULL) return -1;
  st->method_type = PyObject_GetAttrString(types, "MethodType");
  Py_DECREF(types);
  if (st->method_type == NULL) return -1;
  const struct {
    PyObject** slot;
    const char* name;
  } names[] = {
      {&st->s_client, "_client"},   {&st->s_handle, "_handle"}, {&st->s_id, "_id"},
      {&st->s_watched, "_watched"}, {&st->s_name, "name"},
      {&st->s_observe_state, "_observe_state"},
  };
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    *names[i].slot = PyUnicode_InternFromString(names[i].name);
    if (*names[i].slot == NULL) return -1;
  }
  return 0;
}

static int module_traverse(PyObject* module, visitproc visit, void* arg) {
  module_state* st = (module_state*)PyModule_GetState(module);
  Py_VISIT(st->permit_type);
  Py_VISIT(st->ready_type);
  Py_VISIT(st->admit_type);
  Py_VISIT(st->method_type);
  Py_VISIT(st->error);
  Py_VISIT(st->rejected);
  Py_VISIT(st->reasons);
  Py_VISIT(st->outcomes);
  return 0;
}

static int module_clear(PyObject* module) {
  module_state* st = (module_state*)PyModule_GetState(module);
  st->admit = NULL;
  st->complete = NULL;
  Py_CLEAR(st->permit_type);
  Py_CLEAR(st->ready_type);
  Py_CLEAR(st->admit_type);
  Py_CLEAR(st->method_type);
  Py_CLEAR(st->error);
  Py_CLEAR(st->rejected);
  Py_CLEAR(st->reasons);
  Py_CLEAR(st->outcomes);
  Py_CLEAR(st->s_client);
  Py_CLEAR(st->s_handle);
  Py_CLEAR(st->s_id);
  Py_CLEAR(st->s_watched);
  Py_CLEAR(st->s_name);
  Py_CLEAR(st->s_observe_state);
  return 0;
}

static void module_free(void* module) {
  module_clear((PyObject*)module);
}

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec},
    {0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "retryd._speedups",
    .m_doc = "retryd.Permit in C: the hot path of the binding (see retryd/_client.py).",
    .m_size = sizeof(module_state),
    .m_methods = module_methods,
    .m_slots = module_slots,
    .m_traverse = module_traverse,
    .m_clear = module_clear,
    .m_free = module_free,
};

PyMODINIT_FUNC PyInit__speedups(void) {
  return PyModuleDef_Init(&module_def);
}
