"""The retry loop for asyncio: dep.call_async, over the C ABI's loop in steps (retryd_steps_*).

The library admits each attempt, classifies its result, reports it to the host and chooses the
wait; this module awaits the attempt and the wait, so the event loop never blocks: admission and
completion are a few atomic instructions, the waits are asyncio.sleep.
"""

import asyncio
import ctypes
import threading

from . import _native
from ._policy import ERROR_KINDS, Attempt, AttemptResult, _current_async

STEP_STOP = 0
STEP_ATTEMPT = 1
STEP_WAIT = 2


class Step(ctypes.Structure):
    _fields_ = [
        ("attempt", ctypes.c_uint32),
        ("probe", ctypes.c_int),
        ("remaining_ms", ctypes.c_int64),
        ("wait_ns", ctypes.c_int64),
        ("has_record", ctypes.c_int),
        ("record", _native.AttemptInfo),
    ]


_declared = None
_declare_lock = threading.Lock()


def steps_lib():
    """The library with the loop's steps declared (once)."""
    global _declared
    if _declared is not None:
        return _declared
    with _declare_lock:
        lib = _native.lib()
        c_steps = ctypes.c_void_p
        sigs = {
            "retryd_attempt_result_init": (None, [ctypes.POINTER(_native.AttemptOut)]),
            "retryd_steps_begin": (ctypes.c_int, [
                ctypes.c_void_p, ctypes.c_int32, ctypes.POINTER(_native.CallPolicy),
                ctypes.POINTER(_native.CallEnv), ctypes.POINTER(c_steps)]),
            "retryd_steps_admit": (ctypes.c_int, [c_steps, ctypes.POINTER(Step)]),
            "retryd_steps_report": (ctypes.c_int, [
                c_steps, ctypes.POINTER(_native.AttemptOut), ctypes.c_int, ctypes.POINTER(Step)]),
            "retryd_steps_cancel": (None, [c_steps, ctypes.c_int]),
            "retryd_steps_end": (None, [c_steps, ctypes.POINTER(_native.CallResult)]),
        }
        for name, (restype, argtypes) in sigs.items():
            fn = getattr(lib, name)
            fn.restype = restype
            fn.argtypes = argtypes
        _declared = lib
    return lib


def _classify(policy, fn_value, fn_exc, out, state, fill):
    """Fills `out` from the attempt's value or exception as dep.call does. Returns True to
    abort the call (an exception the policy does not map, or one raised while classifying)."""
    if fn_exc is not None:
        state.value, state.exc = None, fn_exc
        try:
            mapped = policy.classify_exception(fn_exc) if isinstance(fn_exc, Exception) else None
            if mapped is None:
                return True
            if isinstance(mapped, AttemptResult):
                state.value = mapped.value
                fill(out, mapped, state)
            else:
                out.error_kind = ERROR_KINDS[mapped] if isinstance(mapped, str) else int(mapped)
        except BaseException as inner:  # noqa: B902 - anything raised here ends the call
            state.exc = inner
            return True
        return False
    try:
        res = policy.inspect(fn_value)
        state.value, state.exc = res.value, None
        fill(out, res, state)
    except BaseException as e:  # noqa: B902
        state.value, state.exc = fn_value, e
        return True
    return False


async def call_async(dep, fn, policy, native_policy, env, hooks):
    """Runs one call in steps; returns (rc, the C result, the call's state). `hooks` holds
    what dep.call shares with this loop: policy, watched, fill (an AttemptResult into the C
    struct), observe (a record for the subscribers and the observer), new_state."""
    lib = steps_lib()
    client = dep._client
    c_env = None
    if env is not None and (env.now_ns or env.random or env.wall_time):
        c_env = _native.CallEnv()
        if env.now_ns is not None:
            c_env.now_ns = _native.NOW_FN(lambda _ctx: int(env.now_ns()))
        if env.random is not None:
            c_env.random = _native.RANDOM_FN(lambda _ctx: int(env.random()) & (2**64 - 1))
        if env.wall_time is not None:
            c_env.wall_now_ms = _native.NOW_FN(lambda _ctx: int(env.wall_time() * 1000))
    sleep = env.sleep if env is not None and env.sleep is not None else asyncio.sleep
    handle = ctypes.c_void_p()
    rc = lib.retryd_steps_begin(client._checked(), dep._id, ctypes.byref(native_policy),
                                ctypes.byref(c_env) if c_env is not None else None,
                                ctypes.byref(handle))
    if rc != _native.OK:
        return rc, None, None
    steps = handle.value
    step = Step()
    state = hooks.new_state()
    c_result = _native.CallResult()
    try:
        while True:
            if lib.retryd_steps_admit(steps, ctypes.byref(step)) != STEP_ATTEMPT:
                if step.has_record:
                    hooks.observe(step.record, state)
                break
            if hooks.watched:
                try:
                    dep._observe_state()  # admitted just now: a probe's half-open shows here
                except BaseException as e:  # noqa: B902 - a subscriber's: it ends the call
                    lib.retryd_steps_cancel(steps, _native.IGNORED)
                    state.late_exc = e
                    break
            remaining = step.remaining_ms
            attempt = Attempt(step.attempt,
                              None if remaining == _native.NO_TIMEOUT else remaining / 1000.0)
            token = _current_async.set(attempt)
            value = exc = None
            try:
                value = await fn(attempt)
            except asyncio.CancelledError:
                # The caller gave up; that says nothing about the dependency.
                lib.retryd_steps_cancel(steps, _native.IGNORED)
                raise
            except BaseException as e:  # noqa: B902 - classified, or it ends the call
                exc = e
            finally:
                _current_async.reset(token)
            out = _native.AttemptOut()
            lib.retryd_attempt_result_init(ctypes.byref(out))
            abort = _classify(hooks.policy, value, exc, out, state, hooks.fill)
            next_step = lib.retryd_steps_report(steps, ctypes.byref(out), int(abort),
                                                ctypes.byref(step))
            state.keep.clear()
            hooks.observe(step.record, state)
            if next_step != STEP_WAIT:
                break
            try:
                slept = sleep(step.wait_ns / 1e9)
                if asyncio.iscoroutine(slept) or isinstance(slept, asyncio.Future):
                    slept = await slept
            except asyncio.CancelledError:
                lib.retryd_steps_cancel(steps, _native.IGNORED)
                raise
            except BaseException as e:  # noqa: B902 - ends the call, then propagates
                lib.retryd_steps_cancel(steps, _native.IGNORED)
                if state.late_exc is None:
                    state.late_exc = e
                break
            if slept is False:
                lib.retryd_steps_cancel(steps, _native.IGNORED)
                break
    finally:
        lib.retryd_steps_end(steps, ctypes.byref(c_result))
    return _native.OK, c_result, state
