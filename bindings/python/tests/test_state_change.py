"""Breaker state-change subscriptions: dep.on_state_change and client.on_state_change."""

import logging
import time

import pytest

import retryd

# Trips on the second failure; open for 400 ms with no jitter (long enough for the rejections
# a test makes right after the trip on a loaded machine); one probe success closes.
QUICK = {"min_calls": 2, "open_for": "400ms", "open_for_max": "400ms", "open_jitter": "0ms",
         "close_after": 1}
# Trips as QUICK does, then stays open for the whole test however slow the machine.
STAYS_OPEN = dict(QUICK, open_for="1h", open_for_max="1h")


class CountingLib:
    """The loaded library, counting the calls of retryd_breaker_state."""

    def __init__(self, lib):
        self._lib = lib
        self.state_reads = 0

    def retryd_breaker_state(self, *args):
        self.state_reads += 1
        return self._lib.retryd_breaker_state(*args)

    def __getattr__(self, name):
        return getattr(self._lib, name)


def fail(dep, times):
    for _ in range(times):
        with pytest.raises(ConnectionError):
            with dep.admit():
                raise ConnectionError("down")


def test_callback_sees_open_half_open_and_closed(make_segment):
    seg = make_segment(orders=QUICK)
    client = retryd.Client(segment=seg.name, fallback_to_local=False)
    orders = client.dependency("orders")
    assert orders.state == "closed"
    seen = []
    orders.on_state_change(lambda name, old, new: seen.append((name, old, new)))
    fail(orders, 2)
    assert seg.state("orders") == "open"
    assert seen == [("orders", "closed", "open")]
    for _ in range(3):  # rejections change nothing
        with pytest.raises(retryd.Rejected):
            orders.admit()
    assert seen == [("orders", "closed", "open")]
    time.sleep(0.45)
    with orders.admit() as permit:  # the probe: the admission made the breaker half-open
        assert permit.probe
        assert seen[-1] == ("orders", "open", "half_open")
    assert seen == [("orders", "closed", "open"), ("orders", "open", "half_open"),
                    ("orders", "half_open", "closed")]
    assert orders.state == "closed"
    client.close()


def test_dep_call_reports_transitions(make_segment):
    seg = make_segment(orders=QUICK)
    client = retryd.Client(segment=seg.name, fallback_to_local=False)
    orders = client.dependency("orders")
    seen = []
    orders.on_state_change(lambda name, old, new: seen.append((old, new)))

    def down(_attempt):
        raise ConnectionRefusedError("down")

    with pytest.raises((ConnectionRefusedError, retryd.CallFailed, retryd.Rejected)):
        orders.call(down, max_attempts=1)
    with pytest.raises((ConnectionRefusedError, retryd.CallFailed, retryd.Rejected)):
        orders.call(down, max_attempts=1)
    assert seen == [("closed", "open")]
    time.sleep(0.45)
    assert orders.call(lambda _attempt: "ok", max_attempts=1) == "ok"
    assert seen == [("closed", "open"), ("open", "half_open"), ("half_open", "closed")]
    client.close()


def test_client_subscription_covers_every_dependency(make_segment):
    seg = make_segment(orders=QUICK, users=QUICK)
    client = retryd.Client(segment=seg.name, fallback_to_local=False)
    orders = client.dependency("orders")
    seen = []
    sub = client.on_state_change(lambda name, old, new: seen.append((name, old, new)))
    users = client.dependency("users")  # resolved after subscribing
    fail(orders, 2)
    fail(users, 2)
    assert seen == [("orders", "closed", "open"), ("users", "closed", "open")]
    sub.unsubscribe()
    sub.unsubscribe()  # a no-op
    assert not orders._watched and not users._watched
    client.close()


def test_a_subscriber_that_raises_is_logged_and_the_call_goes_on(make_segment, caplog):
    seg = make_segment(orders=QUICK)
    client = retryd.Client(segment=seg.name, fallback_to_local=False)
    orders = client.dependency("orders")
    seen = []

    def broken(name, old, new):
        raise RuntimeError("subscriber bug")

    orders.on_state_change(broken)
    orders.on_state_change(lambda name, old, new: seen.append((old, new)))
    with caplog.at_level(logging.ERROR, logger="retryd"):
        fail(orders, 2)  # the permit's own ConnectionError, not the subscriber's
    assert seen == [("closed", "open")]
    assert "subscriber bug" in caplog.text
    client.close()


def test_no_subscriber_no_state_read(make_segment):
    seg = make_segment(orders=STAYS_OPEN, users=QUICK)
    client = retryd.Client(segment=seg.name, fallback_to_local=False)
    counting = CountingLib(client._lib)
    client._lib = counting
    orders = client.dependency("orders")
    users = client.dependency("users")
    fail(orders, 2)
    with pytest.raises(retryd.Rejected):
        orders.admit()
    assert counting.state_reads == 0  # never subscribed: admit and complete never read it

    seen = []
    sub = users.on_state_change(lambda name, old, new: seen.append((old, new)))
    reads = counting.state_reads  # the baseline read at subscription
    assert reads == 1
    with pytest.raises(retryd.Rejected):
        orders.admit()  # another dependency: still no read
    assert counting.state_reads == reads
    with users.admit():
        pass
    assert counting.state_reads == reads + 2  # after the admission and the completion
    sub.unsubscribe()
    with users.admit():
        pass
    users.call(lambda _attempt: "ok", max_attempts=1)
    assert counting.state_reads == reads + 2  # unsubscribed: no read again
    assert seen == []
    client.close()


def test_a_subscriber_unsubscribed_by_another_is_not_called_for_the_same_change(make_segment):
    seg = make_segment(orders=QUICK)
    client = retryd.Client(segment=seg.name, fallback_to_local=False)
    orders = client.dependency("orders")
    seen = []
    subs = {}

    def first(name, old, new):
        seen.append(("first", old, new))
        subs["second"].unsubscribe()

    subs["first"] = orders.on_state_change(first)
    subs["second"] = orders.on_state_change(lambda name, old, new: seen.append(("second", old, new)))
    fail(orders, 2)
    assert seen == [("first", "closed", "open")]
    client.close()


class Stop(BaseException):
    """Not an Exception: what a KeyboardInterrupt raised in a subscriber looks like."""


def test_a_subscriber_raising_past_exception_gives_the_admission_back(make_segment):
    seg = make_segment(orders=QUICK)
    client = retryd.Client(segment=seg.name, fallback_to_local=False)
    orders = client.dependency("orders")

    def stop_at_half_open(name, old, new):
        if new == "half_open":
            raise Stop()

    sub = orders.on_state_change(stop_at_half_open)
    fail(orders, 2)
    time.sleep(0.45)
    with pytest.raises(Stop):
        orders.admit()  # the probe admitted, then the subscriber raised
    sub.unsubscribe()
    # The probe's lease came back: the breaker takes the next probe at once and closes.
    with orders.admit() as permit:
        assert permit.probe
    assert orders.state == "closed"
    client.close()
