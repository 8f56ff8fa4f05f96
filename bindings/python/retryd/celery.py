"""Celery tasks whose retries go through the host's retry budget and circuit breaker.

    import retryd
    import retryd.celery

    payments = retryd.Client().dependency("payments")

    @app.task(bind=True, base=retryd.celery.Task, retryd_dependency=payments,
              retryd_policy=retryd.Policy(max_attempts=5, base=1.0, cap=60.0))
    def charge(self, order_id):
        with urllib.request.urlopen(f"{PAYMENTS}/charge/{order_id}", timeout=5) as r:
            return json.load(r)

Each execution of such a task is one attempt, admitted by the host before its body runs: the
first execution as attempt 0, the one after n retries as attempt n (`self.request.retries`),
so every retry takes a token from the host's retry budget when it runs, in whichever worker
process runs it. A refusal (breaker open, the half-open probe out, bulkhead full, or a retry
the budget cannot pay for) fails the task at once with TaskRejected, a retryd.Rejected, and
the body does not run. The task is not retried later: a refused retry is denied, never queued
(the budget's rule), and first attempts put back on the queue while the breaker is open would
all come back together when it reopens, the stampede the breaker is there to prevent.

The body's outcome is judged as dep.call judges an attempt: an exception through the policy's
`classify_exception` (a refused connection, a timeout, urllib's HTTPError with its status and
Retry-After), a return value through its `inspect` (a response object's status), then the
classification table (the policy's `classifier`, `method`, `idempotency_key`). The breaker is
told the outcome. A retryable attempt with attempts left is retried through Celery's own
`self.retry`, its countdown the policy's backoff (`jitter`, `base`, `cap`, computed by the C
library for the `self.request.retries` retries so far) merged with the server's Retry-After
plus `retry_after_jitter`; a Retry-After longer than `retry_after_max` ends the retrying.
When the retrying ends, the task fails with the body's exception as raised (or returns the
last value, a 503 response say), as Celery's `autoretry_for` does once `max_retries` is spent.
An exception the policy does not map ends the task at once, as a failure.

The task's `max_retries` is set from the policy (`max_attempts - 1`). The policy's
`deadline`, `attempt_timeout`, `expected_attempt` and `observer` have no meaning for a task
whose retries wait in the broker; they are refused, as are `autoretry_for` and a `max_retries`
other than the policy's, with a ValueError or TypeError naming the task and the setting, when
Celery makes the task's class (as the app is finalized, or at the task's first use). A body
that raises Celery's Retry, Ignore or Reject itself has its attempt reported as ignored.
Called directly (`charge(42)`, not through a worker), the body runs once, admitted as a first
attempt.

`retryd_dependency` is a Dependency or a name; a name is resolved on `retryd_client`, or by
default on a retryd.Client() made on first use (a pool process forked after that keeps using
it, as any forked child does). Celery is imported with this module, which retryd itself never
imports.
"""

import ctypes
import threading
import time

import celery
from celery import exceptions as celery_exceptions
from celery.utils.serialization import get_pickleable_exception

from . import AttemptResult, Client, Dependency, Policy, Rejected, _native
from ._policy import CLASSES, ERROR_KINDS, OUTCOME_NAMES, OUTCOMES

__all__ = ["Task", "TaskRejected"]

# The previous retry's backoff (ns), carried in the retry's message: decorrelated jitter grows
# from it.
BACKOFF_HEADER = "retryd_backoff_ns"

_UNSUPPORTED = {
    "deadline": "a task's retries wait in the broker; bound the task with Celery's expires",
    "attempt_timeout": "pass the timeout to the call the task makes, or use its time_limit",
    "expected_attempt": "it matters only with a deadline",
    "observer": "use Celery's task_retry and task_failure signals",
}


class TaskRejected(Rejected):
    """The host refused a task's execution; its body did not run.

    `reason` as retryd.Rejected's ("open", "half_open_busy", "bulkhead_full",
    "budget_empty"), `dependency` the dependency's name, `attempt` the execution's attempt
    number (0 the first, n after n retries). Its arguments are these three, so that Celery's
    result backend gives it back whole, with the JSON serializer as with pickle.
    """

    def __init__(self, reason, dependency=None, attempt=0):
        super().__init__(reason, dependency)
        self.attempt = attempt
        self.args = (reason, dependency, attempt)

    def __str__(self):
        what = "first attempt" if self.attempt == 0 else f"retry {self.attempt}"
        return f"{self.dependency}: {what} rejected: {self.reason}"


# The policy toolkit of retryd_policy.h, declared on a handle of our own to the library the
# package loaded: backoff, Retry-After and classification, as the C retry loop uses them.
_toolkit = None
_toolkit_lock = threading.Lock()


def _lib():
    global _toolkit
    if _toolkit is not None:
        return _toolkit
    with _toolkit_lock:
        if _toolkit is None:
            lib = ctypes.CDLL(_native.library_path())
            i64, i64p = ctypes.c_int64, ctypes.POINTER(ctypes.c_int64)
            intp = ctypes.POINTER(ctypes.c_int)
            sigs = {
                "retryd_random": (ctypes.c_uint64, []),
                "retryd_backoff_ns": (ctypes.c_int, [ctypes.c_int, i64, i64, ctypes.c_uint32, i64,
                                                     ctypes.c_uint64, i64p]),
                "retryd_merge_wait_ns": (ctypes.c_int, [i64, i64, i64, ctypes.c_uint64, i64p]),
                "retryd_parse_retry_after": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_char_p, i64,
                                                            i64, i64p]),
                "retryd_classifier_classify": (ctypes.c_int, [
                    ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                    intp, intp]),
                "retryd_classify": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_int, ctypes.c_int,
                                                   ctypes.c_int, intp, intp]),
            }
            for name, (restype, argtypes) in sigs.items():
                fn = getattr(lib, name)
                fn.restype, fn.argtypes = restype, argtypes
            _toolkit = lib
    return _toolkit


def _ns(seconds):
    return int(round(seconds * 1e9))


def _classify(policy, result):
    """(attempt class, breaker outcome) of one attempt's AttemptResult under `policy`, as the
    C retry loop decides them: the result's own classification if it has one, else the
    policy's table for its method, status and error."""
    if result.attempt_class is not None:
        breaker = result.breaker or ("success" if result.attempt_class == "success" else "failure")
        return CLASSES[result.attempt_class], OUTCOMES[breaker]
    error = ERROR_KINDS[result.error] if isinstance(result.error, str) else int(result.error)
    attempt_class, breaker = ctypes.c_int(), ctypes.c_int()
    lib = _lib()
    method = policy.method.encode()
    status = int(result.status or 0)
    key = int(bool(policy.idempotency_key))
    if policy.classifier is not None:
        rc = lib.retryd_classifier_classify(policy.classifier._handle, method, status, error, key,
                                            ctypes.byref(attempt_class), ctypes.byref(breaker))
    else:
        rc = lib.retryd_classify(method, status, error, key, ctypes.byref(attempt_class),
                                 ctypes.byref(breaker))
    if rc != 0:
        raise ValueError(f"retryd.celery: cannot classify status {status}, error {result.error!r}")
    return attempt_class.value, breaker.value


def _retry_after_ns(policy, result):
    """(the server's Retry-After in ns, or -1 without a usable one; whether it is longer than
    the policy's retry_after_max)."""
    value = result.retry_after
    if value is None:
        return -1, False
    limit = _ns(policy.retry_after_max)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        wait = max(0, _ns(value))
        return wait, wait > limit
    wait_ms = ctypes.c_int64()
    date = None if result.date is None else str(result.date).encode("latin-1", "replace")
    # One millisecond past the limit: a longer wait parses as that, and ends the retrying.
    rc = _lib().retryd_parse_retry_after(str(value).encode("latin-1", "replace"), date,
                                         int(time.time() * 1000), limit // 1_000_000 + 1,
                                         ctypes.byref(wait_ms))
    if rc != 0:
        return -1, False  # malformed: as if the server had sent none, as dep.call does
    wait = wait_ms.value * 1_000_000
    return wait, wait > limit


def _next_wait_ns(policy, retries, previous_backoff_ns, retry_after):
    """(the wait before the retry that follows `retries` earlier retries, its backoff part):
    the policy's backoff with jitter merged with the server's Retry-After (ns, or -1)."""
    lib = _lib()
    backoff = ctypes.c_int64()
    rc = lib.retryd_backoff_ns(_native.JITTER[policy.jitter], _ns(policy.base), _ns(policy.cap),
                               min(int(retries), 2**32 - 1), max(0, int(previous_backoff_ns)),
                               lib.retryd_random(), ctypes.byref(backoff))
    if rc != 0:
        raise ValueError(f"retryd.celery: bad backoff in {policy!r}")
    wait = ctypes.c_int64()
    rc = lib.retryd_merge_wait_ns(backoff.value, retry_after, _ns(policy.retry_after_jitter),
                                  lib.retryd_random(), ctypes.byref(wait))
    if rc != 0:
        raise ValueError(f"retryd.celery: bad retry_after_jitter in {policy!r}")
    return wait.value, backoff.value


def _check(cls):
    """Refuses, when Celery makes a task class, what this module cannot honour."""
    name = getattr(cls, "name", None) or cls.__name__
    policy = cls.retryd_policy
    if policy is None:
        policy = Policy()
    elif not isinstance(policy, Policy):
        raise TypeError(f"task {name}: retryd_policy must be a retryd.Policy, "
                        f"got {type(policy).__name__}")
    for field, instead in _UNSUPPORTED.items():
        if getattr(policy, field) is not None:
            raise ValueError(f"task {name}: retryd.celery cannot honour Policy.{field} "
                             f"({instead})")
    if policy.jitter not in _native.JITTER:
        raise ValueError(f"task {name}: Policy.jitter must be one of {sorted(_native.JITTER)}, "
                         f"got {policy.jitter!r}")
    for field in ("base", "cap", "retry_after_jitter", "retry_after_max"):
        if getattr(policy, field) < 0:
            raise ValueError(f"task {name}: Policy.{field} must not be negative")
    if int(policy.max_attempts) < 1:
        raise ValueError(f"task {name}: Policy.max_attempts must be at least 1, "
                         f"got {policy.max_attempts}")
    dep = cls.retryd_dependency
    if dep is not None and not isinstance(dep, (str, Dependency)):
        raise TypeError(f"task {name}: retryd_dependency must be a retryd.Dependency or a name, "
                        f"got {type(dep).__name__}")
    if cls.retryd_client is not None and not isinstance(cls.retryd_client, Client):
        raise TypeError(f"task {name}: retryd_client must be a retryd.Client")
    if cls.__dict__.get("autoretry_for"):
        raise ValueError(f"task {name}: retryd.celery.Task retries by itself; remove "
                         f"autoretry_for (retryable errors are the policy's classification)")
    max_retries = int(policy.max_attempts) - 1
    if "max_retries" in cls.__dict__ and cls.__dict__["max_retries"] != max_retries:
        raise ValueError(f"task {name}: set max_attempts in retryd_policy, not max_retries")
    cls.max_retries = max_retries


_default_client = None
_default_lock = threading.Lock()


def _client():
    global _default_client
    if _default_client is None:
        with _default_lock:
            if _default_client is None:
                _default_client = Client()
    return _default_client


class Task(celery.Task):
    """A Celery task base class: each execution is admitted by the host and its retries are
    paid for by the host's retry budget (see the module's documentation).

    Set on the task (as options of @app.task, or on a subclass):
      retryd_dependency  the retryd.Dependency, or its name (required)
      retryd_policy      a retryd.Policy (default Policy(): 3 attempts, full jitter, 0.1 s
                         base, 10 s cap)
      retryd_client      the Client a name is resolved on (default: a retryd.Client() made
                         on first use)
    """

    retryd_dependency = None
    retryd_policy = None
    retryd_client = None
    max_retries = Policy().max_attempts - 1

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _check(cls)

    def _retryd_dependency(self):
        dep = self.retryd_dependency
        if isinstance(dep, Dependency):
            return dep
        if dep is None:
            raise ValueError(f"task {self.name}: retryd_dependency is not set")
        resolved = self.__dict__.get("_retryd_resolved")
        if resolved is None:
            resolved = (self.retryd_client or _client()).dependency(dep)
            self._retryd_resolved = resolved
        return resolved

    def __call__(self, *args, **kwargs):
        request = self.request
        attempt = int(request.retries or 0)
        dep = self._retryd_dependency()
        policy = self.retryd_policy or Policy()
        try:
            permit = dep.admit(attempt)
        except Rejected as e:
            raise TaskRejected(e.reason, dep.name, attempt) from None
        # In a worker the tracer has pushed the task's request (its retries, its id): the body
        # runs under it. Celery's own __call__ would push a bare one; a direct call needs it.
        body = super().__call__ if request.called_directly else self.run
        try:
            value = body(*args, **kwargs)
        except (celery_exceptions.Retry, celery_exceptions.Ignore, celery_exceptions.Reject):
            permit.complete("ignored")
            raise
        except Exception as exc:  # noqa: BLE001 - classified below; every path re-raises
            try:
                mapped = policy.classify_exception(exc)
            except BaseException:  # noqa: B902 - the policy's own bug ends the task
                permit.complete("failure")
                raise
            if mapped is None:
                permit.complete("failure")
                raise
            if not isinstance(mapped, AttemptResult):
                mapped = AttemptResult(error=mapped)
            self._retryd_settle(permit, policy, attempt, mapped, exc)
            raise
        except BaseException:  # noqa: B902 - SystemExit, a worker's shutdown: not sent back
            permit.complete("failure")
            raise
        try:
            result = policy.inspect(value)
        except BaseException:  # noqa: B902
            permit.complete("failure")
            raise
        self._retryd_settle(permit, policy, attempt, result, None)
        return result.value

    def _retryd_settle(self, permit, policy, attempt, result, exc):
        """Reports the attempt, and retries the task when the policy and the host allow: raises
        Celery's Retry, or returns (the caller then raises `exc` or returns the value)."""
        try:
            attempt_class, breaker = _classify(policy, result)
        except BaseException:  # noqa: B902
            permit.complete("failure")
            raise
        permit.complete(OUTCOME_NAMES[breaker])
        if attempt_class != CLASSES["retryable"] or self.request.called_directly:
            return
        if attempt + 1 >= int(policy.max_attempts):
            return
        retry_after, too_long = _retry_after_ns(policy, result)
        if too_long:
            return
        wait, backoff = _next_wait_ns(policy, attempt, _previous_backoff(self.request),
                                     retry_after)
        headers = dict(self.request.headers or {})
        headers[BACKOFF_HEADER] = backoff
        # The Retry goes from the pool process to the worker's main process pickled: an
        # exception that does not pickle (urllib's HTTPError holds its response) is wrapped.
        raise self.retry(exc=None if exc is None else get_pickleable_exception(exc),
                         countdown=wait / 1e9, headers=headers)


def _previous_backoff(request):
    """The backoff before this execution, from its message (0 for a first attempt, or a value
    that is not a count of nanoseconds)."""
    value = getattr(request, BACKOFF_HEADER, None)
    if value is None:
        value = (request.headers or {}).get(BACKOFF_HEADER)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return 0
