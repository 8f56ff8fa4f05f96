"""Client, dependency and dep.admit() against real segments."""

import os
import uuid

import pytest

import retryd


def test_admit_success_and_breaker_opens_on_exceptions(make_segment):
    seg = make_segment(orders={"min_calls": 2, "open_for": "60s", "open_for_max": "60s"})
    client = retryd.Client(segment=seg.name, fallback_to_local=False)
    assert not client.local
    orders = client.dependency("orders")
    assert client.dependency("orders") is orders
    with client.dependency("other").admit() as permit:
        assert not permit.probe
    for _ in range(2):
        with pytest.raises(ConnectionError):
            with orders.admit():
                raise ConnectionError("down")
    assert seg.state("orders") == "open"
    with pytest.raises(retryd.Rejected) as e:
        orders.admit()
    assert e.value.reason == "open"
    assert e.value.dependency == "orders"
    client.close()


def test_ignored_and_fail_override_the_outcome(make_segment):
    seg = make_segment(orders={"min_calls": 2, "open_for": "60s", "open_for_max": "60s"})
    client = retryd.Client(segment=seg.name, fallback_to_local=False)
    orders = client.dependency("orders")
    for _ in range(5):
        with pytest.raises(ValueError):
            with orders.admit() as permit:
                permit.ignored()  # a 4xx: our fault, not the dependency's
                raise ValueError("bad request")
    assert seg.state("orders") == "closed"
    for _ in range(2):
        with orders.admit() as permit:
            permit.fail()  # no exception, but the dependency failed
    assert seg.state("orders") == "open"


def test_explicit_complete(make_segment):
    seg = make_segment(orders={"bulkhead_limit": 1})
    client = retryd.Client(segment=seg.name, fallback_to_local=False)
    orders = client.dependency("orders")
    permit = orders.admit()
    with pytest.raises(retryd.Rejected) as e:
        orders.admit()
    assert e.value.reason == "bulkhead_full"
    permit.complete("ignored")
    permit.complete()  # a second call is a no-op
    with orders.admit():
        pass


def test_forced_open_and_budget_empty(make_segment):
    seg = make_segment(closed={"mode": "forced-open"},
                       scarce={"retry_burst": 1, "retry_ratio": 0, "min_retries_per_sec": 0})
    client = retryd.Client(segment=seg.name, fallback_to_local=False)
    with pytest.raises(retryd.Rejected) as e:
        client.dependency("closed").admit()
    assert e.value.reason == "open"
    scarce = client.dependency("scarce")
    reasons = []
    for _ in range(3):
        try:
            with scarce.admit(attempt=1):
                reasons.append("admitted")
        except retryd.Rejected as r:
            reasons.append(r.reason)
    assert reasons[-1] == "budget_empty"
    with scarce.admit(attempt=0):  # a first attempt needs no token
        pass


def test_half_open_busy(make_segment):
    seg = make_segment(orders={"min_calls": 1, "open_for": "1ms", "open_jitter": "0ms",
                               "probe_timeout": "60s"})
    client = retryd.Client(segment=seg.name, fallback_to_local=False)
    orders = client.dependency("orders")
    with orders.admit() as permit:
        permit.fail()
    import time
    probe = None
    for _ in range(200):
        time.sleep(0.005)
        try:
            probe = orders.admit()
            break
        except retryd.Rejected:
            continue
    assert probe is not None and probe.probe
    with pytest.raises(retryd.Rejected) as e:
        orders.admit()
    assert e.value.reason == "half_open_busy"
    probe.complete()


def test_no_segment_falls_back_or_fails():
    name = f"retryd-pytest-absent-{uuid.uuid4().hex[:8]}"
    with retryd.Client(segment=name) as client:
        assert client.local
        with client.dependency("orders").admit():
            pass
    with pytest.raises(retryd.ClientError) as e:
        retryd.Client(segment=name, fallback_to_local=False)
    assert e.value.code == -2
    assert name in str(e.value)


def test_segment_from_environment(make_segment, monkeypatch):
    seg = make_segment(orders={})
    monkeypatch.setenv("RETRYD_SEGMENT", seg.name)
    client = retryd.Client(fallback_to_local=False)
    assert not client.local


def test_bad_dependency_name_and_closed_client(make_segment):
    seg = make_segment()
    client = retryd.Client(segment=seg.name, fallback_to_local=False)
    with pytest.raises(retryd.ClientError):
        client.dependency("no spaces allowed")
    dep = client.dependency("fine")
    client.close()
    client.close()
    with pytest.raises(retryd.Error):
        dep.admit()


def test_library_path_is_reported():
    assert os.path.exists(retryd.library_path()) or "retryd" in retryd.library_path()
