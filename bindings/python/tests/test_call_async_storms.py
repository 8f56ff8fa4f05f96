"""dep.call_async and the asyncio adapters attacked: storms, cancellations, leaks.

A failing test here is a broken promise: its docstring says which one.

- thousands of tasks on one loop, their attempts and waits cancelled at random (Task.cancel and
  asyncio.wait_for), with a flapping breaker, a bulkhead, a scarce budget and a subscriber that
  raises: no bulkhead lease or probe is left (retryctl's view of the segment), every admitted
  attempt is completed (the segment's counters), the budget grants no more than it may,
  CancelledError reaches every cancelled task, and each attempt sees its own current_attempt();
- httpx's AsyncClient through AsyncHTTPXTransport: a task cancelled (or timed out by
  asyncio.wait_for) while it waits to retry a 503 must not keep the 503's connection out of the
  pool;
- aiohttp through AiohttpClient: many retried attempts whose body never arrives leave no socket
  open, and a session's own (tighter) timeout still bounds each attempt.
"""

import asyncio
import contextlib
import gc
import random
import socket
import threading
import time

import pytest

import retryd
from conftest import dependency_status


# ---------------------------------------------------------------------------------------------
# dep.call_async under a cancellation storm.

STORM_DEP = {
    "bulkhead_limit": 40, "bulkhead_timeout": "60s",      # no expiry hides a lease left behind
    "probe_timeout": "60s", "half_open_probes": 2, "close_after": 1,
    "min_calls": 20, "failure_rate_threshold": 40, "window": "200ms", "window_buckets": 2,
    "open_for": "5ms", "open_for_max": "10ms", "open_jitter": "0ms",
    "retry_burst": 10, "retry_ratio": 0.2, "min_retries_per_sec": 0,
}


def test_thousands_of_cancelled_tasks_leave_no_lease_and_complete_every_attempt(make_segment):
    """Promise 2: cancelling call_async tasks at any moment ends the call, reports an in-flight
    attempt as ignored, never leaks a bulkhead lease or a probe, propagates CancelledError."""
    seg = make_segment(storm=STORM_DEP)
    client = retryd.Client(segment=seg.name, fallback_to_local=False)
    dep = client.dependency("storm")
    changes = []

    def subscriber(name, old, new):
        changes.append((old, new))
        if len(changes) % 3 == 0:
            raise RuntimeError("a subscriber's bug")  # logged; the call goes on

    sub = dep.on_state_change(subscriber)
    stats = {"admitted": 0, "wrong_attempt": 0, "in_fn": 0, "max_in_fn": 0, "cancelled": 0,
             "not_cancelled_error": 0, "values": 0, "rejected": 0, "failed": 0, "bugs": 0,
             "timeouts": 0, "cancelled_in_fn": 0, "not_found": 0}
    rng = random.Random(7)
    max_lag = [0.0]

    async def fn(attempt):
        stats["admitted"] += 1
        stats["in_fn"] += 1
        stats["max_in_fn"] = max(stats["max_in_fn"], stats["in_fn"])
        try:
            if retryd.current_attempt() is not attempt:
                stats["wrong_attempt"] += 1
            try:
                await asyncio.sleep(rng.random() * 0.004)
            except asyncio.CancelledError:
                stats["cancelled_in_fn"] += 1
                raise
            if retryd.current_attempt() is not attempt:
                stats["wrong_attempt"] += 1
            r = rng.random()
            if r < 0.45:
                return retryd.AttemptResult(value="ok", status=200)
            if r < 0.75:
                return retryd.AttemptResult(status=503)
            if r < 0.9:
                raise ConnectionResetError("reset")
            if r < 0.93:
                raise KeyError("a bug in fn")
            stats["not_found"] += 1
            return retryd.AttemptResult(status=404)
        finally:
            stats["in_fn"] -= 1

    async def one():
        await asyncio.sleep(rng.random() * 0.01)  # spread the starts over the wave
        try:
            return await dep.call_async(fn, max_attempts=3, base=0.001, cap=0.004)
        except retryd.Rejected:
            stats["rejected"] += 1
        except retryd.CallFailed:
            stats["failed"] += 1
        except KeyError:
            stats["bugs"] += 1

    async def ticker(stop):
        last = time.monotonic()
        while not stop.is_set():
            await asyncio.sleep(0.001)
            now = time.monotonic()
            max_lag[0] = max(max_lag[0], now - last)
            last = now

    async def main():
        stop = asyncio.Event()
        tick = asyncio.create_task(ticker(stop))
        tasks = []
        for wave in range(60):
            # Some of a wave under asyncio.wait_for with a short timeout, started among the
            # others.
            kinds = [False] * 50 + [True] * 15
            rng.shuffle(kinds)
            batch, timed = [], []
            for under_wait_for in kinds:
                if under_wait_for:
                    timed.append(asyncio.create_task(
                        asyncio.wait_for(one(), 0.002 + rng.random() * 0.01)))
                else:
                    batch.append(asyncio.create_task(one()))
            tasks += batch + timed
            for _ in range(20):
                await asyncio.sleep(rng.random() * 0.002)
                for t in rng.sample(batch, 3):
                    t.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for t, r in zip(tasks, results):
            if isinstance(r, asyncio.CancelledError):
                stats["cancelled"] += 1
            elif isinstance(r, asyncio.TimeoutError):
                stats["timeouts"] += 1
            elif isinstance(r, BaseException):
                stats["not_cancelled_error"] += 1
            elif r == "ok":
                stats["values"] += 1
        stop.set()
        await tick

    started = time.monotonic()
    asyncio.run(main())
    elapsed = time.monotonic() - started
    sub.unsubscribe()

    status = dependency_status(seg.name, "storm")
    counters = status["counters"]
    completed = counters["successes"] + counters["failures"] + counters["ignored"]
    print(f"storm: {elapsed:.1f}s, {stats}, completed {completed}, state changes "
          f"{len(changes)}, max loop lag {max_lag[0] * 1000:.1f} ms, bulkhead "
          f"{status['bulkhead']}, probes in flight {status['breaker']['probes_in_flight']}, "
          f"retries {status['retries']}, rejections {status['rejections']}")
    assert stats["wrong_attempt"] == 0
    assert stats["not_cancelled_error"] == 0
    assert stats["cancelled"] > 100 and stats["timeouts"] > 50
    assert counters["half_opened"] > 5, "the storm did not exercise half-open"
    assert completed == stats["admitted"], "an admitted attempt was not completed once"
    # An attempt cancelled in flight is reported ignored, as a 404 is; nothing else is.
    assert counters["ignored"] == stats["cancelled_in_fn"] + stats["not_found"]
    assert status["bulkhead"]["in_use"] == 0, "a bulkhead lease was leaked"
    assert status["breaker"]["probes_in_flight"] == 0, "a probe was leaked"
    # Never more attempts in flight than the bulkhead allows (one loop: all of them are here).
    assert stats["max_in_fn"] <= STORM_DEP["bulkhead_limit"]
    granted = status["retries"]["granted"]
    assert granted <= STORM_DEP["retry_burst"] + 0.2 * status["retries"]["first_attempts"] + 1
    client.close()


# ---------------------------------------------------------------------------------------------
# A raw HTTP server that counts the connections open to it.

class CountingServer:
    """Answers each request per `reply(path) -> bytes` (a full HTTP/1.1 response, or None to
    send the headers of a 100-byte body and then nothing), keeps connections alive, and counts
    those open."""

    def __init__(self, reply):
        self.reply = reply
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(256)
        self.port = self.sock.getsockname()[1]
        self.base = f"http://127.0.0.1:{self.port}"
        self.open = 0
        self.accepted = 0
        self.requests = 0
        self.lock = threading.Lock()
        self.closing = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closing:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.open += 1
                self.accepted += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        buf = b""
        try:
            while True:
                data = conn.recv(65536)
                if not data:
                    return
                buf += data
                while b"\r\n\r\n" in buf:
                    head, buf = buf.split(b"\r\n\r\n", 1)
                    path = head.split(b" ")[1].decode()
                    with self.lock:
                        self.requests += 1
                    out = self.reply(path)
                    if out is None:
                        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc")
                        continue  # the rest of the body never comes
                    conn.sendall(out)
        except OSError:
            pass
        finally:
            conn.close()
            with self.lock:
                self.open -= 1

    def wait_open(self, at_most, timeout=10.0):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self.lock:
                if self.open <= at_most:
                    return self.open
            time.sleep(0.02)
        with self.lock:
            return self.open

    def close(self):
        self.closing = True
        self.sock.close()


def http_reply(status, body=b"x", **headers):
    lines = [f"HTTP/1.1 {status} X", f"Content-Length: {len(body)}"]
    lines += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


@pytest.fixture
def quiet(make_segment):
    seg = make_segment(quiet={"min_calls": 100000, "retry_burst": 1000, "retry_ratio": 10})
    client = retryd.Client(segment=seg.name, fallback_to_local=False)
    yield client.dependency("quiet")
    client.close()


@pytest.mark.parametrize("how", ["wait_for", "cancel"])
def test_httpx_async_a_task_cancelled_while_it_waits_to_retry_frees_its_connection(quiet, how):
    """Promise 3: a retried response is closed (no connection leak). A task cancelled during the
    wait after a 503 (asyncio.wait_for's timeout, or Task.cancel) has its 503 response neither
    returned nor closed: with a pool of one connection, the next request must still get it."""
    httpx = pytest.importorskip("httpx")
    server = CountingServer(lambda path: http_reply(503, Retry_After="2")
                            if path == "/busy" else http_reply(200, b"ok"))
    policy = retryd.Policy(max_attempts=3, retry_after_jitter=0)
    inner = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=1))

    async def main():
        async with httpx.AsyncClient(
                transport=retryd.adapters.AsyncHTTPXTransport(quiet, policy, inner),
                trust_env=False, timeout=httpx.Timeout(5.0, pool=1.0)) as client:
            # The 503 arrives at once; the call then waits 2 s to retry, and is given up.
            if how == "wait_for":
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(client.get(server.base + "/busy"), 0.5)
            else:
                task = asyncio.create_task(client.get(server.base + "/busy"))
                while server.requests < 1:
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.1)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            gc.collect()
            await asyncio.sleep(0.2)
            busy = [c for c in inner._pool.connections if not c.is_idle()]
            try:
                r = await client.get(server.base + "/ok")
                return r.status_code, len(busy), None
            except httpx.PoolTimeout as e:
                return None, len(busy), e

    status, busy, error = asyncio.run(main())
    server.close()
    assert error is None and status == 200, (
        f"the cancelled call's 503 kept the pool's only connection ({busy} busy): {error!r}")


def test_aiohttp_many_retries_of_a_stalled_body_leave_no_socket_open(quiet):
    """Promise 3: no connection leak after many retries (sockets counted at the server)."""
    aiohttp = pytest.importorskip("aiohttp")
    server = CountingServer(lambda path: None)  # headers, 3 bytes of 100, then silence
    policy = retryd.Policy(max_attempts=3, attempt_timeout=0.1, base=0.001, cap=0.002)
    calls = 20

    async def main():
        async with aiohttp.ClientSession() as session:
            http = retryd.adapters.AiohttpClient(quiet, policy, session)
            errors = 0
            for _ in range(calls):
                try:
                    await http.get(server.base + "/stall")
                except (asyncio.TimeoutError, aiohttp.ClientError, retryd.CallFailed):
                    errors += 1
            open_now = await asyncio.to_thread(server.wait_open, 0, 3.0)  # the loop runs
            return errors, open_now

    errors, open_during = asyncio.run(main())
    print(f"aiohttp stalled bodies: {calls} calls, {server.requests} attempts, "
          f"{server.accepted} connections accepted, {open_during} still open in the session")
    end = time.monotonic() + 30  # the server's accepting thread may lag on a loaded machine
    while server.accepted < calls * 3 and time.monotonic() < end:
        time.sleep(0.01)
    server.close()
    assert errors == calls
    # On a loaded machine an attempt's 0.1 s may run out before its connection is made (a
    # loaded record counted 59 of 60), or before the server's thread has read its request, so
    # both may be fewer than the attempts; the promise is that none is left open.
    assert 0 < server.accepted <= calls * 3
    assert server.requests <= server.accepted
    assert open_during == 0, f"{open_during} connections left open by retried attempts"


def test_aiohttp_a_sessions_tighter_timeout_still_bounds_each_attempt(quiet):
    """Promise 3: the per-attempt timeout is capped, as the sync adapters cap a client's own
    timeout (min of the client's and the attempt's). A session made with
    ClientTimeout(total=0.3) and a policy attempt_timeout of 5 s: an attempt must end after
    about 0.3 s, not 5."""
    aiohttp = pytest.importorskip("aiohttp")
    stall = threading.Event()

    def reply(path):
        stall.wait(3.0)  # answers after 3 s
        return http_reply(200, b"late")

    server = CountingServer(reply)
    policy = retryd.Policy(max_attempts=1, attempt_timeout=5.0)

    async def main():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.3)) as session:
            # The session alone: 0.3 s.
            started = time.monotonic()
            with contextlib.suppress(asyncio.TimeoutError):
                async with session.get(server.base + "/plain") as r:
                    await r.read()
            plain = time.monotonic() - started
            http = retryd.adapters.AiohttpClient(quiet, policy, session)
            started = time.monotonic()
            outcome = None
            try:
                r = await http.get(server.base + "/through-retryd")
                outcome = r.status
            except (asyncio.TimeoutError, aiohttp.ClientError, retryd.CallFailed) as e:
                outcome = type(e).__name__
            return plain, time.monotonic() - started, outcome

    plain, through, outcome = asyncio.run(main())
    stall.set()
    server.close()
    print(f"session timeout 0.3 s: plain {plain:.2f}s, through AiohttpClient {through:.2f}s "
          f"({outcome})")
    assert plain < 1.5
    assert through < 1.5, (f"the session's 0.3 s timeout was replaced by the attempt's 5 s: "
                           f"the attempt took {through:.2f}s and got {outcome}")


def test_a_subscriber_or_observer_raising_base_exceptions_leaks_no_permit(make_segment):
    """Promise 2: an exception from a subscriber or the observer does not leak a permit: a
    KeyboardInterrupt from the subscriber at the probe's admission, and from the observer, in
    call_async and in `async with dep.admit()`; then the bulkhead is empty and no probe is out."""
    seg = make_segment(dep={"bulkhead_limit": 1, "bulkhead_timeout": "60s",
                            "probe_timeout": "60s", "min_calls": 1, "open_for": "5ms",
                            "open_for_max": "5ms", "open_jitter": "0ms", "close_after": 1})
    client = retryd.Client(segment=seg.name, fallback_to_local=False)
    dep = client.dependency("dep")
    raised = []

    def subscriber(name, old, new):
        if new == "half_open":
            raise KeyboardInterrupt("from a subscriber")

    async def fail(attempt):
        return retryd.AttemptResult(status=503)

    async def ok(attempt):
        return retryd.AttemptResult(value=1, status=200)

    def observer(info):
        raise KeyboardInterrupt("from the observer")

    async def main():
        for round_ in range(30):
            with contextlib.suppress(retryd.CallFailed, retryd.Rejected):
                await dep.call_async(fail, max_attempts=1)  # trips
            sub = dep.on_state_change(subscriber)
            for _ in range(200):
                await asyncio.sleep(0.002)
                try:
                    if round_ % 2:
                        await dep.call_async(ok, max_attempts=1)
                    else:
                        async with dep.admit():
                            pass
                except retryd.Rejected:
                    continue
                except KeyboardInterrupt as e:
                    raised.append(str(e))
                    break
            sub.unsubscribe()
            # Closes it again through a call whose observer raises.
            for _ in range(200):
                try:
                    await dep.call_async(ok, max_attempts=1, observer=observer)
                except retryd.Rejected:
                    await asyncio.sleep(0.002)
                    continue
                except KeyboardInterrupt as e:
                    raised.append(str(e))
                    break
    asyncio.run(main())
    status = dependency_status(seg.name, "dep")
    print(f"base exceptions: {len(raised)} raised ({set(raised)}); bulkhead "
          f"{status['bulkhead']}; probes in flight {status['breaker']['probes_in_flight']}; "
          f"breaker {status['breaker']['state']}; half-opened {status['counters']['half_opened']}")
    assert len(raised) >= 40
    assert status["bulkhead"]["in_use"] == 0
    assert status["breaker"]["probes_in_flight"] == 0
    client.close()
