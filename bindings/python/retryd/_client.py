"""Client, Dependency and Permit over the C ABI, and the retry loop (dep.call, @dep.retry)."""

import collections.abc
import ctypes
import dataclasses
import os
import functools
import importlib
import importlib.util
import logging
import operator
import sys
import threading
import time
import types
import typing

from . import _async, _native
from ._policy import (
    CLASS_NAMES, CLASSES, ERROR_KINDS, ERROR_NAMES, OUTCOME_NAMES, OUTCOMES, Attempt,
    AttemptResult, Policy, _current, to_native)

_ADMISSIONS = {
    _native.ADMITTED: "admitted",
    _native.ADMITTED_PROBE: "admitted_probe",
    _native.REJECTED_OPEN: "open",
    _native.REJECTED_HALF_OPEN_BUSY: "half_open_busy",
    _native.REJECTED_BULKHEAD_FULL: "bulkhead_full",
    _native.REJECTED_BUDGET_EMPTY: "budget_empty",
}
_STATES = {
    _native.STATE_CLOSED: "closed",
    _native.STATE_OPEN: "open",
    _native.STATE_HALF_OPEN: "half_open",
}
_log = logging.getLogger("retryd")
_STOPS = {
    0: "retry", 1: "success", 2: "terminal", 3: "attempts_exhausted", 4: "rejected",
    5: "deadline", 6: "retry_after_too_long", 7: "cancelled", 8: "aborted",
}


class Error(Exception):
    """Base class of the errors this package raises."""


class ClientError(Error):
    """A cold-path call failed (open, resolve): `code` is the C library's RETRYD_E* value."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


class Rejected(Error):
    """The host refused the attempt: serve a fallback.

    `reason` is "open" (breaker open or forced open), "half_open_busy" (the half-open probe is
    out), "bulkhead_full" or "budget_empty" (a retry, and the host's retry budget is spent).
    From dep.call, `result` is the CallResult (attempts made before the refusal, the last
    value); from dep.admit it is None.
    """

    def __init__(self, reason, dependency=None, result=None):
        super().__init__(f"{dependency}: rejected: {reason}" if dependency else f"rejected: {reason}")
        self.reason = reason
        self.dependency = dependency
        self.result = result


class CallFailed(Error):
    """dep.call gave up: `result.stop` says why ("terminal", "attempts_exhausted",
    "deadline", "retry_after_too_long", "cancelled"), `result.value` is the last attempt's
    return value (a 4xx response, say), and the last attempt's exception is the __cause__."""

    def __init__(self, dependency, result):
        super().__init__(
            f"{dependency}: gave up ({result.stop}) after {result.attempts} attempt(s), "
            f"last status {result.last_status}, last error {result.last_error}")
        self.dependency = dependency
        self.result = result


@dataclasses.dataclass(frozen=True)
class AttemptInfo:
    """What the observer sees after each admission. Times in seconds."""
    attempt: int
    decision: str         # "admitted", "admitted_probe", or the rejection reason
    attempt_class: str    # "success", "retryable", "terminal"
    breaker: str          # the outcome reported: "success", "failure", "ignored"
    status: int
    error: str
    latency: float
    retry_after: typing.Optional[float]  # the server's wait, if it sent one
    wait: float           # the wait chosen before the next attempt
    next: str             # "retry", or why the call ends


@dataclasses.dataclass(frozen=True)
class CallResult:
    """How a call ended. Times in seconds."""
    stop: str
    final_class: str
    attempts: int
    last_status: int
    last_error: str
    rejection: typing.Optional[str]
    elapsed: float
    value: typing.Any = None
    exception: typing.Optional[BaseException] = None


@dataclasses.dataclass
class Env:
    """The world a call runs in, for tests: `now_ns()` a monotonic clock, `sleep(seconds)`
    (returning False cancels the call), `random()` a uniform 64-bit int, `wall_time()` Unix
    seconds for an HTTP-date Retry-After. None: the real thing (sleep is time.sleep, so a
    signal interrupts it and gevent's patching applies)."""
    now_ns: typing.Optional[typing.Callable[[], int]] = None
    sleep: typing.Optional[typing.Callable[[float], typing.Any]] = None
    random: typing.Optional[typing.Callable[[], int]] = None
    wall_time: typing.Optional[typing.Callable[[], float]] = None


class Client:
    """A connection to the host's retryd segment.

    Client(segment=None, fallback_to_local=True, socket=None): `socket` is the daemon's Unix
    socket (its config's `socket`). With neither named, the client attaches through
    $RETRYD_SOCKET if set; else, with $RETRYD_SEGMENT unset, through /run/retryd/retryd.sock if
    it exists (the packaged daemon's); else it maps the segment $RETRYD_SEGMENT, or "retryd",
    by name. With no daemon answering (no segment by name) and `fallback_to_local`, the client
    runs on per-process state with the default policy (and says so once on stderr) and moves to
    the host's limits once the daemon answers; without it, ClientError is raised. A daemon that
    refuses this process raises ClientError (EPERM) with its reason either way.

    Thread-safe. Fork-safe: a child made by os.fork or multiprocessing's fork start method
    keeps using its parent's client, which registers the child as a process of its own on its
    first admission. close() must not race with calls in flight.
    """

    def __init__(self, segment=None, fallback_to_local=True, socket=None):
        self._lib = _native.lib()
        opts = _native.Options(segment.encode() if segment else None, int(bool(fallback_to_local)))
        handle = ctypes.c_void_p()
        if socket:
            rc = self._lib.retryd_open_socket(os.fsencode(socket), ctypes.byref(opts),
                                              ctypes.byref(handle))
        else:
            rc = self._lib.retryd_open(ctypes.byref(opts), ctypes.byref(handle))
        if rc != _native.OK:
            raise ClientError(rc, _native.last_error())
        if _speedups is not None:
            # The C Permit calls the library this package loaded: one lookup, one library.
            _speedups.bind(ctypes.cast(self._lib.retryd_admit, ctypes.c_void_p).value,
                           ctypes.cast(self._lib.retryd_complete, ctypes.c_void_p).value,
                           Error, Rejected, _ADMISSIONS, OUTCOMES)
        self._handle = handle.value
        self._deps = {}
        self._lock = threading.Lock()
        self._subscribers = ()  # replaced, never changed in place: read without the lock

    @property
    def local(self):
        """True while running on per-process state (no segment on the host)."""
        return bool(self._lib.retryd_is_local(self._checked()))

    def _checked(self):
        if self._handle is None:
            raise Error("retryd client is closed")
        return self._handle

    def dependency(self, name):
        """Returns the Dependency `name` (resolved once, then cached). Raises ClientError for a
        bad name (1..63 characters of A-Z a-z 0-9 _ . : -)."""
        with self._lock:
            dep = self._deps.get(name)
            if dep is None:
                out = ctypes.c_int32()
                rc = self._lib.retryd_resolve(self._checked(), name.encode(), ctypes.byref(out))
                if rc != _native.OK:
                    raise ClientError(rc, _native.last_error())
                dep = self._deps[name] = Dependency(self, name, out.value)
                if self._subscribers:
                    dep._watch(True)
            return dep

    def on_state_change(self, callback):
        """Calls callback(name, old, new) whenever this process sees the breaker of any of
        this client's dependencies (those resolved later included) change state, as
        Dependency.on_state_change does for one. Returns a Subscription."""
        return Subscription(self, callback)

    def _subscribe(self, owner, callback, add):
        with self._lock:
            subs = owner._subscribers
            if add:
                subs = subs + (callback,)
            elif callback in subs:
                i = subs.index(callback)
                subs = subs[:i] + subs[i + 1:]
            owner._subscribers = subs
            deps = [owner] if isinstance(owner, Dependency) else list(self._deps.values())
            for dep in deps:
                dep._watch(bool(dep._subscribers or self._subscribers))

    def close(self):
        """Unregisters this process and frees the client. Idempotent."""
        handle, self._handle = getattr(self, "_handle", None), None
        if handle:
            self._lib.retryd_close(handle)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        self.close()


class Permit:
    """An admitted attempt, from dep.admit(). Report how it ended exactly once: by leaving its
    `with` or `async with` block (success on a normal exit, failure on an exception) or by
    complete(). fail(), ignored() and succeed() choose the outcome reported at exit, whatever
    happens.

    This is the ctypes implementation. retryd._speedups has the same in C, and where it is
    built retryd.Permit and Dependency.admit are its (see _speedups_module below)."""

    __slots__ = ("_dep", "_raw", "_start", "_outcome", "_done", "_attempt")

    def __init__(self, dep, attempt=0):
        self._dep = dep
        self._raw = _native.Permit()
        self._outcome = None
        self._done = False
        self._attempt = _attempt_number(attempt)
        lib = dep._client._lib
        decision = lib.retryd_admit(dep._client._checked(), dep._id, self._attempt,
                                    ctypes.byref(self._raw))
        self._start = time.monotonic_ns()
        if dep._watched:
            try:
                dep._observe_state()
            except BaseException:  # noqa: B902 - a subscriber's KeyboardInterrupt, say
                # Nothing was sent: the admission is given back before the exception goes on.
                self._done = True
                lib.retryd_complete(dep._client._handle, ctypes.byref(self._raw), _native.IGNORED, 0)
                raise
        if decision not in (_native.ADMITTED, _native.ADMITTED_PROBE):
            self._done = True
            # The contract: every admission is completed (for a refusal, a no-op).
            lib.retryd_complete(dep._client._handle, ctypes.byref(self._raw), _native.IGNORED, 0)
            if decision < 0:
                raise Error(f"{dep.name}: invalid dependency handle")
            raise Rejected(_ADMISSIONS.get(decision, str(decision)), dep.name)

    @property
    def attempt(self):
        """The attempt's number (0: first attempt, 1: first retry...)."""
        return self._attempt

    @property
    def probe(self):
        """True if this attempt is the breaker's half-open probe."""
        return self._raw.decision == _native.ADMITTED_PROBE

    def fail(self):
        """Report a failure (counts toward the breaker) at exit."""
        self._outcome = _native.FAILURE

    def ignored(self):
        """Report the attempt as ignored at exit: the caller's fault (a 4xx), not the
        dependency's; the breaker does not see it."""
        self._outcome = _native.IGNORED

    def succeed(self):
        """Report a success at exit, even if the block raises."""
        self._outcome = _native.SUCCESS

    def complete(self, outcome=None):
        """Reports the outcome ("success", "failure", "ignored", or the one chosen by fail(),
        ignored(), succeed(); default success) now. A second call is a no-op."""
        if self._done:
            return
        if outcome is None:
            outcome = self._outcome if self._outcome is not None else _native.SUCCESS
        else:
            outcome = _outcome_number(outcome)  # a bad one raises with the permit still open
        self._done = True
        latency = max(0, time.monotonic_ns() - self._start)
        client = self._dep._client
        client._lib.retryd_complete(client._checked(), ctypes.byref(self._raw), outcome, latency)
        if self._dep._watched:
            self._dep._observe_state()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if self._outcome is not None:
            self.complete(self._outcome)
        else:
            self.complete(_native.FAILURE if exc_type is not None else _native.SUCCESS)
        return False

    # admit and complete never block: `async with` is `with`, awaited.
    async def __aenter__(self):
        return self

    async def __aexit__(self, exc_type, exc, tb):
        return self.__exit__(exc_type, exc, tb)


def _attempt_number(attempt):
    try:
        number = operator.index(attempt)
    except TypeError:
        raise TypeError(f"attempt must be an int, not {attempt!r}") from None
    if not 0 <= number <= 0xFFFFFFFF:
        raise ValueError(f"attempt must be from 0 to 4294967295, not {attempt!r}")
    return number


def _outcome_number(outcome):
    if isinstance(outcome, str):
        if outcome not in OUTCOMES:
            raise ValueError(
                f'outcome must be "success", "failure" or "ignored", not {outcome!r}')
        return OUTCOMES[outcome]
    if not isinstance(outcome, int):
        raise TypeError(f"outcome must be a str or an int, not {outcome!r}")
    if outcome not in OUTCOME_NAMES:
        raise ValueError(
            f"outcome must be 0 (success), 1 (failure) or 2 (ignored), not {outcome!r}")
    return outcome


def _speedups_module():
    """retryd._speedups, the Permit in C, or None: the ctypes Permit above serves instead.

    RETRYD_PYTHON_PURE=1 chooses the ctypes one (tests run both). The module is looked up in
    the package (an installed or in-place build), else at the path in RETRYD_PYTHON_EXTENSION
    (a build tree's, as the test suite's); a module named there that does not load is an
    error, one that is simply not built is not.
    """
    pure = os.environ.get("RETRYD_PYTHON_PURE", "")
    if pure not in ("", "0", "1"):
        raise ImportError(f"RETRYD_PYTHON_PURE must be 0 or 1, not {pure!r}")
    if pure == "1":
        return None
    name = __package__ + "._speedups"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != name:
            raise
    path = os.environ.get("RETRYD_PYTHON_EXTENSION")
    if not path:
        return None
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None:
        raise ImportError(f"RETRYD_PYTHON_EXTENSION={path}: not a Python extension module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
    return module


_speedups = _speedups_module()
_PythonPermit = Permit
if _speedups is not None:
    Permit = _speedups.Permit  # noqa: F811 - the same class, in C
    # What its __aenter__ and __aexit__ return: a coroutine to asyncio (create_task takes it).
    collections.abc.Coroutine.register(_speedups.Ready)


class Subscription:
    """A state-change subscription, from on_state_change. unsubscribe() ends it (a second
    call is a no-op); as a context manager it ends at exit."""

    __slots__ = ("_owner", "_client", "callback", "_active")

    def __init__(self, owner, callback):
        if not callable(callback):
            raise TypeError("on_state_change: the callback must be callable")
        self._owner = owner
        self._client = owner if isinstance(owner, Client) else owner._client
        self.callback = callback
        self._active = True
        self._client._subscribe(owner, callback, True)

    def unsubscribe(self):
        if self._active:
            self._active = False
            self._client._subscribe(self._owner, self.callback, False)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.unsubscribe()
        return False


class _CallState:
    __slots__ = ("value", "exc", "keep", "late_exc")

    def __init__(self):
        self.value = None
        self.exc = None
        self.keep = []
        self.late_exc = None  # from the observer or the sleep: raised after the loop


def _fill(out, res, state):
    out.status = int(res.status or 0)
    out.error_kind = ERROR_KINDS[res.error] if isinstance(res.error, str) else int(res.error)
    ra = res.retry_after
    if isinstance(ra, (int, float)) and not isinstance(ra, bool):
        out.retry_after_ms = max(0, int(ra * 1000))
    elif ra is not None:
        text = str(ra).encode("latin-1", "replace")
        state.keep.append(text)
        out.retry_after = text
    if res.date is not None:
        text = str(res.date).encode("latin-1", "replace")
        state.keep.append(text)
        out.date = text
    if res.attempt_class is not None:
        out.attempt_class = CLASSES[res.attempt_class]
        breaker = res.breaker or ("success" if res.attempt_class == "success" else "failure")
        out.breaker_outcome = OUTCOMES[breaker]


class Dependency:
    """A downstream dependency, from client.dependency(name). Thread-safe."""

    def __init__(self, client, name, handle):
        self._client = client
        self._id = handle
        self.name = name
        # State-change subscriptions: while _watched is False (no subscriber here or on the
        # client), admissions and completions never read the breaker's state.
        self._subscribers = ()
        self._watched = False
        self._last_state = None  # the last state this process saw, while watched
        self._state_lock = threading.Lock()

    def __repr__(self):
        return f"<retryd.Dependency {self.name!r}>"

    @property
    def state(self):
        """The breaker's state as this process sees it now: "closed", "open" or "half_open"
        (a breaker whose open period has ended reads "open" until the next admission)."""
        client = self._client
        state = client._lib.retryd_breaker_state(client._checked(), self._id)
        if state < 0:
            raise Error(f"{self.name}: {_native.last_error()}")
        return _STATES.get(state, str(state))

    def on_state_change(self, callback):
        """Calls callback(name, old, new) whenever this process sees this dependency's
        breaker change state ("closed", "open", "half_open"): after each of its admissions and
        completions (dep.admit, dep.call and the adapters) the state is read and compared with
        the last one seen. Changes made by other processes are seen at this process's next
        call; a change and its reversal between two calls are not seen. The callback runs on
        the calling thread, inside the call; an exception it raises is logged (logger
        "retryd") and the call goes on. Returns a Subscription: its unsubscribe() stops the
        calls, and with no subscriber left the state is not read at all. Thread-safe."""
        return Subscription(self, callback)

    def _watch(self, on):
        # Called under the client's lock. Starting to watch reads the state to compare with.
        if on and not self._watched:
            with self._state_lock:
                self._last_state = self._read_state()
        elif not on:
            self._last_state = None
        self._watched = on

    def _read_state(self):
        client = self._client
        if client._handle is None:
            return None
        state = client._lib.retryd_breaker_state(client._handle, self._id)
        return state if state >= 0 else None

    def _observe_state(self):
        state = self._read_state()
        if state is None:
            return
        with self._state_lock:
            old = self._last_state
            if old == state:
                return
            self._last_state = state
        if old is None:
            return
        old_name, new_name = _STATES.get(old, str(old)), _STATES.get(state, str(state))
        for callback in self._subscribers + self._client._subscribers:
            if callback not in self._subscribers and callback not in self._client._subscribers:
                continue  # unsubscribed by a subscriber called before it for this change
            try:
                callback(self.name, old_name, new_name)
            except Exception:  # noqa: BLE001 - a subscriber's bug must not fail the call
                _log.exception("retryd: state-change subscriber %r of %r raised", callback,
                               self.name)

    def admit(self, attempt=0):
        """Asks whether attempt number `attempt` (0: first attempt, 1: first retry...) may go
        out now. Returns a Permit (a context manager) or raises Rejected with the reason."""
        return Permit(self, attempt)

    if _speedups is not None:
        admit = _speedups.admit_method(admit)  # the same, in C

    def call(self, fn, policy=None, *, env=None, **overrides):
        """Calls fn(attempt) under the retry policy and returns its value.

        Each attempt is admitted by the host, `fn` is called with an Attempt (its number and
        timeout), its return value or exception is classified (Policy.inspect,
        Policy.classify_exception) and reported, and the call is retried with backoff, jitter
        and the server's Retry-After while the policy, the retry budget and the deadline allow.
        `overrides` change fields of `policy` (default Policy()) for this call.

        Raises Rejected when an attempt is not admitted (serve a fallback), CallFailed when the
        call gives up, and an exception the policy does not map (a bug in fn, say) as is, after
        reporting that attempt as a failure and without retrying.
        """
        policy = policy or Policy()
        if overrides:
            policy = policy.replace(**overrides)
        lib = self._client._lib
        native_policy, _method = to_native(policy)
        state = _CallState()

        watched = self._watched

        def attempt_cb(_ctx, number, remaining_ms, out_ptr):
            if watched:
                try:
                    self._observe_state()  # admitted just now: a probe's half-open shows here
                except BaseException as e:  # noqa: B902 - a subscriber's: it ends the call
                    state.value, state.exc = None, e
                    return 1
            out = out_ptr.contents
            attempt = Attempt(number, None if remaining_ms == _native.NO_TIMEOUT else remaining_ms / 1000.0)
            previous = getattr(_current, "attempt", None)
            _current.attempt = attempt
            try:
                try:
                    value = fn(attempt)
                finally:
                    _current.attempt = previous
            except BaseException as e:  # noqa: B902 - every exception must stop at the C boundary
                state.value, state.exc = None, e
                try:
                    mapped = policy.classify_exception(e) if isinstance(e, Exception) else None
                    if mapped is None:
                        return 1
                    if isinstance(mapped, AttemptResult):
                        state.value = mapped.value
                        _fill(out, mapped, state)
                    else:
                        out.error_kind = ERROR_KINDS[mapped] if isinstance(mapped, str) else int(mapped)
                except BaseException as inner:  # noqa: B902
                    state.exc = inner
                    return 1
                return 0
            try:
                res = policy.inspect(value)
                state.value, state.exc = res.value, None
                _fill(out, res, state)
            except BaseException as e:  # noqa: B902
                state.value, state.exc = value, e
                return 1
            return 0

        def observer_cb(_ctx, info_ptr):
            self._observe_record(policy, watched, info_ptr.contents, state)

        env = env or Env()
        sleep = env.sleep or time.sleep

        def sleep_cb(_ctx, ns):
            try:
                return 1 if sleep(ns / 1e9) is False else 0
            except BaseException as e:  # noqa: B902 - KeyboardInterrupt ends the call, then propagates
                if state.late_exc is None:
                    state.late_exc = e
                return 1

        c_env = _native.CallEnv()
        c_env.sleep_ns = _native.SLEEP_FN(sleep_cb)
        if env.now_ns is not None:
            c_env.now_ns = _native.NOW_FN(lambda _ctx: int(env.now_ns()))
        if env.random is not None:
            c_env.random = _native.RANDOM_FN(lambda _ctx: int(env.random()) & (2**64 - 1))
        if env.wall_time is not None:
            c_env.wall_now_ms = _native.NOW_FN(lambda _ctx: int(env.wall_time() * 1000))
        c_attempt = _native.ATTEMPT_FN(attempt_cb)
        c_observer = (_native.OBSERVER_FN(observer_cb) if policy.observer or watched
                      else _native.OBSERVER_FN())
        c_result = _native.CallResult()
        rc = lib.retryd_call(self._client._checked(), self._id, ctypes.byref(native_policy),
                             c_attempt, None, c_observer, None, ctypes.byref(c_env),
                             ctypes.byref(c_result))
        if watched:
            self._observe_state()
        return self._conclude(rc, c_result, state)

    def _observe_record(self, policy, watched, record, state):
        """After each admission: the state-change subscribers and the policy's observer see
        it; what they raise is raised once the call has ended."""
        if watched:
            try:
                self._observe_state()
            except BaseException as e:  # noqa: B902 - raised once the call has ended
                if state.late_exc is None:
                    state.late_exc = e
        if not policy.observer:
            return
        try:
            policy.observer(AttemptInfo(
                attempt=record.attempt,
                decision=_ADMISSIONS.get(record.decision, str(record.decision)),
                attempt_class=CLASS_NAMES.get(record.attempt_class, str(record.attempt_class)),
                breaker=OUTCOME_NAMES.get(record.breaker_outcome, str(record.breaker_outcome)),
                status=record.status,
                error=ERROR_NAMES.get(record.error_kind, str(record.error_kind)),
                latency=record.latency_ns / 1e9,
                retry_after=None if record.retry_after_ns < 0 else record.retry_after_ns / 1e9,
                wait=record.wait_ns / 1e9,
                next=_STOPS.get(record.next, str(record.next))))
        except BaseException as e:  # noqa: B902
            if state.late_exc is None:
                state.late_exc = e

    def _conclude(self, rc, c_result, state):
        """Returns the call's value, or raises as dep.call documents."""
        if rc != _native.OK:
            lib = self._client._lib
            raise Error(f"{self.name}: the retry loop failed: "
                        f"{lib.retryd_strerror(rc).decode()} (check the policy)")
        result = CallResult(
            stop=_STOPS.get(c_result.stop, str(c_result.stop)),
            final_class=CLASS_NAMES.get(c_result.final_class, str(c_result.final_class)),
            attempts=c_result.attempts,
            last_status=c_result.last_status,
            last_error=ERROR_NAMES.get(c_result.last_error_kind, str(c_result.last_error_kind)),
            rejection=None if c_result.stop != _native.STOP_REJECTED
            else _ADMISSIONS.get(c_result.rejection, str(c_result.rejection)),
            elapsed=c_result.elapsed_ns / 1e9,
            value=state.value,
            exception=state.exc)
        if state.late_exc is not None:
            raise state.late_exc
        if c_result.stop == _native.STOP_SUCCESS:
            return state.value
        if c_result.stop == _native.STOP_ABORTED and state.exc is not None:
            raise state.exc
        if c_result.stop == _native.STOP_REJECTED:
            raise Rejected(result.rejection, self.name, result) from state.exc
        raise CallFailed(self.name, result) from state.exc

    async def call_async(self, fn, policy=None, *, env=None, **overrides):
        """The retry loop for asyncio: as dep.call, with `fn` a coroutine function
        (`await fn(attempt)`), the waits awaited (asyncio.sleep; never a blocking sleep) and
        the same results and exceptions. Admission and completion never block.

        Cancelling the task ends the call: an attempt in flight is reported as ignored (the
        caller gave up; that says nothing about the dependency: a half-open probe goes back
        unjudged), and asyncio.CancelledError propagates. `env.sleep`, if given, may be a
        coroutine function; returning False cancels the call (stop "cancelled"). Inside `fn`,
        retryd.current_attempt() is this task's attempt.

            order = await orders.call_async(
                lambda attempt: http.get(url, timeout=attempt.timeout),
                retryd.Policy(max_attempts=3, deadline=2.0))
        """
        policy = policy or Policy()
        if overrides:
            policy = policy.replace(**overrides)
        native_policy, _method = to_native(policy)
        watched = self._watched
        hooks = types.SimpleNamespace(
            policy=policy, watched=watched, fill=_fill, new_state=_CallState,
            observe=lambda record, state: (self._observe_record(policy, watched, record, state)
                                           if watched or policy.observer else None))
        rc, c_result, state = await _async.call_async(self, fn, policy, native_policy, env,
                                                      hooks)
        if watched:
            self._observe_state()
        return self._conclude(rc, c_result, state)

    def retry(self, policy=None, *, env=None, **overrides):
        """A decorator: every call of the decorated function goes through dep.call with this
        policy. Inside it, retryd.current_attempt() gives the attempt's number and timeout.

            @orders.retry(max_attempts=3, deadline=2.0)
            def fetch(order_id):
                return session.get(url, timeout=retryd.current_attempt().timeout)
        """
        if callable(policy) and not isinstance(policy, Policy):
            return self.retry()(policy)  # used bare: @dep.retry
        fixed = (policy or Policy()).replace(**overrides) if overrides else (policy or Policy())

        def decorate(func):
            @functools.wraps(func)
            def wrapper(*args, **kwargs):
                return self.call(lambda _attempt: func(*args, **kwargs), fixed, env=env)
            return wrapper
        return decorate
