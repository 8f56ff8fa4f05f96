"""dep.call_async: the same retry loop as dep.call for asyncio, the waits awaited.

Every scripted call of test_call.py's kinds is made both ways, on virtual time, and must end the
same way (the same value or exception, stop, attempts, waits and records). Then what only an
event loop has: the loop keeps running during the waits, each task sees its own attempt, and a
cancelled task ends its call and gives its attempt back unjudged (a half-open probe included).
"""

import asyncio
import time

import pytest

import retryd
from test_call import Response, replay
from conftest import VirtualTime


class AsyncVirtualTime(VirtualTime):
    """VirtualTime whose sleep is a coroutine, as asyncio.sleep is."""

    def env(self):
        async def sleep(seconds):
            VirtualTime.sleep(self, seconds)
        return retryd.Env(now_ns=self.now_ns, sleep=sleep, random=lambda: 2**63)


def run(coro):
    return asyncio.run(coro)


def outcome_of(call):
    try:
        return ("value", call())
    except BaseException as e:  # noqa: B902 - compared below
        return ("raised", e)


def same_call(dep, outcomes, **policy):
    """Makes one call both ways on fresh virtual time; asserts they end alike and returns the
    async outcome."""
    sync_time, async_time = VirtualTime(), AsyncVirtualTime()
    sync_infos, async_infos = [], []
    sync_fn, async_replay = replay(sync_time, outcomes), replay(async_time, outcomes)

    async def async_fn(attempt):
        await asyncio.sleep(0)  # a real suspension point inside the attempt
        return async_replay(attempt)

    sync_out = outcome_of(lambda: dep.call(sync_fn, observer=sync_infos.append,
                                           env=sync_time.env(), **policy))
    async_out = outcome_of(lambda: run(dep.call_async(async_fn, observer=async_infos.append,
                                                      env=async_time.env(), **policy)))
    assert sync_out[0] == async_out[0]
    if sync_out[0] == "value":
        if hasattr(sync_out[1], "status_code"):
            assert sync_out[1].status_code == async_out[1].status_code
        else:
            assert sync_out[1] == async_out[1]
    else:
        assert type(sync_out[1]) is type(async_out[1])
        if isinstance(sync_out[1], (retryd.CallFailed, retryd.Rejected)):
            a, b = sync_out[1].result, async_out[1].result
            assert (a.stop, a.attempts, a.last_status, a.last_error, a.rejection) == \
                (b.stop, b.attempts, b.last_status, b.last_error, b.rejection)
    assert sync_time.sleeps == async_time.sleeps
    assert [a.number for a in sync_fn.seen] == [a.number for a in async_replay.seen]
    assert [a.timeout for a in sync_fn.seen] == [a.timeout for a in async_replay.seen]
    assert sync_infos == async_infos and sync_infos
    return async_out


@pytest.fixture
def orders(make_segment):
    seg = make_segment(orders={"min_calls": 1000})
    client = retryd.Client(segment=seg.name, fallback_to_local=False)
    yield client.dependency("orders")
    client.close()


@pytest.mark.parametrize("outcomes, policy, expect", [
    ([Response(503), Response(502), Response(200)], {"max_attempts": 5}, "value"),
    ([Response(503, **{"Retry-After": "3"}), Response(200)], {"retry_after_jitter": 0.05},
     "value"),
    ([retryd.AttemptResult(status=429, retry_after=1.0), Response(200)],
     {"base": 5.0, "jitter": "none"}, "value"),
    ([Response(503, **{"Retry-After": "600"}), Response(200)], {}, retryd.CallFailed),
    ([Response(404)], {}, retryd.CallFailed),
    ([Response(503)], {"max_attempts": 4}, retryd.CallFailed),
    ([TimeoutError()], {"method": "POST"}, retryd.CallFailed),
    ([ConnectionResetError(), ConnectionResetError(), Response(200)], {"deadline": 5.0},
     "value"),
    ([KeyError("bug"), Response(200)], {}, KeyError),
    ([retryd.AttemptResult(attempt_class="retryable"),
      retryd.AttemptResult(value=42, attempt_class="success")], {}, "value"),
], ids=["retries", "retry-after", "backoff-over-retry-after", "retry-after-too-long",
        "terminal-4xx", "exhausted", "post-timeout-fails-closed", "resets", "unmapped-bug",
        "explicit-results"])
def test_the_async_loop_ends_every_call_as_the_sync_loop_does(orders, outcomes, policy, expect):
    kind, value = same_call(orders, outcomes, **policy)
    if expect == "value":
        assert kind == "value"
    else:
        assert kind == "raised" and isinstance(value, expect)


def test_the_deadline_and_the_budget_end_async_calls_as_sync_ones(make_segment):
    seg = make_segment(scarce={"retry_burst": 1, "retry_ratio": 0, "min_retries_per_sec": 0},
                       slow={"min_calls": 1000})
    client = retryd.Client(segment=seg.name, fallback_to_local=False)
    vtime = AsyncVirtualTime()
    fn = replay(vtime, [Response(503)])

    async def afn(attempt):
        return fn(attempt)

    with pytest.raises(retryd.Rejected) as e:
        run(client.dependency("scarce").call_async(afn, max_attempts=10, env=vtime.env()))
    assert e.value.reason == "budget_empty"
    assert e.value.result.attempts == 2
    assert e.value.result.value.status_code == 503

    start = vtime.now

    async def times_out(attempt):
        vtime.advance(attempt.timeout)
        raise TimeoutError()

    with pytest.raises(retryd.CallFailed) as e:
        run(client.dependency("slow").call_async(
            times_out, deadline=1.0, attempt_timeout=0.3, max_attempts=10, base=0.05,
            env=vtime.env()))
    assert e.value.result.stop == "deadline"
    assert (vtime.now - start) / 1e9 <= 1.0


def test_an_open_breaker_refuses_before_the_attempt_runs(make_segment):
    seg = make_segment(orders={"min_calls": 1, "open_for": "60s", "open_for_max": "60s"})
    orders = retryd.Client(segment=seg.name, fallback_to_local=False).dependency("orders")
    with orders.admit() as permit:
        permit.fail()
    ran = []

    async def fn(attempt):
        ran.append(attempt)

    with pytest.raises(retryd.Rejected) as e:
        run(orders.call_async(fn))
    assert e.value.reason == "open"
    assert e.value.result.attempts == 0
    assert ran == []


def test_the_waits_are_awaited_and_the_event_loop_keeps_running(orders):
    """Real time: a 100 ms backoff between two attempts; a ticker task runs during it."""
    ticks, attempt_times = [], []

    async def fn(attempt):
        attempt_times.append(time.monotonic())
        return Response(503) if attempt.number == 0 else Response(200)

    async def ticker(stop):
        while not stop.is_set():
            ticks.append(time.monotonic())
            await asyncio.sleep(0.005)

    async def main():
        stop = asyncio.Event()
        task = asyncio.create_task(ticker(stop))
        await asyncio.sleep(0)
        response = await orders.call_async(fn, base=0.1, jitter="none", deadline=30.0)
        stop.set()
        await task
        return response

    assert run(main()).status_code == 200
    assert len(attempt_times) == 2
    during_wait = [t for t in ticks if attempt_times[0] < t < attempt_times[1]]
    assert during_wait, "the event loop did not run while the call waited"


def test_each_task_sees_its_own_attempt(orders):
    seen = {}

    async def fn(name, attempt):
        await asyncio.sleep(0.001)
        current = retryd.current_attempt()
        seen.setdefault(name, []).append((attempt.number, current.number))
        return Response(503) if attempt.number < (1 if name == "a" else 2) else Response(200)

    async def main():
        await asyncio.gather(
            orders.call_async(lambda a: fn("a", a), base=0.001),
            orders.call_async(lambda a: fn("b", a), base=0.001))

    run(main())
    assert seen["a"] == [(0, 0), (1, 1)]
    assert seen["b"] == [(0, 0), (1, 1), (2, 2)]
    assert retryd.current_attempt() is None


def _hold_the_probe(orders):
    for _ in range(400):
        try:
            permit = orders.admit()
        except retryd.Rejected:
            time.sleep(0.005)
            continue
        assert permit.probe
        return permit
    pytest.fail("the breaker never went half-open")


def test_a_task_cancelled_in_its_probe_gives_the_probe_back(make_segment):
    seg = make_segment(orders={"min_calls": 1, "open_for": "1ms", "open_jitter": "0ms",
                               "probe_timeout": "60s", "close_after": 1})
    client = retryd.Client(segment=seg.name, fallback_to_local=False)
    orders = client.dependency("orders")
    with orders.admit() as permit:
        permit.fail()
    assert seg.state("orders") == "open"
    # Wait for half-open with a probe of our own, given back unjudged.
    _hold_the_probe(orders).complete("ignored")

    started = []

    async def hangs(attempt):
        started.append(attempt)
        await asyncio.sleep(3600)

    async def main():
        task = asyncio.create_task(orders.call_async(hangs))
        while not started:
            await asyncio.sleep(0.001)
        # The call holds the one probe: another is refused as busy.
        with pytest.raises(retryd.Rejected) as e:
            orders.admit()
        assert e.value.reason == "half_open_busy"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(main())
    assert seg.state("orders") == "half-open"
    probe = _hold_the_probe(orders)  # given back: the next caller gets it
    probe.complete("success")
    assert seg.state("orders") == "closed"


def test_a_task_cancelled_while_it_waits_ends_its_call(orders):
    attempts = []

    async def fn(attempt):
        attempts.append(attempt)
        return Response(503)

    async def main():
        task = asyncio.create_task(orders.call_async(fn, base=3600, jitter="none",
                                                     max_attempts=5))
        while not attempts:
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(main())
    assert len(attempts) == 1


def test_a_sleep_returning_false_cancels_the_call(orders):
    vtime = AsyncVirtualTime()

    async def no(_seconds):
        return False

    async def fn(attempt):
        return Response(503)

    with pytest.raises(retryd.CallFailed) as e:
        run(orders.call_async(fn, env=retryd.Env(now_ns=vtime.now_ns, sleep=no)))
    assert e.value.result.stop == "cancelled"
    assert e.value.result.attempts == 1


def test_state_changes_are_seen_by_async_calls(make_segment):
    seg = make_segment(orders={"min_calls": 1, "open_for": "60s", "open_for_max": "60s"})
    orders = retryd.Client(segment=seg.name, fallback_to_local=False).dependency("orders")
    changes = []
    with orders.on_state_change(lambda name, old, new: changes.append((name, old, new))):
        async def fails(attempt):
            return Response(500)

        with pytest.raises(retryd.CallFailed):
            run(orders.call_async(fails, max_attempts=1))
    assert changes == [("orders", "closed", "open")]


def test_invalid_policy_is_refused(orders):
    async def fn(attempt):
        return 1

    with pytest.raises(ValueError):
        run(orders.call_async(fn, jitter="sideways"))
    with pytest.raises(retryd.Error):
        run(orders.call_async(fn, base=-1))
