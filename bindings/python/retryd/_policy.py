"""The retry policy of dep.call / @dep.retry, and how Python results and exceptions map onto
the classification inputs of the C library (method, status, transport error kind)."""

import collections
import contextvars
import ctypes
import dataclasses
import socket
import ssl
import threading
import typing
import urllib.error

from . import _native

ERROR_KINDS = {
    "none": _native.ERROR_NONE,
    "dns": _native.ERROR_DNS,
    "connect_refused": _native.ERROR_CONNECT_REFUSED,
    "connection_reset": _native.ERROR_CONNECTION_RESET,
    "tls": _native.ERROR_TLS,
    "timeout": _native.ERROR_TIMEOUT,
    "other": _native.ERROR_OTHER,
}
ERROR_NAMES = {v: k for k, v in ERROR_KINDS.items()}
CLASSES = {"success": 0, "retryable": 1, "terminal": 2}
CLASS_NAMES = {v: k for k, v in CLASSES.items()}
OUTCOMES = {"success": 0, "failure": 1, "ignored": 2}
OUTCOME_NAMES = {v: k for k, v in OUTCOMES.items()}


@dataclasses.dataclass
class AttemptResult:
    """What one attempt reports, when a plain return value does not say it.

    Return one from the attempt function (or from Policy.inspect) to give the status, the
    transport error, the server's Retry-After and Date headers, or a classification of your own;
    `value` is what dep.call returns on success.
    """
    value: typing.Any = None
    status: int = 0                      # HTTP status; 0 when no response arrived
    error: typing.Union[str, int] = "none"  # a transport error kind (see ERROR_KINDS)
    retry_after: typing.Union[None, str, float] = None  # header text, or seconds
    date: typing.Optional[str] = None    # the response's Date header
    attempt_class: typing.Optional[str] = None  # "success", "retryable", "terminal": overrides
    breaker: typing.Optional[str] = None        # with attempt_class: "success", "failure", "ignored"


def _header(headers, name):
    if headers is None:
        return None
    get = getattr(headers, "get", None)
    if get is None:
        return None
    value = get(name)
    return None if value is None else str(value)


def default_inspect(value):
    """Maps an attempt's return value to an AttemptResult.

    An AttemptResult is taken as is. An object with an integer `status_code`, `status` or
    `code` attribute (requests, urllib3, http.client, urllib responses) is an HTTP response;
    its `headers` give Retry-After and Date. Anything else is a success.
    """
    if isinstance(value, AttemptResult):
        return value
    for attr in ("status_code", "status", "code"):
        status = getattr(value, attr, None)
        if isinstance(status, int) and not isinstance(status, bool):
            headers = getattr(value, "headers", None)
            return AttemptResult(value=value, status=status,
                                 retry_after=_header(headers, "Retry-After"),
                                 date=_header(headers, "Date"))
    return AttemptResult(value=value, attempt_class="success", breaker="success")


def _mro_names(exc):
    return {cls.__name__ for cls in type(exc).__mro__}


# How many exceptions one classification looks at: a cause chain can be long, or loop.
_CHAIN_LIMIT = 64


def _carried(exc):
    """The exceptions `exc` carries, the nearest first: the one it was raised from, the
    underlying error the HTTP clients keep in an attribute or an argument (urllib's
    URLError.reason, urllib3's MaxRetryError.reason and ProxyError.original_error, the urllib3
    error a requests exception wraps in args[0], the OSError httpcore's errors wrap), then the
    one being handled when it was raised, unless `raise ... from` suppressed that (urllib3 1.26
    raises NewConnectionError inside `except socket.error`, so the refusal is only there)."""
    carried = [exc.__cause__, getattr(exc, "reason", None), getattr(exc, "original_error", None)]
    carried.extend(exc.args)
    if not exc.__suppress_context__:
        carried.append(exc.__context__)
    return [e for e in carried if isinstance(e, BaseException)]


def _own_kind(exc):
    """The transport error kind `exc`'s own type names, and whether it decides the
    classification. A socket-level error does, and so does a timeout: the request may have been
    sent, and a refusal behind it (one being handled when it was raised) must not make it look
    unsent. A client's generic connection error or an OSError ("other") does not: what it
    carries may say more."""
    if isinstance(exc, socket.gaierror):
        return "dns", True
    if isinstance(exc, ConnectionRefusedError):
        return "connect_refused", True
    if isinstance(exc, (ConnectionResetError, ConnectionAbortedError, BrokenPipeError)):
        return "connection_reset", True
    if isinstance(exc, ssl.SSLError):
        return "tls", True
    # Not "...TimeoutError" by name: urllib3's NewConnectionError, a refusal or a failed lookup,
    # is a ConnectTimeoutError.
    names = _mro_names(exc)
    if isinstance(exc, TimeoutError) or any(n.endswith("Timeout") for n in names):
        return "timeout", True
    if "ConnectionError" in names or isinstance(exc, OSError):
        return "other", False
    return None, False


def default_classify_exception(exc):
    """Maps an exception raised by an attempt to a transport error kind, an AttemptResult, or
    None.

    socket.gaierror is "dns", ConnectionRefusedError "connect_refused", a reset, abort or
    broken pipe "connection_reset", ssl.SSLError "tls", TimeoutError (and any exception class
    called ...Timeout, as in requests and httpx) "timeout", urllib's HTTPError a response with
    its status, any other OSError (or exception class called ConnectionError) "other". The
    exception's cause chain is followed, nearest first (__cause__, __context__, URLError.reason,
    urllib3's MaxRetryError.reason, the error a requests or httpcore exception wraps): the first
    exception there that is one of the specific kinds or a timeout decides, so a refusal raised
    through urllib, requests, urllib3 or httpx is "connect_refused" alike, and a client's
    generic connection error is "other" only when nothing behind it says more. A refusal found
    behind a timeout does not make the timeout safe to repeat. None (anything else, a bug in the
    attempt function say) ends the call at once: the attempt counts as a failure and the
    exception propagates.
    """
    if isinstance(exc, urllib.error.HTTPError):
        return AttemptResult(value=exc, status=exc.code,
                             retry_after=_header(exc.headers, "Retry-After"),
                             date=_header(exc.headers, "Date"))
    # Breadth first, so what the exception was raised from comes before what was being handled
    # further back (an earlier, unrelated failure the attempt function had caught).
    fallback = None
    queue, seen = collections.deque([exc]), {id(exc)}
    while queue:
        current = queue.popleft()
        kind, decides = _own_kind(current)
        if decides:
            return kind
        if fallback is None:
            fallback = kind
        for inner in _carried(current):
            if id(inner) not in seen and len(seen) < _CHAIN_LIMIT:
                seen.add(id(inner))
                queue.append(inner)
    return fallback


class Classifier:
    """A classification table of one's own: the library's defaults (classify.h), then
    overrides. Configure it before sharing it between threads."""

    def __init__(self):
        self._lib = _native.lib()
        self._handle = self._lib.retryd_classifier_new()
        if not self._handle:
            raise MemoryError("retryd_classifier_new")

    def _check(self, rc, what):
        if rc != 0:
            raise ValueError(f"{what}: invalid rule")
        return self

    def set_status(self, status, attempt_class, breaker, retry_unsafe=False):
        """Sets the rule for one HTTP status (100..599)."""
        return self._check(self._lib.retryd_classifier_set_status(
            self._handle, int(status), CLASSES[attempt_class], OUTCOMES[breaker],
            int(bool(retry_unsafe))), f"status {status}")

    def set_error(self, error, attempt_class, breaker, retry_unsafe=False):
        """Sets the rule for a transport error kind ("timeout", ...)."""
        return self._check(self._lib.retryd_classifier_set_error(
            self._handle, ERROR_KINDS[error], CLASSES[attempt_class], OUTCOMES[breaker],
            int(bool(retry_unsafe))), f"error {error}")

    def set_idempotent(self, method, idempotent=True):
        """Adds `method` to, or removes it from, the methods safe to repeat."""
        return self._check(self._lib.retryd_classifier_set_idempotent(
            self._handle, method.encode(), int(bool(idempotent))), f"method {method}")

    def __del__(self):
        handle, self._handle = getattr(self, "_handle", None), None
        if handle:
            self._lib.retryd_classifier_free(handle)


@dataclasses.dataclass
class Policy:
    """How dep.call retries. Times are in seconds. The defaults are the C library's.

    max_attempts: attempts per call, the first included.
    jitter, base, cap: exponential backoff, min(cap, base * 2**n), with "full", "equal",
        "decorrelated" or "none" jitter.
    retry_after_jitter: added to a server's Retry-After, so "Retry-After: 0" is no tight loop.
    retry_after_max: a longer Retry-After ends the call instead of retrying earlier than asked.
    deadline: total budget, waits included (None: none; a synchronous caller should set one).
    attempt_timeout: each attempt's own timeout, clamped to what is left of the deadline.
    expected_attempt: no attempt starts, and no wait is taken before one, with less time left
        (None: the slowest attempt of this call so far).
    method, idempotency_key: what classification needs: a "POST" without an idempotency key
        fails closed on an ambiguous error (a timeout) instead of risking a double effect.
    classifier: a Classifier with overrides of the default table.
    inspect: maps an attempt's return value to an AttemptResult (default_inspect).
    classify_exception: maps an attempt's exception (default_classify_exception).
    observer: called with an AttemptInfo after each admission (for logs and metrics); an
        exception it raises is raised again when the call returns.
    """
    max_attempts: int = 3
    jitter: str = "full"
    base: float = 0.1
    cap: float = 10.0
    retry_after_jitter: float = 0.1
    retry_after_max: float = 30.0
    deadline: typing.Optional[float] = None
    attempt_timeout: typing.Optional[float] = None
    expected_attempt: typing.Optional[float] = None
    method: str = "GET"
    idempotency_key: bool = False
    classifier: typing.Optional[Classifier] = None
    inspect: typing.Callable = default_inspect
    classify_exception: typing.Callable = default_classify_exception
    observer: typing.Optional[typing.Callable] = None

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)


def _ms(seconds):
    return int(round(seconds * 1000))


def to_native(policy):
    """Returns the C policy struct for `policy` (the method bytes are kept alive on it)."""
    if policy.jitter not in _native.JITTER:
        raise ValueError(f"jitter must be one of {sorted(_native.JITTER)}, got {policy.jitter!r}")
    c = _native.CallPolicy()
    _native.lib().retryd_call_policy_init(ctypes.byref(c))
    c.max_attempts = max(1, int(policy.max_attempts))
    c.jitter = _native.JITTER[policy.jitter]
    c.backoff_base_ms = _ms(policy.base)
    c.backoff_cap_ms = _ms(policy.cap)
    c.retry_after_jitter_max_ms = _ms(policy.retry_after_jitter)
    c.retry_after_max_ms = _ms(policy.retry_after_max)
    c.deadline_ms = -1 if policy.deadline is None else max(0, _ms(policy.deadline))
    c.attempt_timeout_ms = -1 if policy.attempt_timeout is None else max(1, _ms(policy.attempt_timeout))
    c.expected_attempt_ms = 0 if policy.expected_attempt is None else max(0, _ms(policy.expected_attempt))
    method = policy.method.encode()
    c.method = method
    c.has_idempotency_key = int(bool(policy.idempotency_key))
    c.classifier = policy.classifier._handle if policy.classifier is not None else None
    return c, method


@dataclasses.dataclass(frozen=True)
class Attempt:
    """What the attempt function is told: its number (0 for the first attempt) and the time it
    has, in seconds (None when unbounded). Pass `timeout` to the call, and `deadline_header`
    (the gRPC timeout format) downstream."""
    number: int
    timeout: typing.Optional[float]

    @property
    def deadline_header(self):
        if self.timeout is None:
            return None
        buf = ctypes.create_string_buffer(10)
        n = _native.lib().retryd_format_deadline_header(int(self.timeout * 1e9), buf, 10)
        return buf.value.decode() if n >= 0 else None


_current = threading.local()
# The Attempt running in this asyncio task inside dep.call_async.
_current_async = contextvars.ContextVar("retryd_current_attempt", default=None)


def current_attempt():
    """The Attempt running on this thread inside dep.call or a @dep.retry function, or in this
    asyncio task inside dep.call_async; else None."""
    attempt = getattr(_current, "attempt", None)
    return attempt if attempt is not None else _current_async.get()
