"""Multi-process servers: a forked child keeps using its parent's client, and the limits are
shared with the parent (and every other process) through the segment."""

import multiprocessing
import os

import pytest

import retryd

# The client of the pool workers below: inherited from the parent at fork time.
_inherited = {}


class Response:
    def __init__(self, status):
        self.status_code = status
        self.headers = {}


def _fail_once(_):
    dep = _inherited["dep"]
    try:
        dep.call(lambda attempt: Response(503), max_attempts=1)
    except retryd.CallFailed as e:
        return (os.getpid(), e.result.stop)
    except retryd.Rejected as e:
        return (os.getpid(), e.reason)
    return (os.getpid(), "success")


def _hold_bulkhead(conn):
    dep = _inherited["dep"]
    with dep.admit():
        conn.send("holding")
        conn.recv()  # released by the parent
    conn.send("released")


def test_os_fork_child_keeps_working_and_shares_the_breaker(make_segment):
    seg = make_segment(orders={"min_calls": 4, "open_for": "60s", "open_for_max": "60s"})
    client = retryd.Client(segment=seg.name, fallback_to_local=False)
    orders = client.dependency("orders")
    with orders.admit():
        pass  # the parent has registered and used the segment before forking
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            for _ in range(3):  # with the parent's success: 4 calls, 75 % failures
                try:
                    with orders.admit() as permit:
                        permit.fail()
                except retryd.Rejected:
                    code = 3
        except BaseException:  # noqa: B902 - the child must never return into pytest
            code = 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    # The child's failures opened the breaker for the parent too.
    assert seg.state("orders") == "open"
    with pytest.raises(retryd.Rejected) as e:
        orders.admit()
    assert e.value.reason == "open"


def test_multiprocessing_fork_pool_shares_the_limits(make_segment):
    seg = make_segment(orders={"min_calls": 6, "open_for": "60s", "open_for_max": "60s"})
    client = retryd.Client(segment=seg.name, fallback_to_local=False)
    _inherited["dep"] = client.dependency("orders")
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(3) as pool:
        results = pool.map(_fail_once, range(12), chunksize=1)
    pids = {pid for pid, _ in results}
    assert os.getpid() not in pids
    outcomes = [stop for _, stop in results]
    # Six failures host-wide open the breaker; the later calls are refused, in whatever worker.
    # (Up to two more may get in while the sixth is in flight in another worker.)
    assert 6 <= outcomes.count("attempts_exhausted") <= 8
    assert outcomes.count("open") == 12 - outcomes.count("attempts_exhausted")
    assert seg.state("orders") == "open"
    _inherited.clear()


def test_multiprocessing_fork_child_holds_a_host_wide_lease(make_segment):
    seg = make_segment(orders={"bulkhead_limit": 1})
    client = retryd.Client(segment=seg.name, fallback_to_local=False)
    orders = _inherited["dep"] = client.dependency("orders")
    ctx = multiprocessing.get_context("fork")
    parent_end, child_end = ctx.Pipe()
    child = ctx.Process(target=_hold_bulkhead, args=(child_end,))
    child.start()
    try:
        assert parent_end.recv() == "holding"
        with pytest.raises(retryd.Rejected) as e:
            orders.admit()
        assert e.value.reason == "bulkhead_full"
        parent_end.send("release")
        assert parent_end.recv() == "released"
    finally:
        child.join(10)
        _inherited.clear()
    assert child.exitcode == 0
    with orders.admit():
        pass
