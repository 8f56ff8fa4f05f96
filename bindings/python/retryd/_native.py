"""Loading libretryd and declaring its C ABI (retryd.h, retryd_policy.h, retryd_call.h).

The library is looked up, on first use, in this order:
  1. the path in the RETRYD_LIBRARY environment variable;
  2. its soname, libretryd.so.0, through the dynamic loader (the library installed by the
     libretryd0 package, or on LD_LIBRARY_PATH);
  3. ctypes.util.find_library("retryd") (an installed libretryd.so);
  4. next to this package (libretryd.so copied into it), then the build directories of the
     source tree this package sits in (build*/client/libretryd.so).
Importing the package never fails for want of the library; the first call that needs it
raises LibraryNotFound.
"""

import ctypes
import ctypes.util
import os
import pathlib
import threading

# retryd.h
OK = 0
EINVAL = -1
ENOENT = -2
ADMITTED = 0
ADMITTED_PROBE = 1
REJECTED_OPEN = 2
REJECTED_HALF_OPEN_BUSY = 3
REJECTED_BULKHEAD_FULL = 4
REJECTED_BUDGET_EMPTY = 5
SUCCESS = 0
FAILURE = 1
IGNORED = 2
STATE_CLOSED = 0
STATE_OPEN = 1
STATE_HALF_OPEN = 2

# retryd_policy.h
ERROR_NONE = 0
ERROR_DNS = 1
ERROR_CONNECT_REFUSED = 2
ERROR_CONNECTION_RESET = 3
ERROR_TLS = 4
ERROR_TIMEOUT = 5
ERROR_OTHER = 6
ATTEMPT_SUCCESS = 0
ATTEMPT_RETRYABLE = 1
ATTEMPT_TERMINAL = 2
JITTER = {"none": 0, "full": 1, "equal": 2, "decorrelated": 3}

# retryd_call.h
STOP_SUCCESS = 1
STOP_REJECTED = 4
STOP_CANCELLED = 7
STOP_ABORTED = 8
NO_TIMEOUT = 2**63 - 1


class LibraryNotFound(ImportError):
    """libretryd.so could not be found or loaded."""


class Permit(ctypes.Structure):
    _fields_ = [
        ("decision", ctypes.c_int32),
        ("reserved", ctypes.c_uint32),
        ("opaque", ctypes.c_uint64 * 5),
    ]


class Options(ctypes.Structure):
    _fields_ = [("segment", ctypes.c_char_p), ("fallback_to_local", ctypes.c_int)]


class CallPolicy(ctypes.Structure):
    _fields_ = [
        ("max_attempts", ctypes.c_uint32),
        ("jitter", ctypes.c_int),
        ("backoff_base_ms", ctypes.c_int64),
        ("backoff_cap_ms", ctypes.c_int64),
        ("retry_after_jitter_max_ms", ctypes.c_int64),
        ("retry_after_max_ms", ctypes.c_int64),
        ("deadline_ms", ctypes.c_int64),
        ("attempt_timeout_ms", ctypes.c_int64),
        ("expected_attempt_ms", ctypes.c_int64),
        ("method", ctypes.c_char_p),
        ("has_idempotency_key", ctypes.c_int),
        ("classifier", ctypes.c_void_p),
    ]


class AttemptOut(ctypes.Structure):
    _fields_ = [
        ("status", ctypes.c_int),
        ("error_kind", ctypes.c_int),
        ("retry_after_ms", ctypes.c_int64),
        ("retry_after", ctypes.c_char_p),
        ("date", ctypes.c_char_p),
        ("attempt_class", ctypes.c_int),
        ("breaker_outcome", ctypes.c_int),
    ]


class AttemptInfo(ctypes.Structure):
    _fields_ = [
        ("attempt", ctypes.c_uint32),
        ("decision", ctypes.c_int),
        ("attempt_class", ctypes.c_int),
        ("breaker_outcome", ctypes.c_int),
        ("status", ctypes.c_int),
        ("error_kind", ctypes.c_int),
        ("latency_ns", ctypes.c_int64),
        ("retry_after_ns", ctypes.c_int64),
        ("wait_ns", ctypes.c_int64),
        ("next", ctypes.c_int),
    ]


NOW_FN = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p)
SLEEP_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int64)
RANDOM_FN = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_void_p)


class CallEnv(ctypes.Structure):
    _fields_ = [
        ("ctx", ctypes.c_void_p),
        ("now_ns", NOW_FN),
        ("sleep_ns", SLEEP_FN),
        ("random", RANDOM_FN),
        ("wall_now_ms", NOW_FN),
    ]


class CallResult(ctypes.Structure):
    _fields_ = [
        ("stop", ctypes.c_int),
        ("final_class", ctypes.c_int),
        ("attempts", ctypes.c_uint32),
        ("last_status", ctypes.c_int),
        ("last_error_kind", ctypes.c_int),
        ("rejection", ctypes.c_int),
        ("elapsed_ns", ctypes.c_int64),
    ]


ATTEMPT_FN = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int64, ctypes.POINTER(AttemptOut)
)
OBSERVER_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(AttemptInfo))

# The soname of the C ABI this module declares: client/CMakeLists.txt's SOVERSION.
SONAME = "libretryd.so.0"

_lock = threading.Lock()
_lib = None


def _candidates():
    env = os.environ.get("RETRYD_LIBRARY")
    if env:
        yield env
        return
    yield SONAME
    found = ctypes.util.find_library("retryd")
    if found:
        yield found
    here = pathlib.Path(__file__).resolve().parent
    yield str(here / "libretryd.so")
    root = here.parents[2]  # bindings/python/retryd -> the source tree
    for build in sorted(root.glob("build*/client/libretryd.so")):
        yield str(build)


def _declare(lib):
    c_client = ctypes.c_void_p
    sigs = {
        "retryd_open": (ctypes.c_int, [ctypes.POINTER(Options), ctypes.POINTER(c_client)]),
        "retryd_open_socket": (ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(Options),
                                              ctypes.POINTER(c_client)]),
        "retryd_close": (None, [c_client]),
        "retryd_resolve": (ctypes.c_int, [c_client, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int32)]),
        "retryd_admit": (ctypes.c_int, [c_client, ctypes.c_int32, ctypes.c_uint32, ctypes.POINTER(Permit)]),
        "retryd_complete": (None, [c_client, ctypes.POINTER(Permit), ctypes.c_int, ctypes.c_uint64]),
        "retryd_is_local": (ctypes.c_int, [c_client]),
        "retryd_breaker_state": (ctypes.c_int, [c_client, ctypes.c_int32]),
        "retryd_strerror": (ctypes.c_char_p, [ctypes.c_int]),
        "retryd_last_error": (ctypes.c_char_p, []),
        "retryd_classifier_new": (ctypes.c_void_p, []),
        "retryd_classifier_free": (None, [ctypes.c_void_p]),
        "retryd_classifier_set_status": (
            ctypes.c_int, [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]),
        "retryd_classifier_set_error": (
            ctypes.c_int, [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]),
        "retryd_classifier_set_idempotent": (
            ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]),
        "retryd_format_deadline_header": (
            ctypes.c_int, [ctypes.c_int64, ctypes.c_char_p, ctypes.c_size_t]),
        "retryd_call_policy_init": (None, [ctypes.POINTER(CallPolicy)]),
        "retryd_call": (ctypes.c_int, [
            c_client, ctypes.c_int32, ctypes.POINTER(CallPolicy), ATTEMPT_FN, ctypes.c_void_p,
            OBSERVER_FN, ctypes.c_void_p, ctypes.POINTER(CallEnv), ctypes.POINTER(CallResult)]),
        "retryd_stop_name": (ctypes.c_char_p, [ctypes.c_int]),
    }
    for name, (restype, argtypes) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes


def lib():
    """Returns the loaded library, loading it on first use. Thread-safe."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            errors = []
            for path in _candidates():
                try:
                    loaded = ctypes.CDLL(path)
                    _declare(loaded)
                except (OSError, AttributeError) as e:
                    errors.append(f"{path}: {e}")
                    continue
                _lib = loaded
                break
            else:
                raise LibraryNotFound(
                    "libretryd not found; set RETRYD_LIBRARY to its path"
                    + ("" if not errors else " (" + "; ".join(errors) + ")"))
    return _lib


def library_path():
    """The file the library was loaded from."""
    return lib()._name


def last_error():
    return (lib().retryd_last_error() or b"").decode("utf-8", "replace")
