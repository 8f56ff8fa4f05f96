"""The Permit's contract, whichever implementation serves it: the C one (retryd._speedups, where
it is built) or the ctypes one (RETRYD_PYTHON_PURE=1). ctest runs this file both ways
(python_tests and python_tests_pure), and RETRYD_TEST_PERMIT says which one it expects."""

import asyncio
import gc
import inspect
import os
import pathlib
import shutil
import subprocess
import sys
import threading
import time

import pytest

import retryd
from retryd import _client
from conftest import ROOT, dependency_status

# Trips only on purpose: the outcomes below are counted, not acted on.
CALM = {"min_calls": 1000}


def counters(seg, dep):
    return dependency_status(seg.name, dep)["counters"]


def test_the_expected_permit_serves():
    expected = os.environ.get("RETRYD_TEST_PERMIT")
    if expected is None:
        pytest.skip("RETRYD_TEST_PERMIT is not set (ctest sets it: c or ctypes)")
    assert expected in ("c", "ctypes")
    if expected == "c":
        assert _client._speedups is not None, "retryd._speedups was not found"
        assert retryd.Permit is _client._speedups.Permit
        assert type(retryd.Dependency.__dict__["admit"]) is _client._speedups.admit_method
    else:
        assert _client._speedups is None
        assert retryd.Permit is _client._PythonPermit
        assert inspect.isfunction(retryd.Dependency.__dict__["admit"])


def test_with_reports_success_failure_and_the_chosen_outcome(make_segment):
    seg = make_segment(orders=CALM)
    client = retryd.Client(segment=seg.name, fallback_to_local=False)
    orders = client.dependency("orders")
    with orders.admit() as permit:
        assert isinstance(permit, retryd.Permit)
        assert not permit.probe
        assert permit.attempt == 0
    with pytest.raises(ConnectionError):  # __exit__ returns False: the exception goes on
        with orders.admit():
            raise ConnectionError("down")
    with pytest.raises(ValueError):
        with orders.admit() as permit:
            permit.ignored()
            raise ValueError("a 4xx")
    with orders.admit() as permit:
        permit.fail()
    with pytest.raises(KeyError):
        with orders.admit() as permit:
            permit.succeed()
            raise KeyError("after the response")
    c = counters(seg, "orders")
    assert (c["successes"], c["failures"], c["ignored"]) == (2, 2, 1)
    client.close()


def test_async_with_is_with(make_segment):
    seg = make_segment(orders=CALM, closed={"mode": "forced-open"})
    client = retryd.Client(segment=seg.name, fallback_to_local=False)
    orders = client.dependency("orders")

    async def main():
        async with orders.admit() as permit:
            assert isinstance(permit, retryd.Permit)
        with pytest.raises(ConnectionError):
            async with orders.admit():
                raise ConnectionError("down")
        with pytest.raises(ValueError):
            async with orders.admit() as permit:
                permit.ignored()
                raise ValueError("a 4xx")
        async with orders.admit() as permit:
            permit.fail()
        with pytest.raises(KeyError):
            async with orders.admit() as permit:
                permit.succeed()
                raise KeyError("after the response")
        with pytest.raises(retryd.Rejected) as e:
            async with client.dependency("closed").admit():
                pass
        assert e.value.reason == "open"

    asyncio.run(main())
    c = counters(seg, "orders")
    assert (c["successes"], c["failures"], c["ignored"]) == (2, 2, 1)
    client.close()


def test_async_enter_and_exit_never_suspend(make_segment):
    seg = make_segment(orders=CALM)
    client = retryd.Client(segment=seg.name, fallback_to_local=False)
    permit = client.dependency("orders").admit()
    # Driven by hand, without an event loop: each await ends at its first step.
    with pytest.raises(StopIteration) as stop:
        next(permit.__aenter__().__await__())
    assert stop.value.value is permit
    with pytest.raises(StopIteration) as stop:
        next(permit.__aexit__(None, None, None).__await__())
    assert stop.value.value is False
    assert counters(seg, "orders")["successes"] == 1
    client.close()


def test_complete_reports_now_once_and_checks_the_outcome(make_segment):
    seg = make_segment(orders={"bulkhead_limit": 1, "min_calls": 1000})
    client = retryd.Client(segment=seg.name, fallback_to_local=False)
    orders = client.dependency("orders")
    permit = orders.admit()
    with pytest.raises(ValueError, match=r'outcome must be "success", "failure" or "ignored", '
                                         r"not 'bogus'"):
        permit.complete("bogus")
    with pytest.raises(ValueError, match=r"outcome must be 0 \(success\), 1 \(failure\) or 2 "
                                         r"\(ignored\), not 7"):
        permit.complete(7)
    with pytest.raises(TypeError, match=r"outcome must be a str or an int, not 1.5"):
        permit.complete(1.5)
    # A bad outcome left the permit open: it still holds the bulkhead.
    with pytest.raises(retryd.Rejected) as e:
        orders.admit()
    assert e.value.reason == "bulkhead_full"
    permit.complete(outcome="ignored")
    permit.complete("failure")  # a second call is a no-op
    with orders.admit() as permit:
        permit.complete(1)  # the outcome as retryd.h numbers it: failure
    c = counters(seg, "orders")
    assert (c["successes"], c["failures"], c["ignored"]) == (0, 1, 1)
    assert dependency_status(seg.name, "orders")["bulkhead"]["in_use"] == 0
    client.close()


def test_attempt_is_checked_and_read_only(make_segment):
    seg = make_segment(orders=CALM)
    client = retryd.Client(segment=seg.name, fallback_to_local=False)
    orders = client.dependency("orders")
    with pytest.raises(ValueError, match=r"attempt must be from 0 to 4294967295, not -1"):
        orders.admit(-1)
    with pytest.raises(ValueError, match=r"attempt must be from 0 to 4294967295, not 4294967296"):
        orders.admit(2**32)
    with pytest.raises(TypeError, match=r"attempt must be an int, not '1'"):
        orders.admit("1")
    with orders.admit(attempt=1) as permit:  # a retry: the budget starts with a burst
        assert permit.attempt == 1
        with pytest.raises(AttributeError):
            permit.attempt = 2
    with retryd.Permit(orders) as permit:  # the class itself, as dep.admit() calls it
        assert permit.attempt == 0
    with retryd.Permit(orders, attempt=1) as permit:
        assert permit.attempt == 1
    assert counters(seg, "orders")["successes"] == 3
    client.close()


def test_latency_is_reported_from_admission(make_segment):
    seg = make_segment(orders={"slow_call_duration": "50ms", "min_calls": 1000})
    client = retryd.Client(segment=seg.name, fallback_to_local=False)
    orders = client.dependency("orders")
    with orders.admit():
        pass
    assert counters(seg, "orders")["slow_calls"] == 0
    permit = orders.admit()
    time.sleep(0.06)  # the call itself: 60 ms from admission to completion
    permit.complete()
    assert counters(seg, "orders")["slow_calls"] == 1
    client.close()


def test_an_invalid_handle_and_a_closed_client_are_errors(make_segment):
    seg = make_segment(orders=CALM)
    client = retryd.Client(segment=seg.name, fallback_to_local=False)
    orders = client.dependency("orders")
    stale = client.dependency("stale")
    stale._id = 999_999  # no such slot: the library refuses the handle
    with pytest.raises(retryd.Error, match="stale: invalid dependency handle"):
        stale.admit()
    permit = orders.admit()
    client.close()
    with pytest.raises(retryd.Error, match="retryd client is closed"):
        permit.complete()
    permit.complete()  # reported (as far as a closed client allows): a no-op now
    with pytest.raises(retryd.Error, match="retryd client is closed"):
        orders.admit()


def test_threads_share_a_dependency(make_segment):
    seg = make_segment(orders={"bulkhead_limit": 4, "min_calls": 100000})
    client = retryd.Client(segment=seg.name, fallback_to_local=False)
    orders = client.dependency("orders")
    refused = []

    def worker():
        for _ in range(500):
            try:
                with orders.admit():
                    pass
            except retryd.Rejected as e:
                refused.append(e.reason)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Four threads, each holding at most one permit, never meet a full bulkhead of four.
    assert refused == []
    status = dependency_status(seg.name, "orders")
    assert status["counters"]["successes"] == 2000
    assert status["bulkhead"]["in_use"] == 0
    client.close()


def test_the_method_and_the_permit_look_like_python(make_segment):
    seg = make_segment(orders=CALM)
    client = retryd.Client(segment=seg.name, fallback_to_local=False)
    orders = client.dependency("orders")
    assert str(inspect.signature(retryd.Dependency.admit)) == "(self, attempt=0)"
    assert str(inspect.signature(orders.admit)) == "(attempt=0)"
    assert retryd.Dependency.admit.__name__ == "admit"
    assert "Returns a Permit" in retryd.Dependency.admit.__doc__
    bound = orders.admit  # bound once, called later
    with bound(0) as permit:
        # The garbage collector sees the permit's reference to its dependency (a permit kept
        # on the dependency makes a cycle it must be able to collect).
        assert gc.is_tracked(permit)
        assert orders in gc.get_referents(permit)
        for name in ("fail", "ignored", "succeed", "complete", "probe", "attempt"):
            assert hasattr(permit, name)
    client.close()


def _run_python(code, **env):
    full = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full,
                          cwd=str(ROOT / "bindings" / "python"), timeout=60)


def test_the_ctypes_permit_is_chosen_by_the_environment():
    chosen = _run_python("import retryd, retryd._client as c; "
                         "print(retryd.Permit is c._PythonPermit)", RETRYD_PYTHON_PURE="1")
    assert chosen.returncode == 0, chosen.stderr
    assert chosen.stdout.strip() == "True"
    bad = _run_python("import retryd", RETRYD_PYTHON_PURE="yes")
    assert bad.returncode != 0
    assert "RETRYD_PYTHON_PURE must be 0 or 1, not 'yes'" in bad.stderr


def test_a_named_extension_that_does_not_load_is_an_error():
    package = pathlib.Path(retryd.__file__).parent
    if list(package.glob("_speedups*.so")):
        pytest.skip("the package holds its own retryd._speedups: RETRYD_PYTHON_EXTENSION is not read")
    missing = "/nonexistent/_speedups.abi3.so"
    run = _run_python("import retryd", RETRYD_PYTHON_EXTENSION=missing, RETRYD_PYTHON_PURE="0")
    assert run.returncode != 0
    assert missing in run.stderr


def test_the_extension_does_not_link_libretryd():
    if _client._speedups is None:
        pytest.skip("the ctypes Permit serves")
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("readelf (binutils) is not installed")
    dynamic = subprocess.run([readelf, "-d", _client._speedups.__file__], capture_output=True,
                             text=True, check=True, timeout=60).stdout
    needed = [line for line in dynamic.splitlines() if "(NEEDED)" in line]
    assert needed, dynamic
    assert not [line for line in needed if "retryd" in line]
