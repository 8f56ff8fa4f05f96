"""retryd.adapters with the real clients (requests, httpx, urllib3; httpx's AsyncClient and
aiohttp through dep.call_async) against a real HTTP server
on 127.0.0.1 and a real segment: a refused connection is retried, a 503's Retry-After is waited
for, a 4xx is returned and not held against the breaker, a POST without an idempotency key is
not repeated after a timeout, and a refused first attempt sends nothing."""

import asyncio
import http.server
import os
import pathlib
import re
import subprocess
import sys
import threading
import time

import pytest

import retryd
from conftest import dependency_status


class Reply:
    def __init__(self, status, body=b"", delay=0.0, **headers):
        self.status = status
        self.body = body
        self.delay = delay
        self.headers = {k.replace("_", "-"): v for k, v in headers.items()}


class Server:
    """An HTTP/1.1 server in a thread, answering each path from a script of replies (the last
    one repeats) and recording every request it receives: method, path, headers, arrival time.

    Made on a socket that is bound and not yet listening, so a connection to it is refused
    until listen() (the port stays ours throughout)."""

    def __init__(self):
        self.scripts = {}
        self.received = []
        self.release = threading.Event()  # ends every reply's delay at teardown
        self._lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def handle(self):
                try:
                    super().handle()
                except OSError:
                    pass  # a client that closed or reset a kept-alive connection

            def _serve(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                with outer._lock:
                    outer.received.append({"method": self.command, "path": self.path,
                                           "headers": dict(self.headers), "body": body,
                                           "time": time.monotonic()})
                    script = outer.scripts.get(self.path) or [Reply(200, b"ok")]
                    reply = script.pop(0) if len(script) > 1 else script[0]
                if reply.delay:
                    outer.release.wait(reply.delay)
                try:
                    self.send_response(reply.status)
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(reply.body)))
                    self.end_headers()
                    self.wfile.write(reply.body)
                except OSError:
                    self.close_connection = True  # the client gave up waiting

            do_GET = do_POST = do_PUT = do_DELETE = _serve

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler,
                                                     bind_and_activate=False)
        self.httpd.daemon_threads = True
        self.httpd.socket.bind(("127.0.0.1", 0))
        self.port = self.httpd.socket.getsockname()[1]
        self.base = f"http://127.0.0.1:{self.port}/"
        self._thread = None

    def listen(self):
        if self._thread is None:
            self.httpd.server_activate()
            self._thread = threading.Thread(target=self.httpd.serve_forever,
                                            kwargs={"poll_interval": 0.05}, daemon=True)
            self._thread.start()

    def script(self, path, *replies):
        with self._lock:
            self.scripts[path] = list(replies)
        return self.base + path.lstrip("/")

    def requests_to(self, path):
        with self._lock:
            return [r for r in self.received if r["path"] == path]

    def wait_for(self, path, count, timeout=30.0):
        """The requests to `path` once there are `count` (on a loaded machine the server's
        thread may record a request after the client has given up on it)."""
        end = time.monotonic() + timeout
        while len(self.requests_to(path)) < count and time.monotonic() < end:
            time.sleep(0.01)
        return self.requests_to(path)

    def close(self):
        self.release.set()
        if self._thread is not None:
            self.httpd.shutdown()
            self._thread.join(10)
        self.httpd.server_close()


@pytest.fixture
def server():
    s = Server()
    yield s
    s.close()


# One driver per HTTP client: the same request made through that client's adapter, and what
# the client raises on a timeout and on a refused connection.
class RequestsDriver:
    def __init__(self, dep, policy, base):
        import requests
        self.timeout_error = requests.exceptions.Timeout
        self.connect_error = requests.exceptions.ConnectionError
        self.session = requests.Session()
        self.session.trust_env = False  # no proxy from the environment
        self.session.mount(base, retryd.adapters.RequestsAdapter(dep, policy))

    def request(self, method, url, headers=None, body=None):
        r = self.session.request(method, url, headers=headers, data=body, timeout=30)
        return r, r.status_code, r.content

    def close(self):
        self.session.close()


class HTTPXDriver:
    def __init__(self, dep, policy, base):
        import httpx
        self.timeout_error = httpx.TimeoutException
        self.connect_error = httpx.ConnectError
        self.client = httpx.Client(transport=retryd.adapters.HTTPXTransport(dep, policy),
                                   trust_env=False, timeout=30)

    def request(self, method, url, headers=None, body=None):
        r = self.client.request(method, url, headers=headers, content=body)
        return r, r.status_code, r.content

    def close(self):
        self.client.close()


class Urllib3Driver:
    def __init__(self, dep, policy, base):
        import urllib3
        self.timeout_error = urllib3.exceptions.TimeoutError
        self.connect_error = urllib3.exceptions.MaxRetryError  # what a refused urlopen raises
        self.pool = retryd.adapters.Urllib3PoolManager(dep, policy, timeout=30)

    def request(self, method, url, headers=None, body=None):
        r = self.pool.request(method, url, headers=headers, body=body)
        return r, r.status, r.data

    def close(self):
        self.pool.clear()


# The asyncio adapters, each request run to its end on the driver's own event loop.
class AsyncHTTPXDriver:
    def __init__(self, dep, policy, base):
        import httpx
        self.timeout_error = httpx.TimeoutException
        self.connect_error = httpx.ConnectError
        self.loop = asyncio.new_event_loop()
        self.client = httpx.AsyncClient(
            transport=retryd.adapters.AsyncHTTPXTransport(dep, policy), trust_env=False,
            timeout=30)

    def request(self, method, url, headers=None, body=None):
        r = self.loop.run_until_complete(
            self.client.request(method, url, headers=headers, content=body))
        return r, r.status_code, r.content

    def close(self):
        self.loop.run_until_complete(self.client.aclose())
        self.loop.close()


class AiohttpDriver:
    def __init__(self, dep, policy, base):
        import aiohttp
        self.timeout_error = asyncio.TimeoutError
        self.connect_error = aiohttp.ClientConnectorError
        self.loop = asyncio.new_event_loop()

        async def session():
            return aiohttp.ClientSession(trust_env=False)

        self.session = self.loop.run_until_complete(session())
        self.http = retryd.adapters.AiohttpClient(dep, policy, self.session)

    def request(self, method, url, headers=None, body=None):
        import aiohttp

        async def send():
            r = await self.http.request(method, url, headers=headers, data=body,
                                        timeout=aiohttp.ClientTimeout(total=30))
            return r, r.status, await r.read()

        return self.loop.run_until_complete(send())

    def close(self):
        self.loop.run_until_complete(self.session.close())
        self.loop.close()


# name: (the module the client comes in, the driver)
DRIVERS = {"requests": ("requests", RequestsDriver), "httpx": ("httpx", HTTPXDriver),
           "urllib3": ("urllib3", Urllib3Driver), "httpx-async": ("httpx", AsyncHTTPXDriver),
           "aiohttp": ("aiohttp", AiohttpDriver)}


@pytest.fixture(params=sorted(DRIVERS))
def adapter(request, server):
    """make(dep, policy) -> a driver of the parameter's client, closed at teardown."""
    module, driver_class = DRIVERS[request.param]
    pytest.importorskip(module, reason=f"python3-{module} is not installed")
    made = []

    def make(dep, policy):
        driver = driver_class(dep, policy, server.base)
        made.append(driver)
        return driver

    yield make
    for driver in made:
        driver.close()


@pytest.fixture
def payments(make_segment):
    """A dependency whose breaker the tests do not trip, on a segment of its own."""
    seg = make_segment(payments={"min_calls": 1000})
    client = retryd.Client(segment=seg.name, fallback_to_local=False)
    yield client.dependency("payments")
    client.close()


_GRPC_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}


def grpc_seconds(text):
    m = re.fullmatch(r"(\d{1,8})([HMSmun])", text)
    assert m, text
    return int(m.group(1)) * _GRPC_UNITS[m.group(2)]


def test_refused_connection_is_retried(adapter, server, payments):
    infos = []

    def observe(info):
        infos.append(info)
        server.listen()  # after the refused first attempt, the port starts answering

    url = server.script("/orders", Reply(201, b"created"))
    policy = retryd.Policy(max_attempts=3, base=0.01, deadline=30.0, observer=observe)
    # A POST without an idempotency key: a refused connection sent nothing, so it is retried.
    response, status, body = adapter(payments, policy).request("POST", url, body=b"{}")
    assert (status, body) == (201, b"created")
    assert [(i.error, i.next) for i in infos] == [("connect_refused", "retry"), ("none", "success")]
    assert [r["method"] for r in server.requests_to("/orders")] == ["POST"]


def test_503_retry_after_is_waited_for(adapter, server, payments):
    server.listen()
    infos = []

    def observe(info):
        infos.append((time.monotonic(), info))

    url = server.script("/busy", Reply(503, b"later", Retry_After="1"), Reply(200, b"ok"))
    policy = retryd.Policy(max_attempts=3, base=0.01, retry_after_jitter=0.05, deadline=30.0,
                           observer=observe)
    response, status, body = adapter(payments, policy).request("GET", url)
    assert (status, body) == (200, b"ok")
    (busy_at, busy), (ok_at, ok) = infos
    assert busy.status == 503 and busy.retry_after == pytest.approx(1.0)
    assert busy.next == "retry" and busy.wait >= 1.0
    assert ok.status == 200
    assert ok_at - busy_at >= 1.0  # the second attempt went out after the server's delay
    first, second = server.wait_for("/busy", 2)
    # Each attempt tells the server how long it has: what is left of the 30 s deadline.
    left = [grpc_seconds(r["headers"]["grpc-timeout"]) for r in (first, second)]
    assert 20.0 < left[0] <= 30.0
    assert left[1] <= left[0] - 1.0


def test_4xx_is_returned_and_not_counted_as_a_failure(adapter, server, make_segment):
    server.listen()
    seg = make_segment(payments={"min_calls": 3, "open_for": "60s", "open_for_max": "60s"})
    client = retryd.Client(segment=seg.name, fallback_to_local=False)
    infos = []
    driver = adapter(client.dependency("payments"),
                     retryd.Policy(max_attempts=3, base=0.01, deadline=30.0,
                                   observer=infos.append))
    url = server.script("/orders/7", Reply(404, b"no such order"))
    for _ in range(5):
        response, status, body = driver.request("GET", url)
        assert (status, body) == (404, b"no such order")
        assert response.retryd_result.stop == "terminal"
    assert len(server.requests_to("/orders/7")) == 5  # none repeated
    assert [(i.attempt_class, i.breaker) for i in infos] == [("terminal", "ignored")] * 5
    # Five calls, three of them enough to trip it: the breaker saw no failure.
    assert seg.state("payments") == "closed"
    counters = dependency_status(seg.name, "payments")["counters"]
    assert (counters["failures"], counters["ignored"]) == (0, 5)
    client.close()


def test_post_timeout_is_not_retried_without_an_idempotency_key(adapter, server, payments):
    server.listen()
    infos = []
    # Attempts of 1.5 s: the slow replies time out, the quick ones do not even on a loaded host.
    driver = adapter(payments, retryd.Policy(max_attempts=4, base=0.01, attempt_timeout=1.5,
                                             deadline=30.0, observer=infos.append))
    url = server.script("/charge", Reply(200, b"charged", delay=30.0))
    with pytest.raises(driver.timeout_error) as e:
        driver.request("POST", url, body=b'{"amount": 5}')
    result = e.value.retryd_result
    assert (result.stop, result.attempts, result.last_error) == ("terminal", 1, "timeout")
    assert [(i.error, i.attempt_class, i.next) for i in infos] == [
        ("timeout", "terminal", "terminal")]
    assert len(server.wait_for("/charge", 1)) == 1
    # The same POST with an idempotency key is safe to repeat: the timeout is retried.
    infos.clear()
    url = server.script("/charge-keyed", Reply(200, b"late", delay=30.0), Reply(201, b"charged"))
    response, status, body = driver.request("POST", url, body=b'{"amount": 5}',
                                            headers={"Idempotency-Key": "order-7"})
    assert (status, body) == (201, b"charged")
    assert (infos[0].error, infos[0].next) == ("timeout", "retry")
    assert (infos[-1].error, infos[-1].next) == ("none", "success")
    assert len(server.wait_for("/charge-keyed", len(infos))) == len(infos)


def test_refused_first_attempt_raises_rejected_and_sends_nothing(adapter, server, make_segment):
    server.listen()
    seg = make_segment(payments={"mode": "forced-open"})
    client = retryd.Client(segment=seg.name, fallback_to_local=False)
    driver = adapter(client.dependency("payments"), retryd.Policy(deadline=30.0))
    url = server.script("/orders", Reply(200))
    with pytest.raises(retryd.Rejected) as e:
        driver.request("GET", url)
    assert e.value.reason == "open"
    assert server.requests_to("/orders") == []
    client.close()


@pytest.fixture
def budget_empty(make_segment):
    """A dependency whose retry budget is spent: its one token taken, none deposited or
    refilled."""
    seg = make_segment(payments={"min_calls": 1000, "retry_burst": 1, "retry_ratio": 0,
                                 "min_retries_per_sec": 0})
    client = retryd.Client(segment=seg.name, fallback_to_local=False)
    dep = client.dependency("payments")
    with dep.admit(attempt=1):  # a retry: takes the token
        pass
    with pytest.raises(retryd.Rejected) as e:
        with dep.admit(attempt=1):
            pass
    assert e.value.reason == "budget_empty"
    yield dep
    client.close()


# The same scenario in every binding's adapters: the first attempt gets a 503, the host refuses
# the retry (budget empty), and the client's call returns that 503.
def test_retry_refused_by_budget_returns_the_503(adapter, server, budget_empty):
    server.listen()
    url = server.script("/orders", Reply(503, b"busy"), Reply(200, b"ok"))
    driver = adapter(budget_empty, retryd.Policy(max_attempts=3, base=0.01, deadline=30.0))
    response, status, body = driver.request("GET", url)
    assert (status, body) == (503, b"busy")
    assert len(server.requests_to("/orders")) == 1
    result = response.retryd_result
    assert (result.stop, result.rejection, result.attempts) == ("rejected", "budget_empty", 1)


# The first attempt's connection is refused, the host refuses the retry: the client's own
# exception.
def test_retry_refused_by_budget_raises_the_clients_error(adapter, server, budget_empty):
    url = server.script("/orders", Reply(200))  # not listening: the connection is refused
    driver = adapter(budget_empty, retryd.Policy(max_attempts=3, base=0.01, deadline=30.0))
    with pytest.raises(driver.connect_error) as e:
        driver.request("GET", url)
    result = e.value.retryd_result
    assert (result.stop, result.rejection, result.attempts) == ("rejected", "budget_empty", 1)
    assert result.last_error == "connect_refused"


def test_adapters_module_imports_no_http_client():
    # The clients are imported when an adapter is first used, so the package works without them.
    code = ("import sys, retryd, retryd.adapters; "
            "print(sorted(m for m in ('requests', 'httpx', 'urllib3', 'aiohttp') if m in sys.modules))")
    package_dir = str(pathlib.Path(retryd.__file__).resolve().parents[1])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": package_dir})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
