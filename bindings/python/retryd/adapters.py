"""HTTP-client adapters: every request made through them runs in a dependency's retry loop.

    session = requests.Session()
    session.mount("https://payments/", retryd.adapters.RequestsAdapter(payments, policy))

    client = httpx.Client(transport=retryd.adapters.HTTPXTransport(payments, policy))

    pool = retryd.adapters.Urllib3PoolManager(payments, policy)
    response = pool.request("GET", url)

Each request is one dep.call: every attempt is admitted by the host and reported to it, and
classified by the policy (by default, retryd/classify.h: a refused connection, a failed lookup,
a 408, 425 or 429 is retried for any method; a 5xx, a timeout or a reset only for an idempotent
method or a request with an idempotency key; a 4xx is the caller's fault and ends the call
without counting against the breaker). The request's method, as the client sends it, is the
policy's `method`; a request carrying one of
`idempotency_headers` (default Idempotency-Key, X-Idempotency-Key) has an idempotency key, as
does every request when the policy says `idempotency_key=True`. Between attempts the loop waits
with backoff and jitter, or as long as the server's Retry-After asks. Each attempt's timeouts
are capped at the time it has (the policy's attempt_timeout, clamped to what is left of its
deadline), and that time is sent downstream in the `deadline_header` (default grpc-timeout,
None sends none) unless the request already carries one. A request whose body cannot be sent
twice (a generator, a file) gets one attempt.

When the loop stops, the caller gets what the last attempt got: its response (a 4xx, or the
last 503 when attempts, the deadline or the retry budget ran out), or the exception it raised,
as the client raised it. Either carries the CallResult as `retryd_result` (stop, attempts,
last status and error). A response discarded for a retry is closed. Only when the host refuses
the first attempt (breaker open, half-open probe busy, bulkhead full) is retryd.Rejected
raised: no request was sent, serve a fallback. When no attempt could go out at all (a deadline
already spent), retryd.CallFailed is.

For asyncio, AsyncHTTPXTransport (httpx.AsyncClient) and AiohttpClient (over an
aiohttp.ClientSession) run the same loop through dep.call_async: the waits are awaited, never
slept, and a cancelled task ends its call (its attempt in flight reported as ignored).

    client = httpx.AsyncClient(transport=retryd.adapters.AsyncHTTPXTransport(payments, policy))

    payments_http = retryd.adapters.AiohttpClient(payments, policy, session)
    response = await payments_http.get(url)     # the body is read: await response.json()

requests, httpx, urllib3 and aiohttp are imported when their adapter is first used, so this
module works without them. HTTPXTransport is synchronous: its retry loop runs in the calling
thread.
"""

import asyncio
import inspect
import threading

from ._client import CallFailed, Rejected
from ._policy import Policy

__all__ = ["AiohttpClient", "AsyncHTTPXTransport", "HTTPXTransport", "RequestsAdapter",
           "Urllib3PoolManager"]

DEFAULT_IDEMPOTENCY_HEADERS = ("Idempotency-Key", "X-Idempotency-Key")
DEFAULT_DEADLINE_HEADER = "grpc-timeout"


def _has_header(headers, names):
    if not headers or not names:
        return False
    wanted = {n.lower() for n in names}
    return any(str(k).lower() in wanted for k in headers.keys())


def _cap(value, limit):
    """The smaller of a timeout and the attempt's time; a value that is not a number (None, a
    client's "use the default" sentinel) is unbounded."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return limit
    return value if limit is None else min(value, limit)


def _urllib3_timeout(timeout, limit):
    """A urllib3 Timeout for `timeout` (a number, a (connect, read) pair, a Timeout or None)
    with each part, and the total, capped at `limit` seconds."""
    from urllib3.util import Timeout
    total = None
    if isinstance(timeout, tuple):
        connect, read = timeout
    elif isinstance(timeout, Timeout):
        connect, read, total = timeout.connect_timeout, timeout.read_timeout, timeout.total
    else:
        connect = read = timeout
    return Timeout(connect=_cap(connect, limit), read=_cap(read, limit), total=_cap(total, limit))


def _tag(obj, result):
    try:
        obj.retryd_result = result
    except AttributeError:
        pass  # an object that takes no attributes: the result is still the exception's cause


def _reraise(exc):
    """Raises `exc` again with the context it was raised in: raising it anew (inside a caller's
    `except` block, say) would replace its __context__, where urllib3 keeps the socket error
    that classification looks for."""
    context, suppress = exc.__context__, exc.__suppress_context__
    try:
        raise exc
    except BaseException:
        exc.__context__, exc.__suppress_context__ = context, suppress
        raise


def run(dependency, policy, method, has_key, send, discard, replayable=True, env=None):
    """Sends one request through `dependency`'s retry loop and returns the last response.

    send(attempt) makes one attempt and returns the client's response (or raises the client's
    exception); discard(response) closes a response that is being retried. See the module
    documentation for what is returned and raised.
    """
    policy = _policy_for(policy, method, has_key, replayable)
    previous = []

    def attempt(a):
        _discard_all(previous, discard)
        response = send(a)
        previous.append(response)
        return response

    try:
        return dependency.call(attempt, policy, env=env)
    except CallFailed as e:
        failure = e
    except Rejected as e:
        if e.result is None or e.result.attempts == 0:
            raise
        failure = e  # a retry refused: the last attempt's outcome stands
    except BaseException:
        _discard_all(previous, discard)  # the call ended otherwise: no response is returned
        raise
    # Outside the except clauses, so that what is raised below keeps its own context.
    return _last_attempts(failure)


def _discard_all(responses, discard):
    """Closes responses nobody will get (the call ended by a KeyboardInterrupt, an observer's
    exception), so that their connections go back to the pool."""
    while responses:
        stale = responses.pop()
        try:
            discard(stale)
        except Exception:  # noqa: BLE001 - a response that fails to close is dropped anyway
            pass


async def _discard_all_async(responses, discard):
    """_discard_all for the asyncio adapters, whose close may be a coroutine."""
    while responses:
        stale = responses.pop()
        try:
            closing = discard(stale)
            if inspect.isawaitable(closing):
                await closing
        except Exception:  # noqa: BLE001 - a response that fails to close is dropped anyway
            pass


def _policy_for(policy, method, has_key, replayable):
    policy = policy or Policy()
    policy = policy.replace(method=str(method),
                            idempotency_key=bool(policy.idempotency_key or has_key))
    return policy if replayable else policy.replace(max_attempts=1)


async def run_async(dependency, policy, method, has_key, send, discard, replayable=True,
                    env=None):
    """run for asyncio: send(attempt) is a coroutine function, discard(response) may return an
    awaitable; the loop is dep.call_async. Returns and raises as run does."""
    policy = _policy_for(policy, method, has_key, replayable)
    previous = []

    async def attempt(a):
        await _discard_all_async(previous, discard)
        response = await send(a)
        previous.append(response)
        return response

    try:
        return await dependency.call_async(attempt, policy, env=env)
    except CallFailed as e:
        failure = e
    except Rejected as e:
        if e.result is None or e.result.attempts == 0:
            raise
        failure = e
    except BaseException:
        # Cancelled (or a late exception): no response is returned, so each one is closed and
        # its connection goes back to the pool. The closing is shielded from the cancellation
        # that brought us here.
        await asyncio.shield(_discard_all_async(previous, discard))
        raise
    return _last_attempts(failure)


def _last_attempts(failure):
    """What the caller gets when the loop stopped without a success: the last attempt's
    exception raised again, or its response, tagged with the CallResult."""
    result = failure.result
    if result.exception is not None:
        _tag(result.exception, result)
        _reraise(result.exception)
    if result.value is None:
        raise failure  # no attempt went out (no time left for one): nothing to return
    _tag(result.value, result)
    return result.value


class _Options:
    """What the three adapters have in common: the dependency, the policy, and the headers."""

    def _init_retryd(self, dependency, policy, idempotency_headers, deadline_header, env):
        self.dependency = dependency
        self.policy = policy or Policy()
        self.idempotency_headers = tuple(idempotency_headers or ())
        self.deadline_header = deadline_header
        self.env = env

    def _with_deadline(self, headers, attempt):
        """Returns `headers` with the attempt's time in the deadline header, or as they are."""
        if not self.deadline_header or attempt.timeout is None:
            return headers
        if _has_header(headers, (self.deadline_header,)):
            return headers
        value = attempt.deadline_header
        if value is None:
            return headers
        headers = headers.copy() if headers is not None else {}
        headers[self.deadline_header] = value
        return headers


def _make_requests_adapter():
    import requests.adapters

    class RequestsAdapter(_Options, requests.adapters.HTTPAdapter):
        """A requests transport adapter that sends each request through a dependency's retry
        loop. Mount it on a Session for the URLs of that dependency:

            session.mount("https://payments/", RequestsAdapter(payments, policy))

        Other keyword arguments (pool_connections, pool_maxsize...) go to HTTPAdapter;
        `max_retries` stays 0, the loop does the retrying. Redirects are followed by the
        Session, each hop a call of its own.
        """

        def __init__(self, dependency, policy=None, *,
                     idempotency_headers=DEFAULT_IDEMPOTENCY_HEADERS,
                     deadline_header=DEFAULT_DEADLINE_HEADER, env=None, **kwargs):
            kwargs.pop("max_retries", None)
            self._init_retryd(dependency, policy, idempotency_headers, deadline_header, env)
            super().__init__(max_retries=0, **kwargs)

        def send(self, request, stream=False, timeout=None, verify=True, cert=None,
                 proxies=None):
            parent = super()

            def send_one(attempt):
                prepared = request
                headers = self._with_deadline(request.headers, attempt)
                if headers is not request.headers:
                    prepared = request.copy()
                    prepared.headers = headers
                if attempt.timeout is not None:
                    limited = _urllib3_timeout(timeout, attempt.timeout)
                else:
                    limited = timeout
                return parent.send(prepared, stream=stream, timeout=limited,
                                   verify=verify, cert=cert, proxies=proxies)

            return run(self.dependency, self.policy, request.method,
                       _has_header(request.headers, self.idempotency_headers), send_one,
                       lambda response: response.close(),
                       replayable=request.body is None or isinstance(request.body, (bytes, str)),
                       env=self.env)

    return RequestsAdapter


def _make_httpx_transport():
    import httpx

    class HTTPXTransport(_Options, httpx.BaseTransport):
        """An httpx transport that sends each request through a dependency's retry loop, over
        `transport` (default httpx.HTTPTransport(), which makes one attempt per request):

            client = httpx.Client(transport=HTTPXTransport(payments, policy))
        """

        def __init__(self, dependency, policy=None, transport=None, *,
                     idempotency_headers=DEFAULT_IDEMPOTENCY_HEADERS,
                     deadline_header=DEFAULT_DEADLINE_HEADER, env=None):
            self._init_retryd(dependency, policy, idempotency_headers, deadline_header, env)
            self.transport = transport if transport is not None else httpx.HTTPTransport()

        def handle_request(self, request):
            return run(self.dependency, self.policy, request.method,
                       _has_header(request.headers, self.idempotency_headers),
                       lambda attempt: self.transport.handle_request(
                           _httpx_attempt(self, request, attempt)),
                       lambda response: response.close(),
                       replayable=isinstance(request.stream, httpx.ByteStream),
                       env=self.env)

        def close(self):
            self.transport.close()

    return HTTPXTransport


def _httpx_attempt(options, request, attempt):
    """`request` with the attempt's time as its timeouts' cap and in the deadline header."""
    import httpx
    headers = options._with_deadline(request.headers, attempt)
    extensions = dict(request.extensions)
    timeout = extensions.get("timeout")
    if attempt.timeout is not None:
        timeout = dict(timeout or {})
        for key in ("connect", "read", "write", "pool"):
            timeout[key] = _cap(timeout.get(key), attempt.timeout)
        extensions["timeout"] = timeout
    if headers is request.headers and extensions == request.extensions:
        return request
    return httpx.Request(request.method, request.url, headers=headers,
                         stream=request.stream, extensions=extensions)


def _make_async_httpx_transport():
    import httpx

    class AsyncHTTPXTransport(_Options, httpx.AsyncBaseTransport):
        """An httpx async transport that sends each request through a dependency's retry loop
        (dep.call_async), over `transport` (default httpx.AsyncHTTPTransport()):

            client = httpx.AsyncClient(transport=AsyncHTTPXTransport(payments, policy))
        """

        def __init__(self, dependency, policy=None, transport=None, *,
                     idempotency_headers=DEFAULT_IDEMPOTENCY_HEADERS,
                     deadline_header=DEFAULT_DEADLINE_HEADER, env=None):
            self._init_retryd(dependency, policy, idempotency_headers, deadline_header, env)
            self.transport = transport if transport is not None else httpx.AsyncHTTPTransport()

        async def handle_async_request(self, request):
            return await run_async(
                self.dependency, self.policy, request.method,
                _has_header(request.headers, self.idempotency_headers),
                lambda attempt: self.transport.handle_async_request(
                    _httpx_attempt(self, request, attempt)),
                lambda response: response.aclose(),
                replayable=isinstance(request.stream, httpx.ByteStream),
                env=self.env)

        async def aclose(self):
            await self.transport.aclose()

    return AsyncHTTPXTransport


def _aiohttp_timeout(timeout, session_timeout, limit):
    """An aiohttp.ClientTimeout for one attempt: the request's `timeout` (a ClientTimeout or a
    number of seconds), else the session's, with each part capped at `limit` seconds, so the
    tighter of the two always bounds the attempt."""
    import aiohttp
    base = timeout if timeout is not None else session_timeout
    if not isinstance(base, aiohttp.ClientTimeout):
        base = aiohttp.ClientTimeout(total=base)
    return aiohttp.ClientTimeout(
        total=_cap(base.total, limit), connect=_cap(base.connect, limit),
        sock_read=_cap(base.sock_read, limit), sock_connect=_cap(base.sock_connect, limit))


def _make_aiohttp_client():
    import aiohttp

    class AiohttpClient(_Options):
        """Sends requests over an aiohttp.ClientSession through a dependency's retry loop
        (dep.call_async):

            payments_http = AiohttpClient(payments, policy, session)
            response = await payments_http.post(url, json=order)
            body = await response.json()

        request(method, url, **kwargs) and get, post, put, patch, delete, head take what
        session.request takes. Each attempt reads the response body (the attempt's time covers
        it, and a body cut off midway is the attempt's failure): the connection is free again
        when the response is returned, and its read(), text() and json() answer from memory. Each attempt's `timeout` is
        capped at the time it has. A body that cannot be sent twice (a stream, a file) gets one
        attempt. Returns and raises as the other adapters do.
        """

        def __init__(self, dependency, policy=None, session=None, *,
                     idempotency_headers=DEFAULT_IDEMPOTENCY_HEADERS,
                     deadline_header=DEFAULT_DEADLINE_HEADER, env=None):
            if session is None:
                raise TypeError("AiohttpClient needs the aiohttp.ClientSession to send on")
            self._init_retryd(dependency, policy, idempotency_headers, deadline_header, env)
            self.session = session

        async def request(self, method, url, **kwargs):
            headers = kwargs.pop("headers", None)
            timeout = kwargs.pop("timeout", None)
            data = kwargs.get("data")
            replayable = data is None or isinstance(data, (bytes, str, dict, list, tuple))

            async def send_one(attempt):
                sent = self._with_deadline(dict(headers) if headers else {}, attempt)
                limited = timeout
                if attempt.timeout is not None:
                    limited = _aiohttp_timeout(timeout, self.session.timeout, attempt.timeout)
                response = await self.session.request(
                    method, url, headers=sent or None,
                    **({} if limited is None else {"timeout": limited}), **kwargs)
                await response.read()  # at the end of the body aiohttp frees the connection
                return response

            return await run_async(self.dependency, self.policy, method,
                                   _has_header(headers, self.idempotency_headers), send_one,
                                   lambda response: response.release(), replayable=replayable,
                                   env=self.env)

        async def get(self, url, **kwargs):
            return await self.request("GET", url, **kwargs)

        async def head(self, url, **kwargs):
            return await self.request("HEAD", url, **kwargs)

        async def post(self, url, **kwargs):
            return await self.request("POST", url, **kwargs)

        async def put(self, url, **kwargs):
            return await self.request("PUT", url, **kwargs)

        async def patch(self, url, **kwargs):
            return await self.request("PATCH", url, **kwargs)

        async def delete(self, url, **kwargs):
            return await self.request("DELETE", url, **kwargs)

    return AiohttpClient


def _make_urllib3_pool_manager():
    import urllib3
    from urllib3.util import Retry

    # One attempt per urlopen: the loop retries. Redirects are followed as urllib3's default
    # Retry does (three); a response with a retryable status is returned, not raised.
    single = Retry(total=None, connect=0, read=0, status=0, other=0, redirect=3,
                   raise_on_status=False)

    class Urllib3PoolManager(_Options, urllib3.PoolManager):
        """A urllib3 PoolManager whose urlopen (and so request) sends each request through a
        dependency's retry loop:

            pool = Urllib3PoolManager(payments, policy, timeout=5.0)
            response = pool.request("GET", "https://payments/v1/health")

        Other keyword arguments go to PoolManager. A `retries` given to urlopen or request
        applies inside each attempt, instead of the single try it makes by default.
        """

        def __init__(self, dependency, policy=None, *,
                     idempotency_headers=DEFAULT_IDEMPOTENCY_HEADERS,
                     deadline_header=DEFAULT_DEADLINE_HEADER, env=None, **kwargs):
            self._init_retryd(dependency, policy, idempotency_headers, deadline_header, env)
            self._sending = threading.local()
            super().__init__(**kwargs)

        def urlopen(self, method, url, redirect=True, **kw):
            parent = super()
            if getattr(self._sending, "active", False):
                # PoolManager follows a redirect by calling urlopen again: that hop belongs to
                # the attempt in progress, not to a call of its own.
                return parent.urlopen(method, url, redirect=redirect, **kw)
            headers = kw.pop("headers", None)
            if headers is None:
                headers = self.headers
            timeout = kw.pop("timeout", self.connection_pool_kw.get("timeout"))
            kw.setdefault("retries", single)
            body = kw.get("body")

            def send_one(attempt):
                t = timeout
                if attempt.timeout is not None:
                    t = _urllib3_timeout(t, attempt.timeout)
                extra = {} if t is None else {"timeout": t}
                self._sending.active = True
                try:
                    return parent.urlopen(method, url, redirect=redirect,
                                          headers=self._with_deadline(headers, attempt),
                                          **extra, **kw)
                finally:
                    self._sending.active = False

            def discard(response):
                response.close()
                response.release_conn()

            return run(self.dependency, self.policy, method,
                       _has_header(headers, self.idempotency_headers), send_one, discard,
                       replayable=body is None or isinstance(body, (bytes, str)),
                       env=self.env)

    return Urllib3PoolManager


_FACTORIES = {
    "AiohttpClient": _make_aiohttp_client,
    "AsyncHTTPXTransport": _make_async_httpx_transport,
    "RequestsAdapter": _make_requests_adapter,
    "HTTPXTransport": _make_httpx_transport,
    "Urllib3PoolManager": _make_urllib3_pool_manager,
}
_lock = threading.Lock()


def __getattr__(name):
    """Defines an adapter class, importing its HTTP client, on first use."""
    make = _FACTORIES.get(name)
    if make is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    with _lock:
        cls = globals().get(name)
        if cls is None:
            cls = globals()[name] = make()
    return cls
