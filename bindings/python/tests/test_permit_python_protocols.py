"""The C Permit against what the ctypes Permit lets Python code do with it: its `async with`
methods return what asyncio takes for a coroutine (asyncio.create_task, asyncio.iscoroutine) and the
class can be subclassed. Run on either Permit (RETRYD_PYTHON_PURE=1: the ctypes one)."""

import asyncio

import retryd
from conftest import dependency_status

CALM = {"min_calls": 1000}


def test_aenter_and_aexit_return_coroutines(make_segment):
    seg = make_segment(orders=CALM)
    client = retryd.Client(segment=seg.name, fallback_to_local=False)
    orders = client.dependency("orders")

    async def main():
        permit = orders.admit()
        entered = permit.__aenter__()
        assert asyncio.iscoroutine(entered), type(entered)
        assert await asyncio.create_task(entered) is permit
        assert await asyncio.create_task(permit.__aexit__(None, None, None)) is False

    asyncio.run(main())
    assert dependency_status(seg.name, "orders")["counters"]["successes"] == 1
    client.close()


def test_the_permit_class_can_be_subclassed(make_segment):
    seg = make_segment(orders=CALM)
    client = retryd.Client(segment=seg.name, fallback_to_local=False)
    orders = client.dependency("orders")

    class Timed(retryd.Permit):
        pass

    with Timed(orders) as permit:
        assert isinstance(permit, retryd.Permit)
    assert dependency_status(seg.name, "orders")["counters"]["successes"] == 1
    client.close()
