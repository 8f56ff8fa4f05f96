"""dep.call and @dep.retry: the C retry loop driven from Python, on virtual time."""

import socket

import pytest

import retryd


class Response:
    def __init__(self, status, **headers):
        self.status_code = status
        self.headers = headers


def replay(vtime, outcomes, latency=0.005):
    """An attempt function returning (or raising) `outcomes` in turn; records its attempts."""
    seen = []

    def fn(attempt):
        seen.append(attempt)
        vtime.advance(latency)
        out = outcomes[min(attempt.number, len(outcomes) - 1)]
        if isinstance(out, BaseException):
            raise out
        return out

    fn.seen = seen
    return fn


@pytest.fixture
def orders(make_segment):
    seg = make_segment(orders={"min_calls": 1000})
    client = retryd.Client(segment=seg.name, fallback_to_local=False)
    dep = client.dependency("orders")
    yield dep
    client.close()


def test_retries_until_success_and_observer_sees_each_attempt(orders, vtime):
    infos = []
    fn = replay(vtime, [Response(503), Response(502), Response(200)])
    policy = retryd.Policy(max_attempts=5, observer=infos.append)
    result = orders.call(fn, policy, env=vtime.env())
    assert result.status_code == 200
    assert [a.number for a in fn.seen] == [0, 1, 2]
    assert [i.next for i in infos] == ["retry", "retry", "success"]
    assert [i.status for i in infos] == [503, 502, 200]
    assert infos[0].attempt_class == "retryable" and infos[0].breaker == "failure"
    assert infos[0].latency == pytest.approx(0.005)
    assert infos[0].decision == "admitted"
    assert vtime.sleeps == [pytest.approx(i.wait) for i in infos[:2]]
    assert all(0 < s <= 0.2 for s in vtime.sleeps)


def test_retry_after_is_honoured(orders, vtime):
    infos = []
    fn = replay(vtime, [Response(503, **{"Retry-After": "3"}), Response(200)])
    orders.call(fn, retryd.Policy(base=0.01, retry_after_jitter=0.05, observer=infos.append),
                env=vtime.env())
    assert infos[0].retry_after == pytest.approx(3.0)
    assert 3.0 <= vtime.sleeps[0] <= 3.05
    # A longer backoff wins over a shorter Retry-After.
    vtime.sleeps.clear()
    fn = replay(vtime, [retryd.AttemptResult(status=429, retry_after=1.0), Response(200)])
    orders.call(fn, retryd.Policy(base=5.0, jitter="none"), env=vtime.env())
    assert vtime.sleeps == [pytest.approx(5.0)]


def test_retry_after_above_ceiling_gives_up(orders, vtime):
    fn = replay(vtime, [Response(503, **{"Retry-After": "600"}), Response(200)])
    with pytest.raises(retryd.CallFailed) as e:
        orders.call(fn, env=vtime.env())
    assert e.value.result.stop == "retry_after_too_long"
    assert e.value.result.value.status_code == 503
    assert vtime.sleeps == []


def test_post_timeout_fails_closed(orders, vtime):
    fn = replay(vtime, [TimeoutError("read timed out"), Response(200)])
    with pytest.raises(retryd.CallFailed) as e:
        orders.call(fn, method="POST", env=vtime.env())
    assert e.value.result.stop == "terminal"
    assert e.value.result.attempts == 1
    assert e.value.result.last_error == "timeout"
    assert isinstance(e.value.__cause__, TimeoutError)
    # With an idempotency key it is safe to repeat.
    fn = replay(vtime, [socket.timeout("read timed out"), Response(201)])
    assert orders.call(fn, method="POST", idempotency_key=True, env=vtime.env()).status_code == 201
    # A refused connection sent nothing: a POST retries it.
    fn = replay(vtime, [ConnectionRefusedError(), Response(201)])
    assert orders.call(fn, method="POST", env=vtime.env()).status_code == 201


def test_client_error_is_terminal_and_ignored_by_the_breaker(make_segment, vtime):
    seg = make_segment(orders={"min_calls": 3, "open_for": "60s", "open_for_max": "60s"})
    orders = retryd.Client(segment=seg.name, fallback_to_local=False).dependency("orders")
    for _ in range(10):
        with pytest.raises(retryd.CallFailed) as e:
            orders.call(replay(vtime, [Response(404)]), env=vtime.env())
        assert e.value.result.stop == "terminal"
        assert e.value.result.attempts == 1
        assert e.value.result.last_status == 404
    assert seg.state("orders") == "closed"
    for _ in range(3):
        with pytest.raises(retryd.CallFailed):
            orders.call(replay(vtime, [Response(500)]), max_attempts=1, env=vtime.env())
    assert seg.state("orders") == "open"
    # Now every call is rejected at once, without running the attempt.
    fn = replay(vtime, [Response(200)])
    with pytest.raises(retryd.Rejected) as r:
        orders.call(fn, env=vtime.env())
    assert r.value.reason == "open"
    assert r.value.result.attempts == 0
    assert fn.seen == []


def test_budget_empty_stops_retries(make_segment, vtime):
    seg = make_segment(scarce={"retry_burst": 1, "retry_ratio": 0, "min_retries_per_sec": 0})
    client = retryd.Client(segment=seg.name, fallback_to_local=False)
    scarce = client.dependency("scarce")
    fn = replay(vtime, [Response(503)])
    with pytest.raises(retryd.Rejected) as e:
        scarce.call(fn, max_attempts=10, env=vtime.env())
    assert e.value.reason == "budget_empty"
    assert e.value.result.attempts == 2  # the first attempt and the one retry the token paid for
    assert e.value.result.value.status_code == 503


def test_deadline_is_never_overrun(orders, vtime):
    start = vtime.now
    timeouts = []

    def slow(attempt):
        timeouts.append(attempt.timeout)
        vtime.advance(attempt.timeout)  # every attempt times out
        raise TimeoutError()

    with pytest.raises(retryd.CallFailed) as e:
        orders.call(slow, deadline=1.0, attempt_timeout=0.3, max_attempts=10, base=0.05,
                    env=vtime.env())
    assert e.value.result.stop == "deadline"
    assert (vtime.now - start) / 1e9 <= 1.0
    assert e.value.result.elapsed <= 1.0
    assert timeouts[0] == pytest.approx(0.3)
    assert len(timeouts) >= 2


def test_unmapped_exception_propagates_without_retry(orders, vtime):
    fn = replay(vtime, [KeyError("bug"), Response(200)])
    with pytest.raises(KeyError):
        orders.call(fn, env=vtime.env())
    assert len(fn.seen) == 1


def test_decorator_and_current_attempt(orders, vtime):
    calls = []

    @orders.retry(retryd.Policy(max_attempts=4, deadline=5.0), env=vtime.env())
    def fetch(order_id):
        attempt = retryd.current_attempt()
        calls.append((order_id, attempt.number, attempt.timeout, attempt.deadline_header))
        if attempt.number < 2:
            raise ConnectionResetError()
        return {"id": order_id}

    assert fetch(7) == {"id": 7}
    assert [c[1] for c in calls] == [0, 1, 2]
    assert calls[0][2] == pytest.approx(5.0)
    assert calls[0][3] == "5S"
    assert len(vtime.sleeps) == 2
    assert retryd.current_attempt() is None

    @orders.retry
    def plain():
        return "ok"

    assert plain() == "ok"


def test_custom_classifier_and_explicit_results(orders, vtime):
    table = retryd.Classifier().set_status(409, "retryable", "ignored")
    fn = replay(vtime, [Response(409), Response(200)])
    assert orders.call(fn, classifier=table, env=vtime.env()).status_code == 200
    # A non-HTTP call classifies itself.
    fn = replay(vtime, [retryd.AttemptResult(attempt_class="retryable"),
                        retryd.AttemptResult(value=42, attempt_class="success")])
    assert orders.call(fn, env=vtime.env()) == 42
    # Plain values are successes.
    assert orders.call(lambda attempt: "plain", env=vtime.env()) == "plain"


def test_cancelled_sleep(orders, vtime):
    env = retryd.Env(now_ns=vtime.now_ns, sleep=lambda s: False)
    with pytest.raises(retryd.CallFailed) as e:
        orders.call(replay(vtime, [Response(503)]), env=env)
    assert e.value.result.stop == "cancelled"

    def interrupt(_seconds):
        raise KeyboardInterrupt()

    with pytest.raises(KeyboardInterrupt):
        orders.call(replay(vtime, [Response(503)]), env=retryd.Env(sleep=interrupt))


def test_real_clock_default_env(orders):
    # No env: the real clock and time.sleep; a tiny backoff keeps it quick.
    fn_calls = []

    def fn(attempt):
        fn_calls.append(attempt)
        return Response(503) if attempt.number == 0 else Response(200)

    assert orders.call(fn, base=0.001, deadline=2.0).status_code == 200
    assert fn_calls[0].timeout <= 2.0
    assert fn_calls[1].timeout < fn_calls[0].timeout + 1e-9


def test_invalid_policy(orders):
    with pytest.raises(ValueError):
        orders.call(lambda a: 1, jitter="sideways")
    with pytest.raises(retryd.Error):
        orders.call(lambda a: 1, base=-1)
